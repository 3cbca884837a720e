"""``ppas.core.slots.builder``: the same object as the dataclass's own constructor."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from ppas.core.slots import builder
from ppas.core.view import OutputLengths, SchedulerView, StepRecord, make_step_record, make_view
from ppas.cost.base import StepShape, make_shape


@pytest.mark.parametrize(("make", "cls", "args"), [
    (make_step_record, StepRecord, (1.5, 0.02, 0.03, 512, 256, 10, 1, 10, 3e4, 300, 900)),
    (make_shape, StepShape, (512, 1, 1000.5, 2048, 12, 40000)),
    (make_view, SchedulerView, (3.0, [], 4, 5, 2048, 256, (), None, 77, True, OutputLengths(),
                                 48)),
])
def test_same_object_as_the_constructor(make, cls, args) -> None:  # type: ignore[no-untyped-def]
    made, ref = make(*args), cls(*args)
    assert type(made) is cls
    assert made == ref
    assert dataclasses.astuple(made) == dataclasses.astuple(ref)
    assert repr(made) == repr(ref)
    if cls is not SchedulerView:  # (a view holds a list: not hashable)
        assert hash(made) == hash(ref)
        assert pickle.loads(pickle.dumps(made)) == ref
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, first, args[0])  # frozen, as the constructor's
    assert not hasattr(made, "__dict__")


def test_refuses_what_it_would_build_wrongly() -> None:
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(slots=True)
    class Mutable:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class Base:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Derived(Base):
        b: int

    for cls in (NoSlots, Mutable, Checked, Derived):
        with pytest.raises(TypeError):
            builder(cls)
