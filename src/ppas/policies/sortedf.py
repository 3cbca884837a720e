"""Sorted-F: KV-budgeted batching for an offline backlog (arXiv 2508.06133).

Spec related-policies.md [R abstract]. Model: n requests at time 0; request i needs
``s_i`` KV units for its prompt and one more per generated token, up to ``o_i`` outputs;
the requests in a batch may never hold more than the budget ``M``; objective: the sum of
completion times. NP-hard; FCFS and (memory-constrained) shortest-first can be
arbitrarily bad; Sorted-F repeatedly forms the feasible batch minimising the F-metric and
has a constant-factor guarantee (paper: up to ~30% lower mean latency than FCFS / MC-SF).

Our reading [I], kept replaceable (``metric``):

* ``metric=f``: ``F(X) = sum_{i in X} o_i / |X|^2`` (mean output over batch size: a batch
  is worth its size, costs its outputs). The paper's definition could not be checked
  from here (no access to the paper); this is the spec's stated form.
* Batch formation, per step (a stateless policy): the current batch is the running
  requests with their *remaining* outputs; waiting requests are taken in ascending
  ``o_i`` ("sorted"), skipping any whose footprint ``s_i + o_i`` (whole blocks) does not
  fit beside the batch's, while adding the next one does not raise F. On an idle engine
  this forms exactly the sorted prefix that minimises F among prefixes; later it tops
  the batch up as requests finish.
* ``metric=none``: add every sorted request that fits: memory-constrained
  shortest-first (MC-SF), the paper's baseline.

The budget check uses whole footprints, so the engine never preempts: peak KV of the
admitted set <= M. ``kv_tokens`` None = the bound cost model's KV capacity (unbounded if
it has none). ``o_i`` is ``max_output_tokens`` (the offline model knows output lengths).

Cost per step. The rule above sorts the waiting queue (``decide_whole``, taken where the
view has no ``waiting_log``). With one, the waiting requests are kept between steps by
footprint, each footprint's in the sorted order (``_FootprintIndex``), and the batch is
formed by asking, as often as it grows, for the first request in the sorted order whose
footprint fits the room left: the request the sorted walk would reach next, since those
it skips did not fit an earlier, larger room and the room only shrinks. The F test
breaks the walk on that request exactly as on the walk's. A step that finds the index
and the room of the last walk unchanged (no queue change, no running request gone)
reuses the requests that walk reached and only tests F again; so does a step whose
queue changed only in ways that walk can be carried over (``_carried``: the first
requests it took admitted, arrivals it would not reach, others gone). The running
requests' footprints are summed again only when the running set changes (a request's
prompt and output limit do not change). A walk reads the index's keys in the sorted
order while it skips few that do not fit (``scan_limit``), and asks the tree past that;
the tree's nodes that reach past the room left are not updated by its takes (no later
ask of the walk reads them). O(running + listed x log of the largest footprint) per step
and O(log n) per queue change (and a bucket's insertion: at most ``2 * load`` keys
moved), whatever waits. The key and the footprint do not read ``num_cached_tokens``, so
this holds under a prefix cache too; the budget reads it for the listed requests only.
Requests with equal ``(o_i, arrival)`` go in the view's (queue) order, which the index
does not know: a step that would list one of them is decided by ``decide_whole``.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import add, attrgetter, floordiv, neg
from typing import Any, ClassVar

from ppas.core.config import require
from ppas.core.decision import Decision
from ppas.core.slots import builder
from ppas.core.view import BLOCK_SIZE, RequestView, SchedulerView, uncached_prompt_tokens
from ppas.cost.base import CostModel
from ppas.policies.base import Policy
from ppas.policies.registry import register
from ppas.policies.waiting import WaitingIndex

METRICS = ("f", "none")

#: ``Decision(prefill_budget, prefill_order, decodes_first, chunk_limit, order_kept)``,
#: positionally (``ppas.core.slots``: the same object).
_make_decision = builder(Decision)


@dataclass(frozen=True)
class SortedFConfig:
    budget: int = 8192  # the engine's max_num_batched_tokens
    kv_tokens: int | None = None  # M; None = the cost model's KV capacity
    metric: str = "f"

    def __post_init__(self) -> None:
        require(self.budget >= 1, f"budget must be >= 1, got {self.budget}")
        require(self.kv_tokens is None or self.kv_tokens >= 1,
                f"kv_tokens must be >= 1, got {self.kv_tokens}")
        require(self.metric in METRICS,
                f"unknown metric {self.metric!r}; allowed: {', '.join(METRICS)}")


def footprint(r: RequestView) -> int:
    """Peak KV tokens of a request (prompt + all outputs), in whole blocks."""
    n = r.prompt_tokens + r.max_output_tokens
    return -(-n // BLOCK_SIZE) * BLOCK_SIZE


_prompt_tokens = attrgetter("prompt_tokens")
_max_output_tokens = attrgetter("max_output_tokens")
_num_output_tokens = attrgetter("num_output_tokens")


def f_metric(sum_outputs: int, size: int) -> float:
    """Our reading of the F-metric: sum of outputs over the squared batch size."""
    return sum_outputs / (size * size) if size else float("inf")


@register("sorted-f")
class SortedF(Policy):
    Config = SortedFConfig
    #: Up to this many waiting requests, sorting them (``decide_whole``) costs less than
    #: the index's walk and upkeep: the index is dropped at this length and built again
    #: past twice it (each build amortised over the queue changes since the last drop).
    #: With it, the sort is taken too while the queue is under ``sort_ratio`` times the
    #: requests the last step listed (a request sorted costs about a quarter of a walk's
    #: step). The same decision either way.
    short_queue: ClassVar[int] = 64
    sort_ratio: ClassVar[int] = 4
    #: A walk reads the index's sorted order until it has skipped this many requests that
    #: do not fit, then asks its tree (``decide``): a skip costs about a fortieth of the
    #: tree's answer, and a walk that skips many (a full KV cache) mostly skips the rest of
    #: the queue. The same decision either way.
    scan_limit: ClassVar[int] = 64

    def __init__(self, config: SortedFConfig, spec: str | None = None) -> None:
        super().__init__(config, spec)
        self.kv_tokens = config.kv_tokens
        self._index: _FootprintIndex | None = None  # the waiting queue (a cache, module doc)
        self._listed = 0  # requests the last step listed (which path costs less)
        # The last step's running requests, the cap, their prompts, the room beside them
        # and their summed max outputs (see decide)
        self._running: tuple[Sequence[RequestView], int, list[int], int, int] | None = None
        # The last walk: (index, its version, room, the requests reached, complete, their
        # keys)
        self._walk: _Walk | None = None

    def bind_cost_model(self, cost_model: CostModel | None) -> None:
        if self.config.kv_tokens is None and cost_model is not None:
            self.kv_tokens = cost_model.kv_capacity_tokens

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.config.budget)

    def decide(self, view: SchedulerView) -> Decision:
        log = view.waiting_log
        idx = self._index
        if log is None or idx is None:  # (no index kept while the queue is short)
            d, n_waiting = self._decide_whole(view)
            if log is not None and n_waiting > 2 * self.short_queue:
                self._index = _FootprintIndex()  # (built from the next view)
            return d
        n_running = idx.sync(view, log)
        n_waiting = len(idx.live)
        if n_waiting <= self.short_queue:
            self._index = None
            return self.decide_whole(view)
        if n_waiting <= self.sort_ratio * self._listed:  # a long walk: the sort costs less
            d = self.decide_whole(view)
            self._listed = len(d.prefill_order or ())
            return d
        cfg = self.config
        cap = self.kv_tokens if self.kv_tokens is not None else 1 << 62
        # The running requests' sums, as decide_whole's loop adds them up (in C):
        # footprints (whole blocks of prompt + outputs), outputs left, prompt tokens left.
        # The first two read only fields a request keeps while it runs (prompt, max
        # outputs): kept while the same requests run.
        run = view.requests[:n_running]
        kept = self._running
        if kept is not None and kept[0] == run and kept[1] == cap:
            prompts, room, outputs_sum = kept[2], kept[3], kept[4]
        else:
            prompts = list(map(_prompt_tokens, run))
            outputs = list(map(_max_output_tokens, run))
            room = cap + BLOCK_SIZE * sum(map(floordiv, map(neg, map(add, prompts, outputs)),
                                              repeat(BLOCK_SIZE)))
            outputs_sum = sum(outputs)
            self._running = (list(run), cap, prompts, room, outputs_sum)
        size = n_running
        chunks = n_running - view.num_running_decodes  # (running with prompt tokens left)
        total = outputs_sum - sum(map(_num_output_tokens, run))
        # The budget is min(cfg.budget, the running requests' prompt tokens left + the
        # listed requests' uncached ones): ``need`` adds up the latter only until it
        # reaches cfg.budget (past it the budget is cfg.budget), the former is summed only
        # if it does not (``_budget``).
        cap_budget = cfg.budget
        need = 0
        order: list[str] = []
        f = cfg.metric == "f"
        walk = self._walk
        if size and walk is not None and walk[0] is idx and walk[1] != idx.version:
            walk = self._walk = _carried(walk, room)
        if size and walk is not None and walk[0] is idx and walk[1] == idx.version and (
                walk[2] == room):
            # The index and the room of the last walk: the same requests fit, in the same
            # order (its ``seq``: each request it reached, the last one the one whose F
            # test stopped it unless nothing else fitted, ``complete``); only the F test,
            # on this step's totals, tells where the walk stops.
            cached, complete = walk[3], walk[4]
            total0 = total
            for o, r in cached:  # (size >= 1: f_metric's quotients, inlined)
                if f and (total + o) / ((size + 1) * (size + 1)) > total / (size * size):
                    break
                order.append(r.request_id)
                size += 1
                total += o
                if need < cap_budget:
                    need += uncached_prompt_tokens(r)
            if len(order) < len(cached) or complete:
                self._listed = len(order)
                return _make_decision(_budget(cap_budget, need, prompts, run, chunks),
                                      tuple(order), False, 0, 0)
            order.clear()  # past the last walk's end: walk again
            size, total, need = n_running, total0, 0
        room0 = room
        seq: list[tuple[int, RequestView]] = []
        keys: list[_Key] = []
        complete = False
        # The walk reads the index's sorted order (``scan``) while it skips few requests
        # that do not fit; past ``scan_limit`` skips it asks the tree (``first``), its
        # takes so far set aside there first (``taken``). Either finds the first request
        # in the sorted order, of those not taken, that fits the room left: every request
        # the scan passed was taken or skipped, and a skipped one did not fit a room at
        # least the present one.
        scan = chain.from_iterable(idx.buckets)
        skips = self.scan_limit
        taken: list[_Key] = []
        on_tree = False
        found: _Key | None
        try:
            if size == 0:  # the sorted order's head: it fits (room = M), or goes alone
                key = next(scan)
                if idx.tied(key):
                    return self.decide_whole(view)
                r = idx.live[key[2]][1]
                if key[3] * BLOCK_SIZE > room:  # larger than M: alone (liveness)
                    return Decision(_budget(cap_budget, uncached_prompt_tokens(r), prompts,
                                            run, chunks), (r.request_id,))
                taken.append(key)
                order.append(r.request_id)
                room -= key[3] * BLOCK_SIZE
                size, total = 1, key[0]
                need = uncached_prompt_tokens(r)
            while True:  # the next in the sorted order that fits
                blocks = room // BLOCK_SIZE
                if on_tree:
                    found = idx.first(blocks)
                else:
                    for found in scan:
                        if found[3] <= blocks:
                            break
                        skips -= 1
                        if skips < 0:  # many skipped: the tree from here
                            for k in taken:
                                idx.take(k, blocks)
                            on_tree = True
                            found = idx.first(blocks)
                            break
                    else:
                        found = None
                if found is None:
                    complete = True
                    break
                key = found
                if idx.tied(key):
                    return self.decide_whole(view)
                o = key[0]
                r = idx.live[key[2]][1]
                seq.append((o, r))
                keys.append(key)
                if f and (total + o) / ((size + 1) * (size + 1)) > total / (size * size):
                    break  # (size >= 1: f_metric's quotients, inlined)
                room -= key[3] * BLOCK_SIZE
                if on_tree:
                    idx.take(key, room // BLOCK_SIZE)
                else:
                    taken.append(key)
                order.append(r.request_id)
                size += 1
                total += o
                if need < cap_budget:
                    need += uncached_prompt_tokens(r)
        finally:
            idx.restore()
        self._walk = (idx, idx.version, room0, seq, complete, keys) if n_running else None
        idx.changes = []
        self._listed = len(order)
        return _make_decision(_budget(cap_budget, need, prompts, run, chunks), tuple(order),
                              False, 0, 0)

    def decide_whole(self, view: SchedulerView) -> Decision:
        """The rule as stated (module doc): every waiting request read and sorted."""
        return self._decide_whole(view)[0]

    def _decide_whole(self, view: SchedulerView) -> tuple[Decision, int]:
        """``decide_whole``'s decision and the number of waiting requests."""
        cfg = self.config
        cap = self.kv_tokens if self.kv_tokens is not None else 1 << 62
        room = cap
        size = total = budget = 0
        waiting: list[RequestView] = []
        for r in view.requests:
            if r.is_running:
                room -= footprint(r)
                size += 1
                total += r.max_output_tokens - r.num_output_tokens
                budget += max(0, r.prompt_tokens - r.num_computed_tokens)
            else:
                waiting.append(r)
        if not waiting:
            return Decision(cfg.budget), 0
        waiting.sort(key=lambda r: (r.max_output_tokens, r.arrival_time))
        order: list[str] = []
        for r in waiting:
            need = footprint(r)
            if need > room:
                if need > cap and size == 0 and not order:  # larger than M: alone (liveness)
                    order.append(r.request_id)
                    budget += uncached_prompt_tokens(r)
                    break
                continue
            o = r.max_output_tokens
            if cfg.metric == "f" and size and f_metric(total + o, size + 1) > f_metric(total, size):
                break
            order.append(r.request_id)
            room -= need
            size += 1
            total += o
            budget += uncached_prompt_tokens(r)
        return Decision(min(cfg.budget, budget), tuple(order)), len(waiting)


