"""The decode-node side of prefill deflection (arXiv 2607.02043 [R abstract; detail I]).

In a disaggregated cluster, decode nodes absorb deflected prefills as chunks interleaved
with their resident decodes. The chunk is the largest of a fixed ladder
({2048, 1024, 512, 256, 128} by default) whose predicted step time, beside the node's
running decodes, keeps them within their TBT SLO (``ladder_chunk``). The cluster's
deflection decision (``ppas.cluster.deflection``) uses the same rule to predict a
deflected prompt's TTFT, so the rule exists once, here.

Our reading [I]: when no ladder chunk fits, the node still prefills with the smallest
one (a prompt already placed there must progress; such a node is not chosen for new
deflections); with no decode running, the whole remaining prompt up to ``mbt``. Without a
cost model (the vLLM plugin with none configured) it cannot predict, so it takes the
smallest chunk whenever decodes run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ppas.core.config import check_times, require
from ppas.core.decision import Decision, budget_decision
from ppas.core.view import SchedulerView
from ppas.cost.base import CostModel
from ppas.policies.base import ChunkRule, Policy
from ppas.policies.registry import register

LADDER = (2048, 1024, 512, 256, 128)


def parse_ladder(text: str) -> tuple[int, ...]:
    """``'2048/1024/512'`` -> (2048, 1024, 512), largest first."""
    try:
        vals = sorted({int(x) for x in text.split("/") if x.strip()}, reverse=True)
    except ValueError:
        vals = []
    require(bool(vals) and vals[-1] >= 1,
            f"chunk ladder {text!r}: expected positive integers separated by '/'")
    return tuple(vals)


def ladder_chunk(cost_model: CostModel, tbt_slo: float, num_decodes: int,
                 decode_ctx_tokens: int, prefill_ctx: int = 0,
                 ladder: tuple[int, ...] = LADDER, start: int = 0) -> int:
    """Largest ``c`` in ``ladder`` (sorted, largest first) with
    ``step_time(chunk c at context prefill_ctx + the decodes) <= tbt_slo``; 0 if none.

    ``start``: the index of a guess (a caller's last answer). Step time is monotone in
    the chunk (``largest_chunk_within``'s bisection assumes it too; pinned for the
    roofline by ``tests/test_roofline.py``), so the chunks that fit are the ladder's tail:
    from the guess, the search moves to larger chunks while they fit, or to smaller ones
    until one fits, and ends where the scan from the largest would (with 0, it is that
    scan)."""
    return ladder_fit(cost_model.chunk_time(prefill_ctx, num_decodes, decode_ctx_tokens),
                      tbt_slo, ladder, start)


def ladder_fit(t: Callable[[int], float], tbt_slo: float, ladder: tuple[int, ...],
               start: int = 0) -> int:
    """``ladder_chunk``'s search on ``t``, the step time as a function of the chunk."""
    if t(ladder[start]) <= tbt_slo:
        while start and t(ladder[start - 1]) <= tbt_slo:
            start -= 1
        return ladder[start]
    for c in ladder[start + 1:]:
        if t(c) <= tbt_slo:
            return c
    return 0


@dataclass(frozen=True)
class TbtLadderConfig:
    tbt_slo: float = 0.05
    chunks: str = "2048/1024/512/256/128"
    mbt: int = 4096

    def __post_init__(self) -> None:
        check_times(self, "tbt_slo")
        ladder = parse_ladder(self.chunks)
        require(self.mbt >= ladder[0], f"mbt must be >= the largest chunk "
                f"{ladder[0]}, got {self.mbt}")


@register("tbt-ladder")
class TbtLadder(Policy):
    Config = TbtLadderConfig

    def __init__(self, config: TbtLadderConfig, spec: str | None = None) -> None:
        super().__init__(config, spec)
        self.ladder = parse_ladder(config.chunks)
        self._rung = {c: i for i, c in enumerate(self.ladder)}
        self._last = 0  # the index of the last step's ladder chunk (the next search's guess)

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.config.mbt)

    def decide(self, view: SchedulerView) -> Decision:
        if view.num_running_decodes == 0:
            return budget_decision(self.config.mbt)
        if view.num_pending_prefills == 0:
            return budget_decision(0)
        cm = self.cost_model
        if cm is None:
            return budget_decision(self.ladder[-1])
        # One pass over the running requests only (the view lists them first; decodes are
        # running): O(running), whatever waits. The head prompt is the first running one
        # with prefill left, else the waiting queue's head.
        dctx, head_ctx = 0, -1
        for r in view.requests:
            c = r.num_computed_tokens
            if not r.is_running:
                if head_ctx < 0:
                    head_ctx = c
                break
            if c >= r.prompt_tokens:  # running: not is_pending_prefill(r), inlined
                dctx += c
            elif head_ctx < 0:
                head_ctx = c
        c = ladder_chunk(cm, self.config.tbt_slo, view.num_running_decodes, dctx,
                         max(0, head_ctx), self.ladder, self._last)
        if c:
            self._last = self._rung[c]
            return budget_decision(c)
        return budget_decision(self.ladder[-1])

    def chunk_rule(self, view: SchedulerView) -> ChunkRule | None:
        """``decide``'s budget while only ``now``, P's computed tokens and the decodes'
        change (``Policy.chunk_rule``): with decodes running and P pending, ``decide``
        prices the ladder beside ``num_running_decodes`` decodes whose context is the
        running decodes' computed tokens, summed, at P's context (P is the only running
        prompt, so the head); neither the clock nor the queue is read. The rule is that
        search on the same numbers: equal to ``decide`` everywhere, not only short of P's
        prompt left. None without a cost model (the smallest chunk: no run needed) or
        with no decode running."""
        cm = self.cost_model
        n_dec = view.num_running_decodes
        if cm is None or n_dec == 0:
            return None
        timer = cm.chunk_time
        slo, ladder, rung, smallest = self.config.tbt_slo, self.ladder, self._rung, \
            self.ladder[-1]

        def rule(now: float, prefill_ctx: int, decode_ctx: int) -> tuple[int, float]:
            # ladder_chunk(cm, slo, n_dec, decode_ctx, prefill_ctx, ladder, self._last)
            c = ladder_fit(timer(prefill_ctx, n_dec, decode_ctx), slo, ladder, self._last)
            if c:
                self._last = rung[c]  # (the next search's guess, as decide keeps it)
                return c, 0.0  # (unpriced: the engine prices the step)
            return smallest, 0.0

        return rule
