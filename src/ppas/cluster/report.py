"""Run records and tables of cluster runs: TTFT / TPOT / E2E percentiles, SLO attainment."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ppas.cluster.config import ClusterConfig
from ppas.cluster.simulator import ClusterResult
from ppas.core.metrics import RunSummary, percentiles
from ppas.core.slo import SloSpec
from ppas.engine.solo import SoloTable

#: Columns of ``table`` (record keys), in order.
COLUMNS = ("ttft_p50", "ttft_p95", "ttft_p99", "tpot_p50", "tpot_p95", "tpot_p99", "itl_p99",
           "e2e_p50", "e2e_p95", "e2e_p99", "ttft_attainment", "tpot_attainment",
           "slo_attainment")


def layout(config: ClusterConfig) -> str:
    """``'16 mixed'`` or ``'4P:12D'``."""
    if not config.disaggregated:
        return f"{config.num_instances} mixed"
    return f"{config.pool('prefill').instances}P:{config.pool('decode').instances}D"


def cluster_record(res: ClusterResult, config: ClusterConfig,
                   slo: SloSpec | None = None) -> dict[str, Any]:
    """The run record; ``slo`` replaces the requests' SLOs (relative ones against the
    first instance's cost model: each request's latency alone there)."""
    ms = res.request_metrics()
    if slo is not None:
        solo = SoloTable(res.instances[0].cost_model) if slo.relative and res.instances else None
        ms = slo.apply_all(ms, [solo(r.spec.prompt_tokens, r.spec.output_tokens)
                                for r in res.requests if r.metrics() is not None]
                           if solo else None)
    rec: dict[str, Any] = {"layout": layout(config), "instances": config.num_instances,
                           "router": config.router}
    if config.disaggregated:
        rec["prefill_instances"] = config.pool("prefill").instances
        rec["decode_instances"] = config.pool("decode").instances
    rec |= RunSummary.of(ms, res.num_failed, res.gaps()).record(tails=True)
    if slo is not None:
        rec["slo"] = str(slo)
    rec |= percentiles(ms, (50, 95, 99))
    rec["deflected"] = res.num_deflected
    rec["preemptions"] = sum(x.engine.num_preemptions for x in res.instances)
    rec["steps"] = sum(x.engine.num_steps for x in res.instances)
    return rec


def table(records: Sequence[dict[str, Any]]) -> str:
    """One row per run: layout, then latencies in seconds (TPOT, ITL in ms) and attainment."""
    heads = ["layout", "failed", "deflected"] + [c.replace("_attainment", " att")
                                                 for c in COLUMNS]
    rows = []
    for r in records:
        row = [str(r["layout"]), str(r.get("failed", 0)), str(r.get("deflected", 0))]
        for c in COLUMNS:
            v = r.get(c)
            if v is None or (isinstance(v, float) and math.isnan(v)):
                row.append("-")
            elif c.startswith(("tpot_p", "itl_p")):
                row.append(f"{v * 1e3:.1f}ms")
            elif "attainment" in c:
                row.append(f"{v:.1%}")
            else:
                row.append(f"{v:.3f}")
        rows.append(row)
    w = [max(len(h), *(len(x[i]) for x in rows)) for i, h in enumerate(heads)]
    out = [" ".join(h.rjust(w[i]) for i, h in enumerate(heads))]
    out += [" ".join(x.rjust(w[i]) for i, x in enumerate(row)) for row in rows]
    return "\n".join(out)
