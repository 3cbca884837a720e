"""``ppas sweep``: burst rates x seeds x configs, the paper's tables and Fig. 3."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ppas.analysis.plot import check_plot_path, plot_e2e_vs_burst
from ppas.analysis.report import table_by_burst, table_improvements, table_lower_bound
from ppas.analysis.sweep import Grid, run_grid
from ppas.commands.common import (
    add_cost_args,
    add_shape_args,
    check_common,
    cost_model_for,
    floats,
    ints,
    max_model_len,
    no_success_exit,
    print_json,
    split_configs,
)
from ppas.core.errors import PpasError
from ppas.core.limits import MAX_RATE
from ppas.core.outputs import check_output_dir, finite, json_text, write_folder
from ppas.workload import PAPER_PHASES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = ("exit codes: 0 success; 1 a run completed no request; 2 bad input (one line)"
                "")
    p.add_argument("--burst-rates", default="0.4,0.6,0.8,1.0,1.2,1.4",
                   help=f"comma-separated requests/s in (0, {MAX_RATE:g}]")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--phases", default=PAPER_PHASES, help="DURATION:RATE,... with {burst}")
    add_shape_args(p)
    add_cost_args(p)
    p.add_argument("--plot", help="write mean E2E vs burst rate (paper Fig. 3) to this file")
    p.add_argument("--out-dir", help="also write records.json, tables.txt (and plot) here")
    p.add_argument("--force", action="store_true",
                   help="let --out-dir replace the records.json, tables.txt and plot it holds")


def run(args: argparse.Namespace) -> int:
    check_common(args)
    configs = split_configs(args.configs)
    bursts = floats(args.burst_rates, "--burst-rates")
    seeds = ints(args.seeds, "--seeds")
    if "{burst}" not in args.phases:
        raise PpasError("--phases must contain {burst} for a sweep over --burst-rates")
    if args.num_kv_blocks is not None:
        raise PpasError("--num-kv-blocks is supported by ppas simulate only")
    if args.scheduling_policy != "fcfs":  # the paper's phase traces carry no priorities
        raise PpasError("--scheduling-policy priority needs a trace with a priority column: "
                        "ppas simulate, capacity or tune --trace FILE")
    grid = Grid(tuple(configs), tuple(bursts), tuple(seeds), args.phases, args.prompt_tokens,
                args.output_tokens, args.max_num_seqs, max_model_len(args))
    for b in bursts:  # bad phases or a too-large trace fail now, before any simulation
        grid.trace(b, seeds[0])
    # Every destination is checked before the work starts (ppas.core.outputs).
    plot = check_plot_path(args.plot) if args.plot else None
    out_dir = check_output_dir(args.out_dir, "--out-dir") if args.out_dir else None
    if out_dir is not None and plot is None:
        check_plot_path(out_dir / "e2e_vs_burst.png")
    names = ("records.json", "tables.txt", *(() if plot else ("e2e_vs_burst.png",)))
    held = [n for n in names if out_dir is not None and os.path.lexists(out_dir / n)]
    if held and not args.force:
        raise PpasError(f"--out-dir {str(out_dir)!r} already holds {', '.join(held)}; "
                        "give a new folder, or --force to replace them")
    for c in configs:
        cost_model_for(args, c)  # e.g. a model that leaves no KV cache: fail before the grid
    progress: Any = None
    if not args.json:
        try:
            from tqdm import tqdm

            def progress(cells):  # type: ignore[no-untyped-def]
                return tqdm(cells, desc="sweep", unit="trace", file=sys.stderr, leave=False)
        except ImportError:
            pass
    records = run_grid(grid, lambda c: cost_model_for(args, c), progress, with_lower_bound=True)
    failed = any(int(r["failed"]) for r in records)
    tables = "\n\n".join(t for t in (
        table_by_burst(records, "avg_latency", "mean E2E latency (s), mean over seeds"),
        table_by_burst(records, "avg_ttft", "mean TTFT (s)"),
        table_by_burst(records, "avg_tpot", "mean TPOT (s)"),
        table_by_burst(records, "failed", "failed requests, mean over seeds") if failed else "",
        table_improvements(records, ["mbt:2048", "mbt:16384"]),
        table_lower_bound(records)) if t)
    # Results reach stdout first: a plot or folder that then fails to write loses nothing.
    if args.json:
        print_json(records)
    else:
        print(tables, flush=True)
    if plot is not None:
        plot_e2e_vs_burst(records, plot)
    if out_dir is not None:
        files = {
            "records.json": lambda p: p.write_text(json_text(finite(records))),
            "tables.txt": lambda p: p.write_text(tables + "\n"),
        }
        if plot is None:
            files["e2e_vs_burst.png"] = lambda p: plot_e2e_vs_burst(records, p, fmt="png")
        write_folder(out_dir, files)
    return no_success_exit(records, "sweep")
