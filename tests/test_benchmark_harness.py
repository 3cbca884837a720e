"""benchmarks/harness.py through a benchmark run as a user runs it: the command echo, the
results JSON (written atomically, its path checked before any work) and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bench(name: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *argv], cwd=ROOT,
                          capture_output=True, text=True, env=env, check=False)



def refuses(name: str, *argvs: list[str]) -> None:
    """Each of ``argvs`` is bad input to ``name``: exit 2, nothing on stdout, one line on
    stderr that names the script."""
    for argv in argvs:
        bad = bench(name, *argv)
        assert bad.returncode == 2 and bad.stdout == "", bad.stderr
        assert bad.stderr.startswith(f"{name}: error: ") and bad.stderr.count("\n") == 1

def test_echo_table_and_results_json(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    argv = ("--duration", "5", "--instances", "8", "--pd-ratios", "1:1", "--json", str(out))
    proc = bench("cluster_ttft_breakdown.py", *argv)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("$ ") and lines[0].endswith(
        "benchmarks/cluster_ttft_breakdown.py " + " ".join(argv))
    header = lines[2]
    assert header.split()[:3] == ["layout", "pool", "n"] and header == header.rstrip()
    assert [ln.split()[0] for ln in lines[3:5]] == ["4P:4D", "4P:4D"]
    doc = json.loads(out.read_text())
    assert doc["command"] == lines[0][2:]
    assert set(doc["results"]) == {"4P:4D slowest 5%", "4P:4D all", "4P:4D deflected"}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left


def test_bad_arguments_are_one_line_exit_2(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    for name, argv in (("prefix_policies.py", ["--seeds", "0"]),
                       ("paper_grid.py", ["--json", str(blocker / "r.json")]),
                       ("decision_cost.py", ["--no-such-flag"]),
                       ("cluster_ttft_breakdown.py", ["--seed", "x"])):
        proc = bench(name, *argv)
        assert proc.returncode == 2, (name, proc.stderr)
        assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert proc.stderr.startswith(f"{name}: error: ")


def test_plugin_queue_cost_refuses_bad_sizes() -> None:
    refuses("plugin_queue_cost.py", ["--waiting", "x"], ["--waiting", "0"],
            ["--waiting", "9000"], ["--policies", " ; "], ["--reps", "0"])


def test_real_traffic_refuses_a_bad_output_scale() -> None:
    refuses("real_traffic.py", ["--output-scale", "0"], ["--output-scale", "nan"],
            ["--output-scale", "x"], ["--output-scale", "101"])
    refuses("ttft_tail.py", ["--configs", "ordered", "--output-scale", "0"])
    head = str(ROOT / "tests" / "data" / "traces" / "azure-2023-code-head.csv")
    refuses("headroom.py", ["--trace", head, "--output-scale", "0"],
            ["--trace", head, "--output-scale", "inf"])
    refuses("real_traffic.py", ["--max-tokens", "0"], ["--max-tokens", "x"],
            ["--max-tokens", "-5"])


def test_trace_speed_on_trace_slices(tmp_path: Path) -> None:
    """benchmarks/trace_speed.py: one row per trace (as published and overloaded) and
    policy, with the bar beside; the mean E2E is the simulator's own."""
    data = ROOT / "tests" / "data" / "traces"
    out = tmp_path / "r.json"
    proc = bench("trace_speed.py", "--azure", str(data / "azure-2023-code-head.csv"),
                 "--mooncake", str(data / "mooncake-synthetic-slice.jsonl"),
                 "--configs", "mbt:2048,predictive", "--overload", "3",
                 "--hour-configs", "mbt:2048", "--split", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["results"]
    assert [(r["trace"], r["config"]) for r in rows] == [
        (t, c) for t in ("azure-code 1h", "azure-code 1h x3", "mooncake", "mooncake x3")
        for c in ("mbt:2048", "predictive")] + [("mooncake x3 1h tiled", "mbt:2048")]
    tiled = rows[-1]  # the slice repeated back to back up to an hour of arrivals
    assert tiled["requests"] > rows[-2]["requests"] and tiled["span_s"] <= 3600
    for r in rows:
        assert r["wall_s_per_hour"] == r["wall_s"] * 3600 / r["span_s"]
        assert r["cpu_s_per_hour"] == r["cpu_s"] * 3600 / r["span_s"]
        assert r["avg_latency"] > 0 and r["target_s_per_hour"] == 10
        assert 0 <= r["policy_cpu_s"] <= r["cpu_s"] + 1e-3  # --split: the policy's share
    # (the CPU clock may tick in 4 ms here, more than a tiny slice's decisions take: the
    # calls are counted instead)
    assert all(r["policy_calls"] > 0 for r in rows if r["config"] == "predictive")
    assert abs(rows[2]["span_s"] * 3 - rows[0]["span_s"]) < 1e-6  # x3: a third of the span
    assert "bar" in proc.stdout.splitlines()[2] and "policy s/h" in proc.stdout.splitlines()[2]
    proc = bench("trace_speed.py", "--azure", str(tmp_path / "missing.csv"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_step_breakdown_terms_add_up_and_name_the_dominant_one(tmp_path: Path) -> None:
    """The 0.5B's predicted time on the paper's workload is mostly the per-step constant
    (issue 21: why it is predicted too slow); every step's terms sum to its step time."""
    out = tmp_path / "b.json"
    proc = bench("step_breakdown.py", "--models", "qwen2.5-0.5b", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())["results"]["qwen2.5-0.5b"]
    for budget in ("mbt:2048", "mbt:16384"):
        g = res["grid"][budget]
        assert g["step_overhead"] > max(g["gemm"], g["attn_prefill"])
        assert res["per_layer_overhead"][budget] < g["mean_e2e_s"]
    bad = bench("step_breakdown.py", "--models", "gpt-9")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_predictive_cost_splits_the_decision_time(tmp_path: Path) -> None:
    """benchmarks/predictive_cost.py: decisions, projections and the engine's share add up;
    a config that is not predictive is one line, exit 2."""
    data = ROOT / "tests" / "data" / "traces"
    out = tmp_path / "c.json"
    proc = bench("predictive_cost.py", "--trace", str(data / "mooncake-synthetic-slice.jsonl"),
                 "--configs", "predictive:hold=1;predictive:hold=1,replan=8", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["results"]
    assert [r["config"] for r in rows] == ["predictive:hold=1", "predictive:hold=1,replan=8"]
    for r in rows:
        assert 0 < r["projections"] <= r["decisions"] and r["reads"] >= r["projections"]
        # One clock (process CPU) for the run and its parts, and each part's calls run
        # inside its caller's: nested sums. (Not > 0: the CPU clock ticks in 4 ms here.)
        assert 0 <= r["project_s"] <= r["decide_s"] <= r["cpu_s"]
        assert r["engine_s"] == r["cpu_s"] - r["decide_s"]
    assert rows[1]["projections"] < rows[0]["projections"]  # replanning projects less
    proc = bench("predictive_cost.py", "--trace", str(data / "mooncake-synthetic-slice.jsonl"),
                 "--configs", "mbt:2048")
    assert proc.returncode == 2 and "not a predictive config" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_ttft_tail_reads_the_slowest_first_tokens(tmp_path: Path) -> None:
    """benchmarks/ttft_tail.py: per config and load, the tail is the top 1% of TTFTs (at
    least one request), its wait and prefill make up its TTFT, and a chunk's share of its
    step's budget is at most 1; bad input is one line, exit 2."""
    data = ROOT / "tests" / "data" / "traces"
    out = tmp_path / "t.json"
    proc = bench("ttft_tail.py", "--mooncake", str(data / "mooncake-synthetic-slice.jsonl"),
                 "--configs", "vllm:mbt=16384;vllm:mbt=2048", "--loads", "1,2",
                 "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["results"]["rows"]
    assert [(r["config"], r["load"]) for r in rows] == [
        ("vllm:mbt=16384", 1.0), ("vllm:mbt=16384", 2.0),
        ("vllm:mbt=2048", 1.0), ("vllm:mbt=2048", 2.0)]
    for r in rows:
        assert r["tail_requests"] >= 1 and r["tail_steps"] >= 1
        assert 0 < r["tail_budget_share"] <= 1 and r["tail_wait_s"] >= 0
        # the tail's mean TTFT (wait + prefill): the top floor(1%) of TTFTs, none below P99
        assert r["tail_wait_s"] + r["tail_prefill_s"] >= r["p99_ttft"] * (1 - 1e-9)
        cap = 16384 if "16384" in r["config"] else 2048
        assert r["step_prefill_tokens"] <= cap and r["tail_tokens_per_step"] <= cap
    refuses("ttft_tail.py", ["--configs", "nope:1"], ["--configs", "ordered", "--loads", "x"],
            ["--configs", "ordered", "--loads", "0"],
            ["--configs", "ordered", "--mooncake", str(tmp_path / "missing.jsonl")])


def test_model_clock_benchmark(tmp_path: Path) -> None:
    """benchmarks/model_clock.py: an engine uniformly 2x slower than the policy's model is
    read as such and the clock's runs equal the calibrated ones; a live step log replayed
    reads the fitted model within its band and a model twice as fast near 2; bad input is
    one line, exit 2."""
    data = ROOT / "tests" / "data" / "traces"
    out = tmp_path / "m.json"
    proc = bench("model_clock.py", "--traces", "mooncake", "--mooncake",
                 str(data / "mooncake-synthetic-slice.jsonl"), "--loads", "1,2",
                 "--cases", "slower", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    (res,) = json.loads(out.read_text())["results"]
    rows = {(r["arm"], r["load"]): r for r in res["rows"]}
    for x in (1.0, 2.0):
        assert rows[("clock", x)]["scale"] == 2.0 and rows[("model-seconds", x)]["scale"] == 1
        assert rows[("clock", x)]["mean_e2e"] == rows[("calibrated", x)]["mean_e2e"]
    log = ROOT / "benchmarks" / "results" / "live-steps-20261207-ordered.jsonl"
    for model, lo, hi, moves in (("demo-cpu", 0.8, 1.25, 0), ("demo-cpu-2x-fast", 1.5, 2.5, None)):
        out = tmp_path / f"{model}.json"
        proc = bench("model_clock.py", "--step-log", str(log), "--cost-model",
                     f"fitted:experiments/{model}.cost.json", "--windows", "256",
                     "--json", str(out))
        assert proc.returncode == 0, proc.stderr
        res = json.loads(out.read_text())["results"]
        w = res["windows"]["256"]
        assert all(lo <= r <= hi for r in w["ratios"]) and w["ratios"]
        # the table by prefill tokens counts every step once, and the decodes riding them
        steps = [s for s in map(json.loads, log.read_text().splitlines()) if "step" in s]
        bins = res["by_prefill_tokens"]
        assert sum(b["steps"] for b in bins.values()) == len(steps)
        assert sum(b["decodes"] for b in bins.values()) == sum(
            s["num_decode_reqs"] for s in steps)
        assert moves is None or len(w["moves"]) == moves
        assert moves == 0 or 1.5 <= w["final_scale"] <= 2.5
    refuses("model_clock.py", ["--cases", "nope"], ["--loads", "0"],
            ["--step-log", str(log)], ["--step-log", str(log), "--cost-model",
                                       "fitted:experiments/demo-cpu.cost.json", "--windows", "0"],
            ["--step-log", str(log), "--cost-model", "fitted:experiments/demo-cpu.cost.json",
             "--band", "1"],
            ["--step-log", str(tmp_path / "missing.jsonl"), "--cost-model",
             "fitted:experiments/demo-cpu.cost.json"])


def test_slo_misses_shares_add_up(tmp_path: Path) -> None:
    """benchmarks/slo_misses.py: per config and scale, the TTFT misses split by prompt length
    add up to the TTFT miss share, and the attainment is what neither miss leaves."""
    data = ROOT / "tests" / "data" / "traces"
    out = tmp_path / "r.json"
    proc = bench("slo_misses.py", "--mooncake", str(data / "mooncake-synthetic-slice.jsonl"),
                 "--configs", "vllm:mbt=16384;vllm:mbt=2048,long_prefill_token_threshold=512",
                 "--scales", "0.5,1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["results"]["rows"]
    assert [(r["config"], r["scale"]) for r in rows] == [
        ("vllm:mbt=16384", 0.5), ("vllm:mbt=16384", 1.0),
        ("vllm:mbt=2048,long_prefill_token_threshold=512", 0.5),
        ("vllm:mbt=2048,long_prefill_token_threshold=512", 1.0)]
    for r in rows:
        parts = r["ttft_miss_short"] + r["ttft_miss_mid"] + r["ttft_miss_long"]
        assert abs(parts - r["ttft_miss"]) < 1e-12
        worst, both = max(r["ttft_miss"], r["tpot_miss"]), r["ttft_miss"] + r["tpot_miss"]
        assert 1 - both - 1e-12 <= r["attainment"] <= 1 - worst + 1e-12
        assert r["mean_e2e_x1"] > 0
    assert any(r["ttft_miss"] > 0 for r in rows)  # the slice is busy enough to miss
    refuses("slo_misses.py", ["--configs", "nope:1"], ["--configs", "ordered", "--scales", "x"],
            ["--configs", "ordered", "--slo", "ttft=zz"],
            ["--configs", "ordered", "--mooncake", str(tmp_path / "missing.jsonl")])


def test_predictive_hold_counts_repeats_and_hits(tmp_path: Path) -> None:
    """benchmarks/predictive_hold.py: the per-step policy follows no plan; a held one
    projects less and follows the rest; shares are in [0, 1]; a config that is not
    predictive is one line, exit 2."""
    data = ROOT / "tests" / "data" / "traces"
    out = tmp_path / "h.json"
    proc = bench("predictive_hold.py", "--azure", "", "--mooncake",
                 str(data / "mooncake-synthetic-slice.jsonl"), "--overload", "1",
                 "--configs", "predictive:hold=1;predictive:hold=8", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["results"]
    assert [r["config"] for r in rows] == ["predictive:hold=1", "predictive:hold=8"]
    per_step, held = rows
    assert per_step["followed"] == 0 and per_step["projections"] == per_step["decisions"]
    assert held["projections"] + held["followed"] == held["decisions"]
    assert 0 < held["followed"] and held["projections"] < per_step["projections"]
    assert 0 <= held["hits"] <= held["followed"] and 0 <= per_step["repeat"] <= 1
    refuses("predictive_hold.py", ["--configs", "mbt:2048"], ["--overload", "0"],
            ["--mooncake", "nowhere.jsonl"])
