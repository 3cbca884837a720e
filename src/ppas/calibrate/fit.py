"""Calibration: fit ``ppas.cost.fitted``'s step-time model to the vLLM plugin's steps and
save it (``ppas calibrate``, ``ppas profile``, the experiment's ``fitted:auto`` and report).

The steps come from ``ppas.core.steplog`` (the one reader); the fit takes each step's
``duration_s`` (completion-timed wall time) as the target and its shape from
``prefill_chunks`` (``[chunk_tokens, cached_context_before_chunk]`` pairs) and
``decode_contexts`` (tokens already cached per decode). Other fields are ignored.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from ppas.core.steplog import Step, read_step_log
from ppas.cost.base import StepShape
from ppas.cost.fitted import FittedCostModel, fit


def sample(step: Step) -> tuple[StepShape, float]:
    """A step as the fit sees it: (shape, seconds)."""
    return StepShape.of(list(step.prefill_chunks), list(step.decode_contexts)), step.duration_s


def read_steps(path: str | Path, skip_steps: int = 0,
               warn: Callable[[str], None] | None = None) -> list[Step]:
    """All steps of one log, minus the first ``skip_steps`` of each server run in it
    (warm-up). A malformed line raises a PpasError naming ``file:line``; a truncated last
    line (a killed server) is skipped with a one-line warning to ``warn`` (default stderr)."""
    log = read_step_log(path)
    if log.warning is not None:
        (warn or _warn)(log.warning)
    return [s for run in log.runs for s in run.steps[skip_steps:]]


def fit_and_save(steps: Iterable[Step], path: str | Path, *, sources: Sequence[str],
                 kv_capacity_tokens: int | None = None) -> FittedCostModel:
    """Fit the model to ``steps`` and write it atomically to ``path``; returns it. Raises
    PpasError when the steps cannot be fitted (none, or all of 0 s)."""
    model = fit([sample(s) for s in steps], kv_capacity_tokens=kv_capacity_tokens,
                sources=sources)
    model.to_file(path)
    return model


def _warn(msg: str) -> None:
    print(f"ppas: warning: {msg}", file=sys.stderr)


__all__ = ["fit_and_save", "read_steps", "sample"]
