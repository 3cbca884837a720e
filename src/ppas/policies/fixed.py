"""Static budgets: vLLM's fixed ``max_num_batched_tokens`` and Sarathi-Serve."""

from __future__ import annotations

from dataclasses import dataclass

from ppas.core.config import check_times, require
from ppas.core.decision import Decision, budget_decision
from ppas.core.view import SchedulerView
from ppas.cost.base import CostModel, largest_chunk_within
from ppas.policies.base import Policy
from ppas.policies.registry import register


@dataclass(frozen=True)
class MbtConfig:
    """``mbt:N``: vLLM's stock scheduler with ``--max-num-batched-tokens N``."""

    budget: int = 2048

    def __post_init__(self) -> None:
        require(self.budget >= 1, f"budget must be >= 1, got {self.budget}")


@register("mbt")
class FixedBudget(Policy):
    """Stock vLLM: one global budget shared by decodes and prefill chunks; the prefill cap
    is the global budget itself, so decodes (scheduled first when running earlier) and
    prefills compete exactly as in vLLM V1's ``schedule()``."""

    Config = MbtConfig

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.config.budget)

    def decide(self, view: SchedulerView) -> Decision:
        return budget_decision(self.config.budget)


@dataclass(frozen=True)
class SarathiConfig:
    """``sarathi:budget=N`` (chunk_size, includes decode tokens), or ``sarathi:tbt_slo=S``
    to derive the largest budget whose predicted decode+chunk step meets a TBT SLO of S
    seconds from the cost model (Sarathi-Serve picks it offline by profiling, §4.3)."""

    budget: int = 2048
    tbt_slo: float | None = None
    decodes: int = 32  # decode batch assumed when deriving the budget from tbt_slo

    def __post_init__(self) -> None:
        require(self.budget >= 1, f"budget must be >= 1, got {self.budget}")
        check_times(self, "tbt_slo")
        require(self.decodes >= 0, "decodes must be >= 0")


@register("sarathi")
class Sarathi(Policy):
    """Sarathi-Serve stall-free batching: every decode first, then running prefills, then
    waiting ones FCFS, each taking ``min(remaining prompt, chunk_size - tokens already in
    the step)``. The budget includes decode tokens, so the prefill budget this step is
    ``chunk_size - N_d``."""

    Config = SarathiConfig

    def __init__(self, config: SarathiConfig, spec: str | None = None) -> None:
        super().__init__(config, spec)
        self._budget = config.budget

    def bind_cost_model(self, cost_model: CostModel | None) -> None:
        if self.config.tbt_slo is None or cost_model is None:
            return
        self._budget = max(
            1,
            self.config.decodes
            + largest_chunk_within(cost_model, self.config.tbt_slo, self.config.decodes, 1 << 15),
        )

    @property
    def max_num_batched_tokens(self) -> int:
        return self._budget

    def decide(self, view: SchedulerView) -> Decision:
        return Decision(max(0, self._budget - view.num_running_decodes), decodes_first=True)
