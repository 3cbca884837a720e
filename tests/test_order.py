"""Orders read off a log of ids (``ppas.core.order``): a ``LoggedOrder`` is the tuple of
its ids wherever a decision's order is read or compared."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppas.core.decision import Decision
from ppas.core.order import IdLog


@given(ids=st.lists(st.sampled_from("abcdef"), max_size=8), lo=st.integers(0, 8),
       hi=st.integers(0, 8), tail=st.lists(st.sampled_from("xyz"), max_size=3),
       more=st.lists(st.sampled_from("uv"), max_size=2))
def test_logged_order_is_its_tuple(ids: list[str], lo: int, hi: int, tail: list[str],
                                   more: list[str]) -> None:
    """Length, iteration, indexing, slices, equality both ways, hash, truth, ``then``,
    and inside a ``Decision``; ids appended later change no order read before."""
    log = IdLog()
    log.extend(ids)
    lo, hi = min(lo, len(ids)), min(hi, len(ids))
    if lo > hi:
        with pytest.raises(ValueError):
            log.order(lo, hi)
        return
    o = log.order(lo, hi, tuple(tail))
    t = tuple(ids[lo:hi] + tail)
    assert len(o) == len(t) and tuple(o) == t and list(o) == list(t)
    assert [o[i] for i in range(-len(t), len(t))] == [t[i] for i in range(-len(t), len(t))]
    assert o[1:] == t[1:] and o[:-1] == t[:-1] and o[::2] == t[::2]
    assert o == t and t == o and not (o != t) and hash(o) == hash(t) and bool(o) == bool(t)
    assert o != (*t, "w") and (*t, "w") != o and o != list(t)
    if t:  # (as long, one id other)
        u = ("w", *t[1:])
        assert o != u and u != o and Decision(5, o) != Decision(5, u)
    assert o == log.order(lo, hi, tuple(tail)) and o.then(tuple(more)) == (*t, *more)
    assert Decision(5, o) == Decision(5, t) and hash(Decision(5, o)) == hash(Decision(5, t))
    log.extend(["n"])
    assert tuple(o) == t  # (the log only grows)
