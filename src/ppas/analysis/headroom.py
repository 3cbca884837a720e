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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ppas.core.decision import Decision, EngineKnobs
from ppas.core.view import SchedulerView, is_pending_prefill, is_prefill_chunk
from ppas.cost.base import CostModel, StepShape
from ppas.engine.setup import engine_for
from ppas.engine.simulator import EngineConfig, EngineSim
from ppas.engine.solo import lower_bound_latency
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


class Scripted(Policy):
    """Forced decisions for the first ``len(script)`` decision steps, then ``base``.

    A search tool, not a registered policy: it counts the decision steps it has seen (a
    step whose view has a pending prefill), so it is impure; the engine runs with the
    base's MBT and vLLM knobs. With an empty script it decides exactly as ``base``."""

    name = "scripted"
    Config = object

    def __init__(self, base: Policy, script: Sequence[Decision] = (), seen: int = 0,
                 record: bool = False) -> None:
        super().__init__(None, f"scripted({base.spec})")
        self.base = base
        self.script = script
        self.seen = seen  # decision steps decided so far
        #: With ``record``, every decision taken at a decision step, in order: replayed as
        #: a script, it reproduces this run exactly.
        self.taken: list[Decision] | None = [] if record else None

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
                 engine: EngineConfig | None = None) -> None:
        self.specs = specs
        self.sim = EngineSim(policy, cm, engine or EngineConfig())
        self.policy = policy
        self.i = 0
        self.limit = math.inf
        # For finish()'s pruning bound: every request of the trace is alike (checked).
        assert len({(s.prompt_tokens, s.output_tokens) for s in specs}) <= 1
        self.alone = lower_bound_latency(specs[0], cm) if specs else 0.0
        self.d_min = cm.step_time(StepShape(0, 0, 0.0, 0, 1, 0))

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
        """Run to the end as ``simulate`` does; the mean E2E of the trace. ``inf`` as soon
        as a lower bound of it exceeds ``stop_above`` (checked at each arrival: finished
        requests' E2E plus the time so far of those in the system, over all requests)."""
        sim, specs, n = self.sim, self.specs, len(self.specs)
        prune = stop_above < math.inf
        while True:
            while self.i < n and specs[self.i].arrival_s <= sim.now:
                sim.add_request(specs[self.i])
                self.i += 1
            if sim.has_work():
                if prune and lower_bound(sim, specs, self.i, self.alone,
                                         self.d_min) > stop_above + 1e-9:
                    return math.inf
                sim.run_until(specs[self.i].arrival_s if self.i < n else math.inf)
            elif self.i < n:
                sim.idle_until(specs[self.i].arrival_s)
            else:
                return mean_e2e(sim)

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
        new.alone, new.d_min = self.alone, self.d_min
        pol = self.policy
        new.policy = Scripted(pol.base if base is None else base, script, pol.seen, record)
        if record:
            assert new.policy.taken is not None
            new.policy.taken.extend(script[:pol.seen])
        new.sim = self.sim.fork(new.policy)
        return new


def lower_bound(sim: EngineSim, specs: Sequence[RequestSpec], i: int, alone: float,
                d_min: float) -> float:
    """A lower bound of the trace's mean E2E at this point of the run: finished requests'
    E2E; for the others in the system, the time so far plus one step of at least ``d_min``
    (a decode-only step of one request) per output token left after the next; for the
    requests still to arrive (``specs[i:]``), ``alone`` each (the E2E of one with the
    machine to itself, ``ppas.engine.simulator.lower_bound_latency``)."""
    now, total = sim.now, 0.0
    for r in sim.requests:
        if r.finish_time is not None:
            total += r.finish_time - r.arrival_time
        else:
            total += now - r.arrival_time + (r.max_output_tokens - r.num_output_tokens - 1) * d_min
    return (total + (len(specs) - i) * alone) / len(specs)


def mean_e2e(sim: EngineSim) -> float:
    """The run's mean E2E (every request must have finished: the paper grid's never fail)."""
    reqs = sim.requests
    assert all(r.finish_time is not None and not r.failed for r in reqs), "a request failed"
    return sum(r.finish_time - r.arrival_time  # type: ignore[operator,misc]
               for r in reqs) / len(reqs)


def actions(view: SchedulerView, base: Decision) -> list[Decision]:
    """The decisions tried at a decision step, the base's first, one per enforced cap."""
    mbt = view.max_num_batched_tokens
    queue, decodes = pending_and_decodes(view)
    ahead, left = [], 0
    for pos, end, _ in queue[:PROMPTS_AHEAD]:
        left += end - pos
        ahead.append(min(left, mbt))
    budgets = sorted({min(b, mbt) for b in BUDGETS} | {mbt} | set(ahead))
    caps = set(budgets)
    for m in LIMITS:
        lb = limit_budget(m, mbt, queue, decodes)
        caps.update(min(b, lb) for b in budgets)
    out, seen = [base], {enforced_budget(base, view)}
    for c in sorted(caps):
        d = Decision(c)
        e = enforced_budget(d, view)
        if e not in seen:
            seen.add(e)
            out.append(d)
    return out


@dataclass(frozen=True)
class Rollout:
    base_value: float  # mean E2E of the first incumbent (the base's own run)
    value: float  # mean E2E of the schedule found
    script: list[Decision]  # its decisions, one per decision step
    decision_steps: int
    simulations: int


def rollout(specs: Sequence[RequestSpec], base: Policy, cm: CostModel, script: list[Decision],
            value: float, heuristics: Sequence[Policy]) -> Rollout:
    """One fortified rollout pass over one trace (Bertsekas): the incumbent is the best
    whole schedule found so far (first ``script``, of mean E2E ``value``); at each decision
    step every action is followed by every continuation, the incumbent's own decisions by
    decision-step index (open loop) and each of ``heuristics`` (closed loop), and the
    incumbent is replaced by any strictly better schedule; then the step takes the
    incumbent's decision. So the value never rises, and the schedule followed is always
    the incumbent: the result is never worse than the first ``script`` (asserted)."""
    for h in heuristics:  # one engine: the same global budget and vLLM knobs
        assert (h.max_num_batched_tokens, h.engine_knobs) == \
            (base.max_num_batched_tokens, base.engine_knobs), (h, base)
    base_value = value
    committed: list[Decision] = []
    main = Run(specs, Scripted(base, committed), cm)
    sims = 0
    j = 0
    while main.to_decision():
        view = main.sim._view()
        own = script[j]  # main follows the incumbent, whose run records every step
        states: set[tuple[object, ...]] = set()
        for d in actions(view, own):
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
        committed.append(script[j])  # the incumbent passes through main's state
        main.step()
        j += 1
    final = mean_e2e(main.sim)
    assert abs(final - value) <= 1e-9 * max(1.0, value), (final, value)
    assert final <= base_value + 1e-12, (final, base_value)
    return Rollout(base_value, final, committed, j, sims)


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
