"""The step log: what ``ppas.vllm`` writes per engine step and ``ppas calibrate`` reads.

Format (JSONL, ``FORMAT_VERSION``): each server run appends one ``StepLogHeader`` line
(``{"ppas_step_log": VERSION, ...}``: start time, pid, policy, the server's config) and then
one ``StepLogRecord`` line per completed step. Several runs may share one file; the header
lines tell them apart. Logs from before the header existed (format 0: records only) still
read, as one run.

Durability (``StepLogWriter``): each record is one ``write()`` of a whole line, handed to the
OS when the step completes (every ``flush_every`` steps; default 1), so a server killed with
SIGKILL loses at most the step being written, and SIGTERM to the whole process group (a
terminal's Ctrl-C, ``timeout``, systemd, a container runtime) loses nothing that completed.
A kill in the middle of a write leaves a truncated last line without its newline; the reader
skips exactly that line and says so (``StepLog.warning``). Anything else malformed is an
error naming ``file:line``.
"""

from __future__ import annotations

import atexit
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from ppas.core.errors import PpasError

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


@dataclass
class StepLogRun:
    """One server run of a log: its header (None for a format-0 log) and its records."""

    header: StepLogHeader | None
    records: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (line, record)


@dataclass
class StepLog:
    path: Path
    runs: list[StepLogRun]
    warning: str | None = None  # set when a truncated last line was skipped


def read_step_log_runs(path: str | Path) -> StepLog:
    """Parse a log into runs of raw record objects (field checks are the reader's job)."""
    p = Path(path)
    if not p.is_file():
        raise PpasError(f"step log {str(p)!r} does not exist")
    try:
        text = p.read_bytes().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise PpasError(f"{p}: cannot read step log: {e}") from None
    lines = text.split("\n")
    complete = text.endswith("\n")
    runs: list[StepLogRun] = []
    warning = None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines) and not complete:  # the last write was cut short
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
            runs.append(StepLogRun(obj))  # type: ignore[arg-type]
            continue
        if not runs:
            runs.append(StepLogRun(None))
        if not isinstance(obj, dict):
            raise PpasError(f"{p}:{n}: expected a JSON object (one step)")
        runs[-1].records.append((n, obj))
    return StepLog(p, runs, warning)


__all__ = ["FORMAT_VERSION", "HEADER_KEY", "StepLog", "StepLogHeader", "StepLogRecord",
           "StepLogRun", "StepLogWriter", "read_step_log_runs"]
