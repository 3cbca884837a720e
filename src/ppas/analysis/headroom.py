"""Headroom over a base schedule: a clairvoyant fortified rollout search over the simulator.

How much could ANY per-step policy gain over a base (issue 9: the best stock-vLLM setting
per burst, ``benchmarks/headroom.py``)? By **fortified rollout** (Bertsekas' rollout
policy improvement, keeping the best schedule found so far). The incumbent is first the
base's own run. At each *decision step* (a step with a prompt waiting or mid-prefill, the
view's N_p > 0: the only steps at which a cap changes anything) the search tries every
action of a small set (``actions``), follows each by every continuation, the incumbent's
own later decisions by decision-step index (open loop) and each of a few cheap
closed-loop heuristic policies, simulates to the end of the trace, and keeps any schedule
with a lower mean E2E as the new incumbent; then it takes the incumbent's decision and
moves one step on (``rollout``). ``improve`` runs further passes from the last schedule.

Invariants: the simulator is exact and deterministic and the incumbent is only ever
replaced by a strictly better schedule, so the value never rises from one decision step
to the next and the result is never worse than the base's (asserted at every step and at
the end). The search knows the future arrivals (clairvoyant) and what it finds is not a
policy; it is not exhaustive, so what it finds is headroom that exists, not a bound.

Actions are what a policy can return, a ``Decision`` whose prefill cap is one of: a budget
in ``BUDGETS``, the global MBT, the tokens left of the first ``PROMPTS_AHEAD`` pending
prompts, each alone and each under an admission limit of ``LIMITS`` requests at once
applied through the cap alone, as ``predictive`` applies its limits
(``ppas.policies.predictive.limit_budget``); actions the engine would enforce as the same
cap (``step_rules.enforced_budget``) are tried once, and so are actions that lead to the
same state.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ppas.core.decision import Decision, EngineKnobs
from ppas.core.metrics import tpot_of
from ppas.core.view import SchedulerView, is_pending_prefill, is_prefill_chunk
from ppas.cost.base import CostModel, StepShape
from ppas.engine.setup import engine_for
from ppas.engine.simulator import EngineConfig, EngineSim
from ppas.engine.solo import SoloTable
from ppas.engine.step_rules import enforced_budget
from ppas.policies import Policy, make_policy
from ppas.policies.predictive import limit_budget
from ppas.workload import RequestSpec

#: Prefill caps tried at each decision step (besides the tokens left of the first 1-4
#: pending prompts and the global MBT), and the admission limits each is combined with.
BUDGETS = (0, 64, 2048, 8192, 16384)
LIMITS = (1, 2, 3, 4)
PROMPTS_AHEAD = 4
#: Admission limits whose policies (``LimitAsCap``) continue the cap track's trials.
CAP_HEURISTICS = (1, 2)


class LimitAsCap(Policy):
    """An admission limit (at most ``limit`` requests at once; None: none) and a global
    budget ``mbt``, the limit applied as a policy applies one, through the cap
    (``limit_budget``), on an engine with vLLM's default knobs. ``of(stock)`` takes a
    stock setting's ``max_num_active_seqs`` and MBT: the same schedule as that setting
    when it has no threshold and no interval (checked by ``tests/test_headroom.py``), on
    an engine whose search may leave the limit (the stock engine's knob binds every
    action). A search base and continuation, not a policy of the registry."""

    name = "limit-as-cap"
    Config = object

    def __init__(self, limit: int | None, mbt: int) -> None:
        super().__init__(None, f"limit-as-cap:limit={limit},mbt={mbt}")
        self.limit, self.mbt = limit, mbt

    @classmethod
    def of(cls, stock: Policy) -> LimitAsCap:
        """The limit and MBT of a stock setting."""
        return cls(stock.engine_knobs.max_num_active_seqs, stock.max_num_batched_tokens)

    @property
    def max_num_batched_tokens(self) -> int:
        return self.mbt

    def decide(self, view: SchedulerView) -> Decision:
        if self.limit is None or view.num_pending_prefills == 0:
            return Decision(self.mbt)
        queue, decodes = pending_and_decodes(view)
        return Decision(limit_budget(self.limit, self.mbt, queue, decodes))


def pending_and_decodes(view: SchedulerView) -> tuple[list[tuple[int, int, int]], int]:
    """The pending prompts in engine order, as ``limit_budget`` reads them (computed
    tokens, prompt tokens, 1), and the number of running decodes with outputs left."""
    queue: list[tuple[int, int, int]] = []
    decodes = 0
    for r in view.requests:
        if is_pending_prefill(r):
            queue.append((r.num_computed_tokens, r.prompt_tokens, 1))
        elif r.num_output_tokens < r.max_output_tokens:
            decodes += 1
    return queue, decodes


class Wrapping(Policy):
    """A search tool around ``base`` (not a registered policy): the engine runs with the
    base's MBT, vLLM knobs, history and cost model; subclasses change ``decide``."""

    Config = object

    def __init__(self, base: Policy, spec: str) -> None:
        super().__init__(None, spec)
        self.base = base

    @property
    def max_num_batched_tokens(self) -> int:
        return self.base.max_num_batched_tokens

    @property
    def engine_knobs(self) -> EngineKnobs:
        return self.base.engine_knobs

    @property
    def history_window(self) -> int:  # type: ignore[override]
        return self.base.history_window

    def bind_cost_model(self, cost_model: CostModel | None) -> None:
        self.base.bind_cost_model(cost_model)


