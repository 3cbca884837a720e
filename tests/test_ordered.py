"""The ordered policy: shortest remaining prefill first, the aging bound (checked on random
views and in the simulator), its budget and admission limit, and its model-free fallback."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from policy_views import dec, view

from ppas.core.decision import Decision
from ppas.core.view import (
    OutputLengths,
    RequestSnapshot,
    SchedulerView,
    StepRecord,
    WaitingLog,
    is_pending_prefill,
    view_counts,
)
from ppas.cost.base import StepShape
from ppas.cost.roofline import RooflineCostModel
from ppas.cost.steps import StepCosts
from ppas.engine.request import SimRequest
from ppas.engine.result import SimResult
from ppas.engine.simulator import EngineConfig, simulate
from ppas.engine.solo import solo_latency
from ppas.policies import Policy, make_policy
from ppas.policies.ordered import Ordered
from ppas.workload import RequestSpec

CM = RooflineCostModel("h100-sxm-80gb", "qwen3-8b", max_num_batched_tokens=8192)


def ordered(spec: str = "ordered") -> Ordered:
    p = make_policy(spec)
    assert isinstance(p, Ordered)
    p.bind_cost_model(CM)
    return p


def waiting(rid: str, prompt: int, arrival: float, out: int = 16,
            cached: int = 0) -> RequestSnapshot:
    return RequestSnapshot(rid, arrival, prompt, max_output_tokens=out, num_cached_tokens=cached)


def test_shorter_prompts_first() -> None:
    p = ordered()
    v = view([dec(0, ctx=2000), waiting("long", 6000, 9.9), waiting("short", 100, 9.95),
              waiting("mid", 1500, 9.8)])
    assert p.decide(v).prefill_order == ("short", "mid", "long")


def test_prefix_cache_hit_shortens_the_key() -> None:
    p = ordered()
    v = view([dec(0, ctx=2000), waiting("a", 6000, 9.9, cached=5600),
              waiting("b", 1000, 9.9)])
    assert p.decide(v).prefill_order == ("a", "b")  # 400 uncached tokens against 1000


def test_aging_promotes_old_requests_fcfs() -> None:
    p = ordered("ordered:aging=5,drain=0,turn=0")
    solo_long = p.solo_estimate(6000, 16)
    now = 10.0
    old = waiting("old", 6000, now - 5 * solo_long - 1e-3)
    older = waiting("older", 8000, now - 100)
    v = view([dec(0, ctx=2000), waiting("short", 100, now - 1e-3), old, older], now=now)
    assert p.decide(v).prefill_order == ("older", "old", "short")
    # Just short of its bound, the long one waits behind the short one.
    young = waiting("old", 6000, now - 5 * solo_long + 1e-3)
    v = view([dec(0, ctx=2000), waiting("short", 100, now - 1e-3), young], now=now)
    assert p.decide(v).prefill_order == ("short", "old")


def test_aging_zero_keeps_the_engine_order() -> None:
    p = ordered("ordered:aging=0")
    v = view([dec(0, ctx=2000), waiting("long", 6000, 9.0), waiting("short", 100, 9.5)])
    assert p.decide(v).prefill_order == ("long", "short")


@pytest.mark.parametrize(("prompt", "out"), [(100, 10), (2000, 30), (7000, 200), (20000, 5)])
def test_solo_estimate_is_close_to_the_engines(prompt: int, out: int) -> None:
    s = ordered().solo_estimate(prompt, out)
    ref = solo_latency(prompt, out, CM).e2e
    assert s == pytest.approx(ref, rel=0.1)


@pytest.mark.parametrize(("prompt", "out"), [(100, 10), (2000, 300), (7000, 2000), (20000, 5)])
def test_solo_prefill_is_the_solo_ttft_whatever_the_outputs(prompt: int, out: int) -> None:
    p = ordered("ordered:solo=prefill")
    s = p.solo_estimate(prompt, out)
    assert s == p.solo_estimate(prompt, 1)  # the outputs (a max_tokens cap in vLLM) unread
    assert s == pytest.approx(solo_latency(prompt, out, CM).ttft, rel=0.1)
    assert s < ordered().solo_estimate(prompt, out) or out == 1


def test_solo_prefill_ages_a_long_output_request_by_its_prefill() -> None:
    # A 6k-token prompt with 2,000 outputs: alone, its prefill takes a fraction of a second
    # and its decode tens of seconds. Aged by its solo E2E it would be passed by every
    # shorter prompt for minutes; aged by its solo prefill it goes first after K of those.
    e2e = ordered("ordered:aging=5,drain=0,turn=0")  # the aging scale alone
    pre = ordered("ordered:aging=5,drain=0,solo=prefill,turn=0")
    now = 100.0
    waited = 5 * pre.solo_estimate(6000, 2000) + 1e-3
    assert waited < 5 * e2e.solo_estimate(6000, 2000)
    v = view([dec(0, ctx=2000), waiting("short", 100, now - 1e-3),
              waiting("long", 6000, now - waited, out=2000)], now=now)
    assert e2e.decide(v).prefill_order == ("short", "long")
    assert pre.decide(v).prefill_order == ("long", "short")


def test_kv_footprint_false_leaves_admission_to_the_engine() -> None:
    # 10,000 KV tokens: beside a decode's 2,032, a 4,000-token prompt fits but its whole
    # footprint (prompt + 8,000 outputs) does not. The footprint rule admits nothing this
    # step; without it the prompt is listed and budgeted, and vLLM's own admission (its
    # prompt's blocks) and preemption decide.
    v = view([dec(0, ctx=2000), waiting("w", 4000, 9.9, out=8000)])
    p, q = ordered(), ordered("ordered:kv_footprint=false")
    p.kv_capacity = q.kv_capacity = 10_000
    assert p.decide(v).prefill_budget == 0
    d = q.decide(v)
    assert d.prefill_order == ("w",) and d.prefill_budget >= 4000
    p.kv_capacity = 20_000  # room for the footprint: the same decision as without the rule
    assert p.decide(v) == d


def test_budget_knee_grows_with_riding_decodes() -> None:
    p = ordered("ordered:c_max=16384")
    few = p.chunk(1, 2000)
    many = p.chunk(200, 200 * 4000)
    assert p.config.c_min <= few <= many <= p.config.c_max
    assert few < p.config.c_max  # the knee is below the biggest chunk on an H100


def test_admission_limit_holds_waiting_prompts() -> None:
    p = ordered("ordered:kv_ratio=0.01")  # a limit of 1: the decode fills it
    v = view([dec(0, ctx=2000), waiting("w", 500, 9.9)])
    assert p.decide(v).prefill_budget == 0
    q = ordered("ordered:kv_ratio=0")
    assert q.decide(v).prefill_budget > 0


def test_without_cost_model_ppas_budget_and_measured_aging() -> None:
    p = make_policy("ordered:aging=2,drain=0")
    p.bind_cost_model(None)
    reqs = [dec(0, ctx=2000), waiting("long", 6000, 9.0), waiting("short", 100, 9.9)]
    d = p.decide(view(reqs))
    assert d.prefill_budget == 2048  # P-PAS: two prompts pending beside a decode
    assert d.prefill_order == ("long", "short")  # no step measured yet: engine order
    step = StepRecord(9.5, 0.05, 0.05, 2048, 2048, 1, 1, 1)  # 24 us per token
    d = p.decide(view(reqs, steps=(step,)))
    assert d.prefill_order == ("short", "long")  # long waited 1 s < 2 x its solo
    d = p.decide(view(reqs, now=20.0, steps=(step,)))
    assert d.prefill_order == ("long", "short")  # 11 s: overdue
    # Measured, too, the prefill alone with solo=prefill: outputs change no deadline.
    q = make_policy("ordered:aging=2,drain=0,solo=prefill")
    assert isinstance(q, Ordered)
    q.bind_cost_model(None)
    solo = q.solo_function(view(reqs, steps=(step,)))
    assert solo is not None and solo(6000, 1) == solo(6000, 500) == 0.05 / 2049 * 6000


# -- invariants on random views ----------------------------------------------------------------
@st.composite
def views(draw: st.DrawFn, max_waiting: int = 12) -> SchedulerView:
    now = 100.0
    reqs: list[RequestSnapshot] = []
    for i in range(draw(st.integers(0, 6))):  # running decodes
        ctx = draw(st.integers(1, 20000))
        reqs.append(RequestSnapshot(f"d{i}", draw(st.floats(0, now)), ctx, ctx + 1, 2, 64,
                                    True))
    for i in range(draw(st.integers(0, 2))):  # running prompts
        prompt = draw(st.integers(2, 20000))
        reqs.append(RequestSnapshot(f"p{i}", draw(st.floats(0, now)), prompt,
                                    draw(st.integers(0, prompt - 1)), 0, 32, True))
    waits = [RequestSnapshot(f"w{i}", draw(st.floats(0, now)), (n := draw(st.integers(1, 30000))),
                             max_output_tokens=draw(st.integers(1, 500)),
                             num_cached_tokens=draw(st.integers(0, n)))
             for i in range(draw(st.integers(0, max_waiting)))]
    reqs += sorted(waits, key=lambda r: r.arrival_time)
    return view(reqs, now=now, mbt=8192)


def overdue(p: Ordered, r: RequestSnapshot, now: float) -> bool:
    return now - r.arrival_time >= p.config.aging * p.solo_estimate(
        r.prompt_tokens, max(1, r.max_output_tokens - r.num_output_tokens))


@settings(max_examples=200, deadline=None)
@given(views(), st.sampled_from([0.5, 3.0, 30.0]), st.sampled_from(["e2e", "prefill"]))
def test_aging_bound_and_budget_on_random_views(v: SchedulerView, k: float, solo: str) -> None:
    p = ordered(f"ordered:aging={k:g},drain=0,solo={solo},turn=0")  # the aging bound alone
    d = p.decide(v)
    pending = [r for r in v.requests if is_pending_prefill(r)]
    assert 0 <= d.prefill_budget <= p.max_num_batched_tokens
    if not pending:
        return
    if d.prefill_order is None:  # no admission possible: the running prompts' tokens at most
        running_left = sum(r.prompt_tokens - r.num_computed_tokens for r in pending
                           if r.is_running)
        assert d.prefill_budget <= running_left
        return
    assert sorted(d.prefill_order) == sorted(r.request_id for r in pending)
    by_id = {r.request_id: r for r in pending}
    listed = [by_id[i] for i in d.prefill_order]
    for n, r in enumerate(listed):
        if overdue(p, r, v.now):  # the bound: only earlier overdue requests ahead of it
            for q in listed[:n]:
                assert overdue(p, q, v.now)
                assert (q.arrival_time, q.request_id) <= (r.arrival_time, r.request_id)
    fresh = [r for r in listed if not overdue(p, r, v.now)]
    keys = [r.prompt_tokens - min(r.num_computed_tokens + r.num_cached_tokens,
                                  r.prompt_tokens - 1) for r in fresh]
    assert keys == sorted(keys)  # the others: shortest remaining uncached prefill first


def drain_time(p: Ordered, v: SchedulerView) -> float:
    """T(t) of the drain floor, from its definition: every pending prompt's uncached
    tokens prefilled alone in c_max-token steps (an independent sum of run_time steps)."""
    assert p.costs is not None
    c, total = p.config.c_max, 0.0
    for r in v.requests:
        if not is_pending_prefill(r):
            continue
        start = min(r.num_computed_tokens + r.num_cached_tokens, r.prompt_tokens - 1)
        total += p.costs.prefill_time(c, start, r.prompt_tokens)
    return total


@settings(max_examples=200, deadline=None)
@given(views(), st.sampled_from([0.5, 3.0, 30.0]), st.sampled_from([0.001, 0.5, 1.0, 4.0]))
def test_drain_floor_bound_on_random_views(v: SchedulerView, k: float, drain: float) -> None:
    """The drain floor (``drain=D``): overdue means waited both aging x s_i and D x T(t);
    every request listed ahead of an overdue one is overdue and arrived no later, the rest
    go shortest remaining prefill first; the budget is the rule's without the floor."""
    p = ordered(f"ordered:aging={k:g},drain={drain:g},turn=0")
    base = ordered(f"ordered:aging={k:g},drain=0,turn=0")
    floor = drain * drain_time(p, v)
    # (summed in whole nanoseconds: half a nanosecond per request at most)
    assert p.drain_floor(v) == pytest.approx(floor, rel=1e-12,
                                             abs=drain * 0.5e-9 * (len(v.requests) + 1))
    d = p.decide(v)
    assert d.prefill_budget == base.decide(v).prefill_budget or d.prefill_order is not None
    if d.prefill_order is None:
        return
    pending = [r for r in v.requests if is_pending_prefill(r)]
    assert sorted(d.prefill_order) == sorted(r.request_id for r in pending)
    by_id = {r.request_id: r for r in pending}
    listed = [by_id[i] for i in d.prefill_order]

    def late(r: RequestSnapshot) -> bool:
        return overdue(p, r, v.now) and v.now - r.arrival_time >= p.drain_floor(v)

    for n, r in enumerate(listed):
        if late(r):
            for q in listed[:n]:
                assert late(q)
                assert (q.arrival_time, q.request_id) <= (r.arrival_time, r.request_id)
    fresh = [r for r in listed if not late(r)]
    keys = [r.prompt_tokens - min(r.num_computed_tokens + r.num_cached_tokens,
                                  r.prompt_tokens - 1) for r in fresh]
    assert keys == sorted(keys)


