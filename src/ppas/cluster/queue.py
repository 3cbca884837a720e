"""The prefill pool's queue: which waiting prompts a free prefill instance takes next.

In a disaggregated cluster, arrivals wait in one pool-wide queue; when a prefill instance
has nothing left to prefill it takes a *batch*: queued prompts, in the discipline's order,
while their tokens fit in the instance's ``max_num_batched_tokens`` (the first one always
goes, however long; the engine chunks it).

* ``fcfs``: arrival order.
* ``laps:short_tokens=256`` (LAPS, arXiv 2601.11589 [R docs]): prompts of at most
  ``short_tokens`` tokens are batched and served before long ones; long ones are taken
  (FCFS) only when no short one waits.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

from ppas.core.config import require
from ppas.core.registry import Configured, NoConfig, Registry

QUEUES: Registry[Any] = Registry("queue discipline")


class PrefillQueue(Configured, ABC):
    """Queued prompts in FCFS lanes; a batch comes from the first lane that is not empty,
    so the discipline is which lane a prompt joins (``lane``)."""

    #: How many lanes the discipline uses (lane 0 is served first).
    num_lanes: ClassVar[int] = 1

    def __init__(self, config: Any, spec: str | None = None) -> None:
        super().__init__(config, spec)
        self._lanes: list[deque[tuple[int, int]]] = [deque() for _ in range(self.num_lanes)]
        #: Sum of the queued prompts' tokens (the deflection rule's "queue").
        self.queued_tokens = 0

    @abstractmethod
    def lane(self, prompt_tokens: int) -> int:
        """The lane a prompt of ``prompt_tokens`` tokens joins."""

    def push(self, item: int, prompt_tokens: int) -> None:
        """Enqueue request ``item`` (arrivals come in time order)."""
        self._lanes[self.lane(prompt_tokens)].append((item, prompt_tokens))
        self.queued_tokens += prompt_tokens

    def pop_batch(self, max_tokens: int) -> list[int]:
        """The next batch (empty only when the queue is): from the first non-empty lane,
        while the batch's tokens fit in ``max_tokens`` (the first prompt always goes)."""
        out: list[int] = []
        q = next((q for q in self._lanes if q), None)
        total = 0
        while q and (not out or total + q[0][1] <= max_tokens):
            item, n = q.popleft()
            out.append(item)
            total += n
        self.queued_tokens -= total
        return out

    def __len__(self) -> int:
        return sum(len(q) for q in self._lanes)


@QUEUES.register_class("fcfs")
class Fcfs(PrefillQueue):
    Config = NoConfig

    def lane(self, prompt_tokens: int) -> int:
        return 0


@dataclass(frozen=True)
class LapsConfig:
    short_tokens: int = 256

    def __post_init__(self) -> None:
        require(self.short_tokens >= 1, f"short_tokens must be >= 1, got "
                f"{self.short_tokens}")


@QUEUES.register_class("laps")
class Laps(PrefillQueue):
    """Short prompts first, batched; long ones only when no short one waits."""

    Config = LapsConfig
    num_lanes = 2

    def lane(self, prompt_tokens: int) -> int:
        return 0 if prompt_tokens <= self.config.short_tokens else 1


def make_queue(spec: str) -> PrefillQueue:
    made: PrefillQueue = QUEUES.make(spec)
    return made