def _budget(cap: int, need: int, prompts: list[int], run: Sequence[RequestView],
            chunks: int) -> int:
    """min(cap, need + the prompt tokens left of the running requests ``run``, whose
    prompts are ``prompts`` and ``chunks`` of which have prompt tokens left (the view's
    ``len(run) - num_running_decodes``); those are summed only if ``need`` is under
    ``cap``, read from the last running request back until ``chunks`` are found (an
    engine appends the requests it admits: the prompts left are at the end)."""
    if need >= cap:
        return cap
    left = 0
    i = len(run)
    while chunks and i:
        i -= 1
        x = prompts[i] - run[i].num_computed_tokens
        if x > 0:
            left += x
            chunks -= 1
    return min(cap, need + left)


#: One waiting request in ``_FootprintIndex``: (o_i, arrival, id, footprint in blocks), the
#: sorted order's key first (the id makes keys distinct).
_Key = tuple[int, float, str, int]
_NONE: tuple[float] = (math.inf,)  # above every key: an empty subtree
#: A walk (``SortedF.decide``): its index and the index's version, the room it started
#: from, the requests it reached in the sorted order (``o_i`` and the request), whether it
#: ended because nothing else fitted, and the reached requests' keys.
_Walk = tuple["_FootprintIndex", int, int, list[tuple[int, RequestView]], bool, list[_Key]]