def test_drain_floor_reorders_a_saturated_queue() -> None:
    """Everyone has waited past aging x solo: without the floor the order is FCFS; with
    it, nobody has waited the backlog's drain time yet, so shortest first."""
    reqs = [RequestSnapshot("d0", 0.0, 500, 501, 2, 64, True)]
    reqs += [RequestSnapshot(f"w{i}", 1.0 + 0.1 * i, 24000 if i % 2 == 0 else 200)
             for i in range(40)]
    v = SchedulerView(15.0, reqs, *view_counts(reqs), 4096, 256)
    p, base = ordered("ordered:aging=1,drain=1,turn=0"), ordered("ordered:aging=1,drain=0,turn=0")
    assert all(overdue(base, r, v.now) for r in reqs[1:])
    fcfs = base.decide(v).prefill_order
    assert fcfs is not None and list(fcfs) == [f"w{i}" for i in range(len(fcfs))]
    assert p.drain_floor(v) > 15.0 - 1.0  # more than anyone has waited
    order = p.decide(v).prefill_order
    assert order is not None and order[0] == "w1"  # the shortest, oldest first
    assert ordered("ordered:aging=1,drain=0.01,turn=0").decide(v) == base.decide(v)  # < waits


@settings(max_examples=200, deadline=None)
@given(views(), st.sampled_from([0.5, 3.0, 30.0]))
def test_overdue_prefix_on_random_views(v: SchedulerView, k: float) -> None:
    """The overdue prefix (``overdue_prefix=true``): with ``A`` the newest overdue arrival,
    every pending prompt that arrived no later than ``A`` precedes every later arrival, in
    (arrival, id) order, and the later ones are shortest remaining prefill first; with
    nothing overdue, the order of the rule without the option."""
    p = ordered(f"ordered:aging={k:g},overdue_prefix=true,drain=0,turn=0")
    d = p.decide(v)
    base = ordered(f"ordered:aging={k:g},drain=0,turn=0").decide(v)
    assert d.prefill_budget == base.prefill_budget
    if d.prefill_order is None:
        assert base.prefill_order is None
        return
    pending = [r for r in v.requests if is_pending_prefill(r)]
    assert sorted(d.prefill_order) == sorted(r.request_id for r in pending)
    by_id = {r.request_id: r for r in pending}
    listed = [by_id[i] for i in d.prefill_order]
    late = [r.arrival_time for r in pending if overdue(p, r, v.now)]
    if not late:
        assert d.prefill_order == base.prefill_order
        return
    newest = max(late)
    head = [r for r in listed if r.arrival_time <= newest]
    assert listed[:len(head)] == head  # the prefix first
    assert [(r.arrival_time, r.request_id) for r in head] == sorted(
        (r.arrival_time, r.request_id) for r in head)  # in arrival order
    for n, r in enumerate(listed):  # hence the aging bound: none later ahead of an overdue one
        if overdue(p, r, v.now):
            assert all((q.arrival_time, q.request_id) <= (r.arrival_time, r.request_id)
                       for q in listed[:n])
    keys = [r.prompt_tokens - min(r.num_computed_tokens + r.num_cached_tokens,
                                  r.prompt_tokens - 1) for r in listed[len(head):]]
    assert keys == sorted(keys)  # the rest: shortest remaining uncached prefill first


