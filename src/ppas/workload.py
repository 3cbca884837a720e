"""Request traces: the P-PAS phase generator, gamma burstiness, constant rate, trace files.

Every generator returns a ``Trace``: requests sorted by arrival time (seconds from the
trace start). The same trace feeds the simulator and the live benchmark (``ppas.bench``),
so a simulated run and a measured run can be compared request by request.
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ppas.config import require
from ppas.errors import PpasError


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a trace. ``slo_class`` names an SLO class (see ``SloClass``)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    ttft_slo: float | None = None
    tpot_slo: float | None = None
    slo_class: str | None = None


@dataclass(frozen=True)
class Trace:
    requests: tuple[RequestSpec, ...]
    duration_s: float
    description: str = ""

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[RequestSpec]:
        return iter(self.requests)


@dataclass(frozen=True, slots=True)
class Phase:
    duration_s: float
    rate: float  # requests per second

    def __post_init__(self) -> None:
        require(self.duration_s > 0, f"phase duration must be > 0, got {self.duration_s}")
        require(self.rate >= 0, f"phase rate must be >= 0, got {self.rate}")


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
    _check_lengths(prompt_tokens, output_tokens)
    arr = phase_arrivals(phases, seed)
    dur = sum(p.duration_s for p in phases)
    reqs = tuple(RequestSpec(t, prompt_tokens, output_tokens) for t in arr)
    desc = ",".join(f"{p.duration_s:g}:{p.rate:g}" for p in phases)
    return Trace(reqs, dur, f"phases {desc} seed {seed}")


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
    require(rate > 0, f"request rate must be > 0, got {rate}")
    require(burstiness > 0, f"burstiness must be > 0, got {burstiness}")
    require(num_requests >= 1, f"num_requests must be >= 1, got {num_requests}")
    _check_lengths(prompt_tokens, output_tokens)
    rng = random.Random(seed)
    t, arr = 0.0, []
    for _ in range(num_requests):
        arr.append(t)
        if math.isfinite(rate):
            t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    reqs = tuple(RequestSpec(a, prompt_tokens, output_tokens) for a in arr)
    return Trace(reqs, arr[-1], f"gamma rate {rate:g} burstiness {burstiness:g} seed {seed}")


def constant_trace(
    rate: float, num_requests: int, prompt_tokens: int = 25000, output_tokens: int = 32
) -> Trace:
    require(rate > 0 and math.isfinite(rate), f"request rate must be > 0, got {rate}")
    require(num_requests >= 1, f"num_requests must be >= 1, got {num_requests}")
    _check_lengths(prompt_tokens, output_tokens)
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
    require(rate > 0 and math.isfinite(rate), f"request rate must be > 0, got {rate}")
    require(duration_s > 0 and math.isfinite(duration_s),
            f"duration must be > 0, got {duration_s}")
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


def _check_lengths(prompt_tokens: int, output_tokens: int) -> None:
    require(prompt_tokens >= 1, f"prompt tokens must be >= 1, got {prompt_tokens}")
    require(output_tokens >= 1, f"output tokens must be >= 1, got {output_tokens}")


_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens")
_OPTIONAL = ("ttft_slo", "tpot_slo", "slo_class")


def load_trace(path: str | Path) -> Trace:
    """Read a CSV (header row) or JSONL trace with ``arrival_s, prompt_tokens,
    output_tokens`` (optional ``ttft_slo, tpot_slo, slo_class``). A malformed line raises a
    PpasError naming the file and line number."""
    p = Path(path)
    if not p.is_file():
        raise PpasError(f"trace file {str(p)!r} does not exist")
    rows: list[tuple[int, dict[str, object]]] = []
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise PpasError(f"{p}: cannot read trace file: {e}") from None
    if p.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise PpasError(f"{p}:{n}: invalid JSON: {e.msg}") from None
            if not isinstance(obj, dict):
                raise PpasError(f"{p}:{n}: expected a JSON object with {', '.join(_FIELDS)}")
            rows.append((n, obj))
    elif p.suffix.lower() == ".csv":
        reader = csv.DictReader(text.splitlines())
        missing = [f for f in _FIELDS if f not in (reader.fieldnames or [])]
        if missing:
            raise PpasError(
                f"{p}:1: CSV header lacks {', '.join(missing)}; need {', '.join(_FIELDS)}"
            )
        for n, row in enumerate(reader, 2):
            rows.append((n, {k: v for k, v in row.items() if v not in (None, "")}))
    else:
        raise PpasError(f"{p}: unknown trace format {p.suffix!r}; allowed: .csv, .jsonl")
    reqs = [_parse_row(p, n, obj) for n, obj in rows]
    if not reqs:
        raise PpasError(f"{p}: trace has no requests")
    reqs.sort(key=lambda r: r.arrival_s)
    return Trace(tuple(reqs), reqs[-1].arrival_s, f"file {p.name}")


def _parse_row(p: Path, n: int, obj: dict[str, object]) -> RequestSpec:
    try:
        missing = [f for f in _FIELDS if f not in obj]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        a = float(obj["arrival_s"])  # type: ignore[arg-type]
        pt = float(obj["prompt_tokens"])  # type: ignore[arg-type]
        ot = float(obj["output_tokens"])  # type: ignore[arg-type]
        if not (math.isfinite(a) and a >= 0):
            raise ValueError(f"arrival_s must be a finite number >= 0, got {obj['arrival_s']!r}")
        for name, v in (("prompt_tokens", pt), ("output_tokens", ot)):
            if not (v.is_integer() and v >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {obj[name]!r}")
        slos = {}
        for k in ("ttft_slo", "tpot_slo"):
            if obj.get(k) is not None:
                v = float(obj[k])  # type: ignore[arg-type]
                if not (math.isfinite(v) and v > 0):
                    raise ValueError(f"{k} must be > 0, got {obj[k]!r}")
                slos[k] = v
        cls = obj.get("slo_class")
        return RequestSpec(a, int(pt), int(ot), slo_class=None if cls is None else str(cls), **slos)
    except (ValueError, TypeError) as e:
        raise PpasError(f"{p}:{n}: {e}") from None


def save_trace(trace: Trace, path: str | Path) -> None:
    """Write a trace as JSONL (readable by ``load_trace``)."""
    with open(path, "w") as f:
        for r in trace:
            obj = {"arrival_s": r.arrival_s, "prompt_tokens": r.prompt_tokens,
                   "output_tokens": r.output_tokens}
            for k in _OPTIONAL:
                if getattr(r, k) is not None:
                    obj[k] = getattr(r, k)
            f.write(json.dumps(obj) + "\n")


@dataclass(frozen=True, slots=True)
class SloClass:
    """A request class with latency SLOs (seconds) and its share of the traffic."""

    name: str
    ttft_slo: float | None
    tpot_slo: float | None
    weight: float = 1.0
    prompt_tokens: int | None = None
    output_tokens: int | None = None


def assign_slo_classes(trace: Trace, classes: Sequence[SloClass], seed: int) -> Trace:
    """Tag each request with a class drawn by weight (seeded); a class may override the
    request's lengths."""
    require(len(classes) > 0, "need at least one SLO class")
    rng = random.Random(seed ^ 0x5105)
    weights = [c.weight for c in classes]
    out = []
    for r in trace:
        c = rng.choices(classes, weights)[0]
        out.append(RequestSpec(r.arrival_s, c.prompt_tokens or r.prompt_tokens,
                               c.output_tokens or r.output_tokens, c.ttft_slo, c.tpot_slo, c.name))
    return Trace(tuple(out), trace.duration_s, trace.description + " + slo classes")


__all__ = [
    "PAPER_PHASES", "Phase", "RequestSpec", "SloClass", "Trace", "assign_slo_classes",
    "constant_trace", "gamma_trace", "load_trace", "mixed_trace", "parse_phases",
    "phase_arrivals", "phase_trace", "save_trace",
]
