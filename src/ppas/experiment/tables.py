"""The report's tables, one function each, from the runs (and their predictions).

Invariants:

* a comparison pairs two arms by trace (same load and seed, so the same arrivals and
  prompts) and uses a run's mean E2E only when it has one and no request failed
  (``Paired``);
* only arms complete at a load (every seed) are ranked at it (``winners``, the oracle's
  best baseline);
* a verdict or mark is given only where its interval excludes 1 (``ppas.analysis.stats``);
* a paired bootstrap interval is given only over ``min_bootstrap_n`` traces or more (6 at
  95%); below, the ratio alone and why (``n=2: no bootstrap interval, ...``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypedDict

from ppas.analysis.stats import (
    Interval,
    best_arm,
    geomean,
    paired_bootstrap_ratio,
    paired_t_ratio,
    t_interval,
)
from ppas.core.metrics import RunSummary
from ppas.cost.fitted import FittedCostModel
from ppas.experiment.prediction import SIM_TOLERANCE, Predicted, step_time_error, why_off
from ppas.experiment.runfile import RunFile
from ppas.experiment.slo import TAIL_KEYS, RunKey
from ppas.experiment.spec import Experiment

#: (summary key, column title): the per-cell statistics
METRICS = (("avg_latency", "mean E2E"), ("p95_latency", "P95 E2E"), ("e2e_p99", "P99 E2E"),
           ("avg_ttft", "mean TTFT"),
           ("p95_ttft", "P95 TTFT"), ("avg_tpot", "mean TPOT"), ("p95_tpot", "P95 TPOT"),
           ("makespan", "makespan"), ("failed", "failed"))

Row = dict[str, Any]  # one row of a table, as report.json holds it


class Report(TypedDict):
    """``report.json``: the tables and what they were made from."""

    experiment: str
    description: str
    level: float
    slo: str | None  # ``[report] slo``: what the cells' attainment and goodput are against
    load_name: str
    num_runs: int
    planned_runs: int
    cost_model: dict[str, Any] | None  # ``prediction.model_dict``
    probe: dict[str, Any] | None  # ``probe.probe_dict``: capacity_loads only
    cells: list[Row]
    improvements: list[Row]
    winners: list[Row]
    baseline_pairs: list[Row]
    oracle: list[Row]
    simulator: list[Row]
    relative: Row  # {"reference": arm or None, "rows": [...]}
    runs: list[Row]
    ignored: list[Row]  # {"file", "problem"}: files there that are no complete run


class Paired:
    """The runs' mean E2E by trace, for paired comparisons of arms."""

    def __init__(self, exp: Experiment, runs: Sequence[RunFile]) -> None:
        self.exp = exp
        self.runs = runs

    def e2e(self, arm: str, load: float | None) -> dict[tuple[float, int], float]:
        """``(load, seed) -> mean E2E`` of the arm's usable runs (at ``load``, or all)."""
        return {(r.load, r.seed): float(r.summary["avg_latency"]) for r in self.runs
                if r.arm == arm and (load is None or r.load == load)
                and r.summary.get("avg_latency") and not r.summary.get("failed")}

    def paired(self, a: str, b: str, load: float | None) -> tuple[list[float], list[float]]:
        """Both arms' mean E2E over the traces both ran."""
        x, y = self.e2e(a, load), self.e2e(b, load)
        keys = sorted(set(x) & set(y))
        return [x[k] for k in keys], [y[k] for k in keys]

    def geomean_at(self, arm: str, load: float) -> float | None:
        """The arm's geometric-mean E2E at ``load``; None unless it ran every seed."""
        vals = self.e2e(arm, load)
        if len(vals) != len(self.exp.workload.seeds):
            return None
        return geomean(list(vals.values()))

    def bootstrap(self, xa: Sequence[float], xb: Sequence[float]) -> tuple[Interval, str | None]:
        """The geometric-mean ratio with its paired bootstrap interval; with fewer than
        ``min_bootstrap_n`` traces the ratio alone (no interval: lo, hi infinite) and why."""
        rep = self.exp.report
        n, need = len(xa), min_bootstrap_n(rep.level)
        if n < need:
            est = geomean(list(xa)) / geomean(list(xb))
            return (Interval(est, -math.inf, math.inf, n, rep.level),
                    f"n={n}: no bootstrap interval, needs n >= {need} at {rep.level:.0%}")
        return paired_bootstrap_ratio(xa, xb, level=rep.level, n_boot=rep.n_boot,
                                      seed=rep.bootstrap_seed), None


