"""Fast positional builders for frozen, slotted dataclasses (``builder``).

A frozen dataclass's generated ``__init__`` sets each field through
``object.__setattr__`` (its own ``__setattr__`` raises); for the records an engine makes
at every step (``StepRecord``, ``StepShape``, ``SchedulerView``) that is a sizeable share
of the step. ``builder(cls)`` returns a function of the fields, in declaration order, that
fills an object of a private twin class (the same slots, in the same order, nothing else:
the same memory layout) by plain attribute stores, then makes it a ``cls`` by assigning
``__class__`` (which CPython allows exactly between such layouts, and checks). The object
is the same as ``cls(*args)`` (same type, same field values, equal and hashing equal,
frozen from then on); only the generated ``__init__`` is skipped, so a class with
``__post_init__``, a field that is not in ``__init__`` or any slot that is not a field is
refused.
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
    if cls.__bases__ != (object,):
        raise TypeError(f"{cls.__name__}: builder needs a class with no base but object "
                        "(its twin must have the same layout)")
    if hasattr(cls, "__post_init__") or not all(f.init for f in fields(cls)):
        raise TypeError(f"{cls.__name__}: builder would skip __post_init__ or a non-init "
                        "field")
    # The twin: a plain class with cls's slots (so stores to them are plain slot stores).
    twin = type(f"_{cls.__name__}Fill", (), {"__slots__": tuple(names)})
    env: dict[str, Any] = {"new": object.__new__, "cls": cls, "twin": twin}
    args = ", ".join(f"a{i}" for i in range(len(names)))
    lines = [f"def make({args}):", "    o = new(twin)"]
    lines += [f"    o.{name} = a{i}" for i, name in enumerate(names)]
    lines += ["    o.__class__ = cls", "    return o"]
    exec("\n".join(lines), env)  # noqa: S102  (code built from the field names above)
    make: Callable[..., T] = env["make"]
    make.__doc__ = f"{cls.__name__}({', '.join(names)}), positionally (ppas.core.slots)."
    return make
