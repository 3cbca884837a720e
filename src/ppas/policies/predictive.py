"""Predictive: the prefill budget that minimises the predicted sum of request latencies.

Ours (not from a paper; P-PAS's future work asks for budgets that adapt to the model and
the load). The objective is P-PAS's: mean end-to-end latency. Rule, every step:

* for each candidate ``a`` in {0} + powers of two in [c_min, c_max], project the
  requests now in the system forward under "budget ``a`` while any decode runs, ``c_max``
  when none does", and for each admission limit ``m`` in 1..``max_active`` under "at most
  ``m`` requests at once, budget ``c_max``" (vLLM's ``max_num_active_seqs`` as a policy:
  a prompt starts only when a slot is free, a finished prompt keeps its slot while it
  decodes); take the candidate with the smallest predicted sum of completion times.
  ``a = 0`` is a decode-only step. A limit is applied through the cap alone
  (``limit_budget``: the prompt tokens left of the prompts that fit in the free slots,
  in engine order), so the plugin needs nothing more than a budget;
* no decode running: every constant budget projects as ``c_max`` (nothing to stall; the
  biggest chunk is the most efficient prefill, P-PAS's B_max), so only ``c_max`` and the
  limits compete: a limit stops a prompt's last chunk from spilling into the next prompt
  (which delays the first one's first token). With ``max_active=0`` it takes ``c_max``
  without projecting, as before the limits existed.

The projection is event-driven (one iteration per prompt completion or decode
completion, a heap of decode finish steps: O(N log N) per candidate, no per-step loop):

* prompts complete in engine order (running, then waiting FCFS), the budget shared in
  order (a step's leftover spills into the next prompt, as in vLLM's ``schedule()``);
  a completed prompt emits its first token and becomes a decode for ``o - 1`` steps;
* a decode with ``r`` outputs left finishes ``r`` steps later: decodes count *steps*,
  prompts count *tokens*;
* a step lasts ``S(prefill tokens, their query-key pairs) + sum_decodes (d_ride + d_kv *
  context)`` when it carries prefill, ``base + sum_decodes (d_alone + d_kv * context)``
  when it does not (``ppas.cost.steps.StepCosts``: tables precomputed from the bound
  cost model). ``S`` is the cost model's own step time at that token count, so a prompt's
  short last chunk pays the whole fixed per-step cost, and a step that finishes one prompt
  and spills into the next pays it once (before: the prompt's range priced by linear
  interpolation in a per-chunk table, which undercounted small pieces);
* requests that will arrive while the current work runs wait for it to finish; with
  Poisson arrivals at rate lambda that adds ``lambda * T_end^2 / 2`` (T_end = projected
  time at which the current work is done). lambda is read off the view
  (``arrival_rate``: (N - 2) / span since the oldest arrival still in the system, unbiased
  where (N - 1) / span, used before, was biased high, most at N = 2 or 3). Without this
  term the projection is myopic:
  decode-only steps look free for present requests but cost throughput, which the next
  arrivals pay for (long outputs, 256-512 tokens, showed it: +10% vs the best fixed
  budget at burst 0.8 before, below it after).

This weighs both sides of the P-PAS finding on every request: a bigger ``a`` finishes the
queue's prompts with fewer, more efficient steps (waiting requests gain) but stretches
each of the decodes' remaining steps (decoding requests lose); ``a = 0`` finishes the
decodes in short weight-bound steps and pays for it with a pause of the prefill queue.
In practice, with short answers (32 tokens) it alternates decode-only steps and B_max
chunks: the decode phase of a request costs ~31 weight-bound steps (a few ms each), far
less than riding 31 prefill steps; with long answers (256+) it rides mid-size chunks.
Limits add a middle way no constant budget expresses: under load, prefill the next prompt
whole while the current decodes ride, then run the decodes of both together in
decode-only steps (a decode-only step of two requests costs about as much as one of one),
which is what stock vLLM with ``--max-num-active-seqs 2`` does at every step.
The simulator's gains therefore rest on the cost of decode-only steps relative to mixed
ones; the policy's own model may be off (halving or doubling any calibrated parameter
moved the paper-grid improvement by < 1 point), but the simulator's must be right.

KV admission control: when the bound cost model knows the KV capacity
(``CostModel.kv_capacity_tokens``), the budget is also capped so that only waiting
requests whose whole footprint fits beside the running ones' are admitted
(``kv_admission_cap``); otherwise overload makes vLLM preempt and recompute 25k-token
prompts (A100 / Qwen3-8B, 25k/256: 6-71 preemptions per run for the fixed budgets).
The view carries no KV usage, so with a cost model that has no capacity (``fitted``)
the guard is off.

Prefix caching: a waiting request's prefix-cache hit (``RequestView.num_cached_tokens``,
the blocks the engine would reuse if it admitted it now) is taken off its projected
prefill and off the admission allowance. Footprints stay whole (a shared block is counted
once per request: conservative).

Without a cost model (``bind_cost_model(None)``, e.g. the vLLM plugin with no model
configured) the policy falls back to P-PAS with the paper's parameters (N_th = 2,
B_cap = 2048, B_max = ``c_max``), which needs none.
"""

