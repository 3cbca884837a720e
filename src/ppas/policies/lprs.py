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

Cost per step. The rule above scores and sorts every pending prompt (``decide_whole``,
taken where the view has no ``waiting_log`` or the policy no cost model). With both, a
waiting request's score is ``now - K`` up to rounding, ``K = arrival + rem_weight *
per_tok * remaining`` fixed while it waits (the per-token time is the cost model's), so
the waiting requests are kept between steps in a heap by ``K`` (``_ScoreIndex``); a step
scores the running prompts and the C_t smallest ``K`` (plus any within a rounding margin
of the C_t-th), which hold the top C_t of the whole order: O(running + C_t log n) per
step, O(log n) per queue change. Equal scores go in the view's (queue) order, which the
index does not know: a step whose top C_t depends on it is decided by ``decide_whole``.
The heap's answer is kept while nobody enters or leaves the queue (``_ScoreIndex.memo``),
and the LPRS chunk is found from the last step's boundary between the chunks under the
target and those over it (``_chunk_monotone``: step time is monotone in the chunk), about
two prices a step instead of one per candidate.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice

from ppas.core.config import check_times, require
from ppas.core.decision import Decision
from ppas.core.slots import builder
from ppas.core.view import RequestView, SchedulerView, is_pending_prefill, pending_prefills
from ppas.cost.base import CostModel, StepShape
from ppas.policies.base import Policy, last_prefill_token_time
from ppas.policies.candidates import candidate_chunks
from ppas.policies.registry import register
from ppas.policies.waiting import WaitingIndex

#: ``Decision(prefill_budget, prefill_order, decodes_first, chunk_limit, order_kept)``,
#: positionally (``ppas.core.slots``: the same object).
_make_decision = builder(Decision)


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
        self._index: _ScoreIndex | None = None  # the waiting queue (a cache, module doc)
        #: ``cost_model.chunk_time`` and the cost model it is of (bound once per model)
        self._timer: Callable[[int, int, int], Callable[[int], float]] | None = None
        self._timer_of: CostModel | None = None
        #: the last step's count of chunks under the target (``_chunk_monotone``'s guess)
        self._i0 = 0

    def bind_cost_model(self, cost_model: CostModel | None) -> None:
        super().bind_cost_model(cost_model)
        if cost_model is not None:
            c = self.chunks[len(self.chunks) // 2]
            self.per_token_s = cost_model.step_time(StepShape.one_chunk(c, 0)) / c

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.config.c_max)

    def decide(self, view: SchedulerView) -> Decision:
        log = view.waiting_log
        cm = self.cost_model
        if log is None or cm is None:
            return self.decide_whole(view)
        cfg = self.config
        w, per_tok = cfg.rem_weight, self.per_token_s
        idx = self._index
        if idx is None or idx.weight != w * per_tok:
            idx = self._index = _ScoreIndex(w * per_tok)
        n_running = idx.sync(view, log)
        if idx.unsafe:
            return self.decide_whole(view)
        # one pass over the running requests: the prompts, and the decodes' context
        prompts: list[RequestView] = []
        dctx = 0
        for r in islice(view.requests, n_running):  # (no slice of the view: its iterator)
            c = r.num_computed_tokens
            if c < r.prompt_tokens:
                prompts.append(r)
            else:
                dctx += c
        if not prompts and not idx.live:
            return Decision(cfg.c_max)
        n_dec = view.num_running_decodes
        timer = self._timer
        if timer is None or self._timer_of is not cm:
            timer = self._timer = cm.chunk_time
            self._timer_of = cm
        # (_predictor's T: chunk_time(0, n_dec, dctx), the same function)
        best_c = self._chunk_monotone(timer(0, n_dec, dctx))
        c_t = min(cfg.max_concurrent, view.max_num_seqs - n_dec,
                  (view.max_num_batched_tokens - n_dec) // cfg.l_min)
        if c_t < 1:
            for r in prompts:
                if 0 < r.num_computed_tokens:
                    return Decision(0)
            c_t, best_c = 1, cfg.l_min
        # The top c_t by score, running prompts first among equals (the view's order).
        now = view.now
        wp = w * per_tok  # (w * per_tok * x is (w * per_tok) * x: the same float)
        ranked: list[tuple[float, int, RequestView]] = [
            (-((now - r.arrival_time) - wp * (r.prompt_tokens - r.num_computed_tokens)),
             j, r) for j, r in enumerate(prompts)]
        waiting = len(prompts)  # ranked[j] for j >= waiting: waiting requests
        try:
            for k, r in idx.smallest(c_t, now):
                ranked.append((-((now - r.arrival_time) - k), len(ranked), r))
        finally:
            if idx.taken:  # (none when the answer was the memo's)
                idx.restore()
        ranked.sort()
        top = ranked[:c_t]
        last = len(ranked) - 1
        for j, (s, i, _) in enumerate(top):  # equal waiting scores: the queue's order
            if i >= waiting and (
                    (j and ranked[j - 1][0] == s and ranked[j - 1][1] >= waiting)
                    or (j < last and ranked[j + 1][0] == s and ranked[j + 1][1] >= waiting)):
                return self.decide_whole(view)
        room = 0
        for _, _, r in top:
            room += r.prompt_tokens - r.num_computed_tokens
        # Decision(budget, order), built without the frozen dataclass's __init__
        return _make_decision(best_c if best_c < room else room,
                              tuple([r.request_id for _, _, r in top]), False, 0, 0)

    def _chunk(self, step_t: Callable[[int], float]) -> int:
        """LPRS: the chunk with the smallest asymmetric penalty around the target (ties to
        the larger)."""
        cfg = self.config
        best_c, best_pen = self.chunks[0], float("inf")
        for c in self.chunks:
            t = step_t(c)
            pen = cfg.under_w * (cfg.target_s - t) if t < cfg.target_s else cfg.over_w * (
                t - cfg.target_s)
            if pen <= best_pen:
                best_c, best_pen = c, pen
        return best_c

    def _chunk_monotone(self, step_t: Callable[[int], float]) -> int:
        """``_chunk`` for a step time monotone in the chunk (a cost model's, as
        ``largest_chunk_within`` assumes; ``tests/test_roofline.py``), from fewer prices.
        The chunks under the target are then a prefix, ``chunks[:i0]``, over which the
        penalty does not rise, and it does not fall over the rest, so the scan's pick (the
        last chunk of least penalty) is ``chunks[i0 - 1]`` or, when ``chunks[i0]``'s
        penalty is no larger, the last of the chunks from ``i0`` with ``chunks[i0]``'s
        penalty. ``i0`` is searched from the last step's (``_i0``): it moves little."""
        cfg = self.config
        chunks, target, under_w, over_w = self.chunks, cfg.target_s, cfg.under_w, cfg.over_w
        n = len(chunks)
        i = self._i0
        t_lo = t_hi = 0.0  # the times of chunks[i0 - 1] (< target) and chunks[i0] (>= it)
        up = False
        if i < n:
            t = step_t(chunks[i])
            if t < target:  # i0 > i: up while under the target
                up = True
                t_lo = t
                i += 1
                while i < n:
                    t = step_t(chunks[i])
                    if not t < target:
                        t_hi = t
                        break
                    t_lo = t
                    i += 1
            else:
                t_hi = t
        if not up:  # i0 <= i: down while the chunk below is not under it
            while i:
                t = step_t(chunks[i - 1])
                if t < target:
                    t_lo = t
                    break
                t_hi = t
                i -= 1
        self._i0 = i
        if i == n:
            return chunks[-1]  # (every chunk under the target: the penalty only falls)
        pen = over_w * (t_hi - target)
        if i and under_w * (target - t_lo) < pen:
            return chunks[i - 1]
        j = i + 1
        while j < n and over_w * (step_t(chunks[j]) - target) <= pen:
            j += 1
        return chunks[j - 1]

    def decide_whole(self, view: SchedulerView) -> Decision:
        """The rule as stated (module doc): every pending prompt scored and sorted."""
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
        best_c = self._chunk(step_t)
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
        if cm is not None:  # (chunk_time: step_time of one_chunk(c, 0, n_dec, dctx), exactly)
            return cm.chunk_time(0, n_dec, dctx), self.per_token_s
        per_tok = last_prefill_token_time(view.recent_steps) or 0.0
        return (lambda c: per_tok * (c + n_dec)), per_tok


class _ScoreIndex(WaitingIndex):
    """The waiting requests in a heap by ``K = arrival + weight * remaining`` (``weight``:
    rem_weight times the per-token time; the product ``weight * remaining`` computed as
    the score computes it), entries dropped lazily (one counts while its ``gen`` is its
    request's live one). ``live``: id -> (gen, weight * remaining). ``unsafe``: live
    requests for which ``K`` does not bound the score as ``smallest`` needs (a negative
    arrival or term, or not finite): then the caller reads the whole queue."""

    def __init__(self, weight: float) -> None:
        super().__init__()
        self.weight = weight
        self.heap: list[tuple[float, str, int, RequestView]] = []  # (K, id, gen, request)
        self.gen = 0
        self.unsafe = 0
        self.taken: list[tuple[float, str, int, RequestView]] = []
        #: ``smallest``'s last answer, while no request entered or left: (n, |now|, the K
        #: of the first entry it left on the heap (None: it emptied the heap), the n-th
        #: K, the answer). The same live entries in the same heap order give the same
        #: answer at a ``now`` whose margin still leaves that first entry out and keeps in
        #: those it took (the margin grows with ``|now|``).
        self.memo: tuple[int, float, float | None, float, list[tuple[float, RequestView]]] \
            | None = None

    def add(self, r: RequestView) -> None:
        self.memo = None
        rid, arrival = r.request_id, r.arrival_time
        if rid in self.live:
            self.discard(r)
        x = self.weight * (r.prompt_tokens - r.num_computed_tokens)
        k = arrival + x
        self.gen = gen = self.gen + 1
        bad = not (arrival >= 0 and x >= 0 and math.isfinite(k))
        self.unsafe += bad
        self.live[rid] = (gen, x, bad)
        heapq.heappush(self.heap, (k, rid, gen, r))

    def discard(self, r: RequestView) -> None:
        self.memo = None
        e = self.live.pop(r.request_id, None)
        if e is not None:
            self.unsafe -= e[2]

    def clear(self) -> None:
        super().clear()
        self.memo = None
        self.heap.clear()
        self.unsafe = 0

    def compact(self) -> None:
        if len(self.heap) > 2 * len(self.live) + 256:
            live = self.live
            self.heap = [h for h in self.heap if live.get(h[1], (0,))[0] == h[2]]
            heapq.heapify(self.heap)

    def smallest(self, n: int, now: float) -> list[tuple[float, RequestView]]:
        """``(weight * remaining, request)`` of the ``n`` live requests of smallest ``K``
        and of every one whose ``K`` is within the rounding margin of the n-th's: every
        other scores strictly below all of them (``score = (now - arrival) - weight *
        remaining`` is ``now - K`` within ``4 * 2**-53 * (|now| + K)``, arrival and term
        being >= 0; the margin is far above). Taken off the heap: ``restore``."""
        memo = self.memo
        if memo is not None and memo[0] == n and abs(now) >= memo[1]:
            k = memo[2]  # (the loop below would stop there again, or empty the heap)
            if k is None or k - memo[3] > 1e-9 * (1.0 + abs(now) + abs(k)):
                return memo[4]
        heap, live, taken, pop = self.heap, self.live, self.taken, heapq.heappop
        out: list[tuple[float, RequestView]] = []
        kn = math.inf
        first_left: float | None = None
        while heap:
            k, rid, gen, r = heap[0]
            e = live.get(rid)
            if e is None or e[0] != gen:
                pop(heap)  # stale: dropped
                continue
            if len(out) >= n and k - kn > 1e-9 * (1.0 + abs(now) + abs(k)):
                first_left = k
                break
            taken.append(pop(heap))
            out.append((e[1], r))
            if len(out) == n:
                kn = k
        self.memo = (n, abs(now), first_left, kn, out)
        return out

    def restore(self) -> None:
        for h in self.taken:
            heapq.heappush(self.heap, h)
        self.taken.clear()
