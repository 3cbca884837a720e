"""Request traces: the P-PAS phase generator, gamma burstiness, constant rate, trace files.

Every generator returns a ``Trace``: requests sorted by arrival time (seconds from the
trace start). The same trace feeds the simulator and the live benchmark (``ppas.live.client``),
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

from ppas.core.config import require
from ppas.core.errors import PpasError
from ppas.core.limits import (
    MAX_BURSTINESS,
    MAX_OUTPUT_TOKENS,
    MAX_PROMPT_TOKENS,
    MAX_RATE,
    MAX_REQUESTS,
    MAX_TIME_S,
    MIN_BURSTINESS,
)

Segments = tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a trace. ``slo_class`` names an SLO class (see ``SloClass``).

    ``prefix``: the shared content at the start of the prompt, as segments
    ``(stream, length)``; a segment's tokens are the first ``length`` tokens of the named
    stream, so requests share exactly the prompt prefix their segments agree on (a prefix
    group is one segment ``(group, shared length)``; a session's turns are one stream
    growing turn by turn). The rest of the prompt (``prompt_tokens - sum of lengths``) is
    unique to the request. Empty = a prompt shared with nobody (every trace before prefix
    caching)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    ttft_slo: float | None = None
    tpot_slo: float | None = None
    slo_class: str | None = None
    prefix: Segments = ()

    @property
    def prefix_tokens(self) -> int:
        return sum(n for _, n in self.prefix)


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
    _check_lengths(prompt_tokens, output_tokens)
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
    arr = _arrivals(rate, num_requests, seed, burstiness)
    _check_lengths(prompt_tokens, output_tokens)
    reqs = tuple(RequestSpec(a, prompt_tokens, output_tokens) for a in arr)
    return Trace(reqs, arr[-1], f"gamma rate {rate:g} burstiness {burstiness:g} seed {seed}")


def constant_trace(
    rate: float, num_requests: int, prompt_tokens: int = 25000, output_tokens: int = 32
) -> Trace:
    require(0 < rate <= MAX_RATE, f"request rate must be in (0, {MAX_RATE:g}], got {rate}")
    require(1 <= num_requests <= MAX_REQUESTS,
            f"number of requests must be in [1, {MAX_REQUESTS}], got {num_requests}")
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


def _arrivals(rate: float, num_requests: int, seed: int, burstiness: float) -> list[float]:
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


def prefix_group_trace(rate: float, num_requests: int, seed: int, num_groups: int,
                       prefix_tokens: int, suffix_tokens: str | int | LengthDist,
                       output_tokens: str | int | LengthDist, burstiness: float = 1.0,
                       zipf: float = 0.0) -> Trace:
    """Requests in ``num_groups`` prefix groups (system prompt, tool schema, retrieved
    document): each request draws a group (weight ``1 / (k + 1) ** zipf``; 0 = uniform),
    shares the group's ``prefix_tokens`` and adds a unique suffix. ``rate = inf`` is an
    offline backlog (everything at t = 0)."""
    require(num_groups >= 1, f"num_groups must be >= 1, got {num_groups}")
    require(prefix_tokens >= 0, f"prefix_tokens must be >= 0, got {prefix_tokens}")
    require(zipf >= 0, f"zipf must be >= 0, got {zipf}")
    sd, od = parse_lengths(suffix_tokens), parse_lengths(output_tokens)
    arr = _arrivals(rate, num_requests, seed, burstiness)
    rng = random.Random(seed ^ 0x9F1C)
    weights = [1.0 / (k + 1) ** zipf for k in range(num_groups)]
    reqs = []
    for a in arr:
        g = rng.choices(range(num_groups), weights)[0]
        prefix = ((f"group{g}", prefix_tokens),) if prefix_tokens else ()
        reqs.append(RequestSpec(a, prefix_tokens + sd.sample(rng), od.sample(rng),
                                prefix=prefix))
    return Trace(tuple(reqs), arr[-1],
                 f"prefix groups {num_groups}x{prefix_tokens} rate {rate:g} seed {seed}")


def session_trace(num_sessions: int, turns: int, seed: int, session_rate: float,
                  system_tokens: int, first_tokens: int, turn_tokens: str | int | LengthDist,
                  output_tokens: str | int | LengthDist, think_s: float) -> Trace:
    """Multi-turn / agent sessions: sessions start as a Poisson process at
    ``session_rate``; every session's prompts share a ``system_tokens`` system prompt, and
    each turn's prompt extends the previous one by ``turn_tokens`` (the next user or tool
    message; the previous answer is counted in it, as new tokens, since its text is the
    engine's). Turn ``k + 1`` arrives ``think_s`` (exponential, that mean) after turn
    ``k``'s arrival (open loop, so the same trace replays live)."""
    require(num_sessions >= 1, f"num_sessions must be >= 1, got {num_sessions}")
    require(turns >= 1, f"turns must be >= 1, got {turns}")
    require(system_tokens >= 0 and first_tokens >= 1,
            "system_tokens must be >= 0 and first_tokens >= 1")
    require(think_s > 0, f"think_s must be > 0, got {think_s}")
    td, od = parse_lengths(turn_tokens), parse_lengths(output_tokens)
    starts = _arrivals(session_rate, num_sessions, seed, 1.0)
    rng = random.Random(seed ^ 0x5E55)
    reqs = []
    for s, t in enumerate(starts):
        own = first_tokens
        for _ in range(turns):
            prefix = ((("system", system_tokens),) if system_tokens else ()) + ((f"s{s}", own),)
            reqs.append(RequestSpec(t, system_tokens + own, od.sample(rng), prefix=prefix))
            own += td.sample(rng)
            t += rng.expovariate(1.0 / think_s)
    reqs.sort(key=lambda r: r.arrival_s)
    return Trace(tuple(reqs), reqs[-1].arrival_s,
                 f"sessions {num_sessions}x{turns} rate {session_rate:g} seed {seed}")


