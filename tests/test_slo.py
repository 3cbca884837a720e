"""SLOs (``ppas.core.slo``), inter-token latencies (``Gaps``, the simulator's ITL), solo
latency and capacity (``ppas.analysis.capacity``, ``ppas capacity``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import run_cli

from ppas.analysis.capacity import Point, find_capacity, trace_capacity
from ppas.core.errors import PpasError
from ppas.core.metrics import Gaps, RequestMetrics, RunSummary
from ppas.core.slo import SloBound, SloSpec, SoloLatency
from ppas.cost.base import CostModel, StepShape
from ppas.engine.setup import EngineSetup, engine_for
from ppas.engine.simulator import EngineConfig, simulate
from ppas.engine.solo import SoloTable, solo_latency
from ppas.policies import make_policy
from ppas.workload import RequestSpec, Trace, gamma_trace

AZURE = Path(__file__).parent / "data" / "traces"


# -- the SLO spec ---------------------------------------------------------------------------
def test_slo_spec_units_and_aliases() -> None:
    s = SloSpec.parse("ttft=2s, tpot=100ms,e2el=5x")
    assert s.ttft == SloBound(2.0, False)
    assert s.tpot is not None and s.tpot.value == pytest.approx(0.1) and not s.tpot.relative
    assert s.e2e == SloBound(5.0, True) and s.relative
    assert str(s) == "ttft=2s,tpot=100ms,e2e=5x"
    assert SloSpec.parse(str(s)) == s
    assert not SloSpec.parse("TTFT=0.5s").relative


@pytest.mark.parametrize("text", ["ttft=2", "ttft=", "itl=2s", "ttft=0s", "ttft=-1ms",
                                  "ttft=infs", "ttft=nanx", "ttft=2s,ttft=3s", "ttft", "",
                                  "ttft=2h", "ttft=1e9s"])
def test_bad_slo_specs_are_one_line_errors(text: str) -> None:
    with pytest.raises(PpasError) as e:
        SloSpec.parse(text)
    assert "\n" not in str(e.value) and ("ttft" in str(e.value) or "SLO" in str(e.value))


def test_apply_gives_bounds_in_seconds_and_relative_needs_solo() -> None:
    m = RequestMetrics(arrival_s=0.0, ttft=1.0, e2e=3.0, tpot=0.05, output_tokens=41)
    solo = SoloLatency(ttft=0.25, tpot=0.01, e2e=0.65)
    r = SloSpec.parse("ttft=4x,tpot=4x").apply(m, solo)
    assert (r.ttft_slo, r.tpot_slo, r.e2e_slo) == (1.0, 0.04, None)
    assert not r.meets_slo()  # TTFT equal to its bound meets it; TPOT 0.05 > 0.04 misses
    assert SloSpec.parse("ttft=4x,tpot=5x").apply(m, solo).meets_slo()
    with pytest.raises(PpasError, match="relative"):
        SloSpec.parse("ttft=4x").apply(m)


# -- ITL ------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10, allow_nan=False), st.integers(1, 20)),
                min_size=1, max_size=30),
       st.lists(st.floats(0, 100), min_size=1, max_size=5))
def test_gaps_quantiles_are_numpys_on_the_expanded_sample(
        pairs: list[tuple[float, int]], qs: list[float]) -> None:
    g = Gaps()
    for v, c in pairs:
        g.add(v, c)
    flat = np.repeat([v for v, _ in pairs], [c for _, c in pairs])
    assert g.total == len(flat)
    assert g.quantiles(qs) == pytest.approx(list(np.percentile(flat, qs)), abs=1e-9)
    assert g.mean() == pytest.approx(float(flat.mean()), abs=1e-9)


def _itl_sample(record_steps: bool, config: str) -> tuple[np.ndarray, list[RequestMetrics]]:
    trace = gamma_trace(4.0, 40, 3, 1.0, 3000, 60)
    e = engine_for(config, "h100-sxm-80gb", "qwen3-8b")
    res = simulate(trace, e.policy, e.cost_model, e.config, record_steps=record_steps)
    return np.sort(res.gaps.expanded()), res.request_metrics()


@pytest.mark.parametrize("config", ["mbt:2048", "ppas", "vllm"])
def test_decode_runs_give_the_itl_of_single_steps(config: str) -> None:
    """``record_steps`` takes every step singly; the decode runs' ITLs are the same."""
    fast, ms = _itl_sample(False, config)
    slow, _ = _itl_sample(True, config)
    assert len(fast) == len(slow) == sum(m.output_tokens - 1 for m in ms)
    np.testing.assert_allclose(fast, slow, rtol=1e-9, atol=1e-12)
    assert (fast > 0).all()


