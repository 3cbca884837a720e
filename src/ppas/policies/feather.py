"""Feather: prefix-homogeneous batches via a chunked hash tree (arXiv 2605.06046).

Spec related-policies.md [R code structure]. On prefix-sharing workloads, a batch whose
requests share prefixes beats a larger mixed one: shared blocks are computed once and
stay cached (our simulator and vLLM's prefix cache model this part) and decode attention
over a shared prefix is cheaper on kernels that read it once (not modelled: our cost
model and vLLM-CPU have no cascade attention).

* Chunked hash tree [R]: a request's level-``j`` key is the cumulative hash of its first
  ``(j + 1) * chunk`` prompt tokens (``chunk`` = 512), read off the engine's chained block
  hashes (``RequestView.block_hashes``: block ``(j + 1) * chunk / block_size - 1``). The
  keys of the running batch form a reference-counted working set; a waiting request's
  overlap with the batch is ``1 + max{j : key_j in working set}`` levels (chained keys:
  level j present implies every lower level is). A lazy max-heap over waiting requests
  returns the one with most overlap; entries are pushed again when a key enters the
  working set and stale ones are skipped on pop, so a greedy batch costs O(levels)
  amortised per request instead of radix-tree walks.
* ADD/STOP, our reading [I] (the paper trains an RL agent for it): take the best waiting
  request while it shares at least ``min_overlap`` levels with the batch, or at least
  ``cached_fraction`` of its prompt is in the prefix cache anyway
  (``RequestView.num_cached_tokens``: admitting it costs little and evicts little), or
  the batch (running + added) has fewer than ``min_batch`` requests; STOP at the first
  that does none of these. Stopped requests get no budget this step (the prefill budget
  covers exactly the running prefills and the added requests' uncached prompt tokens).
* Starvation bound (ours): a request waiting ``max_wait_s`` or longer goes before every
  other waiting request, FCFS among such requests, regardless of ADD/STOP. So no request
  that arrived later is first scheduled after ``arrival + max_wait_s`` ahead of it
  (tested with hypothesis in the simulator).

The policy is pure: the tree is rebuilt from the view every step; the paper maintains it
incrementally across steps. Per step: one pass over the view, the level keys of the
waiting requests not yet aged (read once per request: ``Feather.keys_of``), and O(1 +
shared levels) per batch request (``Feather.decide``). The aged requests' FCFS order
keeps the queue's order among equal arrivals, which depends on earlier steps, so
without a ``waiting_log`` the view is read whole every step (O(queue), in C). Where the
view has one, the last step's aged list is kept and checked against the view
(``_Aged``): the requests that left it are its head and the rest still heads the queue
(one list comparison, in C), and the aged requests' keys are kept in a trie. The waiting
requests are followed by the log too (their arrivals in a heap, those with keys
counted), so the newly aged ones come from the heap (the view's rest is read whole only
where two of them arrived at once) and the fresh ones are read only as far as the
greedy goes: without keys among them (no block hashes: no prefix caching) the greedy
takes them in the queue's order (every overlap 0) and under a long queue STOPs at the
first. The decision lists the kept head again and says so (``Decision.order_kept``), so
an engine that keeps its queue in the last order (the simulator) moves only the rest.
The aged list's ids are appended once each to a log of ids (``ppas.core.order.IdLog``)
and the order is read off it (``LoggedOrder``: no tuple of the aged ids), so an engine
that follows it (the simulator) knows its front from two numbers and says so in the
waiting log (``WaitingLog.front``), which spares the comparison of the view's head. A
step then costs O(the changes), where the engine follows the order; O(aged) in C where
the view's head is compared instead.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from itertools import chain, compress, repeat, takewhile
from operator import attrgetter, ge, lt, sub
from operator import neg as negated
from typing import Any, cast

from ppas.core.config import check_times, require
from ppas.core.decision import Decision
from ppas.core.order import IdLog, LoggedOrder
from ppas.core.view import (
    BLOCK_SIZE,
    RequestView,
    SchedulerView,
    WaitingLog,
    uncached_prompt_tokens,
)
from ppas.policies.base import Policy
from ppas.policies.registry import register


@dataclass(frozen=True)
class FeatherConfig:
    budget: int = 8192  # the engine's max_num_batched_tokens
    chunk: int = 512  # tokens per hash-tree level [R]
    min_overlap: int = 1  # levels shared with the batch for ADD [I]
    min_batch: int = 4  # ADD regardless of overlap below this batch size [I]
    cached_fraction: float = 0.5  # ADD a request this much of whose prompt is cached [I]
    max_wait_s: float = 30.0  # starvation bound (ours)
    block_size: int = BLOCK_SIZE  # tokens per entry of RequestView.block_hashes

    def __post_init__(self) -> None:
        require(self.budget >= 1, f"budget must be >= 1, got {self.budget}")
        require(self.block_size >= 1, "block_size must be >= 1")
        require(self.chunk >= self.block_size and self.chunk % self.block_size == 0,
                f"chunk must be a multiple of block_size={self.block_size}, "
                f"got {self.chunk}")
        require(self.min_overlap >= 0, "min_overlap must be >= 0")
        require(self.min_batch >= 0, "min_batch must be >= 0")
        require(0 < self.cached_fraction <= 1,
                f"cached_fraction must be in (0, 1], got {self.cached_fraction}")
        check_times(self, "max_wait_s")


def level_keys(r: RequestView, chunk: int, block_size: int) -> list[Hashable]:
    """The request's hash-tree keys: the chained hash of its first (j + 1) * chunk prompt
    tokens, for every whole chunk of the prompt its engine has hashed."""
    hashes = r.block_hashes
    per = chunk // block_size
    n = min(r.prompt_tokens // chunk, len(hashes) // per)
    return [hashes[(j + 1) * per - 1] for j in range(n)]


class ChunkedHashTree:
    """Working set of the batch's level keys (reference-counted), an index from key to
    the waiting requests that have it, and a lazy max-heap of waiting requests by overlap
    (ties: lower ``rank``, i.e. engine order)."""

    def __init__(self) -> None:
        self.working: dict[Hashable, int] = {}
        self.index: dict[Hashable, list[tuple[int, int]]] = {}  # key -> (request, level)
        self.overlap: list[int] = []
        self.taken: list[bool] = []
        self.heap: list[tuple[int, int]] = []  # (-overlap, request)

    def add_waiting(self, keys: Sequence[Hashable]) -> int:
        i = len(self.overlap)
        ov = 0
        for j, k in enumerate(keys):
            self.index.setdefault(k, []).append((i, j))
            if k in self.working:
                ov = j + 1
        self.overlap.append(ov)
        self.taken.append(False)
        heappush(self.heap, (-ov, i))
        return i

    def add_batch(self, keys: Sequence[Hashable]) -> None:
        """A request joins the batch: its keys enter the working set; waiting requests
        that gain overlap get a fresh heap entry (the old one goes stale)."""
        for k in keys:
            c = self.working.get(k, 0)
            self.working[k] = c + 1
            if c:
                continue
            for i, j in self.index.get(k, ()):
                if not self.taken[i] and j + 1 > self.overlap[i]:
                    self.overlap[i] = j + 1
                    heappush(self.heap, (-(j + 1), i))

    def pop_best(self) -> tuple[int, int] | None:
        """(request, overlap) of the untaken waiting request with most overlap."""
        while self.heap:
            neg, i = heappop(self.heap)
            if self.taken[i] or -neg != self.overlap[i]:
                continue  # stale entry
            self.taken[i] = True
            return i, -neg
        return None


@register("feather")
class Feather(Policy):
    Config = FeatherConfig

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.config.budget)

    def __init__(self, config: FeatherConfig, spec: str | None = None) -> None:
        super().__init__(config, spec)
        # A request's level keys by id, with the request and hashes they were read from
        # and the hashes' length (a request's block hashes do not change: read once; a
        # cache of the views).
        self._keys: dict[str, tuple[RequestView, Sequence[Hashable], int, list[Hashable]]] = {}
        # The last step's aged requests and their keys (a cache of the views, checked
        # against each: ``_Aged``), kept where views have a waiting log.
        self._aged = _Aged(self.keys_of)

    def keys_of(self, r: RequestView) -> list[Hashable]:
        """``level_keys(r, chunk, block_size)``, cached by request id (checked against the
        request and hashes objects and the hashes' length)."""
        hashes = r.block_hashes
        e = self._keys.get(r.request_id)
        if e is not None and e[0] is r and e[1] is hashes and e[2] == len(hashes):
            return e[3]
        keys = level_keys(r, self.config.chunk, self.config.block_size)
        self._keys[r.request_id] = (r, hashes, len(hashes), keys)
        return keys

    def decide(self, view: SchedulerView) -> Decision:
        """The greedy of the module doc, from one pass over the view. Equal to building
        the whole ``ChunkedHashTree``: only the keys of waiting requests not yet aged
        (``fresh``) are indexed; a batch request's keys enter the working set from level 0
        up to the first that no fresh request has (chained keys: no deeper one has one
        either); the prefill budget is summed only where a STOP needs it, until it
        reaches ``budget``. The view lists the running requests first."""
        cfg = self.config
        now, max_wait = view.now, cfg.max_wait_s
        requests = view.requests
        n = len(requests)
        if len(self._keys) > 2 * n + 1024:
            self._keys.clear()  # (requests gone: O(1) amortised per request read)
        log = view.waiting_log
        kept = self._aged
        fresh: Sequence[RequestView]
        ids: Sequence[str]  # the aged requests' (an order read off a log where kept)
        if log is not None:
            # (n_run: the running requests, at the view's head; m: the order's first m
            # ids are the view's first m waiting requests; keyed: some fresh request has a
            # level key)
            n_run, aged, ids, fresh, m, keyed = kept.split(now, max_wait, requests, n, log)
            if n_run == n:
                return Decision(cfg.budget)  # nothing waits
        else:
            n_run = _running(requests)
            if n_run == n:
                return Decision(cfg.budget)  # nothing waits
            aged, fresh = age(now, max_wait, _listed(requests[n_run:]))
            ids, m = list(map(_request_id, aged)), 0
            keyed = any(map(_block_hashes, fresh))  # (no block hashes, no keys)
        n_fresh = len(fresh)
        if not n_fresh:
            return Decision(cfg.budget, _listing(ids, []), order_kept=m)
        order: list[str] = []  # the fresh requests added, after the aged ones (ids)
        keys_of = self.keys_of
        index: dict[Hashable, list[tuple[int, int]]] = {}  # key -> (fresh request, level)
        if keyed:
            fresh = _listed(fresh)
            keys = [keys_of(r) for r in fresh]
            for i, ks in enumerate(keys):
                for j, k in enumerate(ks):
                    lst = index.get(k)
                    if lst is None:
                        index[k] = [(i, j)]
                    else:
                        lst.append((i, j))
        batch = n_run + len(aged)
        added: list[RequestView] = []
        stopped = False
        if not index:
            # No fresh request has a key: every overlap is 0 and stays 0 (an added request
            # adds no key), so the heap below pops the fresh requests in their order.
            for r in fresh:
                if (batch > 0 and batch >= cfg.min_batch and 0 < cfg.min_overlap
                        and r.num_cached_tokens < cfg.cached_fraction * r.prompt_tokens):
                    stopped = True  # STOP (as below, with ov = 0)
                    break
                order.append(r.request_id)
                added.append(r)
                batch += 1
            return self._decision(stopped, requests[:n_run], aged, added, ids, order, m)
        working: set[Hashable] = set()  # the batch's keys that fresh requests have
        for r in requests[:n_run]:  # (the running requests' keys: the batch's)
            for k in keys_of(r):
                if k not in index:
                    break
                working.add(k)
        if log is not None:
            kept.reach(index, working)  # (the aged requests' keys, as the loop below)
        else:
            for r in aged:
                for k in keys_of(r):
                    if k not in index:
                        break
                    working.add(k)
        overlap = [0] * n_fresh
        for k in working:
            for i, j in index[k]:
                if j >= overlap[i]:
                    overlap[i] = j + 1
        fresh = cast(list[RequestView], fresh)  # (keyed: a list, made above)
        heap = list(zip(map(negated, overlap), range(n_fresh), strict=True))  # (-ov, i), in C
        if working:
            heapify(heap)  # (else every overlap is 0: the list is sorted, a heap already)
        taken = [False] * n_fresh
        while heap:
            neg, i = heappop(heap)
            ov = -neg
            if taken[i] or ov != overlap[i]:
                continue  # stale entry
            taken[i] = True
            r = fresh[i]
            if (batch > 0 and batch >= cfg.min_batch and ov < cfg.min_overlap
                    and r.num_cached_tokens < cfg.cached_fraction * r.prompt_tokens):
                stopped = True  # STOP: the best candidate does not belong to this batch
                break
            order.append(r.request_id)
            added.append(r)
            batch += 1
            for k in keys[i]:  # its keys join the working set: others gain overlap
                if k in working:
                    continue
                working.add(k)
                for i2, j in index[k]:
                    if not taken[i2] and j + 1 > overlap[i2]:
                        overlap[i2] = j + 1
                        heappush(heap, (-(j + 1), i2))
        return self._decision(stopped, requests[:n_run], aged, added, ids, order, m)

    def _decision(self, stopped: bool, running: Sequence[RequestView],
                  aged: Sequence[RequestView], added: list[RequestView],
                  ids: Sequence[str], order: list[str], m: int) -> Decision:
        """The greedy's decision: the whole budget unless it STOPped, else the running
        prompts' tokens left and the listed requests' uncached prompts, summed only until
        they reach the budget; the aged requests' ``ids`` listed, then the added ones'
        (``order``), the first ``m`` the view's (``Decision.order_kept``). The listed
        requests are summed first and the running prompts only if those stay under the
        budget (all terms >= 0: a sum that reaches it with them reaches it with the
        running prompts first too, and the budget is then the whole)."""
        cfg = self.config
        listed = _listing(ids, order)
        if not stopped:
            return Decision(cfg.budget, listed, order_kept=m)
        budget = 0  # the listed requests' uncached prompts, then the running prompts
        for r in chain(aged, added):
            if budget >= cfg.budget:
                break
            budget += uncached_prompt_tokens(r)
        if budget < cfg.budget:  # (in C: the running prompts' tokens left)
            budget += sum(map(max, repeat(0), map(sub, map(_prompt_tokens, running),
                                                  map(_num_computed_tokens, running))))
        return Decision(min(cfg.budget, budget), listed, order_kept=m)


def age(now: float, max_wait: float, waiting: list[RequestView]
        ) -> tuple[list[RequestView], list[RequestView]]:
    """The waiting requests aged (``now - arrival >= max_wait``), FCFS (a stable sort:
    the queue's order among equal arrivals), and the others in the queue's order
    (``waiting`` itself where none is aged)."""
    # (the waits now - arrival, tested against max_wait_s as written, in C; the largest
    # is now - the earliest arrival: a float difference is monotone in each term)
    if not waiting or now - min(map(_arrival, waiting)) < max_wait:
        return [], waiting  # (none aged: every wait tested by the largest's)
    waits = list(map(sub, repeat(now), map(_arrival, waiting)))
    aged = list(compress(waiting, map(ge, waits, repeat(max_wait))))
    fresh = list(compress(waiting, map(lt, waits, repeat(max_wait))))
    aged.sort(key=_arrival)  # starvation bound: first, FCFS (stable: queue order)
    return aged, fresh


class _Aged:
    """The last step's aged requests (``age``'s list), their ids, and their level keys as
    a trie, kept between steps of one engine and checked against each view.

    ``age`` of this step's waiting list is the last list less its head (the requests the
    log shows leaving since: its first ``gone``, none back), followed by the requests
    behind them in the queue that are aged now, sorted, when (a) the clock did not go
    back (an aged request stays aged: ``now - arrival`` only grows), (b) the queue starts
    with the rest of the last list, in its order (so those precede every other aged
    request in the queue), and (c) the first newly aged request did not arrive before
    the last of the rest (the rest is sorted: the stable sort of the whole leaves it in
    front); requests put back in front of the rest (preempted) join its head first where
    they are aged, in arrival order and no later than its first (``_lead``). Otherwise
    ``age`` of the whole, and everything is read again. The list's
    equality rests on (a)-(c) alone; the log says how many of its head to drop, and that
    the others stayed in the queue since their keys were read.

    Trie: a node per distinct key prefix ``keys[:j + 1]`` of a kept request,
    ``[count, children]`` under its last key, its count the kept requests whose keys
    start with it (a node leaves at 0). A request's keys are read once, when it joins
    the list: it waits until it leaves the list (a re-entry in the log resets it), and a
    waiting request's block hashes do not change (``SchedulerView``)."""

    def __init__(self, keys_of: Callable[[RequestView], list[Hashable]]) -> None:
        self.keys_of = keys_of
        self.log: WaitingLog | None = None
        self.pos = 0  # the log's next event to read
        self.now = -float("inf")
        self.reqs: list[RequestView] = []  # the last aged list
        self.ids = IdLog()  # their ids from ``lo`` on (earlier ones: of earlier lists)
        self.lo = 0
        self.keys: list[list[Hashable]] = []  # their keys
        self.at: dict[str, int] = {}  # id -> base + its index in reqs
        self.base = 0
        self.roots: dict[Hashable, list[Any]] = {}
        self.aged_keyed = 0  # the list's requests with a level key
        # The waiting requests, as the log shows them (a cache of the views, checked
        # against each by the number of running requests it gives): id -> (its entry's
        # number, it has a level key), the number of them with a key, and a lazy
        # min-heap of (arrival, entry's number, request) holding every one not in the
        # list (an entry is stale once its request left, came back or joined the list;
        # one that joined stays in it while it waits: an aged request stays aged while
        # the clock does not go back, and the heap is read again where it does).
        self.waiting: dict[str, tuple[int, bool]] = {}
        self.keyed = 0
        self.entered = 0  # the requests the log shows entering since the last step
        self.arrivals: list[tuple[float, int, RequestView]] = []

    def split(self, now: float, max_wait: float, requests: Sequence[RequestView], n: int,
              log: WaitingLog) -> tuple[int, list[RequestView], LoggedOrder,
                                        Sequence[RequestView], int, bool]:
        """The running requests at the head of the view's ``requests`` (``n`` of them in
        all), then ``age(now, max_wait, waiting)`` of the waiting ones behind, the aged
        requests' ids, how many of the aged list's head are the view's first waiting
        requests (the kept ones, 0 when the list is made again), and whether a fresh
        request has a level key; the trie brought up to the aged list. The aged list and
        the ids are the ones kept (read them, do not change them). Where the kept list
        holds, the view is read by one slice, the kept head (compared, identity first);
        the newly aged requests come from the heap of arrivals where no two of them
        arrived at once (sorted by arrival, then: ``age``'s stable sort), else from the
        rest of the view, read whole. The fresh requests are then ``requests[n_run +
        m:]`` less the newly aged, read as the greedy goes (``_Tail``). The list's first
        ``gone`` requests are dropped first (it is made again where it does not hold)."""
        n_run, gone = self._follow(now, log, requests, n)
        if n_run == n:  # nothing waits: no aged list
            self._clear()
            return n_run, self.reqs, self._order(), [], 0, False
        if gone >= 0:
            self._drop(gone)
            reqs = self.reqs
            m = len(reqs)
            # (b): the engine says so (the log's front: the list's ids onward, the
            # requests the list holds), else the view's head compared, identity first
            front = log.front
            same = (front is not None and front.log is self.ids and front.lo == self.lo
                    and front.hi - front.lo >= m) or _listed(requests[n_run:n_run + m]) == reqs
            if not same and m and self.entered and self._lead(now, max_wait, requests,
                                                               n_run, n):
                m = len(reqs)  # (requests back in front of the list joined its head)
                same = _listed(requests[n_run:n_run + m]) == reqs
            if same:
                fresh: Sequence[RequestView]
                start = n_run + m
                newly = self._newly(now, max_wait)
                if newly is None:  # (equal arrivals: the queue's order ranks them)
                    newly, fresh = age(now, max_wait, _listed(requests[start:]))
                else:
                    fresh = _Tail(requests, start, n - start - len(newly),
                                  {r.request_id for r in newly})
                if not (m and newly and newly[0].arrival_time < reqs[-1].arrival_time):
                    self._join(newly)  # (c) holds
                    return n_run, reqs, self._order(), fresh, m, self.keyed > self.aged_keyed
        aged, fresh = age(now, max_wait, _listed(requests[n_run:]))
        self._clear()
        self._join(aged)
        return n_run, self.reqs, self._order(), fresh, 0, self.keyed > self.aged_keyed

    def _clear(self) -> None:
        """An empty list."""
        self.reqs, self.keys, self.at, self.base = [], [], {}, 0
        self.ids, self.lo = IdLog(), 0
        self.roots = {}
        self.aged_keyed = 0

    def _follow(self, now: float, log: WaitingLog, requests: Sequence[RequestView],
                n: int) -> tuple[int, int]:
        """Bring the waiting requests up to the view (by the log's events since the last
        step, or from the view where the log cannot tell, the clock went back or the
        number of running requests the log gives does not split the view into running
        then waiting ones) and return that number and how many of the last list's head
        left the queue since the last step; -1 for the latter when that is not all that
        changed in the list (or the log cannot tell)."""
        if log is not self.log or self.pos < log.base or now < self.now:
            return self._read(now, log, requests), -1
        at, base = self.at, self.base
        waiting, arrivals, keys_of = self.waiting, self.arrivals, self.keys_of
        gone, last, kept = 0, base - 1, True
        num = self.pos
        events = log.events[self.pos - log.base:]
        self.entered = 0
        for entered, r in events:
            rid = r.request_id
            if entered:
                self.entered += 1
                has = bool(keys_of(r))
                waiting[rid] = (num, has)
                self.keyed += has
                heappush(arrivals, (r.arrival_time, num, r))
                if rid in at:
                    kept = False  # (it left and came back: no longer the request kept)
            else:
                e = waiting.pop(rid, None)
                if e is not None:
                    self.keyed -= e[1]
                i = at.get(rid)
                if i is not None:
                    gone += 1
                    if i > last:
                        last = i
            num += 1
        self.pos, self.now = num, now
        n_run = n - len(waiting)
        if not (0 <= n_run <= n and (n_run == 0 or requests[n_run - 1].is_running)
                and (n_run == n or not requests[n_run].is_running)):
            return self._read(now, log, requests), -1  # (the log does not tell the view)
        return n_run, gone if kept and last - base == gone - 1 else -1  # (distinct: a prefix)

    def _read(self, now: float, log: WaitingLog, requests: Sequence[RequestView]) -> int:
        """The waiting requests read from the view (``_follow``); the running ones'
        number."""
        keys_of = self.keys_of
        n_run = _running(requests)
        waiting: dict[str, tuple[int, bool]] = {}
        arrivals: list[tuple[float, int, RequestView]] = []
        keyed = 0
        for num, r in enumerate(_listed(requests[n_run:]), -len(requests)):
            has = bool(keys_of(r))
            waiting[r.request_id] = (num, has)
            keyed += has
            arrivals.append((r.arrival_time, num, r))
        heapify(arrivals)
        self.waiting, self.arrivals, self.keyed = waiting, arrivals, keyed
        self.entered = 0
        self.log, self.pos, self.now = log, log.end, now
        return n_run

    def _newly(self, now: float, max_wait: float) -> list[RequestView] | None:
        """The waiting requests outside the list that are aged (``age``'s test), taken
        from the heap by arrival (its stale entries dropped), or None where two of them
        arrived at once (they are taken all the same: they join the list)."""
        arrivals, waiting, at = self.arrivals, self.waiting, self.at
        out: list[RequestView] = []
        tie = False
        while arrivals:
            t, num, r = arrivals[0]
            rid = r.request_id
            e = waiting.get(rid)
            if e is None or e[0] != num or rid in at:
                heappop(arrivals)  # (stale)
                continue
            if now - t < max_wait:
                break  # (the earliest of the rest waited less: none of them is aged)
            heappop(arrivals)
            if out and t == out[-1].arrival_time:
                tie = True
            out.append(r)
        return None if tie else out

    def _drop(self, n: int) -> None:
        """The list's first ``n`` requests leave it."""
        if not n:
            return
        at = self.at
        for r, keys in zip(self.reqs[:n], self.keys[:n], strict=True):
            del at[r.request_id]
            if keys:
                self.aged_keyed -= 1
            node = self.roots
            for k in keys:
                e = node[k]
                e[0] -= 1
                if not e[0]:
                    del node[k]  # (no kept request has this prefix, nor a longer one)
                    break
                node = e[1]
        del self.reqs[:n], self.keys[:n]
        self.base += n
        self.lo += n
        if self.lo > 2 * len(self.reqs) + 4096:  # (the log's ids gone: O(1) amortised)
            self._relog()

    def _join(self, reqs: list[RequestView]) -> None:
        """``reqs`` join the end of the list."""
        at, keys_of = self.at, self.keys_of
        i = self.base + len(self.reqs)
        for r in reqs:
            rid = r.request_id
            at[rid] = i
            i += 1
            keys = keys_of(r)
            if keys:
                self.aged_keyed += 1
                self._grow(keys)
            self.keys.append(keys)
        self.ids.extend(list(map(_request_id, reqs)))
        self.reqs.extend(reqs)

    def _relog(self) -> None:
        """The list's ids in a log of their own (the last one's are never changed: the
        orders read off it stay what they were)."""
        self.ids, self.lo = IdLog(), 0
        self.ids.extend(list(map(_request_id, self.reqs)))

    def _order(self) -> LoggedOrder:
        """The list's ids, as an order."""
        return self.ids.order(self.lo, self.lo + len(self.reqs))

    def _grow(self, keys: list[Hashable]) -> None:
        """The trie gains a kept request's keys."""
        node = self.roots
        for k in keys:
            e = node.get(k)
            if e is None:
                e = node[k] = [0, {}]
            e[0] += 1
            node = e[1]

    def _lead(self, now: float, max_wait: float, requests: Sequence[RequestView],
              start: int, n: int) -> bool:
        """Where the view's waiting requests (``requests[start:n]``) start with a few
        others (at most the log's entries since the last step: preempted requests put
        back in front) and then the list's first, and those few are aged, not in the
        list, in arrival order and arrived no later than the list's first: they join the
        list's head (True). ``age`` of the queue then starts with them, then the list:
        its stable sort leaves them in front (equal arrivals: queue order). The caller
        checks the rest of the list against the view."""
        first, at = self.reqs[0], self.at
        lead: list[RequestView] = []
        for r in requests[start:min(n, start + self.entered + 1)]:
            if r is first:
                break
            t = r.arrival_time
            if r.request_id in at or now - t < max_wait or (lead and t < lead[-1].arrival_time):
                return False
            lead.append(r)
        else:
            return False
        if not lead or lead[-1].arrival_time > first.arrival_time:
            return False
        self.base -= len(lead)
        keys = list(map(self.keys_of, lead))
        for i, (r, ks) in enumerate(zip(lead, keys, strict=True), self.base):
            at[r.request_id] = i
            if ks:
                self.aged_keyed += 1
                self._grow(ks)
        self.reqs[:0] = lead
        self.keys[:0] = keys
        self._relog()
        return True

    def reach(self, index: dict[Hashable, Any], working: set[Hashable]) -> None:
        """Add to ``working`` the keys ``keys[j]`` of every kept request whose keys
        ``keys[:j + 1]`` are all in ``index`` (``decide``'s loop over the aged requests):
        the trie's nodes reached from the roots through keys in ``index``."""
        stack = [self.roots]
        while stack:
            node = stack.pop()
            for k in node.keys() & index.keys():
                working.add(k)
                children = node[k][1]
                if children:
                    stack.append(children)


class _Tail(Sequence[RequestView]):
    """``requests[start:]`` of a view but the requests whose ids are in ``skip`` (``n``
    of them left), read as it is iterated: by slices twice as long each time (O(1) for
    the first request; O(n) for all n)."""

    __slots__ = ("requests", "start", "n", "skip")

    def __init__(self, requests: Sequence[RequestView], start: int, n: int,
                 skip: set[str]) -> None:
        self.requests, self.start, self.n, self.skip = requests, start, n, skip

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[RequestView]:
        reqs, i, size, skip = self.requests, self.start, 1, self.skip
        end = len(reqs)
        while i < end:
            part = reqs[i:i + size]
            if skip:
                yield from (r for r in part if r.request_id not in skip)
            else:
                yield from part
            i += size
            size *= 2

    def __getitem__(self, i):  # type: ignore[no-untyped-def,override]
        return list(self)[i]


def _listing(ids: Sequence[str], order: list[str]) -> tuple[str, ...] | LoggedOrder:
    """The aged requests' ids then the added ones' (``ids`` itself where it is an order
    read off a log: its ids shared, not copied)."""
    if isinstance(ids, LoggedOrder):
        return ids.then(tuple(order)) if order else ids
    return tuple([*ids, *order])


def _running(requests: Sequence[RequestView]) -> int:
    """The number of running requests at the head of ``requests`` (in C)."""
    return len(list(takewhile(_is_running, requests)))


def _listed(part: Sequence[RequestView]) -> list[RequestView]:
    """A slice of the view's requests as a list (itself where it is one)."""
    return part if type(part) is list else list(part)


_arrival = attrgetter("arrival_time")
_is_running = attrgetter("is_running")
_num_computed_tokens = attrgetter("num_computed_tokens")
_prompt_tokens = attrgetter("prompt_tokens")
_block_hashes = attrgetter("block_hashes")
_request_id = attrgetter("request_id")
