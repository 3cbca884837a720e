"""The cluster clock's events: one frozen record per kind.

Events are ordered by ``(time, order, seq)``: at equal times transfers land first, then
requests arrive, then steps start (so a step starting at ``t`` sees every request that
arrived at or before ``t``, as in ``ppas.engine.simulator.simulate``); ``seq``, the order
in which events were booked, breaks the remaining ties.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, slots=True)
class TransferLanded:
    """The KV of request ``request``'s prompt landed on decode instance ``decode`` (its
    position in the decode pool)."""

    time: float
    request: int
    decode: int
    order: ClassVar[int] = 0


@dataclass(frozen=True, slots=True)
class Arrival:
    """Request ``request`` (its position in the arrival-sorted trace) arrives."""

    time: float
    request: int
    order: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class StepStart:
    """Instance ``instance`` starts its next step. Stale unless ``version`` is still the
    instance's (a rewind books a new one and supersedes this)."""

    time: float
    instance: int
    version: int
    order: ClassVar[int] = 2


Event = TransferLanded | Arrival | StepStart
