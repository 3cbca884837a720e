"""The step rules: how one engine step turns a policy's ``Decision`` into a token schedule.

The simulator (``ppas.engine.simulator``) and the vLLM plugin (``ppas.vllm``) both call these
functions; each rule is written here once (``tests/test_differential.py`` checks that the
two engines then produce the same per-step schedule). vLLM V1's token-budget model
(P-PAS §3): there is no prefill or decode phase, only ``num_computed_tokens`` catching up
with ``num_tokens`` (prompt + outputs so far); a preempted request restarts from 0.

Rules, in the order a step applies them:

1. **Prefill chunk** (``is_prefill_chunk``): a chunk that *starts inside the prompt*
   (``num_computed < num_prompt_tokens``). A request with such a chunk pending (or
   waiting) is counted in N_p, a running request past its prompt in N_d (``counts``,
   ``is_pending_prefill``). This is the only test of "prefilling" in the code base.
2. **Liveness** (``enforced_budget``): the policy's budget, never negative, lifted to the
   global budget when it would stall an engine with prompts queued and no decode running.
   Nothing else retries or overrides a decision.
3. **Ordering** (``order_running``, ``order_waiting``): what vLLM's queues allow, as
   ``Decision`` documents it: ``prefill_order`` permutes the running prefill chunks among
   their own slots (decodes keep theirs) and sorts the waiting queue (stable: unlisted
   requests after the listed ones); ``decodes_first`` then moves every running decode ahead
   of the running prefill chunks (stable). The two flags are independent: a policy that
   orders prefills does not get decodes first unless it asks. Running requests are still
   served before waiting ones (vLLM's two loops). A consequence: since the running loop
   takes the cap and the budget first, a waiting request is only admitted once every
   running prompt got all it needed, so at most one running request is mid-prompt and
   both flags act mostly through the waiting queue; they matter for running requests
   once a per-request chunk limit lets several prompts run together.
   **Under ``--scheduling-policy priority``** (``priority=True``) the policy's order applies
   *within* a priority level, never across levels: the waiting queue is kept in
   ``priority_key`` order, vLLM's own heap key ``(priority, arrival_time, request_id)``
   with the policy's rank inserted after ``priority``, and running prefill chunks are
   permuted by ``(priority, rank)``. Why not let the order override priority: a vLLM
   user sets ``priority`` per request as a contract (a paid tier, an interactive class),
   and vLLM's own preemption under priority evicts the largest ``(priority,
   arrival_time)``; a policy that admitted a low-priority request ahead of a high one
   would both break the contract and admit the request vLLM evicts first. Within a level
   the policy decides exactly as under FCFS; without an order the key is vLLM's heap
   order, so an engine that sorts by it every step admits exactly as stock vLLM does.
4. **The cap** (``PrefillCap``): a prefill chunk gets ``min(its tokens, cap left)``,
   and no more than the decision's ``chunk_limit`` where it sets one, and is charged to
   the cap; a chunk past the prompt (a decode, or a recompute tail) is never
   capped. A request whose capped chunk is 0 is skipped (running loop) or stops admission
   (waiting loop), exactly vLLM's ``num_new_tokens == 0`` test. Sum of prefill-chunk tokens
   <= the enforced budget, every step. Where further limits go: one the plugin imposes (a
   per-request chunk cap, a "no prefill this step" rule) into ``PrefillCap.clamp``, which
   every chunk of both engines passes through; one vLLM applies itself before the hook
   (``long_prefill_token_threshold``, its global token budget) into the simulator's
   ``EngineSim._schedule`` next to the global budget, as vLLM orders them.
4b. **Stock vLLM's prefill knobs** (``EngineKnobs``, the ``vllm:`` baseline): vLLM's
   ``long_prefill_token_threshold`` limits every chunk before the global budget
   (``long_prefill_limit``, applied in ``EngineSim._schedule``, recompute tails included);
   ``prefill_schedule_interval`` holds every chunk of a request still short of its last
   token on most steps (``PrefillCadence``, vLLM 0.33's local cadence; 0.32 ignores it);
   ``max_num_active_seqs`` (else ``max_num_seqs``) stops admission from the waiting queue
   once that many requests run (``admission_limit``, 0.32 and 0.33 alike).
   In the plugin vLLM applies them itself.
5. **Recompute accounting** (``StepTally``): after a preemption a request recomputes its
   prompt (prefill chunks, capped) and then its earlier outputs, a *recompute tail* that
   starts past the prompt (not capped, its request counts in N_d). For cost, a chunk is
   priced as prefill when it is a prefill chunk or has more than one token (a tail of k
   tokens runs k queries over its context, like a prefill chunk); a decode is exactly one
   token past the prompt. The simulator prices steps and the plugin writes its step log
   (``prefill_chunks`` / ``decode_contexts``) and ``StepRecord``s with this one rule.
6. **Tokens and clocks** (``samples_token``, ``RECENT_STEPS``): a request samples a token
   at the end of a step whose chunk reaches its ``num_tokens`` (so the first token comes
   from the step with the last prompt chunk); that time is its ``last_token_time``.
   ``StepRecord.interval_s`` is the time between successive scheduler calls that
   launched a step (``step_interval``; 0 for the first), ``duration_s`` the step's
   completion-timed length; engines keep the last ``recent_steps_kept(policy)`` records.

numpy at most; no vllm import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar, cast

from ppas.core.decision import Decision, EngineKnobs
from ppas.core.view import SchedulerView, StepRecord, is_prefill_chunk, make_step_record
from ppas.cost.base import StepShape, causal_pairs, make_shape
from ppas.policies.base import Policy

#: StepRecords an engine keeps for policies at least (``recent_steps_kept``).
RECENT_STEPS = 16


class EngineRequest(Protocol):
    """An engine's own request object, as the step rules read it: vLLM's ``Request``, or
    the simulator's ``SimRequest``, which carries the same attribute names."""

    request_id: str
    num_prompt_tokens: int
    num_computed_tokens: int


