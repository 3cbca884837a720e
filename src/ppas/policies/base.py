"""The policy interface: one pure decision per engine step.

A policy reads a ``SchedulerView`` and returns a ``Decision``: the step's prefill token
budget and, optionally, the order in which prefilling requests get it. The engine (the
simulator or vLLM through ``ppas.vllm.PolicyScheduler``) enforces, every step:

* sum of prefill tokens scheduled <= ``Decision.prefill_budget``;
* decode tokens are never reduced by the policy (they only count against the engine's
  global ``max_num_batched_tokens``, which is ``Policy.max_num_batched_tokens``);
* when the budget is spent, remaining prefills wait for the next step.

Policies hold only their frozen config and the cost model bound once (or tables derived
from it); anything that looks like state (DLFP's current chunk, say) is recomputed from
``SchedulerView.recent_steps``. No torch, vllm or HTTP.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar

from ppas.core.decision import Decision, EngineKnobs
from ppas.core.registry import Configured
from ppas.core.view import SchedulerView, StepRecord
from ppas.cost.base import CostModel


class Policy(Configured, ABC):
    """Base class of every policy. Subclasses set ``Config``; ``@register(NAME)`` sets
    ``name``."""

    #: How many recent ``StepRecord``s the policy reads; engines keep at least this many.
    history_window: ClassVar[int] = 0
    #: The served model's cost model, once bound (None: none configured, or not bound).
    cost_model: CostModel | None = None

    @property
    @abstractmethod
    def max_num_batched_tokens(self) -> int:
        """The engine's global per-step token budget (vLLM's MBT) this policy runs with."""

    @abstractmethod
    def decide(self, view: SchedulerView) -> Decision:
        """The step's decision. Must be fast (microseconds) and side-effect free."""

    def chunk_rule(self, view: SchedulerView) -> ChunkRule | None:
        """This step's and the next steps' prefill budgets as a function of what changes
        between them (None, the default: no such promise; engines then call ``decide``
        every step). Asked only when ``view``'s running requests are decodes (one token
        past their prompt), each of which sampled its last token at ``view.now``, and one
        request mid-prompt, P (a *chunk run*: ``ppas.engine.simulator``).

        ``decide(v)`` must be a bare budget (no order, ``decodes_first`` False, no chunk
        limit) and ``rule(now, prefill_ctx, decode_ctx)[0]`` must equal its
        ``prefill_budget`` wherever either is short of P's prompt left (``prompt_tokens -
        prefill_ctx``; both at least that otherwise: the engine then takes the step
        singly), for ``view`` itself and for every view ``v`` that differs from it only as
        steps that give P chunks short of its prompt's end move it: ``v.now = now``, P's
        computed tokens ``prefill_ctx`` (< its prompt), the decodes in the same order, each
        some tokens further (their computed tokens summing to ``decode_ctx``), each having
        sampled its last token at ``now``, the waiting queue the same but for requests
        arrived at its end, ``recent_steps`` longer. Like ``decide``, free of side effects
        on the decisions. The rule's second value is 0.0 or, for a budget ``b >= 1``, the
        step's price on the policy's bound cost model, ``cost_model.chunk_pricer()(b,
        prefill_ctx, num_running_decodes, decode_ctx)`` exactly (a search that priced
        ``b`` gives it: ``CostModel.priced_chunk_search``); engines read it only where
        they price on that cost model."""
        return None

    @property
    def engine_knobs(self) -> EngineKnobs:
        """vLLM's own prefill knobs this policy runs with (stock defaults)."""
        return EngineKnobs()

    def bind_cost_model(self, cost_model: CostModel | None) -> None:
        """Give model-based policies the served model's cost model (``ppas.cost``), kept
        as ``cost_model``; a policy that derives tables from it overrides this (once, not
        per step). Model-free policies ignore it."""
        self.cost_model = cost_model

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec}>"


#: ``Policy.chunk_rule``'s function: ``(now, prefill_ctx, decode_ctx) -> (prefill budget,
#: price)``, the price 0.0 or the step's (``Policy.chunk_rule``).
ChunkRule = Callable[[float, int, int], tuple[int, float]]


def last_prefill_token_time(steps: Sequence[StepRecord]) -> float | None:
    """Seconds per token of the latest step in ``steps`` that ran prefill (its
    completion-timed duration over all its tokens): what a model-based policy predicts
    with when no cost model is bound. None when no such step is in ``steps``."""
    for s in reversed(steps):
        if s.num_prefill_tokens and s.duration_s > 0:
            return s.duration_s / (s.num_prefill_tokens + s.num_decode_tokens)
    return None
