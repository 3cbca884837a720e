"""Grids of simulated runs: burst rates x seeds x policy configs (P-PAS Table 7 shape)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ppas.core.metrics import geomean_improvement, mean_over
from ppas.cost.base import CostModel
from ppas.engine.simulator import EngineConfig, simulate
from ppas.engine.solo import lower_bound_latency
from ppas.policies import make_policy
from ppas.workload import PAPER_PHASES, Trace, phase_trace

#: The record a run produces (also the ``--json`` schema of ``ppas simulate/sweep``).
RECORD_KEYS = ("config", "burst_rate", "seed", "num_requests", "avg_latency", "p95_latency",
               "avg_ttft", "p95_ttft", "avg_tpot", "p95_tpot", "makespan", "failed")


@dataclass(frozen=True)
class Grid:
    configs: tuple[str, ...]
    burst_rates: tuple[float, ...]
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    phases: str = PAPER_PHASES
    prompt_tokens: int = 25000
    output_tokens: int = 32
    max_num_seqs: int = 256
    max_model_len: int | None = None  # vLLM's limit on prompt + output (None: no limit)

    def trace(self, burst: float, seed: int) -> Trace:
        return phase_trace(self.phases, seed, self.prompt_tokens, self.output_tokens, burst)


def run_one(trace: Trace, config: str, cost_model: CostModel, max_num_seqs: int = 256,
            with_lower_bound: bool = False,
            max_model_len: int | None = None) -> dict[str, float | int | str]:
    res = simulate(trace, make_policy(config), cost_model,
                   EngineConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len))
    rec: dict[str, float | int | str] = {"config": config, **res.summary()}
    rec["num_preemptions"] = res.num_preemptions
    rec["num_steps"] = res.num_steps
    if with_lower_bound:
        rec["lower_bound_latency"] = mean_lower_bound(trace, cost_model)
    return rec


def mean_lower_bound(trace: Trace, cost_model: CostModel) -> float:
    """Mean of ``lower_bound_latency`` over the trace (computed once per request shape);
    nan for an empty trace."""
    cache: dict[tuple[int, int], float] = {}
    total = 0.0
    for s in trace:
        key = (s.prompt_tokens, s.output_tokens)
        if key not in cache:
            cache[key] = lower_bound_latency(s, cost_model)
        total += cache[key]
    return total / len(trace) if len(trace) else float("nan")


def run_grid(
    grid: Grid,
    cost_model_for: Callable[[str], CostModel],
    progress: Callable[[Iterable[tuple[float, int]]], Iterable[tuple[float, int]]] | None = None,
    with_lower_bound: bool = False,
) -> list[dict[str, float | int | str]]:
    """Every (burst, seed) trace under every config. ``cost_model_for(config)`` lets the
    KV capacity follow each config's activation reserve (it depends on the budget)."""
    cms = {c: cost_model_for(c) for c in grid.configs}
    cells = [(b, s) for b in grid.burst_rates for s in grid.seeds]
    out = []
    for b, s in (progress(cells) if progress else cells):
        trace = grid.trace(b, s)
        lb_cache: float | None = None
        for c in grid.configs:
            want_lb = with_lower_bound and lb_cache is None
            rec = run_one(trace, c, cms[c], grid.max_num_seqs, want_lb, grid.max_model_len)
            if with_lower_bound:
                if lb_cache is None:
                    lb_cache = float(rec["lower_bound_latency"])
                rec["lower_bound_latency"] = lb_cache
            rec = {"config": c, "burst_rate": b, "seed": s,
                   **{k: v for k, v in rec.items() if k != "config"}}
            out.append(rec)
    return out


def cell_means(records: Sequence[dict], key: str) -> dict[tuple[str, float], float]:  # type: ignore[type-arg]
    """Mean over seeds per (config, burst)."""
    groups: dict[tuple[str, float], list[dict]] = {}  # type: ignore[type-arg]
    for r in records:
        groups.setdefault((str(r["config"]), float(r["burst_rate"])), []).append(r)
    return {k: mean_over(v, key) for k, v in groups.items()}


def improvement(records: Sequence[dict], policy: str, baseline: str, key: str) -> float:  # type: ignore[type-arg]
    """Geometric-mean improvement of ``policy`` over ``baseline`` across burst rates."""
    m = cell_means(records, key)
    bursts = sorted({b for (c, b) in m if c == policy} & {b for (c, b) in m if c == baseline})
    return geomean_improvement([m[(policy, b)] for b in bursts], [m[(baseline, b)] for b in bursts])
