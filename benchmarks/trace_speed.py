"""Simulator speed on real traces: wall seconds per policy against the 10 s/policy/hour bar.

    .venv/bin/python benchmarks/trace_speed.py --azure ../shared/data/traces/azure-2023-code.csv
        --mooncake ../shared/data/traces/mooncake-synthetic.jsonl
        [--configs mbt:2048,mbt:8192,ppas,predictive] [--overload 3] [--json OUT]

Replays, on one simulated engine (``--hardware``/``--model``, default H100 / Qwen3-8B, the
model's context as max_model_len, as ``ppas simulate`` does), the first hour of the Azure
code trace (``--window 0:3600``) and the whole Mooncake trace, each as published and
``--overload`` times faster (``--time-scale 1/3`` by default: three times the rate), under
each policy, one after another in this process. Per run it prints the trace span (seconds
of arrivals as replayed), the requests, the wall and CPU seconds of ``simulate`` alone (the
trace is read once, outside the timing), the simulated trace-seconds per wall second, the
wall seconds per hour of replayed trace beside the issue's bar of 10 s, and the mean E2E
(so a fast run that computes something else would show). Wall time depends on what else
shares the cores: the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from harness import Table, fail, finish, parser, start

from ppas.core.errors import PpasError
from ppas.cost.catalog import MAX_MODEL_LEN
from ppas.engine.setup import engine_for
from ppas.engine.simulator import EngineConfig, simulate
from ppas.workload import Trace, TraceTransform, load_trace

TARGET_S_PER_HOUR = 10.0


def cases(args: argparse.Namespace) -> list[tuple[str, Trace]]:
    """(name, trace) for each trace as published and overloaded."""
    out = []
    for name, path, window in (("azure-code 1h", args.azure, (0.0, 3600.0)),
                               ("mooncake", args.mooncake, None)):
        if not path:
            continue
        if not Path(path).is_file():
            fail("trace_speed.py", f"trace file {path!r} not found")
        base = load_trace(path, "auto", 512, window)  # the window while reading
        out.append((name, base))
        if args.overload != 1:
            out.append((f"{name} x{args.overload:g}",
                        TraceTransform(time_scale=1 / args.overload).apply(base)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, hardware="h100-sxm-80gb", model="qwen3-8b")
    ap.add_argument("--azure", help="the Azure LLM inference code trace (CSV)")
    ap.add_argument("--mooncake", help="the Mooncake trace (JSONL)")
    ap.add_argument("--configs", default="mbt:2048,mbt:8192,ppas,predictive")
    ap.add_argument("--overload", type=float, default=3.0,
                    help="also replay each trace this many times faster (1: not)")
    args = ap.parse_args(argv)
    if not (args.azure or args.mooncake):
        fail("trace_speed.py", "give --azure FILE and/or --mooncake FILE")
    if not 0 < args.overload <= 100:
        fail("trace_speed.py", f"--overload must be in (0, 100], got {args.overload:g}")
    start(args, argv)
    configs = [c for c in args.configs.split(",") if c]
    try:
        traces = cases(args)
        setups = {c: engine_for(c, args.hardware, args.model) for c in configs}
    except PpasError as e:
        fail("trace_speed.py", str(e))
    engine = EngineConfig(max_model_len=MAX_MODEL_LEN.get(args.model))
    print(f"{args.hardware} / {args.model}; bar: {TARGET_S_PER_HOUR:g} s of wall time per "
          "policy per hour of trace, on one core")
    t = Table(("trace", "<18"), ("config", "<11"), ("span s", ">7.0f"), ("requests", ">8d"),
              ("wall s", ">7.2f"), ("cpu s", ">7.2f"), ("sim s/wall s", ">12.0f"),
              ("wall s/h", ">8.2f"), ("bar", ">4.0f"), ("", "<5"), ("mean E2E", ">9.3f"))
    t.print_header()
    rows = []
    for name, trace in traces:
        for c in configs:
            s = setups[c]
            policy = engine_for(c, args.hardware, args.model).policy  # fresh state
            w0, c0 = time.perf_counter(), time.process_time()
            res = simulate(trace, policy, s.cost_model, engine)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            span = trace.duration_s
            per_hour = wall * 3600.0 / span
            e2e = float(res.summary()["avg_latency"])
            rows.append({"trace": name, "description": trace.description, "config": c,
                         "span_s": span, "requests": len(trace), "wall_s": wall, "cpu_s": cpu,
                         "sim_s_per_wall_s": span / wall, "wall_s_per_hour": per_hour,
                         "target_s_per_hour": TARGET_S_PER_HOUR, "steps": res.num_steps,
                         "failed": sum(1 for r in res.requests if r.failed),
                         "avg_latency": e2e})
            t.print_row(name, c, span, len(trace), wall, cpu, span / wall, per_hour,
                        TARGET_S_PER_HOUR, "ok" if per_hour <= TARGET_S_PER_HOUR else "MISS",
                        e2e)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (wall > cpu when "
          "other processes share them)")
    finish(args, rows, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
