"""Latency metrics exactly as the P-PAS client defines them (spec "Metrics"), per request
and per run, plus aggregation over seeds and the paper's geometric-mean improvement.

    E2E = completion - submission      TTFT = first token - submission
    TPOT = (completion - first token) / max(output_tokens - 1, 1)
    ITL = each gap between consecutive tokens of a request, pooled over the run (``Gaps``)
    makespan = last completion - first submission (``RunSummary``)
Percentiles are numpy's linear interpolation. E2E is ``e2e`` in code; the JSON edges keep their
names: ``avg_latency``/``p95_latency`` in run records, ``e2el`` where ``vllm bench serve``'s
names are written (``ppas.live.results``).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import repeat
from operator import mul
from struct import Struct

import numpy as np

from ppas.core.errors import PpasError


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    arrival_s: float
    ttft: float
    e2e: float
    tpot: float
    output_tokens: int
    ttft_slo: float | None = None
    tpot_slo: float | None = None
    slo_class: str | None = None
    e2e_slo: float | None = None
    end_s: float | None = None  # when the client was done with it; default arrival_s + e2e

    @property
    def finish_s(self) -> float:
        return self.arrival_s + self.e2e if self.end_s is None else self.end_s

    def meets_slo(self) -> bool:
        """Attainment: every given SLO met, a value equal to its SLO meeting it (a request
        with no SLO always attains)."""
        return (self.ttft_slo is None or self.ttft <= self.ttft_slo) and (
            self.tpot_slo is None or self.tpot <= self.tpot_slo) and (
            self.e2e_slo is None or self.e2e <= self.e2e_slo)


def tpot_of(first_token_s: float, completion_s: float, output_tokens: int) -> float:
    """TPOT as ``vllm bench serve`` and the P-PAS client define it: the time after the first
    token over the remaining output tokens. The one definition simulator, cluster and bench use."""
    return (completion_s - first_token_s) / max(output_tokens - 1, 1)


#: A float as ``array('d')`` stores it (a native C double).
_DOUBLE = Struct("d").pack


class Gaps:
    """Inter-token latencies (ITL, seconds): single gaps (``one``), and (value, count)
    pairs, so that a simulated decode run of k steps over n requests adds k values counted
    n times each, not k * n floats. ``quantiles`` are those of the expanded sample, as
    numpy's linear interpolation. ``one`` holds C doubles (``array('d')``: the same
    values, a third of a list's memory, and nothing the cyclic garbage collector scans,
    where a list of millions of floats was scanned whole at every full collection)."""

    __slots__ = ("one", "values", "counts")

    def __init__(self, values: Iterable[float] = ()) -> None:
        self.one: array[float] = array("d", values)  # each counted once (engines append)
        self.values: list[float] = []
        self.counts: list[int] = []

    def add(self, value: float, count: int = 1) -> None:
        if count == 1:
            self.one.append(value)
        else:
            self.values.append(value)
            self.counts.append(count)

    def repeat(self, value: float, count: int) -> None:
        """``count`` single gaps of ``value``: the same as ``count`` appends to ``one``
        (a run of equal gaps from one step, kept apart from the (value, count) pairs so
        that every sum over the gaps adds the same floats in the same order), written at
        once as the double's bytes (``array('d')`` holds native doubles: exact)."""
        self.one.frombytes(_DOUBLE(value) * count)

    def repeat_each(self, values: Iterable[float], count: int) -> None:
        """``repeat(value, count)`` for each of ``values`` in order, written at once (each
        double's bytes ``count`` times, joined: in C)."""
        self.one.frombytes(b"".join(map(mul, map(_DOUBLE, values), repeat(count))))

    def extend(self, values: Sequence[float], count: int) -> None:
        """Each of ``values`` counted ``count`` times."""
        self.values.extend(values)
        self.counts.extend([count] * len(values))

    def mark(self) -> tuple[int, int]:
        """Where ``truncate`` can come back to."""
        return len(self.one), len(self.values)

    def truncate(self, mark: tuple[int, int]) -> None:
        """Undo what was added after ``mark``."""
        del self.one[mark[0]:]
        del self.values[mark[1]:], self.counts[mark[1]:]

    def merge(self, other: Gaps) -> None:
        self.one.extend(other.one)
        self.values.extend(other.values)
        self.counts.extend(other.counts)

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        v = np.concatenate([np.array(self.one, dtype=np.float64),
                            np.array(self.values, dtype=np.float64)])
        c = np.concatenate([np.ones(len(self.one), dtype=np.int64),
                            np.array(self.counts, dtype=np.int64)])
        return v, c

    @property
    def total(self) -> int:
        return len(self.one) + sum(self.counts)

    def expanded(self) -> np.ndarray:
        """Every gap, in no particular order (tests)."""
        v, c = self._arrays()
        return np.repeat(v, c)

    def mean(self) -> float:
        n = self.total
        if not n:
            return math.nan
        v, c = self._arrays()
        # (v * c).sum(): numpy's pairwise sum, the same bits on every machine; np.dot would
        # call BLAS, whose sum order (and idle threads' CPU time) follows its thread count.
        return float((v * c).sum() / n)

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """The ``qs`` percentiles of the expanded sample (NaN when empty): rank
        h = q/100 (N - 1), between the order statistics floor(h) and floor(h) + 1."""
        if not self.total:
            return [math.nan] * len(qs)
        v, c = self._arrays()
        order = np.argsort(v, kind="stable")
        v = v[order]
        cum = np.cumsum(c[order])
        n = int(cum[-1])
        out = []
        for q in qs:
            h = q / 100.0 * (n - 1)
            lo = math.floor(h)
            a = float(v[np.searchsorted(cum, lo, side="right")])
            b = float(v[np.searchsorted(cum, min(lo + 1, n - 1), side="right")])
            out.append(a + (b - a) * (h - lo))
        return out


