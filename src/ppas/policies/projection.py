"""The predictive policy's model of the engine: every request's projected completion time.

``project`` runs the requests now in the system forward under one candidate (a prefill
budget, an admission limit) and returns the predicted sum of their completion times. It
models vLLM V1's step loop (``Scheduler.schedule()``) at the level the choice needs:

* the budget is shared in engine order (running prompts, then waiting ones FCFS); a
  step's leftover spills into the next prompt, at most ``limit`` requests run at once
  (decodes plus prompts; a prompt gets tokens only in a free slot);
* prompts count *tokens*, decodes count *steps*: a completed prompt emits its first token
  and decodes for ``o - 1`` more steps; a decode with ``r`` outputs left ends ``r`` steps
  later;
* a step costs the linearised step time of ``ppas.cost.steps.StepCosts``, tabulated once
  from the bound cost model: ``S(prefill tokens, their causal pairs) + sum_decodes
  (dec_ride + dec_kv * context)`` when it carries prefill, ``dec_base + sum_decodes
  (dec_alone + dec_kv * context)`` when it does not;
* requests that arrive while the current work runs wait for it (Poisson arrivals,
  ``arrival_rate`` read off the view).

It is event-driven, not a step loop: one iteration per prompt completion or decode
completion (a heap of decode end steps), so O(N log N) per candidate. It is a deliberate
approximation of the engine's exact rules (``ppas.engine.step_rules``, which the simulator
and the vLLM adapter share): ``decide`` runs it for every candidate at every step and must
cost microseconds, and a policy sits below the engine.
"""

from __future__ import annotations

from heapq import heappop, heappush

from ppas.core.view import SchedulerView, is_pending_prefill
from ppas.cost.steps import StepCosts

#: A pending prompt: (tokens computed, prompt tokens, outputs left), in engine order.
Prompt = tuple[int, int, int]
#: A running decode: (outputs left, context tokens).
Decode = tuple[int, int]

INF = float("inf")
NEVER = 1 << 60  # steps until an event that cannot happen
NO_LIMIT = 1 << 30


def pending_work(view: SchedulerView) -> tuple[list[Prompt], list[Decode]]:
    """The view's pending prompts (engine order) and running decodes, as ``project``
    reads them. A waiting request's prefix-cache hit (``num_cached_tokens``: the blocks
    the engine would reuse if it admitted it now) shortens its projected prefill."""
    prompts: list[Prompt] = []
    decodes: list[Decode] = []
    for r in view.requests:
        left = r.max_output_tokens - r.num_output_tokens
        if is_pending_prefill(r):
            prompts.append((min(r.num_computed_tokens + r.num_cached_tokens,
                                r.prompt_tokens - 1), r.prompt_tokens, max(1, left)))
        elif left > 0:
            decodes.append((left, r.num_computed_tokens))
    return prompts, decodes


def arrival_rate(view: SchedulerView) -> float:
    """Poisson arrival rate read off the view: the ``N - 1`` requests that arrived after
    the oldest one still in the system, over the span since it arrived (requests leave
    roughly in arrival order), as ``(N - 2) / span``.

    The projection matters only when a prompt waits, i.e. shortly after an arrival, so the
    span is (nearly) the waiting time to the ``N - 1``-th arrival after the oldest, a
    Gamma(N - 1, lambda) variable, and ``E[1 / Gamma(k, lambda)] = lambda / (k - 1)``:
    ``(N - 1) / span`` has mean ``lambda (N - 1) / (N - 2)`` (infinite for N = 2, the
    common state at low load: one decoding, one waiting), ``(N - 2) / span`` has mean
    lambda (measured over every decision of the paper grid: 0.99 x the trace's rate).
    Fewer than three requests: 0."""
    n = len(view.requests)
    if n < 3:
        return 0.0
    oldest = min(r.arrival_time for r in view.requests)
    span = view.now - oldest
    return (n - 2) / span if span > 0 else 0.0


def arrivals_wait(arrival_rate: float, busy_s: float) -> float:
    """Total wait of the requests arriving (Poisson, rate lambda) while the current work
    runs for ``T`` seconds: integral_0^T lambda (T - s) ds = lambda T^2 / 2. Without it
    the projection is myopic: decode-only steps look free for the present requests but
    cost throughput, which the next arrivals pay for."""
    return 0.5 * arrival_rate * busy_s * busy_s


