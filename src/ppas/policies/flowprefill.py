"""FlowPrefill: slack-ordered EDF over TTFT SLO classes (arXiv 2602.16603; code public).

Spec related-policies.md [R]. Priority of a prefilling request:

    deadline = arrival + ttft_slo
    slack    = (deadline - now) - predicted_remaining_prefill_time
    order by sign(slack) / deadline, descending

i.e. EDF among feasible requests (slack >= 0), infeasible ones after them. Requests
without a TTFT SLO rank between the two (key 0). The order goes out as
``Decision.prefill_order``.

Preemption: FlowPrefill preempts a running prefill at the next operator/layer boundary
when a more urgent request arrives. Our engines only switch between steps, so we use the
nearest real lever (the spec's note for vLLM): under contention (two or more prefills
pending) steps carry at most ``batch_tokens`` (2048, FlowPrefill's batching cap) prefill
tokens, so a newly arrived urgent request waits at most one such step; without
contention the full ``mbt`` runs. Layer-boundary preemption is *not* modelled in the
simulator (it would need sub-step events; not done, see the issue report).

Event-driven decisions: FlowPrefill re-plans only on arrivals and completions. Our
decision is a pure function of the view, recomputed every step; between events it
changes only when a request's slack crosses zero (its predicted prefill no longer fits),
which the paper's planner would also act on at its next event. Differences are noted in
the report.

TTFT predictor: the paper fits a cubic to profiled prefill time vs length; we use the
bound cost model's prefill time in chunks of ``batch_tokens`` (tabulated at bind time).
Without a cost model, the per-token time of the last prefill step in ``recent_steps``.

Cost per step. The straightforward rule (``decide_whole``) keys and sorts every pending
prompt. Where the view carries a ``waiting_log`` and a cost model is bound, ``decide``
keeps the waiting requests with a TTFT SLO indexed between steps instead
(``_SlackIndex``): a waiting request's key is fixed but for its sign, which flips once, at
a time known when it enters (its remaining prefill time does not change while it waits;
the key does not read ``num_cached_tokens``, so prefix caching does not matter). The
order's head is then merged from the running prompts (sorted), the on-time heap, the
requests without an SLO in queue order (read from the view's queue head) and the late
heap, up to what ``listed`` takes: O(running + listed + events) per step. Equal keys keep
the queue's relative order in the sort; the queue's order among equal-key requests
depends on earlier steps' orders, which the index does not know, so a tie among the
waiting requests it reads (equal deadlines) sends the step to ``decide_whole`` (same
decisions, ``tests/test_policy_reads.py``). The one pair whose order a cut listing can
lose, two waiting requests with one deadline and different remaining prefill times (one
late while the other is on time: the whole sort swaps them, and they tie again once both
are late), sends every step it waits in to ``decide_whole`` with every prompt listed
(``_mixed_deadline``; the index counts such deadlines as requests come and go).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

from ppas.core.config import require
from ppas.core.decision import Decision
from ppas.core.view import (
    RequestView,
    SchedulerView,
    WaitingLog,
    pending_prefills,
    uncached_prompt_tokens,
)
from ppas.cost.base import CostModel
from ppas.cost.steps import StepCosts
from ppas.policies.base import Policy, last_prefill_token_time
from ppas.policies.registry import register


@dataclass(frozen=True)
class FlowPrefillConfig:
    batch_tokens: int = 2048
    mbt: int = 16384

    def __post_init__(self) -> None:
        require(self.batch_tokens >= 1,
                f"batch_tokens must be >= 1, got {self.batch_tokens}")
        require(self.mbt >= self.batch_tokens,
                f"mbt must be >= batch_tokens={self.batch_tokens}, got {self.mbt}")


def listed(view: SchedulerView, order: list[RequestView], budget: int) -> tuple[str, ...]:
    """The ids of ``order`` (every pending prompt, in the policy's order) that a step with
    prefill budget ``budget`` can serve: every running one, and the waiting ones up to the
    last the engine could admit. The engine serves the running prompts first, then admits
    from the head of its waiting queue, the listed ones first, each taking at least one
    token of what the running ones leave of the budget (``L``; its uncached prompt where
    no prefix cache can grow within the step: ``SchedulerView.waiting_log`` and
    ``prefix_caching``), and no more
    than ``max_num_seqs`` less the running requests. So it never reaches an unlisted one,
    and the step is the one the whole order gives; the next step lists its head again
    (ties in the policy's key keep the queue's relative order either way, but for the
    pairs ``_mixed_deadline`` finds, whose order is listed whole). O(running +
    listed) for the engine, whatever waits. Only for an FCFS queue (a view with a
    ``waiting_log``): under ``--scheduling-policy priority`` the engine ranks the unlisted
    requests by arrival within their priority level, so an order cut short there could
    admit another request (the vLLM plugin, whose view has no log, gets the whole
    order)."""
    n_running = left = 0
    for r in view.requests:
        if not r.is_running:
            break
        n_running += 1
        left += max(0, r.prompt_tokens - r.num_computed_tokens)
    room = budget - left  # L
    slots = view.max_num_seqs - n_running
    # no prefix cache in an engine that says so: a waiting prompt needs its uncached
    exact = view.waiting_log is not None and not view.prefix_caching
    out: list[str] = []
    for r in order:
        if r.is_running:
            out.append(r.request_id)
        elif room > 0 and slots > 0:
            out.append(r.request_id)
            room -= uncached_prompt_tokens(r) if exact else 1
            slots -= 1
    return tuple(out)


def _mixed_deadline(pending: list[RequestView],
                    remaining: Callable[[RequestView], float]) -> bool:
    """Two waiting requests with a TTFT SLO share a deadline but not a remaining prefill
    time. Only such a pair can change places in the sort between steps and tie again
    later: their keys are equal while both are on time and while both are late, and
    differ only between the two flips. A step that lists every pending prompt moves the
    one on time ahead of the late one; a step cut by ``listed`` may leave them in the
    queue's order, and a later tie then reads that order. So with such a pair the order
    is listed whole (exact); without one, keys that tie stay tied (equal deadlines,
    equal flip times, or no SLO: key 0) and the sort keeps their queue order whether
    they were listed or not, so ``listed`` changes no later step."""
    seen: dict[float, float] = {}
    for r in pending:
        if r.is_running or r.ttft_slo is None:
            continue
        d, rem = r.arrival_time + r.ttft_slo, remaining(r)
        if seen.setdefault(d, rem) != rem:
            return True
    return False


@register("flowprefill")
class FlowPrefill(Policy):
    Config = FlowPrefillConfig
    history_window = 16

    def __init__(self, config: FlowPrefillConfig, spec: str | None = None) -> None:
        super().__init__(config, spec)
        self.costs: StepCosts | None = None
        self._index: _SlackIndex | None = None  # a cache of the views (module doc)

    def bind_cost_model(self, cost_model: CostModel | None) -> None:
        self._index = None
        self.costs = None if cost_model is None else StepCosts(
            cost_model, (self.config.batch_tokens,))

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.config.mbt)

    def decide(self, view: SchedulerView) -> Decision:
        if view.num_pending_prefills <= 1:
            return Decision(self.config.mbt)
        log = view.waiting_log
        if log is None or self.costs is None:  # (without a model the keys move each step)
            return self.decide_whole(view)
        d = self._decide_indexed(view, log)
        return d if d is not None else self.decide_whole(view)

    def decide_whole(self, view: SchedulerView) -> Decision:
        """The straightforward rule: every pending prompt keyed and sorted (stable: equal
        keys keep the view's order), O(n log n)."""
        cfg = self.config
        if view.num_pending_prefills <= 1:
            return Decision(cfg.mbt)
        pending = pending_prefills(view)
        now = view.now
        remaining = self._remaining_time(view)

        def key(r: RequestView) -> float:
            if r.ttft_slo is None:
                return 0.0
            deadline = r.arrival_time + r.ttft_slo
            slack = (deadline - now) - remaining(r)
            return (1.0 if slack >= 0 else -1.0) / max(deadline, 1e-9)

        pending.sort(key=key, reverse=True)
        if view.waiting_log is None or _mixed_deadline(pending, remaining):
            # (a queue that may not be FCFS, or a waiting pair whose order only a whole
            # listing keeps: every prompt listed)
            return Decision(cfg.batch_tokens, tuple(r.request_id for r in pending))
        return Decision(cfg.batch_tokens, listed(view, pending, cfg.batch_tokens))

    def _decide_indexed(self, view: SchedulerView, log: WaitingLog) -> Decision | None:
        """``decide_whole(view)`` from the index of the waiting queue (module doc), or
        None where the index cannot give it (a tie among the waiting requests read, a key
        that is not a positive 1/deadline): the caller then takes the whole rule."""
        cfg = self.config
        costs, c = self.costs, cfg.batch_tokens
        assert costs is not None
        now = view.now
        reqs = view.requests
        running: list[tuple[float, int, RequestView]] = []  # (-key, view position, r)
        n_running = left = 0
        for r in reqs:
            if not r.is_running:
                break
            p, done = r.prompt_tokens, r.num_computed_tokens
            if done < p:  # a pending prompt (is_pending_prefill, r running)
                left += p - done
                if r.ttft_slo is None:
                    key = 0.0
                else:
                    deadline = r.arrival_time + r.ttft_slo
                    slack = (deadline - now) - costs.prefill_time(c, done, p)
                    key = (1.0 if slack >= 0 else -1.0) / max(deadline, 1e-9)
                running.append((-key, n_running, r))
            n_running += 1
        idx = self._index
        if idx is None:
            idx = self._index = _SlackIndex(lambda r: costs.prefill_time(
                c, r.num_computed_tokens, r.prompt_tokens))
        if not idx.follow(view, log) or idx.n != len(reqs) - n_running:
            idx.rebuild(view, log, n_running)  # the log could not be followed
        if idx.odd or idx.mixed:
            return None
        running.sort()  # key descending, then view order (the whole sort is stable)
        out: list[str] = []
        room = c - left  # as ``listed``
        slots = view.max_num_seqs - n_running
        exact = not view.prefix_caching
        i, n_run = 0, len(running)
        if room > 0 and slots > 0:
            idx.promote(now)
            try:
                for key, w in idx.in_order(reqs, n_running):
                    while i < n_run and -running[i][0] >= key:  # running first if equal
                        out.append(running[i][2].request_id)
                        i += 1
                    out.append(w.request_id)
                    room -= uncached_prompt_tokens(w) if exact else 1
                    slots -= 1
                    if room <= 0 or slots <= 0:
                        break
            except _Tie:
                return None
            finally:
                idx.restore()
        out.extend(running[j][2].request_id for j in range(i, n_run))
        return Decision(cfg.batch_tokens, tuple(out))

    def _remaining_time(self, view: SchedulerView) -> Callable[[RequestView], float]:
        costs, c = self.costs, self.config.batch_tokens
        if costs is not None:
            return lambda r: costs.prefill_time(c, r.num_computed_tokens, r.prompt_tokens)
        per_tok = last_prefill_token_time(view.recent_steps) or 0.0
        return lambda r: per_tok * (r.prompt_tokens - r.num_computed_tokens)


class _Tie(Exception):
    """Two waiting requests read with equal keys: their order is the queue's (module doc)."""


class _Entry:
    """A waiting request with a TTFT SLO in ``_SlackIndex``: ``kpos`` = 1 / max(deadline,
    1e-9) (its key while on time; -kpos once late), its remaining prefill time."""

    __slots__ = ("r", "kpos", "deadline", "rem", "late")

    def __init__(self, r: RequestView, kpos: float, deadline: float, rem: float) -> None:
        self.r, self.kpos, self.deadline, self.rem = r, kpos, deadline, rem
        self.late = False


class _SlackIndex:
    """The waiting queue of one engine, kept between steps from its ``WaitingLog`` (each
    arrival, preemption and admission once) and read again whole only when the log cannot
    be followed (another engine's log, a trimmed log, the clock going back, a count that
    disagrees with the view). Indexed: the waiting requests with a TTFT SLO (``live``, by
    id), on time by key descending, late by key descending, and on time by the time
    ``deadline - remaining`` at which their slack turns negative (``promote``; a waiting
    request's remaining prefill time does not change, and the clock does not go back, so
    a late request stays late). Entries are dropped lazily (an entry counts while it is
    its id's live one); the heaps are rebuilt when stale entries outnumber live ones.
    ``n`` counts every waiting request, SLO or not."""

    def __init__(self, remaining: Callable[[RequestView], float]) -> None:
        self.remaining = remaining
        self.log: WaitingLog | None = None
        self.pos = 0
        self.now = -math.inf
        self.n = 0
        self.odd = 0  # live entries whose key is not a positive finite 1 / deadline
        # live entries by deadline, then remaining time (counts); ``mixed``: deadlines
        # with two remaining times or more (``_mixed_deadline``: the step is listed whole)
        self.groups: dict[float, dict[float, int]] = {}
        self.mixed = 0
        self.seq = 0  # (heap tie-break: never compares entries)
        self.live: dict[str, _Entry] = {}
        self.ontime: list[tuple[float, int, _Entry]] = []  # (-kpos, seq, e)
        self.late: list[tuple[float, int, _Entry]] = []  # (kpos, seq, e)
        self.flips: list[tuple[float, int, _Entry]] = []  # (deadline - rem, seq, e)
        self.popped: list[tuple[bool, tuple[float, int, _Entry]]] = []  # (late?, entry)

    def follow(self, view: SchedulerView, log: WaitingLog) -> bool:
        """Apply the log's events since the last step; False (nothing applied) when the
        log cannot be followed."""
        now = view.now
        if log is not self.log or self.pos < log.base or now < self.now:
            return False
        self.now = now
        end = log.end
        if self.pos == end:
            return True
        live = self.live
        for entered, r in log.events[self.pos - log.base:]:
            if entered:
                self.add(r, now)
            else:
                self.n -= 1
                e = live.pop(r.request_id, None)
                if e is not None:
                    self._ungroup(e)
                    if not e.kpos > 0:
                        self.odd -= 1
        self.pos = end
        if len(self.ontime) + len(self.late) + len(self.flips) > 4 * len(live) + 256:
            self.compact()
        return True

    def rebuild(self, view: SchedulerView, log: WaitingLog, n_running: int) -> None:
        self.log, self.pos, self.now = log, log.end, view.now
        self.n = self.odd = self.mixed = 0
        self.live.clear()
        self.groups.clear()
        for h in (self.ontime, self.late, self.flips):
            h.clear()
        for r in islice(view.requests, n_running, None):
            self.add(r, view.now)

    def add(self, r: RequestView, now: float) -> None:
        """A request entering the waiting queue: its key as ``decide_whole`` makes it."""
        self.n += 1
        slo = r.ttft_slo
        if slo is None:
            return
        rid = r.request_id
        deadline = r.arrival_time + slo
        kpos = 1.0 / max(deadline, 1e-9)
        rem = self.remaining(r)
        e = _Entry(r, kpos, deadline, rem)
        old = self.live.get(rid)
        if old is not None:
            self._ungroup(old)
            if not old.kpos > 0:
                self.odd -= 1
        self.live[rid] = e
        if kpos > 0:  # (odd entries send every step to the whole rule anyway)
            g = self.groups.setdefault(deadline, {})
            g[rem] = g.get(rem, 0) + 1
            if len(g) == 2 and g[rem] == 1:
                self.mixed += 1
        if not kpos > 0:  # (an infinite or NaN deadline: keyed as no SLO, or unordered)
            self.odd += 1
        self.seq = seq = self.seq + 1
        if (deadline - now) - rem >= 0:
            heapq.heappush(self.ontime, (-kpos, seq, e))
            heapq.heappush(self.flips, (deadline - rem, seq, e))
        else:
            e.late = True
            heapq.heappush(self.late, (kpos, seq, e))

    def _ungroup(self, e: _Entry) -> None:
        """``e`` leaves its deadline's group (grouped where its key is a positive 1 /
        deadline)."""
        if not e.kpos > 0:
            return
        g = self.groups[e.deadline]
        n = g[e.rem] - 1
        if n:
            g[e.rem] = n
            return
        del g[e.rem]
        if len(g) == 1:
            self.mixed -= 1
        elif not g:
            del self.groups[e.deadline]

    def compact(self) -> None:
        """The heaps again from the live entries only."""
        live = self.live.values()
        self.ontime[:] = [(-e.kpos, i, e) for i, e in enumerate(live) if not e.late]
        self.flips[:] = [(e.deadline - e.rem, i, e) for i, e in enumerate(live)
                         if not e.late]
        self.late[:] = [(e.kpos, i, e) for i, e in enumerate(live) if e.late]
        self.seq = len(self.live)
        for h in (self.ontime, self.late, self.flips):
            heapq.heapify(h)

    def promote(self, now: float) -> None:
        """Move the requests late at ``now`` (slack < 0, tested as ``decide_whole`` tests
        it) to the late heap. Candidates come from the heap of ``deadline - remaining``,
        with a margin far above its rounding."""
        flips, live = self.flips, self.live
        lim = now + 1e-6 * (1.0 + abs(now))
        retry = []
        while flips and flips[0][0] <= lim:
            item = heapq.heappop(flips)
            e = item[2]
            if e.late or live.get(e.r.request_id) is not e:
                continue
            if (e.deadline - now) - e.rem >= 0:
                retry.append(item)
            else:
                e.late = True
                heapq.heappush(self.late, (e.kpos, item[1], e))
        for item in retry:
            heapq.heappush(flips, item)

    def _pop(self, heap: list[tuple[float, int, _Entry]], late: bool) -> _Entry | None:
        """The live head of ``heap`` popped (kept in ``popped`` for ``restore``), or None;
        _Tie if the next live one has the same key."""
        live = self.live
        while heap:
            item = heapq.heappop(heap)
            e = item[2]
            if e.late is not late or live.get(e.r.request_id) is not e:
                continue  # stale: dropped for good
            self.popped.append((late, item))
            while heap:  # the next live one: an equal key is a tie
                nxt = heap[0][2]
                if nxt.late is not late or live.get(nxt.r.request_id) is not nxt:
                    heapq.heappop(heap)
                    continue
                if heap[0][0] == item[0]:
                    raise _Tie
                break
            return e
        return None

    def in_order(self, requests: Sequence[RequestView], n_running: int
                 ) -> Iterator[tuple[float, RequestView]]:
        """The waiting requests as (key, request), key descending: on time, then those
        without an SLO in the queue's order, then late (``restore`` after reading)."""
        while (e := self._pop(self.ontime, False)) is not None:
            yield e.kpos, e.r
        for r in islice(requests, n_running, None):
            if r.ttft_slo is None:
                yield 0.0, r
        while (e := self._pop(self.late, True)) is not None:
            yield -e.kpos, e.r

    def restore(self) -> None:
        for late, item in self.popped:
            heapq.heappush(self.late if late else self.ontime, item)
        self.popped.clear()