R = TypeVar("R", bound=EngineRequest)


# -- 1. what is a prefill chunk; N_p / N_d ---------------------------------------------------
def counts(running: Sequence[EngineRequest], num_waiting: int) -> tuple[int, int]:
    """(N_p, N_d): running requests with a prefill chunk left plus every waiting request,
    and running requests past their prompt (P-PAS §3). One pass over ``running``."""
    nd = 0
    for r in running:
        if r.num_computed_tokens >= r.num_prompt_tokens:  # not is_prefill_chunk (inlined)
            nd += 1
    return len(running) - nd + num_waiting, nd


# -- 2. liveness -----------------------------------------------------------------------------
def enforced_budget(decision: Decision, view: SchedulerView) -> int:
    """The prefill cap an engine applies for ``decision``: never negative, and lifted to
    the global budget when it would stall an engine that has prompts queued and no decode
    to run (liveness: a policy can slow prefill down, never stop the server)."""
    b = decision.prefill_budget
    if b <= 0:
        if view.num_running_decodes == 0 and view.num_pending_prefills > 0:
            return view.max_num_batched_tokens
        return 0
    return b


# -- 3. ordering -----------------------------------------------------------------------------
def _ranker(order: Sequence[str]) -> Callable[[EngineRequest], int]:
    rank = {rid: i for i, rid in enumerate(order)}
    last = len(rank)
    return lambda r: rank.get(r.request_id, last)


class PrioritizedRequest(EngineRequest, Protocol):
    """An engine request under ``--scheduling-policy priority`` (vLLM's ``Request`` fields
    its heap compares, ``Request.__lt__``)."""

    priority: int
    arrival_time: float


def priority_key(decision: Decision) -> Callable[[PrioritizedRequest], tuple[int, int, float,
                                                                               str]]:
    """The waiting queue's order under ``--scheduling-policy priority`` (rule 3): vLLM's
    heap key ``(priority, arrival_time, request_id)`` with the policy's rank after
    ``priority`` (lower first; unlisted requests rank last within their level)."""
    rank = _ranker(decision.prefill_order or ())
    return lambda r: (r.priority, rank(r), r.arrival_time, r.request_id)


def order_running(running: list[R], decision: Decision, priority: bool = False) -> None:
    """Reorder ``running`` in place for ``decision`` (rule 3 of the module doc); under
    ``priority`` the prefill chunks are ranked within their priority level."""
    if decision.prefill_order:
        # the prefill chunks' slots (is_prefill_chunk, inlined: a pass over every running
        # request); one prefill chunk (the usual case) stays where it is
        slots = [i for i, r in enumerate(running) if r.num_computed_tokens < r.num_prompt_tokens]
        if len(slots) > 1:
            rank = _ranker(decision.prefill_order)
            key: Callable[[R], int | tuple[int, int]] = rank
            if priority:
                key = lambda r: (cast(PrioritizedRequest, r).priority, rank(r))  # noqa: E731
            for i, r in zip(slots, sorted((running[i] for i in slots), key=key), strict=True):
                running[i] = r
    if decision.decodes_first:
        pre = [r for r in running if is_prefill_chunk(r.num_computed_tokens, r.num_prompt_tokens)]
        if pre:
            running[:] = [r for r in running
                          if not is_prefill_chunk(r.num_computed_tokens, r.num_prompt_tokens)]
            running.extend(pre)


