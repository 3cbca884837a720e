"""The KV room an admission may take: the footprint rule, by the future peak of KV use.

``ordered``'s footprint rule (rule 3) admits a waiting request only if the KV cache can
hold it, beside everything already running, to its last output with no preemption. The
sum of whole footprints (prompt + outputs) is enough for that, but it reserves every
running decode's last output from now on, although a decode holds ``b + s`` tokens ``s``
steps from now and nothing once it has finished. With outputs as long as the prompts
(chat, agents, reasoning) the sum keeps a large share of the cache empty: on an H100,
with 10x outputs, it left ``ordered`` 5.7% and 13.2% slower in mean E2E at 2x and 3x the
Azure code trace's rate, and 8.6 points of gain short on the Mooncake slice
(``docs/results/real-traffic.md``, "The footprint rule by the future peak").

**The peak rule** (``KvRoom.admit``). Steps from now ``s = 0, 1, ...``; each step gives
every decode one output (vLLM's step). Upper bounds on what each request holds:

* a decode (its prompt computed) with ``b`` tokens (prompt, outputs so far, block slack)
  and ``r`` outputs left holds at most ``b + s`` while ``s <= r``, and nothing after;
* a prompt still being prefilled (running, or admitted now) with ``b`` tokens (its whole
  prompt, as if computed at once) and footprint ``f`` holds at most ``min(f, b + s)``,
  for as long as the budgets make its prefill last: it is counted as never finishing.

Their sum ``U(s)`` is nondecreasing between two decodes' last steps, so its maximum is at
some decode's ``s = r_j`` or at the horizon, where every prompt holds ``f``. A request is
admitted iff ``U`` stays within the capacity at each of those points with it added.

**Shared blocks** (prefix caching). Requests that share a prefix hold its blocks once,
so the sum of what each holds counts them once per holder: by ``E`` tokens now
(``SchedulerView.kv_shared_tokens``, from the engine: the references beyond a block's
first, summed). A decode that finishes takes one reference off each of its blocks, and
so takes at most ``e_j`` off ``E``, its blocks that another request holds too
(``RequestView.num_shared_tokens`` of a running request). A prompt admitted now adds a
reference to each block of its hit that someone holds, raising ``E`` by one each: by
``h_i`` for the blocks two running requests hold (``num_shared_tokens`` of a waiting
request), which are in those requests' ``e_j`` already, and by one for each block one
running request holds, which may raise that request's ``e_j`` by one too: those two
cancel. So at step ``s`` the requests counted hold at least ``E + sum(h_i: admitted) -
sum(e_j: decodes finished by s)`` tokens jointly, and ``U(s)`` less that credit (at
least 0) is still an upper bound: a request is admitted iff it fits at every point
with the credit. Without caching ``E`` and every ``h_i`` are 0 and the rule is the one
above, bit for bit; with a system prompt every request shares, the credit is what lets
the cache hold more than a handful of them (``docs/results/prefix-caching.md``).

Invariants (``tests/test_kv_room.py``): every ``U(s)`` is at most the sum of the
footprints, so whatever the sum rule admits the peak rule admits, and while the sum fits
no peak is computed (``room``: the capacity less every footprint, the sum rule's room,
is never above the peak's room at any point); with the lengths exact, the requests held
and admitted never hold more than the capacity at any future step (checked step by step
against the bounds above). Cost: O(1) to set up (the caller sums the footprints, as the
sum rule did) and O(1) per admission the sum allows; the peak's arrays built once per step
on the first admission the sum refuses (O(running log running)), then O(distinct decode
lengths) per admission, in numpy.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ppas.core.view import RequestView

#: The horizon's step: past every decode's last, where a prompt holds its footprint.
HORIZON = 1 << 62


class KvRoom:
    """The KV cache one step's admissions may take (module doc).

    ``room``: the capacity less every held footprint (the sum rule's room; the caller
    sums it, with ``slack`` tokens of block rounding per request). ``running``: the
    running requests, read only if the sum refuses an admission and ``peak`` is on.
    ``shared``: the tokens they hold jointly, credited at each point as far as the
    requests still counted there hold them (module doc, "Shared blocks")."""

    __slots__ = ("capacity", "room", "peak", "_running", "_slack", "_admitted", "_steps",
                 "_free", "_shared", "_lost", "_decodes", "_first", "_pending")

    def __init__(self, capacity: int, room: int, running: Iterable[RequestView],
                 slack: int, peak: bool = True, shared: int = 0) -> None:
        self.capacity, self.room, self.peak = capacity, room, peak
        self._running, self._slack = running, slack
        # E + H: the running requests' joint tokens, plus the admitted prompts' hits on
        # blocks two running requests hold (module doc, "Shared blocks"; those of
        # ``_pending`` added when the credit is first needed)
        self._shared = shared
        self._admitted: list[tuple[int, int]] = []  # (b, f) of the prompts admitted so far
        self._steps: np.ndarray | None = None  # the points s (decodes' last steps, horizon)
        self._free: np.ndarray | None = None  # capacity - U(s) at each of them, no credit
        self._lost: np.ndarray | None = None  # the e_j of the decodes finished by each
        self._decodes: list[RequestView] | None = None  # by steps left (with the credit)
        self._first: np.ndarray | None = None  # decodes finished before each decode point
        self._pending: list[RequestView] = []  # admitted, their h_i not yet in _shared

    def admit(self, base: int, footprint: int, request: RequestView | None = None) -> bool:
        """Admit a prompt of ``base`` tokens (``b``: prompt, outputs it has, slack) and
        ``footprint`` (``f``: prompt, every output, slack) if the cache can hold it to
        its last output beside everything held (module doc); True if admitted.
        ``request``: the waiting request, whose hit on blocks two running requests hold
        (``num_shared_tokens``, O(hit)) is read only if an admission needs the credit."""
        if footprint <= self.room:  # the sum fits: so does the peak (module doc)
            self.room -= footprint
            if request is not None and self._shared:  # (E = 0: nothing two requests hold)
                self._pending.append(request)
            if self._free is not None and self._steps is not None:
                self._free -= np.minimum(footprint, base + self._steps)
            else:
                self._admitted.append((base, footprint))
            return True
        if not self.peak:
            return False
        if self._free is None:
            self._build()
        assert self._free is not None and self._steps is not None
        free = self._free - np.minimum(footprint, base + self._steps)
        if (free >= 0).all():
            if request is not None and self._shared:
                self._pending.append(request)
        elif self._decodes is not None:  # with the credit (module doc, "Shared blocks")
            if self._pending:
                self._shared += sum(r.num_shared_tokens for r in self._pending)
                self._pending.clear()
            h = 0 if request is None else request.num_shared_tokens
            if not (free + np.maximum(0, self._shared + h - self._lost_by_point()) >= 0).all():
                return False
            self._shared += h
        else:
            return False
        self._free = free
        self.room -= footprint
        return True

    def _lost_by_point(self) -> np.ndarray:
        """The ``e_j`` of the decodes finished before each point, summed (module doc)."""
        if self._lost is None:
            assert self._decodes is not None and self._first is not None
            shares = [r.num_shared_tokens for r in self._decodes]
            lost = np.concatenate(([0], np.cumsum(np.asarray(shares, dtype=np.int64))))
            self._lost = np.concatenate((lost[self._first], lost[-1:]))
        return self._lost

    def _build(self) -> None:
        """The peak's arrays from the running requests and the prompts admitted so far."""
        slack = self._slack
        lefts: list[int] = []
        bases: list[int] = []
        decodes: list[RequestView] = []  # with the credit only
        credit = self._shared > 0
        prompts = list(self._admitted)
        for r in self._running:
            p, o, cap = r.prompt_tokens, r.num_output_tokens, r.max_output_tokens
            b = p + o + slack
            if r.num_computed_tokens < p:  # a prompt still being prefilled
                prompts.append((b, p + max(cap, o) + slack))
            else:
                lefts.append(max(0, cap - o))
                bases.append(b)
                if credit:
                    decodes.append(r)
        left = np.asarray(lefts, dtype=np.int64)
        base = np.asarray(bases, dtype=np.int64)
        steps = np.unique(left)  # ascending
        order = np.argsort(left, kind="stable")
        sorted_left = left[order]
        tail_base = np.concatenate((np.cumsum(base[order][::-1])[::-1], [0]))
        first = np.searchsorted(sorted_left, steps, side="left")  # decodes alive at s
        alive = len(left) - first
        held = tail_base[first] + alive * steps
        steps = np.concatenate((steps, [HORIZON]))
        held = np.concatenate((held, [0]))
        for b, f in prompts:
            held += np.minimum(f, b + steps)
        if credit:  # (their e_j read only if an admission needs the credit: O(blocks))
            self._decodes = [decodes[i] for i in order]
            self._first = first
        self._steps = steps
        self._free = self.capacity - held
