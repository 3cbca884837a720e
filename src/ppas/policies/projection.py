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
completion (a heap of decode end steps), so O(N log N) per candidate. Under a long queue
the constant budgets' iterations are computed as arrays instead, all budgets at once
(``stream_runs``: the loop's floats, bit for bit; ``Predictive`` switches at
``STREAM_MIN_PROMPTS``). It is a deliberate
approximation of the engine's exact rules (``ppas.engine.step_rules``, which the simulator
and the vLLM adapter share): ``decide`` runs it for every candidate at every step and must
cost microseconds, and a policy sits below the engine.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from functools import partial
from heapq import heappop, heappush
from itertools import chain

import numpy as np

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
    guess = OutputsLeft.of(view)
    for r in view.requests:
        left = r.max_output_tokens - r.num_output_tokens
        if guess is not None and left > 1:
            left = guess(r.num_output_tokens, left)
        if is_pending_prefill(r):
            prompts.append((min(r.num_computed_tokens + r.num_cached_tokens,
                                r.prompt_tokens - 1), r.prompt_tokens, max(1, left)))
        elif left > 0:
            decodes.append((left, r.num_computed_tokens))
    return prompts, decodes


class OutputsLeft:
    """The outputs a request will still produce, as the projection counts them.

    While the engine has seen every request stop at its cap (``caps_are_lengths``: a
    replay with ``ignore_eos``), the cap less the outputs so far, exactly. Once one stopped
    before it, the caps are caps (``ordered``'s rule 4), and a request that has produced
    ``d`` outputs is charged its expected residual life ``E[X - d | X > d]`` (rounded, at
    least 1, at most what its cap leaves). The distribution of the output count ``X`` is
    the Kaplan-Meier estimate from the finished requests (``OutputLengths``: events) and
    the running decodes (censored: each has run past its ``d``); counting the finished
    ones alone biases it short while the run is young, since the short requests finish
    first and the long ones are still running. Past the longest finished count ``x_max``
    nothing has been seen to stop, so the estimate has no tail there; a request that has
    run ``d >= x_max`` is charged ``d`` more (the residual life of a scale-free tail,
    ``P(X > x) ~ 1 / x^2``, whose mean residual at ``d`` is ``d``: a request that has
    outlived every finished one is taken to run as long again), and the mass the
    estimate leaves past ``x_max`` is charged ``x_max`` more, the same rule at ``x_max``.

    Charging the caps instead makes every decode look endless under vLLM's default
    ``max_tokens`` (the context left): on the Azure code trace at twice its rate on an
    H100, mean E2E 5.57 s against 4.75 s with this estimate and 4.65 s with the lengths
    known (``docs/results/real-traffic.md``, "Real clients' max_tokens"). O(finished
    counts + running) once per view, then O(log finished counts) per distinct ``d``,
    memoised."""

    __slots__ = ("view", "memo", "_km")

    def __init__(self, view: SchedulerView) -> None:
        self.view = view
        self.memo: dict[int, int] = {}
        self._km: tuple[list[int], list[float], list[float]] | None = None

    @classmethod
    def of(cls, view: SchedulerView) -> OutputsLeft | None:
        """None while the caps are the lengths (then ``cap - done`` is exact)."""
        lengths = view.output_lengths
        return None if lengths is None or lengths.caps_are_lengths else cls(view)

    def __call__(self, done: int, left: int) -> int:
        """The outputs left of a request with ``done`` outputs and ``left`` under its cap."""
        guess = self.memo.get(done)
        if guess is None:
            guess = self.memo[done] = self.residual(done)
        return guess if guess < left else left

    def residual(self, done: int) -> int:
        """``round(E[X - done | X > done])``, at least 1 (class doc: ``done`` from
        ``x_max`` on)."""
        if self._km is None:
            self._km = self._kaplan_meier()
        xs, surv, tail = self._km
        if not xs or done >= xs[-1]:
            return max(1, done)
        # S(k) = P(X > k) is surv[i] on [xs[i], xs[i+1]) (1 before xs[0]); tail[i] is the
        # sum of S(k) over k in [xs[i], x_max).
        i = bisect_right(xs, done) - 1
        s_d = surv[i] if i >= 0 else 1.0
        nxt = xs[i + 1]
        total = s_d * (nxt - done) + tail[i + 1] + surv[-1] * xs[-1]
        return max(1, round(total / s_d))

    def _kaplan_meier(self) -> tuple[list[int], list[float], list[float]]:
        """The product-limit estimate at each finished count ``x`` (ascending):
        ``S(x) = prod_{x' <= x} (1 - d_x' / n_x')``, ``d`` the requests that stopped at
        ``x'``, ``n`` those at risk there: finished with ``X >= x'`` and running decodes
        with ``d >= x'`` (they have run past it). Then the tail sums up to ``x_max``."""
        lengths = self.view.output_lengths
        assert lengths is not None
        xs_t, ds = lengths.lengths()
        xs = list(xs_t)
        censored = []
        for r in self.view.requests:  # running first, then waiting (SchedulerView)
            if not r.is_running:
                break
            if r.num_output_tokens > 0:
                censored.append(r.num_output_tokens)
        censored.sort()
        n_fin = lengths.finished  # finished with X >= xs[i], walking up
        c = len(censored)
        j = 0  # censored[:j] are < xs[i]
        surv: list[float] = []
        s = 1.0
        for x, d in zip(xs, ds, strict=True):
            while j < c and censored[j] < x:
                j += 1
            at_risk = n_fin + (c - j)
            s *= 1.0 - d / at_risk
            surv.append(s)
            n_fin -= d
        # tail[i] = sum_{k = xs[i]}^{x_max - 1} S(k); tail[len] = 0
        tail = [0.0] * (len(xs) + 1)
        for i in range(len(xs) - 2, -1, -1):
            tail[i] = tail[i + 1] + surv[i] * (xs[i + 1] - xs[i])
        return xs, surv, tail


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


