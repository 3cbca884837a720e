"""Trace files: ``load_trace`` reads a trace in our own CSV/JSONL format or a public one as
published (Azure LLM inference, Mooncake/Kimi, BurstGPT; ``READERS``, one per format,
detected from the CSV header or the JSONL keys), checks every row against the limits and
names the file, line and field of a bad one; ``save_trace`` writes JSONL.

A time window (``--window``) is applied while reading: rows outside it are counted as
``excluded`` (not dropped: they are not lost, just not asked for) and never become requests,
and the request limit (``MAX_REQUESTS``) is checked on the requests kept, so a slice of a
week-long file is read where the whole file would be refused. A public trace's rows are kept
as numbers until the window has chosen them."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ppas.core import limits
from ppas.core.errors import PpasError
from ppas.core.limits import MAX_OUTPUT_TOKENS, MAX_PRIORITY, MAX_PROMPT_TOKENS, MAX_TIME_S
from ppas.core.outputs import write_atomic
from ppas.workload.requests import Dropped, RequestSpec, Segments, Trace
from ppas.workload.transforms import (
    TraceTransform,
    Window,
    empty_window,
    in_window,
    window_duration,
    window_words,
)

_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens")
_OPTIONAL = ("ttft_slo", "tpot_slo", "slo_class", "priority")
_PREFIX_HELP = ("prefix must be a list of [stream, tokens] pairs (JSONL), or prefix_group "
                "with prefix_tokens")


#: A trace file's rows: (line number, the row's fields by ``_parse_row``'s column names).
Rows = list[tuple[int, dict[str, object]]]


def _jsonl_rows(p: Path, text: str) -> Rows:
    """One JSON object a line; blank lines are skipped."""
    rows: Rows = []
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
    return rows


def _csv_rows(p: Path, text: str) -> Rows:
    """A header row naming the columns, then one request a row; an empty cell is absent."""
    reader = csv.DictReader(text.splitlines())
    names = reader.fieldnames or []
    missing = [f for f in _FIELDS if f not in names]
    if missing:
        raise PpasError(
            f"{p}:1: CSV header lacks {', '.join(missing)}; need {', '.join(_FIELDS)}"
        )
    if twice := sorted({c for c in names if names.count(c) > 1}):
        raise PpasError(f"{p}:1: CSV header names {', '.join(twice)} twice; name each once")
    rows = list(enumerate(reader, 2))
    if extra := next((n for n, row in rows if None in row), None):  # DictReader's restkey
        raise PpasError(f"{p}:{extra}: more cells than the header's {len(names)} columns")
    return [(n, {k: v for k, v in row.items() if v not in (None, "")}) for n, row in rows]


@dataclass(frozen=True)
class Read:
    """A reader's result: the requests kept (any order; in the window, shifted to start at
    its start), the rows it left out by reason, the rows outside the window, and the
    trace's duration before the window (its last kept arrival on its own clock)."""

    requests: list[RequestSpec]
    dropped: Dropped = ()
    excluded: int = 0
    duration_s: float = 0.0


_ZERO = "with 0 prompt or output tokens (failed requests)"


def _read_ppas(p: Path, text: str, block_size: int, window: Window | None) -> Read:
    """Our own format: CSV (``.csv``) or JSONL, the columns of ``load_trace``'s docstring;
    the window on the arrivals as written."""
    rows = (_csv_rows if _is_csv(p) else _jsonl_rows)(p, text)
    reqs = [_parse_row(p, n, obj) for n, obj in rows]
    duration = max((r.arrival_s for r in reqs), default=0.0)
    if window is None:
        return Read(reqs, (), 0, duration)
    kept = [_at(r, r.arrival_s - window[0]) for r in reqs if in_window(window, r.arrival_s)]
    return Read(kept, (), len(reqs) - len(kept), duration)


