"""Seed policies read the head of the waiting queue, not all of it, and decide as before.

Each policy here stops reading ``SchedulerView.requests`` once the rest of the queue can
no longer change its decision (``sloweave``, ``tbt-ladder``), reads the waiting prompts'
total from the engine (``ppas-auto``, ``SchedulerView.waiting_prompt_tokens``), or lists
only the waiting requests the step can admit (``flowprefill``, its order's head taken from
an index of the waiting queue kept between steps). The straightforward rule
(every request read, every pending prompt listed) is kept here as the reference: on
random bursts, with preemption, prefix caching and small admission limits, the simulator
gives the same run under both, request by request and step by step.
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from policy_views import Counting, run_of

from ppas.core.decision import Decision
from ppas.core.view import (
    RequestView,
    SchedulerView,
    is_pending_prefill,
    pending_prefills,
    uncached_prompt_tokens,
)
from ppas.cost.base import largest_chunk_within
from ppas.cost.roofline import RooflineCostModel
from ppas.engine.simulator import EngineConfig, simulate
from ppas.policies import make_policy
from ppas.policies.auto import PpasAuto
from ppas.policies.base import Policy
from ppas.policies.deflection import TbtLadder, ladder_chunk
from ppas.policies.feather import ChunkedHashTree, Feather, level_keys
from ppas.policies.flowprefill import FlowPrefill
from ppas.policies.sloweave import SloWeave
from ppas.workload import RequestSpec

SMALL = RooflineCostModel("l40s", "qwen2.5-0.5b")


# -- the straightforward rules: every request read -------------------------------------------
class WholeSloWeave(SloWeave):
    def decide(self, view: SchedulerView) -> Decision:
        cfg = self.config
        if view.num_running_decodes == 0:
            return Decision(cfg.mbt)
        deadline = float("inf")
        dctx = n_dec = left = 0
        head_ctx = -1
        for r in view.requests:
            if is_pending_prefill(r):
                left += r.prompt_tokens - r.num_computed_tokens
                if head_ctx < 0:
                    head_ctx = r.num_computed_tokens
            else:
                n_dec += 1
                dctx += r.num_computed_tokens
                last = r.last_token_time if r.last_token_time is not None else view.now
                deadline = min(deadline, last + (r.tpot_slo or cfg.tpot_s))
        if left == 0:
            return Decision(0)
        budget = max(0.0, deadline - view.now) - cfg.margin_s
        if budget <= 0:
            return Decision(0)
        assert self.cost_model is not None
        return Decision(largest_chunk_within(self.cost_model, budget, n_dec,
                                             min(cfg.c_max, left),
                                             dctx // max(1, n_dec), max(0, head_ctx)))


class WholeTbtLadder(TbtLadder):
    def decide(self, view: SchedulerView) -> Decision:
        if view.num_running_decodes == 0:
            return Decision(self.config.mbt)
        if view.num_pending_prefills == 0:
            return Decision(0)
        assert self.cost_model is not None
        dctx, head_ctx = 0, -1
        for r in view.requests:
            if not is_pending_prefill(r):
                dctx += r.num_computed_tokens
            elif head_ctx < 0:
                head_ctx = r.num_computed_tokens
        c = ladder_chunk(self.cost_model, self.config.tbt_slo, view.num_running_decodes,
                         dctx, max(0, head_ctx), self.ladder)
        return Decision(c or self.ladder[-1])


class WholePpasAuto(PpasAuto):
    def decide(self, view: SchedulerView) -> Decision:
        hidden = SchedulerView(view.now, view.requests, view.num_pending_prefills,
                               view.num_running_decodes, view.max_num_batched_tokens,
                               view.max_num_seqs, view.recent_steps, view.waiting_log, None)
        return super().decide(hidden)  # no engine total: every request read


class WholeFlowPrefill(FlowPrefill):
    def decide(self, view: SchedulerView) -> Decision:
        cfg = self.config
        if view.num_pending_prefills <= 1:
            return Decision(cfg.mbt)
        pending = pending_prefills(view)
        remaining = self._remaining_time(view)

        def key(r: RequestView) -> float:
            if r.ttft_slo is None:
                return 0.0
            deadline = r.arrival_time + r.ttft_slo
            slack = (deadline - view.now) - remaining(r)
            return (1.0 if slack >= 0 else -1.0) / max(deadline, 1e-9)

        pending.sort(key=key, reverse=True)  # every pending prompt listed
        return Decision(cfg.batch_tokens, tuple(r.request_id for r in pending))


class Checked(Policy):
    """``inner``'s decisions, checking the engine's waiting total at every step."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.config, self.spec, self.name = inner.config, inner.spec, inner.name

    @property
    def max_num_batched_tokens(self) -> int:
        return self.inner.max_num_batched_tokens

    @property
    def history_window(self) -> int:  # type: ignore[override]
        return self.inner.history_window

    def bind_cost_model(self, cost_model: object) -> None:
        self.inner.bind_cost_model(cost_model)  # type: ignore[arg-type]

    def decide(self, view: SchedulerView) -> Decision:
        assert view.waiting_prompt_tokens == sum(
            r.prompt_tokens for r in view.requests if not r.is_running)
        return self.inner.decide(view)