from __future__ import annotations

from dataclasses import dataclass
from heapq import heapify, heappop, heappush

from ppas.core.config import require
from ppas.core.decision import Decision
from ppas.core.view import SchedulerView, is_pending_prefill, uncached_prompt_tokens
from ppas.cost.base import CostModel
from ppas.cost.steps import StepCosts
from ppas.policies.base import Policy
from ppas.policies.registry import register


@dataclass(frozen=True)
class PredictiveConfig:
    """Candidate budgets under decode pressure: 0 and powers of two in [c_min, c_max];
    ``c_max`` is also the budget without decodes and the global MBT (P-PAS's B_max).
    Candidate admission limits: 1..``max_active`` requests at once (0: none).

    ``c_max`` defaults to 32768 (16384 before): a whole prompt of up to 32k tokens (the
    Qwen2.5 / Qwen3 native context) fits in one step when nothing else runs, the cheapest
    way to prefill it; ``c_max`` only bounds the candidates, the projection picks smaller
    chunks where they project better (it can since it prices partial chunks with the cost
    model's step time). Its price is the activation reserve of a bigger MBT."""

    c_min: int = 512
    c_max: int = 32768
    max_active: int = 8

    def __post_init__(self) -> None:
        require(self.max_active >= 0, f"max_active must be >= 0 (0: no limit candidates), "
                f"got {self.max_active}")
        require(self.c_min >= 1, f"c_min must be >= 1, got {self.c_min}")
        require(self.c_max >= self.c_min,
                f"c_max must be >= c_min={self.c_min}, got {self.c_max}")


