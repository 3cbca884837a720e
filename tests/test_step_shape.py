"""The one-chunk step shape and its causal query-key pairs, the rule every cost user calls."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ppas.cost.base import StepShape, causal_pairs


@given(st.integers(0, 300), st.integers(0, 300))
def test_causal_pairs_counts_every_query_key_pair(c: int, p: int) -> None:
    """Token i of the chunk (1-based) sees the p cached tokens and tokens 1..i."""
    assert causal_pairs(c, p) == sum(p + i for i in range(1, c + 1))


@given(st.integers(0, 1 << 20), st.integers(0, 1 << 22))
def test_causal_pairs_is_bit_identical_to_both_former_spellings(c: int, p: int) -> None:
    assert causal_pairs(c, p) == c * (p + (c + 1) / 2) == c * (p + (c + 1) * 0.5)


@given(st.integers(1, 1 << 16), st.integers(0, 1 << 20), st.integers(0, 64),
       st.integers(0, 1 << 20))
def test_one_chunk_is_of_with_one_chunk(c: int, p: int, d: int, ctx: int) -> None:
    contexts = [ctx] + [0] * (d - 1) if d else []
    assert StepShape.one_chunk(c, p, d, ctx if d else 0) == StepShape.of([(c, p)], contexts)


def test_chunk_zero_is_the_decode_only_step() -> None:
    assert StepShape.one_chunk(0, 4096, 3, 300) == StepShape(0, 0, 0.0, 0, 3, 300)