def test_itl_sums_to_each_requests_decode_time() -> None:
    """Every gap belongs to one request: they sum to sum(E2E - TTFT)."""
    flat, ms = _itl_sample(False, "mbt:8192")
    assert flat.sum() == pytest.approx(sum(m.e2e - m.ttft for m in ms), rel=1e-9)


def test_run_summary_reports_tails_and_keeps_run_keys() -> None:
    trace = gamma_trace(2.0, 20, 1, 1.0, 2000, 20)
    e = engine_for("mbt:2048", "h100-sxm-80gb", "qwen3-8b")
    res = simulate(trace, e.policy, e.cost_model, e.config)
    rec = res.summary()
    for k in ("ttft", "tpot", "e2e", "itl"):
        assert rec[f"{k}_p50"] <= rec[f"{k}_p90"] <= rec[f"{k}_p99"]
    assert "slo_attainment" not in rec
    plain = RunSummary.of(res.request_metrics(), 0).record()
    assert {k: rec[k] for k in plain} == plain  # the old keys, the same figures


# -- solo latency ---------------------------------------------------------------------------
def test_solo_latency_is_a_request_alone_on_the_engine() -> None:
    """Alone under a budget covering its prompt, the simulator gives the solo figures."""
    e = engine_for("mbt:16384", "h100-sxm-80gb", "qwen3-8b")
    spec = RequestSpec(0.0, 4000, 50)
    res = simulate([spec], e.policy, e.cost_model, e.config)
    m = res.request_metrics()[0]
    solo = solo_latency(4000, 50, e.cost_model)
    assert solo.ttft <= m.ttft * (1 + 1e-9)
    assert solo.e2e - solo.ttft == pytest.approx(m.e2e - m.ttft, rel=1e-9)
    assert solo.tpot == pytest.approx(m.tpot, rel=1e-9)
    s = res.run_summary(SloSpec.parse("tpot=1.000001x,ttft=1.000001x"), SoloTable(e.cost_model))
    assert s.slo_attainment == 1.0


# -- capacity -------------------------------------------------------------------------------
def _step(threshold: float) -> object:
    def at(s: float) -> Point:
        return Point(s, 1.0 if s <= threshold else 0.5)
    return at


@settings(max_examples=200, deadline=None)
@given(st.floats(0.3, 7.9), st.integers(0, 12))
def test_capacity_brackets_a_monotone_threshold(theta: float, steps: int) -> None:
    grid = (0.25, 0.5, 1, 2, 4, 8)
    cap = find_capacity(_step(theta), grid, 0.9, steps)  # type: ignore[arg-type]
    assert cap.bound == "found" and cap.scale is not None and cap.hi is not None
    assert cap.scale <= theta < cap.hi
    assert cap.hi / cap.scale <= 2 ** (1 / 2**steps) * (1 + 1e-9)
    assert len(cap.points) == len(grid) + steps


def test_capacity_takes_the_first_failing_bracket_and_reports_the_rest() -> None:
    """Not monotone: fails at 2, attains again at 4. Capacity stays in [1, 2)."""
    def at(s: float) -> Point:
        return Point(s, 0.5 if 1.5 < s < 3 else 1.0)

    cap = find_capacity(at, (1, 2, 4), 0.9, 8)
    assert cap.scale is not None and cap.hi is not None and 1.4 < cap.scale <= 1.5 < cap.hi
    assert any(p.scale == 4 and p.attainment == 1.0 for p in cap.points)


