"""The report's figure (``report.png``): mean E2E per arm and load, and each arm relative
to the first baseline arm. matplotlib is optional (the ``cli`` extra), so it is imported
only when a figure is drawn."""

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