class ShortestFirst(Wrapping):
    """``base``'s decisions with the waiting prompts ordered shortest prompt first (fewest
    prompt tokens left, then arrival: SRPT over the admission order); the running
    requests keep theirs. With ``aging_s``, the requests that have waited longer than it
    go first, FCFS. A search continuation (the registered policy with this order and an
    aging bound relative to solo latency is ``ppas.policies.ordered``)."""

    name = "shortest-first"

    def __init__(self, base: Policy, aging_s: float | None = None) -> None:
        aged = "" if aging_s is None else f",aging_s={aging_s:g}"
        super().__init__(base, f"shortest-first({base.spec}{aged})")
        self.aging_s = aging_s

    def decide(self, view: SchedulerView) -> Decision:
        d = self.base.decide(view)
        if view.num_pending_prefills == 0:
            return d
        return Decision(d.prefill_budget, shortest_first(view, self.aging_s),
                        d.decodes_first)


def shortest_first(view: SchedulerView, aging_s: float | None = None) -> tuple[str, ...]:
    """The waiting requests' ids, fewest prompt tokens left first (stable: FCFS ties);
    with ``aging_s``, those that arrived more than ``aging_s`` ago first, FCFS."""
    waiting = [r for r in view.requests if not r.is_running]
    old = view.now - aging_s if aging_s is not None else -math.inf
    waiting.sort(key=lambda r: (r.arrival_time >= old,
                                r.prompt_tokens - r.num_computed_tokens
                                if r.arrival_time >= old else 0))
    return tuple(r.request_id for r in waiting)


@dataclass(frozen=True)
class ActionSet:
    """The actions ``actions`` tries at a decision step: prefill caps (``budgets``, the
    global MBT, the tokens left of the first ``prompts_ahead`` pending prompts), each alone
    and under each admission limit of ``limits`` (through the cap); and, with the base's
    cap, orders of the waiting queue: each of the ``shortest`` waiting prompts with the
    fewest tokens left moved to its head, and with ``srpt`` the whole queue shortest
    first (an order persists: the engine's queue is sorted in place)."""

    budgets: tuple[int, ...] = BUDGETS
    limits: tuple[int, ...] = LIMITS
    prompts_ahead: int = PROMPTS_AHEAD
    shortest: int = 0
    srpt: bool = False


#: Issue 9's actions (identical requests: caps and limits only).
PAPER_ACTIONS = ActionSet()
#: Real traces: fewer caps (a trial simulates hundreds of requests), limits that bind with
#: tens of requests running, and the ordering actions.
TRACE_ACTIONS = ActionSet(budgets=(0, 2048), limits=(16, 32), prompts_ahead=2, shortest=3,
                          srpt=True)