PAIRS = {"sloweave": WholeSloWeave, "tbt-ladder": WholeTbtLadder, "ppas-auto": WholePpasAuto,
         "flowprefill": WholeFlowPrefill}


def fresh(name: str, whole: bool) -> Policy:
    p = make_policy(name)
    if whole:
        cls = PAIRS[name]
        q = cls.__new__(cls)
        q.__dict__.update(p.__dict__)
        return q
    return p


burst = st.tuples(st.floats(0.0, 0.3, allow_nan=False),
                  st.one_of(st.integers(1, 300), st.integers(1, 6000)),
                  st.integers(1, 6), st.one_of(st.none(), st.floats(0.01, 0.5)),
                  st.one_of(st.none(), st.integers(0, 2)))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(burst, min_size=2, max_size=30), extra=st.integers(0, 300),
       seqs=st.integers(1, 8), caching=st.booleans(), name=st.sampled_from(sorted(PAIRS)))
def test_same_run_as_the_whole_queue_read(
        reqs: list[tuple[float, int, int, float | None, int | None]], extra: int, seqs: int,
        caching: bool, name: str) -> None:
    specs = [RequestSpec(a, p, o, ttft, None,
                         prefix=() if g is None else ((f"g{g}", min(p, 512)),))
             for a, p, o, ttft, g in reqs]
    blocks = max(-(-(s.prompt_tokens + s.output_tokens) // 16) for s in specs) + extra
    engine = EngineConfig(num_kv_blocks=blocks, max_num_seqs=seqs, prefix_caching=caching)
    fast = simulate(specs, Checked(fresh(name, False)), SMALL, engine, record_steps=True)
    whole = simulate(specs, fresh(name, True), SMALL, engine, record_steps=True)
    assert run_of(fast) == run_of(whole)


def test_reads_do_not_grow_with_the_queue() -> None:
    """Behind 8 running requests, 10,000 waiting: ``sloweave`` reads until ``c_max``
    prompt tokens are counted, ``tbt-ladder`` and ``ppas-auto`` (with the engine's total)
    one past the running requests."""
    from ppas.core.view import RequestSnapshot
    running: list[RequestView] = [
        RequestSnapshot(f"d{i}", 0.0, 1000, 1000 + i, i + 1, 64, True, 9.99) for i in range(8)]
    waiting: list[RequestView] = [
        RequestSnapshot(f"w{i}", 1.0 + i * 1e-3, 1000) for i in range(10_000)]
    reqs = Counting(running + waiting)
    view = SchedulerView(10.0, reqs, 10_000, 8, 8192, 16, (), None, 10_000 * 1000)
    for name, most in (("sloweave", 8 + 5), ("tbt-ladder", 9), ("ppas-auto", 9)):
        p = make_policy(name)
        p.bind_cost_model(SMALL)
        reqs.read = 0
        p.decide(view)
        assert reqs.read <= most, (name, reqs.read)
    fp = make_policy("flowprefill")
    fp.bind_cost_model(SMALL)
    d = fp.decide(view)
    # without a waiting log the queue may not be FCFS: every pending prompt listed (with
    # one: test_flowprefill_index_reads_the_head)
    assert d.prefill_order is not None and len(d.prefill_order) == 10_000


# -- flowprefill's index: the order's head without the sort ------------------------------------
req = st.tuples(st.floats(0.0, 0.2, allow_nan=False),
                st.one_of(st.integers(1, 300), st.integers(1, 6000)),
                st.integers(1, 6),
                st.one_of(st.none(), st.floats(0.005, 0.8),
                          st.sampled_from([0.05, 0.1, 0.2])),  # (equal deadlines: ties)
                st.one_of(st.none(), st.integers(0, 2)), st.integers(0, 2))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(req, min_size=2, max_size=40), extra=st.integers(0, 300),
       seqs=st.integers(1, 8), caching=st.booleans(), priority=st.booleans(),
       batch=st.sampled_from([64, 512, 2048]))
# Two requests with one deadline and different prompts (7 and 8), the one with more to
# prefill late first: a step that lists every prompt moves 8 ahead of 7, a cut one left
# them in the queue's order, and once both were late the tie read it (found by this test).
@example(reqs=[(0.0, 1, 1, None, None, 0)] * 5 + [
    (0.0, 849, 5, None, None, 2), (0.0, 3, 3, None, None, 2),
    (0.05103836670796086, 5, 3, 0.125, None, 2), (0.0, 2, 3, 0.125, None, 2)],
    extra=23, seqs=1, caching=False, priority=False, batch=64)
def test_flowprefill_index_same_run(
        reqs: list[tuple[float, int, int, float | None, int | None, int]], extra: int,
        seqs: int, caching: bool, priority: bool, batch: int) -> None:
    """Requests one by one (gaps of 0 included: equal deadlines), with and without TTFT
    SLOs, slack running out while they wait, preemption (small KV), prefix caching, small
    admission limits and budgets, FCFS and priority scheduling: the run of the indexed
    ``flowprefill`` is the straightforward rule's, step by step."""
    t = 0.0
    specs = []
    for gap, p, o, ttft, g, prio in reqs:
        t += gap
        specs.append(RequestSpec(t, p, o, ttft, None, priority=prio,
                                 prefix=() if g is None else ((f"g{g}", min(p, 512)),)))
    blocks = max(-(-(s.prompt_tokens + s.output_tokens) // 16) for s in specs) + extra
    engine = EngineConfig(num_kv_blocks=blocks, max_num_seqs=seqs, prefix_caching=caching,
                          scheduling_policy="priority" if priority else "fcfs")
    name = f"flowprefill:batch_tokens={batch},mbt=4096"
    fast = simulate(specs, make_policy(name), SMALL, engine, record_steps=True)
    p = make_policy(name)
    whole = WholeFlowPrefill.__new__(WholeFlowPrefill)
    whole.__dict__.update(p.__dict__)
    ref = simulate(specs, whole, SMALL, engine, record_steps=True)
    assert run_of(fast) == run_of(ref)


def test_flowprefill_index_reads_the_head() -> None:
    """10,000 waiting requests with TTFT SLOs (distinct deadlines; some late, some without
    an SLO) behind 8 running: once the index has followed the log, a step reads the
    running requests and the queue's head only (those without an SLO come from there),
    and lists what the whole rule lists."""
    from ppas.core.view import RequestSnapshot, WaitingLog
    running: list[RequestView] = [
        RequestSnapshot(f"d{i}", 0.0, 1000, 1000 + i, i + 1, 64, True, 9.99) for i in range(8)]
    waiting: list[RequestView] = [
        RequestSnapshot(f"w{i}", 1.0 + i * 1e-3, 1000,
                        ttft_slo=None if i % 7 == 0 else 11.0 + (i * 7919 % 10_000 - i) * 1e-3)
        for i in range(10_000)]
    log = WaitingLog()
    log.events.extend((True, r) for r in waiting)
    reqs = Counting(running + waiting)
    fp = make_policy("flowprefill")
    fp.bind_cost_model(SMALL)
    whole = make_policy("flowprefill")
    whole.bind_cost_model(SMALL)
    for now, caching in ((10.0, False), (10.5, True), (15.0, False), (25.0, True)):
        view = SchedulerView(now, reqs, 10_000, 8, 8192, 16, (), log, 10_000 * 1000,
                             caching)
        reqs.read = 0
        d = fp.decide(view)
        if now > 10.0:
            # the running requests, then the queue's head: none read while requests on
            # time fill the list; once all are late, up to the 8th without an SLO (every
            # 7th request; the queue is read past the running ones again)
            assert reqs.read <= (9 if now < 20 else 9 + 8 + 7 * 7 + 1), reqs.read
        assert d == whole.decide_whole(view)  # type: ignore[attr-defined]
        assert d.prefill_order is not None  # 16 seqs less 8 running; 2048 tokens
        assert len(d.prefill_order) == (8 if caching else 3)


# -- feather: the hash tree without the whole queue's keys -------------------------------------
class WholeFeather(Feather):
    """Feather as first written: the whole tree built from every request every step."""

    def decide(self, view: SchedulerView) -> Decision:
        cfg = self.config
        waiting = [r for r in view.requests if not r.is_running]
        if not waiting:
            return Decision(cfg.budget)
        tree = ChunkedHashTree()
        budget = 0
        batch = 0
        for r in view.requests:
            if r.is_running:
                batch += 1
                tree.add_batch(level_keys(r, cfg.chunk, cfg.block_size))
                budget += max(0, r.prompt_tokens - r.num_computed_tokens)
        order: list[str] = []
        aged = [r for r in waiting if view.now - r.arrival_time >= cfg.max_wait_s]
        aged.sort(key=lambda r: r.arrival_time)
        fresh = [r for r in waiting if view.now - r.arrival_time < cfg.max_wait_s]
        keys = [level_keys(r, cfg.chunk, cfg.block_size) for r in fresh]
        for r in aged:
            order.append(r.request_id)
            tree.add_batch(level_keys(r, cfg.chunk, cfg.block_size))
            budget += uncached_prompt_tokens(r)
            batch += 1
        for k in keys:
            tree.add_waiting(k)
        stopped = False
        while len(order) < len(waiting):
            best = tree.pop_best()
            if best is None:
                break
            i, ov = best
            r = fresh[i]
            if (batch > 0 and batch >= cfg.min_batch and ov < cfg.min_overlap
                    and r.num_cached_tokens < cfg.cached_fraction * r.prompt_tokens):
                stopped = True
                break
            order.append(r.request_id)
            tree.add_batch(keys[i])
            budget += uncached_prompt_tokens(r)
            batch += 1
        if not stopped:
            return Decision(cfg.budget, tuple(order))
        return Decision(min(cfg.budget, budget), tuple(order))


class Compared(Policy):
    """``fast``'s decisions, each checked equal to ``whole``'s on the same view."""

    def __init__(self, fast: Policy, whole: Policy) -> None:
        self.fast, self.whole = fast, whole
        self.config, self.spec, self.name = fast.config, fast.spec, fast.name
        self.steps = 0

    @property
    def max_num_batched_tokens(self) -> int:
        return self.fast.max_num_batched_tokens

    def decide(self, view: SchedulerView) -> Decision:
        d = self.fast.decide(view)
        assert d == self.whole.decide(view), self.steps
        assert hint_holds(d, view), self.steps
        self.steps += 1
        return d


def hint_holds(d: Decision, view: SchedulerView) -> bool:
    """``d.order_kept`` (not part of the decision's equality) is what it says: the order's
    first ``order_kept`` ids are the view's first waiting requests'."""
    k = d.order_kept
    waiting = [r.request_id for r in view.requests if not r.is_running]
    return k == 0 or (len(waiting) >= k and tuple(waiting[:k]) == (d.prefill_order or ())[:k])


fgroup = st.sampled_from([None, 0, 1, 2])
freq = st.tuples(st.sampled_from([0.0, 0.005, 0.01, 0.02, 0.05]),
                 st.one_of(st.integers(1, 200), st.integers(64, 3000)),
                 st.integers(1, 6), fgroup, fgroup, st.integers(0, 2))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(freq, min_size=2, max_size=40), extra=st.integers(0, 2000),
       seqs=st.integers(1, 8), caching=st.booleans(), priority=st.booleans(),
       budget=st.sampled_from([256, 1024, 8192]), min_batch=st.integers(0, 4),
       min_overlap=st.integers(0, 2), wait=st.sampled_from([0.01, 0.05, 0.2]),
       frac=st.sampled_from([0.3, 1.0]))
def test_feather_same_decisions_as_the_whole_tree(
        reqs: list[tuple[float, int, int, int | None, int | None, int]], extra: int,
        seqs: int, caching: bool, priority: bool, budget: int, min_batch: int,
        min_overlap: int, wait: float, frac: float) -> None:
    """Shared prefixes two levels deep (a group, then a subgroup), equal arrivals, aging,
    preemption, prefix caching (``num_cached_tokens`` moving while requests wait), small
    admission limits, FCFS and priority: every step's Decision is the whole tree's."""
    t = 0.0
    specs = []
    for gap, p, o, g, sub, prio in reqs:
        t += gap
        prefix: tuple[tuple[str, int], ...] = ()
        if g is not None:
            prefix = ((f"g{g}", min(p, 128)),)
            if sub is not None and p > 128:
                prefix += ((f"g{g}s{sub}", min(p - 128, 192)),)
        specs.append(RequestSpec(t, p, o, None, None, priority=prio, prefix=prefix))
    blocks = max(-(-(s.prompt_tokens + s.output_tokens) // 16) for s in specs) + extra
    engine = EngineConfig(num_kv_blocks=blocks, max_num_seqs=seqs, prefix_caching=caching,
                          scheduling_policy="priority" if priority else "fcfs")
    name = (f"feather:budget={budget},chunk=64,min_batch={min_batch},"
            f"min_overlap={min_overlap},max_wait_s={wait},cached_fraction={frac}")
    p = make_policy(name)
    whole = WholeFeather.__new__(WholeFeather)
    whole.__dict__.update(make_policy(name).__dict__)
    compared = Compared(p, whole)
    simulate(specs, compared, SMALL, engine)


fview_req = st.tuples(st.booleans(), st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]),
                      st.integers(1, 400), st.lists(st.integers(0, 1), max_size=8),
                      st.integers(0, 400), st.integers(0, 400))


@settings(max_examples=300, deadline=None)
@given(reqs=st.lists(fview_req, min_size=1, max_size=30), budget=st.integers(1, 2000),
       min_batch=st.integers(0, 6), min_overlap=st.integers(0, 3),
       frac=st.sampled_from([0.2, 0.5, 1.0]), now=st.sampled_from([2.0, 3.5]))
def test_feather_decide_is_the_whole_trees_on_views(
        reqs: list[tuple[bool, float, int, list[int], int, int]], budget: int,
        min_batch: int, min_overlap: int, frac: float, now: float) -> None:
    """Hand-made views: prompts on a binary tree of 32-token chunks (equal chunk paths,
    equal keys), running and waiting, aged (``max_wait_s`` 1) or not, equal arrivals,
    cached tokens: ``decide`` gives the whole tree's Decision, twice (the keys cached)."""
    from ppas.core.view import RequestSnapshot
    views = []
    for p in range(2):
        rs: list[RequestView] = []
        for n, (running, arrival, prompt, path, done, cached) in enumerate(reqs):
            hashes = tuple(("h", *path[:b // 2 + 1], b % 2) for b in range(2 * len(path)))
            rs.append(RequestSnapshot(
                f"r{n}", arrival, prompt + 32 * len(path) * p, min(done, prompt) if running
                else 0, 0, 4, running, None, block_hashes=hashes,
                num_cached_tokens=0 if running else min(cached, prompt)))
        rs.sort(key=lambda r: not r.is_running)  # running first, then waiting
        views.append(SchedulerView(now, rs, 0, 0, budget, 8))
    name = (f"feather:budget={budget},chunk=32,min_batch={min_batch},"
            f"min_overlap={min_overlap},max_wait_s=1,cached_fraction={frac}")
    fast = make_policy(name)
    whole = WholeFeather.__new__(WholeFeather)
    whole.__dict__.update(make_policy(name).__dict__)
    for view in (*views, *views):
        assert fast.decide(view) == whole.decide(view)


# bursts at a few instants (equal arrivals), prompts in a few groups sharing a prefix
kreq = st.tuples(st.sampled_from([0.0, 0.0, 0.0005, 0.002, 0.01]),
                 st.one_of(st.integers(1, 300), st.integers(100, 2500)),
                 st.integers(1, 12), fgroup)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(kreq, min_size=8, max_size=70), extra=st.integers(0, 400),
       seqs=st.integers(1, 6), caching=st.booleans(), spare=st.sampled_from([0, 4096]),
       budget=st.sampled_from([256, 2048]), min_batch=st.integers(0, 4),
       min_overlap=st.integers(0, 2), wait=st.sampled_from([0.002, 0.01, 0.05]))
def test_feather_kept_aged_list_is_the_whole_trees(
        reqs: list[tuple[float, int, int, int | None]], extra: int, seqs: int,
        caching: bool, spare: int, budget: int, min_batch: int, min_overlap: int,
        wait: float) -> None:
    """Long queues under FCFS (a waiting log): most requests age while they wait, behind
    few admission slots and a small KV cache (preemption puts a request back in front
    of the aged ones), arrivals equal in bursts, prefixes shared, the log trimmed or
    not: every step's Decision is the whole tree's, where ``Feather`` keeps the last
    step's aged list and its keys (``feather._Aged``)."""
    from ppas.core.view import WaitingLog
    t = 0.0
    specs = []
    for gap, p, o, g in reqs:
        t += gap
        prefix = () if g is None else ((f"g{g}", min(p, 96)),)
        specs.append(RequestSpec(t, p, o, None, None, prefix=prefix))
    blocks = max(-(-(s.prompt_tokens + s.output_tokens) // 16) for s in specs) + extra
    engine = EngineConfig(num_kv_blocks=blocks, max_num_seqs=seqs, prefix_caching=caching)
    name = (f"feather:budget={budget},chunk=32,min_batch={min_batch},"
            f"min_overlap={min_overlap},max_wait_s={wait}")
    whole = WholeFeather.__new__(WholeFeather)
    whole.__dict__.update(make_policy(name).__dict__)
    old = WaitingLog.SPARE
    WaitingLog.SPARE = spare  # 0: the log is trimmed often, the aged list read again
    try:
        simulate(specs, Compared(make_policy(name), whole), SMALL, engine)
    finally:
        WaitingLog.SPARE = old


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n_run=st.integers(0, 3), budget=st.integers(1, 600),
       min_batch=st.integers(0, 5), min_overlap=st.integers(0, 2))
def test_feather_kept_aged_list_on_any_engine(data: st.DataObject, n_run: int, budget: int,
                                              min_batch: int, min_overlap: int) -> None:
    """Hand-made views and log of an engine that may not follow the order: arrivals
    (equal, or older than requests aged), admissions from the head or anywhere,
    admitted requests back in front (preemption), the queue shuffled, the clock still or
    going back: every step's Decision is the whole tree's (``feather._Aged`` checks
    the kept list against each view). The log's front says what the queue starts with
    where the engine followed an order read off a log, and keeps saying it (less the
    head admitted) while the queue is not reordered."""
    from ppas.core.order import IdLog, LoggedOrder
    from ppas.core.view import RequestSnapshot, WaitingLog
    n = 0

    def request(arrival: float, running: bool = False) -> RequestSnapshot:
        nonlocal n
        n += 1
        path = data.draw(st.lists(st.integers(0, 1), max_size=4))
        hashes = tuple(("h", *path[:b // 2 + 1], b % 2) for b in range(2 * len(path)))
        prompt = data.draw(st.integers(1, 200)) + 32 * len(path)
        return RequestSnapshot(f"r{n}", arrival, prompt, 5 if running else 0, 0, 4, running,
                               None, block_hashes=hashes,
                               num_cached_tokens=0 if running else data.draw(
                                   st.integers(0, prompt)))

    name = (f"feather:budget={budget},chunk=32,min_batch={min_batch},"
            f"min_overlap={min_overlap},max_wait_s=1")
    fast = make_policy(name)
    whole = WholeFeather.__new__(WholeFeather)
    whole.__dict__.update(make_policy(name).__dict__)
    log = WaitingLog()
    running: list[RequestView] = [request(0.0, True) for _ in range(n_run)]
    queue: list[RequestView] = []
    now = 2.0
    for _ in range(data.draw(st.integers(1, 12))):
        for _ in range(data.draw(st.integers(0, 6))):
            r = request(now - data.draw(st.sampled_from([0.0, 0.5, 1.0, 1.5, 3.0])))
            queue.append(r)
            log.events.append((True, r))
        view = SchedulerView(now, running + queue, len(queue), n_run, budget, 8, (), log)
        d = fast.decide(view)
        assert d == whole.decide(view)
        assert hint_holds(d, view)
        how = data.draw(st.sampled_from(["follow", "follow", "keep", "shuffle"]))
        if how == "follow":  # the order's requests first (order_waiting)
            rank = {rid: i for i, rid in enumerate(d.prefill_order or ())}
            queue.sort(key=lambda r: rank.get(r.request_id, len(rank)))
            o = d.prefill_order
            log.front = None
            if isinstance(o, LoggedOrder) and all(
                    a == r.request_id for a, r in zip(o, queue, strict=False)) and (
                    len(queue) >= len(o)):  # (every id listed waits: the engine says so)
                log.front = LoggedOrder(o.log, o.lo, o.hi, ())
        elif how == "shuffle":
            queue = list(data.draw(st.permutations(queue)))
            log.front = None
            if data.draw(st.booleans()):  # (true of the queue, but another log's ids)
                other = IdLog()
                lo = fast._aged.lo  # type: ignore[attr-defined]
                j = data.draw(st.integers(0, len(queue)))
                other.extend(["-"] * lo + [r.request_id for r in queue[:j]])
                log.front = other.order(lo, lo + j)
        k = data.draw(st.integers(0, len(queue)))
        if data.draw(st.booleans()):
            gone, queue = queue[:k], queue[k:]
            f = log.front
            if f is not None:  # (its head admitted)
                log.front = LoggedOrder(f.log, min(f.lo + k, f.hi), f.hi, ())
        else:
            log.front = None
            picked = data.draw(st.sets(st.integers(0, len(queue) - 1), max_size=k)
                               if queue else st.just(set()))
            gone = [r for i, r in enumerate(queue) if i in picked]
            queue = [r for i, r in enumerate(queue) if i not in picked]
        log.events.extend((False, r) for r in gone)
        if gone and data.draw(st.booleans()):  # preempted: back in front
            log.front = None
            queue.insert(0, gone[0])
            log.events.append((True, gone[0]))
        now += data.draw(st.sampled_from([0.0, 0.3, 0.5, 1.0, -0.4]))


def test_flowprefill_index_leaves_ties_to_the_queue() -> None:
    """Two late waiting requests with equal deadlines, in the queue in the opposite order
    of their entries in the log (an earlier step moved the second ahead): the whole rule
    keeps the queue's order, and so does ``decide`` (the index sees the tie and sorts the
    queue); one slot left, so the order decides who is admitted."""
    from ppas.core.view import RequestSnapshot, WaitingLog
    run = RequestSnapshot("d", 0.0, 100, 100, 1, 64, True, 0.9)
    a = RequestSnapshot("a", 0.0, 4000, ttft_slo=0.1)
    b = RequestSnapshot("b", 0.0, 3000, ttft_slo=0.1)
    c = RequestSnapshot("c", 0.0, 500, ttft_slo=0.3)  # late, a later deadline: first
    log = WaitingLog()
    log.events.extend([(True, a), (True, b), (True, c)])
    fp = make_policy("flowprefill")
    fp.bind_cost_model(SMALL)
    fp.decide(SchedulerView(0.5, [run, a, b, c], 3, 1, 8192, 3, (), log, 7500, True))
    view = SchedulerView(1.0, [run, b, a, c], 3, 1, 8192, 3, (), log, 7500, True)
    d = fp.decide(view)  # (the index follows the log: no event since the last step)
    assert d == fp.decide_whole(view)  # type: ignore[attr-defined]
    # (the tied pair shares a deadline but not a remaining time: listed whole, b first)
    assert d.prefill_order == ("c", "b", "a")