class WaitingQueue(Protocol):
    """A waiting queue as ``order_waiting`` reorders it: vLLM's (a deque) or the
    simulator's (``ppas.engine.simulator.WaitingQueue``, which also has ``move_to_front``)."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Any]: ...
    def clear(self) -> None: ...
    def extend(self, items: Iterable[Any], /) -> None: ...


def order_waiting(waiting: WaitingQueue, decision: Decision, priority: bool = False) -> None:
    """Put a waiting queue (a deque, served from its head) in admission order (rule 3).
    FCFS: a stable sort by ``decision.prefill_order``, nothing without one. ``priority``:
    sorted by ``priority_key`` every step, with or without an order (the engine keeps its
    priority queue as a deque in this order; vLLM's heap would pop the same sequence).
    A queue with ``move_to_front`` (the simulator's ``WaitingQueue``) is reordered by it
    under FCFS, to the same order in O(len(prefill_order)) (less where the decision's
    ``order_kept`` hint holds)."""
    if len(waiting) < 2 or not (priority or decision.prefill_order):
        return
    if not priority:
        move = getattr(waiting, "move_to_front", None)
        if move is not None:
            move(decision.prefill_order, decision.order_kept)
            return
    if priority:
        pkey = priority_key(decision)
        items = sorted(waiting, key=lambda r: pkey(cast(PrioritizedRequest, r)))
    else:
        items = sorted(waiting, key=_ranker(decision.prefill_order or ()))
    waiting.clear()
    waiting.extend(items)


# -- 4. the cap ------------------------------------------------------------------------------
class PrefillCap:
    """The step's prefill budget left and its per-chunk limit (rule 4; ``limit`` 0: none,
    ``Decision.chunk_limit``). ``clamp`` then ``charge`` every chunk."""

    __slots__ = ("left", "limit")

    def __init__(self, budget: int, limit: int = 0) -> None:
        self.left = budget
        self.limit = limit

    def clamp(self, num_computed_tokens: int, num_prompt_tokens: int, n: int) -> int:
        """Tokens a chunk of ``n`` may take: ``min(n, cap left, limit)`` for a prefill
        chunk (no limit when it is 0), ``n`` otherwise."""
        if num_computed_tokens >= num_prompt_tokens:
            return n
        m = n if n <= self.left else self.left
        lim = self.limit
        return lim if 0 < lim < m else m

    def charge(self, num_computed_tokens: int, num_prompt_tokens: int, n: int) -> None:
        """Charge a scheduled chunk of ``n`` tokens (prefill chunks only)."""
        if num_computed_tokens < num_prompt_tokens:
            self.left -= n


# -- 4b. stock vLLM's prefill knobs ---------------------------------------------------------
def long_prefill_limit(knobs: EngineKnobs, num_requests: int, input_budget: int) -> int:
    """vLLM's per-request chunk limit for a step with ``num_requests`` running or waiting
    (0: none). As ``Scheduler.schedule`` in 0.32 and 0.33: ``long_prefill_token_threshold``
    only when more than one request is eligible (nobody to starve otherwise), raised to
    ``max_num_batched_tokens // num_requests`` when ``..._adaptive``."""
    t = knobs.long_prefill_token_threshold if num_requests > 1 else 0
    if t > 0 and knobs.long_prefill_token_threshold_adaptive:
        t = max(t, input_budget // num_requests)
    return t


def mid_chunk(num_computed_tokens: int, num_prompt_tokens: int, num_tokens: int) -> bool:
    """vLLM's ``Request.is_prefill_chunk`` of a running request: its last chunk stopped
    short of its tokens (inside the prompt, or a recompute tail of more than one token
    left)."""
    return num_computed_tokens < num_prompt_tokens or num_tokens - num_computed_tokens > 1


class PrefillCadence:
    """vLLM 0.33's local ``prefill_schedule_interval`` (``Scheduler.schedule``, no data
    parallelism): a step is *held* when fewer than ``interval`` executed steps have passed
    since the last prefill-carrying one, a running request awaits a decode, and the last
    release step drained the waiting queue (``prefill_capacity_bound`` False). On a held
    step running requests mid-chunk are skipped and admission stops at the first waiting
    request with more than one token to compute; decodes run. One object per engine."""

    __slots__ = ("interval", "executed", "last_prefill", "capacity_bound")

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.executed = 0
        self.last_prefill = -interval  # a full interval back: the first step is never held
        self.capacity_bound = False

    def holds(self, running: Sequence[R], num_tokens: Callable[[R], int]) -> bool:
        if self.capacity_bound or (self.executed + 1) - self.last_prefill >= self.interval:
            return False
        return any(not mid_chunk(r.num_computed_tokens, r.num_prompt_tokens, num_tokens(r))
                   for r in running)

    def after_step(self, held: bool, scheduled_any: bool, carried_prefill: bool,
                   waiting_loop_ran: bool, num_waiting: int) -> None:
        """``carried_prefill``: a running request mid-chunk or an admission with more than
        one token to compute was scheduled; ``num_waiting`` after the step's admissions."""
        if waiting_loop_ran and not held:
            self.capacity_bound = num_waiting > 0
        if scheduled_any:
            self.executed += 1
        if carried_prefill:
            self.last_prefill = self.executed


def prefill_cadence(knobs: EngineKnobs) -> PrefillCadence | None:
    """The engine's cadence for ``knobs``, or None when vLLM would not hold prefill."""
    if knobs.prefill_schedule_interval > 1 and knobs.local_prefill_interval:
        return PrefillCadence(knobs.prefill_schedule_interval)
    return None


# -- 5. recompute accounting -----------------------------------------------------------------
def priced_as_prefill(num_computed_tokens: int, num_prompt_tokens: int, n: int) -> bool:
    """Whether a chunk of ``n`` tokens at ``num_computed_tokens`` costs as a prefill chunk:
    a prefill chunk, or a recompute tail of more than one token (rule 5)."""
    return n > 1 or num_computed_tokens < num_prompt_tokens


class StepTally:
    """One step's chunks, classified and summed (rule 5): the cost model's ``StepShape``,
    the ``StepRecord`` counts and, with ``keep=True``, the step log's lists."""

    __slots__ = ("prefill_tokens", "prefill_reqs", "attn_work", "prefill_kv", "decode_reqs",
                 "decode_ctx", "prompt_tokens", "tail_reqs", "chunks", "contexts")

    def __init__(self, keep: bool = False) -> None:
        self.prefill_tokens = self.prefill_reqs = self.prefill_kv = self.tail_reqs = 0
        self.decode_reqs = self.decode_ctx = self.prompt_tokens = 0
        self.attn_work = 0.0
        self.chunks: list[tuple[int, int]] | None = [] if keep else None
        self.contexts: list[int] | None = [] if keep else None

    def add(self, num_computed_tokens: int, num_prompt_tokens: int, n: int) -> None:
        """A chunk of ``n`` tokens that starts at ``num_computed_tokens`` cached tokens."""
        c = num_computed_tokens
        if n > 1 or c < num_prompt_tokens:  # priced_as_prefill(c, num_prompt_tokens, n)
            self.prefill_tokens += n
            self.prefill_reqs += 1
            self.attn_work += causal_pairs(n, c)
            self.prefill_kv += c + n
            if c < num_prompt_tokens:
                self.prompt_tokens += n
            else:
                self.tail_reqs += 1
            if self.chunks is not None:
                self.chunks.append((n, c))
        else:
            self.decode_reqs += 1
            self.decode_ctx += c
            if self.contexts is not None:
                self.contexts.append(c)

    def add_decodes(self, num_decodes: int, context: int) -> None:
        """``num_decodes`` decodes (one token past the prompt: not ``priced_as_prefill``)
        with ``context`` cached tokens in all: what ``add`` sums for each, at once."""
        self.decode_reqs += num_decodes
        self.decode_ctx += context

    @property
    def recompute_tokens(self) -> int:
        """Tokens of recompute tails (priced as prefill, not charged to the cap)."""
        return self.prefill_tokens - self.prompt_tokens

    def shape(self) -> StepShape:
        return make_shape(self.prefill_tokens, self.prefill_reqs, self.attn_work,
                          self.prefill_kv, self.decode_reqs, self.decode_ctx)

    def record(self, launch: float, duration: float, interval: float,
               prefill_budget: int) -> StepRecord:
        # StepRecord(launch_time, duration_s, interval_s, prefill_budget,
        # num_prefill_tokens, num_decode_tokens, num_prefill_reqs, num_decode_reqs,
        # prefill_attn_work, prefill_kv_tokens, decode_ctx_tokens)
        return make_step_record(launch, duration, interval, prefill_budget,
                                self.prefill_tokens, self.decode_reqs, self.prefill_reqs,
                                self.decode_reqs, self.attn_work, self.prefill_kv,
                                self.decode_ctx)


# -- 6. tokens and clocks --------------------------------------------------------------------
def samples_token(num_computed_after: int, num_tokens: int) -> bool:
    """Whether a request samples a token at the end of a step: its computed tokens (after
    the step) reach its token count (prompt + outputs so far)."""
    return num_computed_after >= num_tokens


def step_interval(now: float, last_launch: float | None) -> float:
    """``StepRecord.interval_s``: time since the previous scheduler call that launched a
    step (DLFP's original proxy; empty calls, which only relay finished requests, do not
    count)."""
    return now - last_launch if last_launch is not None else 0.0


def recent_steps_kept(policy: Policy) -> int:
    """How many StepRecords an engine keeps for ``policy``'s ``recent_steps``."""
    return max(RECENT_STEPS, policy.history_window)
