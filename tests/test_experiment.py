"""``ppas experiment`` offline: the file's validation (every key), the shipped files'
dry-runs, and whole experiments against fake servers (``fake_vllm``) in subprocesses:
reports, resume, a SIGKILL mid-experiment, SIGTERM, and a server that dies mid-run; the
report against a golden."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fake_vllm import FakeLauncher

from ppas.cli import main
from ppas.core.errors import PpasError
from ppas.core.metrics import tpot_of
from ppas.core.outputs import json_text
from ppas.core.processes import alive, start_time
from ppas.experiment.plan import _sim_policy, estimate, plan_text
from ppas.experiment.report import build_report, write_report
from ppas.experiment.runfile import RunFile, read_run
from ppas.experiment.runner import Interrupted, Runner
from ppas.experiment.spec import Experiment, load_experiment, parse_experiment
from ppas.live.versions import FALLBACK_LINE, installed_vllm_version, simulated_line
from ppas.policies import make_policy
from ppas.workload import Trace

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
GOLDEN = TESTS / "data" / "experiment_report"

BASE = """\
name = "t"
out_dir = "{out}"
[model]
path = "{model}"
[engine]
max_num_seqs = 16
[workload]
phases = "0.5:8,0.5:{{burst}}"
burst_rates = [4.0, 12.0]
prompt_tokens = 200
output_tokens = 3
seeds = [0, 1]
warmup_requests = 1
request_timeout_s = 30
[[arms]]
name = "small"
policy = "mbt:64"
baseline = true
[[arms]]
name = "large"
policy = "mbt:512"
baseline = true
[[arms]]
name = "pred"
policy = "predictive:c_min=64,c_max=512"
cost_model = "fitted:auto"
[[arms]]
name = "stock"
[arms.stock]
max_num_batched_tokens = 512
long_prefill_token_threshold = 64
"""


def _text(tmp_path: Path, model: Path, **repl: str) -> str:
    text = BASE.format(out=tmp_path / "out", model=model)
    for old, new in repl.items():
        assert old in text or old.startswith("+"), old
        text = text + new if old.startswith("+") else text.replace(old, new, 1)
    return text


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "exp.toml"
    p.write_text(text)
    return p


# ---------------------------------------------------------------- validation

BAD: list[tuple[dict[str, str], str]] = [
    ({"name = \"t\"": "name = \"t\"\ncolour = 3"}, "colour: unknown key; allowed: name"),
    ({"name = \"t\"": "name = 4"}, "name: must be a string, got 4"),
    ({"name = \"t\"": "name = \"\""}, "name: must be a non-empty string"),
    ({"name = \"t\"": "name = \"t\"\ndescription = 5"}, "description: must be"),
    ({"out_dir = ": "out_dir = 3 #"}, "out_dir: must be a string, got 3"),
    ({"out_dir = ": "out_dir = \"\" #"}, "out_dir: must be a non-empty string"),
    ({"[model]\npath": "[model]\nsize = 1\npath"}, "model.size: unknown key; allowed: path, "
     "vocab_size"),
    ({"[model]\npath": "[model]\n#path"}, "model.path: required"),
    ({"[model]\npath": "model = 3\n#"}, "model: must be a table with keys path, vocab_size"),
    ({"path = \"": "path = \"./nowhere/at/all\" #"}, "model.path: no model folder"),
    ({"path = \"": "vocab_size = 999999\npath = \""}, "model.vocab_size: must be <= the "
     "model's vocab_size 5000"),
    ({"path = \"": "vocab_size = 1\npath = \""}, "model.vocab_size: must be >= 2, got 1"),
    ({"max_num_seqs = 16": "max_num_seqs = 16\nflavour = 1"}, "engine.flavour: unknown key; "
     "allowed: dtype, max_model_len"),
    ({"max_num_seqs = 16": "max_num_seqs = 16\ndtype = \"float8\""},
     "engine.dtype: must be one of auto, float32, float16, bfloat16"),
    ({"max_num_seqs = 16": "max_num_seqs = 16\nmax_model_len = 100"},
     "prompt + output tokens (203) exceed engine.max_model_len (100)"),
    ({"max_num_seqs = 16": "max_num_seqs = 0"}, "engine.max_num_seqs: must be >= 1, got 0"),
    ({"max_num_seqs = 16": "max_num_seqs = 128"}, "max_num_batched_tokens 64 < "
     "engine.max_num_seqs 128"),
    ({"max_num_seqs = 16": "max_num_seqs = 16\ntensor_parallel_size = 0"},
     "engine.tensor_parallel_size: must be >= 1, got 0"),
    ({"max_num_seqs = 16": "max_num_seqs = 16\ngpu_memory_utilization = 1.5"},
     "engine.gpu_memory_utilization: must be in (0, 1]"),
    ({"max_num_seqs = 16": "max_num_seqs = 16\nenable_prefix_caching = \"yes\""},
     "engine.enable_prefix_caching: must be true or false"),
    ({"max_num_seqs = 16": "max_num_seqs = 16\nenforce_eager = 1"},
     "engine.enforce_eager: must be true or false"),
    ({"max_num_seqs = 16": "max_num_seqs = 16\nstartup_timeout_s = -1"},
     "engine.startup_timeout_s: must be > 0, got -1.0"),
    ({"max_num_seqs = 16": "max_num_seqs = 16\nextra_args = \"--x\""},
     "engine.extra_args: must be a list of strings"),
    ({"max_num_seqs = 16": "max_num_seqs = 16\nenv = { \"1A\" = \"x\" }"},
     "engine.env: must be a table NAME"),
    ({"phases = ": "tempo = 1\nphases = "}, "workload.tempo: unknown key; allowed: kind"),
    ({"phases = ": "kind = \"poisson\"\nphases = "}, "workload.kind: must be one of phases, "
     "gamma, trace"),
    ({"phases = \"0.5:8,0.5:{burst}\"": "phases = \"0.5:8\""}, "workload.phases: required: "
     "DURATION_S:RATE"),
    ({"phases = \"0.5:8,0.5:{burst}\"": "phases = \"0.5:x,0.5:{burst}\""},
     "workload.phases: malformed phase"),
    ({"burst_rates = [4.0, 12.0]": "burst_rates = [4.0, -1]"}, "workload.burst_rates: must be "
     "distinct finite numbers > 0"),
    ({"burst_rates = [4.0, 12.0]": "burst_rates = []"}, "workload.burst_rates: must be a "
     "non-empty list"),
    ({"burst_rates = [4.0, 12.0]": "burst_rates = [4.0]\nrequest_rates = [1.0]"},
     "workload.request_rates: applies to kind = \"gamma\" only"),
    ({"phases = ": "burstiness = 2\nphases = "}, "workload.burstiness: applies to kind = "
     "\"gamma\""),
    ({"phases = ": "num_prompts = 2\nphases = "}, "workload.num_prompts: applies to kind = "
     "\"gamma\""),
    ({"phases = ": "file = \"x.csv\"\nphases = "}, "workload.file: applies to kind = "
     "\"trace\""),
    ({"prompt_tokens = 200": "prompt_tokens = 0"}, "workload.prompt_tokens: must be >= 1, "
     "got 0"),
    ({"output_tokens = 3": "output_tokens = 1.5"}, "workload.output_tokens: must be an integer"),
    ({"prompt_tokens = 200": "prompt_tokens = 5000"}, "exceed the model's "
     "max_position_embeddings (4096)"),
    ({"seeds = [0, 1]": "seeds = [0, 0]"}, "workload.seeds: must be distinct integers >= 0"),
    ({"seeds = [0, 1]": "seeds = 3"}, "workload.seeds: must be a list of integers, got 3"),
    ({"seeds = [0, 1]": "seeds = [0, true]"}, "workload.seeds[1]: must be an integer, got True"),
    ({"warmup_requests = 1": "warmup_requests = -1"}, "workload.warmup_requests: must be >= 0, "
     "got -1"),
    ({"request_timeout_s = 30": "request_timeout_s = 0"}, "workload.request_timeout_s: must "
     "be > 0, got 0.0"),
    ({"phases = \"0.5:8,0.5:{burst}\"\nburst_rates = [4.0, 12.0]":
      "phases = \"0.5:{burst}\"\nburst_rates = [0.001]"}, "gives no requests"),
    ({"policy = \"mbt:64\"": "policy = \"mbt:64\"\ncolour = 1"}, "arms[0].colour: unknown "
     "key; allowed: name, policy, stock"),
    ({"name = \"small\"": "name = \"a b\""}, "arms[0].name: must be letters, digits"),
    ({"name = \"large\"": "name = \"small\""}, "arm name 'small' is used twice"),
    ({"policy = \"mbt:64\"": "policy = \"nosuch:1\""}, "arms[0].policy: unknown policy "
     "'nosuch'; allowed:"),
    ({"policy = \"mbt:64\"": "policy = \"mbt:64\"\n[arms.stock]\nmax_num_batched_tokens = 8"},
     "arms[0]: give exactly one of policy"),
    ({"cost_model = \"fitted:auto\"": "cost_model = \"magic\""}, "arms[2].cost_model: must be "
     "fitted:auto, fitted:FILE or roofline"),
    ({"cost_model = \"fitted:auto\"": "cost_model = \"fitted:/no/such.json\""},
     "arms[2].cost_model: no file"),
    ({"policy = \"mbt:64\"": "policy = \"mbt:64\"\nmax_num_batched_tokens = 0"},
     "arms[0].max_num_batched_tokens: must be >= 1, got 0"),
    ({"baseline = true": "baseline = 1"}, "arms[0].baseline: must be true or false"),
    ({"long_prefill_token_threshold = 64": "long_prefill_token_threshold = 64\nchunk = 3"},
     "arms[3].stock.chunk: unknown key; allowed: max_num_batched_tokens, "
     "long_prefill_token_threshold"),
    ({"max_num_batched_tokens = 512\nlong": "long"}, "arms[3].stock.max_num_batched_tokens: "
     "required"),
    ({"long_prefill_token_threshold = 64": "long_prefill_token_threshold = 0"},
     "arms[3].stock.long_prefill_token_threshold: must be an integer >= 1"),
    ({"[arms.stock]": "cost_model = \"fitted:auto\"\n[arms.stock]"}, "arms[3].cost_model: "
     "applies to plugin arms"),
    ({"+": "\n[run]\nspeed = 1\n"}, "run.speed: unknown key; allowed: devices"),
    ({"+": "\n[run]\ndevices = [\"0\", \"0\"]\n"}, "run.devices: must be a list of distinct"),
    ({"+": "\n[run]\nserver_startup_s = -3\n"}, "run.server_startup_s: must be >= 0, got -3.0"),
    ({"+": "\n[run]\nserver_startup_s = true\n"}, "run.server_startup_s: must be a number"),
    ({"+": "\n[run]\nestimate_cost_model = \"roofline\"\n"}, "roofline needs run.hardware"),
    ({"+": "\n[run]\nestimate_cost_model = \"fitted:/no\"\n"}, "run.estimate_cost_model: "
     "must be roofline or fitted:FILE"),
    ({"+": "\n[run]\nhardware = \"tpu\"\n"}, "run.hardware: must be one of rtx5090"),
    ({"+": "\n[run]\ncatalog_model = \"gpt9\"\n"}, "run.catalog_model: must be one of"),
    ({"+": "\n[run]\nrounds = 0\n"}, "run.rounds: must be >= 1, got 0"),
    ({"+": "\n[run]\nrounds = 3\n"}, "run.rounds: must be at most the number of seeds (2)"),
    ({"+": "\n[run]\nrounds = 2\n"}, "run.rounds: must be 1 with a cost_model = "
     "'fitted:auto' arm"),
    ({"+": "\n[run]\nrounds = 2\ndevices = [\"0\"]\n"}, "run.rounds: must be 1 with devices"),
    ({"+": "\n[report]\nlevel = 1.5\n"}, "report.level: must be in (0, 1)"),
    ({"+": "\n[report]\nlevel = 1\n"}, "report.level: must be in (0, 1), got 1.0"),
    ({"+": "\n[report]\nn_boot = 5\n"}, "report.n_boot: must be >= 100, got 5"),
    ({"+": "\n[report]\nn_boot = 100.0\n"}, "report.n_boot: must be an integer, got 100.0"),
    ({"+": "\n[report]\nbootstrap_seed = -1\n"}, "report.bootstrap_seed: must be >= 0, got -1"),
    ({"+": "\n[report]\nstyle = 1\n"}, "report.style: unknown key; allowed: level"),
    ({"+": "\n[report]\nslo = \"ttft=2\"\n"}, "report.slo: bad SLO value 'ttft=2'"),
    ({"+": "\n[report]\nslo = \"speed=2s\"\n"}, "report.slo: bad SLO 'speed=2s'"),
    ({"+": "\n[report]\nslo = 3\n"}, "report.slo: must be a string"),
    ({"+": "\n[report]\nslo = \"ttft=5x\"\n"}, "report.slo: relative SLOs (ttft=5x) need a "
     "cost model for each request's solo latency: set run.estimate_cost_model"),
    ({"+": "\n[[arms]]\nname = \"x\"\npolicy = \"mbt:64\"\nstock = 3\n"},
     "arms[4]: give exactly one of policy"),
    ({"name = \"t\"": "name = \"t\" \"\""}, "not valid TOML"),
    # issue 23: every number bounded (ppas.core.limits), the server on 127.0.0.1 and the
    # results in their folder
    ({"max_num_seqs = 16": "max_num_seqs = 16\ntensor_parallel_size = 100000000"},
     "engine.tensor_parallel_size: must be <= 1024, got 100000000"),
    ({"max_num_seqs = 16": "max_num_seqs = 1000000000000"},
     "engine.max_num_seqs: must be <= 1048576"),
    ({"max_num_seqs = 16": "max_num_seqs = 16\nstartup_timeout_s = 1e300"},
     "engine.startup_timeout_s: must be <= 1000000"),
    ({"max_num_seqs = 16": "max_num_seqs = 16\nmax_model_len = 100000000000"},
     "engine.max_model_len: must be <= 11000000"),
    ({"path = \"": "vocab_size = 100000000000000\npath = \""},
     "model.vocab_size: must be <= 10000000"),
    ({"max_num_batched_tokens = 512": "max_num_batched_tokens = 1000000000000000000"},
     "arms[3].stock.max_num_batched_tokens: must be <= 10000000"),
    ({"policy = \"mbt:64\"": "policy = \"mbt:64\"\nmax_num_batched_tokens = 100000000000"},
     "arms[0].max_num_batched_tokens: must be <= 10000000"),
    ({"+": "\n[report]\nlevel = 1e-300\n"}, "report.level: must be in [0.5, 0.9999]"),
    ({"+": "\n[report]\nn_boot = 1000000000000\n"}, "report.n_boot: must be <= 100000"),
    ({"+": "\n[report]\nbootstrap_seed = 100000000000\n"}, "report.bootstrap_seed: must be <="),
    ({"+": "\n[run]\nserver_startup_s = 1e300\n"}, "run.server_startup_s: must be <="),
    ({"warmup_requests = 1": "warmup_requests = 1000000000"},
     "workload.warmup_requests: must be <= 1000, got 1000000000"),
    ({"request_timeout_s = 30": "request_timeout_s = 1e300"},
     "workload.request_timeout_s: must be <= 1000000"),
    ({"prompt_tokens = 200": "prompt_tokens = 100000000"},
     "workload.prompt_tokens: must be <= 10000000"),
    ({"output_tokens = 3": "output_tokens = 100000000"},
     "workload.output_tokens: must be <= 1000000"),
    ({"burst_rates = [4.0, 12.0]": "burst_rates = [4.0, 1e9]"},
     "workload.burst_rates: must be at most 1000 numbers <= 10000"),
    ({"seeds = [0, 1]": "seeds = [0, 100000000000]"},
     "workload.seeds: must be at most 1000 integers <= 4294967295"),
    ({"max_num_seqs = 16": "max_num_seqs = 16\nextra_args = [\"--host\", \"0.0.0.0\"]"},
     "engine.extra_args: may not set --host, --port, --uds (the server listens on 127.0.0.1"),
    ({"max_num_seqs = 16": "max_num_seqs = 16\nextra_args = [\"--port=80\"]"},
     "engine.extra_args: may not set --host, --port, --uds"),
    ({"name = \"t\"": "name = \"../../x\""}, "name: must be a name without /"),
    ({"name = \"t\"": "name = \"..\""}, "not . or .., got '..'"),
]


@pytest.mark.parametrize(("repl", "message"), BAD, ids=[m for _, m in BAD])
def test_every_key_is_validated(tmp_path: Path, model: Path, repl: dict[str, str],
                                message: str) -> None:
    with pytest.raises(PpasError) as e:
        parse_experiment(_text(tmp_path, model, **repl), "t")
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_cli_bad_file_is_one_line_exit_2(tmp_path: Path, model: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    p = _write(tmp_path, _text(tmp_path, model, **{"max_num_seqs = 16": "max_num_seqs = -2"}))
    assert main(["experiment", str(p), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "engine.max_num_seqs: must be >= 1, got -2" in err
    assert not (tmp_path / "out").exists()  # nothing written
    assert main(["experiment", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read experiment file" in capsys.readouterr().err


def test_other_workload_kinds_and_plan(tmp_path: Path, model: Path) -> None:
    gamma = _text(tmp_path, model, **{
        "phases = \"0.5:8,0.5:{burst}\"\nburst_rates = [4.0, 12.0]":
        "kind = \"gamma\"\nrequest_rates = [2.0, 8.0]\nburstiness = 0.5\nnum_prompts = 6"})
    exp = parse_experiment(gamma, "g")
    assert exp.workload.kind == "gamma" and len(exp.workload.trace(2.0, 1)) == 6
    per_rate = parse_experiment(gamma.replace("num_prompts = 6", "num_prompts = [3, 9]"), "g")
    assert [len(per_rate.workload.trace(r, 0)) for r in (2.0, 8.0)] == [3, 9]
    for bad in ("[3]", "[3, 0]", "[3, 9, 4]", "2.5", "[true, 1]"):
        with pytest.raises(PpasError, match=r"^workload.num_prompts: must be an integer >= 1 "
                           r"or a list of 2 of them \(one per request rate\)"):
            parse_experiment(gamma.replace("num_prompts = 6", f"num_prompts = {bad}"), "g")
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": t, "prompt_tokens": 100,
                                         "output_tokens": 2}) + "\n" for t in (0, 0.1, 0.4)))
    text = _text(tmp_path, model, **{
        "phases = \"0.5:8,0.5:{burst}\"\nburst_rates = [4.0, 12.0]\nprompt_tokens = 200\n"
        "output_tokens = 3": f"kind = \"trace\"\nfile = \"{trace}\""})
    exp = parse_experiment(text, "tr")
    assert exp.workload.loads == (0.0,) and len(exp.workload.trace(0.0, 0)) == 3
    assert exp.num_runs() == 4 * 2
    plan = plan_text(exp, estimate(exp), set())
    assert "8 runs (0 already complete, 8 to run), 4 server start(s)" in plan
    # calibration arms first, fitted:auto after, whatever the file order
    assert [a.name for a in exp.arm_order()] == ["small", "large", "stock", "pred"]


@pytest.mark.parametrize("name", ["paper-rtx5090-qwen2.5-3b", "a100-qwen2.5-3b",
                                  "h100-qwen2.5-3b"])
def test_gpu_files_pass_dry_run(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", str(ROOT / "experiments" / f"{name}.toml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    runs = 210 if name.startswith("paper") else 180
    assert f"{runs} runs (0 already complete, {runs} to run)" in out
    assert "estimated time" in out and "cost model roofline" in out


def test_demo_file_is_valid(tmp_path: Path, model: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # its paths are relative to the repository root
    text = (ROOT / "experiments" / "demo-cpu.toml").read_text()
    local = text.splitlines()
    path_line = next(ln for ln in local if ln.startswith("path = "))
    big = tmp_path / "m2"
    big.mkdir()
    (big / "config.json").write_text(json.dumps({"vocab_size": 5000,
                                                 "max_position_embeddings": 8192}))
    exp = parse_experiment(text.replace(path_line, f"path = \"{big}\""), "demo-cpu")
    kinds = {a.name: (a.plugin, a.cost_model) for a in exp.arms}
    # the baselines are what stock vLLM can run: the two fixed budgets and the stock arm
    assert {a.name for a in exp.arms if a.baseline} == {
        a.name for a in exp.arms if not a.plugin or (a.policy or "").startswith("mbt:")}
    assert sum(1 for a in exp.arms if (a.policy or "").startswith("mbt:")) == 2
    assert any(not p for p, _ in kinds.values())  # a stock vLLM arm
    assert sum(1 for _, c in kinds.values() if c == "fitted:auto") == 3  # ppas-auto, 2 predictive


# ---------------------------------------------------------------- running (fake servers)


def _run_cli(args: list[str]) -> subprocess.Popen[str]:
    """``ppas experiment`` in a subprocess with fake servers (stderr to a pipe)."""
    code = (f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"
            "from fake_vllm import FakeLauncher\n"
            "import ppas.experiment.runner as r\n"
            "r.vllm_launcher = FakeLauncher\n"
            f"from ppas.cli import main\nsys.exit(main({args!r}))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen([sys.executable, "-c", code], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _runs(out: Path) -> dict[str, dict[str, Any]]:
    return {str(p.relative_to(out)): json.loads(p.read_text())
            for p in sorted((out / "runs").rglob("*.json"))}


def test_full_experiment_and_report(tmp_path: Path, model: Path) -> None:
    exp = load_experiment(_write(tmp_path, _text(tmp_path, model)))
    FakeLauncher.started = []
    runner = Runner(exp, FakeLauncher)
    runner.folder.prepare(resume=False)
    runner.run(estimate(exp))
    out = tmp_path / "out"
    runs = _runs(out)
    assert len(runs) == 16
    assert [la.arm.name for la in FakeLauncher.started] == ["small", "large", "stock", "pred"]
    pred = FakeLauncher.started[-1]
    assert pred.cost_model == f"fitted:{(out / 'cost-auto.json').resolve()}"
    stock = FakeLauncher.started[2]
    assert stock.policy is None and stock.step_log is None
    assert "--long-prefill-token-threshold" in stock.extra_args
    by_cell: dict[tuple[float, int], list[Any]] = {}
    for r in runs.values():
        assert r["summary"]["failed"] == 0 and not r["retried"]
        by_cell.setdefault((r["load"], r["seed"]), []).append(r)
        assert (r["steps"] != []) == (r["policy"] is not None)
    for p in (out / "runs").rglob("*.json"):  # the typed record is the file, byte for byte
        assert json_text(read_run(p).to_json()) == p.read_text()
    for cell in by_cell.values():  # same arrivals and prompts for every arm
        assert len({json.dumps(r["per_request"]["arrival_s"]) for r in cell}) == 1
        assert len({r["prompt_seed"] for r in cell}) == 1
    for arm in ("small", "pred"):  # a fresh prompt seed per run on one server
        seeds = [r["prompt_seed"] for r in runs.values() if r["arm"] == arm]
        assert len(set(seeds)) == len(seeds) == 4
    text, rep = write_report(exp)
    for f in ("report.txt", "report.json", "report.png"):
        assert (out / f).stat().st_size > 0
    assert "winner per burst" in text and "small / large" in text
    # the stock arm is predicted as stock vLLM's own knobs, for the vLLM the runs used
    line = simulated_line(installed_vllm_version())
    assert {r["vllm_version"] for r in runs.values()} == {installed_vllm_version()}
    stock_as = f"vllm:mbt=512,long_prefill_token_threshold=64,version={line}"
    assert f"stock (simulated as {stock_as}):" in text and "no prediction" not in text
    cells = {(c["arm"], c["load"]): c for c in rep["cells"]}
    assert len(cells) == 8 and cells[("small", 4.0)]["avg_latency"]["n"] == 2
    assert cells[("small", 4.0)]["sim_avg_latency"] > 0
    assert all(cells[("stock", b)]["sim_avg_latency"] > 0 for b in (4.0, 12.0))
    arms_vs = {b: {i["arm"] for i in rep["improvements"] if i["baseline"] == b}
               for b in ("small", "large")}
    assert arms_vs == {"small": {"large", "pred", "stock"}, "large": {"pred", "stock"}}
    # the oracle: each non-baseline arm against the baseline with the lowest geometric-mean
    # E2E at that load (recomputed here from the runs), per load and over all traces
    def gm(arm: str, load: float) -> float:
        xs = [r["summary"]["avg_latency"] for r in rep["runs"]
              if r["arm"] == arm and r["load"] == load]
        return math.exp(sum(map(math.log, xs)) / len(xs))
    rows = {(o["arm"], o["load"]): o for o in rep["oracle"]}
    assert set(rows) == {(a, ld) for a in ("pred", "stock") for ld in (4.0, 12.0, None)}
    for (arm, load), o in rows.items():
        if load is None:
            assert o["baseline"] == "best per load" and o["ratio"]["n"] == 4
            continue
        assert o["baseline"] == min(("small", "large"), key=lambda b: gm(b, load))
        want = gm(arm, load) / gm(o["baseline"], load)  # paired over the same seeds
        assert o["ratio"]["estimate"] == pytest.approx(want, rel=1e-9)
        assert o["verdict"] in ("lower", "higher", "within noise")
    assert "against the best baseline arm of each burst (oracle" in text
    assert json.loads((out / "report.json").read_text())["num_runs"] == 16


def test_run_file_reads_old_folders_and_refuses_other_files(tmp_path: Path,
                                                            model: Path) -> None:
    """A run file from before runs recorded ``vllm_version`` (17 keys) still loads; a file
    that is no run file is one line naming it."""
    exp = parse_experiment(_text(tmp_path, model), "t")
    new = _run_file(exp, "small", 4.0, 0)
    keys = ["arm", "load", "load_label", "seed", "prompt_seed", "trace", "policy", "stock",
            "vllm_version", "cost_model", "max_num_batched_tokens", "attempts", "retried",
            "wall_s", "finished_at", "summary", "per_request", "steps"]  # the file's order
    assert list(RunFile.from_json(new).to_json()) == keys
    assert RunFile.from_json(new).to_json() == new
    old = {k: v for k, v in new.items() if k != "vllm_version"}
    p = tmp_path / "old.json"
    p.write_text(json.dumps(old, indent=1) + "\n")
    run = read_run(p)
    assert run.vllm_version is None and run.steps and not run.retried
    assert run.to_json() == new | {"vllm_version": None}
    for bad in ("{\"arm\": \"small\"}", "[1, 2]", "{", "", json.dumps(new | {"seed": "0"})):
        p.write_text(bad)
        with pytest.raises(PpasError, match=r"old.json: not a ppas experiment run file") as e:
            read_run(p)
        assert "\n" not in str(e.value)


def test_stock_arms_are_simulated_as_stock_vllm(tmp_path: Path, model: Path) -> None:
    """Issue 8: a stock arm runs in the simulator as the ``vllm:`` policy (its modelled
    knobs, the release line of the vLLM its runs used); knobs it does not model are named."""
    exp = parse_experiment(_text(tmp_path, model), "t")
    stock = exp.arm("stock")
    assert stock.sim_policy("0.33.0+cpu") == (
        "vllm:mbt=512,long_prefill_token_threshold=64,version=0.33", "")
    for unknown in (None, "0.40.1", "dev"):  # not known, or not a supported line
        assert stock.sim_policy(unknown)[0] == (
            f"vllm:mbt=512,long_prefill_token_threshold=64,version={FALLBACK_LINE}")
    assert simulated_line("0.32.0") == "0.32" and FALLBACK_LINE == "0.32"
    # vLLM removed the partial-prefill knobs before 0.32: a stock arm cannot set them (issue
    # 19), and every knob it can set is modelled
    with pytest.raises(PpasError, match=r"arms\[3\]\.stock\.max_num_partial_prefills: "
                                        "unknown key"):
        parse_experiment(_text(tmp_path, model, **{
            "long_prefill_token_threshold = 64": "long_prefill_token_threshold = 64\n"
            "max_num_partial_prefills = 2"}), "t")
    # the plan's estimate runs the threshold too (it differs from MBT alone under load)
    assert _sim_policy(stock, "0.32.0") == stock.sim_policy("0.32.0")[0]
    from ppas.cost.fitted import FittedCostModel
    from ppas.engine.simulator import EngineConfig, simulate

    cm = FittedCostModel(0.002, 2e-5)
    first = exp.workload.trace(12.0, 0).requests[0]
    trace = [type(first)(0.0, 2000, 3) for _ in range(8)]  # a burst: the threshold binds
    eng = EngineConfig(max_num_seqs=16, max_num_batched_tokens=512)
    got = {spec: simulate(trace, make_policy(spec), cm, eng).summary()["avg_latency"]
           for spec in ("mbt:512", _sim_policy(stock, "0.32.0"))}
    assert len(set(got.values())) == 2, got


def test_sigkill_then_resume_loses_and_duplicates_nothing(tmp_path: Path, model: Path) -> None:
    p = _write(tmp_path, _text(tmp_path, model))
    out = tmp_path / "out"
    proc = _run_cli(["experiment", str(p)])
    deadline = time.monotonic() + 240  # (generous: the loop ends as soon as 5 runs are in)
    while time.monotonic() < deadline and len(list(out.glob("runs/*/*.json"))) < 5:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    # the server of the arm in flight (recorded in its pid file) died with the experiment
    (pid_file,) = (out / "logs").glob("*.pid")
    server = json.loads(pid_file.read_text())
    assert server["owner"] == proc.pid
    deadline = time.monotonic() + 30  # (generous: the loop ends as soon as it is gone)
    while time.monotonic() < deadline and alive(server["pid"]):
        time.sleep(0.05)
    assert not alive(server["pid"]), "the server outlived its SIGKILLed experiment"
    before = _runs(out)
    assert 5 <= len(before) < 16
    # without --resume the folder is refused, nothing touched
    assert main(["experiment", str(p)]) == 2
    exp = load_experiment(p)
    runner = Runner(exp, FakeLauncher)
    runner.folder.prepare(resume=True)
    FakeLauncher.started = []
    runner.run(estimate(exp))
    assert not list(out.glob("logs/*.pid"))  # the dead run's record is cleared
    after = _runs(out)
    assert len(after) == 16
    for k, v in before.items():
        assert after[k] == v  # completed runs kept as they were, not rerun
    assert not list(out.rglob("*.tmp"))
    # every arm restarted only if it had runs left; fitted:auto refit from the same runs
    assert "pred" in [la.arm.name for la in FakeLauncher.started]


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            start_new_session=True)


def test_resume_stops_a_server_a_dead_run_left(tmp_path: Path, model: Path) -> None:
    """A server whose experiment died (off Linux, or one that ignored SIGTERM) would hold
    the device and port: the next run into the folder stops it first, and only it."""
    exp = load_experiment(_write(tmp_path, _text(tmp_path, model)))
    logs = tmp_path / "out" / "logs"
    logs.mkdir(parents=True)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a dead owner
    stale, reused, busy, owner = _sleeper(), _sleeper(), _sleeper(), _sleeper()
    try:
        def record(name: str, srv: subprocess.Popen[bytes], start_shift: int,
                   own: int) -> Path:
            f, start = logs / f"{name}.pid", start_time(srv.pid)
            assert start is not None
            f.write_text(json.dumps({"pid": srv.pid, "start": start + start_shift,
                                     "owner": own, "owner_start": start_time(own)}))
            return f

        record("small", stale, 0, gone.pid)
        record("large", reused, 1, gone.pid)  # same pid, another process: not ours
        runner = Runner(exp, FakeLauncher)
        runner.folder.prepare(resume=False)
        assert stale.wait(timeout=20) == -signal.SIGTERM
        assert reused.poll() is None
        assert not list(logs.glob("*.pid"))
        f = record("stock", busy, 0, owner.pid)  # its experiment still runs: refuse
        with pytest.raises(PpasError, match="which is still running"):
            Runner(exp, FakeLauncher).folder.prepare(resume=True)
        assert busy.poll() is None and f.exists()
    finally:
        for p in (stale, reused, busy, owner):
            p.kill()
            p.wait()


def test_sigterm_stops_cleanly_and_resume_refuses_a_changed_file(tmp_path: Path,
                                                                 model: Path) -> None:
    p = _write(tmp_path, _text(tmp_path, model))
    out = tmp_path / "out"
    proc = _run_cli(["experiment", str(p)])
    deadline = time.monotonic() + 240  # (generous: the loop ends as soon as 2 runs are in)
    while time.monotonic() < deadline and len(list(out.glob("runs/*/*.json"))) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "rerun with --resume" in err
    n = len(_runs(out))
    assert 2 <= n < 16 and not list(out.rglob("*.tmp"))
    original = p.read_text()
    p.write_text(original.replace("output_tokens = 3", "output_tokens = 4"))
    with pytest.raises(PpasError, match="--resume: the experiment's workload changed"):
        Runner(load_experiment(p), FakeLauncher).folder.prepare(resume=True)
    # which arms are baselines only shapes the report: changing it is not a changed run
    assert "baseline = true" in original
    p.write_text(original.replace("baseline = true", "baseline = false", 1))
    Runner(load_experiment(p), FakeLauncher).folder.prepare(resume=True)
    p.write_text(original.replace("output_tokens = 3", "output_tokens = 4"))
    assert main(["experiment", str(p), "--report"]) == 2  # nor a report mixing settings
    assert not (out / "report.txt").exists()


def test_dead_server_is_restarted_and_the_run_retried(tmp_path: Path, model: Path) -> None:
    marker = tmp_path / "died"
    text = _text(tmp_path, model, **{
        "max_num_seqs = 16": f"max_num_seqs = 16\nenv = {{ FAKE_DIE_AFTER = \"3\", "
        f"FAKE_DIE_MARKER = \"{marker}\" }}",
        "seeds = [0, 1]": "seeds = [0]", "burst_rates = [4.0, 12.0]": "burst_rates = [12.0]"})
    text = text[:text.index("[[arms]]\nname = \"large\"")]  # one arm
    exp = load_experiment(_write(tmp_path, text))
    FakeLauncher.started = []
    runner = Runner(exp, FakeLauncher)
    runner.folder.prepare(resume=False)
    runner.run(estimate(exp))
    assert marker.exists()  # the first server died after 3 requests
    (run,) = _runs(tmp_path / "out").values()
    assert run["retried"] and len(run["attempts"]) == 2
    assert run["attempts"][0]["server_died"] and not run["attempts"][1]["server_died"]
    assert run["summary"]["failed"] == 0
    assert len(FakeLauncher.started) == 2
    assert "retried after a server death" in write_report(exp)[0]


def test_stop_between_runs_keeps_completed(tmp_path: Path, model: Path) -> None:
    exp = load_experiment(_write(tmp_path, _text(tmp_path, model)))
    runner = Runner(exp, FakeLauncher)
    runner.folder.prepare(resume=False)
    est = estimate(exp)
    calls = []
    orig = runner.measure

    def measure(*a: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            runner.stop.set()
        return orig(*a)

    runner.measure = measure  # type: ignore[method-assign]
    with pytest.raises(Interrupted):
        runner.run(est)
    assert len(runner.folder.completed()) == 2  # the run in flight when stopped is not kept


def test_arms_in_parallel_one_per_device(tmp_path: Path, model: Path) -> None:
    text = _text(tmp_path, model, **{"+": "\n[run]\ndevices = [\"3\", \"5\"]\n",
                                     "seeds = [0, 1]": "seeds = [0]"})
    exp = load_experiment(_write(tmp_path, text))
    FakeLauncher.started = []
    runner = Runner(exp, FakeLauncher)
    runner.folder.prepare(resume=False)
    runner.run(estimate(exp))
    assert len(runner.folder.completed()) == 8
    devices = {la.arm.name: la.env["CUDA_VISIBLE_DEVICES"] for la in FakeLauncher.started}
    assert set(devices.values()) <= {"3", "5"} and len(devices) == 4
    # the fitted:auto arm starts after both calibration arms are done
    cal_done = max((tmp_path / "out" / "runs" / a).stat().st_mtime for a in ("small", "large"))
    pred_files = sorted((tmp_path / "out" / "runs" / "pred").glob("*.json"))
    assert min(p.stat().st_mtime for p in pred_files) >= cal_done
    assert (tmp_path / "out" / "cost-auto.json").is_file()


PRED = """[[arms]]
name = "pred"
policy = "predictive:c_min=64,c_max=512"
cost_model = "fitted:auto"
"""


def test_rounds_run_the_arms_in_abba_order(tmp_path: Path, model: Path) -> None:
    """``run.rounds = 2``: seeds 0 then 1, the arms forward then backward, a server start
    per arm and round; every run once."""
    text = _text(tmp_path, model, **{PRED: "", "+": "\n[run]\nrounds = 2\n"})
    exp = load_experiment(_write(tmp_path, text))
    assert [([a.name for a in order], cells) for order, cells in exp.rounds()] == [
        (["small", "large", "stock"], [(4.0, 0), (12.0, 0)]),
        (["stock", "large", "small"], [(4.0, 1), (12.0, 1)])]
    est = estimate(exp)
    assert est.pending_servers(exp, set()) == 6
    assert "2 rounds, arms in ABBA order" in plan_text(exp, est, set())
    FakeLauncher.started = []
    runner = Runner(exp, FakeLauncher)
    runner.folder.prepare(resume=False)
    runner.run(est)
    assert [la.arm.name for la in FakeLauncher.started] == [
        "small", "large", "stock", "stock", "large", "small"]
    assert len(runner.folder.completed()) == 12
    # One round: the file's order on every cell (as before rounds existed).
    one = load_experiment(_write(tmp_path, _text(tmp_path, model, **{PRED: ""})))
    assert [([a.name for a in o], c) for o, c in one.rounds()] == [
        (["small", "large", "stock"], one.cells())]


def test_vllm_launcher_command(tmp_path: Path, model: Path) -> None:
    """The real launcher's command line: plugin arm with a fitted cost model, stock arm."""
    from ppas.experiment.servers import vllm_launcher
    from ppas.live.server import VllmServer

    text = _text(tmp_path, model, **{"max_num_seqs = 16": "max_num_seqs = 16\n"
                                     "dtype = \"bfloat16\"\nmax_model_len = 4096"})
    exp = parse_experiment(text, "t")
    runner = Runner(exp)
    plugin = runner.launch_for(exp.arm("small"), "2")
    srv = vllm_launcher(plugin)
    assert isinstance(srv, VllmServer)
    cmd = srv.command()
    extra = json.loads(cmd[cmd.index("--additional-config") + 1])
    assert extra["ppas"]["policy"] == "mbt:64"
    assert extra["ppas"]["step_log"].endswith("steps/small.jsonl")
    assert cmd[cmd.index("--max-num-batched-tokens") + 1] == "64"
    # the file's engine flags come after ppas.live.server's CPU defaults: vLLM takes the last
    assert cmd[len(cmd) - 1 - cmd[::-1].index("--dtype") + 1] == "bfloat16"
    assert "--max-model-len" in cmd and plugin.env["CUDA_VISIBLE_DEVICES"] == "2"
    stock = vllm_launcher(runner.launch_for(exp.arm("stock"), None)).command()
    assert "--scheduler-cls" not in stock
    assert stock[stock.index("--long-prefill-token-threshold") + 1] == "64"
    srv2 = VllmServer(model, policy="predictive", max_num_batched_tokens=16384,
                      cost_model="fitted:c.json")
    cmd2 = srv2.command()
    assert json.loads(cmd2[cmd2.index("--additional-config") + 1])["ppas"]["cost_model"] == \
        "fitted:c.json"
    with pytest.raises(PpasError, match="cost_model needs the plugin"):
        VllmServer(model, policy=None, max_num_batched_tokens=64, cost_model="fitted:c.json")


