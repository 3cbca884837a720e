"""The report's figures: ``report.png``, mean E2E per arm and load, and each arm relative
to the first baseline arm; ``report-arms.png``, per load the mean and P99 E2E of each arm
with the simulator's prediction beside each. matplotlib is optional (the ``cli`` extra), so
it is imported only when a figure is drawn."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ppas.analysis.plot import save_figure
from ppas.experiment.tables import Report


def plot_report(rep: Report, path: Path) -> None:
    """Left: mean E2E vs load per arm, t-interval error bars over seeds, the simulator
    dashed. Right: each arm's mean E2E relative to the first baseline arm (paired
    geometric-mean ratio and its paired t-interval): the trace-to-trace spread that widens
    the left panel's bars cancels here."""
    import matplotlib  # lazily: optional (the cli extra), and slow to import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    xlabel = ("load (fraction of the probed prefill capacity)" if rep.get("probe")
              else f"{rep['load_name']} rate (requests/s)" if rep["load_name"] != "trace"
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


def plot_arms(rep: Report, path: Path) -> None:
    """One panel per load: per arm, the mean and the P99 E2E latency (bars: the mean over
    seeds, error bars: the t-interval over seeds) with the simulator's prediction of each
    beside it (a black diamond: the mean over seeds of the predicted value)."""
    import matplotlib  # lazily, as in plot_report

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = sorted({c["load"] for c in rep["cells"]})
    arms = list(dict.fromkeys(c["arm"] for c in rep["cells"]))
    fig, axes = plt.subplots(1, len(loads), figsize=(max(5.0, 1.6 * len(arms)) * len(loads),
                                                     4.5), squeeze=False)
    by = {(c["arm"], c["load"]): c for c in rep["cells"]}
    width = 0.38
    for ax, load in zip(axes[0], loads, strict=True):
        for j, (key, sim_key, label) in enumerate((("avg_latency", "sim_avg_latency", "mean"),
                                                   ("e2e_p99", "sim_e2e_p99", "P99"))):
            xs, ivs, sims = [], [], []
            for i, arm in enumerate(arms):
                c = by.get((arm, load))
                if c is None or not c.get(key):
                    continue
                xs.append(i + (j - 0.5) * width)
                ivs.append(c[key])
                sims.append((i + (j - 0.5) * width + width * 0.3, c.get(sim_key)))
            ys = [iv["estimate"] for iv in ivs]
            lo = [y - (iv["lo"] if iv["lo"] is not None else y) for y, iv in zip(ys, ivs,
                                                                                 strict=True)]
            hi = [(iv["hi"] if iv["hi"] is not None else y) - y for y, iv in zip(ys, ivs,
                                                                                 strict=True)]
            ax.bar(xs, ys, width * 0.9, yerr=[lo, hi], capsize=3, color=f"C{j}", alpha=0.8,
                   label=f"{label} E2E (measured)")
            pts = [(x, s) for x, s in sims if s is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "kD", markersize=5,
                        label="simulator (its mean, P99)" if j == 0 else None)
        ax.set_xticks(range(len(arms)), arms, rotation=20, ha="right", fontsize=8)
        ax.set_ylim(bottom=0)  # latencies: a t-interval's lower end below 0 is cut there
        ax.set(ylabel="E2E latency (s)", title=_load_label(rep, load))
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{rep['experiment']}: mean and P99 E2E per arm ({rep['level']:.0%} "
                 "t-interval over seeds); diamonds: the simulator")
    save_figure(fig, path)


def _load_label(rep: Report, load: float) -> str:
    if rep.get("probe") is not None:
        return f"load {load:g} of the probed prefill capacity"
    return f"{rep['load_name']} {load:g}"