def _read_azure(p: Path, text: str, block_size: int, window: Window | None) -> Read:
    """Azure LLM inference trace (2023 and 2024 releases): ``TIMESTAMP`` a wall-clock
    datetime as published (``2023-11-16 18:17:03.9799600``, optionally with a UTC offset),
    ``ContextTokens``, ``GeneratedTokens``; arrival = seconds after the earliest row."""
    rows, ix = _csv_table(p, text, _SIGNATURES["azure"][1])
    t, c, g = ix["TIMESTAMP"], ix["ContextTokens"], ix["GeneratedTokens"]
    return _public(p, ((n, _datetime_s(p, n, "TIMESTAMP", r[t]),
                        _tokens(p, n, "ContextTokens", r[c]),
                        _tokens(p, n, "GeneratedTokens", r[g]), ()) for n, r in rows), window)


def _read_burstgpt(p: Path, text: str, block_size: int, window: Window | None) -> Read:
    """BurstGPT: ``Timestamp`` (seconds), ``Request tokens``, ``Response tokens`` (0 = a
    failed request, dropped and counted), ``Model``, ``Log Type``; arrival = seconds after
    the earliest row."""
    rows, ix = _csv_table(p, text, _SIGNATURES["burstgpt"][1])
    t, q, a = ix["Timestamp"], ix["Request tokens"], ix["Response tokens"]
    return _public(p, ((n, _seconds(p, n, "Timestamp", r[t], 1),
                        _tokens(p, n, "Request tokens", r[q]),
                        _tokens(p, n, "Response tokens", r[a]), ()) for n, r in rows), window)


def _read_mooncake(p: Path, text: str, block_size: int, window: Window | None) -> Read:
    """Mooncake / Kimi: ``timestamp`` (ms), ``input_length``, ``output_length``,
    ``hash_ids`` (one id per ``block_size``-token prompt block; equal ids = equal prefixes
    up to that block). Block ``i`` becomes the prefix segment ``("kv<id>", tokens of block
    i)``, so two requests agreeing on their first k ids share their first k blocks'
    tokens in the prefix cache (``RequestSpec.prefix``)."""
    def rows() -> Iterator[tuple[int, float, int, int, Segments]]:
        for n, obj in _jsonl_rows(p, text):
            missing = [k for k in _SIGNATURES["mooncake"][1] if k not in obj]
            if missing:
                raise PpasError(f"{p}:{n}: missing {', '.join(missing)} (mooncake format)")
            pt = _tokens(p, n, "input_length", obj["input_length"])
            yield (n, _seconds(p, n, "timestamp", obj["timestamp"], 1000), pt,
                   _tokens(p, n, "output_length", obj["output_length"]),
                   _blocks(p, n, obj["hash_ids"], pt, block_size))

    return _public(p, rows(), window)


