"""The policy interface: one pure decision per engine step.

A policy reads a ``SchedulerView`` and returns a ``Decision``: the step's prefill token
budget and, optionally, the order in which prefilling requests get it. The engine (the
simulator or vLLM through ``ppas.vllm.PolicyScheduler``) enforces, every step:

* sum of prefill tokens scheduled <= ``Decision.prefill_budget``;
* decode tokens are never reduced by the policy (they only count against the engine's
  global ``max_num_batched_tokens``, which is ``Policy.max_num_batched_tokens``);
* when the budget is spent, remaining prefills wait for the next step.

Policies hold only their frozen config; anything that looks like state (DLFP's current
chunk, say) is recomputed from ``SchedulerView.recent_steps``. No torch, vllm or HTTP.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from ppas.core.decision import Decision, EngineKnobs
from ppas.core.view import SchedulerView


class Policy(ABC):
    """Base class of every policy. Subclasses set ``Config``; ``@register(NAME)`` sets
    ``name``."""

    name: ClassVar[str]
    Config: ClassVar[type]
    #: How many recent ``StepRecord``s the policy reads; engines keep at least this many.
    history_window: ClassVar[int] = 0
    def __init__(self, config: Any, spec: str | None = None) -> None:
        self.config = config
        self.spec = spec or self.name

    @property
    @abstractmethod
    def max_num_batched_tokens(self) -> int:
        """The engine's global per-step token budget (vLLM's MBT) this policy runs with."""

    @abstractmethod
    def decide(self, view: SchedulerView) -> Decision:
        """The step's decision. Must be fast (microseconds) and side-effect free."""

    @property
    def engine_knobs(self) -> EngineKnobs:
        """vLLM's own prefill knobs this policy runs with (stock defaults)."""
        return EngineKnobs()

    def bind_cost_model(self, cost_model: Any) -> None:  # noqa: B027 (optional hook)
        """Give model-based policies the served model's cost model (``ppas.cost``).
        Model-free policies ignore it."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec}>"
