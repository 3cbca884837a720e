"""``sorted-f`` and ``lprs-apc`` keep the waiting queue indexed between steps and decide
as the whole-queue rule does.

Where the view carries a ``waiting_log`` (the simulator under FCFS), both policies follow
it (``ppas.policies.waiting``) instead of sorting the queue every step: ``sorted-f`` asks
a footprint-indexed order for the next request that fits, ``lprs-apc`` a heap for the
C_t best-scored. The rules as first written (every waiting request read and sorted) are
kept here as the reference: on random bursts with tied keys, preemption, prefix caching,
small KV budgets and admission limits, trimmed logs and priority scheduling (no log), the
simulator gives the same run under both, request by request and step by step.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_views import Counting, run_of

from ppas.core.decision import Decision
from ppas.core.view import (
    RequestSnapshot,
    RequestView,
    SchedulerView,
    WaitingLog,
    is_pending_prefill,
    pending_prefills,
    uncached_prompt_tokens,
)
from ppas.cost.roofline import RooflineCostModel
from ppas.engine.simulator import EngineConfig, simulate
from ppas.policies import make_policy
from ppas.policies.base import Policy
from ppas.policies.lprs import LprsApc
from ppas.policies.sortedf import SortedF, f_metric, footprint
from ppas.workload import RequestSpec

SMALL = RooflineCostModel("l40s", "qwen2.5-0.5b")


# -- the rules as first written: every waiting request read and sorted ------------------------
class WholeSortedF(SortedF):
    def decide(self, view: SchedulerView) -> Decision:
        cfg = self.config
        cap = self.kv_tokens if self.kv_tokens is not None else 1 << 62
        room = cap
        size = total = budget = 0
        waiting: list[RequestView] = []
        for r in view.requests:
            if r.is_running:
                room -= footprint(r)
                size += 1
                total += r.max_output_tokens - r.num_output_tokens
                budget += max(0, r.prompt_tokens - r.num_computed_tokens)
            else:
                waiting.append(r)
        if not waiting:
            return Decision(cfg.budget)
        waiting.sort(key=lambda r: (r.max_output_tokens, r.arrival_time))
        order: list[str] = []
        for r in waiting:
            need = footprint(r)
            if need > room:
                if need > cap and size == 0 and not order:
                    order.append(r.request_id)
                    budget += uncached_prompt_tokens(r)
                    break
                continue
            o = r.max_output_tokens
            if cfg.metric == "f" and size and f_metric(total + o, size + 1) > f_metric(total, size):
                break
            order.append(r.request_id)
            room -= need
            size += 1
            total += o
            budget += uncached_prompt_tokens(r)
        return Decision(min(cfg.budget, budget), tuple(order))


class WholeLprsApc(LprsApc):
    def decide(self, view: SchedulerView) -> Decision:
        cfg = self.config
        pending = pending_prefills(view)
        if not pending:
            return Decision(cfg.c_max)
        n_dec = view.num_running_decodes
        dctx = 0
        for r in view.requests:
            if not is_pending_prefill(r):
                dctx += r.num_computed_tokens
        step_t, per_tok = self._predictor(view, n_dec, dctx)
        best_c, best_pen = self.chunks[0], float("inf")
        for c in self.chunks:
            t = step_t(c)
            pen = cfg.under_w * (cfg.target_s - t) if t < cfg.target_s else cfg.over_w * (
                t - cfg.target_s)
            if pen <= best_pen:
                best_c, best_pen = c, pen
        c_t = min(cfg.max_concurrent, view.max_num_seqs - n_dec,
                  (view.max_num_batched_tokens - n_dec) // cfg.l_min)
        active = any(r.is_running and 0 < r.num_computed_tokens for r in pending)
        if c_t < 1:
            if active:
                return Decision(0)
            c_t, best_c = 1, cfg.l_min
        now, w = view.now, cfg.rem_weight

        def score(r: RequestView) -> float:
            return (now - r.arrival_time) - w * per_tok * (r.prompt_tokens - r.num_computed_tokens)

        pending.sort(key=score, reverse=True)
        top = pending[:c_t]
        room = sum(r.prompt_tokens - r.num_computed_tokens for r in top)
        return Decision(min(best_c, room), tuple(r.request_id for r in top))


WHOLE: dict[str, type[Policy]] = {"sorted-f": WholeSortedF, "lprs-apc": WholeLprsApc}


def fresh(spec: str, whole: bool, short: int = 0, scan: int = SortedF.scan_limit) -> Policy:
    p = make_policy(spec)
    if isinstance(p, SortedF):  # 0: the index's walk on every queue
        p.short_queue = short  # type: ignore[misc]
        p.sort_ratio = 0 if short == 0 else SortedF.sort_ratio  # type: ignore[misc]
        p.scan_limit = scan  # type: ignore[misc]  # (0: the tree from the first skip)
    if whole:
        cls = WHOLE[p.name]
        q = cls.__new__(cls)
        q.__dict__.update(p.__dict__)
        return q
    return p


# arrivals from a few values (equal keys: the queue's order decides) or anywhere
burst = st.tuples(st.one_of(st.sampled_from([0.0, 0.05, 0.1]), st.floats(0.0, 0.3)),
                  st.one_of(st.integers(1, 300), st.integers(1, 6000)),
                  st.one_of(st.integers(1, 3), st.integers(1, 40)),
                  st.one_of(st.none(), st.integers(0, 2)))

SPECS = st.one_of(
    st.builds(lambda kv, m: f"sorted-f:budget=512,kv_tokens={kv},metric={m}",
              st.sampled_from([800, 2000, 6000, 20000]), st.sampled_from(["f", "none"])),
    st.builds(lambda b: f"sorted-f:budget={b}", st.sampled_from([256, 8192])),
    st.builds(lambda c, w, m: f"lprs-apc:max_concurrent={c},rem_weight={w},l_min={m},c_max=4096",
              st.integers(1, 4), st.sampled_from([0, 1, 1000]), st.sampled_from([16, 256])),
    # targets that the candidate chunks' step times cross (the LPRS search's boundary)
    st.builds(lambda t, o, m: f"lprs-apc:target_s={t},over_w={o},l_min={m},c_max=4096",
              st.sampled_from([0.004, 0.008, 0.015]), st.sampled_from([0, 4]),
              st.sampled_from([16, 256])),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(burst, min_size=2, max_size=40), extra=st.integers(0, 300),
       seqs=st.integers(1, 8), caching=st.booleans(), priority=st.booleans(),
       spare=st.sampled_from([0, 4096]), short=st.sampled_from([0, 0, 2]),
       scan=st.sampled_from([0, 1, 512]), spec=SPECS)
def test_same_run_as_the_whole_queue_rule(
        reqs: list[tuple[float, int, int, int | None]], extra: int, seqs: int,
        caching: bool, priority: bool, spare: int, short: int, scan: int,
        spec: str) -> None:
    specs = [RequestSpec(a, p, o, None, None,
                         prefix=() if g is None else ((f"g{g}", min(p, 512)),),
                         priority=i % 3)
             for i, (a, p, o, g) in enumerate(reqs)]
    blocks = max(-(-(s.prompt_tokens + s.output_tokens) // 16) for s in specs) + extra
    engine = EngineConfig(num_kv_blocks=blocks, max_num_seqs=seqs, prefix_caching=caching,
                          scheduling_policy="priority" if priority else "fcfs")
    old = WaitingLog.SPARE
    WaitingLog.SPARE = spare  # 0: the log is trimmed often, the index read again
    try:
        fast = simulate(specs, fresh(spec, False, short, scan), SMALL, engine,
                        record_steps=True)
        whole = simulate(specs, fresh(spec, True), SMALL, engine, record_steps=True)
    finally:
        WaitingLog.SPARE = old
    assert run_of(fast) == run_of(whole)


@pytest.mark.parametrize("spec", ["sorted-f:kv_tokens=40000",
                                  "sorted-f:kv_tokens=60000,metric=none", "lprs-apc"])
def test_reads_do_not_grow_with_the_queue(spec: str) -> None:
    """Behind 8 running requests, 10,000 waiting, in a log: the first steps read them
    all (the index is built), a later one, after two arrivals and an admission, reads
    the running requests and the two at the boundary, and decides as the whole rule."""
    running: list[RequestView] = [
        RequestSnapshot(f"d{i}", 0.0, 1000, 1000 + i, i + 1, 64, True, 9.99) for i in range(8)]
    waiting: list[RequestView] = [
        RequestSnapshot(f"w{i}", 1.0 + i * 1e-3, 1000 + 7 * (i % 13), 0, 0, 1 + i % 97)
        for i in range(10_000)]
    log = WaitingLog()
    log.events.extend((True, r) for r in waiting)
    p, q = fresh(spec, False, SortedF.short_queue), fresh(spec, True)
    for x in (p, q):
        x.bind_cost_model(SMALL)

    def view_of(reqs: Counting, now: float) -> SchedulerView:
        n_wait = sum(1 for r in reqs.reqs if not r.is_running)
        return SchedulerView(now, reqs, n_wait + 0, 8, 8192, 16, (), log,
                             sum(r.prompt_tokens for r in reqs.reqs if not r.is_running))

    reqs = Counting(running + waiting)
    for _ in range(2):  # (sorted-f: the whole rule's step, then the index built)
        assert p.decide(view_of(reqs, 10.0)) == q.decide(view_of(Counting(reqs.reqs), 10.0))
    assert reqs.read >= 10_000
    admitted = waiting.pop(5)
    log.events.append((False, admitted))
    new = [RequestSnapshot(f"n{i}", 10.5 + i * 1e-3, 500, 0, 0, 3) for i in range(2)]
    waiting.extend(new)
    log.events.extend((True, r) for r in new)
    running.append(RequestSnapshot(admitted.request_id, admitted.arrival_time,
                                   admitted.prompt_tokens, 16, 0, admitted.max_output_tokens,
                                   True))
    reqs = Counting(running + waiting)
    d = p.decide(view_of(reqs, 11.0))
    assert reqs.read <= 9 + 2, reqs.read
    assert d == q.decide(view_of(Counting(reqs.reqs), 11.0))
    assert d.prefill_order, d


@pytest.mark.parametrize("spec", [
    "sorted-f:budget=512,kv_tokens=2000", "sorted-f:budget=512,kv_tokens=6000,metric=none",
    "lprs-apc:max_concurrent=4,rem_weight=0,l_min=16,c_max=4096",
    "lprs-apc:max_concurrent=2,rem_weight=1,l_min=16,c_max=4096"])
def test_equal_keys_go_in_the_queue_order(spec: str) -> None:
    """Thirty requests at two instants, three prompt lengths, two output lengths: equal
    keys everywhere (past ten requests, the ids' order is not the queue's), admitted
    four at a time with preemption; the same run as the whole rule."""
    specs = [RequestSpec(0.0 if i % 2 else 0.05, 100 + 150 * (i % 3), 5 + 3 * (i % 4 == 0))
             for i in range(30)]
    engine = EngineConfig(num_kv_blocks=120, max_num_seqs=4)
    fast = simulate(specs, fresh(spec, False), SMALL, engine, record_steps=True)
    whole = simulate(specs, fresh(spec, True), SMALL, engine, record_steps=True)
    assert run_of(fast) == run_of(whole)


@pytest.mark.parametrize("metric,kv", [("f", 20000), ("none", 20000), ("f", 400000)])
def test_a_finished_request_frees_room(metric: str, kv: int) -> None:
    """No queue change between two steps, but a running request finished: the room
    grows and more waiting requests fit (the last walk is not the next); then one
    replaced by another of the same footprint with more outputs left: the same room, a
    looser F test (the walk goes past where the last one stopped)."""
    spec = f"sorted-f:kv_tokens={kv},metric={metric}"
    big = RequestSnapshot("big", 0.0, 9000, 9000, 5, 1000, True)
    small = RequestSnapshot("small", 0.0, 100, 100, 49, 50, True)  # (F stops at 3 outputs)
    other = RequestSnapshot("other", 0.0, 10, 10, 0, 140, True)  # (footprint: 160 too)
    waiting: list[RequestView] = [
        RequestSnapshot(f"w{i}", 1.0 + i, 500 + 1500 * (i % 4), 0, 0, 10 + i)
        for i in range(40)]
    log = WaitingLog()
    log.events.extend((True, r) for r in waiting)
    p, q = fresh(spec, False), fresh(spec, True)
    for running in ([big, small], [big, small], [small], [small], [other], [other]):
        reqs = running + waiting
        view = SchedulerView(5.0, reqs, len(waiting), len(running), 8192, 64, (), log,
                             sum(r.prompt_tokens for r in waiting))
        assert p.decide(view) == q.decide(view)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(waiting=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 3000), st.integers(1, 60)),
                        min_size=1, max_size=50),
       running=st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 60)),
                        min_size=1, max_size=5),
       moves=st.lists(st.tuples(st.sampled_from(["admit", "arrive", "finish", "decode", "gone"]),
                                st.integers(0, 7), st.integers(1, 3000), st.integers(1, 60)),
                      max_size=30),
       kv=st.sampled_from([2000, 6000, 20000, 60000]), metric=st.sampled_from(["f", "none"]),
       scan=st.sampled_from([0, 1, 3, 512]))
def test_walks_carried_over_decide_as_the_whole_rule(
        waiting: list[tuple[int, int, int]], running: list[tuple[int, int]],
        moves: list[tuple[str, int, int, int]], kv: int, metric: str, scan: int) -> None:
    """``sorted-f`` carries its last walk over queue changes (``_carried``): step by
    step, requests admitted from the front of its order (or not), arrivals anywhere in
    the sorted order (equal keys too), running requests finishing or decoding, waiting
    ones leaving; every step decides as the whole rule."""
    spec = f"sorted-f:kv_tokens={kv},metric={metric}"
    p, q = fresh(spec, False, scan=scan), fresh(spec, True)
    log = WaitingLog()
    run: list[RequestView] = [RequestSnapshot(f"r{i}", 0.0, a, a, 0, o, True)
                              for i, (a, o) in enumerate(running)]
    wait: list[RequestView] = []
    n = 0

    def arrive(at: float, prompt: int, out: int) -> None:
        nonlocal n
        r = RequestSnapshot(f"w{n}", at, prompt, 0, 0, out)
        n += 1
        wait.append(r)
        log.events.append((True, r))

    for at, a, o in waiting:
        arrive(float(at), a, o)
    for step, (move, k, a, o) in enumerate([*moves, ("decode", 0, 1, 1)]):
        reqs = run + wait
        n_dec = sum(1 for r in run if r.num_computed_tokens >= r.prompt_tokens)  # (N_d)
        view = SchedulerView(10.0 + step, reqs, len(wait) + len(run) - n_dec, n_dec, 8192,
                             64, (), log, sum(r.prompt_tokens for r in wait))
        d = p.decide(view)
        assert d == q.decide(view)
        if move == "admit" and d.prefill_order:  # the first k + 1 of the order
            ids = set(d.prefill_order[:k + 1])
            for r in [r for r in wait if r.request_id in ids]:
                wait.remove(r)
                log.events.append((False, r))
                run.append(RequestSnapshot(r.request_id, r.arrival_time, r.prompt_tokens,
                                           0, 0, r.max_output_tokens, True))
        elif move == "arrive":
            arrive(float(k % 5), a, o)
        elif move == "finish" and run:
            run.pop(k % len(run))
        elif move == "gone" and wait:
            log.events.append((False, wait.pop(k % len(wait))))
        elif move == "decode":
            run = [RequestSnapshot(r.request_id, r.arrival_time, r.prompt_tokens,
                                   r.prompt_tokens, min(r.num_output_tokens + 1,
                                                        r.max_output_tokens - 1),
                                   r.max_output_tokens, True) for r in run]


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 30), st.integers(1, 4),
                              st.integers(1, 200)), max_size=80),
       load=st.sampled_from([1, 2, 256]))
def test_footprint_index_keeps_the_sorted_order(ops: list[tuple[bool, int, int, int]],
                                                load: int) -> None:
    """``_FootprintIndex.buckets`` (what a walk reads in order) are the live keys in the
    sorted order, each bucket nonempty, at most ``2 * load`` long, ``maxes`` its last key,
    through adds (again too), discards and clears."""
    from ppas.policies.sortedf import _FootprintIndex
    idx = _FootprintIndex()
    idx.load = load  # type: ignore[misc]
    for step, (add, i, o, prompt) in enumerate(ops):
        r = RequestSnapshot(f"w{i}", float(i % 3), prompt * 16, 0, 0, o)
        if add:
            idx.add(r)
        elif i == 0 and step % 7 == 0:
            idx.clear()
        else:
            idx.discard(r)
        assert [k for b in idx.buckets for k in b] == sorted(k for k, _ in idx.live.values())
        assert all(0 < len(b) <= 2 * load for b in idx.buckets)
        assert idx.maxes == [b[-1] for b in idx.buckets]


@settings(max_examples=200, deadline=None)
@given(model=st.sampled_from(["qwen2.5-0.5b", "qwen2.5-3b"]),
       target=st.floats(0.001, 0.2), under=st.sampled_from([0, 0.5, 1, 4]),
       over=st.sampled_from([0, 1, 4]), l_min=st.sampled_from([16, 256, 300]),
       c_max=st.sampled_from([300, 4096, 8192]),
       steps=st.lists(st.tuples(st.integers(0, 64), st.integers(0, 40000)), min_size=1,
                      max_size=12))
def test_lprs_chunk_search_is_the_scan(model: str, target: float, under: float, over: float,
                                       l_min: int, c_max: int,
                                       steps: list[tuple[int, int]]) -> None:
    """``lprs-apc``'s chunk from the last step's boundary (``_chunk_monotone``) is the scan
    of every candidate's (``_chunk``), step after step (the guess carried over), with
    penalties of weight 0 (ties: the larger chunk)."""
    if c_max < l_min:
        return
    cm = RooflineCostModel("l40s", model)
    p = make_policy(f"lprs-apc:target_s={target!r},under_w={under},over_w={over},"
                    f"l_min={l_min},c_max={c_max}")
    assert isinstance(p, LprsApc)
    p.bind_cost_model(cm)
    for n_dec, k in steps:
        t = cm.chunk_time(0, n_dec, k * n_dec)
        assert p._chunk_monotone(t) == p._chunk(t), (n_dec, k)


def test_lprs_smallest_memo_is_the_heaps() -> None:
    """The index's answer kept while nobody enters or leaves (``_ScoreIndex.memo``) is the
    heap's at every later ``now``, through the rounding margin's growth (keys 1e-7 apart
    come within it as ``now`` grows), and is dropped on a change."""
    from ppas.policies.lprs import _ScoreIndex
    reqs = [RequestSnapshot(f"w{i}", 1.0 + (i % 5) * 1e-7, 100) for i in range(12)]
    idx, ref = _ScoreIndex(0.0), _ScoreIndex(0.0)
    for r in reqs:
        idx.add(r)
    for n in (1, 3):
        for now in (2.0, 2.0, 50.0, 1e3, 1e5, 1e7, 1e9, 2.0):  # (and back: no longer in)
            ref.clear()
            for r in reqs:
                ref.add(r)
            want = [(x, r.request_id) for x, r in ref.smallest(n, now)]
            ref.restore()
            got = [(x, r.request_id) for x, r in idx.smallest(n, now)]
            idx.restore()
            assert got == want, (now, n)
    idx.discard(reqs[0])
    assert idx.memo is None