#: The tail percentiles every run reports beside RUN_KEYS' mean and P95 (``tails``).
TAIL_QS = (50, 90, 99)

#: Keys of a run record (the simulator's and the benchmark's ``--json`` objects, run files).
RUN_KEYS = ("num_requests", "avg_latency", "p95_latency", "avg_ttft", "p95_ttft", "avg_tpot",
            "p95_tpot", "makespan", "failed")


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One run's figures, defined once for the simulator, the cluster and the live bench.

    Over the completed requests; failed ones count only in ``num_requests`` and ``failed``:

    * ``mean_*`` / ``p95_*``: mean and P95 of E2E, TTFT, TPOT (seconds);
    * ``makespan`` = last completion - first submission, both over completed requests;
    * ``good``: completed requests meeting every SLO they carry (``RequestMetrics.meets_slo``),
      None when no request carries one;
    * ``slo_attainment`` = good / num_requests; ``goodput`` = good / makespan (requests/s);
    * ``tails``: P50/P90/P99 of TTFT, TPOT and E2E (``ttft_p50``, ..., as ``percentiles``
      names them, with its per-kind attainments), and of ITL with its mean (``avg_itl``,
      ``itl_p50``, ...) when the run's inter-token gaps are given.

    Figures of a run with no completed request are NaN. ``record`` writes the JSON edge."""

    num_requests: int  # completed + failed
    failed: int
    mean_e2e: float
    p95_e2e: float
    mean_ttft: float
    p95_ttft: float
    mean_tpot: float
    p95_tpot: float
    makespan: float
    good: int | None = None
    tails: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, reqs: Sequence[RequestMetrics], failed: int = 0,
           itl: Gaps | None = None) -> RunSummary:
        tails = percentiles(reqs, TAIL_QS)
        if itl is not None and itl.total:
            tails["avg_itl"] = itl.mean()
            for q, v in zip(TAIL_QS, itl.quantiles(TAIL_QS), strict=True):
                tails[f"itl_p{q:g}"] = v
        if not reqs:
            nan = float("nan")
            return cls(failed, failed, nan, nan, nan, nan, nan, nan, nan, tails=tails)
        e2e = np.array([r.e2e for r in reqs])
        ttft = np.array([r.ttft for r in reqs])
        tpot = np.array([r.tpot for r in reqs])
        first = min(r.arrival_s for r in reqs)
        last = max(r.finish_s for r in reqs)
        has_slo = any(r.ttft_slo is not None or r.tpot_slo is not None
                      or r.e2e_slo is not None for r in reqs)
        return cls(
            num_requests=len(reqs) + failed, failed=failed,
            mean_e2e=float(e2e.mean()), p95_e2e=float(np.percentile(e2e, 95)),
            mean_ttft=float(ttft.mean()), p95_ttft=float(np.percentile(ttft, 95)),
            mean_tpot=float(tpot.mean()), p95_tpot=float(np.percentile(tpot, 95)),
            makespan=float(last - first),
            good=sum(r.meets_slo() for r in reqs) if has_slo else None, tails=tails)

    @property
    def completed(self) -> int:
        return self.num_requests - self.failed

    @property
    def slo_attainment(self) -> float | None:
        return None if self.good is None else self.good / self.num_requests

    @property
    def goodput(self) -> float | None:
        return None if self.good is None else self.good / max(self.makespan, 1e-9)

    def record(self, tails: bool = False) -> dict[str, float | int]:
        """The run record's keys (``RUN_KEYS``; E2E is ``latency`` there), plus
        ``slo_attainment`` and ``goodput`` when requests carry SLOs, plus ``tails`` if asked."""
        out: dict[str, float | int] = {
            "num_requests": self.num_requests,
            "avg_latency": self.mean_e2e,
            "p95_latency": self.p95_e2e,
            "avg_ttft": self.mean_ttft,
            "p95_ttft": self.p95_ttft,
            "avg_tpot": self.mean_tpot,
            "p95_tpot": self.p95_tpot,
            "makespan": self.makespan,
            "failed": self.failed,
        }
        if self.slo_attainment is not None and self.goodput is not None:
            out["slo_attainment"] = self.slo_attainment
            out["goodput"] = self.goodput
        if tails:
            out.update(self.tails)
        return out


def percentiles(reqs: Sequence[RequestMetrics], qs: Sequence[float] = (50, 90, 95, 99)
                ) -> dict[str, float]:
    """``{ttft_p50: .., tpot_p50: .., e2e_p50: .., ...}`` plus SLO attainment split by
    kind over the completed requests that have that SLO: ``ttft_attainment``,
    ``tpot_attainment``."""
    out: dict[str, float] = {}
    if not reqs:
        return out
    for name, vals in (("ttft", [r.ttft for r in reqs]), ("tpot", [r.tpot for r in reqs]),
                       ("e2e", [r.e2e for r in reqs])):
        arr = np.array(vals)
        for q, v in zip(qs, np.percentile(arr, qs), strict=True):
            out[f"{name}_p{q:g}"] = float(v)
    with_ttft = [r for r in reqs if r.ttft_slo is not None]
    if with_ttft:
        met = sum(r.ttft <= r.ttft_slo for r in with_ttft)  # type: ignore[operator]
        out["ttft_attainment"] = met / len(with_ttft)
    with_tpot = [r for r in reqs if r.tpot_slo is not None]
    if with_tpot:
        met = sum(r.tpot <= r.tpot_slo for r in with_tpot)  # type: ignore[operator]
        out["tpot_attainment"] = met / len(with_tpot)
    return out


def mean_over(records: Iterable[Mapping[str, float]], key: str) -> float:
    vals = [float(r[key]) for r in records]
    return float(np.mean(vals)) if vals else float("nan")


def geomean_improvement(policy: Sequence[float], baseline: Sequence[float]) -> float:
    """P-PAS Eq. 1-2: R = (prod_k m_policy,k / m_base,k)^(1/K); improvement = (1 - R) x 100.
    Positive means the policy is better (lower)."""
    if len(policy) != len(baseline) or not policy:
        raise PpasError("geomean improvement needs equal, non-empty series")
    logs = [math.log(p / b) for p, b in zip(policy, baseline, strict=True)]
    return (1.0 - math.exp(sum(logs) / len(logs))) * 100.0


__all__ = ["RUN_KEYS", "TAIL_QS", "Gaps", "RequestMetrics", "RunSummary", "geomean_improvement",
           "mean_over",
           "percentiles", "tpot_of", "asdict"]