def test_vllm_server_records_its_pid_while_running(tmp_path: Path, model: Path) -> None:
    """``VllmServer`` (the real launcher's class) around the fake server's command: the pid
    file names the serving process while it runs and is gone once it is stopped."""
    from ppas.live.server import VllmServer

    class Fake(VllmServer):
        def command(self) -> list[str]:
            return [sys.executable, str(TESTS / "fake_vllm.py"), "--port", str(self.port)]

    pid_file = tmp_path / "srv.pid"
    with Fake(model, policy=None, max_num_batched_tokens=64, pid_file=pid_file,
              log_path=tmp_path / "srv.log", startup_timeout_s=30) as srv:
        rec = json.loads(pid_file.read_text())
        assert srv._proc is not None and rec["pid"] == srv._proc.pid
        assert rec["owner"] == os.getpid() and rec["start"] == start_time(rec["pid"])
        assert "fake_vllm.py" in Path(f"/proc/{rec['pid']}/cmdline").read_text()
    assert not pid_file.exists() and not alive(rec["pid"])


# ---------------------------------------------------------------- the report's golden

#: mean E2E per arm at burst rate x: a + b * x (seconds); the arms differ on purpose
#: (pred near its simulated E2E: within the tolerance; the others far off it)
LATENCY = {"small": (0.50, 0.05), "large": (0.40, 0.08), "pred": (0.0105, 0.0),
           "stock": (0.45, 0.06)}
