"""``ppas bench``: the command line of the live benchmark (``ppas.live.client`` replays,
``ppas.live.results`` summarizes). Trace options share the simulator's vocabulary
(``ppas.workload``'s generators)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ppas.commands.common import add_slo_arg
from ppas.commands.trace_args import add_trace_file_arguments, check_no_file_flags, trace_file
from ppas.core.errors import NO_SUCCESS, PpasError
from ppas.core.limits import (
    MAX_BURSTINESS,
    MAX_CONCURRENCY,
    MAX_OUTPUT_TOKENS,
    MAX_PROMPT_TOKENS,
    MAX_RATE,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_TIMEOUT_S,
    MAX_TP,
    MAX_VOCAB,
    MAX_WARMUPS,
    MIN_BURSTINESS,
    float_arg,
    int_arg,
)
from ppas.core.slo import SloSpec
from ppas.cost import CostModel, make_cost_model
from ppas.cost.catalog import HARDWARE, MODELS
from ppas.engine.solo import SoloTable
from ppas.live.client import ReplayOptions, run_trace
from ppas.live.http import USAGE_MODES, normalize_base_url
from ppas.live.prompts import DEFAULT_FILLER, DEFAULT_VOCAB, PROMPT_FORMATS
from ppas.live.results import (
    METRICS,
    SLO_KEYS,
    check_result_path,
    format_table,
    result_record,
    save_result,
    summarize,
)
from ppas.workload import PAPER_PHASES, Trace, gamma_trace, phase_trace


def add_trace_arguments(p: argparse.ArgumentParser) -> None:
    """Trace options shared with the simulator's vocabulary (same generators)."""
    g = p.add_argument_group("trace (one of --phases, --request-rate, --trace)")
    g.add_argument("--phases", help=f"piecewise-Poisson phases DUR:RATE,... (default the "
                   f"paper's {PAPER_PHASES!r}); {{burst}} is --burst-rate")
    g.add_argument("--burst-rate", type=float_arg(0, MAX_RATE, lo_open=True), default=1.0,
                   help="requests/s substituted for {burst} in --phases (default 1.0)")
    g.add_argument("--request-rate", type=float_arg(0, MAX_RATE, lo_open=True, allow_inf=True),
                   help="gamma arrivals at this mean rate (vllm bench serve); inf = all at once")
    g.add_argument("--burstiness", type=float_arg(MIN_BURSTINESS, MAX_BURSTINESS), default=1.0,
                   help="gamma shape with --request-rate: 1 Poisson, < 1 burstier (default 1)")
    g.add_argument("--num-prompts", type=int_arg(1, MAX_REQUESTS), default=100,
                   help="requests with --request-rate (default 100)")
    g.add_argument("--trace", metavar="FILE", help="a CSV/JSONL trace file (ppas.workload)")
    add_trace_file_arguments(g)
    g.add_argument("--seed", type=int_arg(0, MAX_SEED), default=0,
                   help="arrivals and prompt prefixes (default 0)")
    g.add_argument("--prompt-tokens", type=int_arg(1, MAX_PROMPT_TOKENS),
                   help="prompt length (default 25000, the paper)")
    g.add_argument("--output-tokens", type=int_arg(1, MAX_OUTPUT_TOKENS),
                   help="output length (default 32, the paper)")


def trace_from_args(args: argparse.Namespace) -> Trace:
    """The trace the options describe, built by ``ppas.workload``'s generators only."""
    given = [n for n in ("phases", "request_rate", "trace") if getattr(args, n) is not None]
    if len(given) > 1:
        raise PpasError("give only one of --phases, --request-rate, --trace; got "
                        + ", ".join("--" + n.replace("_", "-") for n in given))
    if args.trace is not None:
        if args.prompt_tokens is not None or args.output_tokens is not None:
            raise PpasError("--prompt-tokens/--output-tokens do not apply to --trace "
                            "(the file gives each request's lengths)")
        if args.max_tokens is not None:
            raise PpasError("--max-tokens is for simulation only: a live replay sends each "
                            "request's output length as max_tokens, with ignore_eos (a random "
                            "model has no EOS to stop at)")
        return trace_file(args)
    check_no_file_flags(args)
    pt = 25000 if args.prompt_tokens is None else args.prompt_tokens
    ot = 32 if args.output_tokens is None else args.output_tokens
    if args.request_rate is not None:
        return gamma_trace(args.request_rate, args.num_prompts, args.seed, args.burstiness, pt, ot)
    trace = phase_trace(args.phases or PAPER_PHASES, args.seed, pt, ot, burst=args.burst_rate)
    if len(trace) == 0:
        raise PpasError(f"the phases {trace.description!r} produce no requests; raise the rates")
    return trace


def slo_goodput(slo: SloSpec) -> dict[str, float]:
    """``--slo``'s absolute bounds as ``--goodput``'s milliseconds."""
    assert not slo.relative
    return {key: b.value * 1000.0 for key, name in (("ttft", "ttft"), ("tpot", "tpot"),
                                                    ("e2el", "e2e"))
            if (b := getattr(slo, name)) is not None}