def min_bootstrap_n(level: float) -> int:
    """The fewest paired traces a percentile bootstrap interval is given for. The interval
    lies within the range of the per-trace ratios, and the range of n traces holds their
    median with probability 1 - 2**(1 - n) only: below ``level`` (n < 6 at 95%) it cannot
    be a ``level`` interval. Two traces give three distinct resamples, not an interval."""
    return math.ceil(1 + math.log2(1 / (1 - level)) - 1e-9)


def _iv(xs: Sequence[float | None], level: float) -> Interval | None:
    vals = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    return t_interval(vals, level) if vals else None


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def cells(exp: Experiment, runs: Sequence[Predicted],
          sums: dict[RunKey, RunSummary | None]) -> list[Row]:
    """Per (arm, load): each metric's mean and t-interval over seeds; the simulator's; the
    tails (P50/P90/P99 of TTFT, TPOT, ITL, E2E) of the runs' requests (``sums``, from
    ``ppas.experiment.slo``) and, under the report's SLO, attainment and goodput."""
    level = exp.report.level
    by: dict[tuple[str, float], list[Predicted]] = {}
    for p in runs:
        by.setdefault((p.run.arm, p.run.load), []).append(p)
    out = []
    for arm in exp.arms:
        for load in exp.workload.loads:
            ps = by.get((arm.name, load), [])
            if not ps:
                continue
            c: Row = {"arm": arm.name, "load": load, "seeds": [p.run.seed for p in ps],
                      "retried_runs": sum(1 for p in ps if p.run.retried)}
            for key, _ in METRICS:
                iv = _iv([p.run.summary.get(key) for p in ps], level)
                c[key] = None if iv is None else iv.to_dict()
            c["sim_avg_latency"] = _mean([p.pred.sim["avg_latency"] for p in ps if p.pred.sim])
            c["sim_e2e_p99"] = _mean([p.pred.sim["e2e_p99"] for p in ps if p.pred.sim])
            c["sim_error"] = _mean([p.pred.error for p in ps if p.pred.error is not None])
            c["sim_note"] = next((p.pred.note for p in ps if p.pred.note), None)
            ss = [s for p in ps if (s := sums.get((p.run.arm, p.run.load, p.run.seed)))]
            for key in TAIL_KEYS:
                iv = _iv([s.tails.get(key) for s in ss], level)
                c[key] = None if iv is None else iv.to_dict()
            if exp.report.slo is not None:
                for key in ("slo_attainment", "goodput"):
                    iv = _iv([getattr(s, key) for s in ss], level)
                    c[key] = None if iv is None else iv.to_dict()
            out.append(c)
    return out


def improvements(exp: Experiment, pr: Paired) -> list[Row]:
    """Each arm against each baseline arm (a baseline against earlier-listed baselines
    only): the geometric-mean ratio per load and overall, paired bootstrap CI."""
    out = []
    base_names = [a.name for a in exp.arms if a.baseline]
    for base in (a for a in exp.arms if a.baseline):
        for arm in exp.arms:
            if arm.name == base.name or (arm.baseline and base_names.index(base.name)
                                         > base_names.index(arm.name)):
                continue
            loads: list[float | None] = [*exp.workload.loads, None]
            for ld in loads:
                xa, xb = pr.paired(arm.name, base.name, ld)
                if not xa:
                    continue
                iv, note = pr.bootstrap(xa, xb)
                out.append({"arm": arm.name, "baseline": base.name, "load": ld,
                            "ratio": iv.to_dict(), "improvement": 1 - iv.estimate,
                            "significant": iv.excludes(1.0), "note": note})
    return out


def oracle(exp: Experiment, pr: Paired) -> list[Row]:
    """Each non-baseline arm against the best baseline arm of each load (lowest
    geometric-mean E2E over seeds): paired t per load, paired bootstrap over all traces."""
    w = exp.workload
    base_names = [a.name for a in exp.arms if a.baseline]
    best_base: dict[float, str] = {}
    for load in w.loads:
        ranked = sorted((g, b) for b in base_names if (g := pr.geomean_at(b, load)) is not None)
        if ranked:
            best_base[load] = ranked[0][1]
    out = []
    for arm in (a for a in exp.arms if not a.baseline):
        all_a: list[float] = []
        all_b: list[float] = []
        for load, bname in best_base.items():
            xa, xb = pr.paired(arm.name, bname, load)
            all_a += xa
            all_b += xb
            if len(xa) < 2:
                continue
            iv = paired_t_ratio(xa, xb, exp.report.level)
            out.append({"arm": arm.name, "load": load, "baseline": bname,
                        "ratio": iv.to_dict(), "verdict": _verdict(iv)})
        if all_a and len(best_base) == len(w.loads):
            iv, note = pr.bootstrap(all_a, all_b)
            out.append({"arm": arm.name, "load": None, "baseline": "best per load",
                        "ratio": iv.to_dict(), "verdict": note or _verdict(iv), "note": note})
    return out


