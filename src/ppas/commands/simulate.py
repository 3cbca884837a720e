"""``ppas simulate``: one trace (phases + seed, gamma arrivals, or a trace file) through
one or more policies."""

from __future__ import annotations

import argparse

from ppas.commands.common import (
    add_cost_args,
    add_shape_args,
    check_common,
    cost_model_for,
    floats,
    print_json,
    split_configs,
)
from ppas.errors import PpasError
from ppas.policies import make_policy
from ppas.simulator import EngineConfig, lower_bound_latency, simulate
from ppas.workload import PAPER_PHASES, Trace, gamma_trace, load_trace, phase_trace


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--phases", default=None,
                   help=f"DURATION:RATE,... (default {PAPER_PHASES} with --burst-rate)")
    p.add_argument("--burst-rate", type=float, default=1.0, help="value of {burst} in --phases")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", help="replay a CSV/JSONL trace file instead of --phases")
    p.add_argument("--request-rate", type=float, help="gamma arrivals (vllm bench serve style)")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--enable-prefix-caching", action="store_true",
                   help="vLLM's automatic prefix caching (traces share prompt prefixes through "
                        "their 'prefix' field)")
    add_shape_args(p)
    add_cost_args(p)
    from ppas.commands import cluster

    cluster.add_arguments(p)


def build_trace(args: argparse.Namespace) -> tuple[Trace, float | None]:
    if args.trace:
        return load_trace(args.trace), None
    if args.request_rate is not None:
        return gamma_trace(args.request_rate, args.num_prompts, args.seed, args.burstiness,
                           args.prompt_tokens, args.output_tokens), None
    (burst,) = floats(repr(args.burst_rate), "--burst-rate")
    phases = args.phases or PAPER_PHASES
    return phase_trace(phases, args.seed, args.prompt_tokens, args.output_tokens, burst), burst


def run(args: argparse.Namespace) -> int:
    if args.cluster:
        from ppas.commands import cluster

        return cluster.run(args)
    if args.mixed or args.instances or args.pd_ratios or args.plot:
        raise PpasError("--mixed, --instances, --pd-ratios and --plot need --cluster FILE")
    check_common(args)
    if args.seed < 0:
        raise PpasError("--seed must be >= 0")
    configs = split_configs(args.configs)
    trace, burst = build_trace(args)
    records = []
    for c in configs:
        cm = cost_model_for(args, c)
        res = simulate(trace, make_policy(c), cm,
                       EngineConfig(max_num_seqs=args.max_num_seqs,
                                    num_kv_blocks=args.num_kv_blocks,
                                    prefix_caching=args.enable_prefix_caching))
        lb = [lower_bound_latency(s, cm) for s in trace]
        records.append({"config": c, "burst_rate": burst, "seed": args.seed, **res.summary(),
                        "num_preemptions": res.num_preemptions, "num_steps": res.num_steps,
                        "prefix_hit_rate": res.prefix_hit_rate,
                        "lower_bound_latency": sum(lb) / len(lb)})
    if args.json:
        print_json(records)
        return 0
    print(f"trace: {trace.description}, {len(trace)} requests")
    cols = ("avg_latency", "p95_latency", "avg_ttft", "p95_ttft", "avg_tpot", "p95_tpot",
            "makespan")
    w = max(10, *(len(c) for c in configs))
    print(f"{'config':<{w}} " + " ".join(f"{c:>11}" for c in cols) + f" {'E2E/bound':>9}")
    for r in records:
        print(f"{r['config']:<{w}} " + " ".join(f"{float(r[c]):>11.3f}" for c in cols)
              + f" {float(r['avg_latency']) / float(r['lower_bound_latency']):>9.2f}")
    return 0