def parse_goodput(items: Sequence[str] | None) -> dict[str, float]:
    """``['ttft:500', 'tpot:50']`` -> ``{'ttft': 500.0, 'tpot': 50.0}`` (milliseconds)."""
    slos: dict[str, float] = {}
    for item in items or ():
        key, sep, val = item.partition(":")
        try:
            ms = float(val)
        except ValueError:
            ms = math.nan
        if not sep or key not in SLO_KEYS or not (ms > 0 and math.isfinite(ms)):
            raise PpasError(f"bad --goodput item {item!r}; expected KEY:MS with KEY one of "
                            "ttft, tpot, e2el and MS a number > 0")
        if key in slos:  # the last would win silently
            raise PpasError(f"--goodput gives {key} twice; give each of ttft, tpot, e2el once")
        slos[key] = ms
    return slos


def _parse_list(text: str, what: str, allowed: Sequence[str] | None = None) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if allowed is not None and x not in allowed]
    if not items or bad:
        raise PpasError(f"bad {what} {text!r}; allowed: comma-separated "
                        + (", ".join(allowed) if allowed else "values"))
    return items


def parse_percentiles(text: str) -> list[float]:
    out = []
    for x in _parse_list(text, "--metric-percentiles"):
        try:
            p = float(x)
        except ValueError:
            p = math.nan
        if not 0 <= p <= 100:
            raise PpasError(f"bad --metric-percentiles item {x!r}; allowed: numbers in [0, 100]")
        out.append(p)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = ("exit codes: 0 success; 1 a run completed no request; 2 bad input (one line)"
                "; 130/143 interrupted by SIGINT/SIGTERM (partial results kept)")
    p.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="model name as served (see /v1/models)")
    add_trace_arguments(p)
    g = p.add_argument_group("requests")
    g.add_argument("--prompt-seed", type=int_arg(0, MAX_SEED),
                   help="seed of the prompts' random prefixes (default --seed); change it to "
                   "replay a trace on the same server without prefix-cache hits")
    g.add_argument("--prompt-format", choices=PROMPT_FORMATS, default="tokens",
                   help="token ids in the paper's shape (default) or approximate text")
    g.add_argument("--vocab-size", type=int_arg(1, MAX_VOCAB),
                   help="random prefix ids are drawn from [0, N) (default: the served model's "
                   f"vocabulary, from --model or the server's model folder; else {DEFAULT_VOCAB})")
    g.add_argument("--filler-token", type=int_arg(0, MAX_VOCAB - 1),
                   help=f"the id repeated after the prefix (default {DEFAULT_FILLER}, or the "
                   "last id of a smaller vocabulary)")
    g.add_argument("--request-timeout", type=float_arg(0, MAX_TIMEOUT_S, lo_open=True),
                   default=1800.0,
                   help="seconds a request may take after sending; then it fails (default 1800)")
    g.add_argument("--max-concurrency", type=int_arg(1, MAX_CONCURRENCY),
                   help="cap on requests in flight (default none)")
    g.add_argument("--num-warmups", type=int_arg(0, MAX_WARMUPS), default=0,
                   help="sequential unmeasured requests shaped like the first one (default 0)")
    g.add_argument("--stream-usage", choices=USAGE_MODES, default="continuous",
                   help="stream_options usage to request: per chunk (default), final, off")
    g = p.add_argument_group("results")
    g.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                   help="SLOs for goodput, e.g. ttft:500 tpot:50 e2el:10000 (milliseconds)")
    add_slo_arg(g)
    g.add_argument("--cost-model", help="with a relative --slo (ttft=5x): the cost model of "
                   "each request's solo latency: roofline (default with --hardware; needs "
                   "--catalog-model) or fitted:FILE from ppas calibrate")
    g.add_argument("--hardware", help=f"GPU of the roofline cost model: {', '.join(HARDWARE)}")
    g.add_argument("--catalog-model", help="model of the roofline cost model (ppas simulate's "
                   f"--model; here --model is the served name): {', '.join(MODELS)}")
    g.add_argument("--tp", type=int_arg(1, MAX_TP), default=None,
                   help="tensor-parallel degree of the roofline cost model (default 1)")
    g.add_argument("--percentile-metrics", default="ttft,tpot,itl",
                   help="metrics to report percentiles of: ttft,tpot,itl,e2el (default "
                   "ttft,tpot,itl)")
    g.add_argument("--metric-percentiles", default="99", help="percentiles, e.g. 50,95,99")
    g.add_argument("--save-result", action="store_true", help="write a JSON results file")
    g.add_argument("--result-dir", help="folder for --save-result (default .)")
    g.add_argument("--result-filename", help="file name for --save-result (default "
                   "bench-MODEL-YYYYmmdd-HHMMSS.json, with -2, -3, ... when that is taken)")
    g.add_argument("--json", action="store_true",
                   help="print one JSON object of run metrics to stdout (no table, no bar)")
    g.add_argument("--disable-tqdm", action="store_true", help="no progress bar")