def _blocks(p: Path, n: int, ids: object, prompt_tokens: int, block_size: int) -> Segments:
    full = -(-prompt_tokens // block_size)
    if not (isinstance(ids, list) and all(isinstance(i, int | str) for i in ids)
            and len(ids) <= full):
        raise PpasError(f"{p}:{n}: hash_ids must be a list of at most {full} block ids "
                        f"(input_length / block_size {block_size}, rounded up), got "
                        f"{ids!r:.60}; a trace with another block size per hash id needs "
                        f"--trace-block-size")
    return tuple((f"kv{h}", min(block_size, prompt_tokens - i * block_size))
                 for i, h in enumerate(ids))


def _public(p: Path, rows: Iterable[tuple[int, float, int, int, Segments]],
            window: Window | None) -> Read:
    """Requests from a public trace's rows ``(line, seconds, prompt, output, prefix)``:
    arrivals from the earliest row; rows outside ``window`` excluded, rows in it with 0
    tokens dropped and counted. The rows are kept as numbers (and prefixes, where any)
    until the earliest is known."""
    lines, times, prompts, outputs = array("q"), array("d"), array("q"), array("q")
    prefixes: dict[int, Segments] = {}
    for n, t, pt, ot, prefix in rows:
        if prefix:
            prefixes[len(lines)] = prefix
        lines.append(n)
        times.append(t)
        prompts.append(pt)
        outputs.append(ot)
    if not lines:
        return Read([])
    t0 = min(times)
    start = window[0] if window is not None else 0.0
    reqs, zero, excluded, last = [], 0, 0, 0.0
    for i, t in enumerate(times):
        a = t - t0
        if a > MAX_TIME_S:
            raise PpasError(f"{p}:{lines[i]}: arrival {a:g} s after the first row; the limit "
                            f"is {MAX_TIME_S:g} s")
        failed = prompts[i] == 0 or outputs[i] == 0
        if not failed:
            last = max(last, a)
        if window is not None and not in_window(window, a):
            excluded += 1
        elif failed:
            zero += 1
        else:
            reqs.append(RequestSpec(a - start, prompts[i], outputs[i],
                                prefix=prefixes.get(i, ())))
    return Read(reqs, ((_ZERO, zero),) if zero else (), excluded, last)


def _csv_table(p: Path, text: str, need: tuple[str, ...]
               ) -> tuple[Iterator[tuple[int, list[str]]], dict[str, int]]:
    """A CSV's rows (line number, cells), read as they are asked for, and the column index
    of each ``need``ed column."""
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader, [])]
    missing = [f for f in need if f not in header]
    if missing:
        raise PpasError(f"{p}:1: CSV header lacks {', '.join(missing)}; need {', '.join(need)}")
    ix = {f: header.index(f) for f in need}
    width = max(ix.values()) + 1

    def rows() -> Iterator[tuple[int, list[str]]]:
        for row in reader:
            if not row:
                continue
            if len(row) < width:
                raise PpasError(f"{p}:{reader.line_num}: {len(row)} fields; the header has "
                                f"{len(header)} ({', '.join(need)} needed)")
            yield reader.line_num, row

    return rows(), ix


def _tokens(p: Path, n: int, field: str, value: object) -> int:
    """A token count: an integer in [0, the limit] (0 is a failed request, dropped later)."""
    hi = MAX_OUTPUT_TOKENS if field in _OUTPUT_COLUMNS else MAX_PROMPT_TOKENS
    try:
        v = float(value)  # type: ignore[arg-type]
    except (ValueError, TypeError, OverflowError):
        v = math.nan
    if not (math.isfinite(v) and v.is_integer() and 0 <= v <= hi) or isinstance(value, bool):
        raise PpasError(f"{p}:{n}: {field} must be an integer in [0, {hi}], got {value!r:.40}")
    return int(v)


def _seconds(p: Path, n: int, field: str, value: object, per_s: int) -> float:
    """A time in seconds (``per_s`` 1) or milliseconds (``per_s`` 1000), as seconds."""
    try:
        v = float(value) / per_s  # type: ignore[arg-type]
    except (ValueError, TypeError, OverflowError):
        v = math.nan
    if not (math.isfinite(v) and abs(v) <= MAX_TIME_S) or isinstance(value, bool):
        unit = "ms" if per_s == 1000 else "s"
        raise PpasError(f"{p}:{n}: {field} must be a number of {unit} (at most "
                        f"{MAX_TIME_S * per_s:g}), got {value!r:.40}")
    return v


def _datetime_s(p: Path, n: int, field: str, value: str) -> float:
    """A published wall-clock time (ISO 8601, any number of fractional digits, optional UTC
    offset; no offset = UTC) as POSIX seconds."""
    try:
        d = datetime.fromisoformat(value.strip())
    except ValueError:
        raise PpasError(f"{p}:{n}: {field} must be a date and time like "
                        f"2023-11-16 18:17:03.9799600, got {value!r:.40}") from None
    return (d if d.tzinfo else d.replace(tzinfo=UTC)).timestamp()


def _check_count(p: Path, rows: int, window: Window | None) -> None:
    if rows > limits.MAX_REQUESTS:
        raise PpasError(f"{p}: {rows} requests"
                        + (f" in the window {window[0]:g}:{window[1]:g} s" if window else "")
                        + f"; the limit is {limits.MAX_REQUESTS:,} per trace"
                        + ("" if window else " (--window START:DURATION reads a slice)"))


