"""Latency metrics exactly as the P-PAS client defines them (spec "Metrics"), per request
and per run, plus aggregation over seeds and the paper's geometric-mean improvement.

    E2E (latency) = completion - submission      TTFT = first token - submission
    TPOT = (completion - first token) / max(output_tokens - 1, 1)
    makespan = last completion - first submission
Percentiles are numpy's linear interpolation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

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

    @property
    def finish_s(self) -> float:
        return self.arrival_s + self.e2e

    def meets_slo(self) -> bool:
        """Attainment: both given SLOs met (a request with no SLO always attains)."""
        return (self.ttft_slo is None or self.ttft <= self.ttft_slo) and (
            self.tpot_slo is None or self.tpot <= self.tpot_slo
        )


def tpot_of(first_token_s: float, completion_s: float, output_tokens: int) -> float:
    """TPOT as ``vllm bench serve`` and the P-PAS client define it: the time after the first
    token over the remaining output tokens. The one definition simulator, cluster and bench use."""
    return (completion_s - first_token_s) / max(output_tokens - 1, 1)


#: Keys of a run record (the simulator's and the benchmark's ``--json`` objects).
RUN_KEYS = ("num_requests", "avg_latency", "p95_latency", "avg_ttft", "p95_ttft", "avg_tpot",
            "p95_tpot", "makespan", "failed")


def run_summary(reqs: Sequence[RequestMetrics], failed: int = 0) -> dict[str, float | int]:
    """Mean and P95 of E2E, TTFT, TPOT; makespan; counts (P-PAS client conventions)."""
    if not reqs:
        nan = float("nan")
        return {"num_requests": failed, "avg_latency": nan, "p95_latency": nan, "avg_ttft": nan,
                "p95_ttft": nan, "avg_tpot": nan, "p95_tpot": nan, "makespan": nan,
                "failed": failed}
    e2e = np.array([r.e2e for r in reqs])
    ttft = np.array([r.ttft for r in reqs])
    tpot = np.array([r.tpot for r in reqs])
    first = min(r.arrival_s for r in reqs)
    last = max(r.finish_s for r in reqs)
    out: dict[str, float | int] = {
        "num_requests": len(reqs) + failed,
        "avg_latency": float(e2e.mean()),
        "p95_latency": float(np.percentile(e2e, 95)),
        "avg_ttft": float(ttft.mean()),
        "p95_ttft": float(np.percentile(ttft, 95)),
        "avg_tpot": float(tpot.mean()),
        "p95_tpot": float(np.percentile(tpot, 95)),
        "makespan": float(last - first),
        "failed": failed,
    }
    if any(r.ttft_slo is not None or r.tpot_slo is not None for r in reqs):
        met = sum(r.meets_slo() for r in reqs)
        out["slo_attainment"] = met / (len(reqs) + failed)
        out["goodput"] = met / max(last - first, 1e-9)
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


__all__ = ["RUN_KEYS", "RequestMetrics", "geomean_improvement", "mean_over", "percentiles",
           "run_summary", "tpot_of", "asdict"]
