"""Transformations of a replayed trace (``TraceTransform``): a time window, rescaled
arrivals, scaled lengths for small engines, and a length filter. Each one is said in words
in the trace's description, and every request it leaves out is counted: in
``Trace.excluded`` when outside the window (not asked for), in ``Trace.dropped`` when
filtered out (too long): nothing is left out silently. A trace file's window is applied
while it is read (``load_trace``; ``read_trace`` does both), with the rules here.

Order (fixed, and said in the description): window, then arrival rescaling (so ``--rate``
is the window's mean rate), then length scaling, then the length filter (on the scaled
lengths, the ones the engine sees)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ppas.core.config import check_fields, require
from ppas.core.errors import PpasError
from ppas.core.limits import (
    MAX_LENGTH_SCALE,
    MAX_OUTPUT_TOKENS,
    MAX_PROMPT_TOKENS,
    MAX_RATE,
    MAX_TIME_S,
    MAX_TIME_SCALE,
)
from ppas.workload.requests import RequestSpec, Trace

WINDOW_HELP = "START:DURATION in seconds, e.g. 0:3600"
#: ``(start, duration)`` in seconds of a trace's own clock.
Window = tuple[float, float]


def in_window(window: Window, arrival_s: float) -> bool:
    """A request arriving at ``arrival_s`` is in the window ``[start, start + duration)``."""
    return window[0] <= arrival_s < window[0] + window[1]


def window_duration(window: Window, duration_s: float) -> float:
    """The windowed trace's duration, of a trace lasting ``duration_s``."""
    return min(window[1], max(0.0, duration_s - window[0]))


def window_words(window: Window, excluded: int) -> list[str]:
    """The window's clauses of a trace's description."""
    w = f"{window[0]:g}:{window[1]:g} s"
    return [f"window {w} (applied before rescaling)",
            *([f"excluded {excluded} outside the window {w}"] if excluded else [])]


def empty_window(window: Window, duration_s: float) -> PpasError:
    return PpasError(f"window {window[0]:g}:{window[1]:g} s holds no request of the trace "
                     f"(its arrivals span 0 to {duration_s:g} s)")


def parse_window(text: str) -> tuple[float, float]:
    """``"START:DURATION"`` (seconds) -> ``(start, duration)``; start >= 0, duration > 0."""
    start, sep, dur = text.partition(":")
    try:
        s, d = float(start), float(dur)
    except ValueError:
        s = d = math.nan
    if not (sep and 0 <= s <= MAX_TIME_S and 0 < d <= MAX_TIME_S):
        raise PpasError(f"bad window {text!r}; expected {WINDOW_HELP} (start >= 0, "
                        f"duration > 0, both at most {MAX_TIME_S:g})")
    return s, d


