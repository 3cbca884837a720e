"""Plain-text tables in the paper's layout (Table 7: mean E2E per burst and config;
Table 1: geometric-mean improvements of a policy vs baselines)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ppas.analysis.sweep import cell_means, improvement

TABLE1_METRICS = (("avg_latency", "avg latency"), ("p95_latency", "P95 latency"),
                  ("avg_ttft", "avg TTFT"), ("avg_tpot", "avg TPOT"), ("makespan", "makespan"))


def _fmt(v: float) -> str:
    return "nan" if math.isnan(v) else f"{v:.3f}"


def table_by_burst(records: Sequence[dict[str, Any]], key: str = "avg_latency",
                   title: str | None = None) -> str:
    """Rows = burst rates, columns = configs (in first-seen order), mean over seeds."""
    configs = list(dict.fromkeys(str(r["config"]) for r in records))
    bursts = sorted({float(r["burst_rate"]) for r in records})
    m = cell_means(records, key)
    w = max(9, *(len(c) for c in configs))
    lines = [title or f"{key} (s), mean over seeds"]
    lines.append(f"{'burst':>6} " + " ".join(f"{c:>{w}}" for c in configs))
    for b in bursts:
        lines.append(f"{b:>6g} " + " ".join(f"{_fmt(m.get((c, b), math.nan)):>{w}}"
                                             for c in configs))
    return "\n".join(lines)


def table_improvements(records: Sequence[dict[str, Any]], baselines: Sequence[str]) -> str:
    """Paper Table 1 for every non-baseline config: (1 - geomean ratio) x 100 per metric."""
    configs = list(dict.fromkeys(str(r["config"]) for r in records))
    present = [b for b in baselines if b in configs]
    if not present:
        return ""
    lines = ["geometric-mean improvement over burst rates (%; positive = better)"]
    for pol in (c for c in configs if c not in present):
        lines.append(f"  {pol}")
        lines.append(f"    {'metric':<12} " + " ".join(f"{'vs ' + b:>12}" for b in present))
        for key, label in TABLE1_METRICS:
            vals = [improvement(records, pol, b, key) for b in present]
            lines.append(f"    {label:<12} " + " ".join(f"{v:>12.1f}" for v in vals))
    return "\n".join(lines)


def table_lower_bound(records: Sequence[dict[str, Any]]) -> str:
    """Mean E2E of each config divided by the machine-to-itself lower bound."""
    if not records or "lower_bound_latency" not in records[0]:
        return ""
    configs = list(dict.fromkeys(str(r["config"]) for r in records))
    bursts = sorted({float(r["burst_rate"]) for r in records})
    m = cell_means(records, "avg_latency")
    lb = cell_means(records, "lower_bound_latency")
    w = max(9, *(len(c) for c in configs))
    lines = ["mean E2E / lower bound (each request alone on the machine)"]
    lines.append(f"{'burst':>6} {'bound(s)':>9} " + " ".join(f"{c:>{w}}" for c in configs))
    for b in bursts:
        lbv = lb[(configs[0], b)]
        lines.append(f"{b:>6g} {lbv:>9.3f} " + " ".join(
            f"{m[(c, b)] / lbv:>{w}.2f}" for c in configs))
    return "\n".join(lines)
