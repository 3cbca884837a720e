"""One registry pattern for policies, cost models, hardware and models (mini-sglang style)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from ppas.errors import PpasError

T = TypeVar("T")


class Registry(Generic[T]):
    """String-keyed registry; unknown names raise a PpasError listing the choices."""

    def __init__(self, kind: str, sort_names: bool = False) -> None:
        self.kind = kind
        self.sort_names = sort_names  # list names alphabetically, else in registration order
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            self.add(name, obj)
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        if name in self._items:
            raise ValueError(f"duplicate {self.kind} {name!r}")
        self._items[name] = obj

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise PpasError(
                f"unknown {self.kind} {name!r}; allowed: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items) if self.sort_names else list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)
