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
* the simulator's prediction of every run: a cost model fitted to every plugin arm's step
  slices (``cost-report.json``), the run's trace, the arm's policy; the error beside the
  measurement, and the arms whose mean error exceeds ``SIM_TOLERANCE`` named with why.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ppas.analysis.stats import (
    Interval,
    best_arm,
    geomean,
    paired_bootstrap_ratio,
    paired_t_ratio,
    t_interval,
)
from ppas.core.steplog import Step
from ppas.experiment.runner import RUNS_DIR, run_path, slug
from ppas.experiment.spec import Experiment

METRICS = (("avg_latency", "mean E2E"), ("p95_latency", "P95 E2E"), ("avg_ttft", "mean TTFT"),
           ("p95_ttft", "P95 TTFT"), ("avg_tpot", "mean TPOT"), ("p95_tpot", "P95 TPOT"),
           ("makespan", "makespan"), ("failed", "failed"))
SIM_TOLERANCE = 0.15
REPORT_COST = "cost-report.json"


def load_runs(exp: Experiment) -> list[dict[str, Any]]:
    """Every completed run file, in (arm order, load, seed) order."""
    runs = []
    w = exp.workload
    for arm in exp.arms:
        for load, seed in exp.cells():
            p = run_path(Path(exp.out_dir), arm.name, w.load_label(load), seed)
            if p.is_file():
                runs.append(json.loads(p.read_text()))
    return runs


def _fit_report_model(exp: Experiment, runs: Sequence[dict[str, Any]]) -> Any:
    from ppas.calibrate.fit import fit_and_save

    steps = [Step.of(s) for r in runs if r.get("policy") for s in r.get("steps", [])]
    if len(steps) < 10:
        return None
    out = Path(exp.out_dir)
    return fit_and_save(steps, out / REPORT_COST, sources=[
        str(out / RUNS_DIR / slug(a.name)) for a in exp.arms if a.plugin])


def _simulate(exp: Experiment, runs: list[dict[str, Any]], model: Any) -> None:
    """Add ``sim`` (predicted avg/p95 E2E) and ``sim_error`` to every run, or ``sim_note``."""
    from ppas.engine.simulator import EngineConfig, simulate
    from ppas.live.versions import installed_vllm_version
    from ppas.policies import make_policy

    installed = installed_vllm_version()  # for runs that did not record theirs
    for r in runs:
        arm = exp.arm(r["arm"])
        spec, why = arm.sim_policy(r.get("vllm_version") or installed)
        r["sim_policy"] = spec
        r["sim"], r["sim_error"] = None, None
        if model is None:
            r["sim_note"] = "no step log to fit a cost model (no plugin arm ran)"
            continue
        if spec is None:
            r["sim_note"] = why
            continue
        trace = exp.workload.trace(r["load"], r["seed"])
        s = simulate(trace, make_policy(spec), model,
                     EngineConfig(max_num_seqs=exp.engine.max_num_seqs,
                                  max_num_batched_tokens=r["max_num_batched_tokens"])).summary()
        r["sim"] = {"avg_latency": float(s["avg_latency"]), "p95_latency": float(s["p95_latency"])}
        m = r["summary"]["avg_latency"]
        r["sim_error"] = (r["sim"]["avg_latency"] - m) / m if m else None


def _iv(xs: Sequence[float | None], level: float) -> Interval | None:
    vals = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    return t_interval(vals, level) if vals else None


