"""``ppas.core.config``: one parser from a table (TOML, JSON, a config string) to a frozen
dataclass, and its one error wording ``WHERE.KEY: PROBLEM``."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from ppas.core.config import (
    FieldError,
    check_fields,
    check_keys,
    config_string,
    from_table,
    parse_dataclass,
    require,
    split_spec,
)
from ppas.core.errors import PpasError


@dataclass(frozen=True)
class Inner:
    rate: float = 1.0

    def __post_init__(self) -> None:
        check_fields(self, "rate", above=0)


@dataclass(frozen=True)
class Outer:
    name: str
    size: int = 1
    on: bool = False
    cap: int | None = None
    mode: str = "a"
    tags: tuple[str, ...] = ()
    inner: Inner = field(default_factory=Inner)
    items: tuple[Inner, ...] = ()

    def __post_init__(self) -> None:
        check_fields(self, "size", "cap", at_least=1)
        check_fields(self, "mode", one_of=("a", "b"))
        require(self.size <= 100 or self.on, "a size above 100 needs on = true")


def test_builds_typed_and_nested() -> None:
    o = from_table(Outer, {"name": "x", "size": 3, "on": True, "tags": ["p", "q"],
                           "inner": {"rate": 2}, "items": [{}, {"rate": 0.5}]}, "t")
    assert o == Outer("x", 3, True, None, "a", ("p", "q"), Inner(2.0), (Inner(), Inner(0.5)))
    assert isinstance(o.inner.rate, float)  # an int is accepted for a float


@pytest.mark.parametrize(("table", "message"), [
    ({"name": "x", "colour": 1},
     "t.colour: unknown key; allowed: name, size, on, cap, mode, tags, inner, items"),
    ({}, "t.name: required"),
    ({"name": "x", "size": True}, "t.size: must be an integer, got True"),  # bool is no int
    ({"name": "x", "size": 2.0}, "t.size: must be an integer, got 2.0"),
    ({"name": "x", "on": 1}, "t.on: must be true or false, got 1"),
    ({"name": 3}, "t.name: must be a string, got 3"),
    ({"name": "x", "tags": "p"}, "t.tags: must be a list of strings, got 'p'"),
    ({"name": "x", "tags": ["p", 2]}, "t.tags[1]: must be a string, got 2"),
    ({"name": "x", "inner": 3}, "t.inner: must be a table with keys rate, got 3"),
    ({"name": "x", "inner": {"rate": "fast"}}, "t.inner.rate: must be a number, got 'fast'"),
    ({"name": "x", "inner": {"rate": float("inf")}}, "t.inner.rate: must be a number, got inf"),
    ({"name": "x", "items": [{}, {"rate": 0}]}, "t.items[1].rate: must be > 0, got 0.0"),
    ({"name": "x", "size": 0}, "t.size: must be >= 1, got 0"),
    ({"name": "x", "cap": 0}, "t.cap: must be >= 1, got 0"),
    ({"name": "x", "mode": "c"}, "t.mode: must be one of a, b, got 'c'"),
    ({"name": "x", "size": 200}, "t: a size above 100 needs on = true"),
])
def test_one_wording(table: object, message: str) -> None:
    with pytest.raises(PpasError) as e:
        from_table(Outer, table, "t")
    assert str(e.value) == message


def test_a_root_table_has_no_prefix() -> None:
    with pytest.raises(PpasError, match=r"^colour: unknown key; allowed: name,"):
        from_table(Outer, {"name": "x", "colour": 1})
    with pytest.raises(PpasError, match=r"^must be a table with keys name, size"):
        from_table(Outer, [1])


def test_config_strings_are_text() -> None:
    o = parse_dataclass(Outer, "o", "name=x,size=1e1,on=yes,cap=none")
    assert (o.size, o.on, o.cap) == (10, True, None)
    assert parse_dataclass(Outer, "o", "y") == Outer("y")  # one value: the first field
    for args, message in (("name=x,size=2.5", "o.size: must be an integer, got '2.5'"),
                          ("name=x,on=maybe", "o.on: must be true or false, got 'maybe'"),
                          ("name=x,bogus=1", "o.bogus: unknown key; allowed: name, size,"),
                          ("name=x,name=y", "o.name: given twice"),
                          ("name=x,size", "o: malformed parameter 'size'; expected key=value"),
                          ("size=0,name=x", "o.size: must be >= 1, got 0")):
        with pytest.raises(PpasError) as e:
            parse_dataclass(Outer, "o", args)
        assert str(e.value).startswith(message), (args, str(e.value))


def test_checks_read_alone() -> None:
    """Built directly, a dataclass's checks still name their field."""
    with pytest.raises(FieldError, match=r"^size: must be >= 1, got 0$"):
        Outer("x", size=0)
    assert check_keys({"a": 1}, "w", ("a", "b")) == {"a": 1}
    assert check_keys({"rate": 1}, "w", Inner) == {"rate": 1}


def test_config_string_reads_back() -> None:
    o = Outer("x", 3, True, None, "b")
    s = config_string("o", o, omit=("tags", "inner", "items"))
    assert s == "o:name=x,size=3,on=true,cap=None,mode=b"
    name, args = split_spec(s)
    assert parse_dataclass(Outer, name, args) == o
