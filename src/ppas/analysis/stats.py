"""Statistics for live comparisons: t-intervals over seeds and paired bootstrap ratios.

Pure functions (numpy only). Conventions:

* ``t_interval(xs)``: the mean of ``xs`` and its two-sided Student-t confidence interval
  ``mean +- t_{(1+level)/2, n-1} * s / sqrt(n)`` (``s`` the sample standard deviation).
  Exact coverage for normal samples; ``n = 1`` gives an infinite interval (no spread known).
* ``geomean_ratio(a, b)``: ``exp(mean(log(a_i / b_i)))`` over pairs ``i`` (one pair per
  trace: same arrivals, two arms). ``improvement = 1 - ratio``: > 0 means ``a`` is lower
  (better, for latencies) than ``b``.
* ``paired_bootstrap_ratio(a, b)``: that ratio with a percentile bootstrap CI, resampling
  *pairs* (so the trace-to-trace variance shared by both arms cancels), seeded, so the same
  data give the same interval.
* ``paired_t_ratio(a, b)``: the same ratio with a t-interval on the log ratios; used to mark
  winners because it stays honest with 2-5 pairs, where a bootstrap has too few distinct
  resamples and its interval is too narrow.
* ``best_arm(arms)``: the arm with the lowest geometric mean over paired traces, and whether
  it is *marked* a winner. "The winner" claims k - 1 things (it beats each other arm), so
  every other arm / it must exclude 1 with the family-wise ``level`` (Bonferroni:
  ``1 - (1 - level) / (k - 1)`` per comparison). Among k tied arms it marks one at most
  ``1 - level`` of the time (tested on synthetic data).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class Interval:
    """A point estimate and its confidence interval ``[lo, hi]`` at ``level``."""

    estimate: float
    lo: float
    hi: float
    n: int
    level: float = 0.95

    def excludes(self, value: float) -> bool:
        return not self.lo <= value <= self.hi

    def to_dict(self) -> dict[str, float | int | None]:
        def f(v: float) -> float | None:
            return v if math.isfinite(v) else None

        return {"estimate": f(self.estimate), "lo": f(self.lo), "hi": f(self.hi), "n": self.n,
                "level": self.level}


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student-t cumulative distribution function."""
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t >= 0 else tail


@lru_cache(maxsize=1024)
def t_quantile(p: float, df: float) -> float:
    """Inverse of ``t_cdf`` (bisection; ~1e-10 absolute)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


def t_interval(xs: Sequence[float], level: float = 0.95) -> Interval:
    """Mean and its Student-t CI. Non-finite values are an error (callers drop missing
    values first); an empty sample is an error."""
    a = np.asarray(xs, dtype=float)
    if a.size == 0 or not np.all(np.isfinite(a)):
        raise ValueError("t_interval needs at least one finite value")
    m = float(a.mean())
    if a.size == 1:
        return Interval(m, -math.inf, math.inf, 1, level)
    half = t_quantile(0.5 + level / 2.0, a.size - 1) * float(a.std(ddof=1)) / math.sqrt(a.size)
    return Interval(m, m - half, m + half, int(a.size), level)


def _log_ratios(a: Sequence[float], b: Sequence[float]) -> np.ndarray:
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape or x.size == 0:
        raise ValueError("paired samples need the same, non-zero length")
    if not (np.all(x > 0) and np.all(y > 0) and np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("ratios need finite values > 0")
    return np.log(x) - np.log(y)


def geomean(xs: Sequence[float]) -> float:
    """``exp(mean(log(x_i)))`` of values > 0: how arms are ranked per load."""
    x = np.asarray(xs, dtype=float)
    if x.size == 0 or not np.all(x > 0):
        raise ValueError("a geometric mean needs values > 0")
    return float(np.exp(np.log(x).mean()))


def geomean_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """``exp(mean(log(a_i / b_i)))``."""
    return float(np.exp(_log_ratios(a, b).mean()))


def paired_bootstrap_ratio(a: Sequence[float], b: Sequence[float], *, level: float = 0.95,
                           n_boot: int = 10_000, seed: int = 0) -> Interval:
    """Geometric-mean ratio a/b with a percentile bootstrap CI over resampled pairs."""
    d = _log_ratios(a, b)
    est = float(np.exp(d.mean()))
    if d.size == 1:
        return Interval(est, -math.inf, math.inf, 1, level)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, size=(n_boot, d.size))
    means = d[idx].mean(axis=1)
    lo, hi = np.quantile(means, [0.5 - level / 2.0, 0.5 + level / 2.0])
    return Interval(est, float(np.exp(lo)), float(np.exp(hi)), int(d.size), level)


def paired_t_ratio(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Interval:
    """Geometric-mean ratio a/b with a t-interval on the per-pair log ratios."""
    iv = t_interval(_log_ratios(a, b).tolist(), level)
    return Interval(math.exp(iv.estimate), math.exp(iv.lo), math.exp(iv.hi), iv.n, level)


@dataclass(frozen=True)
class Best:
    """``best_arm``'s answer: the winner, the runner-up, the runner-up/winner interval at the
    per-comparison level, and whether every comparison excludes 1."""

    winner: str
    runner_up: str
    ratio: Interval
    level_each: float
    marked: bool


def best_arm(arms: dict[str, Sequence[float]], level: float = 0.95) -> Best:
    """The arm with the lowest geometric mean; ``arms[name][i]`` are paired by trace ``i``
    (all the same length, >= 2 arms)."""
    if len(arms) < 2:
        raise ValueError("best_arm needs at least two arms")
    lens = {len(v) for v in arms.values()}
    if len(lens) != 1:
        raise ValueError(f"arms must be paired (same number of traces), got lengths {lens}")
    ranked = sorted(arms, key=lambda a: geomean(arms[a]))
    best = ranked[0]
    each = 1.0 - (1.0 - level) / (len(ranked) - 1)
    ivs = [paired_t_ratio(arms[o], arms[best], each) for o in ranked[1:]]
    return Best(best, ranked[1], ivs[0], each, all(iv.lo > 1.0 for iv in ivs))
