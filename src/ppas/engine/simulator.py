"""A discrete-step simulator with vLLM V1's scheduling semantics.

``EngineSim`` is one engine, stepped like vLLM's ``EngineCore``: ``add_request`` when a
request arrives, ``step()`` for one ``Scheduler.schedule()`` + model step +
``update_from_output``. Each step, in the order of vLLM's code:

1. **build the view** (``_view``): the policy's ``SchedulerView`` (N_p, N_d as
   ``ppas.engine.step_rules.counts`` finds them, kept as requests move: O(1) per step);
2. **decide**: ``policy.decide(view)``, made safe by ``step_rules.enforced_budget``
   (liveness) and applied to the queues by ``step_rules.order_running/order_waiting``;
3. **shape the step** (``_schedule``): running requests first, in order. A request needs
   ``num_tokens - num_computed`` tokens; it gets ``min(need, token budget left)``, clamped
   by the prefill cap (``step_rules.PrefillCap``), and is skipped when that is 0; a decode
   gets 1 token while the budget lasts. When the paged KV cache (``block_size`` blocks)
   cannot hold the new tokens, the *last* running request is preempted (recompute: its
   blocks are freed, ``num_computed`` resets to 0 and it goes to the front of the waiting
   queue); if that is the request itself, the loop stops. Under ``--scheduling-policy
   priority`` (``EngineConfig.scheduling_policy``) the victim is the running request with
   the largest ``(priority, arrival_time)`` instead, a chunk it was given earlier in the
   step is taken back (its tokens return to the budget, not to the prefill cap, which the
   plugin cannot see), and a request that preempted itself ends the loop on vLLM 0.32 but
   is passed over on 0.33 (``priority_skips_self_preempted``). Then, only if nobody was
   preempted, waiting requests in queue order (FCFS, or ``step_rules.priority_key``)
   while the token budget lasts, ``len(running) <
   max_num_seqs``, the capped chunk is not 0 and the request's whole sequence so far fits
   in the free blocks (vLLM's ``scheduler_reserve_full_isl`` admission, its default).
   With prefix caching (``EngineConfig.prefix_caching``, ``ppas.engine.prefix_cache``) a waiting
   request first takes its longest cached prefix of full blocks (its last token is always
   computed); the hit costs neither token budget nor prefill cap, and the admission test
   counts the free cached blocks it takes;
4. **advance** (``_advance``): the step's duration is the cost model's time for the step's
   shape (``step_rules.StepTally``); every request whose computed tokens reach its token
   count samples one token at the step's end (``step_rules.samples_token``). A request
   finishes at its last token and frees its blocks.

``simulate()`` drives one engine over a trace (admit arrivals, step while there is work,
jump the clock to the next arrival when idle); ``ppas.cluster`` drives several
``EngineSim``\\ s on one event clock the same way.

**Cost per step.** A busy step is mostly running decodes (tens of them beside a prompt
chunk): ``_schedule`` takes each with a few integer tests (its block taken once in
``block_size`` steps) and ``_advance`` gives each its token apart from the other chunks,
keeping vLLM's order (the decodes before each chunk's place, then the chunk) for the
inter-token gaps and the finishing order; the step's records are built without the frozen
dataclasses' ``__init__`` (``ppas.core.slots``). Without a prefix cache the KV pool's
block counts are done in place for a chunk that fits and for every admission
(``KvPool.needed``/``grow``: the same arithmetic), and the ordering rules are called only
with an order to apply. The same decodes run step after step, so the last step's first
streak of decodes (those before its first other chunk), less those that finished (the
*decode group*, ``_group``), is taken at once while it still leads ``running``: the blocks
its members take this step come from a bucket by residue (``_buckets``), its context from
a running sum, its gaps are one value written at once (each member's last token came at
the same step's end: ``Gaps.repeat``). The waiting queue keeps its head (admission reads
it every step), leaves an order that already is its front as it is, and moves only what
follows an order's kept head (``Decision.order_kept``, checked: ``WaitingQueue``), or,
for an order read off a log of ids (``ppas.core.order``), what follows the log's ids it
already starts with (known by identity and two numbers; the view's ``WaitingLog.front``).
``tests/test_engine_reference.py`` holds this loop to its earlier form (same steps, floats
and gaps on random runs).

**Decode runs** (``advance``, ``rewind``): when nothing waits and every running request is
a decode, each step's schedule is fixed (one token each) and only the cost model is
needed, so a run of such steps is taken in one go (one cost-model evaluation per step,
two passes over the requests per run) and can be cut back to any step boundary when a
request arrives. Results are identical to single steps (``tests/test_decode_runs.py``);
with ``record_steps`` every step is taken singly.

**Chunk runs** (``run_until``, ``_chunk_run``): while the running requests are decodes that
all sampled their last token at the same step's end and one prompt P being chunked, a
policy may give its budgets as a function of the clock, P's computed tokens and the
decodes' (``Policy.chunk_rule``: ``sloweave``'s deadline search, ``tbt-ladder``'s
ladder). Each such step then schedules every decode and a chunk of P short of its prompt's
end: the run takes them in one go (the rule, one price unless the rule priced the chunk on
the engine's own cost model, and a few integer sums a step; the requests, records and gaps
written once a run), up to the step at which a decode finishes, and stops before a step
that would end P's prompt, admit or preempt. Only ``run_until`` takes them (its caller adds
nothing before the limit, or only arrivals, which no step of a run reads: ``replay`` adds
them after it): they are never cut back. Results are identical to single steps, every
step's record compared (``tests/test_chunk_runs.py``, ``test_ladder_chunk_runs.py``); with
step records, prefix caching, priority scheduling, vLLM's prefill cadence or chunk limit
every step is taken singly (``_takes_chunk_runs``).

The policy's ``Decision.prefill_budget`` is the prefill cap; the global token budget is the
policy's ``max_num_batched_tokens`` (P-PAS §3.2). Invariants checked by the tests:
prefill-chunk tokens <= cap, all tokens <= budget, KV blocks <= capacity, every request
finishes; ``tests/test_differential.py`` checks the per-step schedule against vLLM's own
scheduler with the plugin.
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, islice
from operator import sub
from typing import cast

from ppas.core.config import require
from ppas.core.decision import admission_limit
from ppas.core.metrics import Gaps
from ppas.core.order import IdLog, LoggedOrder
from ppas.core.view import (
    OutputLengths,
    SchedulerView,
    StepRecord,
    WaitingLog,
    make_step_record,
    make_view,
)
from ppas.cost.base import CostModel, causal_pairs
from ppas.engine import step_rules
from ppas.engine.kv import KvPool
from ppas.engine.request import SimRequest, rejection
from ppas.engine.result import SimResult, StepTrace
from ppas.policies.base import Policy
from ppas.workload import RequestSpec, Trace

#: vLLM's ``--scheduling-policy`` values.
SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass(frozen=True)
class EngineConfig:
    """vLLM engine settings. ``max_num_batched_tokens`` None = the policy's own;
    ``num_kv_blocks`` None = the cost model's KV capacity (unbounded if it has none);
    ``max_model_len`` None = no context limit. ``hold_finished_kv``: finished requests keep
    their KV blocks until ``EngineSim.release_kv`` (a disaggregated prefill instance holds a
    prompt's KV until its transfer to the decode instance ends, as vLLM's KV connectors do);
    while the held blocks leave no room for the next admission the engine stalls
    (``EngineSim.stalled``) instead of stepping."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None
    prefix_caching: bool = False  # vLLM's --enable-prefix-caching (ppas.engine.prefix_cache)
    max_model_len: int | None = None
    hold_finished_kv: bool = False
    #: vLLM's ``--scheduling-policy``: "fcfs" or "priority" (``RequestSpec.priority``,
    #: ``step_rules`` rule 3).
    scheduling_policy: str = "fcfs"
    #: Under priority, a running request that preempted itself is passed over and the
    #: running loop goes on (vLLM 0.33) instead of ending it (0.32);
    #: ``ppas.live.versions.ReleaseLine.priority_self_preemption``.
    priority_skips_self_preempted: bool = False

    def __post_init__(self) -> None:
        require(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        require(self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1,
                "max_num_batched_tokens must be >= 1")
        require(self.block_size >= 1, "block_size must be >= 1")
        require(self.num_kv_blocks is None or self.num_kv_blocks >= 1, "num_kv_blocks >= 1")
        require(self.max_model_len is None or self.max_model_len >= 1, "max_model_len >= 1")
        require(self.scheduling_policy in SCHEDULING_POLICIES,
                f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, got "
                f"{self.scheduling_policy!r}")


class WaitingQueue:
    """The waiting queue: a deque's operations (``append``, ``appendleft``, ``popleft``,
    ``[0]``, ``len``, iteration, ``clear``, ``extend``) on a list followed by an
    insertion-ordered dict by request id, so that ``move_to_front`` applies a policy's
    ``prefill_order`` in O(len(order)) instead of sorting the queue
    (``step_rules.order_waiting``), and an order whose head is the queue's own head
    (``Decision.order_kept``) in O(what changed). The queue is ``_front`` (a list; its
    ids, in order, are ``_fids``) followed by ``_d``'s values. ``_front`` is empty but
    after an order with a kept head: it then holds that order's requests, and loses them
    from its head (admissions) or gains one there (preemptions) until the next order.
    Every membership change is recorded in ``log`` (``ppas.core.view.WaitingLog``), and
    ``prompt_tokens`` is the sum of the members' prompt tokens
    (``SchedulerView.waiting_prompt_tokens``). ``head`` is the first member (None when
    empty), kept by every method that changes the queue (``_front``, ``_fids`` and ``_d``
    are changed by nothing else), so that a step reads it without an iterator over the
    dict.

    Where the last order was a ``LoggedOrder`` (``ppas.core.order``) applied whole,
    ``_src`` is its ``IdLog`` and the front's first ``_shi - _slo`` requests are those of
    the log's ids ``[_slo, _shi)``, in order (admissions move ``_slo``; anything else that
    changes the front's head forgets ``_src``): an order of that log from ``_slo`` through
    at least ``_shi`` then lists them first, known without reading them (``_move_logged``).
    """

    __slots__ = ("_front", "_fids", "_d", "log", "prompt_tokens", "head", "_src", "_slo",
                 "_shi")

    def __init__(self, items: Iterable[SimRequest] = ()) -> None:
        self._front: list[SimRequest] = []
        self._fids: list[str] = []
        self._src: IdLog | None = None
        self._slo = self._shi = 0
        self._d: OrderedDict[str, SimRequest] = OrderedDict()
        self.log = WaitingLog()
        self.prompt_tokens = 0
        self.head: SimRequest | None = None
        self.extend(items)

    def __len__(self) -> int:
        return len(self._front) + len(self._d)

    def __bool__(self) -> bool:
        return self.head is not None

    def __iter__(self) -> Iterator[SimRequest]:
        if self._front:
            return chain(self._front, self._d.values())
        return iter(self._d.values())

    def __getitem__(self, i: int) -> SimRequest:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("waiting queue index out of range")
        if i == 0:
            return self.head  # type: ignore[return-value]  # (the queue is not empty)
        front = self._front
        if i < len(front):
            return front[i]
        return next(islice(self._d.values(), i - len(front), None))

    def append(self, r: SimRequest) -> None:
        if self.head is None:
            self.head = r
        self._d[r.request_id] = r
        self.log.events.append((True, r))
        self.prompt_tokens += r.prompt_tokens

    def appendleft(self, r: SimRequest) -> None:
        rid = r.request_id
        if self._front:
            self._front.insert(0, r)
            self._fids.insert(0, rid)
            self._src = None  # (the front no longer starts with the log's ids)
        else:
            d = self._d
            d[rid] = r
            d.move_to_end(rid, last=False)
        self.head = r
        self.log.events.append((True, r))
        self.prompt_tokens += r.prompt_tokens

    def popleft(self) -> SimRequest:
        front, d = self._front, self._d
        if front:
            r = front.pop(0)
            del self._fids[0]
            if self._slo < self._shi:
                self._slo += 1  # (it was the log's id _slo)
            self.head = front[0] if front else next(iter(d.values())) if d else None
        else:
            r = d.popitem(last=False)[1]
            self.head = next(iter(d.values())) if d else None
        self.log.events.append((False, r))
        self.prompt_tokens -= r.prompt_tokens
        return r

    def extend(self, items: Iterable[SimRequest]) -> None:
        for r in items:
            self.append(r)

    def clear(self) -> None:
        self.log.events.extend((False, r) for r in self)
        self._front.clear()
        self._fids.clear()
        self._d.clear()
        self._src = None
        self.head = None
        self.prompt_tokens = 0

    def move_to_front(self, order: Sequence[str], kept: int = 0) -> None:
        """The queue stably sorted by rank in ``order``, unlisted ids last in queue order
        (``step_rules.order_waiting``): the listed requests moved to the front in that
        order, O(len(order)). With ``kept`` (``Decision.order_kept``) they go to
        ``_front`` (``_move_after``): O(the ids after the kept head) where the front
        already starts with it. An order that lists an id twice is sorted as
        ``step_rules`` ranks it (its last place counts, unlisted ids rank as the number
        of ids listed), O(n log n). A ``LoggedOrder`` that continues the last one
        (``_move_logged``) costs O(the ids after the front's)."""
        logged = type(order) is LoggedOrder
        if logged and self._move_logged(cast(LoggedOrder, order)):
            return
        self._src = None
        # (a hint < 0 is none; a logged order goes to the front even without one, so
        # that the next one of its log follows it)
        if (kept > 0 or logged) and self._move_after(order, max(kept, 0)):
            if logged and len(self._front) == len(order):
                # (every id moved, distinct: the front is the order's requests, in order)
                o = cast(LoggedOrder, order)
                self._src, self._slo, self._shi = o.log, o.lo, o.hi
            return
        if self._front:
            self._unfront(0)
        d = self._d
        n = len(order)
        if n > 1 and len(set(order)) != n:  # (an id listed twice; the set built in C)
            rank = {rid: i for i, rid in enumerate(order)}
            last = len(rank)
            items = sorted(d.values(), key=lambda r: rank.get(r.request_id, last))
            d.clear()
            for r in items:
                d[r.request_id] = r
            self.head = items[0] if items else None
            return
        head = self.head
        if head is not None and head.request_id == order[0] and list(islice(d, n)) == list(order):
            return  # the queue's first n ids are the order's: moving them changes nothing
        move = d.move_to_end
        front = None  # the last id moved to the front: the new head
        for rid in reversed(order):
            if rid in d:
                move(rid, last=False)
                front = rid
        if front is not None:
            self.head = d[front]

    def _move_after(self, order: Sequence[str], kept: int) -> bool:
        """``move_to_front(order)`` with the listed requests in ``_front``, when the
        order's ids after its first ``kept`` are distinct and none of them is in the
        front's first ``kept`` (False otherwise; the queue is then as it was). Where
        ``_front`` starts with the order's first ``kept`` ids, in order (the hint
        holds, checked), the front is cut to them and the other ids are moved from the
        dict after them; otherwise the whole front goes back to the dict and the
        order's requests are taken from it. Either way the result is the stable sort's:
        the listed requests present, in the order's order, then the others in queue
        order (moving front members back to the dict, in order, keeps the queue)."""
        front, fids, d = self._front, self._fids, self._d
        if kept > len(front) or kept > len(order):
            kept = 0  # (the hint does not hold: the whole order is moved)
        else:  # (compared as lists, in C: one copy where the hint is all of both)
            head = order if kept == len(order) else order[:kept]
            if (fids if kept == len(fids) else fids[:kept]) != [*head]:
                kept = 0
        rest = order[kept:]
        if len(set(rest)) != len(rest):
            return False  # (an id listed twice)
        self._unfront(kept)
        if kept and not all(map(d.__contains__, rest)):
            return False  # (an id unknown, or listed twice: in the kept head)
        pop = d.pop
        for rid in rest:
            r = pop(rid, None)
            if r is not None:  # (an unknown id is skipped)
                front.append(r)
                fids.append(rid)
        if front:
            self.head = front[0]
        return True

    def followed(self) -> LoggedOrder | None:
        """The log's ids the queue starts with (``WaitingLog.front``), where it follows
        a logged order."""
        src = self._src
        return None if src is None else LoggedOrder(src, self._slo, self._shi, ())

    def _move_logged(self, order: LoggedOrder) -> bool:
        """``move_to_front(order)`` where ``order`` lists the front's log ids first (its
        log is ``_src``, from ``_slo`` through at least ``_shi``: ``IdLog`` never changes
        an id) and the ids after them are distinct and waiting in the dict once the
        front's others went back to it (False otherwise; the queue is then as it was).
        The front is cut to its log ids and the others are moved from the dict after
        them: the stable sort's result, as in ``_move_after``."""
        if order.log is not self._src or order.lo != self._slo or order.hi < self._shi:
            return False
        shi = self._shi
        rest = order.ids()[shi:order.hi]
        if order.tail:
            rest += order.tail
        if len(set(rest)) != len(rest):
            return False  # (an id listed twice)
        self._unfront(shi - self._slo)
        d = self._d
        if not all(map(d.__contains__, rest)):
            return False  # (an id unknown, or one of the front's)
        front, fids, pop = self._front, self._fids, d.pop
        for rid in rest:
            front.append(pop(rid))
            fids.append(rid)
        self._shi = order.hi
        if front:
            self.head = front[0]
        return True

    def _unfront(self, k: int) -> None:
        """``_front``'s members past its first ``k`` go back to the dict's front, in
        order: the queue is unchanged."""
        front, fids, d = self._front, self._fids, self._d
        if k >= len(front):
            return
        move = d.move_to_end
        for i in range(len(front) - 1, k - 1, -1):
            rid = fids[i]
            d[rid] = front[i]
            move(rid, last=False)
        del front[k:], fids[k:]


class _Chain(Sequence[SimRequest]):
    """Running then waiting, without copying (policies rarely iterate). A slice within
    the running requests and the queue's ``_front`` is a copy of those lists' items."""

    __slots__ = ("a", "b", "f", "d")

    def __init__(self, a: list[SimRequest], b: WaitingQueue) -> None:
        self.a, self.b = a, b
        self.f, self.d = b._front, b._d  # (the queue's, never replaced: lengths read in C)

    def __len__(self) -> int:
        return len(self.a) + len(self.f) + len(self.d)

    def __getitem__(self, i):  # type: ignore[no-untyped-def,override]
        a, f = self.a, self.f
        n = len(a)
        if isinstance(i, slice):
            nf = n + len(f)
            start, stop, step = i.indices(nf + len(self.d))
            if step != 1:
                return list(self)[i]
            if stop <= n:
                return a[start:stop]  # within the running requests: no copy of the rest
            if n <= start and stop <= nf:
                return f[start - n:stop - n]  # within the queue's front
            out = a[start:n] if start < n else []
            if start < nf:
                out += f[max(start - n, 0):stop - n]
            if stop > nf:
                out += islice(self.d.values(), max(start - nf, 0), stop - nf)
            return out
        if i < 0:
            i += len(self)
        if i < n:
            return a[i]
        if i == n and self.b.head is not None:  # the queue's head
            return self.b.head
        return self.b[i - n]

    def __iter__(self) -> Iterator[SimRequest]:
        # (in C: policies' one pass over the view)
        if self.f:
            return chain(self.a, self.f, self.d.values())
        return chain(self.a, self.d.values())


class EngineSim:
    """One simulated vLLM V1 engine under ``policy``, on its own clock ``now``."""

    def __init__(self, policy: Policy, cost_model: CostModel, engine: EngineConfig | None = None,
                 record_steps: bool = False) -> None:
        engine = engine or EngineConfig()
        # The policy sees the engine's KV cache (its footprint rules admit into it).
        kv = (engine.num_kv_blocks * engine.block_size if engine.num_kv_blocks is not None
              else None)
        policy.bind_cost_model(cost_model if kv is None or kv == cost_model.kv_capacity_tokens
                               else cost_model.with_kv_capacity(kv))
        self.policy = policy
        self.step_time = cost_model.step_time
        #: ``step_time`` of a step's tally fields, without building its shape
        #: (``CostModel.pricer``: the same floats).
        self._price = cost_model.pricer()
        #: ``step_time`` of one chunk beside decodes (``CostModel.chunk_pricer``: a chunk
        #: run's steps).
        self._chunk_price = cost_model.chunk_pricer()
        self.mbt = engine.max_num_batched_tokens or policy.max_num_batched_tokens
        self.block_size = engine.block_size
        self.max_model_len = engine.max_model_len
        self.by_priority = engine.scheduling_policy == "priority"
        self.skip_self_preempted = self.by_priority and engine.priority_skips_self_preempted
        # vLLM's admission limit (step_rules.admission_limit: a vllm: baseline's
        # max_num_seqs / max_num_active_seqs, else the engine's max_num_seqs).
        self.max_num_seqs = admission_limit(policy.engine_knobs, engine.max_num_seqs)
        if engine.num_kv_blocks is not None:
            self.total_blocks: int | None = engine.num_kv_blocks
        elif cost_model.kv_capacity_tokens is not None:
            self.total_blocks = max(1, cost_model.kv_capacity_tokens // engine.block_size)
        else:
            self.total_blocks = None
        self.pool = KvPool(self.total_blocks, engine.block_size, engine.prefix_caching)
        self.hold_kv = engine.hold_finished_kv
        self.num_held = 0  # finished requests whose KV is held (hold_finished_kv)
        self.stalled = False  # the last advance found nothing to run for the held KV
        self.record_steps = record_steps
        self.now = 0.0
        self.requests: list[SimRequest] = []
        self.running: list[SimRequest] = []
        #: Running requests past their prompt (N_d, ``step_rules.counts``), kept as they
        #: are admitted, cross their prompt's end, are preempted and finish; the view's
        #: N_p is then ``len(running) - _past_prompt + len(waiting)``, O(1) per step.
        self._past_prompt = 0
        self.waiting = WaitingQueue()
        if self.pool.cache is not None:  # hit changes reported (WaitingLog.hits)
            self.pool.cache.changed = self.waiting.log.hits = []
        self.recent: deque[StepRecord] = deque(maxlen=step_rules.recent_steps_kept(policy))
        self.steps: list[StepTrace] = []
        self.num_steps = self.num_preemptions = 0
        self._last_launch: float | None = None
        #: Requests finished by the steps so far, in finishing order (drivers may clear it).
        self.finished: list[SimRequest] = []
        self.output_lengths = OutputLengths()  # where they stopped against their caps
        #: Inter-token latencies of every token after a request's first (ITL), as sampled.
        self.gaps = Gaps()
        self.cost_model = cost_model
        self.decode_steps = cost_model.decode_steps
        # The last decode run (start, durations, cap, n, last launch before it, the step
        # records before it, the requests' last token times before it, the decodes'
        # context at its start) while it can still be rewound, and how many of its steps
        # are applied.
        self._run: tuple[float, list[float], int, int, float | None, list[StepRecord],
                         list[float | None], int] | None = None
        self._run_steps = -1
        self._run_gaps = (0, 0)  # self.gaps.mark() before the last decode run
        self._chain = _Chain(self.running, self.waiting)
        self._log_views = not self.by_priority
        self._prefix_caching = engine.prefix_caching
        # Stock vLLM's own prefill knobs (step_rules rule 4b; defaults for every policy but
        # the vllm: baseline): the chunk limit and vLLM 0.33's prefill cadence.
        self.knobs = policy.engine_knobs
        self.cadence = step_rules.prefill_cadence(self.knobs)
        # (long_prefill_limit is 0 every step without the threshold: not called then)
        self._long_prefill = self.knobs.long_prefill_token_threshold > 0
        self._carried = False  # the last _schedule carried prefill (the cadence's test)
        #: The decode group: the requests of the last step's first streak of decodes
        #: (``_schedule``) that did not finish. Invariant, kept by ``_advance`` and
        #: cleared by everything else that moves a running request's tokens or the running
        #: list (preemption, decode runs, ``fork``): every member is a decode (one token
        #: past its prompt: it was one and got exactly its one token since) and the
        #: members are, in order, the first ``len(_group)`` running requests (``_schedule``
        #: checks this by identity, so a reordering of ``running`` only costs the group).
        #: The list itself is held by nothing else (``_schedule`` takes it as the step's
        #: decodes list and appends to it).
        self._group: list[SimRequest] = []
        #: The steps advanced (``_advance``), and the group's members by residue: a member
        #: with c computed tokens is in ``_buckets[(c - _gstep) % block_size]`` (both grow
        #: by one a step while it is a member), so those whose computed tokens fill their
        #: last block (c % block_size == 0), which take a block this step, are
        #: ``_buckets[-_gstep % block_size]``; ``_group_ctx``: the members' c, summed.
        self._gstep = 0
        self._buckets: list[list[SimRequest]] | None = None
        self._group_ctx = 0
        #: The time every member of ``_group`` sampled its last token (that step's end).
        self._group_time = 0.0
        #: The members of the group the current step's schedule took at once (they lead
        #: its decodes; 0: none).
        self._fast = 0
        #: ``_takes_chunk_runs()`` and what it was found for (the policy, ``record_steps``:
        #: ``run_until`` finds it again when either changed).
        self._chunk_runs = self._takes_chunk_runs()
        self._runs_for: tuple[Policy, bool] = (policy, record_steps)
        #: The next step is known not to be a chunk run's: the last chunk run stopped
        #: before it (``_chunk_run``), and since then no step ran and nothing but arrivals
        #: joined (none of which changes that step: ``Policy.chunk_rule``). Cleared by every
        #: step taken singly (``_step``) and by freed KV (``release_kv``).
        self._single_next = False

    def _takes_chunk_runs(self) -> bool:
        """Whether ``run_until`` looks for chunk runs (``_chunk_run``): the policy's class
        has a ``chunk_rule`` from the class its ``decide`` comes from (a subclass that
        decides otherwise, and inherits the rule, steps singly; an instance's own
        ``decide``, a timing or checking wrapper, is taken to decide as its class does),
        and no engine rule that the run leaves out applies (step records, the prefill
        cadence, prefix caching, priority scheduling, a chunk limit)."""
        cls = type(self.policy)
        rule_from = _defined_in(cls, "chunk_rule")
        return (rule_from is not Policy and rule_from is _defined_in(cls, "decide")
                and not self.record_steps and self.cadence is None
                and not self._prefix_caching and not self.by_priority
                and not self._long_prefill)

    @property
    def free_blocks(self) -> int:
        """Free KV blocks (as vLLM counts them: cached blocks nobody holds are free)."""
        return self.pool.free

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, spec: RequestSpec) -> SimRequest:
        """A request arrives (its ``arrival_s`` is its arrival time; the engine's clock moves
        to it when idle). One vLLM would refuse (``rejection``: longer than max_model_len,
        or never fitting in the KV cache) fails at once with the reason."""
        r = SimRequest(len(self.requests), spec, self.max_model_len)
        self.requests.append(r)
        why = rejection(r, self.total_blocks, self.block_size, self.max_model_len)
        if why is not None:
            r.failed = why
            return r
        self.pool.register(r, spec)
        if not self.has_work() and self.now < r.arrival_time:
            self.now = r.arrival_time
        self.waiting.append(r)
        return r

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def release_kv(self, r: SimRequest, now: float) -> None:
        """Free a finished request's held KV (``hold_finished_kv``) at ``now``; a stalled
        engine resumes then."""
        assert self.hold_kv and r.finish_time is not None and self.num_held > 0
        self.pool.release(r)
        self.num_held -= 1
        self._single_next = False  # (a chunk run stopped for want of KV may now fit)
        if self.stalled and now > self.now:
            self.now = now

    def idle_until(self, t: float) -> None:
        """Move an idle engine's clock to ``t`` (the next arrival)."""
        if not self.has_work() and t > self.now:
            self.now = t

    def fork(self, policy: Policy) -> EngineSim:
        """A copy of this engine that steps on independently under ``policy`` (a search
        trying other decisions from here: ``ppas.analysis.headroom``). Cheaper than
        ``deepcopy``: finished requests, step records, the cost model and the trace are
        shared, being no longer mutated; unfinished requests, the queues, the KV pool's
        count and the cadence are copied; the fork's inter-token gaps start empty. Prefix
        caching and step recording off."""
        assert self.pool.cache is None and not self.record_steps and not self.steps
        new = copy.copy(self)
        fresh: dict[int, SimRequest] = {}
        reqs = []
        for r in self.requests:
            if r.finish_time is None and not r.failed:
                c = SimRequest.__new__(SimRequest)
                for f in SimRequest.__slots__:
                    setattr(c, f, getattr(r, f))
                fresh[id(r)] = c
                r = c
            reqs.append(r)
        new.requests = reqs
        new.running = [fresh[id(r)] for r in self.running]
        new.waiting = WaitingQueue(fresh[id(r)] for r in self.waiting)
        new.finished = list(self.finished)
        new.output_lengths = copy.copy(self.output_lengths)
        new.recent = deque(self.recent, maxlen=self.recent.maxlen)
        new.pool = copy.copy(self.pool)
        new.gaps = Gaps()
        new.cadence = copy.copy(self.cadence)
        new._chain = _Chain(new.running, new.waiting)
        new._run, new._run_steps = None, -1  # the last decode run: only rewind() reads it
        new._group, new._buckets = [], None  # (the fork's requests are copies)
        new.policy = policy
        new._chunk_runs = new._takes_chunk_runs()
        new._runs_for = (policy, new.record_steps)
        new._single_next = False  # (another policy's rule may differ)
        return new

    # -- one step ----------------------------------------------------------------------------
    def step(self) -> None:
        """One engine step: view, decide, shape, advance (module doc)."""
        self._forget_decode_run()
        self._step()

    def _forget_decode_run(self) -> None:
        """Steps other than the last decode run's follow it: it is no longer rewound."""
        self._run = None
        self._run_steps = -1

    def _step(self) -> None:
        """``step()`` once the last decode run is forgotten (``_run`` None)."""
        self._single_next = False
        view = self._view()
        decision = self.policy.decide(view)
        cap = step_rules.enforced_budget(decision, view)
        # (each a no-op without an order to apply: step_rules rule 3; an order permutes the
        # running prefill chunks, len(running) - _past_prompt of them, only when several)
        if decision.decodes_first or (decision.prefill_order
                                      and len(self.running) - self._past_prompt > 1):
            step_rules.order_running(self.running, decision, self.by_priority)
        if decision.prefill_order or self.by_priority:
            step_rules.order_waiting(self.waiting, decision, self.by_priority)
        cadence = self.cadence
        held = cadence is not None and cadence.holds(self.running, _num_tokens)
        scheduled = self._schedule(cap, held, decision.chunk_limit)
        decodes, sched, _, preempted, _ = scheduled
        if cadence is not None:
            cadence.after_step(held, bool(decodes or sched), self._carried, not preempted,
                               len(self.waiting))
        if decodes or sched:
            self._advance(view, cap, scheduled)
        elif preempted:
            # Only under priority (vLLM 0.32, or every running chunk capped away): the
            # request that preempted itself ended the loop before anything was scheduled.
            # vLLM runs no model step for an output without tokens (nor does the plugin
            # log one); the next schedule() follows at once.
            self.num_preemptions += len(preempted)
        elif self.num_held:
            self.stalled = True  # waits for release_kv: held KV leaves no room to admit
        else:
            # step_rules.enforced_budget and the arrival check make this unreachable: a
            # step with work always schedules or preempts something.
            raise RuntimeError(f"simulator stalled at t={self.now}: policy {self.policy.spec}")

    def run_until(self, limit: float, arrivals: bool = False) -> None:
        """Step while there is work and the next step would start before ``limit`` (the
        next arrival): the same steps as calling ``step()`` that often. Nothing joins the
        engine before ``limit`` (the caller's promise), so chunk runs (``_chunk_run``) are
        taken here, never cut back. ``arrivals``: what joins at ``limit`` and after only
        arrives (``add_request``, at the waiting queue's end; ``replay``), so a chunk run
        may go on past ``limit``: its steps read no waiting request (none is admitted in
        them; ``Policy.chunk_rule`` holds through arrivals), and the caller adds the
        arrivals up to the clock before the next step, as it would have before each."""
        waiting = self.waiting  # (its head: None when empty, read without its __bool__)
        found = self._runs_for
        if found[0] is not self.policy or found[1] != self.record_steps:  # (set since)
            self._chunk_runs = self._takes_chunk_runs()
            self._runs_for = (self.policy, self.record_steps)
            self._single_next = False
        runs = self._chunk_runs
        run_limit = math.inf if arrivals else limit
        while self.now < limit and (self.running or waiting.head is not None):
            if runs and not self._single_next and self._chunk_run(run_limit):
                continue
            self.advance(limit)

    def advance(self, limit: float = math.inf) -> None:
        """One ``step()``, or a run of decode-only steps taken in one go
        (``_decode_run``, when it applies and steps are not recorded)."""
        self.stalled = False
        self._forget_decode_run()
        if (self.waiting.head is not None or self.record_steps or self.cadence is not None
                or not self._decode_run(limit)):
            self._step()  # (_run is None: reset above, and _decode_run set none)

    def _decode_run(self, limit: float) -> bool:
        """Up to ``limit``, the decode-only steps ``step()`` would run, in one go.

        Applies when nothing waits, every running request is a decode (one token past its
        prompt) and the global budget covers them all. Then every step schedules one token
        per running request whatever the policy decides (the decision only caps prefill
        chunks, and there are none), so the run asks the policy once, for the cap its
        step records carry. The run stops before the step at which a request finishes
        (``step()`` takes that one), before the KV cache could run short (in k steps a
        request needs at most ceil(k / block_size) new blocks, so nobody is preempted
        inside the run) and before ``limit``. Cost: one cost-model evaluation per step
        (``CostModel.decode_steps``) and two passes over the running requests per run.
        The run can be cut back afterwards (``rewind``). False when no step ran."""
        running = self.running
        n = len(running)
        if n == 0 or n > self.mbt or self.pool.cache is not None:
            return False  # (with prefix caching every block goes through the pool)
        ctx = 0
        k_max = 1 << 62
        for r in running:
            c = r.num_computed_tokens
            p = r.prompt_tokens
            if p + r.num_output_tokens - c != 1 or step_rules.priced_as_prefill(c, p, 1):
                return False  # a prefill chunk or a recompute tail, not a decode
            ctx += c
            left = r.output_len - r.num_output_tokens
            if left < k_max:
                k_max = left
        k_max -= 1  # the finishing step goes through step()
        if self.total_blocks is not None:
            k_kv = self.pool.free // n * self.block_size
            if k_kv < k_max:
                k_max = k_kv
        if k_max < 1 or self.now >= limit:
            return False
        view = self._view()
        cap = step_rules.enforced_budget(self.policy.decide(view), view)
        start = self.now
        dts = self.decode_steps(n, ctx, k_max, start, limit)
        self._run = (start, dts, cap, n, self._last_launch, list(self.recent),
                     [r.last_token_time for r in running], ctx)
        self._run_steps = 0
        self._run_gaps = self.gaps.mark()
        self._apply_run(len(dts))
        return True

    def _apply_run(self, k: int) -> None:
        """Move the requests, the clock and the step records ``k`` steps into the current
        run (from its start; ``k`` may be less than the run's length: ``rewind``). Its
        inter-token gaps: each request's first (from its last token before the run), then
        the durations of the run's later steps, each counted once per request."""
        assert self._run is not None
        self._group = []  # (it moves the running requests' tokens)
        start, dts, cap, n, last_launch, recent0, ltt0, ctx = self._run
        recent = self.recent
        first = _first_kept(recent, k)
        now, prev = start, last_launch
        for i in range(first):
            prev = now
            now += dts[i]
        recent.clear()
        recent.extend(recent0)
        for i in range(first, k):
            # StepRecord(launch_time, duration_s, interval_s, prefill_budget,
            # num_prefill_tokens, num_decode_tokens, num_prefill_reqs, num_decode_reqs,
            # prefill_attn_work, prefill_kv_tokens, decode_ctx_tokens): step i's decodes
            # hold i more tokens each
            recent.append(make_step_record(now, dts[i], step_rules.step_interval(now, prev),
                                           cap, 0, n, 0, n, 0.0, 0, ctx + i * n))
            prev = now
            now += dts[i]
        moved = k - self._run_steps
        self._run_steps = k
        self._last_launch = prev if k else last_launch
        self.now = now
        self.num_steps += moved
        bs = self.block_size
        used = 0
        gaps = self.gaps
        gaps.truncate(self._run_gaps)
        if k:
            t1 = start + dts[0]
            one = gaps.one
            for ltt in ltt0:
                one.append(t1 - ltt)  # type: ignore[operator]  # a decode has a last token
            if k > 1:
                gaps.extend(dts[1:k], n)
        for r, ltt in zip(self.running, ltt0, strict=True):
            c = r.num_computed_tokens + moved
            r.num_computed_tokens = c
            r.num_output_tokens += moved
            r.last_token_time = now if k else ltt
            b = -(-c // bs)
            used += b - r.blocks
            r.blocks = b
        self.pool.take(used)

    def _chunk_run(self, limit: float) -> bool:
        """Up to ``limit``, the steps ``step()`` would run while the running requests are
        decodes that all sampled their last token at ``now`` and one request P mid-prompt
        (in any place among them), in one go, for a policy whose budgets there are a
        function of the clock and the computed tokens (``Policy.chunk_rule``).

        Each such step schedules every decode (one token) and P a chunk of the budget
        ``b``, as long as ``b`` is short of P's prompt's end (so P samples no token and the
        budget admits nobody), every token fits the global budget and the step's new KV
        blocks fit the free ones (so nobody is preempted), and it starts before ``limit``.
        The run stops before the first step that is not such a step (``step()`` takes
        that one: ``_single_next``, which holds through arrivals, as the rule does), or
        after the first at which a decode finishes (the rule knew the decodes: a new run
        may follow). Per step: the rule, one price (``CostModel.chunk_pricer``, or the
        rule's own, ``Policy.chunk_rule``, from the engine's cost model) and a few
        integer sums; the requests, the step records and the inter-token gaps are written
        once a run, as the steps would, and the decodes that finished leave as
        ``_advance`` has them leave, in the running order (the decode group, ``_group``,
        stays the running list's prefix of decodes, its members and their residues
        moving together, until one finishes). False when no step ran."""
        running = self.running
        now = self.now
        if now >= limit or len(running) - self._past_prompt != 1 or len(running) < 2:
            return False  # (not one prompt running beside decodes: step_rules.counts)
        bs = self.block_size
        head = None
        n = dctx = 0
        k_max = 1 << 62
        residues = [0] * bs  # residues[x]: the decodes with computed tokens = x mod bs
        for r in running:
            c = r.num_computed_tokens
            p = r.prompt_tokens
            if c < p:
                if head is not None:
                    return False
                head = r
            elif p + r.num_output_tokens - c != 1 or r.last_token_time != now:
                return False  # a recompute tail, or a decode not sampled at now
            else:
                n += 1
                dctx += c
                residues[c % bs] += 1
                left = r.output_len - r.num_output_tokens
                if left < k_max:
                    k_max = left
        if head is None or n == 0:
            return False
        rule = self.policy.chunk_rule(self._view())
        if rule is None:
            return False
        pool, price, chunk_price = self.pool, self._price, self._chunk_price
        # the rule's price of its chunk is the step's when it priced on this engine's model
        priced = self.policy.cost_model is self.cost_model
        room = self.mbt - n  # the global budget left after the decodes
        free = pool.num_free
        pc, pp, pb = head.num_computed_tokens, head.prompt_tokens, head.blocks
        pc0, dctx0 = pc, dctx  # (the first step's contexts: its record's)
        launches: list[float] = []
        dts: list[float] = []
        caps: list[int] = []
        launch, took, capped = launches.append, dts.append, caps.append
        k = 0
        broke = False  # (stopped before a step that is not a run's)
        while k < k_max and now < limit:
            b, dt = rule(now, pc, dctx)
            if b < 0:
                b = 0  # step_rules.enforced_budget with decodes running
            if b >= pp - pc or b > room:
                broke = True  # P would reach its prompt's end (or the budget admit)
                break
            grow = residues[-k % bs]  # the decodes whose computed tokens fill their block
            if b:
                extra = -(-(pc + b) // bs) - pb
                if grow + extra > free:
                    broke = True  # KvPool.needed: someone would be preempted
                    break
                # the step's shape: P's chunk (StepTally.add), then the decodes; the
                # rule's dt, when it gives one (> 0), is chunk_price's, the same float
                if not (priced and dt > 0.0):
                    dt = chunk_price(b, pc, n, dctx)
                pc += b
                pb += extra
                free -= grow + extra
            else:
                if grow > free:
                    broke = True
                    break
                dt = price(0, 0, 0.0, 0, n, dctx)  # the decode-only step
                free -= grow
            launch(now)
            took(dt)
            capped(b)
            now += dt
            dctx += n
            k += 1
        self._single_next = broke
        if not k:
            return False
        # The requests, as k steps leave them.
        head.num_computed_tokens = pc
        head.blocks = pb
        pool.num_free = free
        for r in running:
            if r is not head:
                r.num_computed_tokens = c = r.num_computed_tokens + k
                r.num_output_tokens += k
                r.last_token_time = now
                r.blocks = -(-c // bs)
        if k == k_max:  # (the step k_max - 1 finished a decode)
            done = [r for r in running
                    if r is not head and r.num_output_tokens >= r.output_len]
            for r in done:
                self._finish(r, now)
            for r in done:
                running.remove(r)
            self._past_prompt -= len(done)
            self._group, self._buckets = [], None  # (made again by the next steps)
        # Each step's gaps: every decode's, the step's end (the next launch: the same
        # sum) less its launch, in decode order (equal values).
        ends = launches[1:]
        ends.append(now)
        self.gaps.repeat_each(map(sub, ends, launches), n)  # (e - a, each in C)
        # The step records (the last ones the deque keeps).
        # Step i: P's chunk of caps[i] on the caps before it, the decodes i tokens longer.
        recent = self.recent
        last = self._last_launch
        first = _first_kept(recent, k)
        pc = pc0 + sum(caps[:first])
        for i in range(first, k):
            t = launches[i]
            if i:
                last = launches[i - 1]
            cap = caps[i]
            recent.append(make_step_record(
                t, dts[i], step_rules.step_interval(t, last), cap, cap, n,
                1 if cap else 0, n, causal_pairs(cap, pc) if cap else 0.0,
                pc + cap if cap else 0, dctx0 + i * n))
            pc += cap
        self._last_launch = launches[-1]
        self.now = now
        self.num_steps += k
        self._carried = caps[-1] > 0  # (P's chunk is mid-prompt)
        self.stalled = False
        self._forget_decode_run()
        # The decode group moves with its members: k more steps, k more tokens each.
        self._gstep += k
        self._group_ctx += k * len(self._group)
        self._group_time = now
        return True

    def rewind(self, t: float) -> None:
        """Undo the steps of the last decode run that start at or after ``t``, so that
        the engine is as if stepped only up to ``t`` (a request arriving at ``t`` joins
        the next step, as in ``simulate``). A no-op unless a run went past ``t``."""
        run = self._run
        if run is None or self.now <= t or self._last_launch is None or self._last_launch < t:
            return
        start, dts = run[0], run[1]
        k, now = 0, start
        while k < self._run_steps and now < t:
            now += dts[k]
            k += 1
        self._apply_run(k)

    def _view(self) -> SchedulerView:
        waiting = self.waiting
        num_waiting = len(waiting._front) + len(waiting._d)  # (len(waiting), in C)
        nd = self._past_prompt  # step_rules.counts(running, num_waiting)[1], kept
        log = waiting.log
        log.trim(num_waiting)
        log.front = waiting.followed()
        # SchedulerView(now, requests, num_pending_prefills, num_running_decodes,
        # max_num_batched_tokens, max_num_seqs, recent_steps, waiting_log,
        # waiting_prompt_tokens, prefix_caching, output_lengths, kv_shared_tokens), the
        # log only under FCFS (SchedulerView.waiting_log); only running requests hold
        # blocks (a preempted one frees its own), so the pool's count is theirs
        cache = self.pool.cache
        return make_view(self.now, self._chain, len(self.running) - nd + num_waiting, nd,
                         self.mbt, self.max_num_seqs, self.recent,
                         log if self._log_views else None, waiting.prompt_tokens,
                         self._prefix_caching, self.output_lengths,
                         0 if cache is None else cache.num_shared * cache.block_size)

    def _schedule(self, prefill_budget: int, held: bool = False,
                  chunk_limit: int = 0) -> _Scheduled:
        """One vLLM V1 ``schedule()``: the decodes scheduled (one token each) and the
        other chunks, with each chunk's place among the decodes (``_Scheduled``), the
        preempted requests and the scheduled chunks' tally. ``held``: a step the prefill
        cadence holds (step_rules rule 4b). Under FCFS a scheduled request is never
        preempted later in the step (victims come from the end of ``running``, past it);
        under priority a victim scheduled earlier has its chunk taken back, and the tally
        is then made again from the schedule (whose requests' counters this step has not
        moved)."""
        running, waiting, pool = self.running, self.waiting, self.pool
        cap = step_rules.PrefillCap(prefill_budget, chunk_limit)
        # vLLM's long_prefill_token_threshold (rule 4b), applied to every chunk before the
        # global budget and the hook, as vLLM orders them (0: none).
        lim = step_rules.long_prefill_limit(self.knobs, len(running) + len(waiting),
                                            self.mbt) if self._long_prefill else 0
        carried = False
        budget = self.mbt
        decodes: list[SimRequest] = []
        sched: list[tuple[SimRequest, int]] = []  # every other chunk, in vLLM's order
        places: list[int] = []  # places[k]: the decodes scheduled before sched[k]
        preempted: list[SimRequest] = []
        tally = step_rules.StepTally()
        cache = pool.cache
        counts_only = cache is None  # KvPool.needed/grow inlined for decodes
        bs = pool.bs
        decode_ctx = 0  # the decodes' tally (StepTally.add_decodes)
        taken_back = False  # a priority victim's chunk left the schedule: tally it again
        i = 0
        n_run = len(running)  # (changes only where a request is preempted, below)
        group = self._group
        self._group = []  # (until _advance: a step that returns early leaves no group)
        self._fast = 0
        k = len(group)
        if counts_only and k and k <= budget and running[:k] == group:
            # The decode group (``_group``): the loop below would take its k members
            # (each a decode, within the budget), each taking a block exactly when its
            # computed tokens fill their last one, unless the free blocks run out first;
            # when they do not, the members are scheduled at once, in C-level passes.
            g = self._gstep
            buckets = self._buckets
            if buckets is None:  # the group's first step: its residues and its context
                buckets = self._buckets = [[] for _ in range(bs)]
                ctx = 0
                for r in group:
                    c = r.num_computed_tokens
                    buckets[(c - g) % bs].append(r)
                    ctx += c
                self._group_ctx = ctx
            grow = buckets[-g % bs]  # (those with c % bs == 0: _buckets)
            if len(grow) <= pool.num_free:
                for r in grow:
                    r.blocks += 1
                pool.num_free -= len(grow)
                decodes = group  # (its list: taken from _group above, held by nothing else)
                decode_ctx = self._group_ctx
                self._fast = k
                i = k
                budget -= k
        while i < n_run and budget > 0:
            r = running[i]
            c, p = r.num_computed_tokens, r.prompt_tokens
            need = p + r.num_output_tokens - c
            if counts_only and need == 1 and c >= p and (c % bs or pool.num_free >= 1):
                # A decode the group did not take: one token, never held, limited or capped
                # (rules 3-4: not mid_chunk, past the prompt), scheduled while the budget
                # lasts and its block fits. A running request holds
                # ceil(num_computed_tokens / block_size) blocks (KvPool.grow before each
                # step's tokens, block counts only), so a decode takes one more block
                # exactly when its computed tokens fill their last one (KvPool.needed: 1).
                # A decode whose block does not fit takes the general path below (one to
                # preempt for), as every other chunk does.
                if not c % bs:
                    r.blocks += 1
                    pool.num_free -= 1
                decodes.append(r)
                decode_ctx += c
                i += 1
                budget -= 1
                continue
            if (need == 1 and c >= p and cache is not None and r.kv is not None
                    and cache.grow_decode(r.kv, r.block_hashes, c)):
                # The same decode under prefix caching: KvPool.needed/grow for one token
                # past the prompt (PrefixCache.grow_decode), when its block fits; one that
                # does not takes the general path below (one to preempt for).
                r.blocks = len(r.kv.block_ids)
                decodes.append(r)
                decode_ctx += c
                i += 1
                budget -= 1
                continue
            mid = c < p or need > 1  # step_rules.mid_chunk(c, p, num_tokens), inlined
            if held and mid:
                i += 1
                continue
            if 0 < lim < need:
                need = lim
            n = cap.clamp(c, p, need if need < budget else budget)
            if n <= 0:
                i += 1
                continue
            if counts_only:  # KvPool.needed/grow inlined: room without preempting anyone
                extra = -(-(c + n) // bs) - r.blocks
                if extra <= pool.num_free:
                    r.blocks += extra
                    pool.num_free -= extra
                    places.append(len(decodes))
                    sched.append((r, n))
                    tally.add(c, p, n)
                    budget -= n
                    cap.charge(c, p, n)
                    carried |= mid
                    i += 1
                    continue
            while pool.needed(r, n) > pool.free:
                if self.by_priority:  # vLLM: max by (priority, arrival_time), first if tied
                    victim = max(running, key=_priority_rank)
                    v = running.index(victim)
                    del running[v]
                    if v < i:
                        i -= 1
                    m = _take_back(victim, decodes, sched, places)
                    if m:  # its chunk this step is taken back
                        budget += m
                        taken_back = True
                else:
                    victim = running.pop()  # lowest priority: the last running request
                if victim.num_computed_tokens >= victim.prompt_tokens:
                    self._past_prompt -= 1
                pool.release(victim)
                victim.num_computed_tokens = 0
                victim.is_running = False
                victim.num_preemptions += 1
                waiting.appendleft(victim)
                preempted.append(victim)
                n_run = len(running)
                if victim is r:
                    break
            if not r.is_running:
                if self.skip_self_preempted:
                    continue  # vLLM 0.33: ``i`` already points at the next request
                break
            pool.grow(r, n)
            places.append(len(decodes))
            sched.append((r, n))
            tally.add(c, p, n)
            budget -= n
            cap.charge(c, p, n)
            carried |= mid
            i += 1
        tally.add_decodes(len(decodes), decode_ctx)  # (re-tallied if taken back)
        if taken_back:  # rare (priority preemption): the tally of what stayed scheduled
            tally = step_rules.StepTally()
            add = tally.add
            for q, m in _in_order(decodes, sched, places):
                add(q.num_computed_tokens, q.prompt_tokens, m)
        self._carried = carried
        if preempted:
            return decodes, sched, places, preempted, tally
        max_num_seqs = self.max_num_seqs
        # (WaitingQueue's head: its truth and its first member, read directly)
        while waiting.head is not None and budget > 0 and len(running) < max_num_seqs:
            r = waiting.head  # waiting[0]
            # A prefix-cache hit (vLLM's get_computed_blocks) skips the cached blocks: they
            # cost neither token budget nor prefill cap (none without a cache: KvPool.lookup).
            hit: Sequence[int] = () if counts_only else pool.lookup(r)
            c, p = r.num_computed_tokens + len(hit) * bs, r.prompt_tokens
            total = p + r.num_output_tokens
            need = total - c
            if held and need > 1:
                break  # the cadence holds admissions with prompt left to compute
            m = lim if 0 < lim < need else need
            n = cap.clamp(c, p, m if m < budget else budget)
            if n <= 0:
                break  # capped to nothing
            if counts_only:  # KvPool.needed/grow inlined (block counts, no hit)
                if -(-(c + need) // bs) - r.blocks > pool.num_free:
                    break  # the whole sequence does not fit (admission)
                waiting.popleft()
                r.is_running = True
                extra = -(-(c + n) // bs) - r.blocks
                r.blocks += extra
                pool.num_free -= extra
            else:
                if pool.needed(r, need, hit) > pool.free:
                    break  # the whole sequence does not fit (admission)
                waiting.popleft()
                r.is_running = True
                pool.grow(r, n, hit)
            if r.first_scheduled_time is None:
                r.first_scheduled_time = self.now
            running.append(r)
            if c >= p:  # (a preempted request's cached outputs can pass its prompt)
                self._past_prompt += 1
            places.append(len(decodes))
            sched.append((r, n))
            tally.add(c, p, n)
            budget -= n
            cap.charge(c, p, n)
            carried |= need > 1
        self._carried = carried
        return decodes, sched, places, preempted, tally

    def _advance(self, view: SchedulerView, cap: int, scheduled: _Scheduled) -> None:
        """Price the step (its chunks' tally), move the clock, sample tokens, finish
        requests, in vLLM's order: the decodes before each other chunk's place, then that
        chunk (the order of the inter-token gaps and of ``finished``)."""
        decodes, sched, places, preempted, tally = scheduled
        # step_time(tally.shape()), from the tally's fields (StepTally.shape's order)
        dt = self._price(tally.prefill_tokens, tally.prefill_reqs, tally.attn_work,
                         tally.prefill_kv, tally.decode_reqs, tally.decode_ctx)
        launch = self.now
        last = self._last_launch  # step_rules.step_interval, inlined
        interval = launch - last if last is not None else 0.0
        self._last_launch = launch
        self.now = now = launch + dt
        self.num_steps += 1
        if preempted:
            self.num_preemptions += len(preempted)
        # tally.record(launch, dt, interval, cap), inlined: StepRecord(launch_time,
        # duration_s, interval_s, prefill_budget, num_prefill_tokens, num_decode_tokens,
        # num_prefill_reqs, num_decode_reqs, prefill_attn_work, prefill_kv_tokens,
        # decode_ctx_tokens)
        self.recent.append(make_step_record(launch, dt, interval, cap, tally.prefill_tokens,
                                            tally.decode_reqs, tally.prefill_reqs,
                                            tally.decode_reqs, tally.attn_work,
                                            tally.prefill_kv, tally.decode_ctx))

        done: list[SimRequest] = []  # the requests finished, in order
        num_decodes = len(decodes)
        num_chunks = len(sched)
        j = k = 0  # the decodes and the chunks done
        fast = self._fast
        if fast:
            # The decode group's members lead the decodes (``_schedule``) and each sampled
            # its last token at ``_group_time``: their gaps are one value, in their order.
            self.gaps.repeat(now - self._group_time, fast)
            for r in decodes if fast == num_decodes else decodes[:fast]:
                r.num_computed_tokens += 1
                r.num_output_tokens = o = r.num_output_tokens + 1
                r.last_token_time = now
                if o >= r.output_len:
                    self._finish(r, now)
                    done.append(r)
            j = fast
        fast_done = len(done)  # (the group's members that finished lead ``done``)
        while True:
            end = places[k] if k < num_chunks else num_decodes
            if end > j:
                # Decodes: one token past the prompt, so each samples one (its computed
                # tokens reach prompt + outputs: step_rules.samples_token) after an earlier
                # token (outputs >= 1: first_token_time is set).
                gap = self.gaps.one.append
                for r in decodes if j == 0 and end == num_decodes else decodes[j:end]:
                    r.num_computed_tokens += 1
                    r.num_output_tokens = o = r.num_output_tokens + 1
                    gap(now - r.last_token_time)  # type: ignore[operator]
                    r.last_token_time = now
                    if o >= r.output_len:
                        self._finish(r, now)
                        done.append(r)
                j = end
            if k == num_chunks:
                break
            r, n = sched[k]
            k += 1
            c0 = r.num_computed_tokens
            c = c0 + n
            r.num_computed_tokens = c
            p = r.prompt_tokens
            if c0 < p <= c:
                self._past_prompt += 1  # the chunk reached the prompt's end
            o = r.num_output_tokens
            if c >= p + o:  # step_rules.samples_token, inlined (hot loop)
                r.num_output_tokens = o = o + 1
                if r.first_token_time is None:
                    r.first_token_time = now
                else:
                    self.gaps.one.append(now - r.last_token_time)  # type: ignore[operator]
                r.last_token_time = now
                if o >= r.output_len:
                    self._finish(r, now)
                    done.append(r)
        # The next step's decode group (``_group``): this step's first streak of decodes,
        # running[:places[0]] (the streak starts at running[0]), less those that finished;
        # none after a preemption (the running list moved) or under priority.
        # Its members by residue (``_buckets``) and their computed tokens (``_group_ctx``)
        # follow it: kept from the last step's when this one took the group at once (its
        # finished members out, the rest of the streak in), else made again.
        g = self._gstep = self._gstep + 1
        # (``decodes`` itself when the streak is all of them: copied below before a
        # member is removed, and never changed otherwise)
        group = (decodes if not num_chunks or places[0] == num_decodes
                 else decodes[:places[0]]) if not preempted and not self.by_priority else []
        bs = self.block_size
        if fast and group:
            buckets = self._buckets
            assert buckets is not None  # (made by _schedule, which took the group)
            ctx = self._group_ctx + fast
            if fast_done:
                for r in done[:fast_done]:
                    c = r.num_computed_tokens
                    buckets[(c - g) % bs].remove(r)
                    ctx -= c
            if len(group) > fast:
                for r in islice(group, fast, None):
                    if r.is_running:
                        c = r.num_computed_tokens
                        buckets[(c - g) % bs].append(r)
                        ctx += c
            self._group_ctx = ctx
        if done:  # (each scheduled, so running once; past its prompt)
            running = self.running
            for r in done:
                running.remove(r)  # (by identity, in C: the rest keep their order)
            self._past_prompt -= len(done)
            if group is decodes:
                group = group[:]
            for r in done:
                if r in group:
                    group.remove(r)
        if not fast:
            self._buckets = None  # (made when first used: _schedule)
        self._group = group
        self._group_time = now
        if self.record_steps:
            used = (self.total_blocks - self.pool.free) if self.total_blocks is not None else 0
            self.steps.append(StepTrace(
                time=launch, duration_s=dt, prefill_budget=cap,
                num_prefill_tokens=tally.prompt_tokens,
                num_recompute_tokens=tally.recompute_tokens,
                num_decode_tokens=tally.decode_reqs,
                num_decode_reqs=tally.decode_reqs + tally.tail_reqs,
                pending_prefills=view.num_pending_prefills,
                running_decodes=view.num_running_decodes, kv_blocks_used=used,
                scheduled=tuple((r.request_id, n)
                                for r, n in _in_order(decodes, sched, places)),
                preempted=tuple(r.request_id for r in preempted)))

    def _finish(self, r: SimRequest, now: float) -> None:
        """``r`` sampled its last token at ``now``: it leaves the engine (``_advance``
        drops it from ``running``) and frees its KV, or holds it (``hold_finished_kv``:
        ``release_kv`` frees it later)."""
        r.finish_time = now
        self.finished.append(r)
        self.output_lengths.record(r.num_output_tokens, r.max_output_tokens)
        r.is_running = False
        if self.hold_kv:
            self.num_held += 1
        else:
            self.pool.release(r)

    def result(self) -> SimResult:
        return SimResult(self.requests, self.num_steps, self.num_preemptions,
                         self.total_blocks, self.steps, self.gaps)


#: One step's schedule (``EngineSim._schedule``): the decodes (one token each), the other
#: chunks (request, tokens), each chunk's place (``places[k]`` decodes come before
#: ``chunks[k]`` in vLLM's order), the preempted requests, the tally of all the chunks.
_Scheduled = tuple[list[SimRequest], list[tuple[SimRequest, int]], list[int], list[SimRequest],
                   step_rules.StepTally]


def _in_order(decodes: list[SimRequest], chunks: list[tuple[SimRequest, int]],
              places: list[int]) -> list[tuple[SimRequest, int]]:
    """A schedule as vLLM orders it: (request, tokens), each decode with 1 token."""
    out: list[tuple[SimRequest, int]] = []
    j = 0
    for chunk, place in zip(chunks, places, strict=True):
        out.extend((r, 1) for r in decodes[j:place])
        out.append(chunk)
        j = place
    out.extend((r, 1) for r in decodes[j:])
    return out


def _take_back(victim: SimRequest, decodes: list[SimRequest],
               chunks: list[tuple[SimRequest, int]], places: list[int]) -> int:
    """Remove ``victim``'s chunk from a schedule being built (a priority preemption of a
    request scheduled earlier in the step): its tokens, 0 if it had none."""
    for k, (q, m) in enumerate(chunks):
        if q is victim:
            del chunks[k], places[k]
            return m
    for k, q in enumerate(decodes):
        if q is victim:
            del decodes[k]
            places[:] = [x - 1 if x > k else x for x in places]  # the decodes before each
            return 1
    return 0




def _first_kept(recent: deque[StepRecord], k: int) -> int:
    """The first of ``k`` new steps whose record ``recent`` keeps once all are appended
    (the last ``maxlen``)."""
    keep = recent.maxlen
    return k - keep if keep is not None and k > keep else 0


def _defined_in(cls: type, name: str) -> type:
    """The class of ``cls``'s MRO whose body defines ``name``."""
    return next(k for k in cls.__mro__ if name in vars(k))


def _priority_rank(r: SimRequest) -> tuple[int, float]:
    return r.priority, r.arrival_time


def _num_tokens(r: SimRequest) -> int:
    return r.prompt_tokens + r.num_output_tokens


def simulate(
    trace: Trace | Sequence[RequestSpec],
    policy: Policy,
    cost_model: CostModel,
    engine: EngineConfig | None = None,
    record_steps: bool = False,
) -> SimResult:
    """Replay ``trace`` through one ``EngineSim`` under ``policy`` (``replay``)."""
    specs = trace.requests if isinstance(trace, Trace) else trace
    return replay(EngineSim(policy, cost_model, engine, record_steps), specs)


def replay(sim: EngineSim, specs: Sequence[RequestSpec]) -> SimResult:
    """Drive ``sim`` over ``specs``: admit the arrivals up to the engine's clock, step
    while there is work, else jump to the next arrival; its result once all finished."""
    specs = sorted(specs, key=lambda s: s.arrival_s)
    i, n = 0, len(specs)
    while True:
        while i < n and specs[i].arrival_s <= sim.now:
            sim.add_request(specs[i])
            i += 1
        if sim.has_work():
            sim.run_until(specs[i].arrival_s if i < n else math.inf, arrivals=True)
        elif i < n:
            sim.idle_until(specs[i].arrival_s)
        else:
            return sim.result()