def winners(exp: Experiment, pr: Paired) -> list[Row]:
    """Per load, among the arms that ran every seed: the lowest geometric-mean E2E, marked
    only when it beats every other arm at the family-wise level (``best_arm``)."""
    out = []
    for load in exp.workload.loads:
        complete = {arm.name: pr.e2e(arm.name, load) for arm in exp.arms}
        complete = {a: v for a, v in complete.items() if len(v) == len(exp.workload.seeds)}
        if len(complete) < 2:
            continue
        keys = sorted(next(iter(complete.values())))
        best = best_arm({a: [v[k] for k in keys] for a, v in complete.items()},
                        exp.report.level)
        out.append({"load": load, "winner": best.winner, "runner_up": best.runner_up,
                    "ratio": best.ratio.to_dict(), "level_each": best.level_each,
                    "marked": best.marked})
    return out


def baseline_pairs(exp: Experiment, pr: Paired) -> list[Row]:
    """Every pair of baseline arms per load, paired t (the fixed-budget crossover)."""
    out = []
    bases = [a.name for a in exp.arms if a.baseline]
    for i, a in enumerate(bases):
        for b in bases[i + 1:]:
            for load in exp.workload.loads:
                xa, xb = pr.paired(a, b, load)
                if len(xa) < 2:
                    continue
                iv = paired_t_ratio(xa, xb, exp.report.level)
                verdict = (f"{a} lower" if iv.hi < 1 else f"{b} lower" if iv.lo > 1
                           else "within noise")
                out.append({"a": a, "b": b, "load": load, "ratio": iv.to_dict(),
                            "verdict": verdict})
    return out


def relative(exp: Experiment, pr: Paired) -> Row:
    """Every arm against the first baseline arm, paired t, per load (the plot's right
    panel)."""
    rows = []
    ref = next((a.name for a in exp.arms if a.baseline), None)
    for arm in exp.arms:
        for load in exp.workload.loads:
            xa, xb = pr.paired(arm.name, ref, load) if ref is not None else ([], [])
            if xa:
                rows.append({"arm": arm.name, "load": load,
                             "ratio": paired_t_ratio(xa, xb, exp.report.level).to_dict()})
    return {"reference": ref, "rows": rows}


def simulator(exp: Experiment, runs: Sequence[Predicted],
              model: FittedCostModel | None) -> list[Row]:
    """Per arm: the simulator's mean and largest error, and why it is off when it is."""
    out = []
    for arm in exp.arms:
        mine = [p for p in runs if p.run.arm == arm.name]
        errs = [p.pred.error for p in mine if p.pred.error is not None]
        note = next((p.pred.note for p in mine if p.pred.note), None)
        mean_err = _mean(errs)
        off = mean_err is not None and abs(mean_err) > SIM_TOLERANCE
        step_err = step_time_error(model, [p.run for p in mine])
        if off and note is None:
            note = why_off(step_err)
        policy = next((p.pred.policy for p in mine if p.pred.policy), None)
        out.append({"arm": arm.name, "plugin": arm.plugin, "sim_policy": policy,
                    "mean_error": mean_err,
                    "max_abs_error": max((abs(e) for e in errs), default=None),
                    "within_tolerance": None if mean_err is None else not off,
                    "step_time_error": step_err, "note": note})
    return out


def run_rows(runs: Sequence[Predicted]) -> list[Row]:
    """Every run: its identity, attempts, prediction and the summary's metrics."""
    return [{"arm": r.arm, "load": r.load, "seed": r.seed, "prompt_seed": r.prompt_seed,
             "retried": r.retried, "attempts": [a.to_json() for a in r.attempts],
             "wall_s": r.wall_s, "sim": p.pred.sim, "sim_error": p.pred.error,
             "summary": {k: r.summary.get(k) for k, _ in METRICS}}
            for p in runs for r in (p.run,)]


def _verdict(iv: Interval) -> str:
    """An arm/baseline ratio's verdict: lower or higher only where the CI excludes 1."""
    return "lower" if iv.hi < 1 else "higher" if iv.lo > 1 else "within noise"
