"""Headroom over the best stock vLLM setting per burst: a clairvoyant rollout search (issue 9).

How much could ANY per-step policy gain over the stock-vLLM oracle of the paper grid (the
best of 1,995 ``vllm:`` knob settings per burst, picked with hindsight,
``benchmarks/policy_comparison.py``)? Every request of the paper trace is alike (25k-token
prompt, 32 outputs), so a tuned static setting is already close to what per-step choices
can do; this benchmark measures how close, per trace, by **fortified rollout** (Bertsekas'
rollout policy improvement, keeping the best schedule found so far). The incumbent is
first a base policy's own run. At each *decision step* (a step with a prompt waiting or
mid-prefill: the only steps at which a cap changes anything) the search tries every
action of a small set, follows each by every continuation, the incumbent's own later
decisions by decision-step index (open loop) and each of a few cheap closed-loop
heuristic policies, simulates to the end of the trace, and keeps any schedule with a
lower mean E2E as the new incumbent; then it takes the incumbent's decision and moves one
step on. A further pass (``--iterations``) starts from the last pass's schedule.

The simulator is exact and deterministic and the incumbent is only ever replaced by a
strictly better schedule, so the value never rises from one decision step to the next
and the result is never worse than the base's (asserted at every step and at the end).
The search knows the future arrivals of the trace (clairvoyant) and the schedules it
finds are not a policy: an online per-step policy with the same actions should not
expect to gain more than it finds; it is not exhaustive, so what it finds is headroom
that exists, not a bound on what could. Actions are what a policy can return, a
``Decision`` whose prefill cap is one of: a budget in {0 (decode-only), 64 (what rides on
a decode step), 2048, 8192, 16384, the global MBT, the tokens left of the first 1-4
pending prompts}, each alone and each under an admission limit of 1-4 requests at once
applied through the cap alone, as ``predictive`` applies its limits
(``ppas.policies.predictive.limit_budget``); actions the engine would enforce as the
same cap (``step_rules.enforced_budget``) are tried once, and so are actions that lead
to the same state.

Bases, each its own engine (global budget and vLLM knobs fixed for the run):
* the best stock setting of each burst, with its knobs (``--stock``; defaults: the
  oracle's picks on RTX 5090 / Qwen2.5-3B, 25k/32, seeds 0-4, from one run of
  ``policy_comparison.py``'s grid; ``--recompute-oracle`` re-picks them over
  ``policy_comparison.stock_grid()`` on this run's traces). The knobs bind every action
  (a cap on top of them is what the plugin adds); continuation: the setting itself;
* the same setting's MBT and ``max_num_active_seqs`` applied as a cap on an engine with
  vLLM's default knobs (``LimitAsCap``: the oracle's own schedule where it has no
  threshold or interval), so the search may leave the limit; continuations: one and two
  requests at a time (``LimitAsCap``);
* ``--policy`` (default ``predictive``); open-loop continuations only (its projections
  cost too much to run at every step of every trial).

    .venv/bin/python benchmarks/headroom.py [--seeds 5] [--bursts 0.4,0.6,...]
        [--hardware rtx5090 --model qwen2.5-3b] [--iterations 2] [--policy predictive]
        [--stock BURST=vllm:...] [--recompute-oracle]
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ppas.analysis.reference import PAPER_BURSTS
from ppas.core.config import config_string
from ppas.core.decision import Knob
from ppas.core.errors import PpasError
from ppas.core.metrics import geomean_improvement
from ppas.core.view import SchedulerView, is_pending_prefill
from ppas.cost.base import CostModel, StepShape
from ppas.cost.roofline import RooflineCostModel
from ppas.engine.simulator import EngineConfig, EngineSim, lower_bound_latency
from ppas.engine.step_rules import enforced_budget
from ppas.policies import Decision, Policy, make_policy
from ppas.policies.predictive import limit_budget
from ppas.policies.vllm_stock import VllmStockConfig
from ppas.workload import PAPER_PHASES, RequestSpec, phase_trace

#: The stock oracle's pick per burst: the lowest mean E2E over seeds 0-4 among
#: ``policy_comparison.stock_grid()`` (vLLM 0.33) on RTX 5090 / Qwen2.5-3B, 25k/32.
#: Settings only; every figure is measured by the run that prints it.
ORACLE_SETTINGS: dict[float, str] = {
    b: config_string("vllm", VllmStockConfig(32768, lpt, adaptive, psi,
                                             max_num_active_seqs=active, version="0.33"),
                     omit=(Knob.MAX_NUM_SEQS,))
    for b, lpt, adaptive, psi, active in ((0.4, 0, False, 1, 1), (0.6, 0, False, 1, 1),
                                          (0.8, 256, True, 32, 2), (1.0, 4096, True, 32, 2),
                                          (1.2, 0, False, 1, 2), (1.4, 0, False, 1, 2))}

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
    def engine_knobs(self):  # type: ignore[no-untyped-def]
        return self.base.engine_knobs

    @property
    def history_window(self) -> int:  # type: ignore[override]
        return self.base.history_window

    def bind_cost_model(self, cost_model: CostModel) -> None:
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
    if sim.waiting:
        return True
    return any(r.num_computed_tokens < r.prompt_tokens for r in sim.running)


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
    return sum(r.finish_time - r.arrival_time for r in reqs) / len(reqs)  # type: ignore[operator]


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


@dataclass
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
            for cont, h in conts:
                run = main.copy(cont, h, record=True)
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


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse's own errors: one line, exit 2 (the project's bad-input contract).
        self.exit(2, f"{self.prog}: error: {message}\n")


def _bursts(text: str) -> tuple[float, ...]:
    try:
        out = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise PpasError(f"--bursts must be comma-separated numbers > 0, got {text!r}") from None
    if not out or any(not b > 0 or not math.isfinite(b) for b in out) or len(set(out)) < len(out):
        raise PpasError(f"--bursts must be distinct numbers > 0, got {text!r}")
    return out


def _stock(items: Sequence[str], bursts: Sequence[float]) -> dict[float, str]:
    """``--stock BURST=SETTING`` (repeatable) over the defaults."""
    out = dict(ORACLE_SETTINGS)
    for item in items:
        b, sep, setting = item.partition("=")
        try:
            burst = float(b)
        except ValueError:
            burst = math.nan
        if not sep or burst not in bursts:
            raise PpasError(f"--stock must be BURST=vllm:... with BURST one of the bursts "
                            f"({', '.join(f'{x:g}' for x in bursts)}), got {item!r}")
        if make_policy(setting).name != "vllm":
            raise PpasError(f"--stock takes a stock setting (vllm:...), got {setting!r}")
        out[burst] = setting
    return out


@dataclass
class Cell:
    """One (track, burst) over the seeds: base and improved mean E2E per seed."""

    base: list[float]
    improved: list[list[float]]  # per seed, after each pass
    decision_steps: int = 0
    simulations: int = 0


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def recompute_oracle(traces: dict[float, list[list[RequestSpec]]], hw: str,
                     model: str) -> dict[float, str]:
    """The best of ``policy_comparison.stock_grid()`` per burst on these traces."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from policy_comparison import stock_grid

    out = {}
    grid = stock_grid()
    cms: dict[int, CostModel] = {}
    for b, ts in traces.items():
        best, best_v = "", math.inf
        for c in grid:
            pol = make_policy(c)
            mbt = pol.max_num_batched_tokens
            cm = cms.setdefault(mbt, RooflineCostModel(hw, model, max_num_batched_tokens=mbt))
            v = _mean([Run(t, Scripted(pol), cm).finish() for t in ts])
            if v < best_v:
                best, best_v = c, v
        out[b] = best
    return out


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="headroom.py", description=__doc__.split("\n")[0])
    p.add_argument("--hardware", default="rtx5090")
    p.add_argument("--model", default="qwen2.5-3b")
    p.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    p.add_argument("--bursts", default=",".join(f"{b:g}" for b in PAPER_BURSTS))
    p.add_argument("--iterations", type=int, default=2,
                   help="rollout iterations (each takes the last schedule as its base)")
    p.add_argument("--policy", action="append", metavar="SPEC",
                   help="a base policy besides the stock setting's two (repeatable; "
                        "default: predictive)")
    p.add_argument("--stock", action="append", default=[], metavar="BURST=vllm:...",
                   help="the stock base (oracle setting) of a burst, over the defaults")
    p.add_argument("--recompute-oracle", action="store_true",
                   help="pick each burst's stock setting over policy_comparison.stock_grid() "
                        "on this run's traces (minutes)")
    a = p.parse_args(argv)
    try:
        if a.seeds < 1:
            raise PpasError(f"--seeds must be >= 1, got {a.seeds}")
        if a.iterations < 1:
            raise PpasError(f"--iterations must be >= 1, got {a.iterations}")
        bursts = _bursts(a.bursts)
        stock = _stock(a.stock, bursts)
        policies = list(dict.fromkeys(a.policy or ["predictive"]))
        bases = {c: make_policy(c) for c in policies}
        RooflineCostModel(a.hardware, a.model)  # validates both names
        traces = {b: [sorted(phase_trace(PAPER_PHASES, s, 25000, 32, b).requests,
                             key=lambda r: r.arrival_s) for s in range(a.seeds)]
                  for b in bursts}
        missing = [b for b in bursts if b not in stock]
        if missing and not a.recompute_oracle:
            raise PpasError("no stock setting for burst(s) "
                            f"{', '.join(f'{b:g}' for b in missing)}: give --stock "
                            "BURST=vllm:... or --recompute-oracle")
    except PpasError as e:
        print(f"headroom.py: error: {e}", file=sys.stderr)
        return 2
    print("$ .venv/bin/python benchmarks/headroom.py "
          + " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:])))
    print(f"hardware {a.hardware}, model {a.model}, paper trace 25k prompt / 32 outputs, "
          f"seeds 0-{a.seeds - 1}, bursts {', '.join(f'{b:g}' for b in bursts)}, "
          f"up to {a.iterations} rollout iteration(s)")
    print("CLAIRVOYANT: the search knows every future arrival of each trace; the schedules "
          "it finds are not a policy.\n")
    t0 = time.perf_counter()
    if a.recompute_oracle:
        stock = recompute_oracle(traces, a.hardware, a.model)
        print(f"stock oracle re-picked over policy_comparison.stock_grid() "
              f"({time.perf_counter() - t0:.0f} s)")
    elif (a.hardware, a.model) != ("rtx5090", "qwen2.5-3b"):
        print("note: the default stock settings are the RTX 5090 / Qwen2.5-3B oracle's; "
              "--recompute-oracle picks this model's")
    for b in bursts:
        print(f"stock base at burst {b:g}: {stock[b].removeprefix('vllm:')}")
    cms: dict[int, CostModel] = {}

    def cm_for(pol: Policy) -> CostModel:
        mbt = pol.max_num_batched_tokens
        if mbt not in cms:
            cms[mbt] = RooflineCostModel(a.hardware, a.model, max_num_batched_tokens=mbt)
        return cms[mbt]

    stock_track, cap_track = "stock setting (its knobs)", "its limit as a cap (default knobs)"
    tracks = [stock_track, cap_track, *policies]

    def policy_for(track: str, b: float) -> tuple[Policy, list[Policy]]:
        """A track's base and its closed-loop continuation heuristics (besides the
        incumbent's own decisions, which every track follows open loop)."""
        if track == stock_track:
            pol = make_policy(stock[b])
            return pol, [pol]
        if track == cap_track:
            pol = LimitAsCap.of(make_policy(stock[b]))
            limits = dict.fromkeys([*CAP_HEURISTICS, pol.limit])
            return pol, [LimitAsCap(m, pol.mbt) for m in limits]
        return bases[track], []  # predictive's projections cost too much per step

    cells: dict[tuple[str, float], Cell] = {}
    spent = dict.fromkeys(tracks, 0.0)
    for b in bursts:
        for track in tracks:
            t1 = time.perf_counter()
            pol, heuristics = policy_for(track, b)
            cell = cells[(track, b)] = Cell([], [])
            for specs in traces[b]:
                first, values, steps, sims = improve(specs, pol, cm_for(pol), a.iterations,
                                                     heuristics)
                cell.base.append(first)
                cell.improved.append(values)
                cell.decision_steps += steps
                cell.simulations += sims
            spent[track] += time.perf_counter() - t1
        print(f"  burst {b:g} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    oracle = [_mean(cells[(stock_track, b)].base) for b in bursts]
    def best_after(k: int) -> list[float]:
        """Per burst, the mean over seeds of the best schedule of any base after pass k."""
        return [_mean([min(cells[(t, b)].improved[s][k] for t in tracks)
                       for s in range(a.seeds)]) for b in bursts]

    best = best_after(a.iterations - 1)

    def row(label: str, vals: Sequence[float]) -> None:
        gaps = [100 * (1 - v / o) for v, o in zip(vals, oracle, strict=True)]
        print(f"{label:>44} " + " ".join(f"{v:7.3f}" for v in vals)
              + f" {geomean_improvement(list(vals), oracle):+8.1f}%   "
              + " ".join(f"{g:+5.1f}%" for g in gaps))

    print("\nmean E2E (s), mean over seeds; vs oracle: geometric-mean improvement over the "
          "bursts, then per burst (+: lower than the oracle)")
    print(f"{'':>44} " + " ".join(f"{b:>7g}" for b in bursts) + f" {'vs oracle':>9}")
    row("best stock vLLM per burst (oracle)", oracle)
    for track in tracks:
        if track != stock_track:
            row(track, [_mean(cells[(track, b)].base) for b in bursts])
        row(f"rollout on {track}", [_mean([v[-1] for v in cells[(track, b)].improved])
                                    for b in bursts])
    for k in range(a.iterations - 1):
        row(f"best schedule found, pass {k + 1} (per trace)", best_after(k))
    row(f"best schedule found, pass {a.iterations} (per trace)", best)
    imp = geomean_improvement(best, oracle)
    least = min(1 - v / o for v, o in zip(best, oracle, strict=True))
    print(f"\nbest schedule found vs the stock oracle: {imp:.1f}% lower mean E2E in geometric "
          f"mean, {100 * least:+.1f}% at the burst where it gains least (the bar for a "
          "policy: >= 10% and never worse).\nCLAIRVOYANT: these schedules know every "
          "future arrival, so an online per-step policy with the same actions should not "
          "expect to gain more;\nthe search is not exhaustive (rollout, a one-step "
          "lookahead per iteration), so this is the headroom found, not a proof that no "
          "more exists.")
    print("wall time per base: " + ", ".join(f"{t} {spent[t]:.0f} s" for t in tracks))
    steps = sum(c.decision_steps for c in cells.values())
    sims = sum(c.simulations for c in cells.values())
    print(f"{steps} decision steps in the final schedules, {sims} simulated continuations")
    print(f"({time.perf_counter() - t0:.1f} s wall)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
