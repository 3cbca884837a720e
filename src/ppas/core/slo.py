"""SLOs a run is measured against: ``ttft=2s,tpot=100ms`` (absolute) or ``ttft=5x`` (relative
to each request's solo latency), parsed once here for ``ppas simulate``, ``ppas capacity``,
``ppas bench`` and ``ppas tune``.

A bound is a number with a unit: ``s`` or ``ms`` (seconds or milliseconds, absolute), or
``x`` (a factor of the request's latency alone on an idle engine, ``SoloLatency``, which
the cost model gives: ``ppas.engine.solo``). The metrics are vLLM's: TTFT, TPOT and E2E
(``e2el`` as ``vllm bench serve --goodput`` names it is accepted). Whether a request meets
them is ``RequestMetrics.meets_slo``, counted by ``RunSummary`` (attainment, goodput): this
module only turns a spec into each request's bounds in seconds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from ppas.core.errors import PpasError
from ppas.core.metrics import RequestMetrics

#: The metrics an SLO can bound, and accepted aliases.
SLO_METRICS = ("ttft", "tpot", "e2e")
_ALIASES = {"e2el": "e2e"}
#: Units: seconds, milliseconds, a factor of the solo latency.
_UNITS = {"ms": 1e-3, "s": 1.0, "x": 1.0}
#: The largest bound (seconds, or a factor): beyond it every request meets it.
MAX_SLO = 1e6
SLO_HELP = ("METRIC=VALUE,... with METRIC one of ttft, tpot, e2e and VALUE a number with a "
            "unit: s, ms (absolute) or x (times the request's latency alone), "
            "e.g. ttft=2s,tpot=100ms or ttft=5x,tpot=5x")


@dataclass(frozen=True, slots=True)
class SoloLatency:
    """One request's latencies with an idle engine to itself (seconds)."""

    ttft: float
    tpot: float
    e2e: float


@dataclass(frozen=True, slots=True)
class SloBound:
    value: float  # seconds, or a factor when relative
    relative: bool

    def seconds(self, solo: float | None) -> float:
        if not self.relative:
            return self.value
        assert solo is not None
        return self.value * solo

    def __str__(self) -> str:
        if self.relative:
            return f"{self.value:g}x"
        return f"{self.value * 1e3:g}ms" if self.value < 1 else f"{self.value:g}s"


@dataclass(frozen=True, slots=True)
class SloSpec:
    """Bounds per metric (None: not bounded); at least one is set."""

    ttft: SloBound | None = None
    tpot: SloBound | None = None
    e2e: SloBound | None = None

    @classmethod
    def parse(cls, text: str) -> SloSpec:
        """``"ttft=2s,tpot=100ms"`` / ``"ttft=5x,e2e=10x"`` -> a spec; one-line PpasError."""
        bounds: dict[str, SloBound] = {}
        for item in (x.strip() for x in text.split(",")):
            key, sep, val = item.partition("=")
            key = _ALIASES.get(key.strip().lower(), key.strip().lower())
            if not sep or key not in SLO_METRICS:
                raise PpasError(f"bad SLO {item!r} in {text!r}; expected {SLO_HELP}")
            if key in bounds:
                raise PpasError(f"SLO {key} given twice in {text!r}")
            val = val.strip().lower()
            unit = next((u for u in ("ms", "s", "x") if val.endswith(u)), None)
            try:
                num = float(val[: -len(unit)]) if unit else math.nan
            except ValueError:
                num = math.nan
            if unit is None or not (math.isfinite(num) and 0 < num <= MAX_SLO):
                raise PpasError(f"bad SLO value {item!r}: need a number in (0, {MAX_SLO:g}] "
                                f"with a unit s, ms or x, e.g. {key}=2s, {key}=100ms, {key}=5x")
            bounds[key] = SloBound(num * _UNITS[unit], unit == "x")
        return cls(**bounds)

    @property
    def relative(self) -> bool:
        """Some bound is a factor of the solo latency (needs a cost model)."""
        return any(b is not None and b.relative for b in (self.ttft, self.tpot, self.e2e))

    def __str__(self) -> str:
        return ",".join(f"{k}={b}" for k in SLO_METRICS if (b := getattr(self, k)) is not None)

    def apply(self, m: RequestMetrics, solo: SoloLatency | None = None) -> RequestMetrics:
        """``m`` with this spec's bounds in seconds (replacing any it carried); ``solo`` is
        needed when the spec is relative."""
        if self.relative and solo is None:
            raise PpasError(f"relative SLOs ({self}) need each request's solo latency from a "
                            "cost model; give absolute ones (s, ms)")

        def sec(key: str) -> float | None:
            b: SloBound | None = getattr(self, key)
            return None if b is None else b.seconds(getattr(solo, key, None))

        return dataclasses.replace(m, ttft_slo=sec("ttft"), tpot_slo=sec("tpot"),
                                   e2e_slo=sec("e2e"))

    def apply_all(self, ms: Sequence[RequestMetrics],
                  solos: Sequence[SoloLatency] | None = None) -> list[RequestMetrics]:
        """``apply`` over a run's requests (``solos`` in the same order)."""
        if solos is None:
            return [self.apply(m) for m in ms]
        return [self.apply(m, s) for m, s in zip(ms, solos, strict=True)]


def parse_slo(text: str | None) -> SloSpec | None:
    """``--slo``'s value, or None when not given."""
    return None if text is None else SloSpec.parse(text)


__all__ = ["SLO_HELP", "SLO_METRICS", "SloBound", "SloSpec", "SoloLatency", "parse_slo"]
