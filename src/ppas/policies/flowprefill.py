"""FlowPrefill: slack-ordered EDF over TTFT SLO classes (arXiv 2602.16603; code public).

Spec related-policies.md [R]. Priority of a prefilling request:

    deadline = arrival + ttft_slo
    slack    = (deadline - now) - predicted_remaining_prefill_time
    order by sign(slack) / deadline, descending

i.e. EDF among feasible requests (slack >= 0), infeasible ones after them. Requests
without a TTFT SLO rank between the two (key 0). The order goes out as
``Decision.prefill_order``.

Preemption: FlowPrefill preempts a running prefill at the next operator/layer boundary
when a more urgent request arrives. Our engines only switch between steps, so we use the
nearest real lever (the spec's note for vLLM): under contention (two or more prefills
pending) steps carry at most ``batch_tokens`` (2048, FlowPrefill's batching cap) prefill
tokens, so a newly arrived urgent request waits at most one such step; without
contention the full ``mbt`` runs. Layer-boundary preemption is *not* modelled in the
simulator (it would need sub-step events; not done, see the issue report).

Event-driven decisions: FlowPrefill re-plans only on arrivals and completions. Our
decision is a pure function of the view, recomputed every step; between events it
changes only when a request's slack crosses zero (its predicted prefill no longer fits),
which the paper's planner would also act on at its next event. Differences are noted in
the report.

TTFT predictor: the paper fits a cubic to profiled prefill time vs length; we use the
bound cost model's prefill time in chunks of ``batch_tokens`` (tabulated at bind time).
Without a cost model, the per-token time of the last prefill step in ``recent_steps``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ppas.core.config import require
from ppas.core.decision import Decision
from ppas.core.view import RequestView, SchedulerView, pending_prefills
from ppas.cost.base import CostModel
from ppas.cost.steps import StepCosts
from ppas.policies.base import Policy, last_prefill_token_time
from ppas.policies.registry import register


@dataclass(frozen=True)
class FlowPrefillConfig:
    batch_tokens: int = 2048
    mbt: int = 16384

    def __post_init__(self) -> None:
        require(self.batch_tokens >= 1,
                f"batch_tokens must be >= 1, got {self.batch_tokens}")
        require(self.mbt >= self.batch_tokens,
                f"mbt must be >= batch_tokens={self.batch_tokens}, got {self.mbt}")


@register("flowprefill")
class FlowPrefill(Policy):
    Config = FlowPrefillConfig
    history_window = 16

    def __init__(self, config: FlowPrefillConfig, spec: str | None = None) -> None:
        super().__init__(config, spec)
        self.costs: StepCosts | None = None

    def bind_cost_model(self, cost_model: CostModel | None) -> None:
        self.costs = None if cost_model is None else StepCosts(
            cost_model, (self.config.batch_tokens,))

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.config.mbt)

    def decide(self, view: SchedulerView) -> Decision:
        cfg = self.config
        if view.num_pending_prefills <= 1:
            return Decision(cfg.mbt)
        pending = pending_prefills(view)
        now = view.now
        remaining = self._remaining_time(view)

        def key(r: RequestView) -> float:
            if r.ttft_slo is None:
                return 0.0
            deadline = r.arrival_time + r.ttft_slo
            slack = (deadline - now) - remaining(r)
            return (1.0 if slack >= 0 else -1.0) / max(deadline, 1e-9)

        pending.sort(key=key, reverse=True)
        return Decision(cfg.batch_tokens, tuple(r.request_id for r in pending))

    def _remaining_time(self, view: SchedulerView) -> Callable[[RequestView], float]:
        costs, c = self.costs, self.config.batch_tokens
        if costs is not None:
            return lambda r: costs.prefill_time(c, r.num_computed_tokens, r.prompt_tokens)
        per_tok = last_prefill_token_time(view.recent_steps) or 0.0
        return lambda r: per_tok * (r.prompt_tokens - r.num_computed_tokens)
