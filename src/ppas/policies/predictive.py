"""Predictive: the prefill budget that minimises the predicted sum of request latencies.

Ours (not from a paper; P-PAS's future work asks for budgets that adapt to the model and
the load). The objective is P-PAS's: mean end-to-end latency. Every step it projects the
requests now in the system forward under each candidate (``ppas.policies.projection``)
and takes the one with the smallest predicted sum of completion times:

* constant budgets ``a`` in {0} + powers of two in [c_min, c_max]: ``a`` while any decode
  runs, ``c_max`` when none does (``a = 0`` is a decode-only step);
* admission limits ``m`` in 1..``max_active``: at most ``m`` requests at once, budget
  ``c_max`` (vLLM's ``max_num_active_seqs`` as a policy: a prompt starts only when a slot
  is free, a finished prompt keeps its slot while it decodes). A limit is applied through
  the budget alone (``limit_budget``), so the plugin needs nothing more than a budget.
  Of the limits the running decodes already fill, only the largest is projected
  (``prune_limits``: they all propose a decode-only step now).

A bigger ``a`` finishes the queue's prompts with fewer, more efficient steps (waiting
requests gain) but stretches each of the decodes' remaining steps (decoding requests
lose); ``a = 0`` finishes the decodes in short weight-bound steps and pauses the prefill
queue. With no decode running every constant budget projects as ``c_max`` (nothing to
stall; the biggest chunk is the most efficient prefill, P-PAS's B_max), so only ``c_max``
and the limits compete (a limit keeps a prompt's last chunk from spilling into the next
prompt, which would delay the first one's first token); with ``max_active = 0`` it takes
``c_max`` without projecting.

A bounded horizon (``horizon``, 128 prompts by default): only the running requests and the
first ``horizon`` pending prompts in engine order are projected exactly; the pending
prompts past them (``n_tail``, a count the view keeps: ``num_pending_prefills``) enter in
closed form (``ppas.policies.projection.Tail``): the horizon's budget stays busy with the
tail's prefill once its own prompts are done (its decodes ride it, as behind a long
queue), the tail is copies of the horizon queued behind it, each completing as the
horizon does one horizon-prefill later, and the next arrivals wait for the whole queue's
prefill. A decision then reads O(running + horizon) requests and projects O(running +
horizon) events per candidate, whatever the queue; the pruning bound stays a lower bound
of each candidate's whole objective, tail included. ``horizon = 0`` projects the whole
queue (the decisions before the horizon, bit for bit; so does any horizon the queue does
not reach). Where the queue is longer it is a change of decisions, measured in
docs/results/trace-speed.md (mean E2E within 1.3% of the whole queue's on the 16 runs of
``benchmarks/predictive_quality.py``, P99 TPOT up to 84% higher on A100 / Mooncake; 64
prompts: 1.1-1.6x cheaper, more often worse in P99 TPOT).

Replanning (``replan``, 1 by default: every step). With ``replan = K`` a projection's plan
is followed by up to ``K - 1`` of the decisions after it that need one, as long as the
first pending prompt (``head_prompt``) is still the one it was made for: while that prompt
is chunked the projection foresaw the steps, and a completed or new head is a new state,
so it projects again. A followed plan steps as the projection stepped it: a constant
budget ``a`` while any decode runs and ``c_max`` when none does, or an admission limit
``m``, its budget recomputed from the queue at each step (``limit_budget``). Decisions
that need no projection (nothing pending, nothing to stall, the KV cap at 0) are taken as
before and do not count. Every step still passes through the KV cap. Invariant: a
followed budget is one the plan's own projection would have taken in that state (so it is
<= ``c_max``). It trades decisions for cost (the projection is 1-3 ms a step under
overload; measured in docs/results/trace-speed.md, "Replanning"), as vLLM 0.33's
``--prefill-schedule-interval`` schedules prefill only every N-th step.

Holding a repeated pick (``hold``, 32 by default; 1: project at every decision, the rule
before 2026-12-03). The projections' picks are sticky:
along the per-step policy's own run 98-99% of the projections on overloaded Mooncake and
87% on Azure x3 pick what the one before picked (docs/results/trace-speed.md, "Holding a
repeated pick"). With ``hold = K`` a projection's plan covers a window of decisions that
need one: 1 (itself) after a changed pick, twice the last window (at most ``K``) after a
pick that repeats the last projection's. The plan is followed, as ``replan``'s is, for
the rest of the window whatever the head prompt does, but for what the projection did
not foresee, which projects again at once: a prompt arriving inside the horizon (the
pending prompts grew and are at most ``horizon``), a burst into the tail (more than
1/``HOLD_GROWTH`` more pending prompts than the projection saw), and a held budget that
would stall decodes more than the projection's (decodes running and the plan made with
none, or a limit's budget now above the projection's). A stable overloaded state is then
projected about once in ``K`` decisions, a changing one every decision. Invariant: at
most ``K - 1`` followed decisions between two projections; every budget passes the KV cap
and is <= ``c_max``. Not combined with ``replan`` (one rule for the window at a time:
``replan`` needs ``hold=1``). The default ``K = 32`` is the smallest power of two that
brought every row of ``benchmarks/trace_speed.py`` under issue 19's bar with room (Azure
x3 8.6, Mooncake x3 7.5 CPU s per trace-hour, against 17-24 and 65-70 per step), at mean
E2E within 1% of the per-step rule on all 16 runs of ``benchmarks/predictive_quality.py``
and P99 TPOT within 7.1% (docs/results/trace-speed.md, "predictive:hold=K").

KV admission control: when the bound cost model knows the KV capacity
(``CostModel.kv_capacity_tokens``), the budget is also capped so that only waiting
requests the KV cache can hold to their last output beside the running ones are admitted
(``kv_admission_cap``: the future peak of KV use, ``ppas.policies.kv_room``); otherwise
overload makes vLLM preempt and recompute long prompts. With a cost model that has no
capacity (``fitted``) the guard is off, and so it is once the engine has seen a request
stop before its ``max_tokens`` (``caps_are_lengths``: the outputs a footprint reads are
caps then, not lengths; ``ordered``'s rule 4). From then on the projection charges each
request its expected outputs left, estimated from where the finished requests stopped and
how far the running ones have run (``OutputsLeft``), not what its cap allows. A waiting
request's prefix-cache hit (``RequestView.num_cached_tokens``) is taken off its projected
prefill and off the admission allowance; footprints stay whole (conservative).

Without a cost model (``bind_cost_model(None)``, e.g. the vLLM plugin with no model
configured) the policy falls back to P-PAS with the paper's parameters (N_th = 2,
B_cap = 2048, B_max = ``c_max``), which needs none.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

from ppas.core.config import require
from ppas.core.decision import Decision
from ppas.core.view import (
    SchedulerView,
    caps_are_lengths,
    is_pending_prefill,
    uncached_prompt_tokens,
)
from ppas.cost.base import CostModel
from ppas.cost.steps import StepCosts
from ppas.policies.base import Policy
from ppas.policies.candidates import candidate_chunks
from ppas.policies.kv_room import KvRoom
from ppas.policies.projection import (
    NO_TAIL,
    STREAM_MIN_PROMPTS,
    Floor,
    Prompt,
    Stream,
    StreamRun,
    Tail,
    arrival_rate,
    horizon_work,
    pending_work,
    project,
    queue_rows,
    stream_runs,
)
from ppas.policies.registry import register

#: The loop's pruning bound also counts the next arrivals' wait (``project``'s
#: ``wait_bound``): it cuts only candidates whose sum exceeds the best so far, so the
#: decisions are the same either way (tests compare both); it saves projected events.
WAIT_BOUND = True
#: ... and so does the queue's prefill still to come (``project``'s ``floor``).
PREFILL_BOUND = True
#: Holding (``hold``): a held plan is projected again once the pending prompts have grown
#: by more than 1 / HOLD_GROWTH of those its projection saw (a burst into the tail).
HOLD_GROWTH = 8


@dataclass(frozen=True)
class PredictiveConfig:
    """``predictive:c_min=512,c_max=32768,max_active=8``.

    * ``c_min``, ``c_max``: the candidate budgets under decode pressure are 0 and the
      powers of two in [c_min, c_max]; ``c_max`` is also the budget without decodes and
      the global MBT (P-PAS's B_max). 32768 lets a whole prompt of up to 32k tokens (the
      Qwen2.5 / Qwen3 native context) run in one step when nothing else runs; the
      projection picks smaller chunks where they project better. Its price is the
      activation reserve of a bigger MBT.
    * ``max_active``: candidate admission limits 1..max_active requests at once (0: none).
    * ``prune_limits``: of the limits that the running decodes already fill, project only
      the largest (``false``: all of them, as before; about half the projections under
      load, and within 1% in mean E2E on the traces and the paper grid measured in
      docs/results/trace-speed.md).
    * ``horizon``: the pending prompts projected exactly, in engine order; those past it
      enter as the closed-form tail (module doc), so a decision's cost does not grow with
      the queue. 0: the whole queue (the decisions before the horizon existed).
    * ``replan``: a projection's plan is followed by up to ``replan - 1`` of the decisions
      after it, while the first pending prompt stays the same (module doc:
      "Replanning"). 1: every step projects (the per-step rule of P-PAS §3).
    * ``hold``: a projection's plan covers a window of decisions (itself and those that
      follow it): twice the last window, at most ``hold``, when its pick repeats the last
      projection's, else 1, so a changed pick projects again at the next decision
      (module doc: "Holding a repeated pick"). 1: every decision projects. ``replan``
      needs ``hold=1``.
    """

    c_min: int = 512
    c_max: int = 32768
    max_active: int = 8
    prune_limits: bool = True
    horizon: int = 128
    replan: int = 1
    hold: int = 32

    def __post_init__(self) -> None:
        require(self.replan >= 1, f"replan must be >= 1 (1: project every step), "
                f"got {self.replan}")
        require(self.hold >= 1, f"hold must be >= 1 (1: project every step), got {self.hold}")
        require(self.hold == 1 or self.replan == 1,
                f"hold and replan are two rules for the same thing: replan needs hold=1 "
                f"(hold is {self.hold} by default), got hold={self.hold}, replan={self.replan}")
        require(self.max_active >= 0, f"max_active must be >= 0 (0: no limit candidates), "
                f"got {self.max_active}")
        require(self.c_min >= 1, f"c_min must be >= 1, got {self.c_min}")
        require(self.horizon >= 0, f"horizon must be >= 0 (0: the whole queue), "
                f"got {self.horizon}")
        require(self.c_max >= self.c_min,
                f"c_max must be >= c_min={self.c_min}, got {self.c_max}")


@register("predictive")
class Predictive(Policy):
    Config = PredictiveConfig

    def __init__(self, config: PredictiveConfig, spec: str | None = None) -> None:
        super().__init__(config, spec)
        self.chunks = candidate_chunks(config.c_min, config.c_max)
        self.candidates = (0, *self.chunks)
        self.limits = tuple(range(1, config.max_active + 1))
        self.costs: StepCosts | None = None
        self.kv_capacity: int | None = None
        # Replanning (``replan`` > 1): the last projection's plan, an admission limit
        # (``limit``, > 0) or a constant budget (``budget``, ``limit`` 0), and the
        # decisions that may still follow it before the next projection.
        self._plan_budget, self._plan_limit, self._plan_left = 0, 0, 0
        self._plan_head: str | None = None  # the first pending prompt it was made for
        # Holding (``hold`` > 1): the decisions the last projection's plan covers (it and
        # the ones that follow it), doubled each time a projection repeats the pick; the
        # pending prompts at the last decision and at the projection; the projection's
        # budget and whether decodes ran then (a held budget never stalls more).
        self._window = 1
        self._pending, self._plan_pending = 0, 0
        self._plan_stall = False
        # The last projection's pick, (budget, limit), projected first the next time: it
        # is the likeliest to win again, and the best sum so far cuts the others early.
        self._last_pick: tuple[int, int] | None = None

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.config.c_max)

    def bind_cost_model(self, cost_model: CostModel | None) -> None:
        self.costs = None if cost_model is None else StepCosts(cost_model, self.chunks)
        self.kv_capacity = None if cost_model is None else cost_model.kv_capacity_tokens
        self._plan_left = 0  # a new engine: the first decision projects
        self._last_pick = None
        self._window = 1
        self._pending = 0

    def decide(self, view: SchedulerView) -> Decision:
        capacity = self.kv_capacity
        if capacity is None or view.num_pending_prefills == 0 or not caps_are_lengths(view):
            return self._decide(view)
        # kv_admission_cap(view, capacity, b) is min(b, the cap at c_max) for every
        # b <= c_max (the allowance grows request by request whatever b is), and every
        # budget _decide returns is <= c_max. So when the cap at c_max is 0 (nothing
        # running prefills and the head of the queue does not fit) the decision is 0
        # whatever _decide would choose, and nothing is projected.
        allowance = kv_admission_cap(view, capacity, self.config.c_max)
        if allowance == 0:
            return Decision(0)
        return Decision(min(self._decide(view).prefill_budget, allowance))

    def _decide(self, view: SchedulerView) -> Decision:
        costs = self.costs
        c_max = self.config.c_max
        if costs is None:  # model-free fallback: P-PAS, paper parameters
            if view.num_pending_prefills >= 2 and view.num_running_decodes > 0:
                return Decision(min(2048, c_max))
            return Decision(c_max)
        limits = self.limits
        hold = self.config.hold
        if hold > 1 and self._arrived(view.num_pending_prefills):
            self._plan_left = 0  # the state changed: project again
        if view.num_pending_prefills == 0 or (view.num_running_decodes == 0 and not limits):
            # No decode to stall: the biggest chunk is the most efficient (P-PAS's B_max).
            return Decision(c_max)
        head = head_prompt(view) if self.config.replan > 1 else None
        if self._plan_left > 0 and head == self._plan_head:  # replanning or holding: follow
            b = self._follow(view)
            # Holding: a held budget does not stall decodes more than its projection's did
            # (a plan made with no decode running, or a limit that now admits more).
            if (hold == 1 or not view.num_running_decodes
                    or (self._plan_stall and b <= self._plan_budget)):
                self._plan_left -= 1
                return Decision(b)
        last = self._last_pick
        best_a, best_limit = self._project(view)
        self._plan_budget, self._plan_limit = best_a, best_limit
        self._plan_left, self._plan_head = self.config.replan - 1, head
        if hold > 1:  # holding: a repeated pick covers twice the decisions, a new one 1
            self._window = (min(2 * self._window, hold)
                            if last is not None and self._last_pick == last else 1)
            self._plan_left = self._window - 1
            self._plan_stall = view.num_running_decodes > 0
            self._plan_pending = view.num_pending_prefills
        return Decision(best_a)

    def _arrived(self, n_pending: int) -> bool:
        """Holding: whether prompts the last projection did not foresee have arrived where
        they would change its pick: one inside the projected horizon (the pending prompts
        grew since the last decision and are within ``horizon``; any with ``horizon = 0``)
        or more than 1 / ``HOLD_GROWTH`` of the prompts it saw (a burst into the tail).
        Completions it foresaw; a completion and an arrival in one step go unseen."""
        grew = n_pending > self._pending
        self._pending = n_pending
        horizon = self.config.horizon
        return ((grew and (horizon == 0 or n_pending <= horizon))
                or n_pending > self._plan_pending + self._plan_pending // HOLD_GROWTH)

    def _follow(self, view: SchedulerView) -> int:
        """The plan's budget now, as the projection that chose it steps: a constant budget
        while any decode runs, ``c_max`` when none does; an admission limit's budget from
        the queue now (``limit_budget`` on the first prompts, read off the view's head)."""
        c_max = self.config.c_max
        m = self._plan_limit
        if not m:
            return self._plan_budget if view.num_running_decodes else c_max
        queue, decs, _, _ = horizon_work(view, m)
        return limit_budget(m, c_max, queue, len(decs))

    def _project(self, view: SchedulerView) -> tuple[int, int]:
        """The candidates' projections: the best budget, and the admission limit it
        applies (0: a constant budget)."""
        costs = self.costs
        assert costs is not None
        c_max = self.config.c_max
        limits = self.limits
        if self.config.horizon:
            queue, decs, n_tail, rate = horizon_work(view, self.config.horizon)
            tail = Tail.behind(queue, len(decs), n_tail)
        else:  # the whole queue
            queue, decs = pending_work(view)
            rate, tail = arrival_rate(view), NO_TAIL
        # Try last step's budget first: decisions are sticky, so the bound prunes early.
        # (Without decodes every constant budget projects as c_max: one candidate.)
        cands = self.candidates if decs else (c_max,)
        last = view.recent_steps[-1].prefill_budget if view.recent_steps else -1
        if last in cands:
            cands = (last, *(a for a in cands if a != last))
        decs.sort()  # once for every candidate (project walks them in end order)
        ctx = sum([c for _, c in decs])
        # Every candidate's budgets are <= c_max: one floor for all of them (on a short
        # queue the walks are short, and the floor's arrays would cost more than they cut).
        rows = queue_rows(queue) if len(queue) >= STREAM_MIN_PROMPTS else None
        floor = Floor(costs, queue, c_max, rows) if PREFILL_BOUND and rows is not None else None
        # Under a long queue the constant budgets are projected together as arrays
        # (``stream_runs``: the loop's floats), then finished in order against the bound.
        runs: dict[int, StreamRun] = {}
        if decs and rows is not None:
            runs = stream_runs(costs, tuple(a for a in cands if a > 0), c_max, queue, decs,
                               rate, ctx, Stream(queue, decs, rows), tail, WAIT_BOUND, floor)
        # Of the limits the running decodes fill (each admits nothing now: limit_budget
        # 0), only the largest, ``full``: it waits for the fewest decodes to end before
        # it admits a prompt. Once decodes end the engine asks again, and the limits
        # above them are projected then (``PredictiveConfig.prune_limits``). A limit of
        # every request never binds: the same projection as the constant budget c_max.
        full = min(len(decs), limits[-1]) if limits and self.config.prune_limits else 0
        n_req = len(decs) + len(queue)
        # The candidates (budget, limit), in the order that breaks ties: the first of
        # equal sums wins. They are projected from the last pick on, then the others in
        # that order: a candidate is cut (inf) only when its sum exceeds the best so far
        # (``project``'s bounds), so it is not the smallest, and one whose sum equals the
        # best so far is not cut; the smallest sum's first candidate wins whatever the
        # order, so the choice is the in-order loop's.
        picks = [*((a, 0) for a in cands), *((c_max, m) for m in limits if full <= m < n_req)]
        first = picks.index(self._last_pick) if self._last_pick in picks else 0
        best_i, best_j = -1, float("inf")
        for i in (first, *range(first), *range(first + 1, len(picks))):
            a, m = picks[i]
            if m:
                j = project(costs, c_max, c_max, queue, decs, best_j, rate, m, ctx, tail,
                            WAIT_BOUND, floor)
            else:
                run = runs.get(a)
                j = (run.finish(best_j) if run is not None else
                     project(costs, a, c_max, queue, decs, best_j, rate, ctx_total=ctx,
                             tail=tail, wait_bound=WAIT_BOUND, floor=floor))
            if j < best_j or (j == best_j and i < best_i):
                best_i, best_j = i, j
        if best_i < 0:
            return c_max, 0
        self._last_pick = a, m = picks[best_i]
        return (limit_budget(m, c_max, queue, len(decs)), m) if m else (a, 0)


def head_prompt(view: SchedulerView) -> str | None:
    """The request id of the first pending prompt in engine order (a running prefill, else
    the first waiting request), None when none is pending. O(running)."""
    for r in view.requests:
        if is_pending_prefill(r):
            return r.request_id
    return None


def limit_budget(limit: int, c_max: int, queue: list[Prompt], num_decodes: int) -> int:
    """The budget that runs at most ``limit`` requests at once (vLLM's
    ``max_num_active_seqs``, expressed through the cap): the prompt tokens left of the
    first ``limit - num_decodes`` pending prompts in engine order (running ones first, then
    FCFS), at most ``c_max``; 0 when the decodes fill every slot. The engine shares the cap
    in that order, so no later prompt gets a token and the waiting loop stops there."""
    slots = limit - num_decodes
    if slots <= 0:
        return 0
    return min(c_max, sum(end - pos for pos, end, _ in queue[:slots]))


def kv_admission_cap(view: SchedulerView, capacity: int, budget: int, slack: int = 16) -> int:
    """KV admission control: cap the budget at the prompt tokens of running prefills plus
    those of the waiting requests (FCFS) the KV cache can hold to their last output
    beside the running ones (``ppas.policies.kv_room``: the future peak of KV use, each
    decode freeing its KV when it finishes, the blocks running requests share counted
    once; ``slack`` tokens of block rounding each).
    vLLM admits a request when its first chunk fits and later preempts the last running
    one (recompute) when the cache runs out; admitting only what can finish avoids that
    thrash under overload.

    The view lists running requests first, then waiting ones, so this reads the running
    ones and the waiting ones up to the first that does not fit or that fills the budget:
    O(running + admitted), not O(queue)."""
    used = 0  # the running requests' prompts and outputs, their slack added after
    allowance = 0
    n_run = 0
    for r in view.requests:
        if not r.is_running:
            break
        n_run += 1
        prompt = r.prompt_tokens
        used += prompt + r.max_output_tokens
        computed = r.num_computed_tokens
        if computed < prompt:  # is_pending_prefill(r) of a running request, inlined
            allowance += prompt - computed
    if n_run == 0:
        return budget  # an idle engine always admits its head (liveness)
    room = capacity - used - n_run * slack  # (integers: the same as request by request)
    if allowance >= budget:
        return budget
    kv = KvRoom(capacity, room, islice(view.requests, n_run), slack,
                shared=view.kv_shared_tokens)  # (prefix caching: kv_room, "Shared blocks")
    for r in islice(view.requests, n_run, None):
        prompt = r.prompt_tokens
        if not kv.admit(prompt + r.num_output_tokens + slack,
                        prompt + r.max_output_tokens + slack, r):
            break
        allowance += uncached_prompt_tokens(r)
        if allowance >= budget:
            return budget
    return allowance
