"""The step rules (``ppas.engine.step_rules``) one by one; the simulator and the plugin apply them
together (``tests/test_simulator.py``, ``tests/test_differential.py``)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from hypothesis import example, given, settings
from hypothesis import strategies as st
from policy_views import dec, pre, view, wait

from ppas.core.order import IdLog
from ppas.core.view import RequestSnapshot, is_prefill_chunk, view_counts
from ppas.cost.base import StepShape
from ppas.engine.simulator import WaitingQueue, _Chain
from ppas.engine.step_rules import (
    RECENT_STEPS,
    PrefillCap,
    StepTally,
    counts,
    enforced_budget,
    order_running,
    order_waiting,
    priced_as_prefill,
    recent_steps_kept,
    samples_token,
    step_interval,
)
from ppas.policies import Decision, make_policy


def test_enforced_budget_liveness() -> None:
    idle = view([wait(0)])
    assert enforced_budget(Decision(0), idle) == 16384  # would stall: lifted
    busy = view([dec(0), wait(0)])
    assert enforced_budget(Decision(0), busy) == 0  # decode-only step is fine
    assert enforced_budget(Decision(-5), busy) == 0
    assert enforced_budget(Decision(300), busy) == 300


def test_counts_running_and_waiting_prefills() -> None:
    # One running prefill + one waiting request = N_p 2 >= N_th 2 (the paper counts both).
    p = make_policy("ppas")
    v = view([dec(0), pre(0), wait(0)])
    assert v.num_pending_prefills == 2 and v.num_running_decodes == 1
    assert p.decide(v).prefill_budget == 2048
    p3 = make_policy("ppas:n_th=3")
    assert p3.decide(v).prefill_budget == 16384


# -- the cap -------------------------------------------------------------------------------
chunks = st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 5000), st.integers(1, 5000)),
                  max_size=30)  # (num_computed, num_prompt_tokens, tokens wanted)


@given(budget=st.integers(0, 8000), wanted=chunks, limit=st.sampled_from([0, 1, 300, 9000]))
def test_cap_limits_prefill_chunks_only(budget: int, wanted: list[tuple[int, int, int]],
                                        limit: int) -> None:
    """Each prefill chunk gets min(wanted, cap left, the chunk limit if any)."""
    cap = PrefillCap(budget, limit)
    spent = 0
    for c, p, n in wanted:
        got = cap.clamp(c, p, n)
        if is_prefill_chunk(c, p):
            assert 0 <= got <= n and got == min(n, budget - spent, limit or n)
            spent += got
        else:
            assert got == n  # decodes and recompute tails pass untouched
        cap.charge(c, p, got)
        assert cap.left == budget - spent >= 0


# -- recompute accounting ------------------------------------------------------------------
@given(wanted=chunks)
def test_tally_classifies_every_token_once(wanted: list[tuple[int, int, int]]) -> None:
    tally = StepTally(keep=True)
    for c, p, n in wanted:
        tally.add(c, p, n)
    total = sum(n for _, _, n in wanted)
    assert tally.prefill_tokens + tally.decode_reqs == total  # a decode is one token
    assert tally.prompt_tokens == sum(n for c, p, n in wanted if c < p)
    assert tally.recompute_tokens == sum(n for c, p, n in wanted if c >= p and n > 1)
    assert tally.decode_reqs == sum(1 for c, p, n in wanted if c >= p and n == 1)
    assert tally.chunks is not None and tally.contexts is not None
    assert tally.shape() == StepShape.of(tally.chunks, tally.contexts)  # what calibrate reads
    rec = tally.record(1.0, 0.5, 0.25, 300)
    assert (rec.num_prefill_tokens, rec.num_prefill_reqs, rec.num_decode_reqs) == (
        tally.prefill_tokens, tally.prefill_reqs, tally.decode_reqs)


def test_recompute_tail_is_priced_as_prefill_and_never_capped() -> None:
    # A request preempted after 40 outputs of a 1000-token prompt recomputes 1040 tokens:
    # a capped chunk inside the prompt, then a 30-token tail past it, then decodes.
    assert is_prefill_chunk(0, 1000) and not is_prefill_chunk(1010, 1000)
    assert priced_as_prefill(1010, 1000, 30) and not priced_as_prefill(1040, 1000, 1)
    assert PrefillCap(0).clamp(1010, 1000, 30) == 30


# -- ordering ------------------------------------------------------------------------------
@dataclass
class Req:
    request_id: str
    num_prompt_tokens: int
    num_computed_tokens: int

    @property
    def prompt_tokens(self) -> int:  # (the simulator's queue sums it)
        return self.num_prompt_tokens


queues = st.lists(st.tuples(st.integers(1, 100), st.integers(0, 150)), max_size=12).map(
    lambda xs: [Req(str(i), p, min(c, p + 20)) for i, (p, c) in enumerate(xs)])


@given(running=queues, waiting=queues, order=st.permutations([str(i) for i in range(12)]),
       listed=st.integers(0, 12), decodes_first=st.booleans())
def test_ordering(running: list[Req], waiting: list[Req], order: list[str], listed: int,
                  decodes_first: bool) -> None:
    d = Decision(100, tuple(order[:listed]) or None, decodes_first)
    before = list(running)
    rank = {rid: i for i, rid in enumerate(order[:listed])}

    def key(r: Req) -> int:
        return rank.get(r.request_id, listed)

    def prefill(r: Req) -> bool:
        return is_prefill_chunk(r.num_computed_tokens, r.num_prompt_tokens)

    order_running(running, d)
    assert sorted(map(id, running)) == sorted(map(id, before))  # a permutation
    pre_ = [r for r in running if prefill(r)]
    dec_ = [r for r in running if not prefill(r)]
    assert pre_ == sorted((r for r in before if prefill(r)), key=key)  # stable by rank
    assert dec_ == [r for r in before if not prefill(r)]
    if decodes_first:
        assert running == dec_ + pre_
    else:  # decodes keep their slots
        assert [prefill(r) for r in running] == [prefill(r) for r in before]
    w = deque(waiting)
    order_waiting(w, d)
    assert list(w) == sorted(waiting, key=key)


@given(waiting=queues, order=st.lists(st.sampled_from([str(i) for i in range(15)]),
                                      max_size=20))
def test_simulator_queue_moves_an_order_to_the_front(waiting: list[Req],
                                                     order: list[str]) -> None:
    """The simulator's waiting queue applies an order (ids repeated or unknown included)
    by moving the listed requests to its front: the same queue as the stable sort."""
    d = Decision(100, tuple(order) or None)
    w: deque[Req] = deque(waiting)
    order_waiting(w, d)
    q = WaitingQueue(waiting)  # type: ignore[arg-type]  # request_id is all it reads
    order_waiting(q, d)
    assert list(q) == list(w)
    assert [q[i] for i in range(len(q))] == list(w)
    assert [ok for ok, _ in q.log.events] == [True] * len(waiting)  # reordering logs nothing


@given(waiting=queues, k=st.integers(0, 16), extra=st.sampled_from([(), ("x",), ("3", "3")]))
def test_simulator_queue_order_already_at_its_front(waiting: list[Req], k: int,
                                                    extra: tuple[str, ...]) -> None:
    """An order that is the queue's own front (as a policy that keeps its order lists it
    step after step), alone or followed by an unknown or repeated id: the same queue as the
    stable sort."""
    order = tuple(r.request_id for r in waiting[:k]) + extra
    d = Decision(100, order or None)
    w: deque[Req] = deque(waiting)
    order_waiting(w, d)
    q = WaitingQueue(waiting)  # type: ignore[arg-type]  # request_id is all it reads
    order_waiting(q, d)
    assert list(q) == list(w)


@given(waiting=queues, ops=st.lists(st.tuples(
    st.sampled_from(["append", "appendleft", "popleft", "clear", "order"]),
    st.lists(st.sampled_from([str(i) for i in range(15)]), max_size=6)), max_size=25))
def test_simulator_queue_keeps_its_head(waiting: list[Req],
                                        ops: list[tuple[str, list[str]]]) -> None:
    """``WaitingQueue.head`` is its first member (None when empty) after every change:
    appends at either end, admissions, clearing, orders (repeated ids included)."""
    q = WaitingQueue(waiting[:len(waiting) // 2])  # type: ignore[arg-type]
    out = list(waiting[len(waiting) // 2:])  # the requests not in the queue
    assert q.head is (waiting[0] if q else None)
    for op, order in ops:
        if op in ("append", "appendleft") and out:
            getattr(q, op)(out.pop())
        elif op == "popleft" and q:
            out.append(q.popleft())
        elif op == "clear":
            out.extend(q)
            q.clear()
        elif op == "order":
            order_waiting(q, Decision(100, tuple(order) or None))
        assert q.head is (next(iter(list(q)), None))
        if q:
            assert q[0] is q.head


@settings(max_examples=400)
@example(waiting=[Req(str(i), 5, 0) for i in range(12)],  # a hint one too long
         ops=[("kept", 4, 0, [], ""), ("kept", 2, 1, [3], "")], cuts=[])
@example(waiting=[Req(str(i), 5, 0) for i in range(12)],  # a kept id listed again
         ops=[("kept", 4, 0, [], ""), ("kept", 2, 0, [2], "head")], cuts=[])
@given(waiting=queues, ops=st.lists(st.tuples(
    st.sampled_from(["append", "appendleft", "popleft", "clear", "order"] + ["kept"] * 5
                    + ["logged"] * 5),
    st.integers(0, 13), st.sampled_from([0, 0, 0, -1, 1, 2, -3]),
    st.lists(st.integers(0, 8), max_size=4, unique=True),
    st.sampled_from(["", "", "", "head", "unknown", "twice"])), max_size=30),
    cuts=st.lists(st.tuples(st.integers(-16, 16), st.integers(-16, 16)), max_size=4))
def test_simulator_queue_applies_kept_orders(
        waiting: list[Req], ops: list[tuple[str, int, int, list[int], str]],
        cuts: list[tuple[int, int]]) -> None:
    """Orders whose head is the queue's own (``Decision.order_kept``, as ``feather``
    lists its aged requests step after step), the hint right, too long, too short or
    negative,
    and the rest the queue's ids (of its kept head again, or behind it) or unknown ids,
    between appends at either end, admissions and clearing: after each, the queue is the
    stable sort's (a deque sorted by ``order_waiting``), its head its first member, its
    items indexed and sliced through the view's ``_Chain`` as listed, and reordering
    logs nothing. Orders read off a log of ids (``LoggedOrder``) too: the log's next ids
    from the queue's front (or one off, or short of the last order's), extended by ids
    behind it, then others (behind it, of the log's again, unknown, twice), or a new
    log; where the queue follows a log, its front starts with that log's ids."""
    _queue_against_a_deque(waiting, ops, cuts)


@settings(max_examples=300)
@given(waiting=queues, ops=st.lists(st.tuples(
    st.sampled_from(["append", "appendleft", "popleft", "popleft"] + ["logged"] * 6),
    st.integers(0, 13), st.sampled_from([0, 0, 0, 0, 0, -1, 1, 2, -3]),
    st.lists(st.integers(0, 8), max_size=4, unique=True),
    st.sampled_from(["", "", "", "", "", "head", "unknown", "twice"])), max_size=40))
def test_simulator_queue_follows_logged_orders(
        waiting: list[Req], ops: list[tuple[str, int, int, list[int], str]]) -> None:
    """Mostly orders read off one log of ids (``LoggedOrder``), as ``feather`` lists its
    aged requests: the queue is the stable sort's after each (as above)."""
    _queue_against_a_deque(waiting, ops, [(1, 3), (2, -1)])


def _queue_against_a_deque(waiting: list[Req], ops: list[tuple[str, int, int, list[int], str]],
                           cuts: list[tuple[int, int]]) -> None:
    """The queue against a deque sorted by ``order_waiting`` under ``ops``."""
    q = WaitingQueue(waiting[:len(waiting) // 2])  # type: ignore[arg-type]
    ids = IdLog()
    ref: deque[Req] = deque(q)
    out = list(waiting[len(waiting) // 2:])  # the requests not in the queue
    running = [Req("r", 5, 5)]
    view_reqs = _Chain(running, q)  # type: ignore[arg-type]
    for op, k, off, extra, bad in ops:
        if op in ("append", "appendleft") and out:
            r = out.pop()
            getattr(q, op)(r)
            getattr(ref, op)(r)
        elif op == "popleft" and q:
            out.append(q.popleft())
            ref.popleft()
        elif op == "clear":
            out.extend(q)
            q.clear()
            ref.clear()
        elif op == "logged":
            queued = [r.request_id for r in q]
            k %= len(queued) + 1
            if q._src is ids and off != -3:
                k = max(k, q._shi - q._slo)  # (mostly ids behind the log's)
            behind = [queued[k + i] for i in extra if k + i < len(queued)]
            more = {"head": tuple(queued[:1]), "unknown": ("x",),
                    "twice": tuple(behind[:1])}.get(bad, ())
            if q._src is not ids or off == -3:  # (a new log: the head, then ids behind)
                ids = IdLog()
                ids.extend(queued[:k])
                lo = 0
            else:  # (the last order's log from the front's first id, or one off)
                lo = min(max(q._slo + (off if off in (-1, 1) else 0), 0), len(ids))
            tail = tuple(behind[len(behind) // 2:]) if not bad else ()  # (not logged)
            ids.extend(behind[:len(behind) - len(tail)])
            more = tail + more
            hi = len(ids) if off != 2 else max(lo, min(q._shi - 1, len(ids)))
            logged = ids.order(lo, hi, more)
            listed = list(logged)
            kept = 0
            while kept < min(len(listed), len(queued)) and listed[kept] == queued[kept]:
                kept += 1
            events = len(q.log.events)
            order_waiting(q, Decision(100, logged or None, order_kept=kept if off else 0))
            order_waiting(ref, Decision(100, tuple(listed) or None))
            assert len(q.log.events) == events
        elif op in ("order", "kept"):
            queued = [r.request_id for r in q]
            k %= len(queued) + 1
            head = tuple(queued[:k])
            # (ids behind the head, and one of the head's again, an unknown one or one
            # of those behind twice)
            behind = tuple(queued[k + i] for i in extra if k + i < len(queued))
            more = {"head": head[-1:], "unknown": ("x",), "twice": behind[:1]}.get(bad, ())
            order = head + behind + more
            kept = len(head) + off if op == "kept" else 0  # (< 0: no hint)
            events = len(q.log.events)
            order_waiting(q, Decision(100, order or None, order_kept=kept))
            order_waiting(ref, Decision(100, order or None))
            assert len(q.log.events) == events
        assert list(q) == list(ref)
        assert q.head is (ref[0] if ref else None)
        assert [q[i] for i in range(len(q))] == list(ref)
        assert q._fids == [r.request_id for r in q._front]  # (its ids, in order)
        if q._src is not None:
            n = q._shi - q._slo
            assert q._fids[:n] == q._src._ids[q._slo:q._shi] and len(q._front) >= n
        whole = running + list(ref)
        assert list(view_reqs) == whole and len(view_reqs) == len(whole)
        assert [view_reqs[i] for i in range(len(whole))] == whole
        for a, b in cuts:
            assert view_reqs[a:b] == whole[a:b]
            assert view_reqs[a:] == whole[a:] and view_reqs[:b] == whole[:b]


@dataclass
class PReq(Req):
    priority: int
    arrival_time: float


@given(reqs=st.lists(st.tuples(st.integers(-1, 1), st.integers(0, 3), st.integers(0, 150)),
                     max_size=12),
       order=st.permutations([str(i) for i in range(12)]), listed=st.integers(0, 12))
def test_priority_ordering(reqs: list[tuple[int, int, int]], order: list[str],
                           listed: int) -> None:
    """Under --scheduling-policy priority the policy's order acts within a level: the
    queue is sorted by level, then the policy's rank, then vLLM's (arrival, id); without
    an order it is exactly vLLM's heap order. Running prefills are ranked within levels."""
    items = [PReq(str(i), 100, c, p, float(a)) for i, (p, a, c) in enumerate(reqs)]
    d = Decision(100, tuple(order[:listed]) or None)
    rank = {rid: i for i, rid in enumerate(order[:listed])}
    w = deque(items[::-1])
    order_waiting(w, d, priority=True)
    got = list(w)
    assert sorted(map(id, got)) == sorted(map(id, items))
    for a, b in zip(got, got[1:], strict=False):
        assert a.priority <= b.priority
        if a.priority == b.priority:
            ra, rb = rank.get(a.request_id, listed), rank.get(b.request_id, listed)
            assert ra <= rb
            if ra == rb:  # vLLM's Request.__lt__ below the policy's rank
                assert (a.arrival_time, a.request_id) < (b.arrival_time, b.request_id)
    unordered = deque(items)
    order_waiting(unordered, Decision(100), priority=True)
    assert list(unordered) == sorted(items, key=lambda r: (r.priority, r.arrival_time,
                                                            r.request_id))
    running = list(items)
    order_running(running, d, priority=True)
    pre_ = [r for r in running if r.num_computed_tokens < 100]
    assert pre_ == sorted((r for r in items if r.num_computed_tokens < 100),  # None: as is
                          key=lambda r: (r.priority, rank.get(r.request_id, listed)) if listed
                          else 0)
    assert [r.num_computed_tokens < 100 for r in running] == [
        r.num_computed_tokens < 100 for r in items]  # decodes keep their slots


# -- counts --------------------------------------------------------------------------------
@given(running=queues, num_waiting=st.integers(0, 5))
def test_counts_match_the_views_counts(running: list[Req], num_waiting: int) -> None:
    snaps = [RequestSnapshot(r.request_id, 0.0, r.num_prompt_tokens, r.num_computed_tokens,
                             is_running=True) for r in running]
    snaps += [RequestSnapshot(f"w{i}", 0.0, 10) for i in range(num_waiting)]
    assert counts(running, num_waiting) == view_counts(snaps)


def test_tokens_and_intervals() -> None:
    assert samples_token(1000, 1000) and not samples_token(999, 1000)
    assert step_interval(5.0, None) == 0.0 and step_interval(5.0, 4.5) == 0.5
    assert recent_steps_kept(make_policy("mbt")) == RECENT_STEPS
