"""Config strings such as ``ppas:n_th=2,b_max=16384,b_cap=2048`` -> frozen dataclasses.

Grammar: ``NAME[:ARGS]`` where ARGS is either one positional value (bound to the class's
first field, e.g. ``mbt:2048``) or comma-separated ``key=value`` pairs. Values are converted
to the dataclass field's type; the dataclass validates ranges in ``__post_init__`` (its
messages name the field; ``parse_dataclass`` prefixes the config's NAME, so an error in
``dlfp-completion:...`` says ``dlfp-completion:``).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, TypeVar

from ppas.core.errors import PpasError

D = TypeVar("D")


def split_spec(spec: str) -> tuple[str, str]:
    """``'ppas:n_th=2'`` -> ``('ppas', 'n_th=2')``; ``'mbt'`` -> ``('mbt', '')``."""
    name, _, args = spec.strip().partition(":")
    return name.strip(), args.strip()


def _convert(value: str, typ: Any, where: str) -> Any:
    origin = typing.get_origin(typ)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value.lower() in ("none", ""):
            return None
        return _convert(value, args[0], where)
    try:
        if typ is bool:
            low = value.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if typ is int:
            f = float(value)
            if not f.is_integer():
                raise ValueError
            return int(f)
        if typ is float:
            f = float(value)
            if not math.isfinite(f):
                raise ValueError
            return f
        return typ(value)
    except (ValueError, TypeError):
        tname = getattr(typ, "__name__", str(typ))
        raise PpasError(f"{where}: {value!r} is not a valid {tname}") from None


def parse_dataclass(cls: type[D], name: str, args: str) -> D:
    """Build dataclass ``cls`` from the ARGS part of a config string."""
    fields = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    allowed = ", ".join(f.name for f in fields) or "(none)"
    kwargs: dict[str, Any] = {}
    if args:
        parts = [p.strip() for p in args.split(",")]
        if len(parts) == 1 and "=" not in parts[0]:
            if not fields:
                raise PpasError(f"{name!r} takes no parameters")
            parts = [f"{fields[0].name}={parts[0]}"]
        by_name = {f.name: f for f in fields}
        for part in parts:
            key, eq, val = part.partition("=")
            key = key.strip()
            if not eq or not key:
                raise PpasError(f"{name}: malformed parameter {part!r}; expected key=value")
            if key not in by_name:
                raise PpasError(f"{name}: unknown parameter {key!r}; allowed: {allowed}")
            if key in kwargs:
                raise PpasError(f"{name}: parameter {key!r} given twice")
            kwargs[key] = _convert(val.strip(), hints[key], f"{name}.{key}")
    try:
        return cls(**kwargs)
    except TypeError as e:  # missing required field
        raise PpasError(f"{name}: {e}; parameters: {allowed}") from None
    except PpasError as e:  # a range check in __post_init__: name the config it came from
        raise PpasError(f"{name}: {e}") from None


def require(cond: bool, msg: str) -> None:
    """Validation helper for ``__post_init__``: raise PpasError(msg) unless cond."""
    if not cond:
        raise PpasError(msg)

