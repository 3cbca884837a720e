"""The model clock (``ppas.policies.model_clock``): wall seconds per cost-model second read
off the engine's step records, and ``ordered``'s rules that compare model seconds with the
wall clock (module doc, "The model clock")."""

from __future__ import annotations

from dataclasses import replace

import pytest
from chunk_run_engines import engine
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_views import dec, view

from ppas.core.errors import PpasError
from ppas.core.view import RequestSnapshot, StepRecord
from ppas.cost.base import CostModel, StepShape
from ppas.cost.fitted import FittedCostModel
from ppas.cost.roofline import RooflineCostModel
from ppas.engine.simulator import EngineSim, replay, simulate
from ppas.policies import make_policy
from ppas.policies.model_clock import MIN_STEPS, WINDOW, ModelClock
from ppas.policies.ordered import Ordered
from ppas.workload import RequestSpec

CM = RooflineCostModel("h100-sxm-80gb", "qwen3-8b", max_num_batched_tokens=8192)
# A CPU-like fitted model, and the same engine twice as slow (every coefficient doubled).
FIT = FittedCostModel(overhead_s=0.009, per_prefill_token_s=0.36e-3, per_attn_pair_s=2e-9,
                      per_decode_s=1e-4, per_decode_ctx_token_s=1e-8, kv_capacity_tokens=200_000)
FIT2 = replace(FIT, **{n: 2 * getattr(FIT, n) for n in (
    "overhead_s", "per_prefill_token_s", "per_attn_pair_s", "per_decode_s",
    "per_decode_ctx_token_s")})


def shape_of(r: StepRecord) -> StepShape:
    return StepShape(r.num_prefill_tokens, r.num_prefill_reqs, r.prefill_attn_work,
                     r.prefill_kv_tokens, r.num_decode_reqs, r.decode_ctx_tokens)


def record(t: float, s: StepShape, factor: float, cm: CostModel = CM) -> StepRecord:
    """A step of shape ``s`` launched at ``t`` that ran ``factor`` times ``cm``'s price."""
    return StepRecord(t, factor * cm.step_time(s), 0.0, 8192, s.num_prefill_tokens,
                      s.num_decodes, s.num_prefill_reqs, s.num_decodes, s.prefill_attn_work,
                      s.prefill_kv_tokens, s.decode_ctx_tokens)


shapes = st.builds(lambda c, p, nd, k: StepShape.one_chunk(c, p, nd, nd * k),
                   st.integers(0, 8192), st.integers(0, 30000), st.integers(0, 64),
                   st.integers(1, 30000)).filter(lambda s: s.num_tokens > 0)


@settings(max_examples=60, deadline=None)
@given(st.floats(1.05, 3.0), st.lists(st.tuples(st.lists(shapes, min_size=0, max_size=12),
                                                st.floats(0.2, 5.0)), min_size=1, max_size=25))
def test_scale_moves_only_outside_the_band_and_then_to_the_ratio(
        band: float, batches: list[tuple[list[StepShape], float]]) -> None:
    clock = ModelClock(CM, band)
    t = 0.0
    seen: list[tuple[float, float]] = []
    for shapes_, factor in batches:
        steps = []
        for s in shapes_:
            t += 1.0
            steps.append(record(t, s, factor))
            seen.append((factor * CM.step_time(s), CM.step_time(s)))
        before = clock.scale
        moved = clock.note(steps)
        assert clock.note(steps) is False  # each record is read once
        last = seen[-WINDOW:]
        r = clock.ratio()
        if len(last) < MIN_STEPS:
            assert r is None and not moved and clock.scale == before
            continue
        assert r == pytest.approx(sum(d for d, _ in last) / sum(q for _, q in last), rel=1e-9)
        inside = before / band <= r <= before * band
        assert moved == (not inside)
        assert clock.scale == (before if inside else r)


def test_a_slow_engine_is_read_within_min_steps() -> None:
    clock = ModelClock(CM, 1.25)
    s = StepShape.one_chunk(2048, 0, 8, 8 * 3000)
    for i in range(MIN_STEPS - 1):
        assert not clock.note([record(float(i), s, 1.9)])
    assert clock.scale == 1.0
    assert clock.note([record(99.0, s, 1.9)])
    assert clock.scale == pytest.approx(1.9, rel=1e-12)
    # Within the band around 1.9 it stays, however the ratio wanders.
    for i in range(WINDOW):
        clock.note([record(100.0 + i, s, 1.9 * 1.2)])
    assert clock.scale == pytest.approx(1.9, rel=1e-12)


def test_untimed_and_empty_steps_are_skipped() -> None:
    clock = ModelClock(CM, 1.25)
    s = StepShape.one_chunk(512)
    untimed = replace(record(1.0, s, 1.0), duration_s=0.0)
    empty = StepRecord(2.0, 0.5, 0.0, 8192, 0, 0, 0, 0)
    clock.note([untimed, empty])
    assert len(clock.window) == 0 and clock.ratio() is None
    with pytest.raises(ValueError, match="band must be > 1"):
        ModelClock(CM, 1.0)
    for bad in ("1", "0.5", "-1", "101"):
        with pytest.raises(PpasError, match=r"clock_band must be 0 \(off\) or in \(1, 100\]"):
            make_policy(f"ordered:clock_band={bad}")


