"""LPRS + APC: fairness-aware, latency-controllable chunked prefill (arXiv 2606.09061).

Spec related-policies.md [R abstract + code]. Per step:

* LPRS (latency-predictive chunk): among candidate chunks (powers of two in
  [l_min, c_max]) pick the one whose predicted step time ``T(n_decodes, c)`` best meets
  ``target_s`` under asymmetric penalties, ``under_w * (target - T)`` when under-filled,
  ``over_w * (T - target)`` when over; ties go to the larger chunk.
* APC (adaptive prefill concurrency): at most
  ``C_t = min(C_max, S_max - |decodes|, floor((T_max - N_t) / L_min))`` prefills are
  active, with T_max the global token budget and N_t the decode tokens already in the
  step; when C_t < 1 and no prefill is active one is still forced in at ``l_min`` tokens.
* Aging priority, our reading [I]: ``score = waited_s - rem_weight * remaining_s``,
  remaining_s the request's remaining prefill at the cost model's per-token prefill time;
  prefills are served in descending score and only the top C_t get the budget
  (``prefill_budget <= their remaining tokens``).

Defaults [I]: target 100 ms (the paper's example), under_w 1, over_w 4, C_max 4,
l_min 256, c_max 8192. Without a cost model, T is the last prefill step's per-token time
times the step's tokens (from ``recent_steps``), and remaining_s uses the same rate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ppas.core.config import check_times, require
from ppas.core.decision import Decision
from ppas.core.view import RequestView, SchedulerView, is_pending_prefill, pending_prefills
from ppas.cost.base import CostModel, StepShape
from ppas.policies.base import Policy, last_prefill_token_time
from ppas.policies.candidates import candidate_chunks
from ppas.policies.registry import register


@dataclass(frozen=True)
class LprsApcConfig:
    target_s: float = 0.1
    under_w: float = 1.0
    over_w: float = 4.0
    max_concurrent: int = 4
    l_min: int = 256
    c_max: int = 8192
    rem_weight: float = 1.0

    def __post_init__(self) -> None:
        check_times(self, "target_s")
        require(self.under_w >= 0 and self.over_w >= 0, "penalties must be >= 0")
        require(self.max_concurrent >= 1,
                f"max_concurrent must be >= 1, got {self.max_concurrent}")
        require(self.l_min >= 1, f"l_min must be >= 1, got {self.l_min}")
        require(self.c_max >= self.l_min,
                f"c_max must be >= l_min={self.l_min}, got {self.c_max}")
        require(self.rem_weight >= 0, "rem_weight must be >= 0")


@register("lprs-apc")
class LprsApc(Policy):
    Config = LprsApcConfig
    history_window = 16

    def __init__(self, config: LprsApcConfig, spec: str | None = None) -> None:
        super().__init__(config, spec)
        self.chunks = candidate_chunks(config.l_min, config.c_max)
        self.per_token_s = 0.0  # prefill seconds per token, for the aging score

    def bind_cost_model(self, cost_model: CostModel | None) -> None:
        super().bind_cost_model(cost_model)
        if cost_model is not None:
            c = self.chunks[len(self.chunks) // 2]
            self.per_token_s = cost_model.step_time(StepShape.one_chunk(c, 0)) / c

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.config.c_max)

    def decide(self, view: SchedulerView) -> Decision:
        cfg = self.config
        pending = pending_prefills(view)
        if not pending:
            return Decision(cfg.c_max)
        n_dec = view.num_running_decodes
        dctx = 0
        for r in view.requests:
            if not is_pending_prefill(r):
                dctx += r.num_computed_tokens
        step_t, per_tok = self._predictor(view, n_dec, dctx)
        # LPRS: chunk with the smallest asymmetric penalty around the target.
        best_c, best_pen = self.chunks[0], float("inf")
        for c in self.chunks:
            t = step_t(c)
            pen = cfg.under_w * (cfg.target_s - t) if t < cfg.target_s else cfg.over_w * (
                t - cfg.target_s)
            if pen <= best_pen:
                best_c, best_pen = c, pen
        # APC: cap on concurrently active prefills.
        c_t = min(cfg.max_concurrent, view.max_num_seqs - n_dec,
                  (view.max_num_batched_tokens - n_dec) // cfg.l_min)
        active = any(r.is_running and 0 < r.num_computed_tokens for r in pending)
        if c_t < 1:
            if active:
                return Decision(0)
            c_t, best_c = 1, cfg.l_min
        # Aging priority: waited time against remaining prefill time.
        now, w = view.now, cfg.rem_weight

        def score(r: RequestView) -> float:
            return (now - r.arrival_time) - w * per_tok * (r.prompt_tokens - r.num_computed_tokens)

        pending.sort(key=score, reverse=True)
        top = pending[:c_t]
        room = sum(r.prompt_tokens - r.num_computed_tokens for r in top)
        return Decision(min(best_c, room), tuple(r.request_id for r in top))

    def _predictor(self, view: SchedulerView, n_dec: int,
                   dctx: int) -> tuple[Callable[[int], float], float]:
        """(T(c), prefill seconds per token) from the cost model or the last step."""
        cm = self.cost_model
        if cm is not None:
            st = cm.step_time
            return (lambda c: st(StepShape.one_chunk(c, 0, n_dec, dctx))), self.per_token_s
        per_tok = last_prefill_token_time(view.recent_steps) or 0.0
        return (lambda c: per_tok * (c + n_dec)), per_tok
