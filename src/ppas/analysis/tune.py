"""The best stock vLLM setting for a trace (``ppas tune``), searched in the simulator.

The space (``StockSpace``, the one definition of which stock settings are tried) is stock
vLLM's scheduler knobs as the ``vllm:`` policy simulates them: ``max_num_batched_tokens``,
``long_prefill_token_threshold`` (a threshold only below the MBT) with and without
``--long-prefill-token-threshold-adaptive``, ``prefill_schedule_interval`` (0.33 only: 0.32
ignores it), and the admission limit set by ``max_num_seqs`` or ``max_num_active_seqs``
(their one effect on the schedule, ``core.decision.admission_limit``: settings with the same
limit are the same schedule and are tried once).

Every setting is scored at every load (a rate multiplier of the trace,
``TraceTransform.at_load``) by one ``Objective`` (``OBJECTIVES``, a registry): lower is
better, infinite when infeasible; ``capacity`` ranks a setting by the largest rate
multiplier at which its SLO attainment stays at or above a target (``ppas.analysis.capacity``:
the loads as the grid, then bisection inside the first failing bracket, each scale one more
run of the setting). ``search`` is **coordinate
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from ppas.analysis.capacity import Point, find_capacity
from ppas.core.config import config_string
from ppas.core.decision import EngineKnobs, Knob, admission_limit
from ppas.core.errors import PpasError
from ppas.core.metrics import RunSummary, geomean_improvement, percentiles
from ppas.core.registry import Registry
from ppas.core.slo import SloSpec
from ppas.cost import CostModel, make_cost_model
from ppas.engine.result import SimResult
from ppas.engine.setup import engine_for
from ppas.engine.simulator import EngineConfig, simulate
from ppas.engine.solo import SoloTable
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
    load: float = 1.0  # the rate multiplier the run was at
    slo_attainment: float | None = None  # under the evaluator's SLO, None without one

    def record(self) -> dict[str, float | int | None]:
        return dict(self.__dict__)


def figures(trace: Trace, config: str, cost_model: CostModel, engine: EngineConfig,
            load: float = 1.0, slo: SloSpec | None = None,
            solo: SoloTable | None = None) -> Figures:
    """``config`` on ``trace`` (at ``load``) in the simulator; attainment under ``slo``
    (``solo``: the solo latencies of a relative one)."""
    return figures_of(simulate(trace, make_policy(config), cost_model, engine), load, slo,
                      solo)


def figures_of(res: SimResult, load: float = 1.0, slo: SloSpec | None = None,
               solo: SoloTable | None = None) -> Figures:
    """One finished run's ``Figures`` (at ``load``; attainment under ``slo``)."""
    reqs = res.request_metrics(slo, solo) if slo is not None else res.request_metrics()
    s = RunSummary.of(reqs, sum(1 for r in res.requests if r.failed))
    p = percentiles(reqs, (99,))
    nan = math.nan
    att = None if slo is None else (s.slo_attainment or 0.0)
    return Figures(s.mean_e2e, s.mean_ttft, s.mean_tpot, p.get("e2e_p99", nan),
                   p.get("ttft_p99", nan), p.get("tpot_p99", nan), s.completed, s.failed,
                   load, att)


class Objective:
    """What a setting is tuned for: ``at_load`` one load's value (lower is better; inf:
    infeasible), ``score`` over the loads (their geometric mean; inf if any is)."""

    name: ClassVar[str]
    unit: ClassVar[str] = "s"
    #: ``overall`` and ``at_load`` are better higher (capacity, attainment), not lower
    higher_is_better: ClassVar[bool] = False

    def at_load(self, f: Figures) -> float:
        raise NotImplementedError

    def probe(self, at: Callable[[float], Figures], loads: Sequence[float]) -> list[Figures]:
        """The runs that rank a setting (``at(load)`` runs it): one per load."""
        return [at(x) for x in loads]

    def figs(self, runs: Mapping[float, Figures], loads: Sequence[float]) -> list[Figures]:
        """The runs of a setting that ``rank`` and ``overall`` read."""
        return [runs[x] for x in loads]

    def load_rank(self, f: Figures) -> tuple[float, float]:
        """The key of the per-load oracle's search."""
        return self.rank([f])

    def overall(self, figs: Sequence[Figures]) -> float:
        """The figure printed for a setting over the loads: ``score``."""
        return self.score(figs)

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


