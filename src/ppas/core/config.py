"""Config tables -> frozen dataclasses: one parser and one error wording for every config.

A config is a frozen dataclass whose ``__post_init__`` checks ranges. ``from_table`` builds
one from a mapping: a TOML table (cluster and experiment files), a JSON object (the vLLM
plugin's ``--additional-config``) or the ``key=value`` pairs of a config string such as
``ppas:n_th=2,b_max=16384,b_cap=2048`` (``parse_dataclass``: policies, routers, queues,
deflection rules). Typing rules: bool is not an int; an int is accepted for a float (and
converted); ``X | None`` takes None; ``tuple[X, ...]`` takes a list; a nested dataclass takes
a table. A config string's values are text, converted to the field's type (``none`` or empty
is None; ``true``/``false``, ``1``/``0``, ``yes``/``no``, ``on``/``off`` are bools).

The wording, one line: ``WHERE.KEY: PROBLEM``, where WHERE is the table's path (``engine``,
``pools[0]``, a config string's NAME such as ``ppas``) and a loader puts its file in front::

    exp.toml: engine.flavour: unknown key; allowed: dtype, max_model_len, ...
    ppas.b_cap: must be an integer, got '2k'
    pools[0].instances: must be >= 1, got 0

``require(cond, problem, key=KEY)`` in ``__post_init__`` reports the same way; a check without
a key is prefixed with WHERE alone (``ppas: n_th must be >= 1``).

A small stdlib helper rather than pydantic: the core imports numpy at most (pydantic comes
with vLLM, at the edge only), and these configs need five conversions and one wording.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from ppas.core.errors import PpasError
from ppas.core.limits import MAX_TIME_S, MIN_TIME_S

D = TypeVar("D")

_BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True,
               "0": False, "false": False, "no": False, "off": False}
_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_PLURAL = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}


class ConfigError(PpasError):
    """A bad config value, in the one wording: ``PATH: PROBLEM``."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)


class FieldError(PpasError):
    """A range check on field ``key`` failed (``require(..., key=)``); ``from_table`` reports
    it at the table's path. Alone it reads ``KEY: PROBLEM``."""

    def __init__(self, key: str, problem: str) -> None:
        self.key, self.problem = key, problem
        super().__init__(f"{key}: {problem}")


def require(cond: bool, problem: str, key: str = "") -> None:
    """Validation helper for ``__post_init__``: unless ``cond``, raise ``problem``, about
    field ``key`` when given (``from_table`` reports it as ``WHERE.KEY: problem``)."""
    if not cond:
        raise FieldError(key, problem) if key else PpasError(problem)


