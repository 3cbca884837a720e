"""Stopping an experiment: SIGINT/SIGTERM, or a failed worker, sets one flag that every
worker reads between runs and the run in flight polls.

Invariants: a set flag stays set; a signal that arrives while no run is being measured
(serial mode only) raises ``Interrupted`` at once, one that arrives during a run lets the
run's replay cancel itself and raise it (so no half-measured run is written); the previous
signal handlers are restored on the way out.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


class Interrupted(BaseException):
    """SIGINT/SIGTERM: stop now, keep what is complete."""


class StopFlag:
    """Set once, by a signal or a failed worker; ``cond`` wakes the workers waiting for an
    arm to become runnable."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.cond = threading.Condition()
        self._measuring = 0  # runs being measured now

    def set(self) -> None:
        self._event.set()
        with self.cond:
            self.cond.notify_all()

    def is_set(self) -> bool:
        return self._event.is_set()

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        """Around a run's replay: a signal during it only sets the flag."""
        self._measuring += 1
        try:
            yield
        finally:
            self._measuring -= 1

    @contextlib.contextmanager
    def signals(self, raise_outside_runs: bool) -> Iterator[None]:
        """SIGINT/SIGTERM set the flag while inside (main thread only)."""
        def handler(signum: int, frame: FrameType | None) -> None:
            self.set()
            if raise_outside_runs and not self._measuring:
                raise Interrupted

        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)