# -- the bound in the simulator ----------------------------------------------------------------
class Recorder(Policy):
    """Wraps a policy; keeps every view's (now, waiting ids) and the decision."""

    def __init__(self, inner: Ordered) -> None:
        super().__init__(inner.config, inner.spec)
        self.inner = inner
        self.log: list[tuple[float, list[str], Decision]] = []
        self.loose: list[bool] = []  # the policy read caps as no lengths (after the step)

    @property
    def max_num_batched_tokens(self) -> int:
        return self.inner.max_num_batched_tokens

    def decide(self, view: SchedulerView) -> Decision:
        d = self.inner.decide(view)
        waiting = [r.request_id for r in view.requests if not r.is_running]
        self.log.append((view.now, waiting, d))
        self.loose.append(self.inner._loose)
        return d


specs = st.lists(st.tuples(st.floats(0, 1), st.integers(1, 12000), st.integers(1, 80)),
                 min_size=1, max_size=40)


#: A burst that overloads the engine: 40 prompts of 1..12000 tokens within one second.
BURST = [((i * 7919) % 1000 / 1000, 1 + (i * 104729) % 12000, 1 + (i * 31) % 80)
         for i in range(40)]


def capped(o: int, loose: bool) -> int | None:
    """A client's ``max_tokens`` for a request of ``o`` outputs: none (the cap is the
    length, as in a replay with ignore_eos), or a cap it stops well before (``loose``)."""
    return 3 * o + 5 if loose else None


def turns_of(log: list[tuple[float, list[str], Decision]], info: dict[str, SimRequest],
             k: float) -> list[tuple[int, dict[str, float]]]:
    """The FCFS turn's clock ``U`` and thresholds at each recorded step, from their
    definition (``ppas.policies.fcfs_turn``): ``U`` sums the prompts that have left the
    queue; a request first seen waiting gets ``U`` plus ``k`` times the prompts waiting
    when it arrived (those that entered before it, in (arrival, id) order)."""
    out: list[tuple[int, dict[str, float]]] = []
    queued: dict[str, int] = {}
    theta: dict[str, float] = {}
    u = 0
    for _, waiting, _ in log:
        now = set(waiting)
        for rid in [rid for rid in queued if rid not in now]:
            u += queued.pop(rid)
        for rid in sorted((rid for rid in waiting if rid not in queued),
                          key=lambda rid: (info[rid].arrival_time, rid)):
            theta.setdefault(rid, u + k * sum(queued.values()))
            queued[rid] = info[rid].prompt_tokens
        out.append((u, dict(theta)))
    return out


@settings(max_examples=40, deadline=None)
@given(specs, st.sampled_from([0.25, 1.0, 4.0]), st.sampled_from([None, 600, 3000]),
       st.booleans(), st.booleans(), st.booleans(), st.sampled_from([0.0, 1.0, 2.0]))
@example(BURST, 1.0, None, False, True, False, 0.0)
@example(BURST, 1.0, None, True, True, False, 0.0)
@example(BURST, 1.0, 600, False, False, False, 0.0)
@example(BURST, 1.0, None, False, True, True, 0.0)
@example(BURST, 0.25, None, False, True, False, 1.0)
@example(BURST, 0.25, 600, False, True, False, 1.0)
def test_aging_bound_in_the_simulator(
        trace: Sequence[tuple[float, int, int]], k: float, kv_blocks: int | None,
        prefix: bool, footprint: bool, loose: bool, turn: float) -> None:
    """The aging bound in runs of the engine; with caps the requests stop before
    (``loose``), with ``s_i`` the solo prefill once the policy has seen one stop early;
    with the FCFS turn (``turn > 0``) a request is overdue once it has also reached its
    turn, computed here from the queue each step shows."""
    reqs = [RequestSpec(a, p, o, max_tokens=capped(o, loose)) for a, p, o in sorted(trace)]
    pol = ordered(f"ordered:aging={k:g},overdue_prefix={str(prefix).lower()},drain=0,"
                  f"kv_footprint={str(footprint).lower()},turn={turn:g}")
    rec = Recorder(pol)
    res = simulate(reqs, rec, CM, EngineConfig(num_kv_blocks=kv_blocks), record_steps=True)
    # Every request finishes (none is longer than the KV cache: 600 blocks = 9600 tokens
    # would reject the longest, which then counts as failed, not stuck).
    assert all(r.finish_time is not None or r.failed for r in res.requests)
    if kv_blocks is None:
        assert not any(r.failed for r in res.requests)
    # The budget is never exceeded.
    for s in res.steps:
        assert s.num_prefill_tokens <= s.prefill_budget
    info = {r.request_id: r for r in res.requests}

    solo = {False: ordered(pol.spec).solo_estimate,  # before and after the switch
            True: ordered(pol.spec + ",solo=prefill").solo_estimate}

    turns = turns_of(rec.log, info, turn)

    def late(rid: str, now: float, loose: bool, step: int) -> bool:
        r = info[rid]
        u, theta = turns[step]
        return (now - r.arrival_time >= k * solo[loose](r.prompt_tokens, r.max_output_tokens)
                and (turn == 0 or u >= theta[rid]))

    # Caps the requests stop before are seen once one finishes, and then for good.
    assert rec.loose == sorted(rec.loose) and (not any(rec.loose) or loose)
    # No request admitted at a step while an overdue one that arrived before it waits on.
    for step, ((now, waiting, _), (_, after, _), was) in enumerate(
            zip(rec.log, rec.log[1:], rec.loose, strict=False)):
        still = set(after)
        admitted = [w for w in waiting if w not in still]
        for i in waiting:
            if i in still and late(i, now, was, step) and info[i].num_preemptions == 0:
                ai = (info[i].arrival_time, i)
                assert all((info[j].arrival_time, j) < ai for j in admitted), (i, admitted)


# -- the saturation rule (module doc, 2) -------------------------------------------------------
#: An A100 with a 7B model: there the knee is below ``c_max``, so the rule has room.
CM_A100 = RooflineCostModel("a100-sxm-80gb", "qwen2.5-7b", max_num_batched_tokens=16384)


def on_a100(spec: str) -> Ordered:
    p = make_policy(spec)
    assert isinstance(p, Ordered)
    p.bind_cost_model(CM_A100)
    return p


def decodes(n: int, ctx: int = 3000, left: int = 200) -> list[RequestSnapshot]:
    return [RequestSnapshot(f"d{i}", 0.0, ctx, ctx + 1, 1, 1 + left, True) for i in range(n)]


def test_saturation_grows_the_budget_past_the_knee_only_under_a_backlog() -> None:
    p = on_a100("ordered")
    q = on_a100("ordered:saturation=false")
    few = view([*decodes(8), *(waiting(f"w{i}", 1500, 9.0 + i / 100) for i in range(2))])
    many = view([*decodes(8), *(waiting(f"w{i}", 1500, 5.0 + i / 100) for i in range(400))])
    knee = q.decide(few).prefill_budget
    assert knee < p.config.c_max  # the A100's knee leaves the rule room
    assert p.decide(few).prefill_budget == knee  # a small queue keeps the knee
    assert q.decide(many).prefill_budget == knee
    assert p.decide(many).prefill_budget == p.config.c_max  # a backlog: throughput rules