def _bound(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def check_fields(obj: object, *keys: str, at_least: float | None = None,
                 above: float | None = None, at_most: float | None = None,
                 one_of: Sequence[str] | None = None) -> None:
    """Range checks for ``__post_init__``: each field in ``keys`` is None, or >= ``at_least``,
    > ``above``, <= ``at_most`` and in ``one_of`` (those given); else
    ``KEY: must be >= 1, got 0``."""
    for k in keys:
        v = getattr(obj, k)
        if v is None:
            continue
        if at_least is not None:
            require(v >= at_least, f"must be >= {_bound(at_least)}, got {v!r}", key=k)
        if at_most is not None:
            require(v <= at_most, f"must be <= {_bound(at_most)}, got {v!r}", key=k)
        if above is not None:
            require(v > above, f"must be > {_bound(above)}, got {v!r}", key=k)
        if one_of is not None:
            require(v in one_of, f"must be one of {', '.join(one_of)}, got {v!r}", key=k)


def check_times(obj: object, *keys: str) -> None:
    """Each field in ``keys`` (seconds: an SLO, a target, a latency) is None or in
    ``[MIN_TIME_S, MAX_TIME_S]`` (``ppas.core.limits``)."""
    for k in keys:
        v = getattr(obj, k)
        require(v is None or MIN_TIME_S <= v <= MAX_TIME_S,
                f"must be in [{MIN_TIME_S:g}, {MAX_TIME_S:g}] s, got {v!r}", key=k)


def check_at_most(obj: object, hi: float, *keys: str) -> None:
    """For a config's ``__post_init__``: each field in ``keys`` is None or <= ``hi``, else
    ``KEY: must be <= HI, got V`` (``require``)."""
    for k in keys:
        v = getattr(obj, k)
        require(v is None or v <= hi, f"must be <= {_text(hi)}, got {v!r}", key=k)


def _text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def at(where: str, key: str) -> str:
    """The path of ``key`` in table ``where``: ``engine`` + ``dtype`` -> ``engine.dtype``;
    an index joins without a dot (``arms`` + ``[0]`` -> ``arms[0]``)."""
    if not where or not key:
        return where or key
    return where + key if key.startswith("[") else f"{where}.{key}"


def config_error(where: str, key: str, problem: str) -> ConfigError:
    """The one wording: ``WHERE.KEY: PROBLEM`` (one line)."""
    return ConfigError(at(where, key), problem)


def unknown_key(where: str, key: str, allowed: Sequence[str]) -> ConfigError:
    return config_error(where, key, f"unknown key; allowed: {', '.join(allowed) or '(none)'}")


def check_keys(table: object, where: str, allowed: Sequence[str] | type) -> dict[str, Any]:
    """A copy of ``table`` once it is a mapping whose keys are all in ``allowed`` (names, or
    a dataclass: its fields); else the one-line error."""
    if isinstance(allowed, type):
        allowed = init_fields(allowed)
    if not isinstance(table, Mapping):
        raise config_error(where, "", f"must be a table with keys {', '.join(allowed)}, "
                           f"got {table!r}")
    for k in table:
        if k not in allowed:
            raise unknown_key(where, str(k), allowed)
    return dict(table)


def init_fields(cls: type) -> list[str]:
    """The keys a config table of dataclass ``cls`` may have, in field order."""
    return [f.name for f in dataclasses.fields(cls) if f.init]


def from_table(cls: type[D], table: object, where: str = "", *, text: bool = False) -> D:
    """Build frozen dataclass ``cls`` from ``table`` (every key a field; ``text``: values are
    a config string's text). Errors are ``ConfigError`` in the one wording, at ``where``."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    t = check_keys(table, where, list(fields))
    hints = typing.get_type_hints(cls)
    kwargs = {k: _value(v, hints[k], at(where, k), text) for k, v in t.items()}
    for k, f in fields.items():
        if k not in t and f.default is dataclasses.MISSING \
                and f.default_factory is dataclasses.MISSING:
            raise config_error(where, k, "required")
    try:
        return cls(**kwargs)
    except FieldError as e:  # a range check naming its field
        raise config_error(where, e.key, e.problem) from None
    except PpasError as e:  # a check about the whole table
        raise config_error(where, "", str(e)) from None


def _value(v: Any, typ: Any, path: str, text: bool) -> Any:
    """``v`` as a value of type ``typ`` (see the module's typing rules)."""
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin is typing.Union or origin is types.UnionType:
        if v is None or (text and isinstance(v, str) and v.strip().lower() in ("none", "")):
            return None
        return _value(v, next(a for a in args if a is not type(None)), path, text)
    if isinstance(typ, type) and dataclasses.is_dataclass(typ):
        return from_table(typ, v, path, text=text)
    if origin is tuple:
        if not isinstance(v, list | tuple):
            of = f" of {_PLURAL[args[0]]}" if args and args[0] in _PLURAL else ""
            raise config_error(path, "", f"must be a list{of}, got {v!r}")
        each = [args[0]] * len(v) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(each) != len(v):
            raise config_error(path, "", f"must be a list of {len(each)}, got {v!r}")
        return tuple(_value(x, a, f"{path}[{i}]", text)
                     for i, (x, a) in enumerate(zip(v, each, strict=True)))
    if typ is Any or typ is object:
        return v
    if text and isinstance(v, str) and typ is not str:
        v = _from_text(v.strip(), typ)
    if typ is bool and isinstance(v, bool):
        return v
    if typ is int and isinstance(v, int) and not isinstance(v, bool):
        return v
    if typ is float and isinstance(v, int | float) and not isinstance(v, bool) \
            and math.isfinite(v):
        return float(v)
    if typ is str and isinstance(v, str):
        return v
    raise config_error(path, "", f"must be {_KINDS.get(typ, typ)}, got {v!r}")


def _from_text(s: str, typ: Any) -> Any:
    """A config string's text as ``typ``; the text itself when it is not one."""
    try:
        if typ is bool:
            return _BOOL_WORDS.get(s.lower(), s)
        f = float(s)
        if typ is int:
            return int(f) if f.is_integer() else s
        return f if typ is float and math.isfinite(f) else s
    except ValueError:
        return s


# ---------------------------------------------------------------- config strings


def split_spec(spec: str) -> tuple[str, str]:
    """``'ppas:n_th=2'`` -> ``('ppas', 'n_th=2')``; ``'mbt'`` -> ``('mbt', '')``."""
    name, _, args = spec.strip().partition(":")
    return name.strip(), args.strip()


def parse_dataclass(cls: type[D], name: str, args: str) -> D:
    """Build dataclass ``cls`` from the ARGS of a config string ``NAME[:ARGS]``: one
    positional value (bound to the first field, ``mbt:2048``) or ``key=value`` pairs."""
    keys = init_fields(cls)
    table: dict[str, str] = {}
    parts = [p.strip() for p in args.split(",")] if args else []
    if len(parts) == 1 and "=" not in parts[0]:
        if not keys:
            raise config_error(name, "", "takes no parameters")
        parts = [f"{keys[0]}={parts[0]}"]
    for part in parts:
        key, eq, val = part.partition("=")
        key = key.strip()
        if not eq or not key:
            raise config_error(name, "", f"malformed parameter {part!r}; expected key=value")
        if key in table:
            raise config_error(name, key, "given twice")
        table[key] = val.strip()
    return from_table(cls, table, name, text=True)


def config_string(name: str, cfg: object, omit: Sequence[str] = ()) -> str:
    """Dataclass ``cfg`` as the config string ``parse_dataclass`` reads back: ``NAME:`` and
    every field but ``omit`` as ``key=value``, in field order (bools ``true``/``false``)."""
    def text(v: object) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)

    args = [f"{k}={text(getattr(cfg, k))}" for k in init_fields(type(cfg)) if k not in omit]
    return f"{name}:{','.join(args)}"