def _is_csv(p: Path) -> bool:
    return p.suffix.lower() == ".csv"


_OUTPUT_COLUMNS = ("GeneratedTokens", "Response tokens", "output_length")
#: Each format: the file kind it comes in and the columns (CSV header) or keys (JSONL) that
#: identify it; auto-detection picks the first whose columns are all present.
_SIGNATURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "ppas": ("either", _FIELDS),
    "azure": ("csv", ("TIMESTAMP", "ContextTokens", "GeneratedTokens")),
    "burstgpt": ("csv", ("Timestamp", "Request tokens", "Response tokens", "Model",
                         "Log Type")),
    "mooncake": ("jsonl", ("timestamp", "input_length", "output_length", "hash_ids")),
}
#: Trace formats by name. A reader turns a file's text into requests and the rows it left
#: out; a new format is one reader and one signature.
READERS: dict[str, Callable[[Path, str, int, Window | None], Read]] = {
    "ppas": _read_ppas, "azure": _read_azure, "burstgpt": _read_burstgpt,
    "mooncake": _read_mooncake,
}
TRACE_FORMATS = ("auto", *READERS)
_SUFFIXES = (".csv", ".jsonl", ".json", ".ndjson")


def detect_format(p: Path, text: str) -> str:
    """The format whose columns the CSV header (or the first JSONL object's keys) has; ppas
    when none matches (its reader then names what is missing)."""
    if _is_csv(p):
        names = {h.strip() for h in next(csv.reader([text.split("\n", 1)[0]]), [])}
    else:
        first = next((line for line in text.splitlines() if line.strip()), "")
        try:
            obj = json.loads(first)
        except json.JSONDecodeError:
            return "ppas"
        names = set(obj) if isinstance(obj, dict) else set()
    kind = "csv" if _is_csv(p) else "jsonl"
    for fmt, (k, cols) in _SIGNATURES.items():
        if k in (kind, "either") and names.issuperset(cols):
            return fmt
    return "ppas"


def load_trace(path: str | Path, fmt: str = "auto", block_size: int = 512,
               window: Window | None = None) -> Trace:
    """Read a trace file in ``fmt`` (``TRACE_FORMATS``; ``auto`` detects it from the CSV
    header or the JSONL keys). Our own format is a CSV (header row) or JSONL with
    ``arrival_s, prompt_tokens, output_tokens`` (optional ``ttft_slo, tpot_slo, slo_class``,
    ``priority`` (vLLM's, read under ``--scheduling-policy priority``),
    and the shared prompt prefix: JSONL ``prefix`` as ``[[stream, tokens], ...]``, or in
    either format one segment as ``prefix_group`` + ``prefix_tokens``); the public formats
    are read as published (their readers say how). A malformed line raises a PpasError
    naming the file, line and field; rows a reader leaves out are counted in
    ``Trace.dropped`` and said in ``Trace.description``. ``window`` ``(start, duration)``
    keeps the requests arriving in it (``TraceTransform``'s window, applied here while
    reading: the module doc), the others counted in ``Trace.excluded``."""
    p = Path(path)
    if fmt not in TRACE_FORMATS:
        raise PpasError(f"unknown trace format {fmt!r}; allowed: {', '.join(TRACE_FORMATS)}")
    if not p.is_file():
        raise PpasError(f"trace file {str(p)!r} does not exist")
    if p.suffix.lower() not in _SUFFIXES:
        raise PpasError(f"{p}: unknown trace file kind {p.suffix!r}; allowed: "
                        f"{', '.join(_SUFFIXES)}")
    try:
        text = p.read_bytes().decode("utf-8-sig")  # a BOM (Excel's CSV) is not a header
    except (OSError, UnicodeDecodeError) as e:
        raise PpasError(f"{p}: cannot read trace file: {e}") from None
    name = detect_format(p, text) if fmt == "auto" else fmt
    kind = _SIGNATURES[name][0]
    if kind != "either" and kind != ("csv" if _is_csv(p) else "jsonl"):
        raise PpasError(f"{p}: {name} traces are {kind.upper()} files; this one is "
                        f"{p.suffix!r} (give --trace-format auto or the file's format)")
    read = READERS[name](p, text, block_size, window)
    reqs, dropped = read.requests, read.dropped
    if not reqs:
        if window is not None and read.excluded:
            raise empty_window(window, read.duration_s)
        raise PpasError(f"{p}: trace has no requests"
                        + "".join(f" ({k} dropped {why})" for why, k in dropped))
    _check_count(p, len(reqs), window)
    reqs.sort(key=lambda r: r.arrival_s)
    desc = f"file {p.name}" + ("" if name == "ppas" else f" ({name} format)")
    desc += "".join(f"; dropped {k} {why}" for why, k in dropped)
    if window is None:
        return Trace(tuple(reqs), reqs[-1].arrival_s, desc, dropped)
    return Trace(tuple(reqs), window_duration(window, read.duration_s),
                 "; ".join([desc, *window_words(window, read.excluded)]), dropped,
                 read.excluded)


