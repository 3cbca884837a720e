"""SLOWeave: deadline-aware chunk size (arXiv 2609.07883; spec related-policies.md).

Rule [R abstract, detail from secondary notes]: decode i's next-token deadline is
``d_i = last_token_time_i + D`` (D = its TPOT SLO, else ``tpot_s``; a decode whose
last token time is unknown, as in the vLLM plugin today, gets ``d_i = now + D``). The step's time
budget is ``B_t = max(0, min_i d_i - now)`` and the chunk is

    c* = max{c <= min(C_max, L_t) : T(n_decodes, c) + margin <= B_t}

with ``L_t`` the prefill tokens left, found by binary search over the cost model (any
monotone T; O(log C_max) model calls, ``ppas.cost.base.largest_chunk_within``). No
decode running -> the whole remaining prompt (up to the global budget ``mbt``);
nothing fits -> a decode-only step (budget 0). Defaults: C_max = 4096, D = 25 ms (the
paper's targets are 10/25/50 ms), margin 1 ms (ours [I]).

Without a cost model (vLLM plugin with none configured) T is estimated from the last
step with prefill in ``recent_steps``: seconds per token = its completion-timed duration
over its tokens, so ``c* = (B_t - margin) / per_token - n_decodes`` (our fallback).

Cost per step: one pass over the running requests (the view lists them first), then the
waiting ones only until ``C_max`` prefill tokens are counted (``min(C_max, L_t)`` is all
that is read of ``L_t``): O(running + waiting requests read), not O(queue).
"""

from __future__ import annotations

from dataclasses import dataclass

from ppas.core.config import check_times, require
from ppas.core.decision import Decision, budget_decision
from ppas.core.view import SchedulerView
from ppas.cost.base import largest_chunk_within
from ppas.policies.base import Policy, last_prefill_token_time
from ppas.policies.registry import register


@dataclass(frozen=True)
class SloWeaveConfig:
    tpot_s: float = 0.025
    c_max: int = 4096
    margin_s: float = 0.001
    mbt: int = 32768

    def __post_init__(self) -> None:
        check_times(self, "tpot_s")
        require(self.c_max >= 1, f"c_max must be >= 1, got {self.c_max}")
        require(self.margin_s >= 0, f"margin_s must be >= 0, got {self.margin_s}")
        require(self.mbt >= self.c_max,
                f"mbt must be >= c_max={self.c_max}, got {self.mbt}")


@register("sloweave")
class SloWeave(Policy):
    Config = SloWeaveConfig
    history_window = 16
    #: The last step's chunk, the next search's guess (any value gives the same chunk:
    #: ``largest_chunk_within``); set per instance once it decides.
    _last = 0

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.config.mbt)

    def decide(self, view: SchedulerView) -> Decision:
        cfg = self.config
        if view.num_running_decodes == 0:
            return budget_decision(cfg.mbt)  # no decode: the whole remaining prompt
        deadline = float("inf")
        dctx = n_dec = left = 0
        head_ctx = -1
        c_max, tpot_s, now = cfg.c_max, cfg.tpot_s, view.now
        for r in view.requests:
            c = r.num_computed_tokens
            running = r.is_running
            if not running or c < r.prompt_tokens:  # is_pending_prefill(r), inlined
                left += r.prompt_tokens - c
                if head_ctx < 0:
                    head_ctx = c
                if not running and left >= c_max:
                    break  # past the decodes (listed first): only min(c_max, left) counts
            else:
                n_dec += 1
                dctx += c
                last = r.last_token_time
                d = (last if last is not None else now) + (r.tpot_slo or tpot_s)
                if d < deadline:
                    deadline = d
        if left == 0:
            return budget_decision(0)
        budget = max(0.0, deadline - view.now) - cfg.margin_s
        limit = min(cfg.c_max, left)
        if budget <= 0:
            return budget_decision(0)
        cm = self.cost_model
        if cm is not None:
            c = largest_chunk_within(cm, budget, n_dec, limit, dctx // max(1, n_dec),
                                     max(0, head_ctx), self._last)
            self._last = c  # (the next search's guess: the same answer, fewer prices)
            return budget_decision(c)
        per_token = last_prefill_token_time(view.recent_steps)
        if per_token is not None:
            return Decision(max(0, min(limit, int(budget / per_token) - n_dec)))
        return budget_decision(min(limit, cfg.c_max))
