"""``ppas experiment --report`` against a golden: a results folder made deterministically
here (synthetic run files: summaries, step slices, a retried run, a failed run, a missing
run) and the report.txt/report.json that the code produced for it at the restructuring's
base (8685c44). The report must stay byte-identical for the same run files.

Regenerate the golden only for a deliberate change of the report:
``PPAS_WRITE_GOLDEN=1 pytest tests/test_experiment_report.py``."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from ppas.experiment.report import write_report
from ppas.experiment.spec import Experiment, parse_experiment

GOLDEN = Path(__file__).resolve().parent / "data" / "experiment_report"

SPEC = """\
name = "golden"
description = "a fixed results folder"
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
seeds = [0, 1, 2]
warmup_requests = 1
[report]
n_boot = 500
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
            "per_request": {"arrival_s": [r.arrival_s for r in trace.requests],
                            "e2el": [e2e] * len(trace)},
            "steps": _steps(exp, arm, load, seed, rng) if spec.plugin else []}


def make_results(tmp_path: Path) -> Experiment:
    """The fixed experiment and its results folder (every run but ``MISSING``)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 5000,
                                                   "max_position_embeddings": 4096}))
    exp = parse_experiment(SPEC.format(out=tmp_path / "out", model=model), "golden")
    for arm in exp.arms:
        for load, seed in exp.cells():
            if (arm.name, load, seed) == MISSING:
                continue
            p = (tmp_path / "out" / "runs" / arm.name
                 / f"{exp.workload.load_label(load)}-s{seed}.json")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(_run_file(exp, arm.name, load, seed), indent=1) + "\n")
    return exp


def test_report_matches_golden(tmp_path: Path) -> None:
    exp = make_results(tmp_path)
    write_report(exp)
    out = tmp_path / "out"
    if os.environ.get("PPAS_WRITE_GOLDEN"):
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for f in ("report.txt", "report.json"):
            (GOLDEN / f).write_bytes((out / f).read_bytes())
    for f in ("report.txt", "report.json"):
        assert (out / f).read_bytes() == (GOLDEN / f).read_bytes(), f
    rep = json.loads((out / "report.json").read_text())
    assert rep["num_runs"] == 23 and rep["planned_runs"] == 24


@pytest.mark.parametrize("name", ["report.txt", "report.json"])
def test_golden_is_not_trivial(name: str) -> None:
    """The golden covers every table of the report."""
    text = (GOLDEN / name).read_text()
    if name == "report.txt":
        for part in ("winner per burst", "baseline arms head to head", "oracle",
                     "geometric-mean improvement", "simulator: cost model fitted",
                     "(simulated as vllm:", "retried after a server death"):
            assert part in text, part
    else:
        rep = json.loads(text)
        for key in ("cells", "improvements", "winners", "baseline_pairs", "oracle",
                    "simulator"):
            assert rep[key], key
        assert rep["relative"]["rows"]