class Tail:
    """The pending prompts past the horizon (``Predictive``'s ``horizon``), as closed-form
    terms of the projected sum. The horizon is projected as before but for one thing: once
    its last prompt completes (at ``T_pf``) the budget stays busy with the tail's prefill
    (``fill``: its steps of ``a`` tokens, priced as the loop prices a step, the horizon's
    decodes riding them) instead of turning to decode-only steps; without that, a big
    budget would finish the horizon's prompts in a few steps and its decodes in cheap
    decode-only steps, while behind a long queue they ride the queue's prefill.

    The tail itself is ``K = n_tail / H`` copies of the horizon's ``H`` prompts queued
    behind it. Copy ``c`` (1..K) starts when the copy before it has had its prefill,
    ``c * T_pf`` later, and its requests then complete as the horizon's do (the mean of the
    ``N`` projected requests' times, running decodes included: a tail request is stalled
    by and stalls decodes as the horizon's are). So the tail adds ``(n_tail / N) * total
    + (n_tail (n_tail + H) / (2 H)) * T_pf``. The busy period the next arrivals wait for
    (``arrivals_wait``) is the whole queue's: its prefill, ``(1 + K) T_pf``, then the last
    decodes' end in decode-only steps, i.e. the horizon's end ``t_end`` less the time the
    tail's prefill added to it (``lag``: the tail's prefill runs ``K T_pf`` whatever the
    horizon's decodes do; counting it in ``t_end`` too would charge a big budget's fat
    steps to every arrival twice), plus ``K T_pf``. Every input is a count or a figure of
    the horizon's own projection: O(1).

    In floats: ``total * scale + coef * T_pf`` and ``t_end - lag + busy * T_pf``; with no
    tail (``NO_TAIL``: 1, 0, 0, no fill, so ``lag`` stays 0.0) they are ``total`` and
    ``t_end`` exactly (times 1.0, plus or minus 0.0), so the projection without a horizon
    gives today's floats.

    Lower bound (``stop_above``): the sum is at least ``scale`` times the loop's bound
    (``total`` so far plus ``t`` for every request left) plus ``coef * T_pf``, and ``T_pf
    >= t`` while a horizon prompt is left; once none is, ``T_pf`` is known."""

    __slots__ = ("scale", "coef", "busy", "fill_tokens", "fill_pairs")

    def __init__(self, n_tail: int = 0, n_prompts: int = 0, n_requests: int = 0,
                 fill_tokens: int = 0, fill_pairs: float = 0.0) -> None:
        self.fill_tokens, self.fill_pairs = fill_tokens, fill_pairs
        if n_tail <= 0 or n_prompts <= 0:
            self.scale, self.coef, self.busy = 1.0, 0.0, 0.0
            self.fill_tokens = 0
            return
        self.scale = 1.0 + n_tail / n_requests  # n_requests >= n_prompts > 0
        self.coef = n_tail * (n_tail + n_prompts) / (2 * n_prompts)
        self.busy = n_tail / n_prompts

    @classmethod
    def behind(cls, queue: list[Prompt], n_decodes: int, n_tail: int) -> Tail:
        """The tail of ``n_tail`` prompts behind ``queue`` (the horizon) beside
        ``n_decodes`` running decodes; its prompts, fresh, taken as the horizon's on
        average (``fill``). O(horizon)."""
        if n_tail <= 0 or not queue:
            return NO_TAIL
        ends = [end for _, end, _ in queue]
        tokens = sum(ends)
        pairs = sum([e * (e + 1) // 2 for e in ends])
        return cls(n_tail, len(queue), len(queue) + n_decodes, n_tail * tokens // len(queue),
                   pairs / tokens)

    def fill(self, costs: StepCosts, a: int) -> tuple[int, float]:
        """The tail's prefill while the horizon's decodes run on (``project``): at budget
        ``a``, ``ceil(fill_tokens / a)`` steps of ``a`` tokens whose pairs per token are
        the tail's (``fill_pairs``: ``(L + 1) / 2`` token-weighted over prompts of ``L``
        tokens, whatever the chunking), each priced as the loop prices a step of ``a``
        tokens, ``A(a) + beta(a) (pairs - a (a + 1) / 2)``, the horizon's decodes riding
        them. (0, 0.0) without a tail."""
        if self.fill_tokens <= 0 or a <= 0:
            return 0, 0.0
        pa, pb = costs.point(a)
        return -(-self.fill_tokens // a), pa + pb * (a * self.fill_pairs - a * (a + 1) / 2)


NO_TAIL = Tail()


class Floor:
    """What the queue's prompts still need at the least, for ``_walk``'s prefill bound:
    a prompt completes only once the stream (the queue's remaining prompt tokens in
    engine order) has been prefilled up to its end, and every prefill step of at most
    ``cap`` tokens is priced at least ``per_token`` a token plus ``per_pair`` a causal
    pair (``StepCosts.prefill_floor``), whatever the chunking. From the start of prompt
    ``h`` (its computed tokens), ``last[h]`` is that floor up to the queue's end and
    ``rest[h]`` its sum over the prompts ``h..`` up to each one's end; both 0.0 at ``h =
    len(queue)``. Built once per decision (every candidate's budgets are <= ``cap``)."""

    __slots__ = ("rest", "last")

    def __init__(self, costs: StepCosts, queue: list[Prompt], cap: int,
                 rows: np.ndarray | None = None) -> None:
        per_token, per_pair = costs.prefill_floor(cap)
        q = (queue_rows(queue) if rows is None else rows).astype(np.float64)  # exact
        start, rem = q[:, 0], q[:, 1] - q[:, 0]
        own = per_token * rem + per_pair * (rem * start + rem * (rem + 1) / 2)
        cum = np.cumsum(own)  # from the queue's start up to each prompt's end
        before = cum - own
        suffix = np.cumsum(cum[::-1])[::-1]
        rest = suffix - np.arange(len(queue), 0, -1) * before
        self.rest = [*rest.tolist(), 0.0]
        self.last = [*((cum[-1] - before).tolist() if len(queue) else ()), 0.0]


def queue_rows(queue: list[Prompt]) -> np.ndarray:
    """The queue as an integer array, one row per prompt (``Floor`` and ``Stream`` of one
    decision may share it: ``rows``)."""
    return np.fromiter(chain.from_iterable(queue), np.int64, 3 * len(queue)).reshape(-1, 3)


def horizon_work(view: SchedulerView, horizon: int
                 ) -> tuple[list[Prompt], list[Decode], int, float]:
    """``pending_work`` and ``arrival_rate`` on the head of the view: every running
    request, then waiting ones (FCFS) until ``horizon`` pending prompts are read (and at
    least the first waiting one); returns the prompts, the decodes, ``n_tail`` (the
    pending prompts not read: ``num_pending_prefills`` less those read) and the arrival
    rate with the oldest request taken among those read. The view lists running requests
    first, then waiting ones FCFS (a preempted request goes back to the front: it is older
    than those behind it), so the oldest request is among them. O(running + horizon): the
    simulator's ``view.requests`` is lazy, and ``len`` of it is O(1)."""
    prompts: list[Prompt] = []
    decodes: list[Decode] = []
    oldest = INF
    n_prompts = 0  # len(prompts)
    guess = OutputsLeft.of(view)
    for r in view.requests:
        arrival = r.arrival_time
        if arrival < oldest:
            oldest = arrival
        running = r.is_running
        if not running and n_prompts >= horizon:
            break  # the waiting ones past the horizon: counted, not read
        left = r.max_output_tokens - r.num_output_tokens
        if guess is not None and left > 1:
            left = guess(r.num_output_tokens, left)
        computed, prompt = r.num_computed_tokens, r.prompt_tokens
        if not running or computed < prompt:  # is_pending_prefill(r), inlined
            done = computed + r.num_cached_tokens  # min(done, prompt - 1), max(1, left)
            prompts.append((done if done < prompt else prompt - 1, prompt,
                            left if left > 1 else 1))
            n_prompts += 1
        elif left > 0:
            decodes.append((left, computed))
    n = len(view.requests)
    span = view.now - oldest
    rate = (n - 2) / span if n >= 3 and span > 0 else 0.0
    return prompts, decodes, max(0, view.num_pending_prefills - len(prompts)), rate


def project(costs: StepCosts, a: int, b: int, queue: list[Prompt], decs: list[Decode],
            stop_above: float = float("inf"), arrival_rate: float = 0.0,
            limit: int = NO_LIMIT, ctx_total: int | None = None,
            tail: Tail = NO_TAIL, wait_bound: bool = False, floor: Floor | None = None
            ) -> float:
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
    context when the caller has it (``Predictive`` shares it across candidates).

    A constant budget (no ``limit``, ``a > 0``, decodes running) over a long queue goes
    through ``project_stream``, the same iterations computed as arrays (the same floats);
    everything else through the loop below. ``tail``: the pending prompts past ``queue``
    (``Tail``), added in closed form. ``wait_bound``: the loop's bound also counts the
    next arrivals' wait (``_walk``), so more candidates that cannot win stop early (the
    same sum when none is pruned; the array path ignores it). ``floor``: the loop's bound
    also counts the queue's prefill still to come (``Floor`` of ``queue`` at a cap >=
    ``a`` and ``b``; ``_walk``), with the same effect."""
    ini = sorted(decs)
    ctx_sum = sum([ctx for _, ctx in ini]) if ctx_total is None else ctx_total
    if a > 0 and ini and limit == NO_LIMIT and len(queue) >= STREAM_MIN_PROMPTS:
        return project_stream(costs, a, b, queue, ini, stop_above, arrival_rate, ctx_sum,
                              tail=tail)
    return _walk(costs, a, b, queue, ini, ctx_sum, stop_above, arrival_rate, limit,
                 tail=tail, wait_bound=wait_bound, floor=floor)


def _walk(costs: StepCosts, a: int, b: int, queue: list[Prompt], ini: list[Decode],
          ctx_sum: int, stop_above: float, arrival_rate: float, limit: int,
          step: int = 0, t: float = 0.0, total: float = 0.0, head: int = 0,
          pos: int | None = None, tail: Tail = NO_TAIL, t_pf: float = -1.0,
          wait_bound: bool = False, floor: Floor | None = None) -> float:
    """``project``'s event loop from a state: ``step`` steps done in ``t`` seconds, the
    completion times so far summing to ``total``, prompts before ``head`` done, the head
    at ``pos`` (default: its computed tokens), the decodes ``ini`` (sorted by end step,
    their context summing to ``ctx_sum``) running; ``t_pf``: when the last prompt
    completed (when ``head`` is already past the queue).

    ``wait_bound``: the bound also counts the next arrivals' wait, ``arrivals_wait`` of
    the busy period so far: ``t - lag`` (the loop's time without the tail's fill, which
    only grows: each iteration adds its ``bare`` duration or a prefill's, all >= 0) plus
    ``busy`` times ``t_pf`` (>= ``t`` while a prompt is left), so it is at most the
    returned sum's last term, and the sum is still >= the bound. In floats the two
    differ from the reals by a few ulps per iteration, far below ``WAIT_MARGIN``: a
    candidate is cut only if its sum exceeds ``stop_above``, so the caller's choice (the
    smallest sum) is the same as without it.

    ``floor`` (``Floor``): when a prompt completes, the bound also counts the prefill the
    prompts after the new head still need: each of them completes at >= ``t`` plus its
    ``Floor`` from the next prompt's start (the head's own rest only shortens what is
    left), the last one too (``t_pf``), and the busy period grows by at least as much (a
    prefill iteration adds no ``lag``). With the wait bound's margin (``WAIT_MARGIN``)."""
    ride, alone, kv, base = costs.dec_ride, costs.dec_alone, costs.dec_kv, costs.dec_base
    point = costs.point
    memo = costs.points.get  # point's memo, read first (point fills it: the same floats)
    pa_a, pb_a = point(a) if a > 0 else (0.0, 0.0)  # (A, beta) of the two budgets
    pa_b, pb_b = point(b) if b > 0 else (0.0, 0.0)
    nq = len(queue)
    # The decodes running now end in a known order: a sorted list walked once (cheap
    # when ``decs`` comes sorted, as ``Predictive`` passes it); the decodes the projected
    # prompts start go to a heap of (end step, context). Decodes ending at the same step
    # finish in the same iteration, so the order between the two changes nothing.
    ni, ii = len(ini), 0
    spawned: list[Decode] = []
    n_dec = ni
    if pos is None:  # prompts before head are done
        pos = queue[head][0] if head < nq else 0
    scale, coef, busy = tail.scale, tail.coef, tail.busy
    rate_half = 0.5 * arrival_rate  # arrivals_wait(rate, x) = rate_half * x * x
    fill_n, fill = tail.fill(costs, a)
    lag = 0.0  # the time the tail's prefill has added so far
    fill_end = -1  # the step up to which the tail's prefill keeps the budget busy
    if head >= nq and t_pf < 0.0:
        t_pf, fill_end = t, step + fill_n
    rest, last = (floor.rest, floor.last) if floor is not None else ([], [])
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
        if k_head == NEVER:  # no prompt runs: k decode-only steps, less the tail's (Tail)
            dur = k * (base + n_dec * alone + kv * ctx_sum)
            f = fill_end - step if budget > 0 and slots > 0 and head >= nq else 0
            if f > 0:
                if f > k:
                    f = k
                bare = dur
                dur = (f * (fill + n_dec * ride + kv * ctx_sum)
                       + (k - f) * (base + n_dec * alone + kv * ctx_sum))
                lag += dur - bare
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
                p = memo(n_tok)
                pa, pb = p if p is not None else point(n_tok)
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
        if head > first:
            for h in range(first, head):  # completed prompts emit their first token, decode
                _, end, o = queue[h]
                if o <= 1:
                    total += t
                else:
                    heappush(spawned, (step + o - 1, end))
                    n_dec += 1
                    ctx_sum += end
            if head >= nq:
                if t_pf < 0.0:  # the last prompt completed in this iteration's last step:
                    t_pf, fill_end = t, step + fill_n  # the tail's prefill goes on
            elif rest:  # the prefill bound (docstring), from prompt head + 1 (a floor's
                # lists are never empty)
                t_end = t + last[head + 1]  # <= t_pf
                low = ((total + (n_dec + nq - head) * t + rest[head + 1]) * scale
                       + coef * t_end)
                if wait_bound and rate_half:
                    busy_low = t - lag + last[head + 1] + busy * t_end
                    low += rate_half * busy_low * busy_low
                if low * WAIT_MARGIN > stop_above:
                    return INF
        # Every request still in the system finishes at >= t: a lower bound on the sum
        # (and on the tail's: ``Tail``, with ``t_pf`` >= t while a prompt is left).
        t_low = t if head < nq else t_pf
        low = (total + (n_dec + nq - head) * t) * scale + coef * t_low
        if low > stop_above:
            return INF
        if wait_bound and rate_half:  # ... and on the next arrivals' wait (docstring)
            busy_low = t - lag + busy * t_low
            if (low + rate_half * busy_low * busy_low) * WAIT_MARGIN > stop_above:
                return INF
    return total * scale + coef * t_pf + arrivals_wait(arrival_rate, t - lag + tail.busy * t_pf)


