"""The cost-model interface: ``step_time(step) -> seconds`` for one engine step.

A ``StepShape`` is the token-budget view of one step reduced to what any cost model
needs: how many prefill tokens run on top of how much cached context, how many decodes
with how much context. Engines build it incrementally (O(1) per scheduled request).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from ppas.core.slots import builder


def causal_pairs(chunk: int, context: int) -> float:
    """Causal query-key pairs of a prefill chunk of ``chunk`` tokens on ``context`` cached
    tokens: token i of the chunk (1-based) attends to the context and to tokens 1..i, so
    ``chunk * (context + (chunk + 1) / 2)``. The one place this sum is written."""
    return chunk * (context + (chunk + 1) / 2)


@dataclass(frozen=True, slots=True)
class StepShape:
    """One step. For prefill chunk i of c_i tokens on top of p_i cached tokens and decode
    j with context k_j (tokens already in its KV cache):

    num_prefill_tokens = sum c_i            num_prefill_reqs = number of chunks
    prefill_attn_work  = sum c_i (p_i + (c_i + 1) / 2)   (``causal_pairs``)
    prefill_kv_tokens  = sum (p_i + c_i)   (KV read by the chunks' attention)
    num_decodes        = number of decodes  decode_ctx_tokens = sum k_j
    """

    num_prefill_tokens: int = 0
    num_prefill_reqs: int = 0
    prefill_attn_work: float = 0.0
    prefill_kv_tokens: int = 0
    num_decodes: int = 0
    decode_ctx_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decodes

    @staticmethod
    def of(chunks: list[tuple[int, int]], decode_contexts: list[int]) -> StepShape:
        """Build from explicit (chunk, cached_context) pairs and decode contexts."""
        return StepShape(
            num_prefill_tokens=sum(c for c, _ in chunks),
            num_prefill_reqs=len(chunks),
            prefill_attn_work=sum(causal_pairs(c, p) for c, p in chunks),
            prefill_kv_tokens=sum(p + c for c, p in chunks),
            num_decodes=len(decode_contexts),
            decode_ctx_tokens=sum(decode_contexts),
        )

    @staticmethod
    def one_chunk(chunk: int, context: int = 0, num_decodes: int = 0,
                  decode_ctx_tokens: int = 0) -> StepShape:
        """One prefill chunk of ``chunk`` tokens on ``context`` cached tokens, beside
        ``num_decodes`` decodes with ``decode_ctx_tokens`` context in all; ``chunk = 0`` is
        the decode-only step."""
        return StepShape(chunk, 1 if chunk else 0, causal_pairs(chunk, context),
                         context + chunk if chunk else 0, num_decodes, decode_ctx_tokens)


#: ``StepShape(*fields)``, positionally, without the frozen ``__init__`` (engines price
#: one per step: ``ppas.core.slots``).
make_shape = builder(StepShape)


class CostModel(ABC):
    """Predicts the wall time of one engine step."""

    #: KV-cache capacity in tokens that this model/hardware pair leaves after weights,
    #: or None when unknown (engines then use their own configured capacity).
    kv_capacity_tokens: int | None = None

    @abstractmethod
    def step_time(self, step: StepShape) -> float:
        """Seconds for one step (> 0 for any non-empty step)."""

    def with_kv_capacity(self, tokens: int) -> CostModel:
        """This model with an engine's own KV cache (``tokens``) as its capacity: the same
        step times, a shallow copy (an engine configured with fewer blocks than the GPU
        leaves, e.g. ``ppas simulate --num-kv-blocks``, shows its policy that cache)."""
        other = copy.copy(self)
        object.__setattr__(other, "kv_capacity_tokens", tokens)  # (frozen dataclasses too)
        return other

    def decode_steps(self, num_decodes: int, decode_ctx_tokens: int, max_steps: int,
                     start: float, limit: float) -> list[float]:
        """Durations of consecutive decode-only steps (``num_decodes`` decodes whose
        context grows by ``num_decodes`` tokens a step, from ``decode_ctx_tokens``), the
        first starting at ``start``: at most ``max_steps``, none starting at or after
        ``limit``. Each equals ``step_time`` of that step exactly (engines rely on it);
        subclasses may override with a faster loop that keeps that equality."""
        out: list[float] = []
        t, ctx, st = start, decode_ctx_tokens, self.step_time
        while len(out) < max_steps and t < limit:
            dt = st(StepShape(0, 0, 0.0, 0, num_decodes, ctx))
            out.append(dt)
            t += dt
            ctx += num_decodes
        return out

    def pricer(self) -> Callable[[int, int, float, int, int, int], float]:
        """``f(*fields) == step_time(StepShape(*fields))`` (the fields positionally, in
        declaration order), for engines that price a step from their tally without building
        a shape (``ppas.engine.simulator``). Each call equals that ``step_time`` exactly;
        subclasses may return a faster function that keeps the equality."""
        st = self.step_time
        return lambda *fields: st(make_shape(*fields))

    def chunk_time(self, prefill_ctx: int, num_decodes: int,
                   decode_ctx_tokens: int) -> Callable[[int], float]:
        """``c -> step_time(StepShape.one_chunk(c, prefill_ctx, num_decodes,
        decode_ctx_tokens))``: the time of one chunk of ``c`` tokens beside fixed decodes,
        for searches that price many chunk sizes (``largest_chunk_within``,
        ``ppas.policies.deflection.ladder_chunk``). Each call equals that ``step_time``
        exactly; subclasses may override with a faster function that keeps the equality."""
        st, one = self.step_time, StepShape.one_chunk
        return lambda c: st(one(c, prefill_ctx, num_decodes, decode_ctx_tokens))

    def chunk_pricer(self) -> Callable[[int, int, int, int], float]:
        """``(c, p, nd, k) -> chunk_time(p, nd, k)(c)`` exactly, ``c >= 1``, for a caller
        that prices one chunk at a time (a chunk run's steps, ``ppas.engine.simulator``);
        subclasses may return a faster function that keeps the equality."""
        chunk_time = self.chunk_time
        return lambda c, p, nd, k: chunk_time(p, nd, k)(c)

    def chunk_search(self) -> Callable[[int, int, int, float, int, int], int]:
        """``(p, nd, k, target_s, c_max, guess) -> largest_fitting(chunk_time(p, nd, k),
        target_s, c_max, guess)`` exactly, for callers that search once a step
        (``largest_chunk_within``; a chunk run's rule, ``ppas.policies.sloweave``);
        subclasses may return a faster function that keeps the equality (the same chunks
        priced, in the same order)."""
        chunk_time = self.chunk_time
        return lambda p, nd, k, target_s, c_max, guess: largest_fitting(
            chunk_time(p, nd, k), target_s, c_max, guess)

    def priced_chunk_search(
            self) -> Callable[[int, int, int, float, int, int, int], tuple[int, float]]:
        """``(p, nd, k, target_s, c_max, guess, k_step) -> (c, price)``: ``c`` is
        ``chunk_search()(p, nd, k, target_s, c_max, guess)`` and ``price`` is
        ``chunk_pricer()(c, p, nd, k_step)`` (0.0 when ``c`` is 0), exactly, for a caller
        that steps with the chunk it searched for (a chunk run's rule,
        ``ppas.policies.sloweave``: the engine then does not price that step again);
        subclasses may return a faster function that keeps the equality."""
        search, price = self.chunk_search(), self.chunk_pricer()

        def priced(p: int, nd: int, k: int, target_s: float, c_max: int, guess: int,
                   k_step: int) -> tuple[int, float]:
            c = search(p, nd, k, target_s, c_max, guess)
            return c, (price(c, p, nd, k_step) if c else 0.0)

        return priced

    def prefill_time(self, prompt_tokens: int, chunk: int, context: int = 0) -> float:
        """Time to prefill ``prompt_tokens`` alone in chunks of ``chunk`` tokens, starting
        from ``context`` cached tokens (no decodes alongside)."""
        t, done = 0.0, context
        end = context + prompt_tokens
        while done < end:
            c = min(chunk, end - done)
            t += self.step_time(StepShape.of([(c, done)], []))
            done += c
        return t


def largest_chunk_within(
    cost_model: CostModel,
    target_s: float,
    num_decodes: int,
    c_max: int,
    decode_ctx: int = 0,
    prefill_ctx: int = 0,
    guess: int = 0,
) -> int:
    """Largest prefill chunk c in [0, c_max] with step_time(decodes + chunk c) <= target,
    by binary search (step time is monotone in c; ``tests/test_roofline.py``). Returns 0
    when none fits. ``guess`` (a caller's last answer, 0: none): the search brackets the
    answer from it, doubling its step up while chunks fit or down until one fits, then
    bisects the bracket. The chunks that fit are a prefix of [1, c_max] (monotone), so
    every bracketing ends at the same c as the search from [1, c_max]: 2 prices when the
    guess is the answer, O(log distance) otherwise."""
    return cost_model.chunk_search()(prefill_ctx, num_decodes, decode_ctx * num_decodes,
                                     target_s, c_max, guess)


def largest_fitting(t: Callable[[int], float], target_s: float, c_max: int,
                    guess: int = 0) -> int:
    """``largest_chunk_within``'s search on a chunk's step time ``t`` (``CostModel
    .chunk_time``, monotone): the largest c in [0, c_max] with ``t(c) <= target_s``, from
    ``guess`` (0: none). Its probes (``CostModel.chunk_search`` repeats them, in order):
    the guess, then c_max's side or 1's by doubling steps, then bisection; or, without a
    guess, 1, c_max, then bisection. Every probe is in [1, c_max]."""
    if 0 < guess <= c_max:
        if t(guess) <= target_s:  # the answer is at or above the guess
            lo, step = guess, 1
            while True:
                hi = lo + step
                if hi > c_max:
                    hi = c_max  # min(c_max, lo + step)
                if hi == lo:
                    return lo  # c_max fits
                if t(hi) > target_s:
                    break
                lo, step = hi, step * 2
        else:  # below it
            hi, step = guess, 1
            while True:
                lo = hi - step
                if lo < 1:
                    lo = 1  # max(1, hi - step)
                if t(lo) <= target_s:
                    break
                if lo == 1:
                    return 0
                hi, step = lo, step * 2
    else:
        if t(1) > target_s:
            return 0
        lo, hi = 1, c_max
        if t(hi) <= target_s:
            return hi
    while hi - lo > 1:  # t(lo) fits, t(hi) does not
        mid = (lo + hi) // 2
        if t(mid) <= target_s:
            lo = mid
        else:
            hi = mid
    return lo
