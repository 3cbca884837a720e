"""The experiment's report: statistics over seeds, paired comparisons, the simulator beside.

From the run files only (so it can be rebuilt at any time, also from a partial experiment):

* per (arm, load): mean and t-interval over seeds of mean/P95 E2E, TTFT, TPOT, makespan
  and failed requests (``ppas.analysis.stats.t_interval``);
* per arm and baseline arm: the geometric-mean ratio of mean E2E over the traces both ran,
  per load and overall, with a paired bootstrap CI (``improvement = 1 - ratio``);
* per arm that is not a baseline: against the best baseline arm *of each load* (an oracle
  that picks, per load, the baseline with the lowest geometric-mean E2E over seeds): the
  paired t-interval per load, and the geometric-mean ratio over every trace with a paired
  bootstrap CI (issue #7: "beat the best stock setting per burst");
* per load: the winner (lowest geometric-mean E2E over seeds) is marked only when the paired
  t-interval of every other arm / winner excludes 1 at the family-wise level (Bonferroni over
  the k - 1 comparisons), else "within noise"; the paired t-test at ``level`` for every
  pair of baseline arms (the fixed-budget crossover);
* per (arm, load): P50/P90/P99 of TTFT, TPOT, ITL and E2E over each run's requests, and,
  when the file gives ``[report] slo``, SLO attainment and goodput (``RunSummary``'s, as
  ``ppas bench`` measures them; ``ppas.experiment.slo``), means over seeds;
* the simulator's prediction of every run: a cost model fitted to every plugin arm's step
  slices (``cost-report.json``), the run's trace, the arm's policy; the error beside the
  measurement, and the arms whose mean error exceeds ``SIM_TOLERANCE`` named with why.

Each table is one function of ``ppas.experiment.tables``, the prediction is
``ppas.experiment.prediction``, the figure ``ppas.experiment.figure``; this module lists
them (``build_report``), prints them (``format_report``) and writes the files.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ppas.calibrate.fit import fit_and_save
from ppas.core.metrics import TAIL_QS
from ppas.core.outputs import write_atomic, write_json_atomic
from ppas.core.steplog import Step
from ppas.cost.fitted import FittedCostModel
from ppas.experiment import tables
from ppas.experiment.figure import plot_arms, plot_report
from ppas.experiment.folder import ResultsFolder
from ppas.experiment.prediction import SIM_TOLERANCE, model_dict, predict
from ppas.experiment.probe import probe_dict, resolved
from ppas.experiment.runfile import RunFile
from ppas.experiment.slo import TAIL_KEYS, run_summaries
from ppas.experiment.spec import Experiment
from ppas.experiment.tables import Report
from ppas.experiment.traces import load_text

REPORT_COST = "cost-report.json"


def build_report(exp: Experiment) -> Report:
    """The report of the folder's completed runs (``report.json``)."""
    exp = resolved(exp)  # capacity_loads: the traces the folder's probe set
    folder = ResultsFolder(exp)
    runs = folder.runs()
    model = _fit_report_model(exp, runs)
    predicted = predict(exp, runs, model)
    pr = tables.Paired(exp, runs)
    return {"experiment": exp.name, "description": exp.description, "level": exp.report.level,
            "slo": exp.report.slo, "load_name": exp.workload.load_name, "num_runs": len(runs),
            "planned_runs": exp.num_runs(),
            "cost_model": None if model is None else model_dict(model),
            "probe": probe_dict(exp),
            "cells": tables.cells(exp, predicted, run_summaries(exp, runs)),
            "improvements": tables.improvements(exp, pr),
            "winners": tables.winners(exp, pr),
            "baseline_pairs": tables.baseline_pairs(exp, pr),
            "oracle": tables.oracle(exp, pr),
            "simulator": tables.simulator(exp, predicted, model),
            "relative": tables.relative(exp, pr),
            "runs": tables.run_rows(predicted),
            "ignored": [{"file": str(c.path), "problem": c.problem} for c in folder.ignored()]}


def _fit_report_model(exp: Experiment, runs: Sequence[RunFile]) -> FittedCostModel | None:
    """The cost model of every plugin arm's step slices (``cost-report.json``), or None
    with fewer than 10 steps."""
    steps = [Step.of(s) for r in runs if r.policy for s in r.steps]
    if len(steps) < 10:
        return None
    folder = ResultsFolder(exp)
    return fit_and_save(steps, folder.out / REPORT_COST, sources=[
        str(folder.arm_dir(a.name)) for a in exp.arms if a.plugin])


def write_report(exp: Experiment) -> tuple[str, Report]:
    """Build the report and write report.txt, report.json, report.png and report-arms.png
    (atomically; the plots only where matplotlib is installed)."""
    out = Path(exp.out_dir)
    rep = build_report(exp)
    text = format_report(rep)
    write_atomic(out / "report.txt", text + "\n")
    write_json_atomic(out / "report.json", rep)
    if importlib.util.find_spec("matplotlib") is not None and rep["cells"]:
        plot_report(rep, out / "report.png")
        plot_arms(rep, out / "report-arms.png")
    return text, rep


# ---------------------------------------------------------------- text


