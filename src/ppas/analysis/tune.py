"""The best stock vLLM setting for a trace (``ppas tune``), searched in the simulator.

The space (``StockSpace``, the one definition of which stock settings are tried) is stock
vLLM's scheduler knobs as the ``vllm:`` policy simulates them: ``max_num_batched_tokens``,
``long_prefill_token_threshold`` (a threshold only below the MBT) with and without
``--long-prefill-token-threshold-adaptive``, ``prefill_schedule_interval`` (0.33 only: 0.32
ignores it), and the admission limit set by ``max_num_seqs`` or ``max_num_active_seqs``
(their one effect on the schedule, ``core.decision.admission_limit``: settings with the same
limit are the same schedule and are tried once).

Every setting is scored at every load (a rate multiplier of the trace,
``TraceTransform.at_load``) by one ``Objective`` (``OBJECTIVES``, a registry: capacity can be
one more entry): lower is better, infinite when infeasible. ``search`` is **coordinate
descent** (``descent``) from vLLM's defaults: one coordinate (``COORDINATES``) at a time,
every value of it tried with the others held, the best kept, until a pass moves nothing;
then the same at each load alone, from the best single setting, for the per-load oracle.
``method="grid"`` runs every setting instead. Measured on the Azure code trace's first 10
minutes at loads 1 and 2 (H100, Qwen3-8B, mean E2E): the descent reached the grid's optimum
of 414 settings after running 33; successive halving over the trace's length (every
setting on the first 1/27 of the trace, the best third on a trace three times longer, ...)
ended 18% above it, the short prefixes ranking the settings wrongly.
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
        only with a threshold, an interval only where the release line applies it, each
        admission limit once (``engine_max_num_seqs``: the engine's, the limit when no knob
        sets one)."""
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
                                omit = (Knob.MAX_NUM_SEQS,) if seqs is None else ()
                                out.append(config_string("vllm", cfg, omit=omit))
        return out


def short_name(config: str) -> str:
    """A ``vllm:`` setting with only its knobs off vLLM's defaults (and its MBT); any other
    config as it is."""
    cfg = make_policy(config).config
    if not isinstance(cfg, VllmStockConfig):
        return config
    d = VllmStockConfig(version=cfg.version)
    return config_string("vllm", cfg, omit=[k for k in KNOB_PARAMS.values() if k != "mbt"
                                            and getattr(cfg, k) == getattr(d, k)]
                         + ["version"])


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

    def violation(self, f: Figures) -> float:
        """How far one load is from feasible (0: feasible), so that a search can walk out
        of an infeasible region."""
        return 0.0 if f.completed else math.inf

    def rank(self, figs: Sequence[Figures]) -> tuple[float, float]:
        """The search's key: feasible settings by ``score``, then the others by their worst
        ``violation``."""
        v = self.score(figs)
        return (0.0, v) if math.isfinite(v) else (1.0, max(self.violation(f) for f in figs))

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

    def violation(self, f: Figures) -> float:
        return max(0.0, f.p99_tpot / self.tpot_slo - 1) if f.completed else math.inf

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

    def run(self, config: str, load: float) -> Figures:
        mbt = make_policy(config).max_num_batched_tokens
        if mbt not in self._costs:
            self._costs[mbt] = engine_for(config, self.hardware, self.model,
                                          cost_model=self.cost_model, tp=self.tp,
                                          config=self.engine).cost_model
        self.simulations += 1
        return figures(self.traces[load], config, self._costs[mbt], self.engine)

    @property
    def loads(self) -> list[float]:
        return list(self.traces)


#: The coordinates of the descent: the knobs moved together (a threshold with its switch,
#: the two admission knobs).
COORDINATES: tuple[tuple[str, ...], ...] = (
    ("mbt",), ("long_prefill_token_threshold", "adaptive"), ("prefill_schedule_interval",),
    ("max_num_seqs", "max_num_active_seqs"))


@dataclass
class Search:
    """Every setting run, its figures at the loads it was run at, and how the search went."""

    results: dict[str, dict[float, Figures]]
    simulations: int
    passes: int = 0


def _knobs(config: str) -> VllmStockConfig:
    cfg = make_policy(config).config
    assert isinstance(cfg, VllmStockConfig)
    return cfg


