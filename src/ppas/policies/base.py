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
from dataclasses import dataclass
from typing import Any, ClassVar

from ppas.state import RequestView, SchedulerView


@dataclass(frozen=True, slots=True)
class Decision:
    """One step's decision.

    prefill_budget: cap on the sum of prefill tokens this step (>= 0).
    prefill_order: request ids in the order prefills should be served; ``None`` keeps the
        engine's own order (running in order, then waiting FCFS). Ids not listed keep their
        engine order after the listed ones.
    decodes_first: schedule every running decode before any running prefill chunk
        (Sarathi-Serve's stall-free batching); vLLM's default is plain running order.
    """

    prefill_budget: int
    prefill_order: tuple[str, ...] | None = None
    decodes_first: bool = False


def uncached_prompt_tokens(r: RequestView) -> int:
    """Prompt tokens a request still has to compute, net of the prefix-cache hit it would
    get if admitted now (at least 1: vLLM always computes the last token)."""
    return max(1, r.prompt_tokens - r.num_computed_tokens - r.num_cached_tokens)


@dataclass(frozen=True)
class EngineKnobs:
    """vLLM's own prefill knobs an engine runs with beside the policy (names and defaults as
    vLLM's ``SchedulerConfig``); their per-step rules are ``ppas.step_rules`` (rule 4b).
    Every policy but ``vllm:`` (stock vLLM's knobs as a baseline) runs with the defaults.
    ``local_prefill_interval``: whether the release line applies ``prefill_schedule_interval``
    without data parallelism (0.33: yes; 0.32: no, the knob does nothing there).
    ``max_num_seqs`` / ``max_num_active_seqs``: None keeps the engine's own
    (``EngineConfig.max_num_seqs``; no separate active limit); their one scheduling effect is
    the admission limit (``step_rules.admission_limit``)."""

    long_prefill_token_threshold: int = 0
    long_prefill_token_threshold_adaptive: bool = False
    prefill_schedule_interval: int = 1
    local_prefill_interval: bool = True
    max_num_seqs: int | None = None
    max_num_active_seqs: int | None = None


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
