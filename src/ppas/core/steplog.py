"""The step log: what ``ppas.vllm`` writes per engine step and ``ppas calibrate`` reads.

Format (JSONL, ``FORMAT_VERSION``): each server run appends one ``StepLogHeader`` line
(``{"ppas_step_log": VERSION, ...}``: start time, pid, policy, the server's config) and then
one ``StepLogRecord`` line per completed step. Several runs may share one file; the header
lines tell them apart. Logs from before the header existed (format 0: records only) still
read, as one run.

Data parallel (``--data-parallel-size N``): each engine core runs its own scheduler, so each
rank writes its own file (``rank_path``: ``steps.jsonl`` -> ``steps.dp0.jsonl``, ...,
``steps.dp{N-1}.jsonl``; with N = 1 the path is used as given), since several processes
appending to one file would interleave their lines. The header carries the rank and the size
(``data_parallel_rank``, ``data_parallel_size``); a header without them (written before they
existed) reads as rank 0 of 1 (``StepLogRun.dp_rank``, ``StepLogRun.dp_size``).

Durability (``StepLogWriter``): each record is one ``write()`` of a whole line, handed to the
OS when the step completes (every ``flush_every`` steps; default 1), so a server killed with
SIGKILL loses at most the step being written, and SIGTERM to the whole process group (a
terminal's Ctrl-C, ``timeout``, systemd, a container runtime) loses nothing that completed.
A kill in the middle of a write leaves a truncated last line without its newline; the reader
skips exactly that line and says so (``StepLog.warning``). Anything else malformed (bad JSON,
a step lacking a field or with one of the wrong type) is an error naming ``file:line``.

Reading (``read_step_log``): the one reader of every consumer (``ppas calibrate``, ``ppas
profile``, the experiment runner). Each step line becomes a checked ``Step``; a reader that
starts at a byte ``offset`` (the size the file had before a run) sees that run's steps only.
"""

from __future__ import annotations

import atexit
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from ppas.core.errors import PpasError
from ppas.core.limits import MAX_CONTEXT_TOKENS, MAX_DP_SIZE, MAX_PROMPT_TOKENS, MAX_TIME_S

FORMAT_VERSION = 1
HEADER_KEY = "ppas_step_log"  # its value is the format version


class StepLogHeader(TypedDict):
    """First line of each server run."""

    ppas_step_log: int  # FORMAT_VERSION
    started: str  # ISO 8601 wall time (UTC) the scheduler started
    started_unix: float  # the same, seconds since the epoch
    pid: int  # the engine-core process writing this run
    policy: str  # the policy's canonical config string
    cost_model: str | None  # the plugin's cost_model spec, if any
    server: dict[str, Any]  # vLLM settings: version, model, max_num_batched_tokens, ...
    data_parallel_rank: int  # this engine core's data-parallel rank (absent in old logs: 0)
    data_parallel_size: int  # the server's data-parallel size (absent in old logs: 1)


def rank_path(path: str, rank: int, size: int) -> str:
    """The file data-parallel rank ``rank`` of ``size`` writes: ``path`` itself when
    ``size`` is 1, else ``path`` with ``.dp{rank}`` before its last suffix (``steps.jsonl``
    -> ``steps.dp1.jsonl``; ``steps`` -> ``steps.dp1``). Every rank is suffixed, rank 0
    too, so no reader mistakes one rank's file for the whole server's log."""
    if size <= 1:
        return path
    head, name = os.path.split(path)
    stem, dot, ext = name.rpartition(".")
    new = f"{stem}.dp{rank}.{ext}" if dot and stem else f"{name}.dp{rank}"
    return os.path.join(head, new)


class StepLogRecord(TypedDict):
    """One completed engine step. Times in seconds (``time`` is the launch on the engine's
    monotonic clock); ``duration_s`` is completion-timed (see ``ppas.vllm``)."""

    step: int  # 1, 2, ... within the run
    time: float
    duration_s: float
    interval_s: float  # since the previous schedule() call
    pending_prefills: int  # N_p the policy saw
    running_decodes: int  # N_d the policy saw
    prefill_budget: int  # the cap enforced this step
    num_prefill_tokens: int
    num_decode_tokens: int
    num_prefill_reqs: int
    num_decode_reqs: int
    prefill_chunks: Sequence[Sequence[int]]  # [chunk_tokens, cached_context_before_chunk]
    decode_contexts: Sequence[int]  # tokens already cached per decode-side request


