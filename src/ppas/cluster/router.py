"""Routers: which instance gets a request (config strings, one registry).

A router sees the candidate instances through ``InstanceView`` (the colocated pool(s) for
an arrival; the decode pool for a finished prefill) and returns the chosen position. It
may keep state (round-robin's cursor) but never changes an instance.

* ``round-robin``: candidates in turn.
* ``least-outstanding-tokens``: fewest in-flight tokens (prompt + output tokens of the
  requests placed there and not finished), as production routers count them.
* ``earliest-completion`` (ours): the instance whose cost model predicts the earliest
  completion of this request, given its queue and running decodes
  (``InstanceView.predicted_finish``).
* ``pass-through``: always the first candidate (a cluster of one instance).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

from ppas.core.registry import Configured, NoConfig, Registry


class InstanceView(Protocol):
    """What a router may read about one instance."""

    @property
    def outstanding_tokens(self) -> int: ...

    def predicted_finish(self, prompt_tokens: int, output_tokens: int, now: float) -> float:
        """Predicted completion time of a new request placed here now."""
        ...


class Router(Configured, ABC):
    #: Whether ``route`` reads instance state beyond ``outstanding_tokens`` (the cluster
    #: then keeps those instances exactly at the routing time).
    reads_state: ClassVar[bool] = False

    @abstractmethod
    def route(self, prompt_tokens: int, output_tokens: int,
              instances: Sequence[InstanceView], now: float) -> int:
        """Position in ``instances`` (non-empty) of the instance that gets the request."""


ROUTERS: Registry[Any] = Registry("router")

@ROUTERS.register_class("pass-through")
class PassThrough(Router):
    Config = NoConfig

    def route(self, prompt_tokens: int, output_tokens: int,
              instances: Sequence[InstanceView], now: float) -> int:
        return 0


@ROUTERS.register_class("round-robin")
class RoundRobin(Router):
    Config = NoConfig

    def __init__(self, config: Any, spec: str | None = None) -> None:
        super().__init__(config, spec)
        self._next = 0

    def route(self, prompt_tokens: int, output_tokens: int,
              instances: Sequence[InstanceView], now: float) -> int:
        i = self._next % len(instances)
        self._next = i + 1
        return i


@ROUTERS.register_class("least-outstanding-tokens")
class LeastOutstandingTokens(Router):
    Config = NoConfig

    def route(self, prompt_tokens: int, output_tokens: int,
              instances: Sequence[InstanceView], now: float) -> int:
        return min(range(len(instances)), key=lambda i: instances[i].outstanding_tokens)


@ROUTERS.register_class("earliest-completion")
class EarliestCompletion(Router):
    """Ours: argmin over instances of the predicted completion time (ties: first)."""

    Config = NoConfig
    reads_state = True

    def route(self, prompt_tokens: int, output_tokens: int,
              instances: Sequence[InstanceView], now: float) -> int:
        return min(range(len(instances)),
                   key=lambda i: instances[i].predicted_finish(prompt_tokens, output_tokens, now))


def router_names() -> list[str]:
    return ROUTERS.names()


def make_router(spec: str) -> Router:
    made: Router = ROUTERS.make(spec)
    return made