def build_report(exp: Experiment) -> dict[str, Any]:
    runs = load_runs(exp)
    level = exp.report.level
    model = _fit_report_model(exp, runs)
    _simulate(exp, runs, model)
    w = exp.workload
    by: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault((r["arm"], r["load"]), []).append(r)
    cells = []
    for arm in exp.arms:
        for load in w.loads:
            rs = by.get((arm.name, load), [])
            if not rs:
                continue
            c: dict[str, Any] = {"arm": arm.name, "load": load, "seeds": [r["seed"] for r in rs],
                                 "retried_runs": sum(1 for r in rs if r.get("retried"))}
            for key, _ in METRICS:
                iv = _iv([r["summary"].get(key) for r in rs], level)
                c[key] = None if iv is None else iv.to_dict()
            sims = [r["sim"]["avg_latency"] for r in rs if r.get("sim")]
            c["sim_avg_latency"] = sum(sims) / len(sims) if sims else None
            errs = [r["sim_error"] for r in rs if r.get("sim_error") is not None]
            c["sim_error"] = sum(errs) / len(errs) if errs else None
            c["sim_note"] = next((r["sim_note"] for r in rs if r.get("sim_note")), None)
            cells.append(c)

    def e2e(arm: str, load: float | None) -> dict[tuple[float, int], float]:
        return {(r["load"], r["seed"]): float(r["summary"]["avg_latency"]) for r in runs
                if r["arm"] == arm and (load is None or r["load"] == load)
                and r["summary"].get("avg_latency") and not r["summary"].get("failed")}

    def paired(a: str, b: str, load: float | None) -> tuple[list[float], list[float]]:
        x, y = e2e(a, load), e2e(b, load)
        keys = sorted(set(x) & set(y))
        return [x[k] for k in keys], [y[k] for k in keys]

    improvements = []
    base_names = [a.name for a in exp.arms if a.baseline]
    for base in (a for a in exp.arms if a.baseline):
        for arm in exp.arms:
            # a baseline against an earlier-listed baseline only (not both directions)
            if arm.name == base.name or (arm.baseline and base_names.index(base.name)
                                         > base_names.index(arm.name)):
                continue
            loads: list[float | None] = [*w.loads, None]
            for ld in loads:
                xa, xb = paired(arm.name, base.name, ld)
                if not xa:
                    continue
                iv = paired_bootstrap_ratio(xa, xb, level=level, n_boot=exp.report.n_boot,
                                            seed=exp.report.bootstrap_seed)
                improvements.append({"arm": arm.name, "baseline": base.name, "load": ld,
                                     "ratio": iv.to_dict(), "improvement": 1 - iv.estimate,
                                     "significant": iv.excludes(1.0)})
    def geomean_at(arm: str, load: float) -> float | None:
        vals = e2e(arm, load)
        if len(vals) != len(w.seeds):
            return None  # only complete arms are ranked
        return geomean(list(vals.values()))

    oracle = []  # every non-baseline arm against the best baseline of each load
    best_base: dict[float, str] = {}
    for load in w.loads:
        ranked_b = sorted((g, b) for b in base_names if (g := geomean_at(b, load)) is not None)
        if ranked_b:
            best_base[load] = ranked_b[0][1]
    for arm in (a for a in exp.arms if not a.baseline):
        all_a: list[float] = []
        all_b: list[float] = []
        for load, bname in best_base.items():
            xa, xb = paired(arm.name, bname, load)
            all_a += xa
            all_b += xb
            if len(xa) < 2:
                continue
            iv = paired_t_ratio(xa, xb, level)
            oracle.append({"arm": arm.name, "load": load, "baseline": bname,
                           "ratio": iv.to_dict(), "verdict": _verdict(iv)})
        if all_a and len(best_base) == len(w.loads):
            iv = paired_bootstrap_ratio(all_a, all_b, level=level, n_boot=exp.report.n_boot,
                                        seed=exp.report.bootstrap_seed)
            oracle.append({"arm": arm.name, "load": None, "baseline": "best per load",
                           "ratio": iv.to_dict(), "verdict": _verdict(iv)})
    winners = []
    for load in w.loads:
        complete = {arm.name: e2e(arm.name, load) for arm in exp.arms}
        complete = {a: v for a, v in complete.items() if len(v) == len(w.seeds)}
        if len(complete) < 2:
            continue
        keys = sorted(next(iter(complete.values())))
        best = best_arm({a: [v[k] for k in keys] for a, v in complete.items()}, level)
        winners.append({"load": load, "winner": best.winner, "runner_up": best.runner_up,
                        "ratio": best.ratio.to_dict(), "level_each": best.level_each,
                        "marked": best.marked})
    pairs = []
    bases = [a.name for a in exp.arms if a.baseline]
    for i, a in enumerate(bases):
        for b in bases[i + 1:]:
            for load in w.loads:
                xa, xb = paired(a, b, load)
                if len(xa) < 2:
                    continue
                iv = paired_t_ratio(xa, xb, level)
                verdict = (f"{a} lower" if iv.hi < 1 else f"{b} lower" if iv.lo > 1
                           else "within noise")
                pairs.append({"a": a, "b": b, "load": load, "ratio": iv.to_dict(),
                              "verdict": verdict})
    relative = []  # every arm against the first baseline arm, paired t, per load
    ref = next((a.name for a in exp.arms if a.baseline), None)
    for arm in exp.arms:
        for load in w.loads:
            xa, xb = paired(arm.name, ref, load) if ref is not None else ([], [])
            if xa:
                relative.append({"arm": arm.name, "load": load,
                                 "ratio": paired_t_ratio(xa, xb, level).to_dict()})
    sim_arms = []
    for arm in exp.arms:
        errs = [r["sim_error"] for r in runs if r["arm"] == arm.name and r.get("sim_error")
                is not None]
        note = next((r.get("sim_note") for r in runs if r["arm"] == arm.name
                     and r.get("sim_note")), None)
        mean_err = sum(errs) / len(errs) if errs else None
        off = mean_err is not None and abs(mean_err) > SIM_TOLERANCE
        step_err = _step_time_error(model, [r for r in runs if r["arm"] == arm.name])
        if off and note is None:
            note = _why_off(step_err)
        policy = next((r["sim_policy"] for r in runs if r["arm"] == arm.name
                       and r.get("sim_policy")), None)
        sim_arms.append({"arm": arm.name, "plugin": arm.plugin, "sim_policy": policy,
                         "mean_error": mean_err,
                         "max_abs_error": max((abs(e) for e in errs), default=None),
                         "within_tolerance": None if mean_err is None else not off,
                         "step_time_error": step_err, "note": note})
    return {"experiment": exp.name, "description": exp.description, "level": level,
            "load_name": w.load_name, "num_runs": len(runs), "planned_runs": exp.num_runs(),
            "cost_model": None if model is None else _model_dict(model),
            "cells": cells, "improvements": improvements, "winners": winners,
            "baseline_pairs": pairs, "oracle": oracle, "simulator": sim_arms,
            "relative": {"reference": ref, "rows": relative},
            "runs": [{k: r.get(k) for k in ("arm", "load", "seed", "prompt_seed", "retried",
                                            "attempts", "wall_s", "sim", "sim_error")}
                     | {"summary": {k: r["summary"].get(k) for k, _ in METRICS}}
                     for r in runs]}