class StepLogWriter:
    """Appends one header line, then one line per step; see the module doc."""

    def __init__(self, path: str, header: StepLogHeader, flush_every: int = 1) -> None:
        self.path = path
        self.flush_every = flush_every
        self._pending = 0
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            # Unbuffered binary file: each write() is one system call with one whole line.
            self._f = open(path, "ab", buffering=0)  # noqa: SIM115 (closed in close())
        except OSError as e:
            raise PpasError(f"ppas.vllm: cannot open step_log {path!r}: {e.strerror}") from None
        self._buf: list[bytes] = []
        self._emit(header)
        self.flush()
        atexit.register(self.close)

    def _emit(self, obj: Any) -> None:
        self._buf.append(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    def write(self, record: StepLogRecord) -> None:
        self._emit(record)
        if len(self._buf) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if self._buf and not self._f.closed:
            self._f.write(b"".join(self._buf))
            self._buf.clear()

    def close(self) -> None:
        if not self._f.closed:
            self.flush()
            self._f.close()


#: The fields a step needs to be read (the fit's target and the step's shape); the others
#: are kept in ``Step.record`` as written.
REQUIRED = ("duration_s", "prefill_chunks", "decode_contexts")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True, slots=True)
class Step:
    """One completed engine step as read back (the reader's side of ``StepLogRecord``).

    Invariants (checked by ``of``): ``duration_s`` is in ``[0, MAX_TIME_S]``; every prefill
    chunk is ``(1 <= chunk_tokens <= MAX_PROMPT_TOKENS, cached_context_before_chunk >= 0)``
    with chunk + context <= ``MAX_CONTEXT_TOKENS``; every decode context is an integer in
    ``[0, MAX_CONTEXT_TOKENS]`` (``ppas.core.limits``); the counts the record carries
    (``num_prefill_tokens``, ``num_prefill_reqs``, ``num_decode_reqs``) agree with its
    lists. ``record`` is the line's object exactly as written (run files copy it)."""

    duration_s: float
    prefill_chunks: tuple[tuple[int, int], ...]
    decode_contexts: tuple[int, ...]
    time: float | None  # the launch on the engine's monotonic clock; None if not logged
    record: Mapping[str, Any] = field(compare=False, repr=False)

    @classmethod
    def of(cls, obj: Any) -> Step:
        """One step-log object -> Step; ValueError names what is wrong."""
        if not isinstance(obj, dict):
            raise ValueError("expected a JSON object (one step)")
        missing = [k for k in REQUIRED if k not in obj]
        if missing:
            raise ValueError(f"step lacks {', '.join(missing)}; is this a ppas.vllm step log?")
        d = obj["duration_s"]
        if not isinstance(d, int | float) or isinstance(d, bool) or not math.isfinite(d) or (
                not 0 <= d <= MAX_TIME_S):
            raise ValueError(f"duration_s must be a finite number >= 0 and <= {MAX_TIME_S:g}, "
                             f"got {d!r}")
        chunks = obj["prefill_chunks"]
        if not isinstance(chunks, list) or not all(
                isinstance(c, list) and len(c) == 2 and _is_int(c[0]) and _is_int(c[1])
                and 1 <= c[0] <= MAX_PROMPT_TOKENS and 0 <= c[1] <= MAX_CONTEXT_TOKENS - c[0]
                for c in chunks):
            raise ValueError(f"prefill_chunks must be a list of [chunk_tokens in [1, "
                             f"{MAX_PROMPT_TOKENS}], cached_context >= 0] integer pairs, "
                             f"chunk + context <= {MAX_CONTEXT_TOKENS}, got {chunks!r:.80}")
        ctx = obj["decode_contexts"]
        if not isinstance(ctx, list) or not all(
                _is_int(k) and 0 <= k <= MAX_CONTEXT_TOKENS for k in ctx):
            raise ValueError(f"decode_contexts must be a list of integers in [0, "
                             f"{MAX_CONTEXT_TOKENS}], got {ctx!r:.80}")
        for key, want in (("num_prefill_tokens", sum(c for c, _ in chunks)),
                          ("num_prefill_reqs", len(chunks)), ("num_decode_reqs", len(ctx))):
            if key in obj and obj[key] != want:
                raise ValueError(f"{key} is {obj[key]!r:.40} but its lists make {want}")
        t = obj.get("time")
        launch = float(t) if isinstance(t, int | float) and not isinstance(t, bool) else None
        return cls(float(d), tuple((c, p) for c, p in chunks), tuple(ctx), launch, obj)