class Scripted(Wrapping):
    """Forced decisions for the first ``len(script)`` decision steps, then ``base``.

    A search tool, not a registered policy: it counts the decision steps it has seen (a
    step whose view has a pending prefill), so it is impure; the engine runs with the
    base's MBT and vLLM knobs. With an empty script it decides exactly as ``base``."""

    name = "scripted"

    def __init__(self, base: Policy, script: Sequence[Decision] = (), seen: int = 0,
                 record: bool = False) -> None:
        super().__init__(base, f"scripted({base.spec})")
        self.script = script
        self.seen = seen  # decision steps decided so far
        #: With ``record``, every decision taken at a decision step, in order: replayed as
        #: a script, it reproduces this run exactly.
        self.taken: list[Decision] | None = [] if record else None

    def decide(self, view: SchedulerView) -> Decision:
        if view.num_pending_prefills == 0:
            return self.base.decide(view)
        k = self.seen
        self.seen = k + 1
        d = self.script[k] if k < len(self.script) else self.base.decide(view)
        if self.taken is not None:
            self.taken.append(d)
        return d


def is_decision_step(sim: EngineSim) -> bool:
    """The next step has a prompt waiting or mid-prefill (the view's N_p > 0): the only
    steps at which the cap can change the schedule, and the ones ``Scripted`` counts."""
    return bool(sim.waiting) or any(is_prefill_chunk(r.num_computed_tokens, r.prompt_tokens)
                                    for r in sim.running)


class Run:
    """``ppas.engine.simulator.simulate`` as a resumable loop: the same calls in the same order,
    able to stop before each decision step, to be copied there and to go on."""

    def __init__(self, specs: Sequence[RequestSpec], policy: Scripted, cm: CostModel,
                 engine: EngineConfig | None = None, objective: Objective | None = None,
                 ) -> None:
        self.specs = specs
        self.sim = EngineSim(policy, cm, engine or EngineConfig())
        self.policy = policy
        self.objective = objective or MeanE2E()
        self.i = 0
        self.limit = math.inf
        self.cm = cm
        self._rest: list[float] | None = None  # rest_alone(), shared by the copies
        self.d_min = cm.step_time(StepShape(0, 0, 0.0, 0, 1, 0))

    def rest_alone(self) -> list[float]:
        """For finish()'s pruning bound: ``[i]``, the E2E alone of ``specs[i:]`` summed."""
        if self._rest is None:
            solo = SoloTable(self.cm)
            rest = [0.0] * (len(self.specs) + 1)
            for k in range(len(self.specs) - 1, -1, -1):
                sp = self.specs[k]
                rest[k] = rest[k + 1] + solo(sp.prompt_tokens, sp.output_tokens).e2e
            self._rest = rest
        return self._rest

    def to_decision(self) -> bool:
        """Run up to the next decision step (False: the trace is done)."""
        sim, specs, n = self.sim, self.specs, len(self.specs)
        while True:
            while self.i < n and specs[self.i].arrival_s <= sim.now:
                sim.add_request(specs[self.i])
                self.i += 1
            if sim.has_work():
                self.limit = specs[self.i].arrival_s if self.i < n else math.inf
                while sim.now < self.limit and sim.has_work():
                    if is_decision_step(sim):
                        return True
                    sim.advance(self.limit)
            elif self.i < n:
                sim.idle_until(specs[self.i].arrival_s)
            else:
                return False

    def step(self) -> None:
        """The decision step (after ``to_decision`` returned True)."""
        self.sim.advance(self.limit)

    def finish(self, stop_above: float = math.inf) -> float:
        """Run to the end as ``simulate`` does; the objective's value. For a mean E2E,
        ``inf`` as soon as a lower bound of it exceeds ``stop_above`` (checked at each
        arrival: finished requests' E2E plus the time so far of those in the system)."""
        sim, specs, n = self.sim, self.specs, len(self.specs)
        obj = self.objective
        first = obj.first if isinstance(obj, MeanE2E) else -1
        prune = stop_above < math.inf and first >= 0
        rest = self.rest_alone() if prune else []
        while True:
            while self.i < n and specs[self.i].arrival_s <= sim.now:
                sim.add_request(specs[self.i])
                self.i += 1
            if sim.has_work():
                if prune and lower_bound(sim, self.i, rest, self.d_min,
                                         first) > stop_above + 1e-9:
                    return math.inf
                sim.run_until(specs[self.i].arrival_s if self.i < n else math.inf)
            elif self.i < n:
                sim.idle_until(specs[self.i].arrival_s)
            else:
                return obj.value(sim)

    def state(self) -> tuple[object, ...]:
        """What the rest of the run depends on besides the script and the trace (runs in
        the same state go on the same way; the step records' caps aside, which only
        ``predictive``'s tie order reads)."""
        sim, cad = self.sim, self.sim.cadence
        return (sim.now, self.i, sim.num_preemptions, self.policy.seen,
                tuple((r.index, r.num_computed_tokens, r.num_output_tokens)
                      for r in sim.running), tuple(r.index for r in sim.waiting),
                None if cad is None else (cad.executed, cad.last_prefill, cad.capacity_bound))

    def copy(self, script: Sequence[Decision], base: Policy | None = None,
             record: bool = False) -> Run:
        """A copy of the run at this point whose policy follows ``script`` (the decisions
        of every decision step from the first, including those already taken), then
        ``base`` (default: this run's), recording its decisions with ``record``."""
        new = Run.__new__(Run)
        new.specs, new.i, new.limit = self.specs, self.i, self.limit
        new.cm, new.d_min, new.objective = self.cm, self.d_min, self.objective
        new._rest = self.rest_alone() if isinstance(self.objective, MeanE2E) else None
        pol = self.policy
        new.policy = Scripted(pol.base if base is None else base, script, pol.seen, record)
        if record:
            assert new.policy.taken is not None
            new.policy.taken.extend(script[:pol.seen])
        new.sim = self.sim.fork(new.policy)
        return new