def candidate_chunks(c_min: int, c_max: int) -> tuple[int, ...]:
    out, c = [], c_min
    while c < c_max:
        out.append(c)
        c *= 2
    out.append(c_max)
    return tuple(out)


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

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.config.c_max)

    def bind_cost_model(self, cost_model: CostModel | None) -> None:
        self.costs = None if cost_model is None else StepCosts(cost_model, self.chunks)
        self.kv_capacity = None if cost_model is None else cost_model.kv_capacity_tokens

    def decide(self, view: SchedulerView) -> Decision:
        d = self._decide(view)
        if self.kv_capacity is None or d.prefill_budget == 0 or view.num_pending_prefills == 0:
            return d
        return Decision(kv_admission_cap(view, self.kv_capacity, d.prefill_budget))

    def _decide(self, view: SchedulerView) -> Decision:
        costs = self.costs
        c_max = self.config.c_max
        if costs is None:  # model-free fallback: P-PAS, paper parameters
            if view.num_pending_prefills >= 2 and view.num_running_decodes > 0:
                return Decision(min(2048, c_max))
            return Decision(c_max)
        limits = self.limits
        if view.num_pending_prefills == 0 or (view.num_running_decodes == 0 and not limits):
            # No decode to stall: the biggest chunk is the most efficient (P-PAS's B_max).
            return Decision(c_max)
        queue: list[tuple[int, int, int]] = []  # (computed, prompt, outputs left)
        decs: list[tuple[int, int]] = []  # (outputs left, context)
        for r in view.requests:
            left = r.max_output_tokens - r.num_output_tokens
            if is_pending_prefill(r):
                # A prefix-cache hit shortens the projected prefill (the engine's
                # lookup for a waiting request; 0 where it does not look up).
                queue.append((min(r.num_computed_tokens + r.num_cached_tokens,
                                  r.prompt_tokens - 1), r.prompt_tokens, max(1, left)))
            elif left > 0:
                decs.append((left, r.num_computed_tokens))
        # Try last step's budget first: decisions are sticky, so the bound prunes early.
        # (Without decodes every constant budget projects as c_max: one candidate.)
        cands = self.candidates if decs else (c_max,)
        last = view.recent_steps[-1].prefill_budget if view.recent_steps else -1
        if last in cands:
            cands = (last, *(a for a in cands if a != last))
        rate = arrival_rate(view)
        best_a, best_j = c_max, float("inf")
        for a in cands:
            j = project(costs, a, c_max, queue, decs, best_j, rate)
            if j < best_j:
                best_a, best_j = a, j
        for m in limits:
            if m >= len(decs) + len(queue):
                break  # never binds: the same projection as the constant budget c_max
            j = project(costs, c_max, c_max, queue, decs, best_j, rate, m)
            if j < best_j:
                best_a, best_j = limit_budget(m, c_max, queue, len(decs)), j
        return Decision(best_a)


def arrival_rate(view: SchedulerView) -> float:
    """Poisson arrival rate read off the view: the ``N - 1`` requests that arrived after
    the oldest one still in the system, over the span since it arrived (requests leave
    roughly in arrival order), as ``(N - 2) / span``.

    The projection matters only when a prompt waits, i.e. shortly after an arrival, so the
    span is (nearly) the waiting time to the ``N - 1``-th arrival after the oldest, a
    Gamma(N - 1, lambda) variable, and ``E[1 / Gamma(k, lambda)] = lambda / (k - 1)``:
    ``(N - 1) / span`` has mean ``lambda (N - 1) / (N - 2)`` (infinite for N = 2, the
    common state at low load: one decoding, one waiting), ``(N - 2) / span`` has mean
    lambda. (Measured over every decision in the paper grid: 0.99 x the trace's rate
    on average, against 1.76 x before.) Fewer than three requests: 0."""
    n = len(view.requests)
    if n < 3:
        return 0.0
    oldest = min(r.arrival_time for r in view.requests)
    span = view.now - oldest
    return (n - 2) / span if span > 0 else 0.0


