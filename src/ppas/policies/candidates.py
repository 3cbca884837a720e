"""Candidate chunk sizes of the policies that search over budgets (``predictive``,
``ppas-auto``, ``lprs-apc``): the powers of two from ``c_min``, and ``c_max``."""

from __future__ import annotations


def candidate_chunks(c_min: int, c_max: int) -> tuple[int, ...]:
    """``c_min``, ``2 c_min``, ``4 c_min``, ... below ``c_max``, then ``c_max``."""
    out, c = [], c_min
    while c < c_max:
        out.append(c)
        c *= 2
    out.append(c_max)
    return tuple(out)