def _check_lengths(prompt_tokens: int, output_tokens: int) -> None:
    require(1 <= prompt_tokens <= MAX_PROMPT_TOKENS,
            f"prompt tokens must be in [1, {MAX_PROMPT_TOKENS}], got {prompt_tokens}")
    require(1 <= output_tokens <= MAX_OUTPUT_TOKENS,
            f"output tokens must be in [1, {MAX_OUTPUT_TOKENS}], got {output_tokens}")


_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens")
_OPTIONAL = ("ttft_slo", "tpot_slo", "slo_class")
_PREFIX_HELP = ("prefix must be a list of [stream, tokens] pairs (JSONL), or prefix_group "
                "with prefix_tokens")


def load_trace(path: str | Path) -> Trace:
    """Read a CSV (header row) or JSONL trace with ``arrival_s, prompt_tokens,
    output_tokens`` (optional ``ttft_slo, tpot_slo, slo_class``, and the shared prompt
    prefix: JSONL ``prefix`` as ``[[stream, tokens], ...]``, or in either format one
    segment as ``prefix_group`` + ``prefix_tokens``). A malformed line raises a PpasError
    naming the file and line number."""
    p = Path(path)
    if not p.is_file():
        raise PpasError(f"trace file {str(p)!r} does not exist")
    rows: list[tuple[int, dict[str, object]]] = []
    try:
        text = p.read_bytes().decode("utf-8-sig")  # a BOM (Excel's CSV) is not a header
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
    if len(rows) > MAX_REQUESTS:
        raise PpasError(f"{p}: {len(rows)} requests; the limit is {MAX_REQUESTS:,} per trace")
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
        a, pt, ot = (_number(obj, k) for k in _FIELDS)
        if not (math.isfinite(a) and 0 <= a <= MAX_TIME_S):
            raise ValueError(f"arrival_s must be a number in [0, {MAX_TIME_S:g}] (seconds), "
                             f"got {obj['arrival_s']!r:.40}")
        for name, v, hi in (("prompt_tokens", pt, MAX_PROMPT_TOKENS),
                            ("output_tokens", ot, MAX_OUTPUT_TOKENS)):
            if not (v.is_integer() and 1 <= v <= hi):
                raise ValueError(f"{name} must be an integer in [1, {hi}], got {obj[name]!r:.40}")
        slos = {}
        for k in ("ttft_slo", "tpot_slo"):
            if obj.get(k) is not None:
                v = _number(obj, k)
                if not (math.isfinite(v) and 0 < v <= MAX_TIME_S):
                    raise ValueError(f"{k} must be in (0, {MAX_TIME_S:g}] s, got {obj[k]!r:.40}")
                slos[k] = v
        cls = obj.get("slo_class")
        prefix = _parse_prefix(obj, int(pt))
        return RequestSpec(a, int(pt), int(ot), slo_class=None if cls is None else str(cls),
                           prefix=prefix, **slos)
    except (ValueError, TypeError, OverflowError) as e:
        raise PpasError(f"{p}:{n}: {e}") from None


