"""Synthetic arrivals and lengths: gamma (``vllm bench serve --burstiness``), constant
rate, a Poisson mix of request classes, and token-length distributions."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from ppas.core.config import require
from ppas.core.errors import PpasError
from ppas.core.limits import MAX_BURSTINESS, MAX_RATE, MAX_REQUESTS, MAX_TIME_S, MIN_BURSTINESS
from ppas.workload.requests import RequestSpec, Trace, check_lengths


def gamma_trace(
    rate: float,
    num_requests: int,
    seed: int,
    burstiness: float = 1.0,
    prompt_tokens: int = 25000,
    output_tokens: int = 32,
) -> Trace:
    """Arrivals with gamma inter-arrival times as ``vllm bench serve --burstiness``:
    shape = burstiness, scale = 1 / (rate * burstiness); burstiness 1 is Poisson, lower is
    burstier. ``rate = inf`` sends everything at t = 0."""
    arr = gamma_arrivals(rate, num_requests, seed, burstiness)
    check_lengths(prompt_tokens, output_tokens)
    reqs = tuple(RequestSpec(a, prompt_tokens, output_tokens) for a in arr)
    return Trace(reqs, arr[-1], f"gamma rate {rate:g} burstiness {burstiness:g} seed {seed}")


def constant_trace(
    rate: float, num_requests: int, prompt_tokens: int = 25000, output_tokens: int = 32
) -> Trace:
    require(0 < rate <= MAX_RATE, f"request rate must be in (0, {MAX_RATE:g}], got {rate}")
    require(1 <= num_requests <= MAX_REQUESTS,
            f"number of requests must be in [1, {MAX_REQUESTS}], got {num_requests}")
    check_lengths(prompt_tokens, output_tokens)
    reqs = tuple(RequestSpec(i / rate, prompt_tokens, output_tokens) for i in range(num_requests))
    return Trace(reqs, reqs[-1].arrival_s, f"constant rate {rate:g}")


def mixed_trace(
    rate: float,
    duration_s: float,
    seed: int,
    mix: Sequence[tuple[float, int, int, int, int]] = (
        (0.5, 32, 256, 16, 256), (0.35, 512, 4096, 64, 512), (0.15, 8192, 32768, 64, 512)),
) -> Trace:
    """Poisson arrivals at ``rate`` for ``duration_s``; each request draws a class from
    ``mix`` = (weight, prompt_min, prompt_max, output_min, output_max) by weight and
    uniform lengths inside it. The default mixes short chat prompts, mid-size RAG prompts
    and long documents (prompt mean ~4k tokens, output mean ~230)."""
    require(0 < rate <= MAX_RATE, f"request rate must be in (0, {MAX_RATE:g}], got {rate}")
    require(0 < duration_s <= MAX_TIME_S,
            f"duration must be in (0, {MAX_TIME_S:g}] s, got {duration_s}")
    require(rate * duration_s <= MAX_REQUESTS, f"rate x duration would make about "
            f"{rate * duration_s:.3g} requests; the limit is {MAX_REQUESTS:,} per trace")
    require(len(mix) > 0 and all(w > 0 and 1 <= p0 <= p1 and 1 <= o0 <= o1
                                 for w, p0, p1, o0, o1 in mix),
            "mix: need (weight > 0, 1 <= prompt_min <= prompt_max, 1 <= output_min <= "
            "output_max) per class")
    rng = random.Random(seed)
    weights = [m[0] for m in mix]
    out: list[RequestSpec] = []
    t = rng.expovariate(rate)
    while t < duration_s:
        _, p0, p1, o0, o1 = rng.choices(mix, weights)[0]
        out.append(RequestSpec(t, rng.randint(p0, p1), rng.randint(o0, o1)))
        t += rng.expovariate(rate)
    require(len(out) > 0, "mixed trace: no arrival within the duration; raise rate or duration")
    return Trace(tuple(out), duration_s, f"mixed rate {rate:g} for {duration_s:g} s seed {seed}")


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution: a weighted mixture of uniform integer ranges
    ``(low, high, weight)`` (``low == high`` for one value); see ``parse_lengths``."""

    parts: tuple[tuple[int, int, float], ...]

    def __post_init__(self) -> None:
        require(len(self.parts) >= 1, "empty token-length distribution")
        for lo, hi, w in self.parts:
            require(1 <= lo <= hi, f"token lengths need 1 <= low <= high, got {lo}-{hi}")
            require(w >= 0 and math.isfinite(w), f"length weights must be >= 0, got {w}")
        require(sum(w for _, _, w in self.parts) > 0, "length weights must not all be 0")

    def sample(self, rng: random.Random) -> int:
        parts = self.parts
        lo, hi, _ = parts[0] if len(parts) == 1 else rng.choices(
            parts, [w for _, _, w in parts])[0]
        return lo if lo == hi else rng.randint(lo, hi)

    @property
    def max(self) -> int:
        return max(hi for _, hi, _ in self.parts)


def parse_lengths(spec: str | int | LengthDist) -> LengthDist:
    """``'25000'``, ``'256-4096'`` (uniform), ``'512:0.7,8192:0.3'`` (weighted values) or a
    weighted mixture of ranges, ``'200-800:0.7,4000-12000:0.3'``."""
    if isinstance(spec, LengthDist):
        return spec
    if isinstance(spec, int):
        return LengthDist(((spec, spec, 1.0),))
    allowed = "allowed: N, LOW-HIGH, or a weighted list N:W,LOW-HIGH:W,..."
    parts = []
    try:
        items = spec.split(",")
        for item in items:
            rng_, colon, w = item.strip().partition(":")
            if not colon and len(items) > 1:
                raise ValueError
            lo, dash, hi = rng_.partition("-")
            parts.append((int(lo), int(hi) if dash else int(lo), float(w) if colon else 1.0))
    except ValueError:
        raise PpasError(f"malformed token lengths {spec!r}; {allowed}") from None
    return LengthDist(tuple(parts))


def gamma_arrivals(rate: float, num_requests: int, seed: int, burstiness: float) -> list[float]:
    """gamma_trace's arrival times (same seed, same times)."""
    require(0 < rate <= MAX_RATE or rate == math.inf,
            f"request rate must be in (0, {MAX_RATE:g}] requests/s or inf, got {rate:g}")
    require(MIN_BURSTINESS <= burstiness <= MAX_BURSTINESS,
            f"burstiness must be in [{MIN_BURSTINESS:g}, {MAX_BURSTINESS:g}], got {burstiness:g}")
    require(1 <= num_requests <= MAX_REQUESTS,
            f"number of requests must be in [1, {MAX_REQUESTS}], got {num_requests}")
    rng = random.Random(seed)
    t, arr = 0.0, []
    for _ in range(num_requests):
        arr.append(t)
        if math.isfinite(rate):
            t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return arr
