"""``ppas simulate``: one trace (phases + seed, gamma arrivals, or a trace file) through
one or more policies."""

from __future__ import annotations

import argparse
import math

from ppas.analysis.sweep import mean_lower_bound
from ppas.commands import cluster
from ppas.commands.common import (
    add_cost_args,
    add_shape_args,
    add_slo_arg,
    check_common,
    cost_model_for,
    engine_config,
    no_success_exit,
    print_json,
    split_configs,
)
from ppas.commands.trace_args import add_trace_arguments, build_trace, trace_counts
from ppas.core.errors import PpasError
from ppas.engine.simulator import simulate
from ppas.engine.solo import SoloTable
from ppas.policies import make_policy


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = ("exit codes: 0 success; 1 a run completed no request; 2 bad input (one line)"
                "")
    add_trace_arguments(p)
    p.add_argument("--enable-prefix-caching", action="store_true",
                   help="vLLM's automatic prefix caching (traces share prompt prefixes through "
                        "their 'prefix' field)")
    add_shape_args(p)
    add_cost_args(p)
    add_slo_arg(p)
    cluster.add_arguments(p)


def _f(v: float) -> str:
    return "nan" if math.isnan(v) else f"{v:.3f}"


def run(args: argparse.Namespace) -> int:
    if args.cluster:
        if args.scheduling_policy != "fcfs":
            raise PpasError("--scheduling-policy priority is not simulated with --cluster "
                            "(its instances admit first come, first served)")
        return cluster.run(args)
    if args.mixed or args.instances or args.pd_ratios or args.plot:
        raise PpasError("--mixed, --instances, --pd-ratios and --plot need --cluster FILE")
    check_common(args)
    configs = split_configs(args.configs)
    trace, burst = build_trace(args)
    if len(trace) == 0:
        raise PpasError(f"the trace ({trace.description}) has no requests; raise the rates "
                        "or lengthen the phases")
    engine = engine_config(args, prefix_caching=args.enable_prefix_caching)
    records = []
    for c in configs:
        cm = cost_model_for(args, c)
        res = simulate(trace, make_policy(c), cm, engine)
        lb = mean_lower_bound(trace, cm)
        slo = args.slo
        solo = SoloTable(cm) if slo is not None and slo.relative else None
        records.append({"config": c, "burst_rate": burst, "seed": args.seed,
                        "trace": trace.description, "trace_dropped": dict(trace.dropped),
                        "trace_excluded": trace.excluded, **res.summary(slo, solo),
                        **({"slo": str(slo)} if slo is not None else {}),
                        "failure_reasons": res.failure_reasons(),
                        "num_preemptions": res.num_preemptions, "num_steps": res.num_steps,
                        "prefix_hit_rate": res.prefix_hit_rate,
                        "lower_bound_latency": lb})
    if args.json:
        print_json(records)
        return no_success_exit(records, "simulate")
    print(f"trace: {trace.description}, {len(trace)} requests{trace_counts(trace)}")
    cols: tuple[str, ...] = ("avg_latency", "p95_latency", "avg_ttft", "p95_ttft",
                             "avg_tpot", "p95_tpot", "makespan", "ttft_p99", "tpot_p99",
                             "itl_p99")
    if args.slo is not None:
        cols += ("slo_attainment", "goodput")
        print(f"SLOs: {args.slo}" + (" (x: times each request's latency alone on the cost "
                                     "model)" if args.slo.relative else ""))
    w = max(10, *(len(c) for c in configs))
    print(f"{'config':<{w}} " + " ".join(f"{c:>{max(11, len(c))}}" for c in cols)
          + f" {'E2E/bound':>9} {'failed':>6}")
    for r in records:
        print(f"{r['config']:<{w}} " + " ".join(
            f"{_f(float(r.get(c, 'nan'))):>{max(11, len(c))}}" for c in cols)
              + f" {_f(float(r['avg_latency']) / float(r['lower_bound_latency'])):>9}"
              + f" {r['failed']:>6}")
    for r in records:
        for why, n in sorted(r["failure_reasons"].items()):
            print(f"{r['config']}: {n} request(s) failed: {why}")
    return no_success_exit(records, "simulate")
