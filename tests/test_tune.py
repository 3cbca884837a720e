"""ppas tune: the stock search, its objectives, the command and the experiment it emits."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_cli import run_cli

from ppas.analysis.capacity import trace_capacity
from ppas.analysis.tune import (
    OBJECTIVES,
    Evaluator,
    Figures,
    StockSpace,
    pareto_front,
    serve_flags,
    short_name,
    tune,
)
from ppas.core.errors import PpasError
from ppas.core.slo import SloSpec
from ppas.engine.setup import engine_for
from ppas.engine.simulator import EngineConfig
from ppas.experiment.spec import load_experiment, parse_experiment
from ppas.workload import TraceTransform, load_trace

#: 10 ms a step whatever it holds: fewer steps is always better, so the best stock setting
#: is the largest MBT, no threshold, no interval, no admission limit.
CONSTANT = {"format": "ppas-fitted-cost-model/1",
            "coefficients": {"overhead_s": 0.01, "per_prefill_token_s": 0.0,
                             "per_attn_pair_s": 0.0, "per_decode_s": 0.0,
                             "per_decode_ctx_token_s": 0.0}}
BEST = ("vllm:mbt=16384,long_prefill_token_threshold=0,adaptive=false,"
        "prefill_schedule_interval=1,max_num_active_seqs=None,version=0.33")


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    """A burst of 24 long prompts (more than the smallest admission limit tried) and a
    second burst later; the constant cost model."""
    trace = tmp_path / "burst.jsonl"
    rows = [{"arrival_s": 0.01 * i, "prompt_tokens": 10000, "output_tokens": 4}
            for i in range(24)]
    rows += [{"arrival_s": 5 + 0.01 * i, "prompt_tokens": 3000, "output_tokens": 8}
             for i in range(8)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cost = tmp_path / "constant.json"
    cost.write_text(json.dumps(CONSTANT))
    return trace, cost


def _evaluator(trace: Path, cost: Path, loads: tuple[float, ...] = (1.0, 2.0),
               slo: SloSpec | None = None) -> Evaluator:
    raw = load_trace(trace)
    return Evaluator({x: TraceTransform().at_load(x).apply(raw) if x != 1 else raw
                      for x in loads}, None, None, f"fitted:{cost}",
                     engine=EngineConfig(max_num_seqs=256), slo=slo,
                     make_trace=lambda x: TraceTransform().at_load(x).apply(raw))


def test_space_is_distinct_and_valid() -> None:
    s = StockSpace().settings()
    assert len(s) == len(set(s))
    assert all("long_prefill_token_threshold=0,adaptive=true" not in c for c in s)
    # max_num_seqs=256 is the engine's own: the same schedule as none, tried once
    assert len(StockSpace(max_num_seqs=(None, 256)).settings()) == len(
        StockSpace(max_num_seqs=(None,)).settings())
    # 0.32 ignores prefill_schedule_interval: not searched there
    assert all("prefill_schedule_interval=1" in c for c in StockSpace().settings("0.32"))


def test_descent_finds_the_known_best_and_the_grid_agrees(files: tuple[Path, Path]) -> None:
    trace, cost = files
    mean = OBJECTIVES.get("mean-e2e")(None)
    d = tune(StockSpace().settings(), ["mbt:2048"], _evaluator(trace, cost), mean)
    g = tune(StockSpace().settings(), [], _evaluator(trace, cost), mean, method="grid")
    assert d.best == g.best == BEST
    assert set(d.oracle.values()) == {BEST}
    assert len(d.search.results) < len(g.search.results) == len(StockSpace().settings())
    assert serve_flags(BEST) == ["--max-num-batched-tokens", "16384"]
    assert short_name(BEST) == "vllm:mbt=16384"
    # mbt:2048 takes more 10 ms steps for every prompt: it loses at every load
    assert all(d.gain("mbt:2048", x) < 0 for x in d.loads)
    assert d.overall_gain("mbt:2048") < 0


def test_p99_ttft_objective_respects_the_tpot_slo() -> None:
    obj = OBJECTIVES.get("p99-ttft")(0.05)
    ok = Figures(1.0, 0.5, 0.04, 2.0, 0.9, 0.05, 10, 0)
    slow = Figures(1.0, 0.5, 0.04, 2.0, 0.9, 0.051, 10, 0)
    assert obj.at_load(ok) == 0.9
    assert obj.at_load(slow) == math.inf
    assert obj.score([ok, slow]) == math.inf
    assert obj.score([ok, ok]) == pytest.approx(0.9)
    # a search walks out of infeasibility: feasible first, then the smaller overshoot
    slower = Figures(1.0, 0.5, 0.04, 2.0, 0.1, 0.06, 10, 0)
    assert obj.rank([ok]) < obj.rank([slow]) < obj.rank([slower])
    assert obj.rank([slow])[1] == pytest.approx(0.02)
    with pytest.raises(PpasError, match="unknown objective 'capacity-x'; allowed: mean-e2e"):
        OBJECTIVES.get("capacity-x")


@pytest.mark.parametrize("slo", ["ttft=0.3s", "ttft=30x"])
def test_capacity_objective_is_the_capacity_search(files: tuple[Path, Path], slo: str) -> None:
    """Issue 19: ``--objective capacity`` maximises what ``ppas capacity`` finds (the loads
    as its grid, the same bisections): for the best setting and our policy alike."""
    trace, cost = files
    loads = (0.5, 1.0, 2.0)
    spec = SloSpec.parse(slo)
    obj = OBJECTIVES.get("capacity")(None, 0.9, 3)
    rep = tune(StockSpace().settings(), ["mbt:2048"], _evaluator(trace, cost, loads, spec),
               obj)
    caps = {c: obj.overall(obj.figs(r, loads)) for c, r in rep.search.results.items()}
    assert len(set(caps.values())) > 2  # the settings differ: the search has work to do
    assert rep.overall(rep.best) == max(caps.values())
    for c in (rep.best, "mbt:2048"):
        cap = trace_capacity(load_trace(trace), lambda c=c: engine_for(  # type: ignore[misc]
            c, None, None, cost_model=f"fitted:{cost}", config=EngineConfig(max_num_seqs=256)),
            spec, 0.9, scales=loads, steps=3)
        assert rep.overall(c) == (cap.scale or 0.0)
    assert rep.overall_gain("mbt:2048") == pytest.approx(
        (rep.overall("mbt:2048") / rep.overall(rep.best) - 1) * 100)
    assert rep.gain("mbt:2048", 1.0) == pytest.approx(
        (rep.value("mbt:2048", 1.0) / rep.value(rep.best, 1.0) - 1) * 100)


def test_command_capacity_objective(files: tuple[Path, Path], tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    trace, cost = files
    out = tmp_path / "tune.json"
    rc, stdout, err = run_cli(["tune", str(trace), "--cost-model", f"fitted:{cost}",
                               "--loads", "0.5,1,2", "--configs", "mbt:2048",
                               "--objective", "capacity", "--slo", "ttft=0.3s",
                               "--attainment", "90", "--json", str(out)], capsys)
    assert rc == 0, err
    assert "SLO attainment per load" in stdout and "SLO ttft=300ms" in stdout
    rec = json.loads(out.read_text())
    assert rec["objective"] == "capacity" and rec["objective_unit"] == "x"
    assert rec["best"]["overall"] >= rec["overall"]["mbt:2048"]
    # the bisection's runs are kept beside the loads asked for
    assert set(rec["stock"][rec["best"]["setting"]]) >= {"0.5", "1", "2"}


def test_pareto_front() -> None:
    def f(ttft: float, tpot: float) -> Figures:
        return Figures(1, 1, 1, 1, ttft, tpot, 1, 0)

    pts = {"a": f(1, 3), "b": f(2, 2), "c": f(3, 1), "d": f(3, 3), "e": f(2, 2)}
    assert pareto_front(pts) == ["a", "b", "c"]


def test_at_load_rescales_on_top_of_the_transform() -> None:
    assert TraceTransform().at_load(2).time_scale == 0.5
    assert TraceTransform(time_scale=4).at_load(2).time_scale == 2
    assert TraceTransform(rate=3).at_load(2).rate == 6
    assert TraceTransform(window=(0, 10)).at_load(1) == TraceTransform(window=(0, 10))
    with pytest.raises(PpasError, match="load must be a number > 0"):
        TraceTransform().at_load(0)


def test_command_prints_writes_and_emits_a_valid_experiment(
        files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, cost = files
    out, exp = tmp_path / "tune.json", tmp_path / "tuned.toml"
    rc, stdout, err = run_cli(["tune", str(trace), "--cost-model", f"fitted:{cost}",
                               "--loads", "1,2", "--configs", "mbt:2048;predictive",
                               "--json", str(out), "--emit-experiment", str(exp),
                               "--experiment-model", "Qwen/Qwen3-8B"], capsys)
    assert rc == 0, err
    assert "vllm serve MODEL --max-num-batched-tokens 16384\n" in stdout
    assert "Pareto front" in stdout
    rec = json.loads(out.read_text())
    assert rec["best"]["setting"] == BEST
    assert set(rec["oracle"]) == {"1", "2"}
    assert set(rec["gains"]) == {"mbt:2048", "predictive"}
    assert rec["pareto_front"]["1"]
    e = load_experiment(exp)
    assert e.workload.loads == (1.0, 2.0)
    stock = e.arm("stock-tuned")
    assert stock.baseline and stock.stock_dict() == {"max_num_batched_tokens": 16384}
    assert e.arm("predictive").cost_model == f"fitted:{cost}"
    # the same trace at the same loads as tune ran it
    assert len(e.workload.trace(2.0, 0)) == 32
    assert e.workload.trace(2.0, 0).duration_s == pytest.approx(
        e.workload.trace(1.0, 0).duration_s / 2)
    rc, stdout, err = run_cli(["experiment", str(exp), "--dry-run"], capsys)
    assert rc == 0, err
    assert "rate multipliers 1, 2" in stdout


def test_emitted_experiment_with_roofline_has_a_calibration_arm(
        files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, _ = files
    exp = tmp_path / "tuned.toml"
    rc, _, err = run_cli(["tune", str(trace), "--hardware", "h100-sxm-80gb", "--model",
                          "qwen3-8b", "--configs", "predictive", "--emit-experiment", str(exp),
                          "--experiment-model", "Qwen/Qwen3-8B"], capsys)
    assert rc == 0, err
    e = load_experiment(exp)
    assert e.arm("predictive").cost_model == "fitted:auto"
    assert any(a.calibrates for a in e.arms)


@pytest.mark.parametrize(("flags", "msg"), [
    (["--loads", "0"], "--loads: values must be finite numbers > 0"),
    (["--objective", "fast"], "argument --objective: invalid choice: 'fast'"),
    (["--tpot-slo", "100ms"], "--tpot-slo applies to --objective p99-ttft only"),
    (["--objective", "p99-ttft", "--tpot-slo", "soon"], "--tpot-slo: must be a duration"),
    (["--emit-experiment", "x.toml"], "--emit-experiment needs --experiment-model"),
    (["--configs", "nope"], "unknown policy 'nope'; allowed:"),
    (["--json", "burst.jsonl"], "--json"),
    (["--vllm-version", "0.1"], "invalid choice: '0.1'"),
    (["--objective", "p99-ttft", "--tpot-slo", "1ms"], "no stock setting tried meets"),
    (["--objective", "capacity"], "--objective capacity needs --slo (METRIC=VALUE"),
    (["--slo", "ttft=1s"], "--slo applies to --objective capacity only"),
    (["--attainment", "80", "--bisect-steps", "2"], "--attainment, --bisect-steps apply to "
     "--objective capacity only"),
    (["--objective", "capacity", "--slo", "ttft=1ms"], "no stock setting tried meets"),
])
def test_bad_flags_exit_2_in_one_line(flags: list[str], msg: str, files: tuple[Path, Path],
                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    trace, cost = files
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli(["tune", str(trace), "--cost-model", f"fitted:{cost}",
                          "--configs", "mbt:2048", *flags]
                         if "--configs" not in flags else
                         ["tune", str(trace), "--cost-model", f"fitted:{cost}", *flags], capsys)
    assert rc == 2
    assert msg in err
    assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["burst.jsonl", "constant.json"]


def test_roofline_needs_hardware_and_model(files: tuple[Path, Path],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(["tune", str(files[0])], capsys)
    assert rc == 2 and "needs --hardware and --model" in err


def test_experiment_trace_loads_are_checked(files: tuple[Path, Path]) -> None:
    base = ('[model]\npath = "Qwen/Qwen3-8B"\n[workload]\nkind = "trace"\nfile = "{f}"\n'
            'loads = {loads}\n[[arms]]\nname = "a"\npolicy = "mbt:2048"\n')
    f = files[0]
    with pytest.raises(PpasError, match="workload.loads: must be distinct rate multipliers"):
        parse_experiment(base.format(f=f, loads="[1, 1]"), "x")
    e = parse_experiment(base.format(f=f, loads="[1, 3]"), "x")
    assert [e.workload.load_label(x) for x in e.workload.loads] == ["x1", "x3"]
    assert e.workload.trace(3, 0).duration_s == pytest.approx(
        e.workload.trace(1, 0).duration_s / 3)
    plain = parse_experiment(base.replace("loads = {loads}\n", "").format(f=f), "x")
    assert plain.workload.loads == (0.0,) and plain.workload.load_label(0.0) == "trace"