def _pm(d: dict[str, Any] | None, digits: int = 2) -> str:
    if d is None or d.get("estimate") is None:
        return "n/a"
    est = d["estimate"]
    if d.get("hi") is None or d.get("lo") is None:
        return f"{est:.{digits}f}"
    return f"{est:.{digits}f}±{(d['hi'] - d['lo']) / 2:.{digits}f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def format_report(rep: Report) -> str:
    """``report.txt``: the tables, one block each."""
    return "\n".join([*_probe_text(rep), *_cells_text(rep), *_tails_text(rep), "",
                      *_winners_text(rep), *_pairs_text(rep), *_oracle_text(rep),
                      *_improvements_text(rep), "", *_simulator_text(rep),
                      *_retried_text(rep), *_ignored_text(rep)])


def _cells_text(rep: Report) -> list[str]:
    lvl, ln = f"{rep['level']:.0%}", rep["load_name"]
    head = (f"{ln:>6}  {'arm':<18} {'mean E2E':>11} {'P95 E2E':>11} {'P99 E2E':>11} "
            f"{'mean TTFT':>11} {'mean TPOT':>13} {'makespan':>11} {'failed':>9} | "
            f"{'sim E2E':>7} {'error':>7} {'sim P99':>7}")
    out = [f"experiment {rep['experiment']}: {rep['num_runs']}/{rep['planned_runs']} runs; "
           f"seconds, mean ± half-width of the {lvl} t-interval over seeds",
           head, "-" * len(head)]
    for c in sorted(rep["cells"], key=lambda c: c["load"]):
        sim = "n/a" if c["sim_avg_latency"] is None else f"{c['sim_avg_latency']:.2f}"
        sim99 = "n/a" if c.get("sim_e2e_p99") is None else f"{c['sim_e2e_p99']:.2f}"
        out.append(f"{_load(c['load']):>6}  {c['arm']:<18} {_pm(c['avg_latency']):>11} "
                   f"{_pm(c['p95_latency']):>11} {_pm(c.get('e2e_p99')):>11} "
                   f"{_pm(c['avg_ttft']):>11} {_pm(c['avg_tpot'], 4):>13} "
                   f"{_pm(c['makespan'], 1):>11} {_pm(c['failed'], 1):>9} | {sim:>7} "
                   f"{_pct(c['sim_error']):>7} {sim99:>7}")
    return out


def _tails_text(rep: Report) -> list[str]:
    """P50/P90/P99 of TTFT and E2E (s), TPOT and ITL (ms), means over seeds; attainment and
    goodput under the report's SLO."""
    rows = [c for c in sorted(rep["cells"], key=lambda c: c["load"])
            if any(c.get(k) for k in TAIL_KEYS)]
    if not rows:
        return []
    slo = rep.get("slo")
    lvl, ln = f"{rep['level']:.0%}", rep["load_name"]
    groups = (("TTFT s", "ttft", 1.0, 3), ("TPOT ms", "tpot", 1e3, 1), ("ITL ms", "itl", 1e3, 1),
              ("E2E s", "e2e", 1.0, 3))
    head = f"{ln:>6}  {'arm':<18}" + "".join(f" | {g + ' P50/P90/P99':^26}" for g, *_ in groups)
    if slo is not None:
        head += f" | {'attainment':>11} {'goodput':>11}"
    out = ["", "tail latencies (means over seeds)"
           + (f"; SLO {slo}: attainment (share of requests meeting it, failed ones "
              f"missing) and goodput (req/s), mean ± half-width of the {lvl} t-interval"
              if slo is not None else ""), head, "-" * len(head)]
    for c in rows:
        line = f"{_load(c['load']):>6}  {c['arm']:<18}"
        for _, m, scale, digits in groups:
            vals = [c.get(f"{m}_p{q}") for q in TAIL_QS]
            line += " | " + "/".join("n/a" if v is None else f"{v['estimate'] * scale:.{digits}f}"
                                     for v in vals).rjust(26)
        if slo is not None:
            att = c.get("slo_attainment")
            att_text = "n/a" if att is None else _pm(_times(att, 100), 1) + "%"
            line += f" | {att_text:>11} {_pm(c.get('goodput')):>11}"
        out.append(line)
    return out


def _times(d: dict[str, Any] | None, k: float) -> dict[str, Any] | None:
    """An interval dict scaled by ``k``."""
    if d is None:
        return None
    return {key: (v * k if isinstance(v, float | int) and key in ("estimate", "lo", "hi")
                  else v) for key, v in d.items()}


def _probe_text(rep: Report) -> list[str]:
    """``capacity_loads``: the probe, and the arrival-time scale it gave each trace."""
    pr = rep.get("probe")
    if pr is None:
        return []
    if pr["result"] is None:
        return ["loads are fractions of the probed prefill capacity; no probe has run yet", ""]
    scales = ", ".join(f"{_load(t['load'])}/seed {t['seed']}: x{t['time_scale']:.3g}"
                       for t in pr["time_scales"])
    return [f"loads are fractions of the {pr['describe']}",
            f"arrival-time scale per load/seed (each trace offers load x capacity in prompt "
            f"tokens/s): {scales}", ""]


