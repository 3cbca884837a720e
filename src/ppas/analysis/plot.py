"""Plots (matplotlib imported lazily: an edge, not part of the core)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ppas.analysis.sweep import cell_means
from ppas.core.errors import PpasError
from ppas.core.outputs import atomic_output, check_output_file

FORMATS = (".png", ".svg", ".pdf")


def check_plot_path(path: str | Path) -> Path:
    """Validate a plot destination before any work is done (format, folder, matplotlib)."""
    p = Path(path)
    if p.suffix.lower() not in FORMATS:
        raise PpasError(f"plot file {str(p)!r}: unknown format; allowed: {', '.join(FORMATS)}")
    check_output_file(p, "plot file")
    if importlib.util.find_spec("matplotlib") is None:
        raise PpasError("plots need matplotlib; install it with: pip install 'ppas[cli]'")
    return p


def plot_e2e_vs_burst(records: Sequence[dict[str, Any]], path: str | Path,
                      title: str = "Mean E2E latency vs burst rate",
                      key: str = "avg_latency", fmt: str | None = None) -> None:
    """P-PAS Fig. 3: mean E2E vs burst rate, one line per config. Written atomically
    (``fmt`` overrides the format the file name's suffix gives)."""
    p = Path(path) if fmt else check_plot_path(path)
    m = cell_means(records, key)
    configs = list(dict.fromkeys(str(r["config"]) for r in records))
    bursts = sorted({float(r["burst_rate"]) for r in records})
    fig, ax = new_figure()
    for c in configs:
        style = "-" if c.startswith("mbt") else "-o"
        ax.plot(bursts, [m[(c, b)] for b in bursts], style, label=c,
                linewidth=1.2 if c.startswith("mbt") else 2.2, markersize=4)
    ax.set_xlabel("burst rate (requests/s)")
    ax.set_ylabel(f"{key} (s)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, p, fmt)


def new_figure() -> tuple[Any, Any]:
    """A (figure, axes) pair on the non-interactive backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(7, 4.5))


def save_figure(fig: Any, path: Path, fmt: str | None = None) -> None:
    """Write ``fig`` atomically (``ppas.core.outputs``: no temporary file survives a failure)
    and close it. The format is ``fmt`` or the file name's suffix."""
    import matplotlib.pyplot as plt

    try:
        fig.tight_layout()
        with atomic_output(path) as tmp:
            fig.savefig(tmp, dpi=120, format=fmt or Path(path).suffix.lstrip(".").lower())
    finally:
        plt.close(fig)


def plot_cluster_sweep(records: Sequence[dict[str, Any]], path: str | Path) -> None:
    """P95 TTFT and TTFT-SLO attainment vs instance count, one line per P:D share (or
    one line for a colocated cluster). Written atomically."""
    p = check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        key = (f"prefill share {r['prefill_instances'] / r['instances']:.0%}"
               if "prefill_instances" in r else "colocated")
        groups.setdefault(key, []).append(r)
    for key, rs in groups.items():
        rs = sorted(rs, key=lambda r: r["instances"])
        xs = [r["instances"] for r in rs]
        a1.plot(xs, [r["p95_ttft"] for r in rs], "-o", label=key)
        if all("ttft_attainment" in r for r in rs):
            a2.plot(xs, [r["ttft_attainment"] for r in rs], "-o", label=key)
    a1.set_xlabel("instances")
    a1.set_ylabel("P95 TTFT (s)")
    a2.set_xlabel("instances")
    a2.set_ylabel("TTFT-SLO attainment")
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    save_figure(fig, p)


def plot_attainment(records: Sequence[dict[str, Any]], path: str | Path,
                    target: float) -> None:
    """SLO attainment against rate scale (``ppas capacity``), one line per config, the
    target dashed and each capacity marked. Written atomically."""
    p = check_plot_path(path)
    fig, ax = new_figure()
    for r in records:
        pts = sorted(r["points"], key=lambda q: q["rate_scale"])
        line = ax.plot([q["rate_scale"] for q in pts], [q["slo_attainment"] for q in pts],
                       "-o", markersize=3, label=str(r["config"]))
        if r["capacity_bound"] == "found":
            ax.axvline(r["capacity_scale"], color=line[0].get_color(), linestyle=":",
                       linewidth=1)
    ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:.0%}")
    ax.set_xscale("log")
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("rate scale (x the trace's rate)")
    ax.set_ylabel("SLO attainment")
    ax.set_title(f"SLO attainment vs rate ({records[0]['slo'] if records else ''})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, p)