def lower_bound(sim: EngineSim, i: int, rest: Sequence[float], d_min: float,
                first: int = 0) -> float:
    """A lower bound of the mean E2E of the trace's requests from index ``first`` at this
    point of the run: finished requests' E2E; for the others in the system, the time so
    far plus one step of at least ``d_min`` (a decode-only step of one request) per output
    token left after the next; for the requests still to arrive, ``rest[i]`` (their E2E
    alone summed, ``ppas.engine.solo``)."""
    now, total = sim.now, 0.0
    for r in sim.requests[first:]:
        if r.finish_time is not None:
            total += r.finish_time - r.arrival_time
        else:
            total += now - r.arrival_time + (r.max_output_tokens - r.num_output_tokens - 1) * d_min
    return (total + rest[i]) / (len(rest) - 1 - first)


def mean_e2e(sim: EngineSim, first: int = 0) -> float:
    """The mean E2E of the run's requests from index ``first`` (every one must have
    finished: the searched traces are cut so that none fails)."""
    reqs = sim.requests[first:]
    assert all(r.finish_time is not None and not r.failed for r in reqs), "a request failed"
    return sum(r.finish_time - r.arrival_time  # type: ignore[operator,misc]
               for r in reqs) / len(reqs)


class Objective:
    """What the search minimises, read off a finished run (deterministic, so the rollout's
    guarantee holds for any objective). ``first``: requests before this index are left out
    (a window's search counts those it can still change)."""

    name = ""
    first = 0

    def value(self, sim: EngineSim) -> float:
        raise NotImplementedError

    def at(self, first: int) -> Objective:
        raise NotImplementedError


@dataclass(frozen=True)
class MeanE2E(Objective):
    """Mean E2E (s); the rollout prunes trials with ``lower_bound``."""

    first: int = 0
    name = "mean-e2e"

    def value(self, sim: EngineSim) -> float:
        return mean_e2e(sim, self.first)

    def at(self, first: int) -> MeanE2E:
        return MeanE2E(first)


#: Added to the P99 TPOT of a schedule that misses the TPOT SLO: every schedule that meets
#: it ranks before every one that misses it, and those by how far they miss.
INFEASIBLE = 1e6


@dataclass(frozen=True)
class P99TtftUnderTpot(Objective):
    """P99 TTFT (s) when P99 TPOT <= ``tpot_slo`` (s), else ``INFEASIBLE`` + P99 TPOT
    (percentiles as ``ppas.core.metrics.percentiles``: numpy's linear interpolation)."""

    tpot_slo: float = 0.1
    first: int = 0
    name = "p99-ttft"

    def value(self, sim: EngineSim) -> float:
        reqs = sim.requests[self.first:]
        assert all(r.finish_time is not None and not r.failed for r in reqs), "a request failed"
        ttft = np.array([r.first_token_time - r.arrival_time for r in reqs])  # type: ignore[operator]
        tpot = np.array([tpot_of(r.first_token_time, r.finish_time,  # type: ignore[arg-type]
                                 r.max_output_tokens) for r in reqs])
        p_tpot = float(np.percentile(tpot, 99))
        if p_tpot > self.tpot_slo:
            return INFEASIBLE + p_tpot
        return float(np.percentile(ttft, 99))

    def at(self, first: int) -> P99TtftUnderTpot:
        return P99TtftUnderTpot(self.tpot_slo, first)