def project(costs: StepCosts, a: int, b: int, queue: list[Prompt], decs: list[Decode],
            stop_above: float = float("inf"), arrival_rate: float = 0.0,
            limit: int = NO_LIMIT, ctx_total: int | None = None) -> float:
    """Sum of predicted completion times (seconds from now) of every request when the
    prefill budget is ``a`` while any decode runs and ``b`` otherwise, and at most
    ``limit`` requests run at once. Returns ``inf`` as soon as a lower bound of the sum
    (finished requests' times plus ``t`` for every request still in the system) exceeds
    ``stop_above``.

    Each iteration projects the steps up to the next event: the head prompt completes, or
    a decode ends (both when they coincide). A step with prefill lasts ``S(prefill) +
    sum_decodes (dec_ride + dec_kv * context)``, a decode-only step ``dec_base +
    sum_decodes (dec_alone + dec_kv * context)`` (``StepCosts``). ``k`` whole chunks of
    one prompt cost ``StepCosts.run_time``; the step in which the head completes has
    its remaining tokens, and its leftover budget spills into the next prompts that have a
    slot (vLLM's ``schedule()`` shares the budget in order): that step is priced as one
    step of all its tokens (``StepCosts.step_time``: the fixed per-step cost paid once).
    ``run_time`` and ``step_time`` are inlined (the same arithmetic, in the same order:
    ``decide`` calls this about 16 times a step). ``ctx_total``: the decodes' summed
    context when the caller has it (``Predictive`` shares it across candidates)."""
    ride, alone, kv, base = costs.dec_ride, costs.dec_alone, costs.dec_kv, costs.dec_base
    point = costs.point
    pa_a, pb_a = point(a) if a > 0 else (0.0, 0.0)  # (A, beta) of the two budgets
    pa_b, pb_b = point(b) if b > 0 else (0.0, 0.0)
    nq = len(queue)
    # The decodes running now end in a known order: a sorted list walked once (cheap
    # when ``decs`` comes sorted, as ``Predictive`` passes it); the decodes the projected
    # prompts start go to a heap of (end step, context). Decodes ending at the same step
    # finish in the same iteration, so the order between the two changes nothing.
    ini = sorted(decs)
    ni, ii = len(ini), 0
    spawned: list[Decode] = []
    n_dec = ni
    ctx_sum = sum([ctx for _, ctx in ini]) if ctx_total is None else ctx_total
    head, pos = 0, queue[0][0] if queue else 0  # prompts before head are done
    step, t, total = 0, 0.0, 0.0  # steps so far, their time, sum of completion times
    while head < nq or n_dec:
        slots = limit - n_dec  # prompts that may run beside the decodes (the head first)
        if n_dec:
            budget, pa, pb = a, pa_a, pb_a
            e = ini[ii][0] if ii < ni else NEVER  # the next decode end
            if spawned and spawned[0][0] < e:
                e = spawned[0][0]
            k = e - step
        else:
            budget, pa, pb = b, pa_b, pb_b
        k_head = (-(-(queue[head][1] - pos) // budget)
                  if head < nq and budget > 0 and slots > 0 else NEVER)
        if not n_dec:
            k = k_head
        first = head  # the prompts completed by this iteration: first..head-1
        if k_head == NEVER:  # no prompt runs: k decode-only steps
            dur = k * (base + n_dec * alone + kv * ctx_sum)
        elif k < k_head:  # a decode ends first: k whole chunks of the head, decodes riding
            # run_time(budget, pos, k)
            run = (k * pa + pb * budget * (k * pos + budget * k * (k - 1) / 2)
                   if k > 0 else 0.0)
            dur = run + k * (n_dec * ride + kv * ctx_sum)
            pos += k * budget
        else:  # the head completes in its k-th step, which may start the next prompts
            k = k_head
            j = k - 1  # whole chunks before that step: run_time(budget, pos, j)
            pre = (j * pa + pb * budget * (j * pos + budget * j * (j - 1) / 2)
                   if j > 0 else 0.0)
            pos += j * budget
            n_tok, pairs, room = 0, 0.0, budget
            while room > 0 and head < nq and head - first < slots:
                end = queue[head][1]
                take = end - pos
                if take > room:
                    take = room
                n_tok += take
                pairs += take * (pos + (take + 1) / 2)  # causal_pairs(take, pos)
                room -= take
                pos += take
                if pos >= end:
                    head += 1
                    pos = queue[head][0] if head < nq else 0
            if n_tok != budget:  # step_time(n_tok, pairs) (point is memoised: same floats)
                pa, pb = point(n_tok)
            pre += pa + pb * (pairs - n_tok * (0 + (n_tok + 1) / 2))
            dur = pre + k * (n_dec * ride + kv * ctx_sum)
        step += k
        t += dur
        while ii < ni and ini[ii][0] <= step:  # decodes ending by now finish
            ctx_sum -= ini[ii][1]
            ii += 1
            n_dec -= 1
            total += t
        while spawned and spawned[0][0] <= step:
            _, ctx = heappop(spawned)
            n_dec -= 1
            ctx_sum -= ctx
            total += t
        for h in range(first, head):  # completed prompts emit their first token, decode
            _, end, o = queue[h]
            if o <= 1:
                total += t
            else:
                heappush(spawned, (step + o - 1, end))
                n_dec += 1
                ctx_sum += end
        # Every request still in the system finishes at >= t: a lower bound on the sum.
        if total + (n_dec + nq - head) * t > stop_above:
            return INF
    return total + arrivals_wait(arrival_rate, t)
