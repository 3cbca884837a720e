"""The trace a ``ppas simulate`` run replays, from the command line: shared by the
single-engine run (``ppas.commands.simulate``) and the cluster run
(``ppas.commands.cluster``)."""

from __future__ import annotations

import argparse

from ppas.core.limits import (
    MAX_BURSTINESS,
    MAX_RATE,
    MAX_REQUESTS,
    MAX_SEED,
    MIN_BURSTINESS,
    float_arg,
    int_arg,
)
from ppas.workload import PAPER_PHASES, Trace, gamma_trace, load_trace, phase_trace


def add_trace_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--phases", default=None,
                   help=f"DURATION:RATE,... (default {PAPER_PHASES} with --burst-rate)")
    p.add_argument("--burst-rate", type=float_arg(0, MAX_RATE, lo_open=True), default=1.0,
                   help="value of {burst} in --phases")
    p.add_argument("--seed", type=int_arg(0, MAX_SEED), default=0)
    p.add_argument("--trace", help="replay a CSV/JSONL trace file instead of --phases")
    p.add_argument("--request-rate", type=float_arg(0, MAX_RATE, lo_open=True, allow_inf=True),
                   help="gamma arrivals (vllm bench serve style)")
    p.add_argument("--num-prompts", type=int_arg(1, MAX_REQUESTS), default=100)
    p.add_argument("--burstiness", type=float_arg(MIN_BURSTINESS, MAX_BURSTINESS), default=1.0)


def build_trace(args: argparse.Namespace) -> tuple[Trace, float | None]:
    """The trace (a file, gamma arrivals, or phases) and the burst rate it was made at
    (None unless phases)."""
    if args.trace:
        return load_trace(args.trace), None
    if args.request_rate is not None:
        return gamma_trace(args.request_rate, args.num_prompts, args.seed, args.burstiness,
                           args.prompt_tokens, args.output_tokens), None
    phases = args.phases or PAPER_PHASES
    trace = phase_trace(phases, args.seed, args.prompt_tokens, args.output_tokens,
                        args.burst_rate)
    return trace, args.burst_rate
