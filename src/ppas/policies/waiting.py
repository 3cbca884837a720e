"""An index of an engine's waiting queue, kept between steps from its ``WaitingLog``.

A policy whose per-step rule sorts the waiting queue (``sorted-f``, ``lprs-apc``) keeps
its waiting requests in its own order instead: each arrival, preemption and admission is
applied once, as the view's ``waiting_log`` reports it (``ppas.core.view.WaitingLog``),
and the queue is read whole again only when the log cannot be followed (another engine's
log, a trimmed one, a count that disagrees with the view). What the index holds is thus a
function of what the views have shown, as the policy's decisions must be.

Subclasses make an entry per request on ``add`` (from fields that do not change while it
waits: not ``num_cached_tokens`` under a prefix cache, ``SchedulerView.prefix_caching``)
and drop their own stale entries lazily (an entry counts while it is the one in ``live``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from itertools import islice
from typing import Any

from ppas.core.view import RequestView, SchedulerView, WaitingLog


class WaitingIndex(ABC):
    """The waiting requests of the engine whose log was last followed, by id (``live``)."""

    def __init__(self) -> None:
        self.log: WaitingLog | None = None
        self.pos = 0  # the number of the next event to read
        self.live: dict[str, Any] = {}

    @abstractmethod
    def add(self, r: RequestView) -> None:
        """``r`` entered the waiting queue (``live[r.request_id]`` becomes its entry)."""

    def discard(self, r: RequestView) -> None:
        """``r`` left the waiting queue."""
        self.live.pop(r.request_id, None)

    def clear(self) -> None:
        """Forget every request (``rebuild`` adds them again)."""
        self.live.clear()

    @abstractmethod
    def compact(self) -> None:
        """Called after each batch of events: drop stale entries if they are too many."""

    def sync(self, view: SchedulerView, log: WaitingLog) -> int:
        """Bring the index up to ``view`` (whose ``waiting_log`` is ``log``) and return
        the number of running requests at the head of ``view.requests``: from the log's
        events since the last call, or, when they cannot be followed or the count they
        give does not split the view's requests into running then waiting, from the
        requests themselves (every waiting one added again)."""
        reqs = view.requests
        n_req = len(reqs)
        if log is self.log and self.pos >= log.base:
            live = self.live
            events = log.events
            k = self.pos - log.base
            if k < len(events):  # (none since the last call: nothing to apply)
                for entered, r in events[k:]:
                    if entered:
                        self.add(r)
                    elif r.request_id in live:
                        self.discard(r)
                self.pos = log.base + len(events)  # (log.end)
                self.compact()
            n = n_req - len(live)
            if 0 <= n <= n_req and (n == 0 or reqs[n - 1].is_running) and (
                    n == n_req or not reqs[n].is_running):
                return n
        return self.rebuild(reqs, log)

    def rebuild(self, reqs: Sequence[RequestView], log: WaitingLog) -> int:
        self.clear()
        self.log, self.pos = log, log.end
        n = 0
        for r in reqs:
            if not r.is_running:
                break
            n += 1
        for r in islice(reqs, n, None):
            self.add(r)
        return n
