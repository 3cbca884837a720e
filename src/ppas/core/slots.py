"""Fast positional builders for frozen, slotted dataclasses (``builder``).

A frozen dataclass's generated ``__init__`` sets each field through
``object.__setattr__`` (its own ``__setattr__`` raises); for the records an engine makes
at every step (``StepRecord``, ``StepShape``, ``SchedulerView``) that is a sizeable share
of the step. ``builder(cls)`` returns a function of the fields, in declaration order, that
allocates the object and fills its slots through the slots' own descriptors: the object
is the same as ``cls(*args)`` (same type, same field values, equal and hashing equal);
only the generated ``__init__`` is skipped, so a class with ``__post_init__``, a field
that is not in ``__init__`` or any slot that is not a field is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, is_dataclass
from typing import Any, TypeVar

T = TypeVar("T")


def builder(cls: type[T]) -> Callable[..., T]:
    """``make(*field_values) -> cls``, the same object as ``cls(*field_values)``."""
    if not (is_dataclass(cls) and cls.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__}: builder needs a frozen dataclass")
    names = [f.name for f in fields(cls)]
    if tuple(cls.__dict__.get("__slots__", ())) != tuple(names):
        raise TypeError(f"{cls.__name__}: builder needs slots equal to the fields")
    if hasattr(cls, "__post_init__") or not all(f.init for f in fields(cls)):
        raise TypeError(f"{cls.__name__}: builder would skip __post_init__ or a non-init "
                        "field")
    env: dict[str, Any] = {"new": object.__new__, "cls": cls}
    args = ", ".join(f"a{i}" for i in range(len(names)))
    lines = [f"def make({args}):", "    o = new(cls)"]
    for i, name in enumerate(names):
        env[f"s{i}"] = cls.__dict__[name].__set__
        lines.append(f"    s{i}(o, a{i})")
    lines.append("    return o")
    exec("\n".join(lines), env)  # noqa: S102  (code built from the field names above)
    make: Callable[..., T] = env["make"]
    make.__doc__ = f"{cls.__name__}({', '.join(names)}), positionally (ppas.core.slots)."
    return make
