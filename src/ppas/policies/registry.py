"""The policy registry and config-string entry point: ``make_policy('ppas:b_cap=1024')``."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ppas.core.registry import Registry

if TYPE_CHECKING:
    from ppas.policies.base import Policy

POLICIES: Registry[Any] = Registry("policy", sort_names=True)
_loaded = False


def register(name: str) -> Callable[[Any], Any]:
    """Class decorator: register a policy under ``name``, which also becomes its ``name``
    (the one place a policy is named)."""

    return POLICIES.register_class(name)


def _load() -> None:
    """Import every module of ``ppas.policies`` once (lazily, on the first lookup): a
    policy is one file whose class carries ``@register(NAME)``; nothing else lists it."""
    global _loaded
    if not _loaded:
        _loaded = True
        import ppas.policies as package

        for m in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{m.name}")


def policy_names() -> list[str]:
    _load()
    return POLICIES.names()


def make_policy(spec: str) -> Policy:
    """Parse a config string (``NAME[:k=v,...]``) into a policy instance."""
    _load()
    policy: Policy = POLICIES.make(spec)
    return policy