STEP_BIAS = {"large": 1.4}  # its steps slower than the shared fit predicts
CHUNK = {"small": 64, "large": 512, "pred": 256}
MISSING = ("stock", 12.0, 2)  # a run not made: stock is incomplete at 12
FAILED = ("large", 4.0, 1)  # a run with a failed request: left out of the paired ratios
RETRIED = ("small", 12.0, 0)  # a run retried after a server death
VLLM_VERSION = "0.32.0"


def _steps(exp: Experiment, arm: str, load: float, seed: int,
           rng: random.Random) -> list[dict[str, Any]]:
    """A plugin arm's step slice: each request prefilled in chunks, then decoded."""
    steps: list[dict[str, Any]] = []
    t = 100.0
    for req in exp.workload.trace(load, seed).requests:
        done = 0
        while done < req.prompt_tokens:
            k = min(CHUNK[arm], req.prompt_tokens - done)
            dur = ((0.002 + 2e-5 * k + 1e-8 * k * done) * rng.uniform(0.9, 1.1)
                   * STEP_BIAS.get(arm, 1.0))
            steps.append({"time": t, "duration_s": dur, "prefill_chunks": [[k, done]],
                          "decode_contexts": []})
            done += k
            t += dur
        for i in range(1, req.output_tokens):
            dur = (0.002 + 1e-4) * rng.uniform(0.9, 1.1)
            steps.append({"time": t, "duration_s": dur, "prefill_chunks": [],
                          "decode_contexts": [req.prompt_tokens + i]})
            t += dur
    return steps