def actions(view: SchedulerView, base: Decision, space: ActionSet = PAPER_ACTIONS
            ) -> list[Decision]:
    """The decisions tried at a decision step (``space``), the base's first: one per
    enforced cap (in the base's order), then the orders (with the base's cap)."""
    mbt = view.max_num_batched_tokens
    queue, decodes = pending_and_decodes(view)
    ahead, left = [], 0
    for pos, end, _ in queue[:space.prompts_ahead]:
        left += end - pos
        ahead.append(min(left, mbt))
    budgets = sorted({min(b, mbt) for b in space.budgets} | {mbt} | set(ahead))
    caps = set(budgets)
    for m in space.limits:
        lb = limit_budget(m, mbt, queue, decodes)
        caps.update(min(b, lb) for b in budgets)
    out, seen = [base], {enforced_budget(base, view)}
    for c in sorted(caps):
        d = Decision(c, base.prefill_order, base.decodes_first)
        e = enforced_budget(d, view)
        if e not in seen:
            seen.add(e)
            out.append(d)
    if space.shortest or space.srpt:
        fcfs = [r.request_id for r in view.requests if not r.is_running]
        if len(fcfs) > 1:
            order = shortest_first(view)
            cap, first = base.prefill_budget, base.decodes_first
            heads = [rid for rid in order[:space.shortest] if rid != fcfs[0]]
            out += [Decision(cap, (rid,), first) for rid in heads]
            moved = (order[0], *(rid for rid in fcfs if rid != order[0]))
            if space.srpt and order != tuple(fcfs) and order != moved:
                out.append(Decision(cap, order, first))
    return out


@dataclass(frozen=True)
class Rollout:
    base_value: float  # value of the first incumbent (the base's own run)
    value: float  # value of the schedule found
    script: list[Decision]  # its decisions, one per decision step
    decision_steps: int
    simulations: int
    times: list[float]  # the clock at each of its decision steps


def rollout(specs: Sequence[RequestSpec], base: Policy, cm: CostModel, script: list[Decision],
            value: float, heuristics: Sequence[Policy], *, space: ActionSet = PAPER_ACTIONS,
            objective: Objective | None = None, start_s: float = 0.0,
            end_s: float = math.inf, every: int = 1, engine: EngineConfig | None = None,
            ) -> Rollout:
    """One fortified rollout pass over one trace (Bertsekas): the incumbent is the best
    whole schedule found so far (first ``script``, of value ``value``); at each decision
    step every action is followed by every continuation, the incumbent's own decisions by
    decision-step index (open loop) and each of ``heuristics`` (closed loop), and the
    incumbent is replaced by any strictly better schedule; then the step takes the
    incumbent's decision. So the value never rises, and the schedule followed is always
    the incumbent: the result is never worse than the first ``script`` (asserted).
    Actions are tried at decision steps that start in ``[start_s, end_s)``, every
    ``every``-th of them (the others take the incumbent's decision)."""
    for h in heuristics:  # one engine: the same global budget and vLLM knobs
        assert (h.max_num_batched_tokens, h.engine_knobs) == \
            (base.max_num_batched_tokens, base.engine_knobs), (h, base)
    base_value = value
    committed: list[Decision] = []
    main = Run(specs, Scripted(base, committed), cm, engine, objective)
    sims = 0
    j = tried = 0
    times: list[float] = []
    while main.to_decision():
        now = main.sim.now
        times.append(now)
        if start_s <= now < end_s:
            if tried % every == 0:
                script, value, n = _try_step(main, committed, script, j, value, heuristics,
                                             space)
                sims += n
            tried += 1
        committed.append(script[j])  # the incumbent passes through main's state
        main.step()
        j += 1
    final = main.objective.value(main.sim)
    assert abs(final - value) <= 1e-9 * max(1.0, value), (final, value)
    assert final <= base_value + 1e-12, (final, base_value)
    return Rollout(base_value, final, committed, j, sims, times)


