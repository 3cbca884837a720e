"""P-PAS: prefill-pressure adaptive scheduling (P-PAS paper §3, Algorithm 1)."""

from __future__ import annotations

from dataclasses import dataclass

from ppas.core.config import require
from ppas.core.decision import Decision
from ppas.core.view import SchedulerView
from ppas.policies.base import Policy
from ppas.policies.registry import register


@dataclass(frozen=True)
class PpasConfig:
    """Paper defaults: N_th = 2, B_max = 16384 (also the global MBT), B_cap = 2048."""

    n_th: int = 2
    b_max: int = 16384
    b_cap: int = 2048

    def __post_init__(self) -> None:
        require(self.n_th >= 1, f"n_th must be >= 1, got {self.n_th}")
        require(self.b_max >= 1, f"b_max must be >= 1, got {self.b_max}")
        require(
            1 <= self.b_cap <= self.b_max,
            f"b_cap must be in [1, b_max={self.b_max}], got {self.b_cap}",
        )


@register("ppas")
class Ppas(Policy):
    """Per step: N_p = requests with prompt left (running or waiting), N_d = running
    decodes. If N_p >= N_th and N_d > 0 the prefill budget is B_cap (pressure: protect the
    decodes), else B_max (big efficient chunks). The global budget stays B_max, so decode
    tokens are never cut by the cap (§3.2)."""

    Config = PpasConfig

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.config.b_max)

    def decide(self, view: SchedulerView) -> Decision:
        c = self.config
        if view.num_pending_prefills >= c.n_th and view.num_running_decodes > 0:
            return Decision(c.b_cap)
        return Decision(c.b_max)
