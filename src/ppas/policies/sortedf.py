"""Sorted-F: KV-budgeted batching for an offline backlog (arXiv 2508.06133).

Spec related-policies.md [R abstract]. Model: n requests at time 0; request i needs
``s_i`` KV units for its prompt and one more per generated token, up to ``o_i`` outputs;
the requests in a batch may never hold more than the budget ``M``; objective: the sum of
completion times. NP-hard; FCFS and (memory-constrained) shortest-first can be
arbitrarily bad; Sorted-F repeatedly forms the feasible batch minimising the F-metric and
has a constant-factor guarantee (paper: up to ~30% lower mean latency than FCFS / MC-SF).

Our reading [I], kept replaceable (``metric``):

* ``metric=f``: ``F(X) = sum_{i in X} o_i / |X|^2`` (mean output over batch size: a batch
  is worth its size, costs its outputs). The paper's definition could not be checked
  from here (no access to the paper); this is the spec's stated form.
* Batch formation, per step (a stateless policy): the current batch is the running
  requests with their *remaining* outputs; waiting requests are taken in ascending
  ``o_i`` ("sorted"), skipping any whose footprint ``s_i + o_i`` (whole blocks) does not
  fit beside the batch's, while adding the next one does not raise F. On an idle engine
  this forms exactly the sorted prefix that minimises F among prefixes; later it tops
  the batch up as requests finish.
* ``metric=none``: add every sorted request that fits: memory-constrained
  shortest-first (MC-SF), the paper's baseline.

The budget check uses whole footprints, so the engine never preempts: peak KV of the
admitted set <= M. ``kv_tokens`` None = the bound cost model's KV capacity (unbounded if
it has none). ``o_i`` is ``max_output_tokens`` (the offline model knows output lengths).
"""

from __future__ import annotations

from dataclasses import dataclass

from ppas.core.config import require
from ppas.core.decision import Decision
from ppas.core.view import BLOCK_SIZE, RequestView, SchedulerView, uncached_prompt_tokens
from ppas.cost.base import CostModel
from ppas.policies.base import Policy
from ppas.policies.registry import register

METRICS = ("f", "none")


@dataclass(frozen=True)
class SortedFConfig:
    budget: int = 8192  # the engine's max_num_batched_tokens
    kv_tokens: int | None = None  # M; None = the cost model's KV capacity
    metric: str = "f"

    def __post_init__(self) -> None:
        require(self.budget >= 1, f"budget must be >= 1, got {self.budget}")
        require(self.kv_tokens is None or self.kv_tokens >= 1,
                f"kv_tokens must be >= 1, got {self.kv_tokens}")
        require(self.metric in METRICS,
                f"unknown metric {self.metric!r}; allowed: {', '.join(METRICS)}")


def footprint(r: RequestView) -> int:
    """Peak KV tokens of a request (prompt + all outputs), in whole blocks."""
    n = r.prompt_tokens + r.max_output_tokens
    return -(-n // BLOCK_SIZE) * BLOCK_SIZE


def f_metric(sum_outputs: int, size: int) -> float:
    """Our reading of the F-metric: sum of outputs over the squared batch size."""
    return sum_outputs / (size * size) if size else float("inf")


@register("sorted-f")
class SortedF(Policy):
    Config = SortedFConfig

    def __init__(self, config: SortedFConfig, spec: str | None = None) -> None:
        super().__init__(config, spec)
        self.kv_tokens = config.kv_tokens

    def bind_cost_model(self, cost_model: CostModel | None) -> None:
        if self.config.kv_tokens is None and cost_model is not None:
            self.kv_tokens = cost_model.kv_capacity_tokens

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.config.budget)

    def decide(self, view: SchedulerView) -> Decision:
        cfg = self.config
        cap = self.kv_tokens if self.kv_tokens is not None else 1 << 62
        room = cap
        size = total = budget = 0
        waiting: list[RequestView] = []
        for r in view.requests:
            if r.is_running:
                room -= footprint(r)
                size += 1
                total += r.max_output_tokens - r.num_output_tokens
                budget += max(0, r.prompt_tokens - r.num_computed_tokens)
            else:
                waiting.append(r)
        if not waiting:
            return Decision(cfg.budget)
        waiting.sort(key=lambda r: (r.max_output_tokens, r.arrival_time))
        order: list[str] = []
        for r in waiting:
            need = footprint(r)
            if need > room:
                if need > cap and size == 0 and not order:  # larger than M: alone (liveness)
                    order.append(r.request_id)
                    budget += uncached_prompt_tokens(r)
                    break
                continue
            o = r.max_output_tokens
            if cfg.metric == "f" and size and f_metric(total + o, size + 1) > f_metric(total, size):
                break
            order.append(r.request_id)
            room -= need
            size += 1
            total += o
            budget += uncached_prompt_tokens(r)
        return Decision(min(cfg.budget, budget), tuple(order))
