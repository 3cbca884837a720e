"""``ppas tune``: the best stock vLLM setting for a trace, and what our policies gain over it
(``ppas.analysis.tune``)."""

from __future__ import annotations

import argparse
import math
import re
import time
from pathlib import Path

from ppas.analysis.plot import check_plot_path, new_figure, save_figure
from ppas.analysis.tune import (
    OBJECTIVES,
    TAKES_SLO,
    TAKES_TPOT_SLO,
    Evaluator,
    StockSpace,
    TuneReport,
    serve_flags,
    short_name,
    tune,
)
from ppas.commands.common import (
    add_cost_args,
    add_slo_arg,
    check_common,
    engine_config,
    floats,
    split_configs,
)
from ppas.commands.trace_args import add_trace_file_arguments, trace_counts
from ppas.core.errors import PpasError
from ppas.core.limits import MAX_BISECT_STEPS, float_arg, int_arg
from ppas.core.outputs import check_output_file, json_text, write_atomic
from ppas.core.slo import SLO_HELP
from ppas.experiment.spec import parse_experiment
from ppas.experiment.tuned import TunedTrace, tuned_experiment
from ppas.workload import Trace, TraceTransform, load_trace

SEARCHES = ("descent", "grid")
_DURATION = re.compile(r"^\s*([0-9.eE+-]+)\s*(ms|s)?\s*$")


