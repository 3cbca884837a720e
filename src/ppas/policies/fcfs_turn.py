"""The FCFS turn: when first come, first served would have admitted a waiting request,
counted in uncached prompt tokens admitted (``ordered``'s rule 1, "The FCFS turn";
issue 20).

The clock is ``U``, the uncached prompt tokens of every request that has left the waiting
queue since the policy began to watch it (admitted, or aborted: under FCFS both are
ahead of a later arrival and gone before its turn), each counted as noted when it entered
the queue. A request first seen waiting while the queue holds ``A_i`` uncached prompt
tokens besides it gets the threshold ``theta_i = U + K * A_i``; it has *reached its turn*
once ``U >= theta_i``. With ``K = 1`` that is when FCFS would have admitted it: every
request in the queue when it arrived is ahead of it under FCFS (the earlier arrivals, and
preempted requests, which vLLM puts at the queue's front), and each adds its prompt to
``U`` as it leaves. A policy that reorders serves some later arrivals first; they add to
``U`` too, so a request passed by later ones reaches its turn no later, in tokens
admitted, than under FCFS (``K = 1``), and ``theta_i - U`` at its arrival is what may be
admitted before it, whoever arrives.

Invariants (``tests/test_fcfs_turn.py``): ``U`` never decreases and ``theta_i`` is fixed
once set (a preempted request keeps its own), so a request that has reached its turn keeps
it; ``note`` twice on the same view changes nothing (``ordered``'s two decision paths both
call it). Between two looks the requests that left the queue are counted first, then the
ones that entered, the new ones in (arrival, id) order (between two steps the engine
admits, then requests arrive). Where the view carries the engine's ``WaitingLog`` these
are read off the events since the last look, O(events) (a request's last event counts);
otherwise (another engine's view, a trimmed log) the queue is compared with the one last
seen, O(waiting): the same sets. Memory: the thresholds of requests no longer pending are
dropped once they outnumber the pending ones (a request preempted after that gets a new
one, as a new arrival would).
"""

from __future__ import annotations

import math
from itertools import islice

from ppas.core.view import (
    RequestView,
    SchedulerView,
    WaitingLog,
    is_pending_prefill,
    uncached_prompt_tokens,
)


def _arrival_id(r: RequestView) -> tuple[float, str]:
    return r.arrival_time, r.request_id


class FcfsTurns:
    """The clock ``U`` and the thresholds ``theta_i`` of one engine's waiting requests
    (module doc); ``k`` is ``K``."""

    __slots__ = ("k", "admitted", "queued", "queued_rem", "theta", "log", "pos")

    #: Thresholds kept beyond twice the pending requests before the stale ones go.
    SPARE = 4096

    def __init__(self, k: float) -> None:
        self.k = k
        self.admitted = 0  # U
        self.queued: dict[str, int] = {}  # the waiting requests, by id: their tokens
        self.queued_rem = 0  # sum(queued.values())
        self.theta: dict[str, float] = {}
        self.log: WaitingLog | None = None
        self.pos = 0

    def turned(self, request_id: str) -> bool:
        """Whether the request has reached its turn (one never seen waiting has: it was
        running before the policy watched)."""
        return self.admitted >= self.theta.get(request_id, -math.inf)

    def threshold(self, request_id: str) -> float:
        """``theta_i`` (-inf for a request never seen waiting)."""
        return self.theta.get(request_id, -math.inf)

    def note(self, view: SchedulerView) -> None:
        """Bring ``U`` and the thresholds up to ``view`` (idempotent on one view): the
        requests that left the queue since the last look add to ``U``, then the ones that
        entered it are queued, those never seen before in (arrival, id) order."""
        log = view.waiting_log
        left: list[str] = []
        entered: list[RequestView] = []
        if log is not None and log is self.log and log.base <= self.pos <= log.end:
            last: dict[str, tuple[bool, RequestView]] = {}  # each request's last event
            for entered_, r in islice(log.events, self.pos - log.base, None):
                last[r.request_id] = (entered_, r)
            for rid, (inside, r) in last.items():
                if rid in self.queued:
                    if not inside:
                        left.append(rid)
                elif inside:
                    entered.append(r)
        else:  # the queue in ``view`` against the one last seen
            now: dict[str, RequestView] = {}
            for r in view.requests:
                if not r.is_running:
                    now[r.request_id] = r
            left = [rid for rid in self.queued if rid not in now]
            entered = [r for rid, r in now.items() if rid not in self.queued]
        for rid in left:
            rem = self.queued.pop(rid)
            self.admitted += rem
            self.queued_rem -= rem
        entered.sort(key=_arrival_id)
        for r in entered:
            rid, rem = r.request_id, uncached_prompt_tokens(r)
            if rid not in self.theta:
                self.theta[rid] = self.admitted + self.k * self.queued_rem
            self.queued[rid] = rem
            self.queued_rem += rem
        self.log = log
        self.pos = log.end if log is not None else 0
        if len(self.theta) > 2 * view.num_pending_prefills + self.SPARE:
            self._prune(view)

    def _prune(self, view: SchedulerView) -> None:
        """Keep the thresholds of the pending requests only."""
        keep = {r.request_id for r in view.requests if is_pending_prefill(r)}
        keep.update(self.queued)
        self.theta = {rid: t for rid, t in self.theta.items() if rid in keep}
