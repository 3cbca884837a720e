"""``ppas capacity``: the largest rate scale of a trace at which each policy's SLO
attainment stays at or above ``--attainment`` percent; attainment against rate as a table
(and ``--plot``). The search, and how it treats attainment that is not monotone in the
rate, is ``ppas.analysis.capacity``'s: every ``--scales`` grid point first, then
``--bisect-steps`` bisections inside the first bracket where attainment falls below the
target."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from ppas.analysis.capacity import DEFAULT_SCALES, Capacity, trace_capacity
from ppas.analysis.plot import check_plot_path, plot_attainment
from ppas.commands.common import (
    add_cost_args,
    add_shape_args,
    add_slo_arg,
    check_common,
    engine_config,
    floats,
    split_configs,
)
from ppas.commands.trace_args import add_trace_arguments, build_trace
from ppas.core.errors import PpasError
from ppas.core.limits import MAX_BISECT_STEPS, MAX_RATE_SCALE, MIN_RATE_SCALE, float_arg, int_arg
from ppas.engine.setup import EngineSetup, engine_for


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = "exit codes: 0 success; 2 bad input (one line)"
    add_trace_arguments(p)
    add_shape_args(p)
    add_cost_args(p)
    add_slo_arg(p, required=True)
    p.add_argument("--attainment", type=float_arg(0, 100, lo_open=True), default=90.0,
                   help="target SLO attainment in percent (default 90)")
    p.add_argument("--scales", default=",".join(f"{s:g}" for s in DEFAULT_SCALES),
                   help="grid of rate scales (x the trace's rate), comma-separated, in "
                        f"[{MIN_RATE_SCALE:g}, {MAX_RATE_SCALE:g}]")
    p.add_argument("--bisect-steps", type=int_arg(0, MAX_BISECT_STEPS), default=6,
                   help="bisections inside the first failing bracket (default 6)")
    p.add_argument("--plot", help="write attainment against rate scale (.png, .svg, .pdf)")


def _scales(text: str) -> list[float]:
    vals = floats(text, "--scales", hi=MAX_RATE_SCALE)
    if min(vals) < MIN_RATE_SCALE:
        raise PpasError(f"--scales: values must be at least {MIN_RATE_SCALE:g}, got {text!r}")
    return vals


def record(config: str, cap: Capacity, base_rate: float, slo: str) -> dict[str, Any]:
    """One config's JSON object: the capacity and every evaluated point."""
    def rate(s: float | None) -> float | None:
        return None if s is None else s * base_rate

    return {"config": config, "slo": slo, "target_attainment": cap.target,
            "capacity_scale": cap.scale, "capacity_rate": rate(cap.scale),
            "capacity_bound": cap.bound, "failing_scale": cap.hi,
            "points": [{"rate_scale": p.scale, "rate": rate(p.scale),
                        "slo_attainment": p.attainment,
                        **(p.summary.record(tails=True) if p.summary else {})}
                       for p in cap.points]}


def _capacity_text(r: dict[str, Any]) -> str:
    s, bound = r["capacity_scale"], r["capacity_bound"]
    if bound == "below":
        return f"below x{r['failing_scale']:g} (the lowest scale already fails)"
    if bound == "above":
        return f"at least x{s:g} ({r['capacity_rate']:.4g} req/s; no scale failed)"
    return (f"x{s:.4g} ({r['capacity_rate']:.4g} req/s; x{r['failing_scale']:.4g} "
            "fails)")


def run(args: argparse.Namespace) -> int:
    check_common(args)
    configs = split_configs(args.configs)
    scales = _scales(args.scales)
    plot = check_plot_path(args.plot) if args.plot else None
    trace, _ = build_trace(args)
    if len(trace) == 0:
        raise PpasError(f"the trace ({trace.description}) has no requests")
    if trace.duration_s <= 0:
        raise PpasError("capacity needs a trace whose arrivals span some time (duration 0)")
    base_rate = len(trace) / trace.duration_s
    engine = engine_config(args)
    target = args.attainment / 100.0
    records = []
    for c in configs:
        def setup(c: str = c) -> EngineSetup:
            return engine_for(c, args.hardware, args.model, cost_model=args.cost_model,
                              tp=args.tp, config=engine)

        cap = trace_capacity(trace, setup, args.slo, target, scales=scales,
                             steps=args.bisect_steps)
        records.append(record(c, cap, base_rate, str(args.slo)))
    if plot is not None:
        plot_attainment(records, plot, target)
    if args.json:
        json.dump({"trace": trace.description, "base_rate": base_rate, "results": records},
                  sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print(f"trace: {trace.description}, {len(trace)} requests, {base_rate:.4g} req/s at x1")
    print(f"SLOs: {args.slo}; target attainment {args.attainment:g}%")
    for r in records:
        print(f"\n{r['config']}")
        print(f"  {'rate scale':>10} {'req/s':>9} {'attain':>7} {'goodput':>8} "
              f"{'ttft_p99':>9} {'tpot_p99':>9}")
        for p in r["points"]:
            print(f"  {p['rate_scale']:>10.4g} {p['rate']:>9.4g} {p['slo_attainment']:>7.1%} "
                  f"{_f(p.get('goodput')):>8} {_f(p.get('ttft_p99')):>9} "
                  f"{_f(p.get('tpot_p99')):>9}")
        print(f"  capacity: {_capacity_text(r)}")
    return 0


def _f(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"
