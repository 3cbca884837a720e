"""The P-PAS paper's measured runs (RTX 5090, Qwen2.5-3B), shipped in ``ppas/data``.

Derived from the artifact log by ``benchmarks/extract_reference.py``; used by the
calibration script, the paper benchmark and the tests. Keys match the simulator's records.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

PAPER_CONFIGS = ("mbt:512", "mbt:1024", "mbt:2048", "mbt:4096", "mbt:8192", "mbt:16384", "ppas")
PAPER_BURSTS = (0.4, 0.6, 0.8, 1.0, 1.2, 1.4)


@cache
def reference() -> dict[str, Any]:
    path = resources.files("ppas") / "data" / "reference_rtx5090_qwen2.5-3b.json"
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def reference_runs() -> list[dict[str, Any]]:
    return list(reference()["runs"])


def accuracy(sim: list[dict[str, Any]], key: str = "avg_latency") -> dict[str, Any]:
    """Per-cell relative error of simulated vs measured means (mean over seeds).

    Returns ``cells`` {(config, burst): (sim, ref, rel_err)}, ``within15`` (fraction of
    cells within 15%), ``median_abs_err`` and ``geomean_abs_log_err``.
    """
    import math

    from ppas.analysis.sweep import cell_means

    ref = cell_means(reference_runs(), key)
    got = cell_means(sim, key)
    cells = {}
    for k, r in ref.items():
        if k in got:
            cells[k] = (got[k], r, got[k] / r - 1.0)
    errs = sorted(abs(e) for _, _, e in cells.values())
    n = len(errs)
    return {
        "cells": cells,
        "within15": sum(e <= 0.15 for e in errs) / n if n else float("nan"),
        "median_abs_err": (errs[n // 2] if n % 2 else (errs[n // 2 - 1] + errs[n // 2]) / 2)
        if n else float("nan"),
        "mean_abs_log_err": sum(abs(math.log(s / r)) for s, r, _ in cells.values()) / n
        if n else float("nan"),
    }