def test_capacity_below_and_above_the_grid() -> None:
    assert find_capacity(_step(0.1), (1, 2), 0.9, 5).bound == "below"  # type: ignore[arg-type]
    cap = find_capacity(_step(9), (1, 2), 0.9, 5)  # type: ignore[arg-type]
    assert (cap.bound, cap.scale) == ("above", 2)


class _Linear(CostModel):
    """1 ms per token, nothing else: a 1000-token prompt takes 1 s however it is batched."""

    def step_time(self, step: StepShape) -> float:
        return 1e-3 * step.num_tokens


def test_capacity_on_a_queue_known_analytically() -> None:
    """100 requests of 1000 prompt tokens and 1 output, one every 2 s: service 1 s each.
    Up to scale 2 nobody queues (TTFT = solo); past it request i waits i (1 - 2/s) s, and
    with ttft=1.5x the 90% target fails once 1 - 2/s > 0.5/89, so capacity is in
    [2, 2.012]."""
    def setup() -> EngineSetup:
        return EngineSetup(make_policy("mbt:2048"), _Linear(), EngineConfig())

    trace = Trace(tuple(RequestSpec(2.0 * i, 1000, 1) for i in range(100)), 200.0, "even")
    cap = trace_capacity(trace, setup, SloSpec.parse("ttft=1.5x"), 0.9,
                         scales=(0.5, 1, 2, 4), steps=10)
    assert cap.bound == "found" and cap.scale is not None
    assert 2.0 <= cap.scale <= 2.012 + 1e-3


# -- the commands ---------------------------------------------------------------------------
GAMMA = ["--request-rate", "2", "--num-prompts", "30", "--prompt-tokens", "2000",
         "--output-tokens", "30", "--hardware", "h100-sxm-80gb", "--model", "qwen3-8b"]


def test_simulate_slo_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(["simulate", *GAMMA, "--configs", "mbt:2048",
                       "--slo", "ttft=5x,tpot=100ms", "--json"], capsys)
    assert rc == 0
    r = json.loads(out)[0]
    assert r["slo"] == "ttft=5x,tpot=100ms" and 0 <= r["slo_attainment"] <= 1
    assert r["goodput"] >= 0 and r["itl_p99"] >= r["itl_p50"] > 0


def test_capacity_command_json_and_table(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    args = ["capacity", *GAMMA, "--configs", "mbt:2048", "--slo", "ttft=3x",
            "--scales", "0.5,4,64", "--bisect-steps", "2"]
    rc, out, _ = run_cli([*args, "--json"], capsys)
    assert rc == 0
    r = json.loads(out)["results"][0]
    assert r["capacity_bound"] in ("found", "below", "above")
    assert len(r["points"]) >= 3 and all("ttft_p99" in p for p in r["points"])
    if r["capacity_bound"] == "found":
        assert r["capacity_scale"] < r["failing_scale"]
    rc, out, _ = run_cli(args, capsys)
    assert rc == 0 and "capacity:" in out and "rate scale" in out


@pytest.mark.parametrize("extra", [["--slo", "ttft=2"], [], ["--slo", "ttft=2s", "--scales",
                                                            "0"],
                                   ["--slo", "ttft=2s", "--attainment", "120"],
                                   ["--slo", "ttft=2s", "--plot", "x.gif"]])
def test_capacity_bad_input_is_one_line_exit_2(extra: list[str],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(["capacity", *GAMMA, "--configs", "mbt:2048", *extra], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("toml", ["cluster-colocated.toml", "cluster-disaggregated.toml"])
def test_cluster_slo_and_itl(toml: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).parent.parent / "examples" / toml
    rc, out, _ = run_cli(["simulate", "--cluster", str(path), "--mixed", "--request-rate", "3",
                       "--duration", "20", "--slo", "ttft=5x,tpot=2ms", "--json"], capsys)
    assert rc == 0
    r = json.loads(out)[0]
    assert r["slo"] == "ttft=5x,tpot=2ms" and r["tpot_attainment"] == 0.0  # 2 ms: none
    assert r["slo_attainment"] == 0.0 and r["itl_p99"] >= r["itl_p50"] > 0