_COST_FLAGS = ("cost_model", "hardware", "catalog_model", "tp")


def solo_cost_model(args: argparse.Namespace) -> CostModel | None:
    """The cost model of a relative ``--slo``'s solo latencies; None for absolute SLOs. A
    relative one without a cost model, or cost-model flags without it, is one line."""
    given = ["--" + k.replace("_", "-") for k in _COST_FLAGS if getattr(args, k) is not None]
    if args.slo is None or not args.slo.relative:
        if given:
            raise PpasError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to a "
                            "relative --slo only (e.g. ttft=5x: the cost model gives each "
                            "request's solo latency)")
        return None
    spec = args.cost_model or ("roofline" if args.hardware or args.catalog_model else None)
    if spec is None:
        raise PpasError(f"--slo {args.slo} is relative to each request's solo latency, which "
                        "needs a cost model: give --hardware H --catalog-model M (roofline) or "
                        "--cost-model fitted:FILE; or absolute bounds (s, ms)")
    if spec == "roofline" and not (args.hardware and args.catalog_model):
        raise PpasError("the roofline cost model needs --hardware and --catalog-model "
                        f"(hardware: {', '.join(HARDWARE)}; models: {', '.join(MODELS)})")
    return make_cost_model(spec, args.hardware, args.catalog_model, args.tp or 1)


def result_destination(args: argparse.Namespace) -> Path | None:
    """Where ``--save-result`` will write, checked before the run."""
    if not args.save_result:
        if args.result_dir is not None or args.result_filename is not None:
            raise PpasError("--result-dir/--result-filename need --save-result")
        return None
    return check_result_path(args.result_dir, args.result_filename,
                             [args.trace] if args.trace else [])


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    normalize_base_url(args.base_url)  # fail fast, before building a long trace
    if args.slo is not None and args.goodput:
        raise PpasError("give --slo or --goodput, not both (both set the SLOs)")
    cost_model = solo_cost_model(args)
    goodput = (parse_goodput(args.goodput) if args.slo is None
               else {} if cost_model is not None else slo_goodput(args.slo))
    pmetrics = _parse_list(args.percentile_metrics, "--percentile-metrics", METRICS)
    percentiles = parse_percentiles(args.metric_percentiles)
    if args.vocab_size is not None and args.filler_token is not None and (
            args.filler_token >= args.vocab_size):
        raise PpasError(f"--filler-token {args.filler_token} must be < --vocab-size "
                        f"{args.vocab_size}")
    trace = trace_from_args(args)
    options = ReplayOptions(
        prompt_seed=args.seed if args.prompt_seed is None else args.prompt_seed,
        prompt_format=args.prompt_format, vocab_size=args.vocab_size,
        filler_id=args.filler_token, request_timeout_s=args.request_timeout,
        max_concurrency=args.max_concurrency, num_warmups=args.num_warmups,
        usage=args.stream_usage, keep_partial_on_cancel=True)
    dest = result_destination(args)  # before the run: a bad folder must not lose it
    started = datetime.now()
    bars: list[tqdm[Any]] = []  # opened once the server answered: no bar before an error

    def start_bar() -> None:
        bars.append(tqdm(total=len(trace), file=sys.stderr, unit="req", desc="bench",
                         disable=args.json or args.disable_tqdm))

    try:
        result = asyncio.run(run_trace(args.base_url, args.model, trace, options,
                                       on_start=start_bar,
                                       on_done=lambda _o: bars[0].update(1)))
    finally:
        for bar in bars:
            bar.close()
    relative = None
    if cost_model is not None:
        solo = SoloTable(cost_model)
        relative = (args.slo, [solo(r.prompt_tokens, r.output_tokens) for r in trace.requests])
    summary = summarize(result, goodput, pmetrics, percentiles, relative)
    # The table first: whatever happens to the file, the run is on the terminal.
    if args.json:
        print(json.dumps(summary, allow_nan=False), flush=True)
    else:
        print(format_table(summary, pmetrics, percentiles), flush=True)
    if dest is not None:
        record = result_record(result, summary, started=started, base_url=args.base_url,
                               model=args.model, seed=args.seed,
                               prompt_format=args.prompt_format)
        path = save_result(dest, record, named=args.result_filename is not None,
                           model=args.model, started=started)
        if not args.json:
            print(f"results: {path}", file=sys.stderr)
    if result.interrupted:
        sig = getattr(signal, result.interrupted_by, signal.SIGINT)
        print(f"ppas bench: interrupted by {sig.name}; partial results above", file=sys.stderr)
        return 128 + int(sig)
    if summary["completed"] == 0:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(summary["failure_reasons"].items()))
        print(f"ppas bench: no request succeeded ({reasons}); exit code {NO_SUCCESS}",
              file=sys.stderr)
        return NO_SUCCESS
    return 0