def _run_file(exp: Experiment, arm: str, load: float, seed: int) -> dict[str, Any]:
    """One run file as ``ppas experiment`` writes it (its 18 keys, in its order)."""
    rng = random.Random(f"{arm}-{load}-{seed}")
    spec = exp.arm(arm)
    w = exp.workload
    trace = w.trace(load, seed)
    a, b = LATENCY[arm]
    e2e = (a + b * load) * rng.uniform(0.85, 1.15)
    failed = int((arm, load, seed) == FAILED)
    summary = {"completed": len(trace) - failed, "failed": failed,
               "avg_latency": e2e, "p95_latency": e2e * rng.uniform(1.3, 1.6),
               "avg_ttft": e2e * 0.6, "p95_ttft": e2e * rng.uniform(0.8, 1.0),
               "avg_tpot": 0.004 * rng.uniform(0.9, 1.1),
               "p95_tpot": 0.006 * rng.uniform(0.9, 1.1),
               "makespan": trace.requests[-1].arrival_s + e2e * 2}
    retried = (arm, load, seed) == RETRIED
    attempts = [{"attempt": 1, "server_died": False, "reason": "", "failed": failed}]
    if retried:
        attempts = [{"attempt": 1, "server_died": True,
                     "reason": "the server stopped answering /health during the run",
                     "failed": 2}, {"attempt": 2, "server_died": False, "reason": "",
                                    "failed": 0}]
    mbt = spec.max_num_batched_tokens or 512  # pred: what its policy would give
    return {"arm": arm, "load": load, "load_label": w.load_label(load), "seed": seed,
            "prompt_seed": 1000 * seed + w.loads.index(load) + 1,
            "trace": trace.description, "policy": spec.policy, "stock": spec.stock_dict(),
            "vllm_version": VLLM_VERSION,
            "cost_model": None if spec.cost_model is None else "fitted:/x/cost-auto.json",
            "max_num_batched_tokens": mbt, "attempts": attempts, "retried": retried,
            "wall_s": summary["makespan"] + 0.5, "finished_at": 1.8e9 + seed,
            "summary": summary,
            "per_request": _per_request(trace, e2e, f"{arm}-{load}-{seed}", failed),
            "steps": _steps(exp, arm, load, seed, rng) if spec.plugin else []}


