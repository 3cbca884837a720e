"""An engine set up for a policy: the one place a cost model is sized to a token budget.

vLLM reserves GPU memory for the activations of one full step of
``max_num_batched_tokens`` tokens before it sizes the KV cache, so a cost model's KV
capacity depends on the engine's budget (``RooflineCostModel``'s activation reserve).
Invariant: the cost model of every engine built here is sized at the budget that engine
runs with, ``config.max_num_batched_tokens`` if set, else the policy's own (what
``EngineSim`` runs with).
"""

from __future__ import annotations

from dataclasses import dataclass

from ppas.core.errors import PpasError
from ppas.cost import CostModel, make_cost_model
from ppas.cost.roofline import RooflineCostModel, RooflineParams
from ppas.engine.simulator import EngineConfig
from ppas.policies import Policy, make_policy


@dataclass(frozen=True)
class EngineSetup:
    """What ``simulate(trace, policy, cost_model, config)`` takes, consistent."""

    policy: Policy
    cost_model: CostModel
    config: EngineConfig

    @property
    def max_num_batched_tokens(self) -> int:
        """The budget the engine runs with and its cost model is sized at."""
        return self.config.max_num_batched_tokens or self.policy.max_num_batched_tokens


def engine_for(policy: Policy | str, hardware: str | None, model: str | None, *,
               cost_model: str | None = "roofline", tp: int = 1,
               params: RooflineParams | None = None,
               config: EngineConfig | None = None) -> EngineSetup:
    """``policy`` (a config string or a built policy) on an engine of ``config`` (default
    settings if None), its cost model (``make_cost_model``'s spec ``cost_model`` for
    ``hardware`` x ``model`` at tensor-parallel degree ``tp``; a roofline of trial
    ``params`` if given, whatever ``cost_model`` says) sized at the engine's token budget."""
    pol = make_policy(policy) if isinstance(policy, str) else policy
    cfg = config or EngineConfig()
    mbt = cfg.max_num_batched_tokens or pol.max_num_batched_tokens
    if params is not None:  # calibration trials: the roofline under other constants
        if not hardware or not model:
            raise PpasError("the roofline cost model needs hardware and model")
        cm: CostModel = RooflineCostModel(hardware, model, params, tp, max_num_batched_tokens=mbt)
    else:
        cm = make_cost_model(cost_model, hardware, model, tp, mbt)
    return EngineSetup(pol, cm, cfg)


__all__ = ["EngineSetup", "engine_for"]
