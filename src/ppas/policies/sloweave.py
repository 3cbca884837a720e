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

Chunk runs (``chunk_rule``, ``ppas.engine.simulator``): while the running requests are
decodes that all sampled their last token at ``now`` and one prompt P, ``min_i d_i`` is
``now + min_i D_i`` (rounding is monotone), so the rule reads the running requests once
(the queue not at all) and each step then costs only its search over the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppas.core.config import check_times, require
from ppas.core.decision import Decision, budget_decision
from ppas.core.view import SchedulerView
from ppas.cost.base import largest_chunk_within
from ppas.policies.base import ChunkRule, Policy, last_prefill_token_time
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


_NO_RUN: tuple[int, int, tuple[str, int] | None] = (0, 0, None)


@register("sloweave")
class SloWeave(Policy):
    Config = SloWeaveConfig
    history_window = 16
    #: The last step's chunk, the next search's guess (any value gives the same chunk:
    #: ``largest_chunk_within``); set per instance once it decides.
    _last = 0
    #: The two chunks before ``_last`` in a chunk run, in order (``chunk_rule``'s guess
    #: extrapolates; 0: none), and the run's P and number of decodes.
    _before: tuple[int, int, tuple[str, int] | None] = (0, 0, None)

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
            self._before = _NO_RUN
            return budget_decision(c)
        per_token = last_prefill_token_time(view.recent_steps)  # (no chunk_rule for this)
        if per_token is not None:
            return Decision(max(0, min(limit, int(budget / per_token) - n_dec)))
        return budget_decision(min(limit, cfg.c_max))

    def chunk_rule(self, view: SchedulerView) -> ChunkRule | None:
        """``decide``'s budget while only ``now``, P's computed tokens and the decodes'
        change (``Policy.chunk_rule``): with every decode's last token at ``now`` the
        deadline is ``now + D`` for ``D`` the least of their TPOTs (``fl(now + D_i)`` is
        monotone in ``D_i``) and the head is P. ``L_t`` is P's prompt left plus the queue
        behind it; the rule counts P's alone: the chunks that fit are a prefix (step time
        is monotone in the chunk), so the search under ``min(c_max, P's left)`` finds the
        same chunk when it is short of P's left, and P's left otherwise, as ``decide``
        then finds at least that: the contract's terms. The queue is not read. None
        without a cost model (the fallback reads ``recent_steps``) or with no decode
        running."""
        cfg = self.config
        cm = self.cost_model
        if cm is None or view.num_running_decodes == 0:
            return None
        c_max, tpot_s, margin = cfg.c_max, cfg.tpot_s, cfg.margin_s
        d_min = float("inf")
        n_dec = 0
        head = None
        for r in view.requests:
            if not r.is_running:
                break  # (the waiting requests, after the running ones)
            if r.num_computed_tokens < r.prompt_tokens:
                if head is not None:
                    return None  # (two prompts running: not a chunk run's view)
                head = r
            else:
                n_dec += 1
                d = r.tpot_slo or tpot_s
                if d < d_min:
                    d_min = d
        if head is None:
            return None
        prompt = head.prompt_tokens
        # largest_chunk_within's search, checked once, with its chunk's price
        search = cm.priced_chunk_search()
        # the search's guess (any guess gives the same chunk): the last chunk plus half
        # its change over the two steps before (floored), plus one: 2 prices when the
        # chunk is the guess or one less, 2.3 a step on average after a run's first on
        # Mooncake x3, where the chunk shrinks a little every step as the contexts grow.
        # From the last run's end when P and the decodes are the same (``_before``).
        last, before = self._last, self._before
        key = (head.request_id, n_dec)
        own = before[2] == key  # last: this P's beside these decodes
        b2, b1 = (before[0], before[1]) if own else (0, 0)

        def rule(now: float, prefill_ctx: int, decode_ctx: int) -> tuple[int, float]:
            nonlocal last, b2, b1, own
            # decide's arithmetic, in its order, on this view's constants
            x = (now + d_min) - now
            budget = (x if x > 0.0 else 0.0) - margin  # (max(0.0, x): the same float)
            if budget <= 0:
                return 0, 0.0
            left = prompt - prefill_ctx
            limit = c_max if c_max < left else left
            guess = last + 1 + ((last - b2) // 2 if b2 else last - b1 if b1 else 0)
            # largest_chunk_within(cm, budget, n_dec, limit, decode_ctx // n_dec,
            # prefill_ctx, guess), the cost model's search taken once a run, and the price
            # of its chunk beside the decodes' exact context (Policy.chunk_rule's)
            found = search(prefill_ctx, n_dec, decode_ctx // n_dec * n_dec, budget, limit,
                           guess if guess < limit else limit, decode_ctx)
            c = found[0]
            if c == left:
                # P's prompt end: the engine takes this step singly (decide), and P's
                # tail is a far guess for decide's search, the last chunk a near one
                return found
            b2, b1 = b1, (last if own else 0)
            self._before = (b2, b1, key)
            own = True
            last = self._last = c
            return found

        return rule