def _carried(walk: _Walk, room: int) -> _Walk | None:
    """The walk that the index (changed since ``walk``) and ``room`` give, found from
    ``walk`` without walking, or None. The sorted walk from room R over the index reaches
    requests in the sorted order, each the first after the last that fits the room left.
    Where the index's changes since ``walk`` (``changes``, each request once) are

    * the first j requests the walk took, gone (admitted) and the room less exactly their
      footprints: the walk from here is the old one after its j-th take (the same set,
      the same room), i.e. its requests from the (j + 1)-th on;
    * requests gone that the walk did not reach: no answer of ``first`` was one of them;
    * requests added after the walk's last reached request when it stopped on the F test
      (the walk never went past it), or larger than the room the walk had where their key
      falls (the room only shrinks along a walk), none with another's ``(o_i,
      arrival)``:

    the same walk (``tests/test_policy_index.py`` checks the runs)."""
    idx, _, room0, seq, complete, keys = walk
    changes = idx.changes
    if changes is None:
        return None
    ids = {key[2] for _, key in changes}
    if len(ids) < len(changes):  # a request changed twice
        return None
    gone = [key for entered, key in changes if not entered]
    j = 0
    if gone:
        reached = {key[2]: i for i, key in enumerate(keys)}
        at = sorted(reached[key[2]] for key in gone if key[2] in reached)
        j = len(at)
        if at != list(range(j)) or j > (len(seq) if complete else len(seq) - 1):
            return None
    rooms = [room0]  # the room before reaching keys[i]
    for key in keys:
        rooms.append(rooms[-1] - key[3] * BLOCK_SIZE)
    if rooms[j] != room:
        return None
    n = len(keys)
    for entered, key in changes:
        if not entered:
            continue
        if idx.tied(key):
            return None
        i = bisect_left(keys, key)
        if i == n and not complete:  # past the request the F test stopped on
            continue
        if key[3] * BLOCK_SIZE <= rooms[max(i, j)]:  # the walk would reach it
            return None
    idx.changes = []
    return (idx, idx.version, room, seq[j:], complete, keys[j:])