def test_the_global_mbt_follows_c_sat() -> None:
    assert on_a100("ordered").max_num_batched_tokens == 4096
    assert on_a100("ordered:c_sat=16384").max_num_batched_tokens == 16384
    with pytest.raises(Exception, match="c_sat"):
        make_policy("ordered:c_sat=2048")
    for bad in ("ordered:ride_ceiling=true", "ordered:c_sat=4096,ride_ceiling=true",
                "ordered:c_sat=16384,ride_ceiling=true,saturation=false"):
        with pytest.raises(Exception, match="ride_ceiling needs saturation=true and c_sat"):
            make_policy(bad)


@pytest.mark.parametrize(("prompt", "out"), [(2000, 30), (16000, 50), (32000, 20)])
def test_solo_estimate_follows_the_saturation_ceiling(prompt: int, out: int) -> None:
    # With a 16k decode-free ceiling a long prompt alone runs in 16k-token steps; the
    # estimate follows them (within 2% of the engine's best solo latency).
    for cm in (CM, CM_A100):
        p = make_policy("ordered:c_sat=16384")
        assert isinstance(p, Ordered)
        p.bind_cost_model(cm)
        assert p.solo_estimate(prompt, out) == pytest.approx(
            solo_latency(prompt, out, cm).e2e, rel=0.02)


@st.composite
def busy_views(draw: st.DrawFn) -> SchedulerView:
    """Random views with up to 40 decodes and 0..300 waiting prompts (a backlog or not)."""
    now = 100.0
    reqs: list[RequestSnapshot] = []
    for i in range(draw(st.integers(0, 40))):
        ctx = draw(st.integers(1, 20000))
        out = draw(st.integers(1, 500))
        reqs.append(RequestSnapshot(f"d{i}", draw(st.floats(0, now)), ctx, ctx + 1,
                                    draw(st.integers(1, out)), out + 1, True))
    for i in range(draw(st.integers(0, 2))):
        prompt = draw(st.integers(2, 30000))
        reqs.append(RequestSnapshot(f"p{i}", draw(st.floats(0, now)), prompt,
                                    draw(st.integers(0, prompt - 1)), 0, 32, True))
    n = draw(st.integers(0, 300))
    sizes = draw(st.lists(st.integers(1, 30000), min_size=n, max_size=n))
    reqs += [RequestSnapshot(f"w{i}", now - 50 + i / 10, s, max_output_tokens=64)
             for i, s in enumerate(sizes)]
    return view(reqs, now=now, mbt=16384)


def riding(v: SchedulerView) -> tuple[int, int]:
    """(the decodes running in ``v``, their context)."""
    dec = [r for r in v.requests if r.is_running and not is_pending_prefill(r)
           and r.num_output_tokens < r.max_output_tokens]
    return len(dec), sum(r.num_computed_tokens for r in dec)


@settings(max_examples=150, deadline=None)
@given(busy_views(), st.sampled_from(["ordered", "ordered:c_sat=16384",
                                      "ordered:c_max=8192,c_sat=16384",
                                      "ordered:ride_floor=true,kv_backlog=false",
                                      "ordered:ride_floor=true,c_sat=16384",
                                      "ordered:c_max=8192,ride_drain=true",
                                      "ordered:c_sat=16384,ride_ceiling=true",
                                      "ordered:c_sat=8192,ride_ceiling=true,ride_drain=true"]))
def test_saturation_budget_bounds_and_early_exit(v: SchedulerView, spec: str) -> None:
    p = on_a100(spec)
    # The same rule without saturation (ride_ceiling, which needs it, off too).
    q = on_a100(spec.replace("ride_ceiling=true", "ride_ceiling=false")
                + ("," if ":" in spec else ":") + "saturation=false")
    n_dec, ctx = riding(v)
    knee = q.chunk(n_dec, ctx)
    # The floor: the knee, or beside decodes (the idle floor) the decode-free knee.
    floor = knee if not n_dec or p.config.ride_floor else min(knee, q.chunk(0, 0))
    budget = p.chunk(n_dec, ctx, v)
    costs = p.costs
    assert costs is not None
    ride = n_dec * costs.dec_ride + costs.dec_kv * ctx
    # Beside decodes the ceiling is c_max, or with ride_ceiling the riding knee over the
    # saturation candidates where that is bigger (module doc, 2).
    ceiling = p.config.c_max
    if n_dec and p.config.ride_ceiling:
        wide = on_a100(spec.replace("ride_ceiling=true", "saturation=false")
                       .replace("c_sat=", "c_max="))
        ceiling = max(ceiling, wide.chunk(n_dec, ctx))
    # Never below the floor, never above the global MBT; beside decodes, at most the ceiling.
    assert floor <= budget <= p.max_num_batched_tokens
    if n_dec:
        assert budget <= ceiling
    # The early exit gives what the whole queue gives.
    assert budget == p.saturation_chunk(v, floor, n_dec > 0, ride, early_exit=False,
                                        ceiling=ceiling if n_dec else None)
    assert 0 <= p.decide(v).prefill_budget <= p.max_num_batched_tokens


@settings(max_examples=150, deadline=None)
@given(busy_views(), st.integers(0, 3_000_000), st.booleans(), st.booleans())
def test_admissible_backlog_ignores_the_prompts_the_kv_cache_cannot_take(
        v: SchedulerView, capacity: int, ride_floor: bool, peak: bool) -> None:
    """With ``kv_backlog`` the budget is the one the whole-queue rule gives on the view cut
    before the first waiting prompt the footprint rule cannot admit: with ``kv_peak=false``
    the first whose footprint does not fit in the KV room left (the sum rule, written out
    here); with ``kv_peak`` (the default) the first ``KvRoom`` refuses, which counts the
    KV the running decodes free as they finish (``tests/test_kv_room.py``: it never
    overfills)."""
    from ppas.policies.kv_room import KvRoom
    from ppas.policies.ordered import SLACK
    spec = f"ordered:ride_floor={str(ride_floor).lower()},kv_peak={str(peak).lower()}"
    p, q = on_a100(spec), on_a100(spec + ",kv_backlog=false")
    p.kv_capacity = q.kv_capacity = capacity
    running = [r for r in v.requests if r.is_running]
    room = capacity - sum(r.prompt_tokens + r.max_output_tokens + SLACK for r in running)
    kept = list(running)
    kv = KvRoom(capacity, room, running, SLACK, True, 0) if peak else None
    for r in v.requests[len(running):]:
        footprint = r.prompt_tokens + r.max_output_tokens + SLACK
        if kv is not None:
            if not kv.admit(r.prompt_tokens + r.num_output_tokens + SLACK, footprint, r):
                break
        else:
            room -= footprint
            if room < 0:
                break
        kept.append(r)
    n_dec, ctx = riding(v)
    cut = replace(v, requests=tuple(kept))
    assert p.chunk(n_dec, ctx, v) == q.chunk(n_dec, ctx, cut)


def test_idle_floor_keeps_long_context_decodes_steps_short() -> None:
    # On an A100, 48 decodes at 12k context lift the throughput knee to c_max; with a
    # short queue (or a backlog the KV cache cannot take) the idle floor keeps the
    # decode-free knee, where the rule before it gave c_max.
    new, old = on_a100("ordered"), on_a100("ordered:ride_floor=true,kv_backlog=false")
    idle = new.chunk(0, 0)
    assert idle < new.config.c_max
    assert old.chunk(48, 48 * 12000) == old.config.c_max
    short = view([*decodes(48, 12000, 300), waiting("w0", 6000, 9.0)])
    assert new.decide(short).prefill_budget == idle
    assert old.decide(short).prefill_budget == old.config.c_max
    held = 48 * (12000 + 301 + 16)
    cap = held + 30000  # room for one 20k-token prompt, not two
    for p in (new, old):
        p.kv_capacity = cap
    backlog = view([*decodes(48, 12000, 300),
                    *(waiting(f"w{i}", 20000, 5.0 + i / 100, out=300) for i in range(200))])
    assert new.decide(backlog).prefill_budget == idle
    assert old.decide(backlog).prefill_budget == old.config.c_max


