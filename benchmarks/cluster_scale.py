"""Scale of the cluster simulator: one hour of a 16-instance cluster at 50 requests/s.

    .venv/bin/python benchmarks/cluster_scale.py [--instances 16] [--rate 50]
        [--duration 3600] [--router least-outstanding-tokens] [--profile] [--json OUT]

Simulates ``--duration`` seconds of Poisson arrivals with mixed prompt lengths
(``workload.mixed_trace``: half 32-256-token prompts, 35% 512-4k, 15% 8k-32k; outputs
16-512 tokens) on ``--instances`` colocated H200s serving Llama-3.2-3B under P-PAS, and
prints the wall and CPU time, requests simulated per second of wall time, engine steps,
and the peak memory. The same run at a quarter and half of the duration (each in a fresh
process, so the peak resident memory is its own) shows how time and memory grow with the
trace. The issue's bar: 180,000 requests in under 60 s on one core. ``--profile`` prints
where the time goes (cProfile, top functions by own time) for the shortest run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from harness import Table, finish, parser, start

from ppas.cluster.config import ClusterConfig, PoolConfig
from ppas.cluster.simulator import simulate_cluster
from ppas.core.metrics import percentiles
from ppas.workload import mixed_trace


def one(args: argparse.Namespace, duration: float) -> dict[str, float]:
    trace = mixed_trace(args.rate, duration, args.seed)
    cfg = ClusterConfig((PoolConfig("gpu", instances=args.instances, hardware=args.hardware,
                                    model=args.model, policy=args.policy),),
                        router=args.router)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    w0, c0 = time.perf_counter(), time.process_time()
    res = simulate_cluster(trace, cfg)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    p = percentiles(res.request_metrics())
    return {"duration_s": duration, "requests": len(trace), "wall_s": wall, "cpu_s": cpu,
            "req_per_wall_s": len(trace) / wall, "steps": sum(x.engine.num_steps
                                                                for x in res.instances),
            "events": res.num_events, "peak_rss_mb": rss / 1024, "trace_rss_mb": rss0 / 1024,
            "failed": res.num_failed, "ttft_p95": p["ttft_p95"], "tpot_p95": p["tpot_p95"]}


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, hardware="h200", model="llama3.2-3b", seed=0)
    ap.add_argument("--instances", type=int, default=16)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--router", default="least-outstanding-tokens")
    ap.add_argument("--policy", default="ppas:n_th=2,b_max=8192,b_cap=2048")
    ap.add_argument("--one", type=float, help=argparse.SUPPRESS)  # child: one duration
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    if args.one is not None:
        print(json.dumps(one(args, args.one)))
        return 0
    start(args, argv)
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(one, args, args.duration / 4)
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    print(f"{args.instances} x {args.hardware} / {args.model}, {args.policy}, router "
          f"{args.router}, mixed prompts at {args.rate:g} requests/s")
    t = Table(("duration", ">9"), ("requests", ">9d"), ("wall s", ">8.1f"), ("cpu s", ">8.1f"),
              ("req/wall s", ">11.0f"), ("steps", ">10d"), ("peak RSS MB", ">12.0f"),
              ("P95 TTFT", ">9"), ("P95 TPOT", ">9"))
    t.print_header()
    rows = []
    for frac in (0.25, 0.5, 1.0):
        cmd = [sys.executable, __file__, "--one", repr(args.duration * frac)]
        for k in ("instances", "rate", "router", "policy", "hardware", "model", "seed"):
            cmd += [f"--{k}", str(getattr(args, k))]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        rows.append(r)
        t.print_row(f"{r['duration_s']:>8.0f}s", r["requests"], r["wall_s"], r["cpu_s"],
                    r["req_per_wall_s"], r["steps"], r["peak_rss_mb"], f"{r['ttft_p95']:>8.3f}s",
                    f"{r['tpot_p95'] * 1e3:>7.1f}ms")
    full = rows[-1]
    load = os.getloadavg()[0]
    print(f"{full['requests']} requests: {full['wall_s']:.1f} s wall ("
          f"{'meets' if full['wall_s'] < 60 else 'misses'} the < 60 s bar), {full['cpu_s']:.1f} s "
          f"of CPU on one core ({'meets' if full['cpu_s'] < 60 else 'misses'}); load average "
          f"{load:.1f} on {os.cpu_count()} cores (wall > CPU when other processes share them)")
    print(f"per request: {full['cpu_s'] / full['requests'] * 1e6:.0f} us CPU, "
          f"{(full['peak_rss_mb'] - full['trace_rss_mb']) * 1024 / full['requests']:.2f} KiB "
          f"of peak memory beyond the trace")
    finish(args, rows, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