def descent(settings: Sequence[str], score: Callable[[str], tuple[float, float]], start: str,
            max_passes: int = 4) -> tuple[str, int]:
    """Coordinate descent over ``settings`` (``COORDINATES``): from ``start``, try every
    value of one coordinate with the others held (those in ``settings``), move to the best
    if it is strictly better; repeat over the coordinates until a pass moves nothing.
    Returns the setting reached and the passes made."""
    by_key = {tuple(getattr(_knobs(c), f) for fs in COORDINATES for f in fs): c
              for c in settings}
    names = [f for fs in COORDINATES for f in fs]
    cur = start
    for n in range(1, max_passes + 1):
        moved = False
        for fs in COORDINATES:
            base = dict(zip(names, next(k for k, c in by_key.items() if c == cur),
                            strict=True))
            values = {tuple(k[names.index(f)] for f in fs) for k in by_key}
            cands = []
            for v in values:
                key = tuple((dict(base) | dict(zip(fs, v, strict=True)))[f] for f in names)
                if key in by_key:
                    cands.append(by_key[key])
            best = min(cands, key=lambda c: (score(c), settings.index(c)))
            if score(best) < score(cur):
                cur, moved = best, True
        if not moved:
            return cur, n
    return cur, max_passes


def search(settings: Sequence[str], ev: Evaluator, objective: Objective, *,
           method: str = "descent") -> tuple[Search, str, dict[float, str]]:
    """The best single setting over the loads, and the best at each load: by coordinate
    descent from vLLM's defaults (the per-load ones from the single best), or the grid."""
    if not settings:
        raise PpasError("no stock settings to search")
    loads = ev.loads
    runs: dict[str, dict[float, Figures]] = {}

    def at(c: str, x: float) -> Figures:
        if x not in runs.setdefault(c, {}):
            runs[c][x] = ev.run(c, x)
        return runs[c][x]

    def overall(c: str) -> tuple[float, float]:
        return objective.rank([at(c, x) for x in loads])

    passes = 0
    if method == "grid":
        best = min(settings, key=overall)
        oracle = {x: min(settings, key=lambda c: objective.rank([at(c, x)]))  # noqa: B023
                  for x in loads}
    else:
        default = config_string("vllm", VllmStockConfig(version=_knobs(settings[0]).version),
                                omit=(Knob.MAX_NUM_SEQS,))
        start = default if default in settings else settings[0]
        best, passes = descent(settings, overall, start)
        oracle = {x: descent(settings, lambda c: objective.rank([at(c, x)]),  # noqa: B023
                             best)[0] for x in loads}
    return Search(runs, ev.simulations, passes), best, oracle


# ---------------------------------------------------------------- what is reported


def pareto_front(points: dict[str, Figures]) -> list[str]:
    """The names whose (P99 TTFT, P99 TPOT) no other point beats in both, by P99 TTFT."""
    items = [(n, f.p99_ttft, f.p99_tpot) for n, f in points.items()
             if math.isfinite(f.p99_ttft) and math.isfinite(f.p99_tpot)]
    front: dict[tuple[float, float], str] = {}  # one name per point: the first given
    for n, t, p in items:
        if not any((t2 <= t and p2 <= p) and (t2 < t or p2 < p) for _, t2, p2 in items):
            front.setdefault((t, p), n)
    return [front[k] for k in sorted(front)]


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
            pts = {c: r[load] for c, r in self.search.results.items() if load in r}
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
            "search": {"settings_run": len(self.search.results),
                       "passes": self.search.passes, "simulations": self.search.simulations},
            "stock": per(self.search.results), "ours": per(self.ours),
        }


def tune(settings: Sequence[str], ours: Sequence[str], ev: Evaluator, objective: Objective,
         method: str = "descent") -> TuneReport:
    """Search ``settings`` (``search``), then run ``ours`` on the trace at every load."""
    s, best, oracle = search(settings, ev, objective, method=method)
    if not math.isfinite(objective.score(list(s.results[best].values()))):
        raise PpasError(f"no stock setting tried meets the objective at every load "
                        f"({objective.describe()}); loosen the SLO or lower the loads")
    mine = {c: {x: ev.run(c, x) for x in ev.loads} for c in ours}
    s.simulations = ev.simulations
    return TuneReport(objective, ev.loads, s, mine, best, oracle)