def _per_request(trace: Trace, e2e: float, key: str, failed: int) -> dict[str, Any]:
    """The per-request arrays ``BenchResult.per_request`` writes: TTFT about 0.6 of the run's
    mean E2E, the rest decode gaps; the last ``failed`` requests failed (a generator of its
    own, so that the summaries' draws stay as they were)."""
    rng = random.Random("per-request-" + key)
    n = len(trace)
    out: dict[str, list[Any]] = {k: [] for k in (
        "arrival_s", "scheduled_s", "end_s", "input_lens", "output_lens", "ttfts", "tpots",
        "itls", "e2els", "errors")}
    t0 = trace.requests[0].arrival_s
    for i, r in enumerate(trace.requests):
        ok = i < n - failed
        ttft = e2e * 0.6 * rng.uniform(0.5, 1.5)
        itl = [e2e * 0.4 / max(r.output_tokens - 1, 1) * rng.uniform(0.5, 1.5)
               for _ in range(r.output_tokens - 1)] if ok else []
        total = ttft + sum(itl)
        out["arrival_s"].append(r.arrival_s)
        out["scheduled_s"].append(r.arrival_s - t0)
        out["end_s"].append(r.arrival_s - t0 + total)
        out["input_lens"].append(r.prompt_tokens)
        out["output_lens"].append(r.output_tokens if ok else 0)
        out["ttfts"].append(ttft if ok else None)
        out["tpots"].append(tpot_of(ttft, total, r.output_tokens) if ok else None)
        out["itls"].append(itl)
        out["e2els"].append(total if ok else None)
        out["errors"].append("" if ok else "http: 500")
    return out


def make_results(tmp_path: Path, model: Path) -> Experiment:
    """The fixed experiment (``BASE`` with three seeds) and its results folder (every run
    but ``MISSING``)."""
    exp = parse_experiment(_text(tmp_path, model, **{
        "name = \"t\"": "name = \"golden\"\ndescription = \"a fixed results folder\"",
        "seeds = [0, 1]": "seeds = [0, 1, 2]",
        "+": "\n[report]\nn_boot = 500\nslo = \"ttft=0.6s,tpot=250ms\"\n"}), "golden")
    for arm in exp.arms:
        for load, seed in exp.cells():
            if (arm.name, load, seed) == MISSING:
                continue
            p = (tmp_path / "out" / "runs" / arm.name
                 / f"{exp.workload.load_label(load)}-s{seed}.json")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(_run_file(exp, arm.name, load, seed), indent=1) + "\n")
    return exp