def read_trace(path: str | Path, fmt: str = "auto", block_size: int = 512,
               transform: TraceTransform | None = None) -> Trace:
    """``load_trace`` with ``transform``: its window while reading, the rest after."""
    tf = transform or TraceTransform()
    trace = load_trace(path, fmt, block_size, tf.window)
    rest = tf.without_window()
    return rest.apply(trace) if rest else trace


def _at(r: RequestSpec, arrival_s: float) -> RequestSpec:
    return dataclasses.replace(r, arrival_s=arrival_s)


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
        priority = 0
        if obj.get("priority") is not None:  # vLLM's per-request priority: an integer
            v = _number(obj, "priority")
            if not (v.is_integer() and abs(v) <= MAX_PRIORITY):
                raise ValueError(f"priority must be an integer in [-{MAX_PRIORITY}, "
                                 f"{MAX_PRIORITY}] (lower is served first), got "
                                 f"{obj['priority']!r:.40}")
            priority = int(v)
        return RequestSpec(a, int(pt), int(ot), slos.get("ttft_slo"), slos.get("tpot_slo"),
                           slo_class=None if cls is None else str(cls), prefix=prefix,
                           priority=priority)
    except (ValueError, TypeError, OverflowError) as e:
        raise PpasError(f"{p}:{n}: {e}") from None


def _number(obj: dict[str, object], key: str) -> float:
    """``obj[key]`` as a float; a number too large for a float is inf (then out of bounds)."""
    try:
        if isinstance(obj[key], bool):  # JSON true is not 1 second or 1 token
            raise ValueError
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
        nf = math.nan if isinstance(n, bool) else float(n)  # type: ignore[arg-type]
        if not (nf.is_integer() and nf >= 1) or not isinstance(stream, str | int) \
                or isinstance(stream, bool) or str(stream) == "":
            raise ValueError(f"prefix segment {seg!r}: need a non-empty stream and tokens >= 1")
        out.append((str(stream), int(nf)))
    total = sum(n for _, n in out)
    if total > prompt_tokens:
        raise ValueError(f"prefix has {total} tokens, more than prompt_tokens={prompt_tokens}")
    return tuple(out)


def save_trace(trace: Trace, path: str | Path) -> None:
    """Write a trace as JSONL (readable by ``load_trace``), atomically."""
    lines = []
    for r in trace:
        obj: dict[str, object] = {"arrival_s": r.arrival_s, "prompt_tokens": r.prompt_tokens,
                                  "output_tokens": r.output_tokens}
        for k in _OPTIONAL:
            v = getattr(r, k)
            if v is not None and not (k == "priority" and v == 0):  # 0: vLLM's default
                obj[k] = v
        if r.prefix:
            obj["prefix"] = [list(seg) for seg in r.prefix]
        lines.append(json.dumps(obj) + "\n")
    write_atomic(path, "".join(lines))