@dataclass(frozen=True)
class TraceTransform:
    """What to do to a trace before replaying it; None = leave as is.

    * ``window``: ``(start, duration)`` seconds of the trace's own clock; requests arriving
      in ``[start, start + duration)`` are kept, shifted to start at 0, the others
      excluded (``Trace.excluded``).
    * ``time_scale``: every arrival time multiplied by it (0.5 = twice the rate).
    * ``rate``: arrivals rescaled so the mean rate (requests / duration) is this (req/s);
      exclusive with ``time_scale``.
    * ``length_scale``: prompt and output lengths (and shared prefixes) multiplied by it,
      rounded, at least 1 token.
    * ``drop_longer_than``: requests whose prompt + output exceed it (tokens) dropped.
    * ``output_scale``: output lengths alone multiplied by it (after ``length_scale``),
      rounded, at least 1 token: the same arrivals and prompts with a larger decode share
      (``benchmarks/real_traffic.py --output-scale``).
    * ``max_tokens``: the clients' ``max_tokens`` (``RequestSpec.max_tokens``), after the
      lengths are scaled: N >= 1 caps every request at N outputs (longer ones stop at N,
      as vLLM's length stop); 0, vLLM's default where a client sends none, caps each at
      ``max_model_len`` less its prompt. The outputs stay where each request stops on its
      own (its EOS); engines and policies see the cap (``--max-tokens``)."""

    window: Window | None = None
    time_scale: float | None = None
    rate: float | None = None
    length_scale: float | None = None
    drop_longer_than: int | None = None
    # Not in the repr, so an experiment's workload keeps the settings hash it had before
    # the field existed (experiment files cannot set it; the benchmarks can).
    output_scale: float | None = field(default=None, repr=False)
    max_tokens: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        require(self.time_scale is None or self.rate is None,
                "give a time scale or a rate, not both (both rescale the arrivals)")
        for key, hi in (("time_scale", MAX_TIME_SCALE), ("rate", MAX_RATE),
                        ("length_scale", MAX_LENGTH_SCALE),
                        ("output_scale", MAX_LENGTH_SCALE)):
            v = getattr(self, key)
            require(v is None or (math.isfinite(v) and 0 < v <= hi),
                    f"{key} must be a number in (0, {hi:g}], got {v!r}")
        check_fields(self, "drop_longer_than", at_least=2)
        require(self.max_tokens is None or 0 <= self.max_tokens <= MAX_OUTPUT_TOKENS,
                f"max_tokens must be 0 (vLLM's default: max_model_len less the prompt) or "
                f"an integer in [1, {MAX_OUTPUT_TOKENS}], got {self.max_tokens!r}")

    def at_load(self, load: float) -> TraceTransform:
        """This transform with the arrivals ``load`` times as fast on top: a rate ``load``
        times higher, a time scale ``load`` times smaller (a load of 1 changes nothing)."""
        require(math.isfinite(load) and load > 0, f"load must be a number > 0, got {load!r}")
        if load == 1:
            return self
        if self.rate is not None:
            return replace(self, rate=self.rate * load)
        return replace(self, time_scale=(self.time_scale or 1.0) / load)

    def __bool__(self) -> bool:
        return any(getattr(self, k) is not None for k in self.__dataclass_fields__)

    def apply(self, trace: Trace) -> Trace:
        """The transformed trace; its description gains one clause per transformation (and
        per drop), its ``dropped`` the counts."""
        reqs = list(trace.requests)
        duration = trace.duration_s
        words: list[str] = []
        dropped: list[tuple[str, int]] = []
        excluded = 0
        if self.window is not None:
            w = self.window
            kept = [_at(r, r.arrival_s - w[0]) for r in reqs if in_window(w, r.arrival_s)]
            if not kept:
                raise empty_window(w, trace.duration_s)
            excluded = len(reqs) - len(kept)
            words += window_words(w, excluded)
            reqs, duration = kept, window_duration(w, trace.duration_s)
        factor = self.time_scale
        if self.rate is not None:
            if duration <= 0:
                raise PpasError("cannot rescale to a rate: every request arrives at the same "
                                "instant (duration 0)")
            factor = len(reqs) / duration / self.rate
            words.append(f"rate {self.rate:g} req/s (was {len(reqs) / duration:.4g}; arrival "
                         f"times x{factor:.4g})")
        elif factor is not None:
            words.append(f"arrival times x{factor:g}")
        if factor is not None:
            if duration * factor > MAX_TIME_S:
                raise PpasError(f"rescaled, the trace would last {duration * factor:g} s; the "
                                f"limit is {MAX_TIME_S:g} s")
            reqs = [_at(r, r.arrival_s * factor) for r in reqs]
            duration *= factor
        if self.length_scale is not None:
            reqs = [_scaled(r, self.length_scale) for r in reqs]
            words.append(f"lengths x{self.length_scale:g} (at least 1 token)")
        if self.output_scale is not None:
            reqs = [_outputs_scaled(r, self.output_scale) for r in reqs]
            words.append(f"output lengths x{self.output_scale:g} (at least 1 token)")
        if self.max_tokens is not None:
            reqs = [_capped(r, self.max_tokens) for r in reqs]
            words.append("max_tokens vLLM's default (max_model_len less the prompt)"
                         if self.max_tokens == 0 else
                         f"max_tokens {self.max_tokens} (longer outputs stop there)")
        if self.drop_longer_than is not None:
            cap = self.drop_longer_than
            kept = [r for r in reqs if r.prompt_tokens + r.output_tokens <= cap]
            words.append(f"requests over {cap} tokens (prompt + output) dropped")
            if len(kept) < len(reqs):
                dropped.append((f"longer than {cap} tokens (prompt + output)",
                                len(reqs) - len(kept)))
            if not kept:
                raise PpasError(f"every request of the trace is longer than {cap} tokens "
                                "(prompt + output); raise the limit or scale the lengths")
            reqs = kept
        desc = "; ".join([trace.description, *words,
                          *(f"dropped {n} {why}" for why, n in dropped)])
        return Trace(tuple(reqs), duration, desc, trace.dropped + tuple(dropped),
                     trace.excluded + excluded)

    def without_window(self) -> TraceTransform:
        """The transformations after the window (a file's window is applied by
        ``load_trace`` while reading)."""
        return replace(self, window=None)


def _at(r: RequestSpec, arrival_s: float) -> RequestSpec:
    return replace(r, arrival_s=arrival_s)


def _capped(r: RequestSpec, cap: int) -> RequestSpec:
    """The client's cap on ``r`` (0: vLLM's default, resolved by the engine's
    ``max_model_len``); outputs past a cap N stop at N."""
    return replace(r, max_tokens=cap,
                   output_tokens=r.output_tokens if cap == 0 else min(r.output_tokens, cap))


def _outputs_scaled(r: RequestSpec, f: float) -> RequestSpec:
    """Output length times ``f`` (rounded, >= 1); the prompt as it is."""
    ot = max(1, round(r.output_tokens * f))
    if ot > MAX_OUTPUT_TOKENS:
        raise PpasError(f"output scale {f:g} makes a request of {ot} output tokens; the "
                        f"limit is {MAX_OUTPUT_TOKENS}")
    return replace(r, output_tokens=ot)


def _scaled(r: RequestSpec, f: float) -> RequestSpec:
    """Lengths times ``f`` (rounded, >= 1). Prefix segments are floored, and cut at the
    first that would be empty, so equal segments stay equal (shared prefixes stay shared)
    and the prefix never outgrows the prompt."""
    pt, ot = max(1, round(r.prompt_tokens * f)), max(1, round(r.output_tokens * f))
    if pt > MAX_PROMPT_TOKENS or ot > MAX_OUTPUT_TOKENS:
        raise PpasError(f"length scale {f:g} makes a request of {pt} prompt and {ot} output "
                        f"tokens; the limits are {MAX_PROMPT_TOKENS} and {MAX_OUTPUT_TOKENS}")
    prefix: list[tuple[str, int]] = []
    room = pt
    for stream, n in r.prefix:
        k = min(math.floor(n * f), room)
        if k < 1:
            break
        prefix.append((stream, k))
        room -= k
    return replace(r, prompt_tokens=pt, output_tokens=ot, prefix=tuple(prefix))
