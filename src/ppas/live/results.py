"""The live benchmark's results (``ppas bench``): the run's summary at the JSON edge, the
terminal table, and the results file.

The figures are ``ppas.core.metrics.RunSummary``'s (seconds, under the run record's names:
``avg_latency``, ``p95_ttft``, ``makespan``, ...), so a live run and a simulated one mean the
same thing by each; ``vllm bench serve``'s names and units (milliseconds: ``mean_ttft_ms``,
``p99_itl_ms``, ``e2el`` for E2E) are written beside them, and its per-second rates
(``request_throughput``, ``request_goodput``) count over the benchmark duration (first
submission to the last request's end, failures included), as it defines them.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from ppas.core.errors import PpasError
from ppas.core.metrics import Gaps, RunSummary
from ppas.core.outputs import (
    check_output_dir,
    check_output_file,
    json_text,
    write_json_atomic,
    write_new_file,
)
from ppas.core.slo import SloSpec, SoloLatency
from ppas.live.http import public_url
from ppas.live.outcome import BenchResult

METRICS = ("ttft", "tpot", "itl", "e2el")  # vllm bench serve's names
METRIC_NAMES = {
    "ttft": "Time to First Token",
    "tpot": "Time per Output Token (excl. 1st token)",
    "itl": "Inter-token Latency",
    "e2el": "End-to-end Latency",
}
SLO_KEYS = ("ttft", "tpot", "e2el")  # --goodput's


def _pword(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p)


def _mean(xs: Sequence[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def _pct(xs: Sequence[float], p: float) -> float | None:
    return float(np.percentile(xs, p)) if xs else None  # numpy linear, as the paper


def _std(xs: Sequence[float]) -> float | None:
    return float(np.std(xs)) if xs else None


def _or_none(x: float) -> float | None:
    """A figure of a run with no success (NaN in ``RunSummary``) is None in JSON."""
    return None if math.isnan(x) else x


def metric_values(result: BenchResult) -> dict[str, list[float]]:
    """Seconds per metric over successful requests (``itl`` pools all gaps)."""
    ok = [r for r in result.outcomes if r.success]
    return {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": [t for r in ok if (t := r.tpot) is not None],
        "itl": [g for r in ok for g in r.itl],
        "e2el": [r.e2e for r in ok if r.e2e is not None],
    }


def run_summary(result: BenchResult, goodput: Mapping[str, float] | None = None,
                relative: tuple[SloSpec, Sequence[SoloLatency]] | None = None) -> RunSummary:
    """The run's ``RunSummary``; ``goodput`` gives every request SLOs in milliseconds by
    ``vllm bench serve --goodput`` key (``ttft``/``tpot``/``e2el``); ``relative``, an SLO
    spec and each trace request's solo latency (by index), gives each request its own."""
    slo = {k: ms / 1000.0 for k, ms in (goodput or {}).items()}
    ms = [dataclasses.replace(m, ttft_slo=slo.get("ttft"), tpot_slo=slo.get("tpot"),
                              e2e_slo=slo.get("e2el"))
          if relative is None else relative[0].apply(m, relative[1][r.index])
          for r in result.outcomes if (m := r.metrics()) is not None]
    return RunSummary.of(ms, failed=len(result.outcomes) - len(ms),
                         itl=Gaps(metric_values(result)["itl"]))


def summarize(
    result: BenchResult,
    goodput: Mapping[str, float] | None = None,
    percentile_metrics: Sequence[str] = ("ttft", "tpot", "itl"),
    percentiles: Sequence[float] = (99.0,),
    relative: tuple[SloSpec, Sequence[SoloLatency]] | None = None,
) -> dict[str, Any]:
    """Run-level metrics (see the module doc): seconds under the run record's names and
    milliseconds under ``vllm bench serve``'s. Means and percentiles are over successful
    requests; None when there are none. ``goodput``, ``relative``: SLOs as in
    ``run_summary``; a value equal to its SLO meets it."""
    o = result.outcomes
    run = run_summary(result, goodput, relative)
    vals = metric_values(result)
    ok = [r for r in o if r.success]
    dur = result.duration_s
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    s: dict[str, Any] = {
        "completed": run.completed,
        "failed": run.failed,
        "num_requests": run.num_requests,
        "interrupted": result.interrupted,
        "interrupted_by": result.interrupted_by,
        "failure_reasons": dict(Counter(r.error.split(":")[0] for r in o if not r.success)),
        "duration": dur,
        "makespan": _or_none(run.makespan),
        "avg_latency": _or_none(run.mean_e2e),
        "p95_latency": _or_none(run.p95_e2e),
        "avg_ttft": _or_none(run.mean_ttft),
        "p95_ttft": _or_none(run.p95_ttft),
        "avg_tpot": _or_none(run.mean_tpot),
        "p95_tpot": _or_none(run.p95_tpot),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / dur if dur > 0 else None,
        "output_throughput": out_tokens / dur if dur > 0 else None,
        "total_token_throughput": (in_tokens + out_tokens) / dur if dur > 0 else None,
        # P50/P90/P99 of TTFT, TPOT, E2E and ITL in seconds (RunSummary.tails)
        **{k: _or_none(v) for k, v in run.tails.items()},
    }
    if goodput or relative is not None:
        s["slo_attainment"] = run.slo_attainment or 0.0
        good = run.good or 0  # None: no request completed
        if relative is not None:
            s["slo"] = str(relative[0])
        else:
            s["goodput_slos_ms"] = dict(goodput or {})
        s["good_requests"] = good
        s["request_goodput"] = good / dur if dur > 0 else None
    for m in percentile_metrics:
        xs = [x * 1000.0 for x in vals[m]]
        s[f"mean_{m}_ms"] = _mean(xs)
        s[f"median_{m}_ms"] = _pct(xs, 50)
        s[f"std_{m}_ms"] = _std(xs)
        for p in percentiles:
            s[f"p{_pword(p)}_{m}_ms"] = _pct(xs, p)
    return s