def _try_step(main: Run, committed: list[Decision], script: list[Decision], j: int,
              value: float, heuristics: Sequence[Policy], space: ActionSet
              ) -> tuple[list[Decision], float, int]:
    """Every action at ``main``'s decision step ``j`` with every continuation: the
    incumbent (script, value) after them, and the simulations run."""
    view = main.sim._view()
    own = script[j]  # main follows the incumbent, whose run records every step
    states: set[tuple[object, ...]] = set()
    sims = 0
    for d in actions(view, own, space):
        trial = [*committed, d]
        first = main.copy(trial)
        first.step()
        key = first.state()
        if key in states:
            continue  # another action led to the same state
        states.add(key)
        conts: list[tuple[list[Decision], Policy | None]] = [(trial, h) for h in heuristics]
        if d is not own:  # (own then the incumbent's tail: the incumbent itself)
            conts.insert(0, ([*trial, *script[j + 1:]], None))
        for cont, then in conts:
            run = main.copy(cont, then, record=True)
            v = run.finish(value)
            sims += 1
            if v < value:
                assert run.policy.taken is not None
                script, value = run.policy.taken, v
    return script, value, sims


def improve(specs: Sequence[RequestSpec], base: Policy, cm: CostModel, iterations: int,
            heuristics: Sequence[Policy] = ()) -> tuple[float, list[float], int, int]:
    """(base mean E2E, mean E2E of the schedule found after each of ``iterations``
    fortified rollout passes, decision steps, simulations); the first pass starts from
    ``base``'s own run, each further one from the last one's schedule (its open-loop
    continuations are new). A pass that finds nothing is a fixed point: the next ones
    would find nothing either, and repeat its value without running."""
    rec = Scripted(base, record=True)
    first = Run(specs, rec, cm).finish()
    assert rec.taken is not None
    script, value = rec.taken, first
    steps = sims = 0
    values: list[float] = []
    while len(values) < iterations:
        r = rollout(specs, base, cm, script, value, heuristics)
        steps, sims = r.decision_steps, sims + r.simulations
        done = r.value >= value
        script, value = r.script, r.value
        values.append(value)
        if done:
            values += [value] * (iterations - len(values))
    check = Run(specs, Scripted(base, script), cm).finish()
    assert abs(check - value) <= 1e-9 * max(1.0, value) and value <= first + 1e-12
    return first, values, steps, sims


def roofline_per_budget(hardware: str, model: str) -> Callable[[Policy], CostModel]:
    """``engine_for``'s roofline for a policy, built once per token budget."""
    cms: dict[int, CostModel] = {}

    def cost_model(pol: Policy) -> CostModel:
        mbt = pol.max_num_batched_tokens
        if mbt not in cms:
            cms[mbt] = engine_for(pol, hardware, model).cost_model
        return cms[mbt]

    return cost_model


def best_setting(traces: dict[float, list[list[RequestSpec]]], settings: Sequence[str],
                 hardware: str, model: str) -> dict[float, str]:
    """Per burst, the setting of ``settings`` with the lowest mean E2E over its traces
    (the first of equals), each run as ``Scripted`` runs it with no script."""
    cost_model = roofline_per_budget(hardware, model)
    out = {}
    for b, ts in traces.items():
        best, best_v = "", math.inf
        for c in settings:
            pol = make_policy(c)
            cm = cost_model(pol)
            v = sum(Run(t, Scripted(pol), cm).finish() for t in ts) / len(ts)
            if v < best_v:
                best, best_v = c, v
        out[b] = best
    return out


# ------------------------------------------------------------------ real traces: windows