#: ``_walk``'s bound with the arrivals' wait is shrunk by this factor before it is compared
#: (relative rounding of a loop's floats: about 1e-16 per addition; ``wait_bound``), and so
#: is its prefill bound (``floor``: ``Floor``'s floats too).
WAIT_MARGIN = 1.0 - 1e-9
#: ``project`` takes the array path (``project_stream``) from this many pending prompts:
#: below, the loop is cheaper than the arrays' fixed cost (both give the same floats).
STREAM_MIN_PROMPTS = 24
#: Causal-pair sums are exact integers in a float below this (see ``Stream``).
EXACT_INT = 1 << 53
#: ``stream_runs`` keys budget r's steps as ``r * ROW + step`` (steps stay below it).
ROW = 1 << 40


class Stream:
    """The queue and the running decodes as arrays, for ``project_stream`` (built once per
    decision: every constant budget reads the same).

    ``cum[h]``: the stream's tokens (the remaining prompt tokens in engine order) up to
    prompt ``h``'s end, ``before[h]`` up to its start. ``pairs_to[h]``: the causal pairs
    (``sum (position + 1)`` over the tokens, ``causal_pairs``) of the stream before prompt
    ``h``, so that any stretch of the stream has its pairs as a difference (``pairs``).
    The loop sums a step's pairs prompt by prompt in floats; each term and partial sum is
    an integer below 2**53 (``exact``), so both are exact and equal."""

    def __init__(self, queue: list[Prompt], ini: list[Decode],
                 rows: np.ndarray | None = None) -> None:
        q = queue_rows(queue) if rows is None else rows
        self.start, self.end, self.outs = q[:, 0], q[:, 1], q[:, 2]
        rem = self.end - self.start
        self.cum = np.cumsum(rem)
        self.before = self.cum - rem
        self.offset = self.start - self.before  # a prompt's position less the stream's
        self.tokens = int(self.cum[-1])
        pairs = rem * self.start + rem * (rem + 1) // 2
        self.pairs_to = np.cumsum(pairs) - pairs
        self.max_end = int(self.end.max())
        self.spawns = spawns = self.outs > 1
        self.n_ini = len(ini)
        d = np.array(ini, dtype=np.int64).reshape(len(ini), 2)
        self.ini_end = d[:, 0]
        self.last_step = self.tokens + int(self.outs.max()) + int(self.ini_end.max(initial=0))
        self._pairs_exact = bool(self.pairs_to[-1] < EXACT_INT)
        # Per event (``stream_runs``' columns before sorting: the completions, the running
        # decodes' ends, the spawned decodes' ends), what it changes: the requests
        # finishing, the decodes running and their context (integers, exact in floats).
        nq, nq_ini = len(queue), len(queue) + self.n_ini
        self.event_terms = terms = np.zeros((4, nq_ini + int(np.count_nonzero(spawns))))
        terms[0, :nq] = 1  # prompts completing
        terms[1, :nq], terms[1, nq:] = ~spawns, 1  # requests finishing
        terms[2, :nq], terms[2, nq:] = spawns, -1  # decodes starting less ending
        terms[3, :nq] = self.end * spawns  # their context
        terms[3, nq:nq_ini], terms[3, nq_ini:] = -d[:, 1], -self.end[spawns]

    def exact(self, a: int) -> bool:
        """Whether every step's causal pairs at budget ``a`` stay exact integers."""
        return (a * (self.max_end + a) < EXACT_INT and self._pairs_exact
                and self.last_step < ROW)

    def pairs(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """The causal pairs of the stream's tokens ``lo..hi - 1`` (integers)."""
        return self._upto(hi) - self._upto(lo)

    def _upto(self, x: np.ndarray) -> np.ndarray:
        h = np.minimum(np.searchsorted(self.cum, x), len(self.cum) - 1)
        n = x - self.before[h]
        return self.pairs_to[h] + n * self.start[h] + n * (n + 1) // 2


class StreamRun:
    """One budget's projection by ``stream_runs``, to be finished against a bound."""

    __slots__ = ("walk", "j", "bound")

    def __init__(self, j: float, bound: float,
                 walk: Callable[[float], float] | None = None) -> None:
        self.j = j  # the sum of completion times (when ``walk`` is None)
        self.bound = bound  # the largest lower bound the loop would have checked
        self.walk = walk  # the loop from where the decodes ran out, given ``stop_above``

    def finish(self, stop_above: float = INF) -> float:
        """What ``project(..., stop_above)`` returns: ``inf`` when a lower bound exceeds
        ``stop_above``, else the sum."""
        if self.bound > stop_above:
            return INF
        if self.walk is not None:
            return self.walk(stop_above)
        return self.j


def project_stream(costs: StepCosts, a: int, b: int, queue: list[Prompt],
                   ini: list[Decode], stop_above: float, arrival_rate: float,
                   ctx_sum: int, stream: Stream | None = None, tail: Tail = NO_TAIL) -> float:
    """``project`` for a constant budget ``a > 0``, no limit, ``ini`` (sorted, not empty)
    running, through ``stream_runs`` (the same floats)."""
    s = Stream(queue, ini) if stream is None else stream
    run = stream_runs(costs, (a,), b, queue, ini, arrival_rate, ctx_sum, s, tail)[a]
    return run.finish(stop_above)


def stream_runs(costs: StepCosts, budgets: tuple[int, ...], b: int, queue: list[Prompt],
                ini: list[Decode], arrival_rate: float, ctx_sum: int,
                s: Stream, tail: Tail = NO_TAIL, wait_bound: bool = False,
                floor: Floor | None = None) -> dict[int, StreamRun]:
    """``project`` for each constant budget ``a`` in ``budgets`` (each > 0; no limit;
    ``ini`` sorted, not empty), the loop's iterations computed as arrays, all budgets at
    once (one row each), with the loop's floats.

    While any decode runs, every step takes ``a`` tokens off the stream of the queue's
    remaining prompt tokens (whole chunks, then the completing step's spill), so prompt
    ``h`` completes in step ``ceil(R_h / a)`` (``R_h``: the stream's tokens up to its end)
    and its decode ends ``o_h - 1`` steps later. The loop's iterations end exactly at the
    distinct steps of these events and of the running decodes' ends: a row holds every
    event's step, sorted, each step's events counted at its first copy (a repeated step
    is an iteration of no steps: its duration is exactly 0.0, nothing finishes in it, so
    it changes no float). Each iteration's duration is the loop's expression of its start
    state (the decodes and their context there: integer running sums of the events before
    it); ``t`` is the running sum of the durations and ``total`` that of ``t`` repeated
    once per request finishing, and numpy's ``cumsum`` along a row adds in order, as the
    loop does (adding 0.0 changes nothing), so every float is the loop's. If the decodes
    all end while prompts are left (the budget would become ``b``), the loop takes over
    from that state (no decode running then, so the state is five numbers):
    ``StreamRun.walk``. Budgets whose causal pairs might not be exact integers
    (``Stream.exact``) run the loop. ``tail``: as the loop's (``Tail``), in the same
    expressions (the time of each row's last completion read off ``t``). ``wait_bound``:
    the loop's (``_walk``), for the walks alone (a row's own bound is the loop's without
    it), and so is ``floor``."""
    out: dict[int, StreamRun] = {}
    rows = tuple(a for a in budgets if s.exact(a))
    for a in budgets:
        if a not in rows:
            out[a] = StreamRun(0.0, -INF, partial(_walk, costs, a, b, queue, ini, ctx_sum,
                                                  arrival_rate=arrival_rate, limit=NO_LIMIT,
                                                  tail=tail, wait_bound=wait_bound,
                                                  floor=floor))
    if not rows:
        return out
    ride, alone, kv, base = costs.dec_ride, costs.dec_alone, costs.dec_kv, costs.dec_base
    nr, nq = len(rows), len(queue)
    A, PA, PB, PBA = costs.point_rows(rows)  # one row per budget: a, A(a), beta(a), beta(a) a
    start, cum, tokens = s.start, s.cum, s.tokens
    comp = -(-cum[None, :] // A)  # the step in which each prompt completes
    raw = np.concatenate((comp, np.broadcast_to(s.ini_end, (nr, s.n_ini)),
                          (comp + s.outs - 1)[:, s.spawns]), axis=1)  # every event's step
    ev = np.sort(raw, axis=1)  # each iteration's last step
    w = ev.shape[1]
    key = np.arange(nr, dtype=np.int64)[:, None] * ROW  # row r's steps as r * ROW + step
    at = np.searchsorted((ev + key).ravel(), (raw + key).ravel())  # at the step's first copy
    n = nr * w
    # Each column's events summed, the four terms at once (term i's columns as i * n + at)
    n_comp, fin, d_dec, d_ctx = np.bincount(
        (at + np.arange(0, 4 * n, n)[:, None]).ravel(), np.tile(s.event_terms, nr).ravel(),
        4 * n).astype(np.int64).reshape(4, nr, w)
    # The state before each event (column 0: now) and after it (column w: the end), as
    # integer running sums: the decodes, their context, the prompts completed.
    n_dec = _running(d_dec, s.n_ini)
    ctx = _running(d_ctx, ctx_sum)
    head = _running(n_comp, 0)
    prev = _running(ev, 0, False)  # each iteration's first step - 1
    n_after, head_after = n_dec[:, 1:], head[:, 1:]
    n_dec, ctx, head, prev = n_dec[:, :-1], ctx[:, :-1], head[:, :-1], prev[:, :-1]
    comp_last = comp[:, -1:]
    prefill = prev < comp_last
    stalled = prefill & (n_dec == 0)  # no decode left, prompts left
    stall = np.where(stalled.any(axis=1), stalled.argmax(axis=1), w)
    k = ev - prev
    pos = s.offset[np.minimum(head, nq - 1)] + A * prev  # the head's position at its start
    kvc = kv * ctx
    ride_k = k * (n_dec * ride + kvc)
    alone_1 = base + n_dec * alone + kvc  # one decode-only step
    dur = k * alone_1  # decode-only (the queue is done)
    lag_ri = np.zeros(nr)  # each row's lag at its last iteration computed here
    if tail.fill_tokens > 0:  # ... but for the tail's prefill (none without a tail)
        fills = [tail.fill(costs, a) for a in rows]  # its steps after the queue's
        FILL = np.array([f for _, f in fills])[:, None]
        fill_end = comp_last + np.array([n for n, _ in fills], dtype=np.int64)[:, None]
        f = np.clip(fill_end - prev, 0, k)
        filled = (f > 0) & ~prefill
        bare = dur
        dur = np.where(filled, f * (FILL + n_dec * ride + kvc) + (k - f) * alone_1, bare)
        lag = np.cumsum(np.where(filled, dur - bare, 0.0), axis=1)
        lag_ri = lag[np.arange(nr), np.minimum(stall, w) - 1]
    run = k * PA + PBA * (k * pos + A * k * (k - 1) / 2) + ride_k  # k whole chunks
    dur = np.where(prefill & (n_comp == 0), run, dur)  # (a decode ends first)
    done = np.flatnonzero(n_comp)  # the head completes in the iteration's last step
    rd = done // w
    kd, pd, ed = k.ravel()[done], pos.ravel()[done], ev.ravel()[done]
    ad, pa_s, pb_s, pba_s = A[rd, 0], PA[rd, 0], PB[rd, 0], PBA[rd, 0]
    j = kd - 1  # whole chunks before it
    pre = np.where(j > 0, j * pa_s + pba_s * (j * pd + ad * j * (j - 1) / 2), 0.0)
    lo = ad * (ed - 1)  # the stream's tokens before the last step
    hi = np.minimum(ad * ed, tokens)
    pairs = s.pairs(lo, hi).astype(np.float64)  # the loop's float sum, exactly
    n_tok = hi - lo
    # Only each row's last completion (the queue's last step) may take fewer than a.
    last = at[nq - 1::w]  # each row's last completion, at its first copy
    for r, i in enumerate(np.searchsorted(done, last).tolist()):
        if n_tok[i] != rows[r]:
            pa_s[i], pb_s[i] = costs.point(int(n_tok[i]))
    flat_dur = dur.reshape(-1)  # a view: dur is a fresh array
    flat_dur[done] = (pre + (pa_s + pb_s * (pairs - n_tok * (0 + (n_tok + 1) / 2)))
                      + ride_k.ravel()[done])
    t = np.cumsum(dur, axis=1)
    valid = np.arange(w)[None, :] < stall[:, None]
    fin = np.where(valid, fin, 0)  # requests finishing at each end
    total = _finished_sums(t, fin)
    # Each row's last completion is its queue's last step (the iteration at its first
    # copy); where the decodes run out first it comes in the walk (t_pf 0.0 here, never
    # read: every column before the stall has prompts left).
    last = last - np.arange(nr) * w
    t_pf = np.where(last < stall, t[np.arange(nr), np.minimum(last, w - 1)], 0.0)
    scale, coef = tail.scale, tail.coef
    left = head_after < nq
    bound = np.where(valid, (total + (n_after + nq - head_after) * t) * scale
                     + coef * np.where(left, t, t_pf[:, None]), -INF)
    bmax = bound.max(axis=1)
    for r, a_r in enumerate(rows):
        i = int(stall[r]) - 1  # the last iteration computed here
        if stall[r] < w:  # the loop goes on, at budget b, with no decode running
            h = int(head_after[r, i])
            pos_h = int(start[h] + a_r * ev[r, i] - s.before[h])
            out[a_r] = StreamRun(0.0, float(bmax[r]), partial(
                _walk, costs, a_r, b, queue, [], 0, arrival_rate=arrival_rate,
                limit=NO_LIMIT, step=int(ev[r, i]), t=float(t[r, i]),
                total=float(total[r, i]), head=h, pos=pos_h, tail=tail,
                wait_bound=wait_bound, floor=floor))
        else:
            tp, te = float(t_pf[r]), float(t[r, i]) - float(lag_ri[r])
            out[a_r] = StreamRun(float(total[r, i]) * scale + coef * tp
                                 + arrivals_wait(arrival_rate, te + tail.busy * tp),
                                 float(bmax[r]))
    return out


def _running(d: np.ndarray, first: int, add: bool = True) -> np.ndarray:
    """Each row's running sums of ``d`` with ``first`` in front (``add``; else ``d`` itself
    one place later): column i is the state before event i, column w after the last."""
    nr, w = d.shape
    y = np.empty((nr, w + 1), dtype=d.dtype)
    y[:, 0] = first
    y[:, 1:] = d
    return np.cumsum(y, axis=1, out=y) if add else y


def _finished_sums(t: np.ndarray, fin: np.ndarray) -> np.ndarray:
    """Per row, the running sum of ``t[i]`` added ``fin[i]`` times after iteration i, in
    order, as the loop adds each finishing request's completion time; ``cumsum`` along a
    row adds left to right, and adding 0.0 changes no value."""
    nr, w = t.shape
    if int(fin.max(initial=0)) <= 1:
        return np.cumsum(np.where(fin > 0, t, 0.0), axis=1)
    # Each row's times repeated once per finish, in order, after a 0.0 and padded with
    # 0.0s to the longest row's count: one (nr, most + 1) block, summed along its rows.
    upto = np.cumsum(fin, axis=1)  # finishes up to each iteration
    n_fin = upto[:, -1]
    most = int(n_fin.max())
    reps = np.empty((nr, w + 2), dtype=np.int64)
    reps[:, 0], reps[:, 1:-1], reps[:, -1] = 1, fin, most - n_fin
    times = np.zeros((nr, w + 2))
    times[:, 1:-1] = t
    sums = np.cumsum(np.repeat(times.ravel(), reps.ravel()).reshape(nr, most + 1), axis=1)
    return np.take_along_axis(sums, upto, axis=1)  # sums[r, n]: of row r's first n finishes