def a100_frontier(n_dec: int, queued: int, rho: float) -> list[tuple[int, int, float]]:
    """The saturation rule's frontier on an A100 (``c_sat`` 16384) beside ``n_dec`` decodes
    at 3000 tokens of context, ``queued`` tokens pending at ``rho`` causal pairs per token."""
    p = on_a100("ordered:c_sat=16384")
    costs = p.costs
    assert costs is not None
    cands = list(p.sat_chunks)
    ride = n_dec * (costs.dec_ride + costs.dec_kv * 3000)
    return p._frontier(cands, rho * min(cands[-1], queued), queued, ride)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 50_000), st.integers(1, 2000), st.floats(0, 1e10), st.floats(0, 1e10),
       st.integers(0, 64), st.sampled_from([4096, 8192, 16384, 40000]), st.floats(0, 4000))
def test_saturation_choice_is_monotone_in_the_backlog(
        outputs_left: int, n: int, q1: float, q2: float, n_dec: int, queued: int,
        rho: float) -> None:
    from ppas.policies.ordered import _argmin
    frontier = a100_frontier(n_dec, queued, rho)
    lo, hi = sorted((q1, q2))
    # More queued work (Q) never picks a smaller chunk; more decode work left (L) never
    # picks a bigger one.
    assert _argmin(frontier, outputs_left, lo, n) <= _argmin(frontier, outputs_left, hi, n)
    assert _argmin(frontier, outputs_left + 1000, lo, n) <= _argmin(frontier, outputs_left,
                                                                    lo, n)


CM_H100_16K = RooflineCostModel("h100-sxm-80gb", "qwen3-8b", max_num_batched_tokens=16384)


def test_ride_drain_charges_decodes_only_for_the_drain() -> None:
    # H100 / Qwen3-8B, c_max 8192, 36 decodes riding and 10k-token prompts waiting. Charged
    # every output left, the riding decodes keep the budget at 4096 however long they run;
    # charged only for the drain's steps, decodes with 300 outputs left let it grow to
    # 8192 (the drain is over after a few steps either way), while decodes with 10 left,
    # behind a drain of 80k tokens (10-20 steps), are charged every output: as before.
    old, new = make_policy("ordered:c_max=8192"), make_policy("ordered:c_max=8192,ride_drain=true")
    for p in (old, new):
        p.bind_cost_model(CM_H100_16K)
    for n_wait, left, want in ((2, 300, 8192), (8, 300, 8192), (8, 10, 4096)):
        v = view([*decodes(36, 4000, left),
                  *(waiting(f"w{i}", 10000, 5.0 + i / 100, out=300) for i in range(n_wait))],
                 mbt=16384)
        assert old.decide(v).prefill_budget == 4096
        assert new.decide(v).prefill_budget == want, (n_wait, left)


def test_ride_ceiling_grows_past_c_max_only_beside_costly_decodes() -> None:
    # H100 / Qwen3-8B, c_max 4096, c_sat 8192, 10k-token prompts waiting. Beside 36 decodes
    # at 8k tokens of context (18 ms of decode work per step) 4096-token chunks clear
    # under 95% of an 8192 chunk's prefill per second: the riding knee is 8192, and the
    # drain's J takes it for decodes with 300 outputs left (not for ones with 10 left).
    # Beside 36 decodes at 1.5k (7 ms) the knee is 4096, c_max: as without the option.
    spec = "ordered:c_sat=8192,ride_drain=true"
    old, new = make_policy(spec), make_policy(spec + ",ride_ceiling=true")
    for p in (old, new):
        p.bind_cost_model(CM_H100_16K)
    for ctx, n_wait, left, want in ((8000, 2, 300, 8192), (8000, 40, 300, 8192),
                                    (8000, 8, 10, 4096), (1500, 8, 300, 4096),
                                    (1500, 40, 300, 4096)):
        v = view([*decodes(36, ctx, left),
                  *(waiting(f"w{i}", 10000, 5.0 + i / 100, out=300) for i in range(n_wait))],
                 mbt=16384)
        assert old.decide(v).prefill_budget == 4096
        assert new.decide(v).prefill_budget == want, (ctx, n_wait, left)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 2000), max_size=64), st.integers(1, 2000), st.floats(0, 1e10),
       st.integers(0, 64), st.sampled_from([4096, 8192, 16384, 40000, 400000]),
       st.floats(0, 4000))
def test_ride_drain_never_picks_a_smaller_chunk(rides: list[int], n: int, q: float,
                                                n_dec: int, queued: int, rho: float) -> None:
    # Charging a decode min(r, S(c)) instead of r cuts a bigger chunk's J by more (its step
    # is longer, its drain shorter), so the choice is never smaller than the rule's that
    # charges every output; when the drain outlasts every decode (S >= r for the biggest
    # chunk, hence for all) the two are the same.
    from ppas.policies.ordered import _argmin, _argmin_drain
    frontier = a100_frontier(n_dec, queued, rho)
    every = _argmin(frontier, sum(rides), q, n)
    drain = _argmin_drain(frontier, rides, q, n, queued)
    assert drain >= every
    if not rides or max(rides) <= queued / frontier[-1][1]:
        assert drain == every


# -- the indexed path (a waiting log) against the straightforward one ------------------------
def logged(v: SchedulerView) -> SchedulerView:
    """``v`` with a waiting log in which every waiting request entered once."""
    log = WaitingLog()
    log.events.extend((True, r) for r in v.requests if not r.is_running)
    return replace(v, waiting_log=log)


@settings(max_examples=300, deadline=None)
@given(st.lists(views(), min_size=1, max_size=3), st.sampled_from([0.5, 3.0, 30.0]),
       st.sampled_from([0.0, 0.05]), st.booleans(), st.sampled_from([0.0, 0.01, 0.3, 3.0]))
def test_indexed_path_is_the_full_one_cut_on_random_views(
        vs: list[SchedulerView], k: float, kv_ratio: float, prefix: bool,
        drain: float) -> None:
    """The same Decision as ``decide_full(truncate=True)``, whose order is the full
    order's requests up to the first the engine cannot admit, and every running prompt
    (with and without the overdue prefix, with and without the drain floor)."""
    # (idle_limit=0: the idle limit is set by ``decide`` on top of either path's decision)
    p = ordered(f"ordered:aging={k:g},kv_ratio={kv_ratio:g},"
                f"overdue_prefix={str(prefix).lower()},drain={drain:g},idle_limit=0")
    for v in vs:  # one policy, several views: a new log each time is read whole
        d = p.decide(logged(v))
        assert d == p.decide_full(v, truncate=True)
        full = p.decide_full(v)
        assert d.prefill_budget == full.prefill_budget
        assert (d.prefill_order is None) == (full.prefill_order is None)
        if d.prefill_order is not None and full.prefill_order is not None:
            rank = {rid: i for i, rid in enumerate(full.prefill_order)}
            assert [rank[i] for i in d.prefill_order] == sorted(rank[i] for i in d.prefill_order)
            assert {r.request_id for r in v.requests
                    if r.is_running and is_pending_prefill(r)} <= set(d.prefill_order)


class Pinned(Policy):
    """Wraps an ordered policy: every decision checked against the straightforward path
    on the same view (``full``: decide by it, the policy as it was before its index)."""

    def __init__(self, inner: Ordered, full: bool = False) -> None:
        super().__init__(inner.config, inner.spec)
        self.inner, self.full = inner, full
        self.indexed = 0

    @property
    def max_num_batched_tokens(self) -> int:
        return self.inner.max_num_batched_tokens

    def decide(self, view: SchedulerView) -> Decision:
        if self.full:
            return self.inner.decide_full(view)
        d = self.inner.decide(view)
        if view.waiting_log is not None and view.num_pending_prefills:
            self.indexed += 1
            # (with prefix caching the indexed path lists every pending prompt)
            assert d == self.inner.decide_full(view, truncate=not view.prefix_caching)
        return d


def outcome(res: SimResult) -> tuple[object, ...]:
    return (res.num_steps, res.num_preemptions, res.gaps.one,
            [(r.first_scheduled_time, r.first_token_time, r.last_token_time, r.finish_time,
              r.num_preemptions, r.failed) for r in res.requests])


