"""``ppas sweep``: burst rates x seeds x configs, the paper's tables and Fig. 3."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ppas.commands.common import (
    add_cost_args,
    add_shape_args,
    check_common,
    cost_model_for,
    floats,
    ints,
    print_json,
    split_configs,
)
from ppas.errors import PpasError
from ppas.report import table_by_burst, table_improvements, table_lower_bound
from ppas.sweep import Grid, run_grid
from ppas.workload import PAPER_PHASES, parse_phases


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--burst-rates", default="0.4,0.6,0.8,1.0,1.2,1.4")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--phases", default=PAPER_PHASES, help="DURATION:RATE,... with {burst}")
    add_shape_args(p)
    add_cost_args(p)
    p.add_argument("--plot", help="write mean E2E vs burst rate (paper Fig. 3) to this file")
    p.add_argument("--out-dir", help="also write records.json, tables.txt (and plot) here")


def run(args: argparse.Namespace) -> int:
    check_common(args)
    configs = split_configs(args.configs)
    bursts = floats(args.burst_rates, "--burst-rates")
    seeds = ints(args.seeds, "--seeds")
    if "{burst}" not in args.phases:
        raise PpasError("--phases must contain {burst} for a sweep over --burst-rates")
    parse_phases(args.phases, bursts[0])
    out_dir = Path(args.out_dir) if args.out_dir else None
    if out_dir is not None and out_dir.exists() and not out_dir.is_dir():
        raise PpasError(f"--out-dir {str(out_dir)!r} exists and is not a directory")
    if args.num_kv_blocks is not None:
        raise PpasError("--num-kv-blocks is supported by ppas simulate only")
    if args.plot:
        from ppas.plot import check_plot_path

        check_plot_path(args.plot)
    grid = Grid(tuple(configs), tuple(bursts), tuple(seeds), args.phases, args.prompt_tokens,
                args.output_tokens, args.max_num_seqs)
    progress: Any = None
    if not args.json:
        try:
            from tqdm import tqdm

            def progress(cells):  # type: ignore[no-untyped-def]
                return tqdm(cells, desc="sweep", unit="trace", file=sys.stderr, leave=False)
        except ImportError:
            pass
    records = run_grid(grid, lambda c: cost_model_for(args, c), progress, with_lower_bound=True)
    tables = "\n\n".join(t for t in (
        table_by_burst(records, "avg_latency", "mean E2E latency (s), mean over seeds"),
        table_by_burst(records, "avg_ttft", "mean TTFT (s)"),
        table_by_burst(records, "avg_tpot", "mean TPOT (s)"),
        table_improvements(records, ["mbt:2048", "mbt:16384"]),
        table_lower_bound(records)) if t)
    if args.plot:
        from ppas.plot import plot_e2e_vs_burst

        plot_e2e_vs_burst(records, args.plot)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "records.json").write_text(json.dumps(records, indent=1) + "\n")
        (out_dir / "tables.txt").write_text(tables + "\n")
        if not args.plot:
            from ppas.plot import plot_e2e_vs_burst

            plot_e2e_vs_burst(records, out_dir / "e2e_vs_burst.png")
    if args.json:
        print_json(records)
    else:
        print(tables)
    return 0
