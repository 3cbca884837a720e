"""What a policy returns each step, and stock vLLM's own knobs an engine runs beside it.

The token-budget view of a step is ``ppas.core.view``; the rules that apply a decision are
``ppas.engine.step_rules``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from ppas.core.order import LoggedOrder


@dataclass(frozen=True, slots=True)
class Decision:
    """One step's decision.

    prefill_budget: cap on the sum of prefill tokens this step (>= 0).
    prefill_order: request ids in the order prefills should be served; ``None`` keeps the
        engine's own order (running in order, then waiting FCFS). Ids not listed keep their
        engine order after the listed ones. Under vLLM's ``--scheduling-policy priority``
        the order applies within each priority level, never across levels
        (``ppas.engine.step_rules`` rule 3 says why).
    decodes_first: schedule every running decode before any running prefill chunk
        (Sarathi-Serve's stall-free batching); vLLM's default is plain running order.
    chunk_limit: the most tokens one request's prefill chunk may take this step, running
        or waiting (0: no limit): vLLM's ``long_prefill_token_threshold`` decided per step
        (``ppas.engine.step_rules`` rule 4). A long prompt then leaves the rest of the
        budget to the prompts behind it, as the static knob does.
    order_kept: a hint, not part of the decision (equal decisions may differ in it): the
        first ``order_kept`` ids of ``prefill_order`` are, in order, the first
        ``order_kept`` waiting requests of the view decided on (a policy that keeps its
        order between steps lists its kept head again). An engine whose queue is kept in
        the last order may then move only the rest (the simulator's
        ``WaitingQueue.move_to_front``, which checks it); others ignore it. 0: no hint.
        (An order that is a ``ppas.core.order.LoggedOrder`` is a tuple of ids that shares
        them with the policy's earlier orders: equal to its tuple, cheaper to build and
        to follow.)
    """

    prefill_budget: int
    prefill_order: tuple[str, ...] | LoggedOrder | None = None
    decodes_first: bool = False
    chunk_limit: int = 0
    order_kept: int = field(default=0, compare=False)


#: The shared ``Decision(b)`` of each budget ``budget_decision`` was asked for (at most
#: ``_SHARED_MAX`` budgets; others are made anew).
_SHARED: dict[int, Decision] = {}
_SHARED_MAX = 1 << 16


def budget_decision(prefill_budget: int) -> Decision:
    """``Decision(prefill_budget)`` (an ``int`` budget, no order), one shared object per
    budget: a decision is frozen, so a policy that returns a bare budget every step need not
    build one each time (the engine reads it, never keeps or changes it)."""
    d = _SHARED.get(prefill_budget)
    if d is None:
        d = Decision(prefill_budget)
        if len(_SHARED) < _SHARED_MAX and type(prefill_budget) is int:
            _SHARED[prefill_budget] = d
    return d


class Knob(StrEnum):
    """Stock vLLM's scheduler knobs: the one spelling of their names (``SchedulerConfig``
    fields; ``EngineKnobs`` fields, experiment stock arms and the ``vllm:`` policy's
    parameters are named after them). A member is its name; ``flag`` is ``vllm serve``'s."""

    MAX_NUM_BATCHED_TOKENS = "max_num_batched_tokens"
    MAX_NUM_SEQS = "max_num_seqs"
    MAX_NUM_ACTIVE_SEQS = "max_num_active_seqs"
    LONG_PREFILL_TOKEN_THRESHOLD = "long_prefill_token_threshold"
    LONG_PREFILL_TOKEN_THRESHOLD_ADAPTIVE = "long_prefill_token_threshold_adaptive"
    PREFILL_SCHEDULE_INTERVAL = "prefill_schedule_interval"

    @property
    def flag(self) -> str:
        """``vllm serve``'s flag: ``max_num_seqs`` -> ``--max-num-seqs``."""
        return "--" + self.value.replace("_", "-")


@dataclass(frozen=True)
class EngineKnobs:
    """vLLM's own prefill knobs an engine runs with beside the policy (named as ``Knob``,
    defaults as vLLM's ``SchedulerConfig``); their per-step rules are
    ``ppas.engine.step_rules`` (rule 4b).
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


def admission_limit(knobs: EngineKnobs, engine_max_num_seqs: int) -> int:
    """vLLM's ``Scheduler.max_num_active_reqs`` (0.32 and 0.33): the waiting loop admits
    while fewer requests run; ``max_num_active_seqs`` when set, else ``max_num_seqs`` (the
    knob's, else the engine's). ``max_num_seqs`` also sizes the model runner and its CUDA
    graphs (captured up to ``min(2 * max_num_seqs, 512)`` tokens, so every decode-only step
    stays captured): admission is its only effect on the schedule. vLLM refuses an active
    limit above ``max_num_seqs``; the ``min`` keeps the engine's slots a bound anyway."""
    slots = knobs.max_num_seqs if knobs.max_num_seqs is not None else engine_max_num_seqs
    if knobs.max_num_active_seqs is not None:
        return min(knobs.max_num_active_seqs, slots)
    return slots
