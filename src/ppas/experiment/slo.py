"""A run's tail latencies and SLO figures for the report, from its per-request arrays.

Invariants: a run is measured the way ``ppas bench`` measures it (``RunSummary`` over the
completed requests, failed ones counting as missing their SLOs; ITL pooled over the run's
gaps), from the arrays its file keeps (``BenchResult.per_request``); a run whose file lacks
them, or whose arrays disagree in length, has no such figures (None) rather than guessed
ones. Relative SLOs (``ttft=5x``) are against each request's solo latency on the
experiment's cost model (``Experiment.slo_cost_model``), the request's lengths taken from
the run's trace, the same for every arm.
"""

from __future__ import annotations

from collections.abc import Sequence

from ppas.core.metrics import TAIL_QS, Gaps, RequestMetrics, RunSummary
from ppas.core.slo import SloSpec, SoloLatency
from ppas.cost import make_cost_model
from ppas.engine.solo import SoloTable
from ppas.experiment.runfile import RunFile
from ppas.experiment.spec import Experiment

#: The tails the report gives per (arm, load): ``RunSummary.tails``' keys (seconds).
TAIL_KEYS = tuple(f"{m}_p{q}" for m in ("ttft", "tpot", "itl", "e2e") for q in TAIL_QS)
#: The per-request arrays a run file needs for them.
_ARRAYS = ("scheduled_s", "end_s", "ttfts", "tpots", "itls", "e2els", "output_lens")

RunKey = tuple[str, float, int]  # (arm, load, seed)


def request_metrics(run: RunFile) -> tuple[list[int], list[RequestMetrics], int, Gaps] | None:
    """The run's completed requests (their trace indices and metrics), its failed count and
    its inter-token gaps; None when the file lacks the arrays."""
    pr = run.per_request
    if any(not isinstance(pr.get(k), list) for k in _ARRAYS):
        return None
    n = len(pr["ttfts"])
    if any(len(pr[k]) != n for k in _ARRAYS):
        return None
    idx: list[int] = []
    ms: list[RequestMetrics] = []
    gaps = Gaps()
    for i in range(n):
        ttft, tpot, e2e = pr["ttfts"][i], pr["tpots"][i], pr["e2els"][i]
        if ttft is None or tpot is None or e2e is None:
            continue
        idx.append(i)
        ms.append(RequestMetrics(float(pr["scheduled_s"][i]), float(ttft), float(e2e),
                                 float(tpot), int(pr["output_lens"][i]),
                                 end_s=None if pr["end_s"][i] is None
                                 else float(pr["end_s"][i])))
        for g in pr["itls"][i] or ():
            gaps.add(float(g))
    return idx, ms, n - len(ms), gaps


def run_summaries(exp: Experiment, runs: Sequence[RunFile]) -> dict[RunKey, RunSummary | None]:
    """Each run's ``RunSummary`` under the report's SLO (``[report] slo``, if any)."""
    slo = exp.report.slo_spec
    solo: SoloTable | None = None
    if slo is not None and slo.relative:
        spec = exp.slo_cost_model()
        assert spec is not None  # parse_experiment refuses a relative SLO without one
        solo = SoloTable(make_cost_model(spec, exp.run.hardware, exp.run.catalog_model,
                                         exp.engine.tensor_parallel_size))
    return {(r.arm, r.load, r.seed): _summary(exp, r, slo, solo) for r in runs}


def _summary(exp: Experiment, run: RunFile, slo: SloSpec | None,
             solo: SoloTable | None) -> RunSummary | None:
    got = request_metrics(run)
    if got is None:
        return None
    idx, ms, failed, gaps = got
    if slo is not None:
        solos: list[SoloLatency] | None = None
        if solo is not None:
            reqs = exp.workload.trace(run.load, run.seed).requests
            if len(reqs) != len(run.per_request["ttfts"]):
                return None  # not this trace's run: no reference to measure against
            solos = [solo(reqs[i].prompt_tokens, reqs[i].output_tokens) for i in idx]
        ms = slo.apply_all(ms, solos)
    return RunSummary.of(ms, failed, gaps)


__all__ = ["TAIL_KEYS", "request_metrics", "run_summaries"]