# -- the engines' records carry the shapes they ran --------------------------------------------
BURST = [RequestSpec((i * 7919) % 1000 / 400, 1 + (i * 104729) % 9000, 1 + (i * 31) % 70)
         for i in range(60)]


@pytest.mark.parametrize("spec", ["ordered", "sloweave:tpot_s=0.03,c_max=300",
                                  "mbt:2048", "vllm:mbt=8192"])
def test_simulator_records_price_to_their_durations(spec: str) -> None:
    """Every step's record, from single steps, decode runs and chunk runs (sloweave takes
    chunk runs), prices on the engine's model to its own duration."""
    sim, counter = engine(spec, CM, None, True)  # every step's record kept
    replay(sim, BURST)
    assert len(sim.recent) == sim.num_steps > 50
    assert counter.steps > 0 or not spec.startswith("sloweave")
    for r in sim.recent:
        assert CM.step_time(shape_of(r)) == pytest.approx(r.duration_s, rel=1e-9)


def test_on_its_own_model_the_clock_never_moves_and_decides_nothing() -> None:
    """In the simulator the engine prices steps with the policy's model: the clock reads
    1 and ``ordered``'s run is the one with ``clock_band=0``, request for request."""
    on, off = make_policy("ordered"), make_policy("ordered:clock_band=0")
    assert isinstance(on, Ordered)
    a, b = simulate(BURST, on, CM), simulate(BURST, off, CM)
    assert on._clock is not None and on._clock.changes == 0
    ratio = on._clock.ratio()
    assert ratio is not None and ratio == pytest.approx(1.0, rel=1e-9)
    assert [(r.first_token_time, r.finish_time) for r in a.requests] == [
        (r.first_token_time, r.finish_time) for r in b.requests]


def test_an_engine_twice_as_slow_as_the_model_is_read_as_such() -> None:
    p = make_policy("ordered:c_max=2048")
    assert isinstance(p, Ordered)
    sim = EngineSim(p, FIT2)
    p.bind_cost_model(FIT)  # the policy's model: twice as fast as the engine
    replay(sim, BURST)
    assert p._clock is not None and p._clock.changes == 1
    assert p._clock.scale == pytest.approx(2.0, rel=1e-9)


# -- ordered's wall-clock rules, scaled --------------------------------------------------------
def ordered_on(spec: str, cm: CostModel = FIT) -> Ordered:
    p = make_policy(spec)
    assert isinstance(p, Ordered)
    p.bind_cost_model(cm)
    return p


def slow_steps(factor: float, n: int = MIN_STEPS, cm: CostModel = FIT) -> tuple[StepRecord, ...]:
    s = StepShape.one_chunk(512, 0, 1, 2000)
    return tuple(record(9.0 - 0.01 * (n - i), s, factor, cm) for i in range(n))


def test_the_aging_deadline_is_in_measured_seconds() -> None:
    """A long prompt that has waited 1.5x its aging deadline in model seconds goes first
    with the model's clock, and not when the engine runs twice as slow as the model."""
    spec = "ordered:aging=5,drain=0,turn=0,c_max=2048,idle_limit=0"
    off = ordered_on(spec + ",clock_band=0")
    solo = off.solo_estimate(3000, 16)
    now = 10.0
    reqs = [dec(0, ctx=2000), RequestSnapshot("long", now - 1.5 * 5 * solo, 3000,
                                               max_output_tokens=16),
            RequestSnapshot("short", now - 1e-3, 100, max_output_tokens=16)]
    v = view(reqs, now=now, steps=slow_steps(2.0))
    assert off.decide(v).prefill_order == ("long", "short")  # overdue by the model
    on = ordered_on(spec)
    assert on.decide(v).prefill_order == ("short", "long")  # 0.75x its measured deadline
    assert on.decide_full(v).prefill_order == ("short", "long")
    # On an engine as fast as the model the two agree.
    v1 = view(reqs, now=now, steps=slow_steps(1.0))
    assert ordered_on(spec).decide(v1).prefill_order == ("long", "short")


def test_the_load_gate_reads_the_measured_load() -> None:
    """Arrivals whose work is 0.3 of the window in model seconds keep the idle limit; on
    an engine twice as slow they are 0.6 of it, past the gate's 0.5."""
    p = ordered_on("ordered:c_max=2048,idle_window=10,clock_band=0")
    lim = p.idle_limit_of()
    assert lim > 0
    assert p._arrivals is not None
    per = p._arrivals.costs.prefill_time(lim, 0, 1000)
    n = int(0.3 * 10 / per)
    now = 10.0
    arrivals = [RequestSnapshot(f"a{i}", now - 9.0 + i * 8.0 / n, 1000, 1000, 1, 16, True,
                                now - 0.01) for i in range(n)]
    reqs = [*arrivals, RequestSnapshot("w", now - 0.001, 1000, max_output_tokens=16)]
    for spec, factor, limited in [("clock_band=0", 2.0, True), ("clock_band=1.25", 1.0, True),
                                  ("clock_band=1.25", 2.0, False)]:
        q = ordered_on(f"ordered:c_max=2048,idle_window=10,{spec}")
        # Every arrival is noted once, while it waits (the gate's window), then the step.
        for a in arrivals:
            q.decide(view([RequestSnapshot(a.request_id, a.arrival_time, 1000,
                                           max_output_tokens=16)], now=a.arrival_time))
        d = q.decide(view(reqs, now=now, steps=slow_steps(factor)))
        assert (d.chunk_limit == lim) == limited, (spec, factor)