def _verdict(iv: Interval) -> str:
    """An arm/baseline ratio's verdict: lower or higher only where the CI excludes 1."""
    return "lower" if iv.hi < 1 else "higher" if iv.lo > 1 else "within noise"


def _step_time_error(model: Any, runs: Sequence[dict[str, Any]]) -> float | None:
    """(predicted - measured) / measured total step time of the arm's own steps."""
    from ppas.calibrate.fit import sample
    from ppas.cost.fitted import fit_stats

    steps = [sample(Step.of(s)) for r in runs for s in r.get("steps", [])]
    if model is None or not steps:
        return None
    return float(fit_stats(model, steps).total_error)


def _why_off(step_err: float | None) -> str:
    """Where a mean-E2E miss comes from: the step-time model, or outside the steps."""
    if step_err is None:
        return "no step log for this arm, so the cause cannot be located"
    if abs(step_err) > SIM_TOLERANCE / 2:
        return (f"the fitted step-time model misses this arm's own steps by {step_err:+.0%} "
                "in total (the linear step model fits this arm's mix of steps worse)")
    return (f"its steps are predicted within {step_err:+.0%} in total, so the miss is outside "
            "the engine's step times: waits between steps (HTTP, detokenisation, the client "
            "and other processes sharing the CPU) or a different order of scheduling")


