"""The simulator beside the measurement: each run predicted from its trace, its arm's policy
and a cost model fitted to the plugin arms' step slices, and where a miss comes from.

Invariants: a stock arm is simulated as the ``vllm:`` policy of its modelled knobs for the
vLLM line its runs used (``ArmSpec.sim_policy``; runs that did not record theirs count as
the installed vLLM's); a run without a prediction says why (``Prediction.note``); an arm is
off when its mean relative error exceeds ``SIM_TOLERANCE``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ppas.calibrate.fit import sample
from ppas.core.steplog import Step
from ppas.cost.fitted import COEFFICIENTS, FittedCostModel, fit_stats
from ppas.engine.simulator import EngineConfig, simulate
from ppas.experiment.runfile import RunFile
from ppas.experiment.spec import Experiment
from ppas.live.versions import installed_vllm_version
from ppas.policies import make_policy

SIM_TOLERANCE = 0.15


@dataclass(frozen=True)
class Prediction:
    """One run's prediction."""

    policy: str | None  # the policy simulated for the run's arm; None when it has none
    sim: dict[str, float] | None  # predicted ``avg_latency``, ``p95_latency``, ``e2e_p99``
    error: float | None  # (predicted - measured) / measured mean E2E
    note: str | None  # why there is no prediction


@dataclass(frozen=True)
class Predicted:
    """A run and its prediction: what the report's tables read."""

    run: RunFile
    pred: Prediction


def predict(exp: Experiment, runs: Sequence[RunFile],
            model: FittedCostModel | None) -> list[Predicted]:
    installed = installed_vllm_version()  # for runs that did not record theirs
    return [Predicted(r, _predict(exp, r, model, installed)) for r in runs]


def _predict(exp: Experiment, r: RunFile, model: FittedCostModel | None,
             installed: str | None) -> Prediction:
    spec, why = exp.arm(r.arm).sim_policy(r.vllm_version or installed)
    if model is None:
        return Prediction(spec, None, None, "no step log to fit a cost model (no plugin arm ran)")
    if spec is None:
        return Prediction(spec, None, None, why)
    trace = exp.workload.trace(r.load, r.seed)
    s = simulate(trace, make_policy(spec), model,
                 EngineConfig(max_num_seqs=exp.engine.max_num_seqs,
                              max_num_batched_tokens=r.max_num_batched_tokens)).summary()
    sim = {k: float(s[k]) for k in ("avg_latency", "p95_latency", "e2e_p99")}
    m = r.summary["avg_latency"]
    return Prediction(spec, sim, (sim["avg_latency"] - m) / m if m else None, None)


def step_time_error(model: FittedCostModel | None, runs: Sequence[RunFile]) -> float | None:
    """(predicted - measured) / measured total step time of the runs' own steps."""
    steps = [sample(Step.of(s)) for r in runs for s in r.steps]
    if model is None or not steps:
        return None
    return float(fit_stats(model, steps).total_error)


def why_off(step_err: float | None) -> str:
    """Where a mean-E2E miss comes from: the step-time model, or outside the steps."""
    if step_err is None:
        return "no step log for this arm, so the cause cannot be located"
    if abs(step_err) > SIM_TOLERANCE / 2:
        return (f"the fitted step-time model misses this arm's own steps by {step_err:+.0%} "
                "in total (the linear step model fits this arm's mix of steps worse)")
    return (f"its steps are predicted within {step_err:+.0%} in total, so the miss is outside "
            "the engine's step times: waits between steps (HTTP, detokenisation, the client "
            "and other processes sharing the CPU) or a different order of scheduling")


def model_dict(model: FittedCostModel) -> dict[str, Any]:
    """The report's view of the cost model: coefficients and fit statistics."""
    return {"coefficients": {n: float(getattr(model, n)) for n in COEFFICIENTS},
            "fit": None if model.stats is None else asdict(model.stats)}