def format_table(s: Mapping[str, Any], percentile_metrics: Sequence[str],
                 percentiles: Sequence[float]) -> str:
    """The ``vllm bench serve`` result table, plus the paper's seconds-based lines."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]

    def row(name: str, v: Any, digits: int = 2) -> None:
        if v is None:
            lines.append(f"{name:<40} {'n/a':<10}")
        elif isinstance(v, float):
            lines.append(f"{name:<40} {v:<10.{digits}f}")
        else:
            lines.append(f"{name:<40} {v:<10}")

    row("Successful requests:", s["completed"])
    row("Failed requests:", s["failed"])
    for reason, n in sorted(s["failure_reasons"].items()):
        row(f"  {reason}:", n)
    row("Benchmark duration (s):", s["duration"])
    row("Makespan (s):", s["makespan"])
    row("Total input tokens:", s["total_input_tokens"])
    row("Total generated tokens:", s["total_output_tokens"])
    row("Request throughput (req/s):", s["request_throughput"])
    if "request_goodput" in s:
        row("Request goodput (req/s):", s["request_goodput"])
    row("Output token throughput (tok/s):", s["output_throughput"])
    row("Total token throughput (tok/s):", s["total_token_throughput"])
    lines.append("{s:{c}^{n}}".format(s=" Paper metrics (s) ", n=50, c="-"))
    for key, name in (("latency", "E2E"), ("ttft", "TTFT"), ("tpot", "TPOT")):
        row(f"Mean {name} (s):", s[f"avg_{key}"], 4)
        row(f"P95 {name} (s):", s[f"p95_{key}"], 4)
    for m in percentile_metrics:
        lines.append("{s:{c}^{n}}".format(s=f" {METRIC_NAMES[m]} ", n=50, c="-"))
        label = m.upper()
        row(f"Mean {label} (ms):", s[f"mean_{m}_ms"])
        row(f"Median {label} (ms):", s[f"median_{m}_ms"])
        for p in percentiles:
            row(f"P{_pword(p)} {label} (ms):", s[f"p{_pword(p)}_{m}_ms"])
    lines.append("=" * 50)
    return "\n".join(lines)


# ---------------------------------------------------------------- results file


def check_result_path(folder: str | os.PathLike[str] | None, filename: str | None,
                      inputs: Sequence[str | os.PathLike[str]] = ()) -> Path:
    """Where a results file will go, checked before the run (``ppas.core.outputs``): the file
    ``folder/filename`` (never one of ``inputs``), or, without a file name, the folder in
    which ``save_result`` will make a fresh name. Raises a one-line PpasError."""
    d = Path(folder if folder is not None else ".")
    if filename is not None:
        if not filename or Path(filename).name != filename:
            raise PpasError(f"--result-filename {filename!r} must be a file name "
                            "(put the folder in --result-dir)")
        return check_output_file(d / filename, "--result-filename", inputs)
    return check_output_dir(d, "--result-dir")


def result_record(result: BenchResult, summary: Mapping[str, Any], *, started: datetime,
                  base_url: str, model: str, seed: int, prompt_format: str) -> dict[str, Any]:
    """The results file's object: run facts, the summary, per-request arrays."""
    return {"date": started.isoformat(timespec="seconds"), "backend": "openai",
            "base_url": public_url(base_url), "model": model, "trace": result.description,
            "seed": seed, "prompt_format": prompt_format, **summary, **result.per_request()}


def save_result(dest: Path, record: Mapping[str, Any], *, named: bool, model: str,
                started: datetime) -> Path:
    """Write ``record`` atomically: over the file ``dest`` (``named``), or into the folder
    ``dest`` under a fresh ``bench-MODEL-TIME[-k].json`` that no concurrent run can take."""
    if named:
        return write_json_atomic(dest, record)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(model.rstrip("/")).name) or "model"
    return write_new_file(dest, f"bench-{slug}-{started:%Y%m%d-%H%M%S}", ".json",
                          json_text(record))