@dataclass
class CapacityObjective(Objective):
    """The largest rate multiplier at which the SLO attainment (the evaluator's SLO) stays at
    or above ``target``: ``find_capacity`` with the loads as the grid and ``steps``
    bisections; maximised (``score`` is its inverse). Per load: the attainment."""

    name = "capacity"
    unit = "x"
    higher_is_better = True
    target: float = 0.9
    steps: int = 3

    def at_load(self, f: Figures) -> float:
        return f.slo_attainment or 0.0

    def probe(self, at: Callable[[float], Figures], loads: Sequence[float]) -> list[Figures]:
        cap = find_capacity(lambda x: Point(x, self.at_load(at(x))), loads, self.target,
                            self.steps)
        return [at(p.scale) for p in cap.points]  # each run once: ``at`` keeps them

    def figs(self, runs: Mapping[float, Figures], loads: Sequence[float]) -> list[Figures]:
        return [runs[x] for x in sorted(runs)]

    def capacity(self, figs: Sequence[Figures]) -> float:
        """``find_capacity``'s answer from its runs (by scale: the last before the first
        that fails); 0 when the lowest fails, the highest (a lower bound) when none does."""
        pts = sorted(figs, key=lambda f: f.load)
        fail = next((i for i, f in enumerate(pts) if self.at_load(f) < self.target), None)
        if fail is None:
            return pts[-1].load if pts else 0.0
        return pts[fail - 1].load if fail else 0.0

    def score(self, figs: Sequence[Figures]) -> float:
        cap = self.capacity(figs)
        return 1 / cap if cap > 0 else math.inf

    def rank(self, figs: Sequence[Figures]) -> tuple[float, float]:
        cap = self.capacity(figs)
        if cap > 0:
            return (0.0, 1 / cap)
        return (1.0, self.target - min((self.at_load(f) for f in figs), default=0.0))

    def load_rank(self, f: Figures) -> tuple[float, float]:
        return (0.0, 1 - self.at_load(f))

    def overall(self, figs: Sequence[Figures]) -> float:
        return self.capacity(figs)

    def describe(self) -> str:
        return (f"capacity: the largest rate multiplier with SLO attainment >= "
                f"{self.target:.0%} (the loads as the grid, {self.steps} bisections; at "
                "least the highest load when none fails, 0 when the lowest does); per load: "
                "SLO attainment")


class ObjectiveFactory(Protocol):
    """An objective from the flags that shape it (``tpot_slo`` in seconds)."""

    def __call__(self, tpot_slo: float | None = None, target: float = 0.9,
                 steps: int = 3) -> Objective: ...


#: Objective name -> its factory.
OBJECTIVES: Registry[ObjectiveFactory] = Registry("objective")
OBJECTIVES.add(MeanE2E.name, lambda tpot_slo=None, target=0.9, steps=3: MeanE2E())
OBJECTIVES.add(P99TtftUnderTpot.name, lambda tpot_slo=None, target=0.9, steps=3:
               P99TtftUnderTpot(tpot_slo if tpot_slo else 0.1))
OBJECTIVES.add(CapacityObjective.name, lambda tpot_slo=None, target=0.9, steps=3:
               CapacityObjective(target, steps))
