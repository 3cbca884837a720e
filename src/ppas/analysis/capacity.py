"""Capacity: the largest rate scale of a trace at which a policy's SLO attainment stays at
or above a target (the metric Sarathi-Serve, DistServe and Niyama report).

A rate scale s replays the trace with its arrival times divided by s (``TraceTransform``'s
time scale 1/s): s = 2 is twice the trace's rate, with the same requests in the same order.
Attainment is ``RunSummary.slo_attainment`` (failed requests count as missing).

Attainment need not be monotone in the rate: a faster replay can merge bursts into fewer,
larger batches, or shift a preemption, and attain more. The search therefore does not
assume it. It first evaluates every scale of a grid (increasing), takes the first grid
bracket [a, b] where a attains and b does not, and bisects inside it (geometrically:
scales are ratios) for a fixed number of steps, keeping the invariant "lo attains, hi does
not". Capacity is the last ``lo``: every grid scale up to it attains, and the boundary lies
below ``hi``. Grid points past the first failing one are still evaluated and shown (a
non-monotone curve is visible in the table), but do not raise the capacity. When the lowest
grid scale already fails, capacity is below the grid (``below``); when no grid scale fails,
it is at least the highest (``above``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ppas.core.errors import PpasError
from ppas.core.metrics import RunSummary
from ppas.core.slo import SloSpec
from ppas.engine.setup import EngineSetup
from ppas.engine.simulator import simulate
from ppas.engine.solo import SoloTable
from ppas.workload import Trace, TraceTransform

#: The default grid of rate scales.
DEFAULT_SCALES = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


@dataclass(frozen=True)
class Point:
    """One evaluated rate scale."""

    scale: float
    attainment: float
    summary: RunSummary | None = None


@dataclass
class Capacity:
    """The search's outcome. ``scale``: the capacity (the largest scale found attaining);
    ``bound``: ``"found"`` (lo attains, ``hi`` fails, hi / lo within the bisection's
    resolution), ``"below"`` (the lowest grid scale fails; scale is None) or ``"above"``
    (no grid scale fails; scale is the highest, a lower bound)."""

    target: float
    scale: float | None
    hi: float | None
    bound: str
    points: list[Point] = field(default_factory=list)


def find_capacity(attainment: Callable[[float], Point], scales: Sequence[float],
                  target: float, steps: int) -> Capacity:
    """Capacity by grid, then bisection inside the first failing bracket (module doc).
    ``attainment(scale)`` evaluates one scale; ``target`` is a fraction in (0, 1]."""
    grid = sorted(set(scales))
    if not grid or grid[0] <= 0:
        raise PpasError("capacity needs rate scales > 0")
    points = [attainment(s) for s in grid]
    first_fail = next((i for i, p in enumerate(points) if p.attainment < target), None)
    if first_fail is None:
        return Capacity(target, grid[-1], None, "above", points)
    if first_fail == 0:
        return Capacity(target, None, grid[0], "below", points)
    lo, hi = grid[first_fail - 1], grid[first_fail]
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        p = attainment(mid)
        points.append(p)
        if p.attainment >= target:
            lo = mid
        else:
            hi = mid
    points.sort(key=lambda p: p.scale)
    return Capacity(target, lo, hi, "found", points)


def trace_capacity(trace: Trace, setup: Callable[[], EngineSetup], slo: SloSpec,
                   target: float, *, scales: Sequence[float] = DEFAULT_SCALES,
                   steps: int = 6) -> Capacity:
    """``find_capacity`` of the engine ``setup()`` builds (a fresh policy each run, e.g.
    ``lambda: engine_for(config, hardware, model)``) on ``trace`` replayed at rate
    scales; relative SLOs are against the first setup's cost model."""
    solo: SoloTable | None = None

    def at(scale: float) -> Point:
        nonlocal solo
        e = setup()
        if slo.relative and solo is None:
            solo = SoloTable(e.cost_model)
        tr = trace if scale == 1 else TraceTransform(time_scale=1 / scale).apply(trace)
        s = simulate(tr, e.policy, e.cost_model, e.config).run_summary(slo, solo)
        return Point(scale, s.slo_attainment or 0.0, s)

    return find_capacity(at, scales, target, steps)


__all__ = ["DEFAULT_SCALES", "Capacity", "Point", "find_capacity", "trace_capacity"]