def limit_budget(limit: int, c_max: int, queue: list[tuple[int, int, int]],
                 num_decodes: int) -> int:
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
    those of the waiting requests (FCFS) whose whole footprint (prompt + outputs, ``slack``
    tokens of block rounding each) still fits beside every running request's whole
    footprint. vLLM admits a request when its first chunk fits and later preempts the
    last running one (recompute) when the cache runs out; admitting only what can finish
    avoids that thrash under overload."""
    room = capacity
    allowance = 0
    if not any(r.is_running for r in view.requests):
        return budget  # an idle engine always admits its head (liveness)
    for r in view.requests:
        if r.is_running:
            room -= r.prompt_tokens + r.max_output_tokens + slack
            if is_pending_prefill(r):
                allowance += r.prompt_tokens - r.num_computed_tokens
    if allowance >= budget:
        return budget
    for r in view.requests:
        if r.is_running:
            continue
        need = r.prompt_tokens + r.max_output_tokens + slack
        if need > room:
            break
        room -= need
        allowance += uncached_prompt_tokens(r)
        if allowance >= budget:
            return budget
    return allowance


def project(costs: StepCosts, a: int, b: int, queue: list[tuple[int, int, int]],
            decs: list[tuple[int, int]], stop_above: float = float("inf"),
            arrival_rate: float = 0.0, limit: int = 1 << 30) -> float:
    """Sum of predicted completion times (seconds from now) of every request when the
    prefill budget is ``a`` while any decode runs and ``b`` otherwise, and at most
    ``limit`` requests run at once (decodes plus prompts; a prompt gets tokens only in a
    free slot, the head first, and a step's leftover budget spills only into prompts
    that have a slot). Event-driven: one
    iteration per prompt completion or decode completion, O(N log N) in all. Returns
    ``inf`` as soon as a lower bound of the sum (finished requests' times plus ``t`` for
    every request still in the system) exceeds ``stop_above``."""
    ride, alone, kv, base = costs.dec_ride, costs.dec_alone, costs.dec_kv, costs.dec_base
    heap: list[tuple[int, int]] = [(left, ctx) for left, ctx in decs]  # (finish step, ctx)
    heapify(heap)
    n_dec, ctx_sum = len(heap), sum(ctx for _, ctx in decs)
    qi, pos = 0, queue[0][0] if queue else 0
    step, t, total = 0, 0.0, 0.0
    nq = len(queue)
    while qi < nq or heap:
        c = a if heap else b
        slots = limit - n_dec  # prompts that may run beside the decodes (the head first)
        if qi < nq and c > 0 and slots > 0:
            end = queue[qi][1]
            k1 = -(-(end - pos) // c)
        else:
            k1 = 1 << 60
        k = heap[0][0] - step if heap else k1
        k = k1 if k1 < k else k
        if k1 < (1 << 60) and k == k1:
            # The head's prompt completes in this segment: k - 1 whole chunks, then a last
            # step with its remaining tokens, whose leftover budget spills into the next
            # prompts (vLLM shares the budget in order). That step is priced as one step
            # of all its tokens (the fixed per-step cost paid once, StepCosts.step_time).
            last = pos + (k - 1) * c
            r = end - last
            pre = costs.run_time(c, pos, k - 1)
            n_tok, pairs = r, r * (last + (r + 1) / 2)
            spill = c - r
            done_heads = [qi]
            qi += 1
            pos = queue[qi][0] if qi < nq else 0
            while spill > 0 and qi < nq and len(done_heads) < slots:
                nxt_end = queue[qi][1]
                take = min(spill, nxt_end - pos)
                n_tok += take
                pairs += take * (pos + (take + 1) / 2)
                spill -= take
                pos += take
                if pos >= nxt_end:
                    done_heads.append(qi)
                    qi += 1
                    pos = queue[qi][0] if qi < nq else 0
            pre += costs.step_time(n_tok, pairs)
            dur = pre + k * (n_dec * ride + kv * ctx_sum)
        elif k1 < (1 << 60):
            dur = costs.run_time(c, pos, k) + k * (n_dec * ride + kv * ctx_sum)
            pos += k * c
            done_heads = []
        else:
            dur = k * (base + n_dec * alone + kv * ctx_sum)
            done_heads = []
        step += k
        t += dur
        while heap and heap[0][0] <= step:
            _, ctx = heappop(heap)
            n_dec -= 1
            ctx_sum -= ctx
            total += t
        for h in done_heads:
            _, end, o = queue[h]
            if o <= 1:
                total += t
            else:
                heappush(heap, (step + o - 1, end))
                n_dec += 1
                ctx_sum += end
        # Every request still in the system finishes at >= t: a lower bound on the sum.
        if total + (n_dec + nq - qi) * t > stop_above:
            return float("inf")
    # Requests arriving (Poisson, rate lambda) while the current work runs wait for it to
    # end: integral_0^T lambda (T - s) ds = lambda T^2 / 2.
    return total + 0.5 * arrival_rate * t * t
