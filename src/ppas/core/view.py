"""The read-only view of scheduler state that every policy receives, every engine step.

The same view is produced by the simulator (``ppas.engine.simulator``) and by the vLLM adapter
(``ppas.vllm``), so a policy runs unchanged in both. vLLM's token-budget model: there is
no prefill or decode phase, only ``num_computed_tokens`` catching up with the prompt.
Which requests count as pending prefills (N_p) or decodes (N_d) is a step rule
(``ppas.engine.step_rules.is_pending_prefill``, P-PAS §3).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ppas.core.order import LoggedOrder
from ppas.core.slots import builder


class RequestView(Protocol):
    """What a policy may read about one request. Engines pass their own objects."""

    @property
    def request_id(self) -> str: ...
    @property
    def arrival_time(self) -> float: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def num_output_tokens(self) -> int: ...
    @property
    def max_output_tokens(self) -> int: ...
    @property
    def is_running(self) -> bool: ...
    @property
    def last_token_time(self) -> float | None: ...
    @property
    def ttft_slo(self) -> float | None: ...
    @property
    def tpot_slo(self) -> float | None: ...
    @property
    def block_hashes(self) -> Sequence[Hashable]:
        """Chained hashes of the request's full KV blocks (``BLOCK_SIZE`` tokens each,
        prompt first): equal i-th hashes mean equal first ``(i + 1) * BLOCK_SIZE`` tokens.
        Empty where the engine has none (prefix caching off)."""
        ...
    @property
    def num_cached_tokens(self) -> int:
        """For a waiting request, the prompt tokens it would take from the prefix cache if
        admitted now; 0 for running requests (their hits are in ``num_computed_tokens``)
        and where the engine does not look it up."""
        ...
    @property
    def num_shared_tokens(self) -> int:
        """Prefix caching: for a running request, the tokens of the KV blocks it holds
        that another request holds too (its release takes at most that many off the
        view's ``kv_shared_tokens``); for a waiting one, the tokens of its hit
        (``num_cached_tokens``) in blocks that two running requests hold. 0 without
        prefix caching, and where the engine does not count them (an engine that counts
        ``kv_shared_tokens`` counts these: ``ppas.policies.kv_room``, "Shared blocks")."""
        ...


#: Tokens per KV block, as in vLLM (``--block-size`` 16): the unit of ``block_hashes``.
BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class RequestSnapshot:
    """A plain RequestView (tests, adapters)."""

    request_id: str
    arrival_time: float
    prompt_tokens: int
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    max_output_tokens: int = 1
    is_running: bool = False
    last_token_time: float | None = None
    ttft_slo: float | None = None
    tpot_slo: float | None = None
    block_hashes: Sequence[Hashable] = ()
    num_cached_tokens: int = 0
    num_shared_tokens: int = 0


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One executed engine step, as fed back to policies (and written to the step log).

    ``duration_s`` is completion-timed: from the step's launch to its output arriving.
    ``interval_s`` is the time between successive scheduler calls (DLFP's original proxy;
    0 for an engine's first step). Prefill counts cover every chunk priced as prefill,
    recompute tails after a preemption included; decodes are single tokens past the prompt
    (``ppas.engine.step_rules``, rule 5).

    The last three fields complete the step's shape as the cost model prices it
    (``ppas.cost.base.StepShape``: ``prefill_attn_work``, ``prefill_kv_tokens``,
    ``decode_ctx_tokens``), so that a policy can compare a step's measured duration with
    its own cost model's price of the same step (``ppas.policies.model_clock``).
    Invariant: with them, ``StepShape(num_prefill_tokens, num_prefill_reqs,
    prefill_attn_work, prefill_kv_tokens, num_decode_reqs, decode_ctx_tokens)`` is the
    shape the engine ran (``StepTally.shape``); both engines fill them.
    """

    launch_time: float
    duration_s: float
    interval_s: float
    prefill_budget: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_prefill_reqs: int
    num_decode_reqs: int
    prefill_attn_work: float = 0.0
    prefill_kv_tokens: int = 0
    decode_ctx_tokens: int = 0

    @property
    def guarded(self) -> bool:
        """A step whose prefill ran beside decodes (DLFP's 'guarded' step)."""
        return self.num_prefill_tokens > 0 and self.num_decode_reqs > 0


#: ``StepRecord(*fields)``, positionally, without the frozen ``__init__`` (engines make one
#: per step: ``ppas.core.slots``).
make_step_record = builder(StepRecord)


class WaitingLog:
    """An engine's record of who entered and left its waiting queue, in order: the
    ``(True, request)`` of an arrival or a preemption, the ``(False, request)`` of an
    admission. ``events[i]`` is event number ``base + i``; the engine drops old events
    (``trim``, raising ``base``), so a reader that last read up to an event number below
    ``base`` must read the queue itself again. A policy that keeps an index of the waiting
    queue between steps (``ppas.policies.ordered``) applies the events since it last looked
    instead of reading the whole queue: what it knows still comes from the view.

    ``front``: None, or an order read off a log of ids (``ppas.core.order.LoggedOrder``)
    that the queue starts with: its first ``len(front)`` waiting requests are, in order,
    the ones its ids name, each the object of its last entering event (an engine that
    put a policy's order first and kept it so: the simulator; a policy that listed it
    knows the queue's head from it without reading the head).

    ``hits``: None, or (an engine with prefix caching that reports them: the simulator)
    the waiting requests whose ``num_cached_tokens`` changed, in order, as the cache
    caches the block after a hit or evicts one of its blocks (a request may be listed more
    than once, and may have left the queue by the time it is read). ``hits[i]`` is report
    number ``hits_base + i``. Invariant: a waiting request whose hit differs from the one
    it had when it was last read is listed since that read; so an index that reads a
    request's hit as it enters keeps its key exact by reading again the requests listed
    since it last looked (``tests/test_prefix_policies.py``)."""

    __slots__ = ("events", "base", "front", "hits", "hits_base")

    #: Events kept beyond twice the queue's length before ``trim`` drops them all.
    SPARE = 4096

    def __init__(self) -> None:
        self.events: list[tuple[bool, RequestView]] = []
        self.base = 0
        self.front: LoggedOrder | None = None
        self.hits: list[RequestView] | None = None
        self.hits_base = 0

    @property
    def end(self) -> int:
        """The number of the next event (one past the last)."""
        return self.base + len(self.events)

    def trim(self, queue_len: int) -> None:
        """Drop every event once more than ``2 * queue_len + SPARE`` are kept (a reader
        then reads the queue again: O(1) amortised per event)."""
        if len(self.events) > 2 * queue_len + self.SPARE:
            self.base += len(self.events)
            self.events.clear()
        hits = self.hits
        if hits is not None and len(hits) > 2 * queue_len + self.SPARE:
            self.hits_base += len(hits)
            hits.clear()  # (in place: the engine appends to this list)

    @property
    def hits_end(self) -> int:
        """The number of the next hit report (one past the last)."""
        return self.hits_base + (0 if self.hits is None else len(self.hits))


class OutputLengths:
    """An engine's record of where its finished requests stopped against their caps: what
    tells a policy whether a request's ``max_output_tokens`` (vLLM's ``max_tokens``) is its
    length or only a cap, and, when it is a cap, how long requests run.

    A replay with ``ignore_eos`` (the repository's live experiments, and every simulated
    trace without ``--max-tokens``) stops each request at its cap, so the caps are the
    lengths. Real clients send a cap (vLLM's default: ``max_model_len`` less the prompt)
    and most requests stop at an EOS well before it. Invariant: ``caps_are_lengths`` holds
    until the first request that stops (EOS, a stop string, the context's end) with fewer
    outputs than its cap, and never again after it (an aborted request says nothing and is
    not recorded). ``mean`` is the mean output count of every finished request recorded,
    ``lengths()`` their distribution."""

    __slots__ = ("finished", "early", "outputs", "counts", "_sorted")

    def __init__(self) -> None:
        self.finished = 0  # requests recorded
        self.early = 0  # ... that stopped before their cap
        self.outputs = 0  # their outputs, summed
        self.counts: dict[int, int] = {}  # requests by output count
        self._sorted: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    def record(self, outputs: int, cap: int) -> None:
        """A request stopped after ``outputs`` outputs, under a cap of ``cap``."""
        self.finished += 1
        self.outputs += outputs
        if outputs < cap:
            self.early += 1
        self.counts[outputs] = self.counts.get(outputs, 0) + 1
        self._sorted = None

    def lengths(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The output counts recorded, ascending, and how many requests stopped at each
        (sorted once per change: O(distinct counts log) then, O(1) after)."""
        if self._sorted is None:
            items = sorted(self.counts.items())
            self._sorted = (tuple(x for x, _ in items), tuple(n for _, n in items))
        return self._sorted

    def __copy__(self) -> OutputLengths:
        new = OutputLengths()
        new.finished, new.early, new.outputs = self.finished, self.early, self.outputs
        new.counts = self.counts.copy()
        return new

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OutputLengths):
            return NotImplemented
        return (self.finished, self.early, self.outputs, self.counts) == (
            other.finished, other.early, other.outputs, other.counts)

    __hash__ = None  # type: ignore[assignment]  # (mutable: compared by value, not hashed)

    def __repr__(self) -> str:
        return (f"OutputLengths(finished={self.finished}, early={self.early}, "
                f"outputs={self.outputs})")

    @property
    def caps_are_lengths(self) -> bool:
        return self.early == 0

    @property
    def mean(self) -> float:
        """The mean output count of the finished requests (0 before the first)."""
        return self.outputs / self.finished if self.finished else 0.0


@dataclass(frozen=True, slots=True)
class SchedulerView:
    """Scheduler state at the start of one step.

    ``requests``: running requests in the engine's order, then waiting ones FCFS.
    ``num_pending_prefills`` (N_p) counts running requests with prompt tokens left plus
    all waiting requests; ``num_running_decodes`` (N_d) counts running requests past their
    prompt (P-PAS §3; ``ppas.engine.step_rules.counts``). Engines compute both while building the
    view so that policies that need only counts cost O(1).
    ``waiting_log``: the waiting queue's ``WaitingLog`` where the engine keeps one and the
    queue is FCFS, so that ``prefill_order``'s listed requests go first and admission
    stops at the first it cannot admit (the simulator under ``--scheduling-policy fcfs``);
    None otherwise (the vLLM plugin, hand-made views). A waiting request's fields do not
    change while it waits, but for ``num_cached_tokens`` where ``prefix_caching``.
    ``waiting_prompt_tokens``: the sum of ``prompt_tokens`` over the waiting requests,
    where the engine keeps it as the queue changes (the simulator), so that a policy that
    needs the pending prompts' total reads the running ones only; None: read the requests.
    ``prefix_caching``: the engine caches prefixes, so a waiting request's
    ``num_cached_tokens`` may change while it waits (an index keyed on it must be rebuilt
    from the requests, not kept from ``waiting_log``, unless the log reports those changes:
    ``WaitingLog.hits``).
    ``output_lengths``: the engine's ``OutputLengths`` (the simulator and the vLLM
    plugin); None (hand-made views): every cap is taken for the request's length.
    ``kv_shared_tokens``: the KV tokens the running requests hold jointly (prefix
    caching: blocks several requests reference), counted once per holder beyond the
    first: ``BLOCK_SIZE * (sum of the blocks each running request holds - blocks
    held)``. A sum of the running requests' tokens counts them that much too often. 0
    without prefix caching, and where the engine does not count them (hand-made views).
    """

    now: float
    requests: Sequence[RequestView]
    num_pending_prefills: int
    num_running_decodes: int
    max_num_batched_tokens: int
    max_num_seqs: int
    recent_steps: Sequence[StepRecord] = field(default_factory=tuple)
    waiting_log: WaitingLog | None = None
    waiting_prompt_tokens: int | None = None
    prefix_caching: bool = False
    output_lengths: OutputLengths | None = None
    kv_shared_tokens: int = 0


def caps_are_lengths(view: SchedulerView) -> bool:
    """Whether ``view``'s requests' ``max_output_tokens`` are their lengths, as far as its
    engine has seen (``OutputLengths``; True without a record)."""
    o = view.output_lengths
    return o is None or o.caps_are_lengths


#: ``SchedulerView(*fields)``, positionally, every field given, without the frozen
#: ``__init__`` (the simulator makes one per step: ``ppas.core.slots``).
make_view = builder(SchedulerView)


# -- what counts as prefill (P-PAS §3: N_p / N_d) ------------------------------------------
def is_prefill_chunk(num_computed_tokens: int, num_prompt_tokens: int) -> bool:
    """A chunk starting at ``num_computed_tokens`` is a prefill chunk (inside the prompt)."""
    return num_computed_tokens < num_prompt_tokens


def is_pending_prefill(r: RequestView) -> bool:
    """A request the policy counts in N_p: waiting, or running with a prefill chunk left."""
    return not r.is_running or is_prefill_chunk(r.num_computed_tokens, r.prompt_tokens)


def pending_prefills(view: SchedulerView) -> list[RequestView]:
    """The requests of ``view`` counted in N_p, in the view's order."""
    return [r for r in view.requests if is_pending_prefill(r)]


def view_counts(requests: Sequence[RequestView]) -> tuple[int, int]:
    """(N_p, N_d) of a list of request views (tests)."""
    np_ = sum(1 for r in requests if is_pending_prefill(r))
    return np_, len(requests) - np_


def uncached_prompt_tokens(r: RequestView) -> int:
    """Prompt tokens a request still has to compute, net of the prefix-cache hit it would
    get if admitted now (at least 1: vLLM always computes the last token)."""
    return max(1, r.prompt_tokens - r.num_computed_tokens - r.num_cached_tokens)
