"""The best stock vLLM setting for a trace (``ppas tune``), searched in the simulator.

The space (``StockSpace``, the one definition of which stock settings are tried) is stock
vLLM's scheduler knobs as the ``vllm:`` policy simulates them: ``max_num_batched_tokens``,
``long_prefill_token_threshold`` (a threshold only below the MBT) with and without
``--long-prefill-token-threshold-adaptive``, ``prefill_schedule_interval`` (0.33 only: 0.32
ignores it), and the admission limit set by ``max_num_seqs`` or ``max_num_active_seqs``
(their one effect on the schedule, ``core.decision.admission_limit``: settings with the same
limit are the same schedule and are tried once).

Every setting is scored at every load (a rate multiplier of the trace,
``TraceTransform.at_load``) by one ``Objective`` (``OBJECTIVES``): lower is better, infinite
when infeasible. ``search`` is **successive halving** over the trace's length: every setting
runs on the first 1/eta^k of the trace at every load, the best 1/eta (by the objective, plus
the best at each load alone, so the per-load oracle survives) go on to a trace eta times
longer, until the survivors run the whole trace. With ``rungs=1`` it is the plain grid
search. What is reported (best single setting, per-load oracle, Pareto front) is over the
settings run on the whole trace.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from ppas.core.config import config_string
from ppas.core.decision import EngineKnobs, Knob, admission_limit
from ppas.core.errors import PpasError
from ppas.core.metrics import RunSummary, geomean_improvement, percentiles
from ppas.core.registry import Registry
from ppas.cost import CostModel
from ppas.engine.setup import engine_for
from ppas.engine.simulator import EngineConfig, simulate
from ppas.policies import make_policy
from ppas.policies.vllm_stock import KNOB_PARAMS, VllmStockConfig
from ppas.workload import Trace


@dataclass(frozen=True)
class StockSpace:
    """The values tried of each stock knob (None: vLLM's default, no flag)."""

    max_num_batched_tokens: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
    long_prefill_token_threshold: tuple[int, ...] = (0, 256, 512, 1024, 2048, 4096)
    adaptive: tuple[bool, ...] = (False, True)
    prefill_schedule_interval: tuple[int, ...] = (1, 2, 4)
    max_num_seqs: tuple[int | None, ...] = (None, 64, 16)
    max_num_active_seqs: tuple[int | None, ...] = (None,)

    def settings(self, version: str = "0.33", engine_max_num_seqs: int = 256) -> list[str]:
        """Every distinct setting as a ``vllm:`` config string (``max_num_seqs`` written only
        when set), in the order of the fields: a threshold only below the MBT, ``adaptive``
        only with a threshold, an interval only where the release line applies it, an
        admission limit only once."""
        out: list[str] = []
        seen: set[tuple[object, ...]] = set()
        psis = self.prefill_schedule_interval if version != "0.32" else (1,)
        for mbt in self.max_num_batched_tokens:
            for lpt in self.long_prefill_token_threshold:
                if lpt >= mbt:
                    continue
                for adaptive in (self.adaptive if lpt else (False,)):
                    for psi in psis:
                        for seqs in self.max_num_seqs:
                            for active in self.max_num_active_seqs:
                                if seqs is not None and seqs > mbt:
                                    continue
                                if active is not None and active > (seqs or mbt):
                                    continue
                                cfg = VllmStockConfig(mbt, lpt, adaptive, psi, seqs, active,
                                                      version)
                                limit = admission_limit(EngineKnobs(
                                    max_num_seqs=seqs, max_num_active_seqs=active),
                                    engine_max_num_seqs)
                                key = (mbt, lpt, adaptive, psi, limit)
                                if key in seen:
                                    continue
                                seen.add(key)
                                omit = [k for k in (Knob.MAX_NUM_SEQS, Knob.MAX_NUM_ACTIVE_SEQS)
                                        if getattr(cfg, k) is None]
                                out.append(config_string("vllm", cfg, omit=omit))
        return out


def serve_flags(config: str) -> list[str]:
    """A ``vllm:`` setting as ``vllm serve`` flags (``Knob.flag``); knobs at vLLM's default
    are left out but ``--max-num-batched-tokens``."""
    pol = make_policy(config)
    cfg = pol.config
    if not isinstance(cfg, VllmStockConfig):
        raise PpasError(f"{config!r} is not a stock vLLM setting (vllm:...)")
    out: list[str] = []
    defaults = VllmStockConfig()
    for knob, param in KNOB_PARAMS.items():
        v = getattr(cfg, param)
        if knob is not Knob.MAX_NUM_BATCHED_TOKENS and v == getattr(defaults, param):
            continue
        out += [knob.flag] if isinstance(v, bool) else [knob.flag, str(v)]
    return out


# ---------------------------------------------------------------- figures and objectives


@dataclass(frozen=True)
class Figures:
    """One run's figures the objectives read (seconds)."""

    mean_e2e: float
    mean_ttft: float
    mean_tpot: float
    p99_e2e: float
    p99_ttft: float
    p99_tpot: float
    completed: int
    failed: int

    def record(self) -> dict[str, float | int]:
        return dict(self.__dict__)


def figures(trace: Trace, config: str, cost_model: CostModel, engine: EngineConfig) -> Figures:
    """``config`` on ``trace`` in the simulator."""
    res = simulate(trace, make_policy(config), cost_model, engine)
    reqs = res.request_metrics()
    s = RunSummary.of(reqs, sum(1 for r in res.requests if r.failed))
    p = percentiles(reqs, (99,))
    nan = math.nan
    return Figures(s.mean_e2e, s.mean_ttft, s.mean_tpot, p.get("e2e_p99", nan),
                   p.get("ttft_p99", nan), p.get("tpot_p99", nan), s.completed, s.failed)


class Objective:
    """What a setting is tuned for: ``at_load`` one load's value (lower is better; inf:
    infeasible), ``score`` over the loads (their geometric mean; inf if any is)."""

    name: ClassVar[str]
    unit: ClassVar[str] = "s"

    def at_load(self, f: Figures) -> float:
        raise NotImplementedError

    def score(self, figs: Sequence[Figures]) -> float:
        vals = [self.at_load(f) for f in figs]
        if not vals or any(not math.isfinite(v) or v <= 0 for v in vals):
            return math.inf
        return math.exp(sum(math.log(v) for v in vals) / len(vals))

    def describe(self) -> str:
        raise NotImplementedError


class MeanE2E(Objective):
    name = "mean-e2e"

    def at_load(self, f: Figures) -> float:
        return f.mean_e2e if f.completed else math.inf

    def describe(self) -> str:
        return "mean E2E (geometric mean over loads)"


@dataclass
class P99TtftUnderTpot(Objective):
    name = "p99-ttft"
    tpot_slo: float = 0.1

    def at_load(self, f: Figures) -> float:
        return f.p99_ttft if f.completed and f.p99_tpot <= self.tpot_slo else math.inf

    def describe(self) -> str:
        return (f"P99 TTFT (geometric mean over loads) with P99 TPOT <= "
                f"{self.tpot_slo * 1000:g} ms at every load")


#: Objective name -> its factory (``tpot_slo`` in seconds, for the objectives that take one).
OBJECTIVES: Registry[Callable[[float | None], Objective]] = Registry("objective")
OBJECTIVES.add(MeanE2E.name, lambda slo: MeanE2E())
OBJECTIVES.add(P99TtftUnderTpot.name, lambda slo: P99TtftUnderTpot(slo if slo else 0.1))
#: Objectives that read ``--tpot-slo``.
TAKES_TPOT_SLO = (P99TtftUnderTpot.name,)


# ---------------------------------------------------------------- the search


def prefix(trace: Trace, fraction: float) -> Trace:
    """The requests arriving in the first ``fraction`` of the trace (at least one)."""
    if fraction >= 1:
        return trace
    end = trace.duration_s * fraction
    reqs = tuple(r for r in trace.requests if r.arrival_s < end) or trace.requests[:1]
    return Trace(reqs, end, f"{trace.description}; first {fraction:.3g} of it", trace.dropped)


@dataclass
class Evaluator:
    """Runs settings on the trace of each load, with cost models sized per token budget."""

    traces: dict[float, Trace]
    hardware: str | None
    model: str | None
    cost_model: str = "roofline"
    tp: int = 1
    engine: EngineConfig = field(default_factory=EngineConfig)
    simulations: int = 0
    _costs: dict[int, CostModel] = field(default_factory=dict)

    def run(self, config: str, load: float, fraction: float = 1.0) -> Figures:
        mbt = make_policy(config).max_num_batched_tokens
        if mbt not in self._costs:
            self._costs[mbt] = engine_for(config, self.hardware, self.model,
                                          cost_model=self.cost_model, tp=self.tp,
                                          config=self.engine).cost_model
        self.simulations += 1
        return figures(prefix(self.traces[load], fraction), config, self._costs[mbt],
                       self.engine)

    @property
    def loads(self) -> list[float]:
        return list(self.traces)


@dataclass(frozen=True)
class Rung:
    fraction: float
    settings: int


@dataclass
class Search:
    """The settings run on the whole trace, their figures per load, and how the search went."""

    results: dict[str, dict[float, Figures]]
    rungs: list[Rung]
    simulations: int


def num_rungs(n: int, eta: int, keep: int, max_rungs: int) -> int:
    """Rungs of successive halving for ``n`` settings: enough that about ``keep`` reach
    the whole trace, at most ``max_rungs``."""
    r = 1
    while r < max_rungs and n / eta ** (r - 1) > keep * eta:
        r += 1
    return r


def search(settings: Sequence[str], ev: Evaluator, objective: Objective, *, eta: int = 3,
           keep: int = 8, max_rungs: int = 5,
           progress: Callable[[str], None] | None = None) -> Search:
    """Successive halving (see the module docstring); ``max_rungs=1`` is the grid search."""
    if not settings:
        raise PpasError("no stock settings to search")
    alive = list(dict.fromkeys(settings))
    rungs_n = num_rungs(len(alive), eta, keep, max_rungs)
    rungs: list[Rung] = []
    loads = ev.loads
    scored: dict[str, dict[float, Figures]] = {}
    for k in range(rungs_n):
        fraction = 1.0 / eta ** (rungs_n - 1 - k)
        rungs.append(Rung(fraction, len(alive)))
        if progress:
            progress(f"rung {k + 1}/{rungs_n}: {len(alive)} settings on {fraction:.3g} of "
                     "the trace")
        scored = {c: {load: ev.run(c, load, fraction) for load in loads} for c in alive}
        if k == rungs_n - 1:
            break
        rank = sorted(alive, key=lambda c: objective.score(list(scored[c].values())))
        nxt = rank[:max(keep, math.ceil(len(alive) / eta))]
        for load in loads:
            best = min(alive, key=lambda c: objective.at_load(scored[c][load]))  # noqa: B023
            if best not in nxt:
                nxt.append(best)
        alive = nxt
    return Search(scored, rungs, ev.simulations)


# ---------------------------------------------------------------- what is reported


def pareto_front(points: dict[str, Figures]) -> list[str]:
    """The names whose (P99 TTFT, P99 TPOT) no other point beats in both, by P99 TTFT."""
    items = [(n, f.p99_ttft, f.p99_tpot) for n, f in points.items()
             if math.isfinite(f.p99_ttft) and math.isfinite(f.p99_tpot)]
    front = [n for n, t, p in items
             if not any((t2 <= t and p2 <= p) and (t2 < t or p2 < p) for _, t2, p2 in items)]
    return sorted(front, key=lambda n: (points[n].p99_ttft, points[n].p99_tpot))


@dataclass
class TuneReport:
    """Everything ``ppas tune`` prints and writes."""

    objective: Objective
    loads: list[float]
    search: Search
    ours: dict[str, dict[float, Figures]]
    best: str  # the best single stock setting
    oracle: dict[float, str]  # the best stock setting per load

    def value(self, config: str, load: float) -> float:
        f = self.ours[config][load] if config in self.ours else self.search.results[config][load]
        return self.objective.at_load(f)

    def gain(self, config: str, load: float) -> float:
        """Per cent lower objective than the best single stock setting at ``load``."""
        ours, base = self.value(config, load), self.value(self.best, load)
        if not (math.isfinite(ours) and math.isfinite(base)):
            return math.nan
        return (1 - ours / base) * 100

    def overall_gain(self, config: str) -> float:
        """Geometric-mean improvement over the loads (P-PAS Eq. 1-2); nan when infeasible."""
        ours = [self.value(config, x) for x in self.loads]
        base = [self.value(self.best, x) for x in self.loads]
        if not all(math.isfinite(v) for v in ours + base):
            return math.nan
        return geomean_improvement(ours, base)

    def fronts(self) -> dict[float, list[str]]:
        out = {}
        for load in self.loads:
            pts = {c: r[load] for c, r in self.search.results.items()}
            pts |= {c: r[load] for c, r in self.ours.items()}
            out[load] = pareto_front(pts)
        return out

    def record(self) -> dict[str, object]:
        def per(rs: dict[str, dict[float, Figures]]) -> dict[str, object]:
            return {c: {f"{x:g}": f.record() for x, f in r.items()} for c, r in rs.items()}

        return {
            "objective": self.objective.name, "objective_description": self.objective.describe(),
            "loads": self.loads,
            "best": {"setting": self.best, "vllm_serve_flags": serve_flags(self.best),
                     "score": self.objective.score(list(self.search.results[self.best]
                                                        .values()))},
            "oracle": {f"{x:g}": {"setting": c, "value": self.value(c, x)}
                       for x, c in self.oracle.items()},
            "gains": {c: {"per_load": {f"{x:g}": self.gain(c, x) for x in self.loads},
                          "overall": self.overall_gain(c)} for c in self.ours},
            "pareto_front": {f"{x:g}": names for x, names in self.fronts().items()},
            "search": {"rungs": [r.__dict__ for r in self.search.rungs],
                       "simulations": self.search.simulations},
            "stock": per(self.search.results), "ours": per(self.ours),
        }


def tune(settings: Sequence[str], ours: Sequence[str], ev: Evaluator, objective: Objective,
         max_rungs: int = 5, progress: Callable[[str], None] | None = None) -> TuneReport:
    """Search ``settings``, then run ``ours`` on the whole trace at every load."""
    s = search(settings, ev, objective, max_rungs=max_rungs, progress=progress)
    loads = ev.loads
    if progress and ours:
        progress(f"our policies: {', '.join(ours)}")
    mine = {c: {x: ev.run(c, x) for x in loads} for c in ours}
    s.simulations = ev.simulations
    best = min(s.results, key=lambda c: objective.score(list(s.results[c].values())))
    oracle = {x: min(s.results, key=lambda c: objective.at_load(s.results[c][x]))  # noqa: B023
              for x in loads}
    return TuneReport(objective, loads, s, mine, best, oracle)
