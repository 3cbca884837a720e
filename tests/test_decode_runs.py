"""Decode runs (``EngineSim.advance``): many decode-only steps in one go, and ``rewind``,
must give exactly what stepping one step at a time gives."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppas.cost.base import StepShape
from ppas.cost.roofline import RooflineCostModel
from ppas.engine.result import SimResult
from ppas.engine.simulator import EngineConfig, EngineSim, simulate
from ppas.policies import make_policy, policy_names
from ppas.workload import RequestSpec, mixed_trace

CM = RooflineCostModel("h200", "qwen2.5-3b")


def times(res: SimResult) -> list[tuple[object, ...]]:
    return [(r.first_token_time, r.last_token_time, r.finish_time, r.num_preemptions, r.failed,
             r.num_output_tokens) for r in res.requests]


workloads = st.lists(st.tuples(st.floats(0, 2), st.integers(1, 3000), st.integers(1, 200)),
                     min_size=1, max_size=25)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(policy_names()), workloads, st.one_of(st.none(), st.integers(30, 600)))
def test_decode_runs_equal_single_steps(name: str, reqs: list[tuple[float, int, int]],
                                        kv: int | None) -> None:
    trace = [RequestSpec(a, p, o) for a, p, o in reqs]
    eng = EngineConfig(num_kv_blocks=kv)
    fast = simulate(trace, make_policy(name), CM, eng)
    slow = simulate(trace, make_policy(name), CM, eng, record_steps=True)  # no decode runs
    assert times(fast) == times(slow)
    assert (fast.num_steps, fast.num_preemptions) == (slow.num_steps, slow.num_preemptions)


def test_decode_runs_every_policy_mixed_trace() -> None:
    trace = mixed_trace(5.0, 20, 1)
    for name in policy_names():
        fast = simulate(trace, make_policy(name), CM)
        slow = simulate(trace, make_policy(name), CM, record_steps=True)
        assert times(fast) == times(slow), name


@given(st.integers(1, 600), st.integers(0, 10**6))
def test_roofline_decode_steps_are_step_time(n: int, ctx: int) -> None:
    for cm in (CM, RooflineCostModel("rtx5090", "qwen3-8b", tp=2)):
        dts = cm.decode_steps(n, ctx, 5, 0.0, math.inf)
        assert dts == [cm.step_time(StepShape(0, 0, 0.0, 0, n, ctx + i * n)) for i in range(5)]
        assert len(cm.decode_steps(n, ctx, 5, 0.0, dts[0] + dts[1])) == 2  # none at the limit


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(policy_names()), workloads, st.one_of(st.none(), st.integers(30, 600)))
def test_run_ahead_then_rewind_equals_stepping(name: str, reqs: list[tuple[float, int, int]],
                                               kv: int | None) -> None:
    """Run as far ahead as possible, then cut back to each arrival (as the cluster does)."""
    trace = sorted((RequestSpec(a, p, o) for a, p, o in reqs), key=lambda s: s.arrival_s)
    eng = EngineConfig(num_kv_blocks=kv)
    ref = simulate(trace, make_policy(name), CM, eng, record_steps=True)
    sim = EngineSim(make_policy(name), CM, eng)
    i = 0
    while i < len(trace) or sim.has_work():
        nxt = trace[i].arrival_s if i < len(trace) else math.inf
        while sim.has_work() and sim.now < nxt:
            sim.advance(math.inf)
            sim.rewind(nxt)
        if i < len(trace):
            sim.idle_until(nxt)
            while i < len(trace) and trace[i].arrival_s <= sim.now:
                sim.add_request(trace[i])
                i += 1
    assert times(sim.result()) == times(ref)
