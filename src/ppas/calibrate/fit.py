"""Reading the vLLM plugin's step logs for ``ppas calibrate`` (``ppas.commands.calibrate``),
which fits ``ppas.cost.fitted``'s step-time model to them.

A step log (``ppas.core.steplog``, written by ``ppas.vllm``) is JSONL, one header line per server
run and one object per engine step. The fit uses
``duration_s`` (the step's completion-timed wall time) as the target and the step's shape
from ``prefill_chunks`` (``[chunk_tokens, cached_context_before_chunk]`` pairs) and
``decode_contexts`` (tokens already cached per decode). Other keys are ignored.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ppas.core.errors import PpasError
from ppas.core.steplog import read_step_log_runs
from ppas.cost.base import StepShape

REQUIRED = ("duration_s", "prefill_chunks", "decode_contexts")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def step_record(obj: Any) -> tuple[StepShape, float]:
    """One step-log object -> (shape, seconds); ValueError names what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object (one step)")
    missing = [k for k in REQUIRED if k not in obj]
    if missing:
        raise ValueError(f"step lacks {', '.join(missing)}; is this a ppas.vllm step log?")
    d = obj["duration_s"]
    if not isinstance(d, int | float) or isinstance(d, bool) or not math.isfinite(d) or d < 0:
        raise ValueError(f"duration_s must be a finite number >= 0, got {d!r}")
    chunks = obj["prefill_chunks"]
    if not isinstance(chunks, list) or not all(
            isinstance(c, list) and len(c) == 2 and _is_int(c[0]) and _is_int(c[1])
            and c[0] >= 1 and c[1] >= 0 for c in chunks):
        raise ValueError("prefill_chunks must be a list of [chunk_tokens >= 1, "
                         f"cached_context >= 0] integer pairs, got {chunks!r:.80}")
    ctx = obj["decode_contexts"]
    if not isinstance(ctx, list) or not all(_is_int(k) and k >= 0 for k in ctx):
        raise ValueError(f"decode_contexts must be a list of integers >= 0, got {ctx!r:.80}")
    return StepShape.of([(c, p) for c, p in chunks], ctx), float(d)


def read_step_log(path: str | Path, skip_steps: int = 0,
                  warn: Callable[[str], None] | None = None) -> list[tuple[StepShape, float]]:
    """All steps of one log, minus the first ``skip_steps`` of each server run in it
    (warm-up). A malformed line raises a PpasError naming ``file:line``; a truncated last
    line (a killed server) is skipped with a one-line warning to ``warn`` (default stderr)."""
    log = read_step_log_runs(path)
    if log.warning is not None:
        (warn or _warn)(log.warning)
    records = []
    for run in log.runs:
        part = []
        for n, obj in run.records:
            try:
                part.append(step_record(obj))
            except ValueError as e:
                raise PpasError(f"{log.path}:{n}: {e}") from None
        records += part[skip_steps:]
    return records


def _warn(msg: str) -> None:
    print(f"ppas: warning: {msg}", file=sys.stderr)