def _model_dict(model: Any) -> dict[str, Any]:
    from dataclasses import asdict

    from ppas.cost.fitted import COEFFICIENTS

    return {"coefficients": {n: float(getattr(model, n)) for n in COEFFICIENTS},
            "fit": None if model.stats is None else asdict(model.stats)}


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


def format_report(rep: dict[str, Any]) -> str:
    lvl = f"{rep['level']:.0%}"
    ln = rep["load_name"]
    head = (f"{ln:>6}  {'arm':<18} {'mean E2E':>11} {'P95 E2E':>11} {'mean TTFT':>11} "
            f"{'mean TPOT':>13} {'makespan':>11} {'failed':>9} | {'sim E2E':>7} {'error':>7}")
    out = [f"experiment {rep['experiment']}: {rep['num_runs']}/{rep['planned_runs']} runs; "
           f"seconds, mean ± half-width of the {lvl} t-interval over seeds",
           head, "-" * len(head)]
    for c in sorted(rep["cells"], key=lambda c: c["load"]):
        sim = "n/a" if c["sim_avg_latency"] is None else f"{c['sim_avg_latency']:.2f}"
        out.append(f"{_load(c['load']):>6}  {c['arm']:<18} {_pm(c['avg_latency']):>11} "
                   f"{_pm(c['p95_latency']):>11} {_pm(c['avg_ttft']):>11} "
                   f"{_pm(c['avg_tpot'], 4):>13} {_pm(c['makespan'], 1):>11} "
                   f"{_pm(c['failed'], 1):>9} | {sim:>7} {_pct(c['sim_error']):>7}")
    out.append("")
    out.append(f"winner per {ln} (lowest geometric-mean E2E over seeds; marked only if, at a "
               f"family-wise {lvl}, the paired t-interval of every other arm/winner excludes "
               "1: Bonferroni; shown: the runner-up's):")
    for wnr in rep["winners"]:
        r = wnr["ratio"]
        tag = "WINNER" if wnr["marked"] else "within noise"
        out.append(f"  {ln} {_load(wnr['load'])}: {tag}: {wnr['winner']} ahead of "
                   f"{wnr['runner_up']} by x{r['estimate']:.2f} [{_num(r['lo'])}, "
                   f"{_num(r['hi'])}]")
    if rep["baseline_pairs"]:
        out.append("")
        out.append(f"baseline arms head to head (ratio of mean E2E a/b, paired {lvl} "
                   "t-interval):")
        for p in rep["baseline_pairs"]:
            r = p["ratio"]
            out.append(f"  {ln} {_load(p['load'])}: {p['a']} / {p['b']} = x{r['estimate']:.2f} "
                       f"[{_num(r['lo'])}, {_num(r['hi'])}]: {p['verdict']}")
    if rep.get("oracle"):
        out.append("")
        out.append(f"against the best baseline arm of each {ln} (oracle; ratio of mean E2E "
                   f"arm/baseline; per {ln}: paired {lvl} t-interval, all: geometric mean "
                   f"with a paired bootstrap {lvl} CI):")
        for o in rep["oracle"]:
            r = o["ratio"]
            where = "all" if o["load"] is None else _load(o["load"])
            out.append(f"  {o['arm']:<18} vs {o['baseline']:<14} {ln} {where:>5}: "
                       f"x{r['estimate']:.2f} [{_num(r['lo'])}, {_num(r['hi'])}]: "
                       f"{o['verdict']}")
    if rep["improvements"]:
        out.append("")
        out.append(f"geometric-mean improvement of mean E2E over each baseline (paired "
                   f"bootstrap {lvl} CI; + = lower latency; * = CI excludes 0):")
        for imp in rep["improvements"]:
            r = imp["ratio"]
            lo = None if r["hi"] is None else 1 - r["hi"]
            hi = None if r["lo"] is None else 1 - r["lo"]
            where = "all" if imp["load"] is None else _load(imp["load"])
            out.append(f"  {imp['arm']:<18} vs {imp['baseline']:<14} {ln} {where:>5}: "
                       f"{imp['improvement']:+7.1%} [{_pct(lo)}, {_pct(hi)}]"
                       f"{' *' if imp['significant'] else ''}")
    out.append("")
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
    retried = sum(1 for r in rep["runs"] if r.get("retried"))
    if retried:
        out.append(f"{retried} run(s) were retried after a server death (see their files)")
    return "\n".join(out)