def _duration(text: str) -> float:
    """``100ms``, ``0.1s`` or ``0.1`` (seconds) -> seconds, in (0, 3600]."""
    m = _DURATION.match(text)
    try:
        v = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1) if m else math.nan
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and 0 < v <= 3600):
        raise argparse.ArgumentTypeError(f"must be a duration such as 100ms or 0.1s, in (0, "
                                         f"3600 s], got {text!r}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = "exit codes: 0 success; 2 bad input (one line)"
    p.add_argument("trace", help="a trace file (CSV/JSONL: ours, azure, mooncake, burstgpt)")
    add_trace_file_arguments(p)
    add_cost_args(p)
    p.add_argument("--loads", default="1",
                   help="rate multipliers of the (transformed) trace, e.g. 1,1.5,2")
    p.add_argument("--configs", default="ppas;predictive",
                   help="our policies to compare with the best stock setting ('' for none)")
    p.add_argument("--objective", choices=OBJECTIVES.names(), default="mean-e2e",
                   help="mean-e2e: geometric mean over loads of mean E2E; p99-ttft: of P99 "
                        "TTFT, with P99 TPOT within --tpot-slo at every load; capacity: the "
                        "largest rate multiplier with SLO attainment (--slo) >= --attainment "
                        "(the loads as the grid, then bisection)")
    p.add_argument("--tpot-slo", type=_duration, default=None,
                   help="P99 TPOT bound of --objective p99-ttft (e.g. 100ms; default 100ms)")
    add_slo_arg(p)
    p.add_argument("--attainment", type=float_arg(0, 100, lo_open=True), default=None,
                   help="--objective capacity: target SLO attainment in percent (default 90)")
    p.add_argument("--bisect-steps", type=int_arg(0, MAX_BISECT_STEPS), default=None,
                   help="--objective capacity: bisections inside the first failing bracket "
                        "of --loads (default 3)")
    p.add_argument("--search", choices=SEARCHES, default="descent",
                   help="descent: coordinate descent over the knobs (fast); grid: every "
                        "setting (slow: a check of the descent)")
    p.add_argument("--plot", metavar="FILE", help="the P99 TTFT / P99 TPOT plane (png/svg/pdf)")
    p.add_argument("--json", metavar="OUT", help="write everything as JSON")
    p.add_argument("--emit-experiment", metavar="FILE.toml",
                   help="write an experiment file: the tuned stock setting live against "
                        "--configs on this trace (needs --experiment-model)")
    p.add_argument("--experiment-model", metavar="PATH",
                   help="the model the emitted experiment serves: a local folder or a "
                        "Hugging Face id ORG/NAME")


def run(args: argparse.Namespace) -> int:
    check_common(args)
    if args.tpot_slo is not None and args.objective not in TAKES_TPOT_SLO:
        raise PpasError(f"--tpot-slo applies to --objective {', '.join(TAKES_TPOT_SLO)} only")
    given = [f for f in ("slo", "attainment", "bisect_steps") if getattr(args, f) is not None]
    if given and args.objective not in TAKES_SLO:
        raise PpasError(f"{', '.join('--' + f.replace('_', '-') for f in given)} appl"
                        f"{'ies' if len(given) == 1 else 'y'} to --objective "
                        f"{', '.join(TAKES_SLO)} only")
    if args.objective in TAKES_SLO and args.slo is None:
        raise PpasError(f"--objective {args.objective} needs --slo ({SLO_HELP})")
    if args.emit_experiment and not args.experiment_model:
        raise PpasError("--emit-experiment needs --experiment-model (a local model folder or "
                        "a Hugging Face id ORG/NAME)")
    if args.experiment_model and not args.emit_experiment:
        raise PpasError("--experiment-model applies to --emit-experiment only")
    loads = list(dict.fromkeys(floats(args.loads, "--loads", hi=1000.0)))
    ours = split_configs(args.configs) if args.configs.strip() else []
    inputs = [args.trace]
    plot = check_plot_path(args.plot) if args.plot else None
    out_json = check_output_file(args.json, "--json", inputs) if args.json else None
    out_exp = (check_output_file(args.emit_experiment, "--emit-experiment", inputs)
               if args.emit_experiment else None)
    if args.time_scale is not None and args.rate is not None:
        raise PpasError("give --time-scale or --rate, not both (both rescale the arrivals)")
    t0 = time.perf_counter()
    tf = TraceTransform(args.window, args.time_scale, args.rate, args.length_scale,
                        args.drop_longer_than)
    raw = load_trace(args.trace, args.trace_format or "auto", args.trace_block_size or 512,
                     tf.window)  # the window while reading: the rest per load

    def at_load(x: float) -> Trace:
        rest = tf.without_window().at_load(x)
        return rest.apply(raw) if rest else raw

    traces = {x: at_load(x) for x in loads}
    engine = engine_config(args)
    objective = OBJECTIVES.get(args.objective)(
        args.tpot_slo, 0.9 if args.attainment is None else args.attainment / 100,
        3 if args.bisect_steps is None else args.bisect_steps)
    settings = StockSpace().settings(args.vllm_version, args.max_num_seqs)
    ev = Evaluator(dict(traces), args.hardware, args.model, args.cost_model, args.tp, engine,
                   slo=args.slo, make_trace=at_load)
    for x, tr in traces.items():
        print(f"load x{x:g}: {tr.description}, {len(tr)} requests{trace_counts(tr)}")
    print(f"objective: {objective.describe()}"
          + (f"; SLO {args.slo}" if args.slo is not None else "")
          + f"; {len(settings)} stock settings (vLLM "
          f"{args.vllm_version}), {args.search} search")
    rep = tune(settings, ours, ev, objective, method=args.search)
    print_report(rep)
    print(f"({len(rep.search.results)} of {len(settings)} stock settings run, "
          f"{rep.search.simulations} simulations, {time.perf_counter() - t0:.1f} s)")
    if plot:
        plot_front(rep, plot)
        print(f"plot written to {plot}")
    if out_json:
        write_atomic(out_json, json_text(rep.record() | {
            "traces": {f"{x:g}": {"description": t.description, "requests": len(t),
                                  "dropped": dict(t.dropped), "excluded": t.excluded}
                       for x, t in traces.items() if x in loads}},
            allow_nan=True))
        print(f"JSON written to {out_json}")
    if out_exp:
        text = tuned_experiment(
            f"tune-{Path(args.trace).stem}", args.experiment_model,
            TunedTrace(str(Path(args.trace).resolve()), args.trace_format,
                       args.trace_block_size, tf, tuple(loads)),
            rep.best, ours, cost_model=args.cost_model, hardware=args.hardware,
            catalog_model=args.model, max_model_len=engine.max_model_len,
            max_num_seqs=args.max_num_seqs)
        parse_experiment(text, out_exp.stem)  # it must read back
        write_atomic(out_exp, text)
        print(f"experiment written to {out_exp} (ppas experiment {out_exp} --dry-run)")
    return 0


def _f(v: float) -> str:
    return "infeasible" if math.isinf(v) else "nan" if math.isnan(v) else f"{v:.3f}"


def _fo(rep: TuneReport, c: str) -> str:
    """A setting's overall figure (capacity: ``x`` and the multiplier)."""
    v = rep.overall(c)
    return f"x{v:.3g}" if rep.objective.name == "capacity" and math.isfinite(v) else _f(v)


def _pct(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{v:+.1f}%"


def print_report(rep: TuneReport) -> None:
    loads = rep.loads
    res = rep.search.results
    ob = rep.objective
    head = " ".join(f"{'x' + format(x, 'g'):>10}" for x in loads)
    print("\nbest single stock setting (one for every load): "
          f"{short_name(rep.best)}\n  vllm serve MODEL {' '.join(serve_flags(rep.best))}")
    per = "SLO attainment" if ob.higher_is_better else f"{ob.name} ({ob.unit})"
    print(f"\n{per} per load {head} {ob.name if ob.higher_is_better else 'overall':>10}")
    print(f"{'best single stock':<28}" + " ".join(f"{_f(rep.value(rep.best, x)):>10}"
                                                  for x in loads)
          + f" {_fo(rep, rep.best):>10}")
    print(f"{'stock oracle (per load)':<28}" + " ".join(
        f"{_f(rep.value(rep.oracle[x], x)):>10}" for x in loads))
    for c in rep.ours:
        print(f"{c:<28}" + " ".join(f"{_f(rep.value(c, x)):>10}" for x in loads)
              + f" {_fo(rep, c):>10}")
    print("\nstock oracle, per load:")
    for x in loads:
        print(f"  x{x:g}: {short_name(rep.oracle[x])}")
    if rep.ours:
        print(f"\ngain over the best single stock setting ({ob.name}, "
              f"{'higher' if ob.higher_is_better else 'lower'} is better"
              + ("; per load: SLO attainment" if ob.higher_is_better else "") + "):")
        print(f"{'policy':<28}{head} {'overall':>10}")
        for c in rep.ours:
            print(f"{c:<28}" + " ".join(f"{_pct(rep.gain(c, x)):>10}" for x in loads)
                  + f" {_pct(rep.overall_gain(c)):>10}")
    print("\nPareto front of P99 TTFT against P99 TPOT (s), per load, over the stock settings "
          "run there and our policies:")
    for x, names in rep.fronts().items():
        print(f"  load x{x:g}:")
        for n in names:
            f = rep.ours[n][x] if n in rep.ours else res[n][x]
            print(f"    {f.p99_ttft:9.3f} {f.p99_tpot:9.4f}  {short_name(n)}")


def plot_front(rep: TuneReport, path: Path) -> None:
    """P99 TPOT against P99 TTFT: every setting run on the whole trace (dots), the Pareto
    front (line) and our policies (stars), one colour per load."""
    fig, ax = new_figure()
    fronts = rep.fronts()
    for i, x in enumerate(rep.loads):
        color = f"C{i}"
        pts = [r[x] for r in rep.search.results.values() if x in r]
        ax.scatter([f.p99_ttft for f in pts], [f.p99_tpot for f in pts], s=10, color=color,
                   alpha=0.4, label=f"stock, load x{x:g}")
        fr = [rep.ours[n][x] if n in rep.ours else rep.search.results[n][x] for n in fronts[x]]
        ax.plot([f.p99_ttft for f in fr], [f.p99_tpot for f in fr], "-", color=color)
        for j, c in enumerate(rep.ours):
            f = rep.ours[c][x]
            ax.scatter([f.p99_ttft], [f.p99_tpot], marker="*^vsD"[j % 5], s=90,
                       color=color, edgecolor="k", label=c if i == 0 else None)
    ax.set_xlabel("P99 TTFT (s)")
    ax.set_ylabel("P99 TPOT (s)")
    ax.set_title("Stock vLLM settings and our policies, simulated")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, path)