def _winners_text(rep: Report) -> list[str]:
    lvl, ln = f"{rep['level']:.0%}", rep["load_name"]
    return [f"winner per {ln} (lowest geometric-mean E2E over seeds; marked only if, at a "
            f"family-wise {lvl}, the paired t-interval of every other arm/winner excludes "
            "1: Bonferroni; shown: the runner-up's):",
            *(f"  {ln} {_load(w['load'])}: {'WINNER' if w['marked'] else 'within noise'}: "
              f"{w['winner']} ahead of {w['runner_up']} by {_ratio(w['ratio'])}"
              for w in rep["winners"])]


def _pairs_text(rep: Report) -> list[str]:
    lvl, ln = f"{rep['level']:.0%}", rep["load_name"]
    return _block(f"baseline arms head to head (ratio of mean E2E a/b, paired {lvl} "
                  "t-interval):",
                  [f"  {ln} {_load(p['load'])}: {p['a']} / {p['b']} = {_ratio(p['ratio'])}: "
                   f"{p['verdict']}" for p in rep["baseline_pairs"]])


def _oracle_text(rep: Report) -> list[str]:
    lvl, ln = f"{rep['level']:.0%}", rep["load_name"]
    return _block(f"against the best baseline arm of each {ln} (oracle; ratio of mean E2E "
                  f"arm/baseline; per {ln}: paired {lvl} t-interval, all: geometric mean "
                  f"with a paired bootstrap {lvl} CI):",
                  [f"  {o['arm']:<18} vs {o['baseline']:<14} {ln} {_where(o['load']):>5}: "
                   + (f"x{o['ratio']['estimate']:.2f}" if o.get("note")
                      else _ratio(o["ratio"])) + f": {o['verdict']}" for o in rep["oracle"]])


def _improvements_text(rep: Report) -> list[str]:
    lvl, ln = f"{rep['level']:.0%}", rep["load_name"]
    lines = []
    for imp in rep["improvements"]:
        r = imp["ratio"]
        lo = None if r["hi"] is None else 1 - r["hi"]
        hi = None if r["lo"] is None else 1 - r["lo"]
        ci = (f"({imp['note']})" if imp.get("note")
              else f"[{_pct(lo)}, {_pct(hi)}]{' *' if imp['significant'] else ''}")
        lines.append(f"  {imp['arm']:<18} vs {imp['baseline']:<14} {ln} "
                     f"{_where(imp['load']):>5}: {imp['improvement']:+7.1%} {ci}")
    return _block(f"geometric-mean improvement of mean E2E over each baseline (paired "
                  f"bootstrap {lvl} CI; + = lower latency; * = CI excludes 0):", lines)


def _block(title: str, lines: list[str]) -> list[str]:
    """A table after a blank line; nothing when it has no rows."""
    return ["", title, *lines] if lines else []


def _ratio(r: dict[str, Any]) -> str:
    return f"x{r['estimate']:.2f} [{_num(r['lo'])}, {_num(r['hi'])}]"


def _where(load: float | None) -> str:
    return "all" if load is None else _load(load)


def _simulator_text(rep: Report) -> list[str]:
    out = []
    cm = rep["cost_model"]
    if cm is not None:
        st, co = cm.get("fit") or {}, cm["coefficients"]
        out.append(f"simulator: cost model fitted to the plugin arms' step logs "
                   f"(overhead {co['overhead_s'] * 1e3:.2f} ms, "
                   f"{co['per_prefill_token_s'] * 1e6:.1f} us/prefill token; "
                   f"{st.get('num_steps', '?')} steps, MAPE {_pctu(st.get('mape'))})")
    for s in rep["simulator"]:
        as_ = "" if s["plugin"] or not s["sim_policy"] else f" (simulated as {s['sim_policy']})"
        if s["mean_error"] is None:
            out.append(f"  {s['arm']}: no prediction ({s['note'] or 'no runs'})")
        elif not s["within_tolerance"]:
            out.append(f"  {s['arm']}{as_}: OFF by {s['mean_error']:+.1%} on average (> "
                       f"{SIM_TOLERANCE:.0%}); max |error| {s['max_abs_error']:.1%}: "
                       f"{s['note']}")
        else:
            out.append(f"  {s['arm']}{as_}: mean error {s['mean_error']:+.1%} (max |error| "
                       f"{s['max_abs_error']:.1%})")
    return out


def _retried_text(rep: Report) -> list[str]:
    retried = sum(1 for r in rep["runs"] if r.get("retried"))
    if not retried:
        return []
    return [f"{retried} run(s) were retried after a server death (see their files)"]


def _ignored_text(rep: Report) -> list[str]:
    """The run files that are there but are no complete run: not read, re-run by
    ``--resume``."""
    ign = rep["ignored"]
    if not ign:
        return []
    return [f"{len(ign)} run file(s) ignored (not complete runs; --resume runs them again):",
            *(f"  ignored: {i['file']}: {i['problem']}" for i in ign)]


def _pctu(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _num(x: float | None) -> str:
    return "inf" if x is None else f"{x:.2f}"


def _load(x: float) -> str:
    return load_text(x)
