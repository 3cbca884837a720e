"""Cost-model tables that model-based policies precompute once in ``bind_cost_model``.

``decide`` must cost microseconds, so nothing here is called per step except table
look-ups. Everything is derived from ``CostModel.step_time`` alone, so any monotone cost
model (roofline, fitted) works.

``StepCosts`` linearises one step around the shapes that matter to prefill scheduling:

    T(step with chunk c at context p, decodes with contexts k_j)
        ~= pre[c](p) + sum_j (dec_ride + dec_kv * k_j)          (c > 0)
    T(decode-only step, decodes k_j)
        ~= dec_base + sum_j (dec_alone + dec_kv * k_j)

``pre[c]`` is tabulated per chunk ``c`` as a cumulative table ``F_c(x)`` = time to
prefill prompt tokens ``[0, x)`` alone in chunks of ``c``, on a grid of ``c`` tokens,
so the time to prefill ``[p, P)`` is ``F_c(P) - F_c(p)`` (interpolated).

``step_time`` / ``run_time`` price prefill steps from the cost model's own step time
instead (no interpolation along the prompt): a step of ``n`` prefill tokens whose chunks
make ``W`` causal query-key pairs (``sum r_i (p_i + (r_i + 1) / 2)``) costs

    S(n, W) = A(n) + beta(n) * (W - n (n + 1) / 2)

with ``A(n)`` = the step time of one ``n``-token chunk on an empty cache and ``beta(n)`` the
cost model's secant cost per pair at that token count (one ``n``-token chunk at context 0
and at ``ref_ctx``), both tabulated on a grid of ``n`` (every token up to 1024, then about
1024 points up to the largest chunk). A partial chunk is priced at its own token count,
so its fixed per-step cost (weights, launch) is counted in full; a step that finishes
one prompt and starts the next pays that cost once. Exact at the grid points for one
chunk at context 0 or ``ref_ctx``; for a cost model affine in (tokens, pairs) beyond
1024 tokens, such as ``fitted`` (whose eager-step jump at the CUDA-graph capture size lies
on the per-token grid), exact everywhere (``predictive`` uses these; ``prefill_time`` is
kept for the other users).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ppas.cost.base import CostModel, StepShape, causal_pairs

#: ``StepCosts.point_rows``: four columns, one row per budget.
Columns = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class StepCosts:
    """Precomputed, linearised step costs for a set of candidate chunk sizes."""

    def __init__(self, cost_model: CostModel, chunks: Sequence[int], max_len: int = 131072,
                 ref_ctx: int = 8192) -> None:
        self.chunks = tuple(sorted(set(int(c) for c in chunks if c > 0)))
        self.max_len = max_len
        st, shape = cost_model.step_time, StepShape.one_chunk
        # Per chunk size: cum[i] = F_c(i * c), slope[i] = seconds per token within chunk i
        # (linear interpolation inside a chunk; the last slope extends the table).
        self._cum: dict[int, list[float]] = {}
        self._slope: dict[int, list[float]] = {}
        for c in self.chunks:
            cum, slope = [0.0], []
            done = 0
            while done < max_len:
                n = min(c, max_len - done)
                t = st(shape(n, done))
                cum.append(cum[-1] + t)
                slope.append(t / n)
                done += n
            slope.append(slope[-1])
            self._cum[c] = cum
            self._slope[c] = slope
        # Marginal cost of one decode riding along a prefill chunk, and per context token.
        c0 = self.chunks[len(self.chunks) // 2] if self.chunks else 2048
        base = st(shape(c0, 0))
        n = 16
        self.dec_ride = max(0.0, (st(shape(c0, 0, n, 0)) - base) / n)
        self.dec_kv = max(0.0, (st(shape(c0, 0, n, n * ref_ctx))
                                - st(shape(c0, 0, n, 0))) / (n * ref_ctx))
        # Decode-only steps: weight-bound base plus a (small) per-decode increment.
        one = st(StepShape(0, 0, 0.0, 0, 1, 0))
        many = st(StepShape(0, 0, 0.0, 0, 64, 0))
        self.dec_alone = max(0.0, (many - one) / 63)
        self.dec_base = max(0.0, one - self.dec_alone)
        # Prefill steps by token count (module docstring): A(n) and beta(n) at every n up
        # to 1024 (small steps are the least linear: CUDA-graph sizes, waves) and then
        # every ``grid`` tokens up to the largest chunk (one point past it).
        top = self.chunks[-1] if self.chunks else 1
        fine = min(top, 1024)
        self._fine = fine
        self._grid = g = max(1, -(-(top - fine) // 1024))
        ns = [*range(1, fine + 1), *range(fine + g, top + g + 1, g)]
        self._ns = ns
        chunk_st = cost_model.chunk_pricer()  # st(shape(n, p)) exactly (CostModel.chunk_pricer)
        self._a = [chunk_st(n, 0, 0, 0) for n in ns]
        self._beta = [max(0.0, (chunk_st(n, ref_ctx, 0, 0) - a) / (n * ref_ctx))
                      for n, a in zip(ns, self._a, strict=True)]
        self.points: dict[int, tuple[float, float]] = {}  # point(n), memoised (read-only outside)
        self._floors: dict[int, tuple[float, float]] = {}  # prefill_floor(cap), memoised
        self._rows: dict[tuple[int, ...], Columns] = {}  # point_rows(budgets), memoised

    def prefill_time(self, c: int, start: int, end: int) -> float:
        """Time to prefill prompt tokens ``[start, end)`` alone in chunks of ``c`` (exact
        for chunk-aligned ranges; a partial chunk is interpolated linearly)."""
        cum, slope, m = self._cum[c], self._slope[c], self.max_len
        if end > m or start > m:
            return self._at(c, end) - self._at(c, start)
        i, r = divmod(end, c)
        j, q = divmod(start, c)
        return cum[i] + slope[i] * r - cum[j] - slope[j] * q

    def _point(self, n: int) -> tuple[float, float]:
        """(A(n), beta(n)), linear between grid points (the last segment extended)."""
        ns, fine = self._ns, self._fine
        if n <= fine:
            i = n - 1 if n > 1 else 0
            if i >= len(ns) - 1:
                i = len(ns) - 2
        else:
            i = min(fine - 1 + (n - fine) // self._grid, len(ns) - 2)
        lo, hi = ns[i], ns[i + 1]
        f = (n - lo) / (hi - lo)
        a, b = self._a, self._beta
        return a[i] + f * (a[i + 1] - a[i]), b[i] + f * (b[i + 1] - b[i])

    def point(self, n: int) -> tuple[float, float]:
        """(A(n), beta(n)) of the module docstring, memoised (``predictive`` asks for the
        same few token counts at every step)."""
        p = self.points.get(n)
        if p is None:
            p = self.points[n] = self._point(n)
        return p

    def point_rows(self, budgets: tuple[int, ...]) -> Columns:
        """Columns of ``a``, ``A(a)``, ``beta(a)`` and ``beta(a) * a``, one row per budget
        ``a`` (``point``'s floats), memoised per tuple of budgets (``predictive`` asks for
        the same few at every projection; read-only: callers index copies out of them)."""
        got = self._rows.get(budgets)
        if got is None:
            pts = [self.point(a) for a in budgets]
            got = self._rows[budgets] = (
                np.array(budgets, dtype=np.int64)[:, None],
                np.array([p[0] for p in pts])[:, None], np.array([p[1] for p in pts])[:, None],
                np.array([p[1] * a for p, a in zip(pts, budgets, strict=True)])[:, None])
        return got

    def prefill_floor(self, cap: int) -> tuple[float, float]:
        """(per token, per causal pair), both >= 0, such that every prefill step of
        ``n`` in 1..``cap`` tokens and ``W`` causal pairs is priced at least ``n * per
        token + W * per pair``: ``step_time``'s ``A(n) + beta(n) (W - n (n + 1) / 2)``
        is ``[A(n) - beta(n) n (n + 1) / 2] + beta(n) W``, so per token is the least
        bracket per token (0 if one is negative) and per pair the least ``beta``. O(cap)
        once per ``cap`` (memoised), as arrays (``_points``: ``_point``'s floats; the
        least of a set of floats is one of them, whatever the order it is read in)."""
        got = self._floors.get(cap)
        if got is None:
            per_token, per_pair = float("inf"), float("inf")
            if cap >= 1:
                n = np.arange(1, cap + 1, dtype=np.int64)
                a, beta = self._points(n)
                # (fmin skips a NaN, as the loop's min(least, x) does)
                per_token = float(np.fmin.reduce((a - beta * (n * (n + 1) / 2)) / n))
                per_pair = float(np.fmin.reduce(beta))
            got = self._floors[cap] = (max(0.0, per_token), max(0.0, per_pair))
        return got

    def _points(self, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``_point`` of each token count in ``n`` (>= 1), as arrays: the same grid
        segment and the same operations in the same order, elementwise (the same floats;
        ``tests/test_predictive.py`` holds them to ``_point``'s)."""
        ns, fine = np.array(self._ns, dtype=np.int64), self._fine
        top = len(ns) - 2
        i = np.minimum(np.where(n <= fine, np.maximum(n - 1, 0),
                                fine - 1 + (n - fine) // self._grid), top)
        lo, hi = ns[i], ns[i + 1]
        f = (n - lo) / (hi - lo)
        a, b = np.array(self._a), np.array(self._beta)
        return a[i] + f * (a[i + 1] - a[i]), b[i] + f * (b[i + 1] - b[i])

    def step_time(self, n: int, pairs: float) -> float:
        """A prefill-only step of ``n`` tokens (``n`` >= 1) whose chunks make ``pairs``
        causal query-key pairs: ``A(n) + beta(n) * (pairs - n (n + 1) / 2)``, the pairs
        beyond one ``n``-token chunk on an empty cache."""
        a, beta = self.point(n)
        return a + beta * (pairs - causal_pairs(n, 0))

    def run_time(self, c: int, start: int, k: int) -> float:
        """``k`` consecutive steps each prefilling ``c`` tokens of one prompt, the first at
        context ``start``: step j has ``c (start + j c)`` pairs beyond ``c (c + 1) / 2``, so
        the sum is ``k A(c) + beta(c) c (k start + c k (k - 1) / 2)`` (closed form)."""
        if k <= 0:
            return 0.0
        a, beta = self.point(c)
        return k * a + beta * c * (k * start + c * k * (k - 1) / 2)

    def _at(self, c: int, x: int) -> float:
        cum, slope = self._cum[c], self._slope[c]
        if x >= self.max_len:  # beyond the table: the last chunk's cost per token
            return cum[-1] + (x - self.max_len) * slope[-1]
        i, r = divmod(x, c)
        return cum[i] + slope[i] * r

    def decode_cost(self, context: int, with_prefill: bool) -> float:
        """Marginal step time of one decode with ``context`` cached tokens."""
        return (self.dec_ride if with_prefill else self.dec_alone) + self.dec_kv * context