@settings(max_examples=60, deadline=None)
@given(specs, st.sampled_from([0.01, 0.25, 4.0]), st.sampled_from([None, 400, 1500]),
       st.sampled_from([0.0, 0.05]), st.sampled_from([4, 256]), st.booleans(),
       st.sampled_from([0.0, 0.02, 1.0]), st.booleans(), st.booleans())
@example(BURST, 0.01, 400, 0.0, 256, False, 0.0, True, False)
@example(BURST, 0.01, 400, 0.0, 256, True, 0.0, True, False)
@example(BURST, 0.01, 400, 0.0, 256, False, 1.0, True, False)
@example(BURST, 0.01, None, 0.0, 256, False, 0.02, True, False)
@example(BURST, 0.01, 400, 0.0, 256, False, 1.0, False, False)
@example(BURST, 0.01, 400, 0.0, 256, False, 1.0, True, True)
def test_indexed_path_in_the_simulator_changes_nothing(
        trace: Sequence[tuple[float, int, int]], k: float, kv_blocks: int | None,
        kv_ratio: float, max_num_seqs: int, prefix: bool, drain: float,
        footprint: bool, loose: bool) -> None:
    """At every step of a run (arrivals, admissions, preemptions under a tight KV cache,
    requests turning overdue, the caps seen to be no lengths) the indexed decision is the
    straightforward one cut, and the run (every request's times, the steps, the
    preemptions, the gaps) is the run of the straightforward decisions with their whole
    order."""
    reqs = [RequestSpec(a * 3, p, o, max_tokens=capped(o, loose)) for a, p, o in sorted(trace)]
    spec = (f"ordered:aging={k:g},kv_ratio={kv_ratio:g},overdue_prefix={str(prefix).lower()}"
            f",drain={drain:g},kv_footprint={str(footprint).lower()},idle_limit=0")
    # (idle_limit=0: ``decide`` sets the idle limit on top of either path's decision)
    engine = EngineConfig(num_kv_blocks=kv_blocks, max_num_seqs=max_num_seqs)
    pinned = Pinned(ordered(spec))
    res = simulate(reqs, pinned, CM, engine)
    assert pinned.indexed > 0 or all(r.failed for r in res.requests)
    assert outcome(res) == outcome(simulate(reqs, Pinned(ordered(spec), full=True), CM, engine))


@st.composite
def shared_prefixes(draw: st.DrawFn) -> list[RequestSpec]:
    """Bursts of prompts of 1-3 shared prefixes (0-6,000 tokens) and their own 1-3,000."""
    out = []
    for _ in range(draw(st.integers(1, 24))):
        shared, g = draw(st.integers(0, 6000)), draw(st.integers(0, 2))
        out.append(RequestSpec(draw(st.floats(0, 2)), shared + draw(st.integers(1, 3000)),
                               draw(st.integers(1, 60)),
                               prefix=((f"g{g}", shared),) if shared else ()))
    return sorted(out, key=lambda r: r.arrival_s)


@settings(max_examples=40, deadline=None)
@given(shared_prefixes(), st.sampled_from([0.01, 0.25, 4.0]), st.sampled_from([300, 900, None]),
       st.sampled_from([0.0, 0.05]), st.booleans(), st.sampled_from([0.0, 1.0]),
       st.booleans())
def test_indexed_path_with_prefix_caching_changes_nothing(
        reqs: list[RequestSpec], k: float, kv_blocks: int | None, kv_ratio: float,
        prefix: bool, drain: float, footprint: bool) -> None:
    """With prefix caching the index keeps each waiting request's key as its hit moves
    (``WaitingLog.hits``): at every step (hits grown by the caching of another request's
    blocks, cut by evictions under a tight KV cache, preemptions) the indexed decision is
    the straightforward one with its whole order, and so is the run."""
    spec = (f"ordered:aging={k:g},kv_ratio={kv_ratio:g},overdue_prefix={str(prefix).lower()}"
            f",drain={drain:g},kv_footprint={str(footprint).lower()},idle_limit=0")
    engine = EngineConfig(num_kv_blocks=kv_blocks, prefix_caching=True)
    pinned = Pinned(ordered(spec))
    res = simulate(reqs, pinned, CM, engine)
    assert pinned.indexed > 0 or all(r.failed for r in res.requests) or (
        drain > 0 and prefix)  # (the overdue prefix under a drain floor: never indexed)
    assert outcome(res) == outcome(simulate(reqs, Pinned(ordered(spec), full=True), CM, engine))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 512), st.integers(0, 10**8),
       st.sampled_from(["ordered", "ordered:c_max=16384", "ordered:efficiency=0.5"]))
def test_fixed_knee_is_the_budget_whatever_rides(n: int, ctx: int, spec: str) -> None:
    """Where the indexed path takes the budget as fixed (``_knee``), ``chunk`` returns it
    for any decodes riding."""
    p = ordered(spec)
    if p._knee is not None:
        assert p.chunk(n, ctx) == p._knee
    assert ordered()._knee == 4096  # the default on an H100 with an 8B model: c_max


# -- the idle limit (module doc, 2) ------------------------------------------------------------
@settings(deadline=None)
@given(views(), st.sampled_from([256, 512, 2048]))
def test_idle_limit_only_without_a_backlog_on_random_views(v: SchedulerView, lim: int) -> None:
    """The decision is the one without the limit, plus ``chunk_limit = L`` exactly when at
    most one request waits (and a prompt is pending)."""
    base = ordered("ordered:idle_limit=0").decide(v)
    limited = ordered(f"ordered:idle_limit={lim},idle_util=0").decide(v)
    n_wait = sum(1 for r in v.requests if not r.is_running)
    assert (limited.prefill_budget, limited.prefill_order, limited.decodes_first) == (
        base.prefill_budget, base.prefill_order, base.decodes_first)
    assert base.chunk_limit == 0
    assert limited.chunk_limit == (lim if n_wait <= 1 and v.num_pending_prefills else 0)


@settings(deadline=None)
@given(views(max_waiting=2), st.sampled_from([256, 512]), st.sampled_from([0.001, 0.05, 1.0]),
       st.sampled_from([1.0, 60.0]))
def test_idle_limit_load_gate_on_random_views(v: SchedulerView, lim: int, util: float,
                                              window: float) -> None:
    """The load gate (module doc, 2) on a fresh policy: the window holds the view's pending
    requests that arrived in the last ``window`` seconds; the limit is set exactly when
    at most one request waits and their prefill work in ``lim``-token chunks is below
    ``util`` of the window. The rest of the decision is the ungated one's."""
    spec = f"ordered:idle_limit={lim}"
    base = ordered(f"{spec},idle_util=0").decide(v)
    gated = ordered(f"{spec},idle_util={util},idle_window={window}").decide(v)
    assert (gated.prefill_budget, gated.prefill_order, gated.decodes_first) == (
        base.prefill_budget, base.prefill_order, base.decodes_first)
    costs = StepCosts(CM, [lim])
    work = sum(costs.prefill_time(lim, 0, r.prompt_tokens) for r in v.requests
               if is_pending_prefill(r) and r.arrival_time >= v.now - window)
    if abs(work / window - util) > 1e-9:  # (not on the boundary, where rounding decides)
        assert gated.chunk_limit == (lim if base.chunk_limit and work / window < util else 0)


@pytest.mark.parametrize("hw,model", [("h100-sxm-80gb", "qwen3-8b"),
                                      ("a100-sxm-80gb", "qwen2.5-7b"), ("a40", "qwen2.5-7b"),
                                      ("rtx5090", "qwen2.5-3b"), ("h100-sxm-80gb", "qwen2.5-0.5b")])
@pytest.mark.parametrize("spec", ["ordered", "ordered:c_min=64", "ordered:c_min=128,c_max=1024",
                                  "ordered:c_min=16,c_sat=8192"])