def busiest_windows(specs: Sequence[RequestSpec], e2e: Sequence[float], length_s: float,
                    count: int) -> list[tuple[float, float]]:
    """Up to ``count`` disjoint windows ``[start, start + length_s)`` holding the most E2E
    seconds (``e2e[k]``: request k's E2E in the base's run) among the requests arriving in
    them, in time order; starts are multiples of ``length_s / 4``."""
    assert len(specs) == len(e2e) and length_s > 0 and count >= 0
    if not specs:
        return []
    step = length_s / 4
    end = specs[-1].arrival_s
    sums: dict[int, float] = {}
    for sp, v in zip(specs, e2e, strict=True):
        k = int(sp.arrival_s // step)
        for s in range(max(0, k - 3), k + 1):  # the windows starting at s * step hold it
            sums[s] = sums.get(s, 0.0) + v
    picked: list[int] = []
    for s in sorted(sums, key=lambda s: (-sums[s], s)):
        if len(picked) == count:
            break
        if s * step <= end and all(abs(s - p) >= 4 for p in picked):
            picked.append(s)
    return [(s * step, s * step + length_s) for s in sorted(picked)]


@dataclass(frozen=True)
class WindowResult:
    """One window's search: requests it counts (those unfinished at its start or arriving
    in it), its value before and after on the trace cut at its end (drain included), and
    the whole trace's value after the splice (kept only when strictly lower)."""

    start_s: float
    end_s: float
    requests: int
    base_value: float
    value: float
    whole_value: float
    kept: bool
    decision_steps: int
    simulations: int


@dataclass(frozen=True)
class Spliced:
    base_value: float  # the base's whole-trace value
    value: float  # the whole-trace value of the schedule found
    script: list[Decision]
    windows: list[WindowResult]
    tail: str  # the policy deciding after the script (whose own run was the best first)
    firsts: list[float]  # the whole-trace values of the base, each heuristic and tail
    first_tails: list[dict[str, float]]  # their ``tail_figures``
    found_tails: dict[str, float]  # the ``tail_figures`` of the schedule found


def tail_figures(sim: EngineSim) -> dict[str, float]:
    """Mean E2E, P99 TTFT, P99 TPOT and P99 E2E (s) of a finished run's requests."""
    reqs = sim.requests
    e2e = [r.finish_time - r.arrival_time for r in reqs]  # type: ignore[operator]
    ttft = [r.first_token_time - r.arrival_time for r in reqs]  # type: ignore[operator]
    tpot = [tpot_of(r.first_token_time, r.finish_time, r.max_output_tokens)  # type: ignore[arg-type]
            for r in reqs]
    p = np.percentile(np.array([ttft, tpot, e2e]), 99, axis=1)
    return {"mean_e2e": sum(e2e) / len(e2e), "p99_ttft": float(p[0]),
            "p99_tpot": float(p[1]), "p99_e2e": float(p[2])}


def splice_windows(specs: Sequence[RequestSpec], base: Policy, cm: CostModel,
                   objective: Objective,
                   windows: Callable[[list[float]], Sequence[tuple[float, float]]],
                   heuristics: Sequence[Policy], space: ActionSet = TRACE_ACTIONS,
                   every: int = 1, engine: EngineConfig | None = None,
                   tails: Sequence[Policy] = ()) -> Spliced:
    """The rollout on each window in time order (module doc), spliced into the whole
    trace. The first incumbent is the best whole-trace run of ``base``, each of
    ``heuristics`` (also the rollout's continuations) and each of ``tails`` (the same
    engine), its policy the *tail* that decides wherever no spliced decision does. The
    windows are ``windows(e2e)``, ``e2e[k]`` request k's E2E in that run. Per window: the
    trace cut at its end; the incumbent's
    decisions followed open loop (then the tail); actions tried at the decision steps in
    the window (``rollout``'s ``start_s``/``end_s``/``every``); the window's objective
    counts the requests from the first one unfinished at its start. Its decisions before
    the window's end then replace the incumbent's, the tail decides after, and the whole
    trace is simulated: kept if strictly better. Never worse than the base's own run nor
    any heuristic's (asserted)."""
    best: tuple[float, list[Decision], Policy, EngineSim] | None = None
    firsts, first_tails = [], []
    for pol in (base, *heuristics, *tails):
        rec = Scripted(pol, record=True)
        run = Run(specs, rec, cm, engine, objective)
        v = run.finish()
        firsts.append(v)
        first_tails.append(tail_figures(run.sim))
        assert rec.taken is not None
        if best is None or v < best[0]:
            best = (v, rec.taken, pol, run.sim)
    assert best is not None
    value, script, tail, sim = best
    results = []
    arrivals = [s.arrival_s for s in specs]
    e2e = [(r.finish_time or math.inf) - r.arrival_time for r in sim.requests]
    for t0, t1 in sorted(windows(e2e)):
        n = bisect_left(arrivals, t1)
        cut = specs[:n]
        first = next((k for k, r in enumerate(sim.requests[:n])
                      if r.arrival_time >= t0 or (r.finish_time or math.inf) > t0), n)
        if first >= n:
            continue
        obj = objective.at(first)
        wrec = Scripted(tail, script, record=True)
        w0 = Run(cut, wrec, cm, engine, obj).finish()
        assert wrec.taken is not None
        r = rollout(cut, tail, cm, wrec.taken, w0, heuristics, space=space, objective=obj,
                    start_s=t0, end_s=t1, every=every, engine=engine)
        c = bisect_left(r.times, t1)
        cand = Scripted(tail, r.script[:c], record=True)
        run = Run(specs, cand, cm, engine, objective)
        v = run.finish()
        kept = v < value
        if kept:
            assert cand.taken is not None
            script, value, sim = cand.taken, v, run.sim
        results.append(WindowResult(t0, t1, n - first, w0, r.value, value, kept,
                                    r.decision_steps, r.simulations))
    check = Run(specs, Scripted(tail, script), cm, engine, objective).finish()
    assert abs(check - value) <= 1e-9 * max(1.0, value), (check, value)
    assert value <= min(firsts) + 1e-12, (value, firsts)
    return Spliced(firsts[0], value, script, results, tail.spec, firsts, first_tails,
                   tail_figures(sim))


# ------------------------------------------------------------------ a bound for any schedule


def fastest_step(cm: CostModel, prompt_tokens: int) -> float:
    """A lower bound of the time of any step that computes ``prompt_tokens`` prompt
    tokens: the step time of one chunk of them that reads only its own KV and does no
    attention arithmetic (``srpt_bound``'s premise: no real step is faster; for the
    roofline, its attention is at least that KV read and every other term grows with
    the tokens and requests, checked by ``tests/test_headroom.py``)."""
    return cm.step_time(StepShape(prompt_tokens, 1, 0.0, prompt_tokens, 0, 0))


def peak_prefill_rate(cm: CostModel, mbt: int) -> float:
    """The most prompt tokens per second a step of at most ``mbt`` tokens can compute:
    the max over P <= ``mbt`` of P / ``fastest_step(P)`` (``srpt_bound``'s server)."""
    return max(p / fastest_step(cm, p) for p in range(1, mbt + 1))


def srpt_bound(specs: Sequence[RequestSpec], cm: CostModel, mbt: int) -> float:
    """A lower bound of the mean E2E of ANY schedule of ``specs`` on an engine of global
    budget ``mbt`` priced by ``cm``, if no step that computes P prompt tokens is faster
    than ``fastest_step(P)`` (checked for the roofline): every such step lasts at least
    P / R (R = ``peak_prefill_rate``), so the
    prompts are jobs of ``prompt_tokens / R`` seconds on one server, where preemptive
    shortest-remaining-first minimises the sum of completion times (1|r_j,pmtn|sum C_j);
    a request's first token comes no earlier than its prompt's last token, and each later
    token takes a step of at least a one-decode step. So mean E2E >= (sum of SRPT
    completion - arrival + (outputs - 1) x that step) / n."""
    import heapq

    rate = peak_prefill_rate(cm, mbt)
    d_min = cm.step_time(StepShape(0, 0, 0.0, 0, 1, 0))
    reqs = sorted(specs, key=lambda r: r.arrival_s)
    heap: list[tuple[float, int]] = []
    total = 0.0
    now = 0.0
    k, n = 0, len(reqs)
    while k < n or heap:
        if not heap:
            now = max(now, reqs[k].arrival_s)
        while k < n and reqs[k].arrival_s <= now:
            heapq.heappush(heap, (reqs[k].prompt_tokens / rate, k))
            k += 1
        left, j = heapq.heappop(heap)
        nxt = reqs[k].arrival_s if k < n else math.inf
        if now + left <= nxt:
            now += left
            total += now - reqs[j].arrival_s
        else:
            heapq.heappush(heap, (left - (nxt - now), j))
            now = nxt
    total += sum((r.output_tokens - 1) * d_min for r in reqs)
    return total / n if n else 0.0
