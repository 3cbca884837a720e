"""Where a disaggregated cluster's slow first tokens come from, per layout.

For the requests that went through the prefill pool (not deflected), TTFT splits into:
waiting in the pool's queue, the prefill itself, the KV transfer, and the wait on the
decode node until the first token (recompute of the last prompt token there). Printed as
the mean of each part over the slowest 5% of those requests and over all of them, beside
the deflected requests' P95 TTFT, on docs/results/cluster.md's sweep:

    .venv/bin/python benchmarks/cluster_ttft_breakdown.py [--config FILE] [--rate 40]
        [--duration 120] [--instances 8,16] [--pd-ratios 1:3,1:1] [--seed 0] [--json OUT]
"""

from __future__ import annotations

import sys

import numpy as np
from harness import Table, finish, parser, start

from ppas.cluster.config import load_cluster
from ppas.cluster.simulator import simulate_cluster
from ppas.commands.cluster import configs
from ppas.core.errors import PpasError
from ppas.workload import mixed_trace

PARTS = ("queue", "prefill", "transfer", "decode-node wait")


def breakdown(res) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    """(parts of each pool request [n, 4], TTFT of each deflected request)."""
    pool, defl = [], []
    for cr in res.requests:
        m = cr.metrics()
        if m is None:
            continue
        if cr.deflected or cr.decode is None:
            defl.append(m.ttft)
            continue
        p, d, a = cr.prefill, cr.decode, cr.spec.arrival_s
        pool.append((p.first_scheduled_time - a, p.finish_time - p.first_scheduled_time,
                     cr.transfer_end - p.finish_time, d.first_token_time - cr.transfer_end))
    return np.array(pool, dtype=float).reshape(-1, 4), np.array(defl, dtype=float)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, seed=0)
    ap.add_argument("--config", default="examples/cluster-disaggregated.toml")
    ap.add_argument("--rate", type=float, default=40.0)
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--instances", default="8,16")
    ap.add_argument("--pd-ratios", default="1:3,1:1")
    a = ap.parse_args(argv)
    try:
        base = load_cluster(a.config)
        cfgs = configs(base, a.instances, a.pd_ratios)
        trace = mixed_trace(a.rate, a.duration, a.seed)
    except PpasError as e:
        print(f"cluster_ttft_breakdown: {e}", file=sys.stderr)
        return 2
    if not base.disaggregated:
        print("cluster_ttft_breakdown: --config must have prefill and decode pools",
              file=sys.stderr)
        return 2
    start(a, argv)
    print(f"{len(trace)} requests, rate {a.rate:g}/s for {a.duration:g} s, seed {a.seed}; "
          f"mean seconds per part of TTFT for requests through the prefill pool")
    t = Table(("layout", ">7"), ("pool n", ">7"), ("which", ">10"), *((p, "16.3f") for p in PARTS),
              ("deflected P95 TTFT", ">19"))
    t.print_header()
    results: dict[str, dict[str, float | str]] = {}
    for cfg in cfgs:
        res = simulate_cluster(trace, cfg)
        parts, defl = breakdown(res)
        name = f"{cfg.pool('prefill').instances}P:{cfg.pool('decode').instances}D"
        d95 = f"{np.percentile(defl, 95):.3f}" if len(defl) else "-"
        if not len(parts):
            print(f"{name:>7} {0:>7}")
            continue
        tot = parts.sum(axis=1)
        slow = parts[tot >= np.percentile(tot, 95)]
        for which, rows in (("slowest 5%", slow), ("all", parts)):
            means = rows.mean(axis=0)
            t.print_row(name, len(parts), which, *means, d95 if which == "all" else "")
            results[f"{name} {which}"] = dict(zip(PARTS, map(float, means), strict=True))
        results[f"{name} deflected"] = {"ttft_p95": d95}
    finish(a, results, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