def test_idle_limit_from_the_cost_model(hw: str, model: str, spec: str) -> None:
    """``idle_limit=-1`` (the default; module doc, 2, "The limit from the cost model"):
    the biggest power of two in [c_min, c_max] whose prefill-only step, priced by the cost
    model itself, is at most twice a one-token step, at least c_min; 0 when that reaches
    the global MBT. The decisions are those of that limit set by hand."""
    cm = RooflineCostModel(hw, model, max_num_batched_tokens=16384)
    p = make_policy(spec)
    assert isinstance(p, Ordered)
    p.bind_cost_model(cm)
    cfg = p.config
    fixed = cm.step_time(StepShape.one_chunk(1))
    cands = [c for c in (1 << k for k in range(20)) if cfg.c_min <= c <= cfg.c_max]
    fits = [c for c in cands if cm.step_time(StepShape.one_chunk(c)) <= 2 * fixed]
    want = max(fits, default=cfg.c_min)
    if want >= max(cfg.c_max, cfg.c_sat):
        want = 0
    assert p.idle_limit_of() == p._idle_limit == want
    explicit = make_policy(f"{spec}{',' if ':' in spec else ':'}idle_limit={want}")
    explicit.bind_cost_model(cm)
    assert isinstance(explicit, Ordered) and explicit._idle_limit == want
    v = view([waiting("a", 3000, 0.0)], now=0.5)
    assert p.decide(v) == explicit.decide(v)
    assert p.decide(v).chunk_limit == want  # one request waiting, an idle engine: gate open


def test_idle_limit_on_the_catalog_gpus() -> None:
    """The limit the rule gives on the pairs measured in ``docs/results/real-traffic.md``:
    512 on an H100 with Qwen3-8B (a 512-token step costs 1.7 one-token steps, 1024 tokens
    2.5) and on an A100 with Qwen2.5-7B (c_min: 512 tokens already cost 2.6); off for a
    0.5B model on an H100 (a 4096-token step costs 1.8 one-token steps)."""
    def lim(hw: str, model: str) -> int:
        p = ordered()
        p.bind_cost_model(RooflineCostModel(hw, model, max_num_batched_tokens=8192))
        return p._idle_limit
    assert lim("h100-sxm-80gb", "qwen3-8b") == 512
    assert lim("a100-sxm-80gb", "qwen2.5-7b") == 512
    assert lim("h100-sxm-80gb", "qwen2.5-0.5b") == 0
    unbound = make_policy("ordered")
    assert isinstance(unbound, Ordered) and unbound._idle_limit == 0  # no cost model: off
    unbound.bind_cost_model(None)
    assert unbound._idle_limit == 0


class PendingRecorder(Recorder):
    """A ``Recorder`` that also keeps whether a prompt was pending at each step."""

    def __init__(self, inner: Ordered) -> None:
        super().__init__(inner)
        self.pending: list[int] = []

    def decide(self, view: SchedulerView) -> Decision:
        self.pending.append(view.num_pending_prefills)
        return super().decide(view)


@settings(max_examples=25, deadline=None)
@given(specs, st.sampled_from([256, 1000]), st.sampled_from([0.05, 0.5, 1.0]),
       st.sampled_from([0.05, 0.3]))
def test_idle_limit_load_gate_in_the_simulator(trace: Sequence[tuple[float, int, int]],
                                               lim: int, util: float, window: float) -> None:
    """In a run, every request is noted as it arrives (its first step is decided with it
    pending), so a step decided at ``now`` with at most one request waiting and a prompt
    pending has the limit exactly when the trace's arrivals in ``[now - window, now]``
    need less than ``util * window`` seconds to prefill alone in ``lim``-token chunks;
    a step with a backlog never has it; every request finishes."""
    reqs = [RequestSpec(a, p, o) for a, p, o in sorted(trace)]
    rec = PendingRecorder(ordered(
        f"ordered:idle_limit={lim},idle_util={util},idle_window={window}"))
    res = simulate(reqs, rec, CM, EngineConfig(), record_steps=True)
    assert all(r.finish_time is not None for r in res.requests)
    costs = StepCosts(CM, [lim])
    for (now, waiting, d), pending in zip(rec.log, rec.pending, strict=True):
        if len(waiting) > 1 or not pending:
            assert d.chunk_limit == 0
            continue
        rho = sum(costs.prefill_time(lim, 0, r.prompt_tokens) for r in reqs
                  if now - window <= r.arrival_s <= now) / window
        if abs(rho - util) > 1e-9:
            assert d.chunk_limit == (lim if rho < util else 0), (now, rho)


@settings(max_examples=30, deadline=None)
@given(specs, st.sampled_from([128, 1000]))
@example([(0.0, 5000, 4), (0.5, 20, 4)], 1000)
def test_idle_limit_in_the_simulator(trace: Sequence[tuple[float, int, int]], lim: int) -> None:
    """Every prefill chunk of a step decided with at most one request waiting is at most
    ``L`` tokens, and a step decided with more waiting has no limit (no preemption here,
    so every chunk of more than one token is a prefill chunk); the budget holds and every
    request finishes."""
    reqs = [RequestSpec(a, p, o) for a, p, o in sorted(trace)]
    rec = Recorder(ordered(f"ordered:idle_limit={lim},idle_util=0"))
    res = simulate(reqs, rec, CM, EngineConfig(), record_steps=True)
    assert all(r.finish_time is not None for r in res.requests)
    decided = {now: (waiting, d) for now, waiting, d in rec.log}
    for s in res.steps:
        assert s.num_prefill_tokens <= s.prefill_budget
        if s.time not in decided:
            continue  # a decode run's later steps: no prefill
        waiting, d = decided[s.time]
        if len(waiting) > 1:
            assert d.chunk_limit == 0
        elif s.num_prefill_tokens:
            assert d.chunk_limit == lim
            assert all(n <= lim for _, n in s.scheduled), s.scheduled


def test_caps_that_are_no_lengths_switch_the_rules_once() -> None:
    """Caps the requests stop before (vLLM's ``max_tokens`` sent by real clients): the
    engine stops each at its own length, the policy sees the caps, and once one request
    has stopped early it reads no cap as a length (module doc, "Caps, not lengths").
    Caps equal to the lengths change nothing, to the last bit."""
    exact = [RequestSpec(a, p, o) for a, p, o in sorted(BURST)]
    same = [RequestSpec(a, p, o, max_tokens=o) for a, p, o in sorted(BURST)]
    loose = [RequestSpec(a, p, o, max_tokens=capped(o, True)) for a, p, o in sorted(BURST)]
    runs = {}
    for name, reqs in (("exact", exact), ("same", same), ("loose", loose)):
        pol = ordered()
        runs[name] = simulate(reqs, pol, CM, EngineConfig(num_kv_blocks=3000))
        assert pol._loose == (name == "loose")
    assert outcome(runs["exact"]) == outcome(runs["same"])
    trusting = ordered("ordered:caps=lengths")  # the rule before the record
    simulate(loose, trusting, CM, EngineConfig(num_kv_blocks=3000))
    assert not trusting._loose
    for r, (_, _, o) in zip(runs["loose"].requests, sorted(BURST), strict=True):
        assert r.finish_time is not None and r.num_output_tokens == r.output_len == o
        assert r.max_output_tokens == capped(o, True)