@dataclass
class StepLogRun:
    """One server run of a log: its header (None for a format-0 log, or for a read that
    started after it) and its steps, in order."""

    header: StepLogHeader | None
    steps: list[Step] = field(default_factory=list)

    @property
    def dp_rank(self) -> int:
        """The data-parallel rank that wrote this run (0 if the header does not say)."""
        return int(self.header.get("data_parallel_rank", 0)) if self.header else 0

    @property
    def dp_size(self) -> int:
        """The server's data-parallel size (1 if the header does not say)."""
        return int(self.header.get("data_parallel_size", 1)) if self.header else 1


@dataclass
class StepLog:
    path: Path
    runs: list[StepLogRun]
    warning: str | None = None  # set when a truncated last line was skipped

    @property
    def steps(self) -> list[Step]:
        """Every step of every run, in file order."""
        return [s for run in self.runs for s in run.steps]


def read_step_log(path: str | Path, offset: int = 0) -> StepLog:
    """Read a log from byte ``offset`` (a line start, such as the file's size before a run)
    into runs of checked steps. Raises PpasError naming ``file:line`` on anything malformed
    but a truncated last line (see the module doc)."""
    p = Path(path)
    if not p.is_file():
        raise PpasError(f"step log {str(p)!r} does not exist")
    try:
        with open(p, "rb") as f:
            first = f.read(offset).count(b"\n") + 1  # the line number at ``offset``
            text = f.read().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise PpasError(f"{p}: cannot read step log: {e}") from None
    lines = text.split("\n")
    complete = text.endswith("\n")
    runs: list[StepLogRun] = []
    warning = None
    for i, line in enumerate(lines):
        n = first + i
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) - 1 and not complete:  # the last write was cut short
                warning = (f"{p}:{n}: skipped a truncated last line (the server was killed "
                           "while writing it)")
                break
            raise PpasError(f"{p}:{n}: invalid JSON: {e.msg}") from None
        if isinstance(obj, dict) and HEADER_KEY in obj:
            version = obj[HEADER_KEY]
            if not isinstance(version, int) or isinstance(version, bool) or not (
                    1 <= version <= FORMAT_VERSION):
                raise PpasError(f"{p}:{n}: step log format {version!r} is not supported; "
                                f"this ppas reads formats 0 to {FORMAT_VERSION}")
            size, rank = obj.get("data_parallel_size", 1), obj.get("data_parallel_rank", 0)
            if not _is_int(size) or not 1 <= size <= MAX_DP_SIZE:
                raise PpasError(f"{p}:{n}: data_parallel_size must be an integer in [1, "
                                f"{MAX_DP_SIZE}], got {size!r:.40}")
            if not _is_int(rank) or not 0 <= rank < size:
                raise PpasError(f"{p}:{n}: data_parallel_rank must be an integer in [0, "
                                f"{size - 1}] (below data_parallel_size), got {rank!r:.40}")
            runs.append(StepLogRun(obj))  # type: ignore[arg-type]
            continue
        if not runs:
            runs.append(StepLogRun(None))
        try:
            runs[-1].steps.append(Step.of(obj))
        except ValueError as e:
            raise PpasError(f"{p}:{n}: {e}") from None
    return StepLog(p, runs, warning)


__all__ = ["FORMAT_VERSION", "HEADER_KEY", "REQUIRED", "Step", "StepLog", "StepLogHeader",
           "StepLogRecord", "StepLogRun", "StepLogWriter", "rank_path", "read_step_log"]
