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
from ppas.core.registry import Registry

QUEUES: Registry[Any] = Registry("queue discipline")


class PrefillQueue(ABC):
    name: ClassVar[str]  # set by @QUEUES.register_class(NAME)
    Config: ClassVar[type]

    def __init__(self, config: Any, spec: str | None = None) -> None:
        self.config = config
        self.spec = spec or self.name
        #: Sum of the queued prompts' tokens (the deflection rule's "queue").
        self.queued_tokens = 0

    @abstractmethod
    def push(self, item: int, prompt_tokens: int) -> None:
        """Enqueue request ``item`` (arrivals come in time order)."""

    @abstractmethod
    def pop_batch(self, max_tokens: int) -> list[int]:
        """The next batch (empty only when the queue is)."""

    @abstractmethod
    def __len__(self) -> int: ...


def _take(q: deque[tuple[int, int]], max_tokens: int, out: list[int]) -> int:
    """Pop from ``q`` while the batch's tokens fit (the first one always); returns tokens."""
    total = 0
    while q and (not out or total + q[0][1] <= max_tokens):
        item, n = q.popleft()
        out.append(item)
        total += n
    return total


@dataclass(frozen=True)
class FcfsConfig:
    pass


@QUEUES.register_class("fcfs")
class Fcfs(PrefillQueue):
    Config = FcfsConfig

    def __init__(self, config: Any, spec: str | None = None) -> None:
        super().__init__(config, spec)
        self._q: deque[tuple[int, int]] = deque()

    def push(self, item: int, prompt_tokens: int) -> None:
        self._q.append((item, prompt_tokens))
        self.queued_tokens += prompt_tokens

    def pop_batch(self, max_tokens: int) -> list[int]:
        out: list[int] = []
        self.queued_tokens -= _take(self._q, max_tokens, out)
        return out

    def __len__(self) -> int:
        return len(self._q)


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

    def __init__(self, config: LapsConfig, spec: str | None = None) -> None:
        super().__init__(config, spec)
        self._short: deque[tuple[int, int]] = deque()
        self._long: deque[tuple[int, int]] = deque()

    def push(self, item: int, prompt_tokens: int) -> None:
        q = self._short if prompt_tokens <= self.config.short_tokens else self._long
        q.append((item, prompt_tokens))
        self.queued_tokens += prompt_tokens

    def pop_batch(self, max_tokens: int) -> list[int]:
        out: list[int] = []
        self.queued_tokens -= _take(self._short if self._short else self._long, max_tokens, out)
        return out

    def __len__(self) -> int:
        return len(self._short) + len(self._long)


def make_queue(spec: str) -> PrefillQueue:
    made: PrefillQueue = QUEUES.make(spec)
    return made
