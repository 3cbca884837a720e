"""``ppas experiment FILE``: a live comparison of scheduling arms on a real engine, with
statistics (``ppas.experiment``; the file format is ``ppas.experiment.spec``'s docstring).

    ppas experiment experiments/demo-cpu.toml --dry-run   # the plan, runs, estimated time
    ppas experiment experiments/demo-cpu.toml             # run, then report
    ppas experiment experiments/demo-cpu.toml --resume    # finish after a crash or Ctrl-C
    ppas experiment experiments/demo-cpu.toml --report    # rebuild the report only

Exit codes: 0 done, 2 bad file or arguments (one line), 130 interrupted (completed runs
are kept; ``--resume`` continues), 1 a server could not be started or died twice, or a run
in which no request succeeded (``--resume`` runs it again). One experiment at a time writes
a folder: a second one into it is refused (exit 2).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from ppas.core.errors import PpasError

if TYPE_CHECKING:
    from ppas.experiment.spec import Experiment


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="experiment file (TOML)")
    p.add_argument("--dry-run", action="store_true",
                   help="validate, print the plan, the number of runs and the estimated time")
    p.add_argument("--resume", action="store_true",
                   help="keep the completed runs in the experiment's folder, run the rest")
    p.add_argument("--report", action="store_true",
                   help="only rebuild report.txt/.json/.png from the completed runs")
    p.add_argument("--out-dir", help="results folder (default: the file's out_dir)")


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top: ``ppas --help`` imports every command module
    from ppas.experiment.plan import estimate, plan_text
    from ppas.experiment.runner import Interrupted, Runner
    from ppas.experiment.spec import load_experiment

    exp = load_experiment(args.file, args.out_dir)
    if sum((args.dry_run, args.resume, args.report)) > 1:
        raise PpasError("give at most one of --dry-run, --resume, --report")
    runner = Runner(exp)
    folder = runner.folder
    if args.dry_run:
        folder.check_path()
        print(plan_text(exp, estimate(exp), folder.completed()))
        return 0
    if args.report:
        folder.check_path()
        folder.check_same("--report")
        return _report(exp, time.monotonic())
    with folder.locked():
        folder.prepare(resume=args.resume)
        est = estimate(exp)
        print(plan_text(exp, est, folder.completed()), file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            runner.run(est)
        except Interrupted:
            n = len(folder.completed())
            print(f"ppas experiment: stopped; {n}/{exp.num_runs()} runs complete in "
                  f"{exp.out_dir}/ (rerun with --resume to finish)", file=sys.stderr)
            return 130
        except PpasError as e:
            n = len(folder.completed())
            print(f"ppas experiment: error: {str(e).splitlines()[0]}\n{n}/{exp.num_runs()} "
                  f"runs complete in {exp.out_dir}/ (fix and rerun with --resume)",
                  file=sys.stderr)
            return 1
        return _report(exp, t0)


def _report(exp: Experiment, t0: float) -> int:
    from ppas.experiment.report import write_report  # here for ``ppas --help``, as in run

    text, rep = write_report(exp)
    print(text)
    print(f"report: {exp.out_dir}/report.txt, report.json, report.png, report-arms.png "
          f"({rep['num_runs']} runs; {time.monotonic() - t0:.0f} s)")
    return 0
