"""Trace files: ``load_trace`` reads a CSV or JSONL trace (``READERS``, by suffix), checks
every row against the limits and names the file and line of a bad one; ``save_trace``
writes JSONL."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from pathlib import Path

from ppas.core.errors import PpasError
from ppas.core.limits import MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS, MAX_REQUESTS, MAX_TIME_S
from ppas.core.outputs import write_atomic
from ppas.workload.requests import RequestSpec, Segments, Trace

_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens")
_OPTIONAL = ("ttft_slo", "tpot_slo", "slo_class")
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


#: Trace formats by file suffix. A reader turns a file's text into ``Rows`` with
#: ``_parse_row``'s column names, which validates every row the same way; a new format
#: (a public trace's own columns) is one reader that maps its columns, added here.
READERS: dict[str, Callable[[Path, str], Rows]] = {
    ".jsonl": _jsonl_rows, ".json": _jsonl_rows, ".ndjson": _jsonl_rows, ".csv": _csv_rows,
}


def load_trace(path: str | Path) -> Trace:
    """Read a CSV (header row) or JSONL trace with ``arrival_s, prompt_tokens,
    output_tokens`` (optional ``ttft_slo, tpot_slo, slo_class``, and the shared prompt
    prefix: JSONL ``prefix`` as ``[[stream, tokens], ...]``, or in either format one
    segment as ``prefix_group`` + ``prefix_tokens``). A malformed line raises a PpasError
    naming the file and line number."""
    p = Path(path)
    if not p.is_file():
        raise PpasError(f"trace file {str(p)!r} does not exist")
    try:
        text = p.read_bytes().decode("utf-8-sig")  # a BOM (Excel's CSV) is not a header
    except (OSError, UnicodeDecodeError) as e:
        raise PpasError(f"{p}: cannot read trace file: {e}") from None
    read = READERS.get(p.suffix.lower())
    if read is None:
        raise PpasError(f"{p}: unknown trace format {p.suffix!r}; allowed: .csv, .jsonl")
    rows = read(p, text)
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
            if getattr(r, k) is not None:
                obj[k] = getattr(r, k)
        if r.prefix:
            obj["prefix"] = [list(seg) for seg in r.prefix]
        lines.append(json.dumps(obj) + "\n")
    write_atomic(path, "".join(lines))
