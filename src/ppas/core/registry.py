"""One registry pattern for policies, routers, queues, cost models, hardware and models
(mini-sglang style).

Configurable classes (policies, cluster routers and prefill queues) are registered with
``@REGISTRY.register_class(NAME)``, which also sets their ``name`` (the one place a class is
named), and built from a config string ``NAME[:k=v,...]`` by ``REGISTRY.make``: the class's
frozen ``Config`` dataclass parsed from the arguments, then ``cls(config, spec)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from ppas.core.config import parse_dataclass, split_spec
from ppas.core.errors import PpasError

T = TypeVar("T")
C = TypeVar("C", bound=type)


class Configured:
    """Base of the classes ``Registry.make`` builds: ``cls(config, spec)``, ``config`` the
    class's frozen ``Config`` parsed from the config string ``spec``."""

    name: ClassVar[str]  # set by ``register_class``
    Config: ClassVar[type]

    def __init__(self, config: Any, spec: str | None = None) -> None:
        self.config = config
        self.spec = spec or self.name


@dataclass(frozen=True)
class NoConfig:
    """The ``Config`` of a class that takes no parameters."""


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

    def register_class(self, name: str) -> Callable[[C], C]:
        """Class decorator: register the class under ``name``, which also becomes its
        ``name``."""

        def deco(cls: C) -> C:
            cls.name = name  # type: ignore[attr-defined]
            self.add(name, cls)  # type: ignore[arg-type]
            return cls

        return deco

    def make(self, spec: str) -> Any:
        """An instance of the registered class a config string ``NAME[:k=v,...]`` names;
        an empty or unknown name, or a bad argument, is a one-line ``PpasError``."""
        if not isinstance(spec, str) or not spec.strip():
            raise PpasError(f"empty {self.kind} config; allowed: {', '.join(self.names())}")
        name, args = split_spec(spec)
        cls: Any = self.get(name)
        return cls(parse_dataclass(cls.Config, name, args), spec.strip())

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