#: Objectives that read ``--tpot-slo``; those that need an SLO (``--slo``) and read
#: ``--attainment`` and ``--bisect-steps``.
TAKES_TPOT_SLO = (P99TtftUnderTpot.name,)
TAKES_SLO = (CapacityObjective.name,)


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
    #: SLOs each run's attainment is measured against (relative ones on the cost model
    #: without a token budget of its own: ``make_cost_model``'s default)
    slo: SloSpec | None = None
    #: the trace at a load not in ``traces`` (the capacity objective's bisection)
    make_trace: Callable[[float], Trace] | None = None
    simulations: int = 0
    _costs: dict[int, CostModel] = field(default_factory=dict)
    _solo: SoloTable | None = None

    def __post_init__(self) -> None:
        self.loads = list(self.traces)  # the loads asked for
        if self.slo is not None and self.slo.relative:
            self._solo = SoloTable(make_cost_model(self.cost_model, self.hardware,
                                                   self.model, self.tp))

    def run(self, config: str, load: float) -> Figures:
        mbt = make_policy(config).max_num_batched_tokens
        if mbt not in self._costs:
            self._costs[mbt] = engine_for(config, self.hardware, self.model,
                                          cost_model=self.cost_model, tp=self.tp,
                                          config=self.engine).cost_model
        if load not in self.traces:
            if self.make_trace is None:
                raise PpasError(f"no trace at load x{load:g}")
            self.traces[load] = self.make_trace(load)
        self.simulations += 1
        return figures(self.traces[load], config, self._costs[mbt], self.engine, load,
                       self.slo, self._solo)


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
        return objective.rank(objective.probe(lambda x: at(c, x), loads))

    passes = 0
    if method == "grid":
        best = min(settings, key=overall)
        oracle = {x: min(settings, key=lambda c: objective.load_rank(at(c, x)))  # noqa: B023
                  for x in loads}
    else:
        default = config_string("vllm", VllmStockConfig(version=_knobs(settings[0]).version),
                                omit=(Knob.MAX_NUM_SEQS,))
        start = default if default in settings else settings[0]
        best, passes = descent(settings, overall, start)
        oracle = {x: descent(settings, lambda c: objective.load_rank(at(c, x)),  # noqa: B023
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

    def runs(self, config: str) -> dict[float, Figures]:
        return self.ours[config] if config in self.ours else self.search.results[config]

    def value(self, config: str, load: float) -> float:
        return self.objective.at_load(self.runs(config)[load])

    def overall(self, config: str) -> float:
        """The objective's figure over the loads (``Objective.overall``)."""
        return self.objective.overall(self.objective.figs(self.runs(config), self.loads))

    def gain(self, config: str, load: float) -> float:
        """Per cent better objective than the best single stock setting at ``load``."""
        return self._better(self.value(config, load), self.value(self.best, load))

    def _better(self, ours: float, base: float) -> float:
        if not (math.isfinite(ours) and math.isfinite(base)) or base == 0:
            return math.nan
        return (ours / base - 1 if self.objective.higher_is_better else 1 - ours / base) * 100

    def overall_gain(self, config: str) -> float:
        """Geometric-mean improvement over the loads (P-PAS Eq. 1-2), or for an objective
        better higher (capacity) the per cent higher ``overall``; nan when infeasible."""
        if self.objective.higher_is_better:
            return self._better(self.overall(config), self.overall(self.best))
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
            "objective_unit": self.objective.unit,
            "best": {"setting": self.best, "vllm_serve_flags": serve_flags(self.best),
                     "overall": self.overall(self.best)},
            "oracle": {f"{x:g}": {"setting": c, "value": self.value(c, x)}
                       for x, c in self.oracle.items()},
            "gains": {c: {"per_load": {f"{x:g}": self.gain(c, x) for x in self.loads},
                          "overall": self.overall_gain(c)} for c in self.ours},
            "overall": {c: self.overall(c) for c in self.ours},
            "pareto_front": {f"{x:g}": names for x, names in self.fronts().items()},
            "search": {"settings_run": len(self.search.results),
                       "passes": self.search.passes, "simulations": self.search.simulations},
            "stock": per(self.search.results), "ours": per(self.ours),
        }


def tune(settings: Sequence[str], ours: Sequence[str], ev: Evaluator, objective: Objective,
         method: str = "descent") -> TuneReport:
    """Search ``settings`` (``search``), then run ``ours`` on the trace at every load."""
    s, best, oracle = search(settings, ev, objective, method=method)
    if objective.rank(objective.figs(s.results[best], ev.loads))[0] != 0:
        raise PpasError(f"no stock setting tried meets the objective at every load "
                        f"({objective.describe()}); loosen the SLO or lower the loads")
    mine: dict[str, dict[float, Figures]] = {}
    for c in ours:
        runs = mine[c] = {}

        def at(x: float, c: str = c, runs: dict[float, Figures] = runs) -> Figures:
            if x not in runs:
                runs[x] = ev.run(c, x)
            return runs[x]

        objective.probe(at, ev.loads)
    s.simulations = ev.simulations
    return TuneReport(objective, ev.loads, s, mine, best, oracle)
