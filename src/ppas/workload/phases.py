"""The P-PAS paper's phase traces: piecewise-Poisson arrivals, ``DURATION_S:RATE`` per
phase, bit-identical to the paper's artifact."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from ppas.core.config import require
from ppas.core.errors import PpasError
from ppas.core.limits import MAX_RATE, MAX_REQUESTS, MAX_TIME_S
from ppas.workload.requests import RequestSpec, Trace, check_lengths


@dataclass(frozen=True, slots=True)
class Phase:
    duration_s: float
    rate: float  # requests per second

    def __post_init__(self) -> None:
        require(0 < self.duration_s <= MAX_TIME_S,
                f"phase duration must be in (0, {MAX_TIME_S:g}] s, got {self.duration_s:g}")
        require(0 <= self.rate <= MAX_RATE,
                f"phase rate must be in [0, {MAX_RATE:g}] requests/s, got {self.rate:g}")


PAPER_PHASES = "10:0.2,10:{burst},10:0.2,10:{burst},10:0.2"


def parse_phases(spec: str, burst: float | None = None) -> tuple[Phase, ...]:
    """``'10:0.2,10:{burst},10:0.2'`` -> phases. ``{burst}`` (or ``B``) is the burst rate."""
    if burst is not None:
        spec = spec.replace("{burst}", repr(burst)).replace(":B", f":{burst!r}")
    phases = []
    for part in spec.split(","):
        dur, sep, rate = part.strip().partition(":")
        if not sep:
            raise PpasError(f"malformed phase {part!r} in {spec!r}; expected DURATION_S:RATE")
        try:
            d, r = float(dur), float(rate)
        except ValueError:
            raise PpasError(
                f"malformed phase {part!r} in {spec!r}; DURATION_S and RATE must be numbers"
                + ("" if burst is not None else " (use {burst} only with --burst-rates)")
            ) from None
        if not (math.isfinite(d) and math.isfinite(r)):
            raise PpasError(f"phase {part!r}: numbers must be finite")
        phases.append(Phase(d, r))
    if not phases:
        raise PpasError("empty phase list")
    return tuple(phases)


def phase_arrivals(phases: Sequence[Phase], seed: int) -> list[float]:
    """The P-PAS artifact's piecewise-Poisson generator, bit for bit (spec: one
    ``random.Random(seed)`` for the whole trace; per phase, start at the phase start and
    add ``expovariate(rate)``; an arrival at or past the phase end is discarded and the
    next phase starts from its own start, the rng continuing)."""
    rng = random.Random(seed)
    out: list[float] = []
    start = 0.0
    for ph in phases:
        end = start + ph.duration_s
        if ph.rate > 0:
            t = start
            while True:
                t += rng.expovariate(ph.rate)
                if t >= end:
                    break
                out.append(t)
        start = end
    return out


def phase_trace(
    phases: Sequence[Phase] | str,
    seed: int,
    prompt_tokens: int = 25000,
    output_tokens: int = 32,
    burst: float | None = None,
) -> Trace:
    if isinstance(phases, str):
        phases = parse_phases(phases, burst)
    check_lengths(prompt_tokens, output_tokens)
    require(sum(p.duration_s for p in phases) <= MAX_TIME_S,
            f"phases last {sum(p.duration_s for p in phases):g} s; the limit is {MAX_TIME_S:g} s")
    expected = sum(p.duration_s * p.rate for p in phases)
    require(expected <= MAX_REQUESTS, f"phases would make about {expected:.3g} requests; the "
            f"limit is {MAX_REQUESTS:,} per trace (lower the rates or durations)")
    arr = phase_arrivals(phases, seed)
    dur = sum(p.duration_s for p in phases)
    reqs = tuple(RequestSpec(t, prompt_tokens, output_tokens) for t in arr)
    desc = ",".join(f"{p.duration_s:g}:{p.rate:g}" for p in phases)
    return Trace(reqs, dur, f"phases {desc} seed {seed}")