def _pctu(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _num(x: float | None) -> str:
    return "inf" if x is None else f"{x:.2f}"


def _load(x: float) -> str:
    return f"{x:g}"


# ---------------------------------------------------------------- plot


def plot_report(rep: dict[str, Any], path: Path) -> None:
    """Left: mean E2E vs load per arm, t-interval error bars over seeds, the simulator
    dashed. Right: each arm's mean E2E relative to the first baseline arm (paired
    geometric-mean ratio and its paired t-interval): the trace-to-trace spread that widens
    the left panel's bars cancels here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ppas.analysis.plot import save_figure

    fig, (ax, axr) = plt.subplots(1, 2, figsize=(12, 4.5))
    arms = list(dict.fromkeys(c["arm"] for c in rep["cells"]))
    top = max(c["load"] for c in rep["cells"]) or 1.0
    rel = {(r["arm"], r["load"]): r["ratio"] for r in rep["relative"]["rows"]}
    for i, arm in enumerate(arms):
        color = f"C{i % 10}"
        cs = sorted((c for c in rep["cells"] if c["arm"] == arm and c["avg_latency"]),
                    key=lambda c: c["load"])
        xs = [c["load"] + 0.006 * i * top for c in cs]
        ivs = [c["avg_latency"] for c in cs]
        _errorbar(ax, xs, ivs, color, arm)
        sim = [(x, c["sim_avg_latency"]) for x, c in zip(xs, cs, strict=True)
               if c["sim_avg_latency"] is not None]
        if sim:
            ax.plot([s[0] for s in sim], [s[1] for s in sim], "--", color=color, alpha=0.6)
        rs = [(x, rel[(arm, c["load"])]) for x, c in zip(xs, cs, strict=True)
              if (arm, c["load"]) in rel]
        if rs:
            _errorbar(axr, [x for x, _ in rs], [r for _, r in rs], color, arm)
    xlabel = (f"{rep['load_name']} rate (requests/s)" if rep["load_name"] != "trace"
              else "trace")
    ys_all = [c["avg_latency"]["estimate"] for c in rep["cells"] if c["avg_latency"]]
    if ys_all and min(ys_all) > 0 and max(ys_all) / min(ys_all) > 5:
        ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel="mean E2E latency (s)",
           title=f"measured ({rep['level']:.0%} CI over seeds); dashed: simulator")
    axr.axhline(1.0, color="k", linewidth=0.8)
    axr.set(xlabel=xlabel, ylabel=f"mean E2E / {rep['relative']['reference']}",
            title=f"paired by trace ({rep['level']:.0%} paired t-interval)")
    for a in (ax, axr):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.suptitle(rep["experiment"])
    save_figure(fig, path)


def _errorbar(ax: Any, xs: Sequence[float], ivs: Sequence[dict[str, Any]], color: str,
              label: str) -> None:
    ys = [iv["estimate"] for iv in ivs]
    lo = [y - (iv["lo"] if iv["lo"] is not None else y) for y, iv in zip(ys, ivs, strict=True)]
    hi = [(iv["hi"] if iv["hi"] is not None else y) - y for y, iv in zip(ys, ivs, strict=True)]
    ax.errorbar(xs, ys, yerr=[lo, hi], fmt="-o", color=color, capsize=3, markersize=4,
                label=label)


def write_report(exp: Experiment) -> tuple[str, dict[str, Any]]:
    """Build the report and write report.txt, report.json and report.png (atomically)."""
    import importlib.util

    from ppas.core.outputs import write_json_atomic

    out = Path(exp.out_dir)
    rep = build_report(exp)
    text = format_report(rep)
    tmp = out / ".report.txt.tmp"
    tmp.write_text(text + "\n")
    tmp.replace(out / "report.txt")
    write_json_atomic(out / "report.json", rep)
    if importlib.util.find_spec("matplotlib") is not None and rep["cells"]:
        plot_report(rep, out / "report.png")
    return text, rep
