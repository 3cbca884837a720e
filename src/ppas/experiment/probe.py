"""The capacity probe of a ``capacity_loads`` workload: the loads are fractions of the
engine's prefill capacity measured on this machine, so "low" and "high" load are the same
fractions of what the host can do on a slow or a fast one.

Invariants:

* the probe runs once per results folder, on the first arm's server (no server start of
  its own), after its start and before its first run: ``requests`` prompts of
  ``prompt_tokens`` random tokens and 1 output token, one at a time, each with its own
  prompt (no prefix-cache hit); the capacity is ``prompt_tokens / median TTFT`` (prompt
  tokens per second through one prefill, HTTP included);
* the result is written to ``probe.json`` in the folder before any run, and a resume or
  ``--report`` reads it back, so every run of a folder replays the same traces;
* the probe's result is a measurement, not a setting: the experiment's fingerprint leaves
  it out (``WorkloadSpec.settings_text``);
* before the probe (``--dry-run``, the time estimate) the capacity is predicted by the
  simulator from ``run.estimate_cost_model`` (``predicted_capacity``), and said so.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ppas.core.errors import PpasError
from ppas.core.outputs import write_json_atomic
from ppas.cost import CostModel
from ppas.engine.simulator import EngineConfig, simulate
from ppas.experiment.servers import ArmServer
from ppas.experiment.spec import Experiment
from ppas.live.client import ReplayOptions, run_trace
from ppas.policies import make_policy
from ppas.workload import RequestSpec, Trace

PROBE_FILE = "probe.json"
#: Probe prompts are seeded apart from the runs' (``measure.prompt_seed``: 1000 * seed + k).
PROBE_PROMPT_SEED = 10**9


@dataclass(frozen=True)
class ProbeResult:
    """What the probe measured (``probe.json``)."""

    arm: str  # the server it ran on
    max_num_batched_tokens: int  # that server's budget
    prompt_tokens: int
    ttft_s: tuple[float, ...]  # one per probe request, in order
    capacity_tok_s: float  # prompt_tokens / median(ttft_s)
    finished_at: float

    @staticmethod
    def of(arm: str, mbt: int, prompt_tokens: int, ttfts: list[float]) -> ProbeResult:
        if not ttfts or min(ttfts) <= 0:
            raise PpasError(f"capacity probe on arm {arm}: no probe request succeeded, so "
                            "the capacity cannot be measured; see the arm's server log")
        return ProbeResult(arm, mbt, prompt_tokens, tuple(ttfts),
                           prompt_tokens / statistics.median(ttfts), time.time())

    def describe(self) -> str:
        ms = ", ".join(f"{t * 1e3:.0f}" for t in self.ttft_s)
        return (f"capacity probe on {self.arm} (MBT {self.max_num_batched_tokens}): "
                f"{len(self.ttft_s)} prompts of {self.prompt_tokens} tokens one at a time, "
                f"TTFT {ms} ms, median {statistics.median(self.ttft_s) * 1e3:.0f} ms: "
                f"prefill capacity {self.capacity_tok_s:.0f} prompt tokens/s")


def probe_path(exp: Experiment) -> Path:
    return Path(exp.out_dir) / PROBE_FILE


def read_probe(exp: Experiment) -> ProbeResult | None:
    """The folder's ``probe.json``; None when there is none."""
    p = probe_path(exp)
    if not p.exists():
        return None
    try:
        d = json.loads(p.read_text())
        return ProbeResult(str(d["arm"]), int(d["max_num_batched_tokens"]),
                           int(d["prompt_tokens"]), tuple(float(x) for x in d["ttft_s"]),
                           float(d["capacity_tok_s"]), float(d["finished_at"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PpasError(f"{p}: not a probe result ({e}); delete it to probe again (and the "
                        "runs made with it)") from None


def write_probe(exp: Experiment, res: ProbeResult) -> None:
    write_json_atomic(probe_path(exp), asdict(res))


def with_probe(exp: Experiment, res: ProbeResult) -> Experiment:
    """The experiment whose traces are set by the probed capacity."""
    return replace(exp, workload=exp.workload.with_capacity(res.capacity_tok_s))


def resolved(exp: Experiment) -> Experiment:
    """``exp`` with its folder's probed capacity when it needs one and it was measured."""
    if exp.workload.probe is None or exp.workload.capacity_tok_s is not None:
        return exp
    res = read_probe(exp)
    return exp if res is None else with_probe(exp, res)


def predicted_capacity(exp: Experiment, cost_model: CostModel) -> float:
    """The probe's result as the simulator predicts it: one probe prompt alone on an engine
    whose budget holds it."""
    probe = exp.workload.probe
    assert probe is not None
    n = probe.prompt_tokens
    s = simulate([RequestSpec(0.0, n, 1)], make_policy(f"mbt:{max(n, 1)}"), cost_model,
                 EngineConfig(max_num_seqs=exp.engine.max_num_seqs)).summary()
    return n / float(s["avg_ttft"])


def run_probe(exp: Experiment, srv: ArmServer) -> ProbeResult:
    """The probe on ``srv`` (see the module docstring); a failed request is left out."""
    probe = exp.workload.probe
    assert probe is not None
    w = exp.workload
    one = Trace((RequestSpec(0.0, probe.prompt_tokens, 1),), 0.0, "capacity probe")
    ttfts: list[float] = []
    for i in range(probe.requests):
        res = asyncio.run(run_trace(srv.base_url, exp.model.path, one, ReplayOptions(
            prompt_seed=PROBE_PROMPT_SEED + i, vocab_size=exp.model.vocab_size,
            filler_id=min(1000, exp.model.vocab_size - 1),
            request_timeout_s=w.request_timeout_s,
            num_warmups=w.warmup_requests if i == 0 else 0)))
        ttfts += [o.ttft for o in res.outcomes if o.success and o.ttft is not None]
    return ProbeResult.of(srv.launch.arm.name, srv.launch.max_num_batched_tokens,
                          probe.prompt_tokens, ttfts)


def probe_dict(exp: Experiment) -> dict[str, Any] | None:
    """The report's record of the probe and each trace's resulting time scale."""
    if exp.workload.probe is None:
        return None
    res = read_probe(exp)
    if res is None:
        return {"result": None, "time_scales": []}
    w = with_probe(exp, res).workload
    return {"result": asdict(res), "describe": res.describe(),
            "time_scales": [{"load": load, "seed": s, "window": list(w.windows[i])
                             if w.windows else None, "time_scale": w.time_scale_at(load, s)}
                            for load in w.loads for i, s in enumerate(w.seeds)]}
