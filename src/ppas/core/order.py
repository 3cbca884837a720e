"""Orders that share their ids: a ``Decision.prefill_order`` read off a list that only grows.

A policy that lists the same long head every step (``feather``'s aged requests, FCFS,
under overload thousands of them) would build a tuple of it every step, and an engine
that keeps its queue in the last order would compare that head with its own every step:
O(listed) twice, for a head that changed by a few ids. Here the policy appends its ids,
once each, to an ``IdLog``, whose ids never change once appended (it has no other
method that writes); a step's order is a ``LoggedOrder``: the log's ids ``[lo, hi)``,
then a few others. Two orders of one log whose ranges overlap list the same ids there,
so an engine that applied the last one checks the new one's head by identity and two
numbers (``ppas.engine.simulator.WaitingQueue``), and the policy builds it in O(1).

A ``LoggedOrder`` is a sequence of ids equal to the tuple of its ids (and hashes as it),
so a decision that carries one equals the same decision with a tuple.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain, islice
from typing import overload


class IdLog:
    """Ids appended, never changed: ``ids[i]`` is fixed once ``i < len``."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: list[str] = []

    def __len__(self) -> int:
        return len(self._ids)

    def extend(self, ids: Sequence[str]) -> None:
        self._ids.extend(ids)

    def order(self, lo: int, hi: int, tail: tuple[str, ...] = ()) -> LoggedOrder:
        """The ids ``[lo, hi)`` (0 <= lo <= hi <= len), then ``tail``."""
        if not 0 <= lo <= hi <= len(self._ids):
            raise ValueError(f"ids [{lo}, {hi}) not in a log of {len(self._ids)}")
        return LoggedOrder(self, lo, hi, tail)


class LoggedOrder(Sequence[str]):
    """``log``'s ids ``[lo, hi)`` then ``tail``: a tuple of ids, without its copy."""

    __slots__ = ("log", "lo", "hi", "tail")

    def __init__(self, log: IdLog, lo: int, hi: int, tail: tuple[str, ...]) -> None:
        self.log, self.lo, self.hi, self.tail = log, lo, hi, tail

    def then(self, more: tuple[str, ...]) -> LoggedOrder:
        """This order, then ``more``."""
        return LoggedOrder(self.log, self.lo, self.hi, self.tail + more)

    def ids(self) -> list[str]:
        """The log's list (read, never write: the invariant of ``IdLog``)."""
        return self.log._ids

    def __len__(self) -> int:
        return self.hi - self.lo + len(self.tail)

    def __iter__(self) -> Iterator[str]:
        return chain(islice(self.log._ids, self.lo, self.hi), self.tail)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[str, ...]: ...

    def __getitem__(self, i: int | slice) -> str | tuple[str, ...]:
        if isinstance(i, slice):
            return tuple(self)[i]
        n = self.hi - self.lo
        if i < 0:
            i += len(self)
        if 0 <= i < n:
            return self.log._ids[self.lo + i]
        return self.tail[i - n]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LoggedOrder):
            if (other.log is self.log and other.lo == self.lo and other.hi == self.hi
                    and other.tail == self.tail):
                return True
            return tuple(self) == tuple(other)
        if isinstance(other, tuple):
            return tuple(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))