def test_vllms_default_caps_do_not_throttle_admission(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients that send no ``max_tokens`` get vLLM's default cap, the context left
    (``max_tokens=0``): read as lengths, every footprint is the whole context, and the
    footprint rule admits three requests at a time here. Once a request stops early the
    rule is off, and the run is within 30% of the one with exact lengths (9.2 s, 11.6 s
    when written); with the engine's record of early stops blinded, it is over three
    times slower (39.2 s)."""
    engine = EngineConfig(max_model_len=131072)  # caps of 127k-131k tokens
    chat = [(a, 1 + p // 3, 200 + 5 * o) for a, p, o in sorted(BURST)]  # outputs 205-600
    exact = [RequestSpec(a, p, o) for a, p, o in chat]
    default = [RequestSpec(a, p, o, max_tokens=0) for a, p, o in chat]

    def mean_e2e(reqs: list[RequestSpec], spec: str = "ordered") -> float:
        res = simulate(reqs, ordered(spec), CM, engine)
        assert all(r.finish_time is not None for r in res.requests)
        return sum(r.finish_time - r.arrival_time for r in res.requests  # type: ignore[operator]
                   ) / len(res.requests)

    base, seen = mean_e2e(exact), mean_e2e(default)
    monkeypatch.setattr(OutputLengths, "record", lambda self, outputs, cap: None)
    blind = mean_e2e(default)
    monkeypatch.undo()
    assert mean_e2e(default, "ordered:caps=lengths") == blind  # the same rule, by config
    # (until the first request stops, the caps are all the policy knows: 3 run at once)
    assert seen < 1.3 * base and blind > 3 * seen, (base, seen, blind)


# -- finish the riding decodes first (module doc, 5) -------------------------------------------
def finishes_first(p: Ordered, v: SchedulerView, budget: int) -> bool:
    """Rule 5 from its definition: ``short * (t_b - t_0) > t_0 * N / (1 - rho)``, with
    ``rho`` the load gate's window (the pending prompts that arrived in its last
    ``idle_window`` seconds, prefilled alone in idle-limit chunks, over the window)."""
    costs = p.costs
    assert costs is not None
    lim = p.idle_limit_of()
    gate = StepCosts(CM, [lim])
    start = v.now - p.config.idle_window
    rho = sum(gate.prefill_time(lim, 0, r.prompt_tokens) for r in v.requests
              if is_pending_prefill(r) and r.arrival_time >= start) / p.config.idle_window
    decs = [r for r in v.requests if r.is_running and not is_pending_prefill(r)
            and r.num_output_tokens < r.max_output_tokens]
    pending = sum(r.prompt_tokens - min(r.num_computed_tokens + r.num_cached_tokens,
                                        r.prompt_tokens - 1)
                  for r in v.requests if is_pending_prefill(r))
    if rho >= 1 or not decs or not pending:
        return False
    b = min(budget, pending)
    drain = math.ceil(pending / b)
    short = sum(1 for r in decs if r.max_output_tokens - r.num_output_tokens <= drain)
    t_b = costs.step_time(b, b * (b + 1) / 2) + sum(
        costs.dec_ride + costs.dec_kv * r.num_computed_tokens for r in decs)
    t_0 = costs.dec_base + sum(costs.dec_alone + costs.dec_kv * r.num_computed_tokens
                               for r in decs)
    if short == 0:
        return False
    if p.config.finish == "burst":  # the load of the arrivals of the drain's last S t_b s
        span = drain * t_b
        rho = max(rho, sum(gate.prefill_time(lim, 0, r.prompt_tokens) for r in v.requests
                           if is_pending_prefill(r) and r.arrival_time >= v.now - span) / span)
        if rho >= 1:
            return False
    return short * (t_b - t_0) > t_0 * v.num_pending_prefills / (1 - rho)


@settings(max_examples=200, deadline=None)
@given(busy_views(), st.sampled_from(["gate", "burst"]))
@example(SchedulerView(  # a running prompt listed before an older waiting one: the burst's
    now=100.0, requests=[  # load counts both (the window was once read in view order)
        RequestSnapshot("d0", 0.0, 1, 2, 1, 2, True),
        RequestSnapshot("p0", 100.0, 2, 0, 0, 32, True),
        RequestSnapshot("w0", 50.0, 1324, 0, 0, 64, False)],
    num_pending_prefills=2, num_running_decodes=1, max_num_batched_tokens=16384,
    max_num_seqs=256, recent_steps=()), "burst")
def test_finish_first_on_random_views(v: SchedulerView, load: str) -> None:
    """With ``finish`` a step's decision is the rule before's, or the decodes alone
    (budget 0) exactly when rule 5's inequality holds, and then only with a decode
    running and a prompt pending."""
    spec = f"ordered:finish={load}"
    before = ordered().decide(v)
    d = ordered(spec).decide(v)
    fire = (before.prefill_budget > 0 and v.num_running_decodes > 0
            and finishes_first(ordered(spec), v, before.prefill_budget))
    if fire:
        assert d == Decision(0)
        assert v.num_running_decodes > 0 and v.num_pending_prefills > 0
    else:
        assert d == before


def test_finish_first_worked_case() -> None:
    """One decode with 2 outputs left beside an 8,000-token prompt on an H100 (budget 4096:
    a drain of 2 steps of ~0.1 s, a decode-only step of ~0.013 s): running the decode
    alone for its last two outputs saves it ~0.09 s a step and costs the prompt ~0.013 s.
    Behind 40 pending prompts the same step costs more than it saves."""
    d = RequestSnapshot("d", 0.0, 1000, 1000, 14, 16, True)
    one = view([d, waiting("w", 8000, 9.9)])
    assert ordered().decide(one).prefill_budget > 0
    assert ordered("ordered:finish=gate").decide(one) == Decision(0)
    # ... unless the load is read as the burst's: the prompt arrived within its own drain
    assert ordered("ordered:finish=burst").decide(one) == ordered().decide(one)
    crowd = view([d, *(waiting(f"w{i}", 8000, 9.9) for i in range(40))])
    assert ordered("ordered:finish=gate").decide(crowd) == ordered().decide(crowd)
    # a decode that outlasts the drain gains nothing: it rides the drain's steps either way
    long = RequestSnapshot("d", 0.0, 1000, 1000, 1, 16, True)
    assert ordered("ordered:finish=gate").decide(view([long, waiting("w", 8000, 9.9)])) \
        == ordered().decide(view([long, waiting("w", 8000, 9.9)]))


class DecodeLog(Policy):
    """Wraps a policy; keeps each decision's budget with the most outputs any running
    decode has left, and whether a decode runs and a prompt pends."""

    def __init__(self, inner: Ordered) -> None:
        super().__init__(inner.config, inner.spec)
        self.inner = inner
        self.log: list[tuple[int, int, bool]] = []

    @property
    def max_num_batched_tokens(self) -> int:
        return self.inner.max_num_batched_tokens

    def decide(self, view: SchedulerView) -> Decision:
        d = self.inner.decide(view)
        left = max((r.max_output_tokens - r.num_output_tokens for r in view.requests
                    if r.is_running and not is_pending_prefill(r)), default=0)
        both = view.num_running_decodes > 0 and view.num_pending_prefills > 0
        self.log.append((d.prefill_budget, left, both))
        return d


#: Prompts of 200-6,000 tokens with 1-12 outputs, one every 40-90 ms: decodes near their end
#: ride most drains, and the rule fires.
TRICKLE = [(i * 0.063 % 5, 200 + (i * 2617) % 5800, 1 + (i * 7) % 12) for i in range(60)]


@settings(max_examples=40, deadline=None)
@given(specs, st.sampled_from([None, 600]), st.sampled_from(["gate", "burst"]))
@example(TRICKLE, None, "gate")
def test_finish_first_in_the_simulator(trace: Sequence[tuple[float, int, int]],
                                       kv_blocks: int | None, load: str) -> None:
    """Rule 5's invariants in runs of the engine: every request finishes; a budget of 0
    only with a decode running and a prompt pending; a run of such steps is at most as
    long as the most outputs a running decode had left at its first step (decodes only
    drain, and only a prefill makes a new one)."""
    reqs = [RequestSpec(a, p, o) for a, p, o in sorted(trace)]
    rec = DecodeLog(ordered(f"ordered:finish={load}"))
    res = simulate(reqs, rec, CM, EngineConfig(num_kv_blocks=kv_blocks), record_steps=True)
    assert all(r.finish_time is not None or r.failed for r in res.requests)
    for s in res.steps:
        assert s.num_prefill_tokens <= s.prefill_budget
    run, bound = 0, 0
    for budget, left, both in rec.log:
        if budget == 0:
            assert both
            if run == 0:
                bound = left
            run += 1
            assert run <= bound
        else:
            run = 0


def test_finish_first_fires_and_serves_the_decodes_sooner() -> None:
    """On ``TRICKLE`` the rule runs decode-only steps and cuts the mean TPOT."""
    reqs = [RequestSpec(a, p, o) for a, p, o in sorted(TRICKLE)]
    rec = DecodeLog(ordered("ordered:finish=gate"))
    fin = simulate(reqs, rec, CM, EngineConfig())
    base = simulate(reqs, ordered(), CM, EngineConfig())
    assert any(b == 0 for b, _, _ in rec.log)
    assert fin.summary()["avg_tpot"] < base.summary()["avg_tpot"]