class _FootprintIndex(WaitingIndex):
    """The waiting requests by footprint (whole blocks), each footprint's as a list in
    the sorted order ``(o_i, arrival)``, under a segment tree of the lists' heads: the
    first request in the sorted order among footprints up to a bound is a prefix minimum,
    O(log of the largest footprint). ``live``: id -> (key, request). ``ties``: live
    requests by ``(o_i, arrival)``, to tell where the order needs the queue's (``tied``).
    Within a step, ``take`` sets a request aside (its list's head moves on: ``cut``) and
    ``restore`` undoes the step's changes to the tree (``undo``). ``buckets``: every key
    again, in the sorted order, in lists of at most ``2 * load`` (``maxes``: each one's
    last key), for a walk to read in order. Memory: O(waiting requests + largest
    footprint)."""

    max_changes: ClassVar[int] = 32  # changes kept for ``_carried`` (past it: a walk)
    load: ClassVar[int] = 256  # a bucket is split past twice this

    def __init__(self) -> None:
        super().__init__()
        self.size = 1  # leaves (footprints 0 .. size - 1), a power of two
        # tree[size + b]: list b's head (_NONE: empty); tree[i]: min(tree[2i], tree[2i + 1])
        self.tree: list[tuple[Any, ...]] = [_NONE, _NONE]
        self.lists: dict[int, list[_Key]] = {}
        self.ties: dict[tuple[int, float], int] = {}
        self.cut: dict[int, int] = {}  # footprint -> its requests taken this step
        self.undo: list[tuple[int, tuple[Any, ...]]] = []  # (node, its value before)
        self.version = 0  # counts the changes of the set of requests
        # The keys in the sorted order, cut in nonempty lists; maxes[i] = buckets[i][-1]
        self.buckets: list[list[_Key]] = []
        self.maxes: list[_Key] = []
        # Since the last walk (``SortedF.decide`` empties it): (added?, key) for each
        # change of the set, in order; None: not known (too many, or the index read again)
        self.changes: list[tuple[bool, _Key]] | None = None

    def add(self, r: RequestView) -> None:
        o, arrival, rid = r.max_output_tokens, r.arrival_time, r.request_id
        if rid in self.live:
            self.discard(r)
        blocks = footprint(r) // BLOCK_SIZE
        key: _Key = (o, arrival, rid, blocks)
        self._note(True, key)
        self.live[rid] = (key, r)
        t = (o, arrival)
        self.ties[t] = self.ties.get(t, 0) + 1
        if blocks >= self.size:
            self._grow(blocks)
        lst = self.lists.get(blocks)
        if lst is None:
            lst = self.lists[blocks] = []
        i = bisect_left(lst, key)
        lst.insert(i, key)
        if i == 0:
            self._set(blocks, key)
        buckets, maxes = self.buckets, self.maxes
        if not buckets:
            buckets.append([key])
            maxes.append(key)
            return
        j = bisect_left(maxes, key)
        if j == len(maxes):  # past every key: the last bucket's end
            j -= 1
            bucket = buckets[j]
            bucket.append(key)
            maxes[j] = key
        else:
            bucket = buckets[j]
            bucket.insert(bisect_left(bucket, key), key)
        if len(bucket) > 2 * self.load:
            half = len(bucket) >> 1
            buckets.insert(j + 1, bucket[half:])
            del bucket[half:]
            maxes.insert(j, bucket[-1])

    def _note(self, entered: bool, key: _Key) -> None:
        """A change of the set of requests: a new version, and the change kept for
        ``_carried`` (up to ``max_changes``; past it, not known)."""
        self.version += 1
        changes = self.changes
        if changes is not None:
            if len(changes) < self.max_changes:
                changes.append((entered, key))
            else:
                self.changes = None

    def discard(self, r: RequestView) -> None:
        e = self.live.pop(r.request_id, None)
        if e is None:
            return
        key = e[0]
        self._note(False, key)
        t = (key[0], key[1])
        n = self.ties[t] - 1
        if n:
            self.ties[t] = n
        else:
            del self.ties[t]
        lst = self.lists[key[3]]
        i = bisect_left(lst, key)
        del lst[i]
        if i == 0:
            self._set(key[3], lst[0] if lst else _NONE)
        maxes = self.maxes
        j = bisect_left(maxes, key)
        bucket = self.buckets[j]
        del bucket[bisect_left(bucket, key)]
        if not bucket:
            del self.buckets[j], maxes[j]
        elif maxes[j] is key:
            maxes[j] = bucket[-1]

    def clear(self) -> None:
        super().clear()
        self.version += 1
        self.changes = None
        self.ties.clear()
        self.lists.clear()
        self.tree = [_NONE] * (2 * self.size)
        self.buckets.clear()
        self.maxes.clear()

    def compact(self) -> None:
        """(Nothing stale is kept.)"""

    def _grow(self, blocks: int) -> None:
        """The tree again, with leaves up to ``blocks`` at least."""
        size = self.size
        while size <= blocks:
            size *= 2
        tree: list[tuple[Any, ...]] = [_NONE] * (2 * size)
        for b, lst in self.lists.items():
            if lst:
                tree[size + b] = lst[0]
        for i in range(size - 1, 0, -1):
            a, c = tree[2 * i], tree[2 * i + 1]
            tree[i] = a if a < c else c
        self.size, self.tree = size, tree

    def _set(self, blocks: int, head: tuple[Any, ...]) -> None:
        """Leaf ``blocks`` is ``head`` now (between steps): it and the minima above."""
        tree = self.tree
        i = self.size + blocks
        tree[i] = head
        i >>= 1
        while i:
            a, c = tree[2 * i], tree[2 * i + 1]
            v = a if a < c else c
            if tree[i] is v:
                break
            tree[i] = v
            i >>= 1

    def first(self, blocks: int) -> _Key | None:
        """The first request in the sorted order, of those not taken, with a footprint of
        at most ``blocks`` blocks; None: none."""
        if blocks < 0:
            return None
        tree, size = self.tree, self.size
        if blocks >= size - 1:
            best = tree[1]
        else:
            lo, hi = size, size + blocks + 1
            best = _NONE
            while lo < hi:  # the minimum over leaves [0, blocks] (lo: a left edge, even)
                if hi & 1:
                    hi -= 1
                    if tree[hi] < best:
                        best = tree[hi]
                lo >>= 1
                hi >>= 1
        return None if best is _NONE else best  # type: ignore[return-value]

    def tied(self, key: _Key) -> bool:
        """Another live request has ``key``'s ``(o_i, arrival)``."""
        return self.ties[(key[0], key[1])] > 1

    def take(self, key: _Key, bound: int) -> None:
        """Set ``first``'s answer (its list's head) aside for this step, whose later
        ``first`` calls ask for at most ``bound`` blocks: a node that reaches past leaf
        ``bound`` is read by none of them and is left as it is (a node that does not is
        kept right by every ``take`` below it: each had a bound at least this one)."""
        b = key[3]
        n = self.cut.get(b, 0) + 1
        self.cut[b] = n
        lst = self.lists[b]
        tree, undo = self.tree, self.undo
        i = self.size + b
        undo.append((i, tree[i]))
        v = tree[i] = lst[n] if n < len(lst) else _NONE
        top = self.size + bound + 1  # (node i of width w reaches leaf (i + 1) * w - size - 1)
        w = 1
        while i > 1:  # each parent: the lesser of v (the child that changed) and its sibling
            s = tree[i ^ 1]
            if s < v:
                v = s
            i >>= 1
            w <<= 1
            if (i + 1) * w > top or tree[i] is v:
                break
            undo.append((i, tree[i]))
            tree[i] = v

    def restore(self) -> None:
        """Undo the step's ``take``s."""
        tree, undo = self.tree, self.undo
        while undo:
            i, v = undo.pop()
            tree[i] = v
        self.cut.clear()
