"""The trace a run replays, from the command line: shared by the single-engine run
(``ppas.commands.simulate``), the cluster run (``ppas.commands.cluster``) and, for trace
files (format and transformations), the live benchmark (``ppas.commands.bench``)."""

from __future__ import annotations

import argparse

from ppas.core.errors import PpasError
from ppas.core.limits import (
    MAX_BURSTINESS,
    MAX_LENGTH_SCALE,
    MAX_OUTPUT_TOKENS,
    MAX_PROMPT_TOKENS,
    MAX_RATE,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_TIME_SCALE,
    MIN_BURSTINESS,
    float_arg,
    int_arg,
)
from ppas.workload import (
    PAPER_PHASES,
    TRACE_FORMATS,
    Trace,
    TraceTransform,
    gamma_trace,
    parse_window,
    phase_trace,
    read_trace,
)
from ppas.workload.transforms import WINDOW_HELP

#: The trace-file flags (their ``args`` names) that need ``--trace``.
_FILE_FLAGS = ("trace_format", "trace_block_size", "window", "time_scale", "rate",
               "length_scale", "drop_longer_than", "max_tokens")


def add_trace_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--phases", default=None,
                   help=f"DURATION:RATE,... (default {PAPER_PHASES} with --burst-rate)")
    p.add_argument("--burst-rate", type=float_arg(0, MAX_RATE, lo_open=True), default=1.0,
                   help="value of {burst} in --phases")
    p.add_argument("--seed", type=int_arg(0, MAX_SEED), default=0)
    p.add_argument("--trace", help="replay a CSV/JSONL trace file instead of --phases")
    add_trace_file_arguments(p)
    p.add_argument("--request-rate", type=float_arg(0, MAX_RATE, lo_open=True, allow_inf=True),
                   help="gamma arrivals (vllm bench serve style)")
    p.add_argument("--num-prompts", type=int_arg(1, MAX_REQUESTS), default=100)
    p.add_argument("--burstiness", type=float_arg(MIN_BURSTINESS, MAX_BURSTINESS), default=1.0)


def build_trace(args: argparse.Namespace) -> tuple[Trace, float | None]:
    """The trace (a file, gamma arrivals, or phases) and the burst rate it was made at
    (None unless phases)."""
    if args.trace:
        return trace_file(args), None
    check_no_file_flags(args)
    if args.request_rate is not None:
        return gamma_trace(args.request_rate, args.num_prompts, args.seed, args.burstiness,
                           args.prompt_tokens, args.output_tokens), None
    phases = args.phases or PAPER_PHASES
    trace = phase_trace(phases, args.seed, args.prompt_tokens, args.output_tokens,
                        args.burst_rate)
    return trace, args.burst_rate


def add_trace_file_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """A trace file's format and transformations (``ppas.workload.transforms``, applied in
    the order listed)."""
    p.add_argument("--trace-format", choices=TRACE_FORMATS, default=None,
                   help="--trace's format (default auto: from the CSV header or JSONL keys)")
    p.add_argument("--trace-block-size", type=int_arg(1, MAX_PROMPT_TOKENS), default=None,
                   help="tokens per hash id in a mooncake trace (default 512)")
    p.add_argument("--window", type=_window, default=None,
                   help=f"replay only this slice of --trace: {WINDOW_HELP} (before rescaling)")
    g = p.add_mutually_exclusive_group() if isinstance(p, argparse.ArgumentParser) else p
    g.add_argument("--time-scale", type=float_arg(0, MAX_TIME_SCALE, lo_open=True),
                   help="multiply --trace's arrival times by K (0.5 = twice the rate)")
    g.add_argument("--rate", type=float_arg(0, MAX_RATE, lo_open=True),
                   help="rescale --trace's arrivals to this mean rate (req/s)")
    p.add_argument("--length-scale", type=float_arg(0, MAX_LENGTH_SCALE, lo_open=True),
                   help="multiply --trace's prompt and output lengths (at least 1 token)")
    p.add_argument("--drop-longer-than", type=int_arg(2, MAX_PROMPT_TOKENS + MAX_OUTPUT_TOKENS),
                   help="drop --trace's requests whose prompt + output exceed N tokens "
                        "(after --length-scale; counted and reported)")
    p.add_argument("--max-tokens", type=max_tokens_arg, default=None, metavar="default|N",
                   help="the clients' max_tokens on --trace's requests, a cap the policies "
                        "see: N (longer outputs stop at N), or 'default', vLLM's when a "
                        "client sends none (max_model_len less the prompt); each request "
                        "still stops at its own output length (its EOS)")


def max_tokens_arg(text: str) -> int:
    """``--max-tokens``: ``default`` (0: vLLM's default cap) or an integer N >= 1."""
    if text.strip() == "default":
        return 0
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 1 <= n <= MAX_OUTPUT_TOKENS:
        raise argparse.ArgumentTypeError(
            f"must be 'default' (max_model_len less the prompt) or an integer in "
            f"[1, {MAX_OUTPUT_TOKENS}], got {text!r}")
    return n


def _window(text: str) -> tuple[float, float]:
    try:
        return parse_window(text)
    except PpasError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def trace_file(args: argparse.Namespace) -> Trace:
    """``--trace`` read in its format, then transformed."""
    if args.time_scale is not None and args.rate is not None:
        raise PpasError("give --time-scale or --rate, not both (both rescale the arrivals)")
    tf = TraceTransform(args.window, args.time_scale, args.rate, args.length_scale,
                        args.drop_longer_than, max_tokens=args.max_tokens)
    return read_trace(args.trace, args.trace_format or "auto", args.trace_block_size or 512, tf)


def trace_counts(trace: Trace) -> str:
    """`` (K dropped, E excluded by the window)`` for a run's header; "" when none."""
    parts = ([f"{sum(n for _, n in trace.dropped)} dropped"] if trace.dropped else []) + (
        [f"{trace.excluded} excluded by the window"] if trace.excluded else [])
    return f" ({', '.join(parts)})" if parts else ""


def check_no_file_flags(args: argparse.Namespace) -> None:
    """The trace-file flags without ``--trace``: one line, not silently ignored."""
    given = ["--" + k.replace("_", "-") for k in _FILE_FLAGS if getattr(args, k) is not None]
    if given:
        raise PpasError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to "
                        "--trace only")
