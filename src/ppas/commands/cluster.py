"""``ppas simulate --cluster FILE``: a trace through a multi-instance cluster, optionally
swept over instance counts (``--instances``) and prefill:decode ratios (``--pd-ratios``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ppas.analysis.plot import check_plot_path, plot_cluster_sweep
from ppas.cluster.config import ClusterConfig, load_cluster
from ppas.cluster.report import cluster_record, table
from ppas.cluster.simulator import simulate_cluster
from ppas.commands.common import no_success_exit
from ppas.commands.trace_args import build_trace
from ppas.core.errors import PpasError
from ppas.core.limits import MAX_INSTANCES, MAX_TIME_S, float_arg
from ppas.core.outputs import finite
from ppas.workload import Trace, mixed_trace


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster (with --cluster FILE)")
    g.add_argument("--cluster", help="simulate a cluster described by a TOML file "
                   "(pools, router, link, slo); the policies come from the file")
    g.add_argument("--mixed", action="store_true",
                   help="mixed prompt lengths (32-256, 512-4k, 8k-32k tokens) at "
                   "--request-rate for --duration seconds")
    g.add_argument("--duration", type=float_arg(0, MAX_TIME_S, lo_open=True), default=60.0,
                   help="seconds of --mixed arrivals")
    g.add_argument("--instances", help="sweep: comma-separated instance counts, e.g. 4,8,16")
    g.add_argument("--pd-ratios", help="sweep (disaggregated): P:D ratios, e.g. 1:3,1:1")
    g.add_argument("--plot", help="write P95 TTFT and TTFT attainment vs instances (.png)")


def _ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals or any(not 1 <= v <= MAX_INSTANCES for v in vals):
        raise PpasError(f"{what}: expected comma-separated integers in [1, {MAX_INSTANCES}], "
                        f"got {text!r}")
    return vals


def _ratios(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        a, sep, b = part.strip().partition(":")
        try:
            pa, pb = int(a), int(b)
        except ValueError:
            pa = pb = 0
        if not sep or pa < 1 or pb < 1:
            raise PpasError(f"--pd-ratios: expected P:D pairs of integers >= 1 such as "
                            f"1:3,1:1, got {part.strip()!r}")
        out.append(pa / (pa + pb))
    return out


def configs(base: ClusterConfig, instances: str | None, ratios: str | None
            ) -> list[ClusterConfig]:
    """The sweep's cluster configs (just ``base`` without sweep flags)."""
    if ratios and not base.disaggregated:
        raise PpasError("--pd-ratios needs a disaggregated cluster (prefill and decode pools)")
    counts = _ints(instances, "--instances") if instances else [base.num_instances]
    shares: list[float | None] = list(_ratios(ratios)) if ratios else [None]
    out: list[ClusterConfig] = []
    for n in counts:
        for s in shares:
            c = base.with_instances(n, s) if (instances or s is not None) else base
            if all(c != o for o in out):
                out.append(c)
    return out


def cluster_trace(args: argparse.Namespace) -> Trace:
    """``--mixed`` arrivals, else the trace a single-engine run would replay."""
    if args.mixed:
        if args.trace:
            raise PpasError("--mixed and --trace are exclusive")
        if args.request_rate is None:
            raise PpasError("--mixed needs --request-rate")
        return mixed_trace(args.request_rate, args.duration, args.seed)
    return build_trace(args)[0]


def run(args: argparse.Namespace) -> int:
    if args.seed < 0:
        raise PpasError("--seed must be >= 0")
    if args.plot:
        check_plot_path(args.plot)
    base = load_cluster(args.cluster)
    cfgs = configs(base, args.instances, args.pd_ratios)
    trace = cluster_trace(args)
    records: list[dict[str, Any]] = []
    for c in cfgs:
        records.append({**cluster_record(simulate_cluster(trace, c), c, args.slo),
                        "trace": trace.description, "trace_dropped": dict(trace.dropped),
                        "trace_excluded": trace.excluded})
    if args.plot:
        plot_cluster_sweep(records, args.plot)
    if args.json:
        json.dump(finite(records), sys.stdout, indent=1, allow_nan=False)  # no value: null
        sys.stdout.write("\n")
    else:
        print(f"trace: {trace.description}, {len(trace)} requests; cluster {args.cluster}, "
              f"router {base.router}")
        print(table(records), flush=True)
    return no_success_exit(records, "simulate --cluster")  # as one engine: 1 if none done
