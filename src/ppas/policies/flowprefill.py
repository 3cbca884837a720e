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
from ppas.core.view import RequestView, SchedulerView, pending_prefills, uncached_prompt_tokens
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


def listed(view: SchedulerView, order: list[RequestView], budget: int) -> tuple[str, ...]:
    """The ids of ``order`` (every pending prompt, in the policy's order) that a step with
    prefill budget ``budget`` can serve: every running one, and the waiting ones up to the
    last the engine could admit. The engine serves the running prompts first, then admits
    from the head of its waiting queue, the listed ones first, each taking at least one
    token of what the running ones leave of the budget (``L``; its uncached prompt where
    no prefix cache can grow within the step: ``SchedulerView.waiting_log`` and
    ``prefix_caching``), and no more
    than ``max_num_seqs`` less the running requests. So it never reaches an unlisted one,
    and the step is the one the whole order gives; the next step lists its head again
    (ties in the policy's key keep the queue's relative order either way). O(running +
    listed) for the engine, whatever waits."""
    n_running = left = 0
    for r in view.requests:
        if not r.is_running:
            break
        n_running += 1
        left += max(0, r.prompt_tokens - r.num_computed_tokens)
    room = budget - left  # L
    slots = view.max_num_seqs - n_running
    # no prefix cache in an engine that says so: a waiting prompt needs its uncached
    exact = view.waiting_log is not None and not view.prefix_caching
    out: list[str] = []
    for r in order:
        if r.is_running:
            out.append(r.request_id)
        elif room > 0 and slots > 0:
            out.append(r.request_id)
            room -= uncached_prompt_tokens(r) if exact else 1
            slots -= 1
    return tuple(out)


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
        return Decision(cfg.batch_tokens, listed(view, pending, cfg.batch_tokens))

    def _remaining_time(self, view: SchedulerView) -> Callable[[RequestView], float]:
        costs, c = self.costs, self.config.batch_tokens
        if costs is not None:
            return lambda r: costs.prefill_time(c, r.num_computed_tokens, r.prompt_tokens)
        per_tok = last_prefill_token_time(view.recent_steps) or 0.0
        return lambda r: per_tok * (r.prompt_tokens - r.num_computed_tokens)
