"""The CLI contract: JSON schema, tables, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ppas.analysis.sweep import RECORD_KEYS
from ppas.cli import main


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        rc = main(args)
    except SystemExit as e:  # argparse errors
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_sweep_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(["sweep", "--hardware", "rtx5090", "--model", "qwen2.5-3b",
                          "--burst-rates", "0.4,1.4", "--seeds", "0,1",
                          "--configs", "mbt:2048,ppas:n_th=2,b_max=16384,b_cap=2048",
                          "--json"], capsys)
    assert rc == 0
    recs = json.loads(out)
    assert len(recs) == 2 * 2 * 2
    for r in recs:
        assert set(RECORD_KEYS) <= set(r)
        assert r["config"] in ("mbt:2048", "ppas:n_th=2,b_max=16384,b_cap=2048")
        assert r["failed"] == 0 and r["num_requests"] > 0
        assert 0 < r["avg_ttft"] < r["avg_latency"] <= r["p95_latency"] * 1.0001 + 1e9 * 0
        assert r["makespan"] > 0 and r["avg_tpot"] > 0


def test_simulate_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(["simulate", "--hardware", "h100-sxm-80gb", "--model", "qwen2.5-7b",
                          "--burst-rate", "1.0", "--configs", "mbt:2048,ppas"], capsys)
    assert rc == 0 and "avg_latency" in out and "ppas" in out
    rc, out, _ = run_cli(["simulate", "--hardware", "h100-sxm-80gb", "--model", "qwen2.5-7b",
                          "--configs", "ppas", "--json", "--seed", "3"], capsys)
    (rec,) = json.loads(out)
    assert rec["seed"] == 3 and rec["config"] == "ppas"


def test_sweep_plot_and_out_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "fig.png"
    rc, out, _ = run_cli(["sweep", "--hardware", "rtx5090", "--model", "qwen2.5-3b",
                          "--burst-rates", "0.4,1.0", "--seeds", "0", "--plot", str(plot),
                          "--out-dir", str(tmp_path / "out")], capsys)
    assert rc == 0 and plot.stat().st_size > 1000
    assert "geometric-mean improvement" in out and "mean E2E latency" in out
    assert json.loads((tmp_path / "out" / "records.json").read_text())


RTX = ["--hardware", "rtx5090", "--model", "qwen2.5-3b"]
BAD = [
    (["sweep", "--hardware", "rtx9999", "--model", "qwen2.5-3b"], "allowed: rtx5090"),
    (["sweep", "--hardware", "rtx5090", "--model", "gpt-5"], "allowed: qwen2.5-0.5b"),
    (["sweep", "--hardware", "rtx5090"], "needs --hardware and --model"),
    (["sweep", "--hardware", "rtx5090", "--model", "qwen2.5-3b", "--configs", "fast"],
     "unknown policy 'fast'; allowed: "),
    (["sweep", "--hardware", "rtx5090", "--model", "qwen2.5-3b", "--burst-rates", "0.4,x"],
     "not a comma-separated list"),
    (["sweep", "--hardware", "rtx5090", "--model", "qwen2.5-3b", "--burst-rates", "-1"],
     "must be finite numbers > 0"),
    (["sweep", "--hardware", "rtx5090", "--model", "qwen2.5-3b", "--phases", "10:1"],
     "must contain {burst}"),
    (["simulate", "--hardware", "rtx5090", "--model", "qwen2.5-3b", "--phases", "10:x"],
     "malformed phase"),
    (["simulate", "--cost-model", "magic"], "allowed: roofline, fitted:FILE"),
    (["simulate", "--cost-model", "fitted:/nonexistent/cost.json"], "nonexistent"),
    (["simulate", "--hardware", "rtx5090", "--model", "qwen2.5-3b", "--trace", "/no/such.csv"],
     "does not exist"),
    (["simulate", "--hardware", "rtx5090", "--model", "qwen2.5-3b", "--prompt-tokens", "0"],
     "--prompt-tokens: must be an integer in [1, 10000000], got '0'"),
    (["sweep", "--hardware", "rtx5090", "--model", "qwen2.5-3b", "--plot", "/tmp/x.bmp"],
     "allowed: .png"),
    (["simulate", "--max-num-seqs", "abc"], "--max-num-seqs: must be an integer in [1, "),
    # issue 11: tracebacks and missing bounds, each one line naming the bound
    (["simulate", *RTX, "--phases", "1:0"], "has no requests"),
    (["simulate", *RTX, "--request-rate", "1", "--burstiness", "inf"],
     "--burstiness: must be a number in [0.001, 1000], got 'inf'"),
    (["sweep", *RTX, "--burst-rates", "1e9"], "at most 10000, got '1e9'"),
    (["simulate", *RTX, "--prompt-tokens", "1e12"], "must be an integer in [1, 10000000]"),
    (["simulate", *RTX, "--burst-rate", "1e9"], "--burst-rate: must be a number in (0, 10000]"),
    (["simulate", *RTX, "--phases", "1e300:{burst}"], "phase duration must be in (0, 1e+07] s"),
    (["simulate", *RTX, "--phases", "1000000:1000"], "the limit is 1,000,000 per trace"),
    (["simulate", *RTX, "--num-prompts", "1e9", "--request-rate", "1"],
     "--num-prompts: must be an integer in [1, 1000000]"),
    (["simulate", *RTX, "--seed", "-1"], "--seed: must be an integer in [0, 4294967295]"),
    (["simulate", *RTX, "--tp", "0"], "--tp: must be an integer in [1, 1024]"),
    (["sweep", *RTX, "--seeds", "0,99999999999"], "need integers in [0, 4294967295]"),
    (["simulate", "--hardware", "h100-sxm-80gb", "--model", "qwen2.5-7b", "--tp", "8",
      "--configs", "mbt:10000000"], "lower the policy's token budget"),
    (["simulate", "--cluster", "examples/cluster-colocated.toml", "--mixed", "--duration",
      "1e9", "--request-rate", "1"], "--duration: must be a number in (0, 1e+07]"),
    (["simulate", "--cluster", "examples/cluster-colocated.toml", "--instances", "100000000"],
     "--instances: expected comma-separated integers in [1, 4096]"),
    # issue 23: repeated values ran (and counted) twice; absurd policy times
    (["sweep", *RTX, "--burst-rates", "0.4,0.4"], "--burst-rates: 0.4 given twice"),
    (["sweep", *RTX, "--seeds", "0,1,0"], "--seeds: 0 given twice; give each value once"),
    (["simulate", *RTX, "--configs", "dlfp:target_s=1e-300"],
     "dlfp.target_s: must be in [1e-06, 1e+07] s"),
    (["simulate", *RTX, "--configs", "sarathi:tbt_slo=1e-300"],
     "sarathi.tbt_slo: must be in [1e-06, 1e+07] s"),
    (["simulate", *RTX, "--configs", "ppas-auto:ref_prompt=9999999999"],
     "ppas-auto.ref_prompt: must be <= 10000000"),
    # the clients' max_tokens: a cap the policies see, for simulation only
    (["simulate", *RTX, "--trace", "tests/data/traces/azure-2023-code-head.csv",
      "--max-tokens", "lots"], "--max-tokens: must be 'default' (max_model_len less the "
     "prompt) or an integer in [1, "),
    (["simulate", *RTX, "--max-tokens", "64"], "--max-tokens"),
    (["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--trace",
      "tests/data/traces/azure-2023-code-head.csv", "--max-tokens", "64"],
     "--max-tokens is for simulation only"),
]


@pytest.mark.parametrize("args,needle", BAD)
def test_bad_input_one_line_exit_2(args: list[str], needle: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(args, capsys)
    assert rc == 2
    assert out == ""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], err


def test_console_script_no_traceback() -> None:
    p = subprocess.run([sys.executable, "-m", "ppas.cli", "sweep", "--hardware", "nope",
                        "--model", "qwen2.5-3b"], capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stdout == ""


def test_missing_optional_package_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    import ppas.commands.simulate as sim

    def run(args: object) -> int:
        raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")

    monkeypatch.setattr(sim, "run", run)
    rc, out, err = run_cli(["simulate"], capsys)
    assert rc == 2 and out == ""
    assert err.strip() == ("ppas simulate: error: needs the optional package 'matplotlib'; "
                           "install it with: pip install 'ppas[cli]'")


def test_simulate_prefix_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ppas.workload import prefix_group_trace, save_trace

    f = tmp_path / "groups.jsonl"
    save_trace(prefix_group_trace(4.0, 40, 0, 2, 3000, "100-200", 16), f)
    base = ["simulate", "--hardware", "rtx5090", "--model", "qwen2.5-3b", "--trace", str(f),
            "--configs", "mbt:8192,feather", "--json"]
    rc, out, _ = run_cli(base, capsys)
    assert rc == 0 and all(r["prefix_hit_rate"] == 0 for r in json.loads(out))
    rc, out, _ = run_cli([*base, "--enable-prefix-caching"], capsys)
    recs = json.loads(out)
    assert rc == 0 and all(r["prefix_hit_rate"] > 0.8 for r in recs)