def _number(obj: dict[str, object], key: str) -> float:
    """``obj[key]`` as a float; a number too large for a float is inf (then out of bounds)."""
    try:
        return float(obj[key])  # type: ignore[arg-type]
    except OverflowError:
        return math.inf
    except (ValueError, TypeError):
        raise ValueError(f"{key} must be a number, got {obj[key]!r:.40}") from None


def _parse_prefix(obj: dict[str, object], prompt_tokens: int) -> Segments:
    raw = obj.get("prefix")
    group = obj.get("prefix_group")
    if raw is not None and group is not None:
        raise ValueError("give prefix or prefix_group, not both")
    if group is not None:
        if "prefix_tokens" not in obj:
            raise ValueError("prefix_group needs prefix_tokens")
        raw = [[group, obj["prefix_tokens"]]]
    elif "prefix_tokens" in obj:
        raise ValueError("prefix_tokens needs prefix_group")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError(_PREFIX_HELP)
    out = []
    for seg in raw:
        if not (isinstance(seg, list | tuple) and len(seg) == 2):
            raise ValueError(_PREFIX_HELP)
        stream, n = seg
        nf = float(n)  # type: ignore[arg-type]
        if not (nf.is_integer() and nf >= 1) or str(stream) == "":
            raise ValueError(f"prefix segment {seg!r}: need a non-empty stream and tokens >= 1")
        out.append((str(stream), int(nf)))
    total = sum(n for _, n in out)
    if total > prompt_tokens:
        raise ValueError(f"prefix has {total} tokens, more than prompt_tokens={prompt_tokens}")
    return tuple(out)


def save_trace(trace: Trace, path: str | Path) -> None:
    """Write a trace as JSONL (readable by ``load_trace``), atomically."""
    from ppas.core.outputs import write_atomic

    lines = []
    for r in trace:
        obj: dict[str, object] = {"arrival_s": r.arrival_s, "prompt_tokens": r.prompt_tokens,
                                  "output_tokens": r.output_tokens}
        for k in _OPTIONAL:
            if getattr(r, k) is not None:
                obj[k] = getattr(r, k)
        if r.prefix:
            obj["prefix"] = [list(seg) for seg in r.prefix]
        lines.append(json.dumps(obj) + "\n")
    write_atomic(path, "".join(lines))


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
        pt = c.prompt_tokens or r.prompt_tokens
        prefix = r.prefix if sum(n for _, n in r.prefix) <= pt else ()
        out.append(RequestSpec(r.arrival_s, pt, c.output_tokens or r.output_tokens,
                               c.ttft_slo, c.tpot_slo, c.name, prefix))
    return Trace(tuple(out), trace.duration_s, trace.description + " + slo classes")


__all__ = [
    "PAPER_PHASES", "LengthDist", "Phase", "RequestSpec", "Segments", "SloClass", "Trace",
    "assign_slo_classes", "constant_trace", "gamma_trace", "load_trace", "mixed_trace",
    "parse_lengths", "parse_phases", "phase_arrivals", "phase_trace", "prefix_group_trace",
    "save_trace", "session_trace",
]
