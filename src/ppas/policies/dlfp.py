"""DLFP: Decode-Latency Feedback Prefill (arXiv 2609.38386; spec related-policies.md).

Model-free. Only prefill that overlaps running decodes is restricted: with no decode
running the prefill budget is the full ``c_max`` [R]. After a *guarded* step (prefill
beside decodes, ``StepRecord.guarded``) the observed step time is proportional feedback
for the next chunk. Control law, our reading [I] (the spec gives only its form):

    c <- clamp(c_prev * target_s / T_observed, c_min, c_max)

where ``c_prev`` is the last guarded step's prefill budget and ``T_observed`` its time.
The policy is pure: the "current chunk" is recomputed from ``SchedulerView.recent_steps``
(the latest guarded step in the window); with none in the window it is ``c_init``.

Two variants [R]: ``dlfp`` times the scheduler-call interval (``StepRecord.interval_s``,
the original proxy, which lags the GPU step under asynchronous scheduling and is what
the paper blames for its failures at 8B/32B/TP=2); ``dlfp-completion`` times the step
from launch to its output (``StepRecord.duration_s``). Default parameters are ours [I]
(the abstract gives none): target 50 ms inter-token latency, chunks in [256, 16384],
starting at 2048.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ppas.core.config import check_times, require
from ppas.core.decision import Decision, budget_decision
from ppas.core.view import SchedulerView
from ppas.policies.base import Policy
from ppas.policies.registry import register


@dataclass(frozen=True)
class DlfpConfig:
    target_s: float = 0.05
    c_min: int = 256
    c_max: int = 16384
    c_init: int = 2048

    def __post_init__(self) -> None:
        check_times(self, "target_s")
        require(self.c_min >= 1, f"c_min must be >= 1, got {self.c_min}")
        require(self.c_max >= self.c_min,
                f"c_max must be >= c_min={self.c_min}, got {self.c_max}")
        require(self.c_min <= self.c_init <= self.c_max,
                f"c_init must be in [c_min, c_max], got {self.c_init}")


@register("dlfp")
class Dlfp(Policy):
    """Proportional feedback on the scheduler-call interval (``interval_s``)."""

    Config = DlfpConfig
    completion_timed: ClassVar[bool] = False
    history_window = 16

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.config.c_max)

    def decide(self, view: SchedulerView) -> Decision:
        c = self.config
        if view.num_running_decodes == 0:
            return budget_decision(c.c_max)  # no decode to protect: full budget
        return budget_decision(self.current_chunk(view))

    def current_chunk(self, view: SchedulerView) -> int:
        c = self.config
        steps = view.recent_steps
        for i in range(len(steps) - 1, -1, -1):
            s = steps[i]
            if s.guarded:
                t = s.duration_s if self.completion_timed else s.interval_s
                prev = min(max(s.prefill_budget, c.c_min), c.c_max)
                if t <= 0:
                    return c.c_max
                return int(min(c.c_max, max(c.c_min, prev * c.target_s / t)))
        return c.c_init


@register("dlfp-completion")
class DlfpCompletion(Dlfp):
    """Proportional feedback on the completion-timed step (``duration_s``)."""

    completion_timed = True