def _close(a: object, b: object, rel: float = 1e-9, eps: float = 1e-12) -> bool:
    """``a == b`` as JSON values, floats within ``rel`` of each other or both within
    ``eps`` of 0 (a sum of residuals is 0 up to rounding), with the same types, keys,
    lengths and every other value equal."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or abs(a - b) <= max(rel * max(abs(a), abs(b)), eps)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], rel, eps) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, rel, eps) for x, y in zip(a, b, strict=True))
    return a == b


def test_report_matches_golden(tmp_path: Path, model: Path) -> None:
    """The report stays byte-identical for the same run files: a results folder made
    deterministically here (summaries, step slices, a retried run, a failed run, a missing
    run) against the report.txt/report.json the code made for it at 8685c44, regenerated for
    issue 23 (no bootstrap interval below ``min_bootstrap_n`` traces, ignored files), for
    issue 19 (tail latencies, SLO attainment and goodput: new keys and a new table only) and
    issue 20 (P99 E2E and the simulator's P99; the probe, null here); report.json's floats
    are compared to 1e-9 relative, 1e-12 near 0 (the fit runs on the machine's BLAS). Regenerate
    only for a deliberate change of the report: ``PPAS_WRITE_GOLDEN=1 pytest -k golden``."""
    exp = make_results(tmp_path, model)
    write_report(exp)
    out = tmp_path / "out"
    if os.environ.get("PPAS_WRITE_GOLDEN"):
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for f in ("report.txt", "report.json"):
            (GOLDEN / f).write_bytes((out / f).read_bytes())
    assert (out / "report.txt").read_bytes() == (GOLDEN / "report.txt").read_bytes()
    # report.json keeps full floats; the fit's least squares runs on the machine's BLAS,
    # whose kernel (OpenBLAS picks one per CPU) can move the last bits: equal up to that.
    assert _close(json.loads((out / "report.json").read_text()),
                  json.loads((GOLDEN / "report.json").read_text()))
    rep = json.loads((out / "report.json").read_text())
    assert rep["num_runs"] == 23 and rep["planned_runs"] == 24


@pytest.mark.parametrize("name", ["report.txt", "report.json"])
def test_report_golden_is_not_trivial(name: str) -> None:
    """The golden covers every table of the report."""
    text = (GOLDEN / name).read_text()
    if name == "report.txt":
        for part in ("winner per burst", "baseline arms head to head", "oracle",
                     "geometric-mean improvement", "simulator: cost model fitted",
                     "(simulated as vllm:", "retried after a server death",
                     "tail latencies (means over seeds); SLO ttft=0.6s,tpot=250ms"):
            assert part in text, part
    else:
        rep = json.loads(text)
        for key in ("cells", "improvements", "winners", "baseline_pairs", "oracle",
                    "simulator"):
            assert rep[key], key
        assert rep["relative"]["rows"]
        atts = [c["slo_attainment"]["estimate"] for c in rep["cells"]]
        assert min(atts) < 0.5 and max(atts) == 1.0  # the SLO separates the arms
        assert all(c["itl_p99"]["estimate"] >= c["itl_p50"]["estimate"] for c in rep["cells"])


@pytest.mark.parametrize(("slo", "expect"), [("ttft=1000x", 1.0), ("ttft=0.01x", 0.0)])
def test_report_relative_slo(tmp_path: Path, model: Path, slo: str, expect: float) -> None:
    """A relative SLO is against each request's solo latency on the experiment's estimate
    cost model: a loose one every completed request meets, a tight one none."""
    exp = make_results(tmp_path, model)
    text = exp.source.replace('slo = "ttft=0.6s,tpot=250ms"', f'slo = "{slo}"') + (
        '[run]\nestimate_cost_model = "roofline"\nhardware = "h100-sxm-80gb"\n'
        'catalog_model = "qwen3-8b"\n')
    rep = build_report(parse_experiment(text, "golden"))
    assert rep["slo"] == slo
    for c in rep["cells"]:
        failed = c["failed"]["estimate"] > 0
        assert c["slo_attainment"]["estimate"] == pytest.approx(expect, abs=0.1 if failed else 0)


# ---------------------------------------------------------------- a results folder to trust


def _one_arm(tmp_path: Path, model: Path, **repl: str) -> Path:
    """``BASE`` cut to its first arm at one burst rate, two seeds (2 runs), written."""
    text = _text(tmp_path, model, **{"burst_rates = [4.0, 12.0]": "burst_rates = [4.0]",
                                     **repl})
    return _write(tmp_path, text[:text.index("[[arms]]\nname = \"large\"")])


@pytest.fixture()
def fake_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    """``main([...])`` in this process runs its servers as ``fake_vllm``."""
    import ppas.experiment.runner as runner_module

    monkeypatch.setattr(runner_module, "vllm_launcher", FakeLauncher)


def test_run_file_names_are_injective(tmp_path: Path, model: Path) -> None:
    """Issue 23, data loss 1, 2 and the path escape: arm names and loads map to distinct
    file names that read back, and none leaves its folder."""
    from ppas.experiment.folder import file_name, name_of

    names = ["mbt:64", "mbt_64", "mbt%3A64", "..", ".", ".x", "a.b", "ü", "x=1,y+2"]
    files = [file_name(n) for n in names]
    assert len(set(files)) == len(names)
    assert [name_of(f) for f in files] == names
    assert all("/" not in f and not f.startswith(".") for f in files)
    exp = parse_experiment(_text(tmp_path, model), "t")
    labels = {x: exp.workload.load_label(x) for x in (4.0, 0.1234561, 0.1234562, 1e-7, 3e6)}
    assert labels[4.0] == "4" and len(set(labels.values())) == len(labels)
    assert all(float(lab) == x for x, lab in labels.items())


def test_colliding_arms_and_rates_all_run(tmp_path: Path, model: Path, fake_cli: None,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Arms ``mbt:64`` / ``mbt_64`` and rates 0.1234561 / 0.1234562 used to share files:
    every one of the 4 runs is now its own file, and the report counts 4 distinct runs."""
    p = _one_arm(tmp_path, model, **{
        "burst_rates = [4.0]": "burst_rates = [0.1234561, 0.1234562]",
        "seeds = [0, 1]": "seeds = [0]", "name = \"small\"": "name = \"mbt:64\""})
    p.write_text(p.read_text() + "".join(f"[[arms]]\nname = \"{a}\"\npolicy = \"mbt:64\"\n"
                                         for a in ("mbt_64", "..")))
    assert main(["experiment", str(p)]) == 0
    runs = _runs(tmp_path / "out")
    assert len(runs) == 6
    assert {(r["arm"], r["load"]) for r in runs.values()} == {
        (a, x) for a in ("mbt:64", "mbt_64", "..") for x in (0.1234561, 0.1234562)}
    out = capsys.readouterr().out
    assert "6/6 runs" in out and "0.1234561  mbt_64" in out and "0.1234562  mbt:64" in out
    # arm ".." stays inside the folder, like every other
    assert sorted(x.name for x in tmp_path.iterdir()) == ["exp.toml", "model", "out"]
    assert {x.name for x in (tmp_path / "out" / "runs").iterdir()} == {
        "mbt%3A64", "mbt_64", "%2E."}


BROKEN = {"truncated": None, "empty": "", "list": "[]", "object": "{}", "nan": "NaN",
          "nan inside": "avg_latency", "not a step": "steps", "no request succeeded": "ok0"}


def _break(p: Path, how: str) -> None:
    text = p.read_text()
    obj = json.loads(text)
    if how == "truncated":
        p.write_text(text[:len(text) // 2])
    elif how == "nan inside":
        obj["summary"]["avg_latency"] = math.nan
        p.write_text(json.dumps(obj))
    elif how == "not a step":
        obj["steps"] = [{"x": 1}]
        p.write_text(json.dumps(obj))
    elif how == "no request succeeded":
        obj["summary"]["completed"] = 0
        p.write_text(json.dumps(obj))
    else:
        p.write_text(BROKEN[how] or "")


def test_broken_run_files_are_pending_rerun_and_reported(
        tmp_path: Path, model: Path, fake_cli: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23, data loss 3 and the report's tracebacks: a run file that does not parse as
    a complete run is pending in --dry-run, listed (not read) by --report, and re-run by
    --resume, which leaves the good run as it was."""
    p = _one_arm(tmp_path, model)
    assert main(["experiment", str(p)]) == 0
    out = tmp_path / "out"
    good, bad = sorted((out / "runs" / "small").glob("*.json"))
    keep = good.read_bytes()
    for how in BROKEN:
        _break(bad, how)
        capsys.readouterr()
        assert main(["experiment", str(p), "--dry-run"]) == 0, how
        assert "2 runs (1 already complete, 1 to run)" in capsys.readouterr().out, how
        assert main(["experiment", str(p), "--report"]) == 0, how
        text = capsys.readouterr().out
        assert "1/2 runs" in text and f"ignored: {bad}" in text, how
        assert main(["experiment", str(p), "--resume"]) == 0, how
        assert read_run(bad).summary["completed"] > 0, how
        assert good.read_bytes() == keep, how


def test_state_file_is_rebuilt_or_the_resume_refused(
        tmp_path: Path, model: Path, fake_cli: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23, data loss 4: experiment.json deleted or corrupt, then --resume: rebuilt
    when every run file records these settings; refused (never re-stamped) when the file's
    settings changed, or a run file does not record its settings."""
    p = _one_arm(tmp_path, model)
    assert main(["experiment", str(p)]) == 0
    out, state = tmp_path / "out", tmp_path / "out" / "experiment.json"
    runs = _runs(out)
    original = state.read_text()
    state.unlink()
    capsys.readouterr()
    assert main(["experiment", str(p), "--resume"]) == 0
    assert "written again" in capsys.readouterr().err
    assert state.read_text() == original and _runs(out) == runs
    changed = p.read_text().replace("prompt_tokens = 200", "prompt_tokens = 300")
    for corrupt in ("", "{", "[]", "{\"fingerprint\": 3}"):
        state.write_text(corrupt)
        p.write_text(changed)
        assert main(["experiment", str(p), "--resume"]) == 2, corrupt
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "do not record this experiment's settings" in err
        assert state.read_text() == corrupt and _runs(out) == runs  # nothing re-stamped
        assert main(["experiment", str(p)]) == 2  # nor without --resume
        assert "pass --resume" in capsys.readouterr().err
    # a run file from before runs recorded their settings: cannot be told apart
    p.write_text(changed.replace("prompt_tokens = 300", "prompt_tokens = 200"))
    f = next((out / "runs" / "small").glob("*.json"))
    f.write_text(json.dumps({k: v for k, v in json.loads(f.read_text()).items()
                             if k != "settings"}))
    state.unlink()
    assert main(["experiment", str(p), "--resume"]) == 2
    assert not state.exists()
    # with experiment.json back, that older file counts again
    state.write_text(original)
    assert main(["experiment", str(p), "--dry-run"]) == 0
    assert "2 runs (2 already complete, 0 to run)" in capsys.readouterr().out
    # a run file of other settings in a folder that says these: refused, not overwritten
    other = json.loads(f.read_text()) | {"settings": "0123456789abcdef"}
    f.write_text(json.dumps(other))
    assert main(["experiment", str(p), "--resume"]) == 2
    assert "made with other settings" in capsys.readouterr().err
    assert json.loads(f.read_text()) == other


def test_one_experiment_at_a_time_per_folder(tmp_path: Path, model: Path, fake_cli: None,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23, data loss 5: a second experiment into a folder in use exits 2 in one line
    and touches nothing; once the first is done the folder is free again."""
    p = _one_arm(tmp_path, model)
    exp = load_experiment(p)
    with Runner(exp, FakeLauncher).folder.locked():
        capsys.readouterr()
        assert main(["experiment", str(p)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is in use by another ppas experiment (pid " in err
        assert not (tmp_path / "out" / "runs").exists()
    assert main(["experiment", str(p)]) == 0
    assert len(_runs(tmp_path / "out")) == 2


def test_a_run_with_no_successful_request_fails_and_resume_retries_it(
        tmp_path: Path, model: Path, fake_cli: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23, data loss 6: a server answering 500 to every request: the run is failed
    (kept under failed/, not counted), the experiment exits 1, --resume runs it again."""
    fail = tmp_path / "fail"
    fail.write_text("")
    p = _one_arm(tmp_path, model, **{
        "warmup_requests = 1": "warmup_requests = 0",
        "max_num_seqs = 16": f"max_num_seqs = 16\nenv = {{ FAKE_FAIL_WHILE = \"{fail}\" }}"})
    assert main(["experiment", str(p)]) == 1
    err = capsys.readouterr().err
    assert "no request succeeded at burst 4 seed 0" in err and "0/2 runs complete" in err
    out = tmp_path / "out"
    assert not _runs(out) and len(list((out / "failed").rglob("*.json"))) == 1
    assert main(["experiment", str(p), "--dry-run"]) == 0
    assert "(0 already complete, 2 to run)" in capsys.readouterr().out
    fail.unlink()
    assert main(["experiment", str(p), "--resume"]) == 0
    assert len(_runs(out)) == 2
    assert all(r["summary"]["completed"] > 0 for r in _runs(out).values())


def test_fitted_auto_resume_after_a_corrupt_calibration_run(
        tmp_path: Path, model: Path, fake_cli: None) -> None:
    """Issue 23, tracebacks: a ``fitted:auto`` experiment whose calibration run file is
    corrupt, then --resume: the calibration run is made again and the model refitted."""
    text = _text(tmp_path, model, **{"burst_rates = [4.0, 12.0]": "burst_rates = [4.0]",
                                     "seeds = [0, 1]": "seeds = [0]"})
    cut = text.index("[[arms]]\nname = \"large\"")
    p = _write(tmp_path, text[:cut] + text[text.index("[[arms]]\nname = \"pred\""):
                                      text.index("[[arms]]\nname = \"stock\"")])
    assert main(["experiment", str(p)]) == 0
    out = tmp_path / "out"
    (cal,) = (out / "runs" / "small").glob("*.json")
    (pred,) = (out / "runs" / "pred").glob("*.json")
    cal.write_text("{\"arm\": ")
    pred.unlink()
    assert main(["experiment", str(p), "--resume"]) == 0
    assert read_run(cal).steps and read_run(pred).cost_model == (
        f"fitted:{(out / 'cost-auto.json').resolve()}")


def test_cost_model_files_must_be_cost_models(tmp_path: Path, model: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23: ``cost_model = "fitted:/etc/passwd"`` (any file that is not a fitted cost
    model) and an estimate's ``fitted:FILE`` fail at --dry-run, in one line."""
    junk = tmp_path / "passwd"
    junk.write_text("root:x:0:0:root:/root:/bin/bash\n")
    for repl, where in (({"cost_model = \"fitted:auto\"": f"cost_model = \"fitted:{junk}\""},
                         "arms[2].cost_model: "),
                        ({"+": f"\n[run]\nestimate_cost_model = \"fitted:{junk}\"\n"},
                         "run.estimate_cost_model: ")):
        p = _write(tmp_path, _text(tmp_path, model, **repl))
        assert main(["experiment", str(p), "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and where in err and "not a fitted cost model" in err


def test_trace_requests_must_fit_the_model(tmp_path: Path, model: Path) -> None:
    """Issue 23: a trace file's prompt + output above max_model_len is refused up front."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": t, "prompt_tokens": n,
                                         "output_tokens": 2}) + "\n"
                             for t, n in ((0, 100), (0.1, 4095))))
    text = _text(tmp_path, model, **{
        "phases = \"0.5:8,0.5:{burst}\"\nburst_rates = [4.0, 12.0]\nprompt_tokens = 200\n"
        "output_tokens = 3": f"kind = \"trace\"\nfile = \"{trace}\""})
    with pytest.raises(PpasError, match=r"^workload.file: prompt \+ output tokens \(4097\) "
                       r"exceed the model's max_position_embeddings \(4096\)$"):
        parse_experiment(text, "t")


def test_out_dir_file_and_non_regular_experiment_files(tmp_path: Path, model: Path) -> None:
    """Issue 23, exit codes and hangs: --dry-run refuses an out_dir that is a file as the
    run does (exit 2); a FIFO or a device as the experiment file is refused in one line,
    without reading it."""
    p = _write(tmp_path, _text(tmp_path, model))
    f = tmp_path / "afile"
    f.write_text("keep\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for args in (["experiment", str(p), "--out-dir", str(f), "--dry-run"],
                 ["experiment", str(p), "--out-dir", str(f), "--report"],
                 ["experiment", str(fifo), "--dry-run"],
                 ["experiment", "/dev/zero", "--dry-run"]):
        proc = _run_cli(args)
        try:
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode == 2, (args, err)
        assert err.count("\n") == 1 and ("is not a folder" in err
                                         or "is not a regular file" in err), err
    assert f.read_text() == "keep\n"


def test_two_seeds_give_no_bootstrap_interval(tmp_path: Path, model: Path) -> None:
    """Issue 23, statistics: with 2 seeds the paired bootstrap has 3 distinct resamples, so
    the report gives the geometric-mean ratio and says why it has no interval, instead of
    an interval; with enough traces the interval is there."""
    from ppas.experiment.folder import run_path

    exp = parse_experiment(_text(tmp_path, model), "t")
    for arm in exp.arms:
        for load, seed in exp.cells():
            p = run_path(tmp_path / "out", arm.name, exp.workload.load_label(load), seed)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(_run_file(exp, arm.name, load, seed)))
    text, rep = write_report(exp)
    per_load = [i for i in rep["improvements"] if i["load"] is not None]
    assert per_load and all(i["ratio"]["n"] == 2 or i["ratio"]["n"] == 1 for i in per_load)
    for i in per_load:
        assert i["ratio"]["lo"] is None and i["ratio"]["hi"] is None and not i["significant"]
        assert i["note"].startswith(f"n={i['ratio']['n']}: no bootstrap interval")
    assert "n=2: no bootstrap interval, needs n >= 6 at 95%" in text
    block = text.split("geometric-mean improvement")[1].split("simulator:")[0]
    rows = [ln for ln in block.splitlines()[1:] if ln.strip()]
    assert rows and all("no bootstrap interval" in ln and "[" not in ln
                        and not ln.endswith("*") for ln in rows)  # no interval, no mark
    from ppas.experiment.folder import run_path
    from ppas.experiment.tables import min_bootstrap_n

    assert [min_bootstrap_n(lv) for lv in (0.5, 0.9, 0.95, 0.99)] == [2, 5, 6, 8]


def _mutate(p: Path, rng: random.Random) -> str:
    """Break run file ``p`` in one of the ways a disk, an editor or a script does; every
    way leaves no complete run. Returns which."""
    text = p.read_text()
    obj = json.loads(text)
    how = rng.choice(["truncate", "empty", "list", "object", "nan", "drop key", "wrong type",
                      "none succeeded", "bad step", "binary", "fifo"])
    if how == "truncate":
        p.write_text(text[:rng.randrange(0, text.rindex("}"))])
    elif how in ("empty", "list", "object"):
        p.write_text({"empty": "", "list": "[]", "object": "{}"}[how])
    elif how == "nan":
        obj["summary"][rng.choice(["avg_latency", "makespan", "p95_ttft"])] = math.nan
        p.write_text(json.dumps(obj))
    elif how == "drop key":
        del obj[rng.choice(["arm", "load", "seed", "summary", "attempts", "steps", "wall_s"])]
        p.write_text(json.dumps(obj))
    elif how == "wrong type":
        key = rng.choice(["arm", "load", "seed", "summary", "steps", "max_num_batched_tokens"])
        obj[key] = rng.choice(["x", [1], {"a": 1}, None, True])
        p.write_text(json.dumps(obj))
    elif how == "none succeeded":
        obj["summary"]["completed"] = 0
        p.write_text(json.dumps(obj))
    elif how == "bad step":
        obj["steps"] = [{"duration_s": -1, "prefill_chunks": [], "decode_contexts": []}]
        p.write_text(json.dumps(obj))
    elif how == "binary":
        p.write_bytes(bytes(rng.randrange(256) for _ in range(64)))
    else:
        p.unlink()
        os.mkfifo(p)
    return how


def test_corrupt_results_folder_resume_reruns_exactly_the_bad_runs(
        tmp_path: Path, model: Path, fake_cli: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23, the corrupt-results-folder test: run files broken at random (a random
    subset, random ways); --dry-run counts exactly the intact ones, --report lists exactly
    the broken ones and never tracebacks, --resume re-runs exactly the broken ones and
    leaves the others byte for byte."""
    import shutil

    p = _one_arm(tmp_path, model, **{"seeds = [0, 1]": "seeds = [0, 1, 2]"})
    p.write_text(p.read_text() + "[[arms]]\nname = \"b:512\"\npolicy = \"mbt:512\"\n")
    assert main(["experiment", str(p)]) == 0
    out = tmp_path / "out"
    pristine = tmp_path / "pristine"
    shutil.copytree(out, pristine)
    files = sorted((out / "runs").rglob("*.json"))
    assert len(files) == 6
    for seed in range(3):
        shutil.rmtree(out)
        shutil.copytree(pristine, out)
        rng = random.Random(seed)
        broken = sorted(rng.sample(files, rng.randint(1, len(files))))
        hows = [_mutate(f, rng) for f in broken]
        intact = {f: f.read_bytes() for f in files if f not in broken}
        capsys.readouterr()
        assert main(["experiment", str(p), "--dry-run"]) == 0, hows
        assert f"6 runs ({len(intact)} already complete, {len(broken)} to run)" in \
            capsys.readouterr().out, hows
        assert main(["experiment", str(p), "--report"]) == 0, hows
        text = capsys.readouterr().out
        listed = sorted(Path(ln.split("ignored: ")[1].split(": ")[0])
                        for ln in text.splitlines() if ln.startswith("  ignored: "))
        assert listed == broken, hows
        assert main(["experiment", str(p), "--resume"]) == 0, hows
        assert all(f.read_bytes() == b for f, b in intact.items()), hows
        assert all(read_run(f).summary["completed"] > 0 for f in broken), hows


def test_folders_from_before_the_escaped_names_still_read(tmp_path: Path, model: Path) -> None:
    """A folder written before issue 23 kept arm ``mbt:64`` in ``runs/mbt_64/``: its runs
    count where the file holds that very run; the colliding arm ``mbt_64``'s run in the
    same file is not taken for it."""
    from ppas.experiment.folder import ResultsFolder

    exp = parse_experiment(_text(tmp_path, model, **{"name = \"small\"": "name = \"mbt:64\"",
                                                     "name = \"large\"": "name = \"mbt_64\""}),
                           "t")
    named = parse_experiment(_text(tmp_path, model), "t")  # the golden's arms' run files
    old = tmp_path / "out" / "runs" / "mbt_64"
    old.mkdir(parents=True)
    mine = _run_file(named, "small", 4.0, 0) | {"arm": "mbt:64"}
    (old / "4-s0.json").write_text(json.dumps(mine))
    theirs = _run_file(named, "large", 12.0, 1) | {"arm": "mbt_64"}
    (old / "12-s1.json").write_text(json.dumps(theirs))
    folder = ResultsFolder(exp)
    assert folder.completed() == {("mbt:64", 4.0, 0), ("mbt_64", 12.0, 1)}
    assert not folder.check("mbt:64", 12.0, 1).complete
    assert folder.runs("mbt:64")[0].to_json() == mine


# ---------------------------------------------------------------- the file, fuzzed

#: every key of the experiment file, by table (the ``[[arms]]`` ones on the first arm)
FILE_KEYS = {
    "": ["name", "description", "out_dir"],
    "model": ["path", "vocab_size"],
    "engine": ["dtype", "max_model_len", "max_num_seqs", "tensor_parallel_size",
               "gpu_memory_utilization", "enable_prefix_caching", "enforce_eager",
               "startup_timeout_s", "extra_args", "env"],
    "workload": ["kind", "phases", "burst_rates", "request_rates", "burstiness", "num_prompts",
                 "file", "prompt_tokens", "output_tokens", "seeds", "warmup_requests",
                 "request_timeout_s"],
    "arms": ["name", "policy", "stock", "cost_model", "max_num_batched_tokens", "baseline"],
    "arms.stock": ["max_num_batched_tokens", "long_prefill_token_threshold",
                   "max_num_partial_prefills", "max_long_partial_prefills"],
    "run": ["devices", "server_startup_s", "estimate_cost_model", "hardware", "catalog_model",
            "rounds"],
    "report": ["level", "n_boot", "bootstrap_seed"],
}


def _toml(v: Any) -> str:
    """``v`` as a TOML value (a string that TOML cannot hold is a TOML error: fine)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return ("nan" if math.isnan(v) else "inf" if v == math.inf else "-inf"
                if v == -math.inf else repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(map(_toml, v)) + "]"
    return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(x)}" for k, x in v.items()) + " }"


def _values() -> Any:
    from hypothesis import strategies as st

    scalar = st.one_of(st.integers(-2**70, 2**70), st.floats(), st.text(max_size=12),
                       st.booleans(), st.sampled_from([
                           "fitted:/etc/passwd", "fitted:auto", "../../x", "..", "/", "--host",
                           "mbt:64", "ppas:b_cap=1e18", "trace", "gamma", "0.5:1e9,1:{burst}",
                           "roofline", "float16", "1e-300"]),
                       st.sampled_from([0, 1, -1, 10**9, 10**18, 1e-300, 1e300, 0.5, 2.0]))
    number = st.sampled_from([0, 1, -1, 3, 10**6, 10**9, 10**12, 10**18, 2**63 - 1, 1e-300,
                              1e300, 0.5, 2.0, 1e9, math.nan, math.inf])
    return st.one_of(number, number, number, scalar, st.lists(number, min_size=1, max_size=3),
                     st.lists(scalar, max_size=3),
                     st.dictionaries(st.sampled_from(["A", "max_num_batched_tokens", "x y"]),
                                     scalar, max_size=2))


def _numbers(obj: Any) -> list[float]:
    """Every number in a parsed experiment's specs (dataclasses, tuples, dicts)."""
    import dataclasses

    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return []
    if isinstance(obj, int | float):
        return [obj]
    if dataclasses.is_dataclass(obj):
        return [x for f in dataclasses.fields(obj) for x in _numbers(getattr(obj, f.name))]
    if isinstance(obj, tuple | list):
        return [x for v in obj for x in _numbers(v)]
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _numbers(v)]
    return []


@pytest.mark.parametrize("where", [(t, k) for t, ks in FILE_KEYS.items() for k in ks],
                         ids=[f"{t}.{k}".lstrip(".") for t, ks in FILE_KEYS.items() for k in ks])
def test_fuzz_experiment_file(tmp_path: Path, model: Path, where: tuple[str, str]) -> None:
    """Issue 23, the fuzz test on the experiment file: any value at any key (huge, tiny,
    NaN, infinite, of the wrong type, a path outside the folder) is either a valid
    experiment whose plan is made at once, or one ``PpasError`` line: never a traceback,
    a hang or a server listening off 127.0.0.1."""
    from hypothesis import HealthCheck, given, settings

    base = _text(tmp_path, model)
    junk = tmp_path / "junk.json"
    junk.write_text("{}")

    @settings(max_examples=40, deadline=None, derandomize=True,  # too_slow: a timing check
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(_values())
    def one(value: Any) -> None:
        table, key = where
        line = f"{key} = {_toml(value)}\n"
        header = {"": None, "arms": "[[arms]]\n", "arms.stock": "[arms.stock]\n"}.get(
            table, f"[{table}]\n")
        if table == "":
            text = line + "\n".join(ln for ln in base.splitlines()
                                    if not ln.startswith(f"{key} = ")) + "\n"
        elif table == "arms.stock":
            text = base.replace("[arms.stock]\n", header + line)
        elif header in base:
            at = base.index(header) + len(header)
            rest = base[at:].split("\n[", 1)
            body = "".join(ln + "\n" for ln in rest[0].splitlines()
                           if not ln.startswith(f"{key} = "))
            text = base[:at] + line + body + ("\n[" + rest[1] if len(rest) > 1 else "")
        else:
            text = base + "\n" + header + line
        t0 = time.monotonic()
        try:
            exp = parse_experiment(text, "t")
        except PpasError as e:
            assert "\n" not in str(e), str(e)
            return
        plan_text(exp, estimate(exp), set())
        assert time.monotonic() - t0 < 30, (where, value)
        assert not any(a.split("=")[0] in ("--host", "--port")
                       for a in exp.engine.extra_args)
        assert "/" not in exp.name and exp.name not in (".", "..")  # out/NAME stays in out/
        assert exp.workload.warmup_requests <= 1000 and exp.report.n_boot <= 100_000
        assert 0.5 <= exp.report.level < 1
        big = [x for x in _numbers(exp) if not abs(x) <= 2**32]
        assert not big, (where, value, big)  # every number bounded (ppas.core.limits)

    one()
