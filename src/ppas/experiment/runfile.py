"""One run's file, ``runs/ARM/LOAD-sSEED.json``: what one replay of a (load, seed) trace on
one arm's server measured.

Invariants:

* a run file is written atomically and only once the run is complete, so a file present
  means a run done (``--resume`` skips it; a kill loses at most the run in flight);
* the JSON object has the keys of ``RunFile``, in its field order; ``RunFile.to_json``
  gives exactly the object ``ppas experiment`` has always written, and ``from_json`` reads
  every folder written so far (files from before the runs recorded ``vllm_version`` or
  ``settings`` read them as None; ``to_json`` leaves out a None ``settings``);
* a file is a run file only when every field has its type, the summary's counts are
  integers >= 0 and its figures finite numbers or None (no NaN anywhere: ``read_run``), and
  every step is a step-log step (``ppas.core.steplog.Step.of``);
* ``retried`` is derived: a run was retried when it took more than one attempt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ppas.core.errors import PpasError
from ppas.core.outputs import write_json_atomic
from ppas.core.steplog import Step


@dataclass(frozen=True)
class Attempt:
    """One try at a run; a run has two only when the server died during the first."""

    attempt: int  # 1, 2
    server_died: bool
    reason: str  # why the server was declared dead ("" when it was not)
    failed: int | None  # failed requests, None when the attempt measured nothing

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "server_died": self.server_died,
                "reason": self.reason, "failed": self.failed}

    @staticmethod
    def from_json(obj: dict[str, Any]) -> Attempt:
        return Attempt(obj["attempt"], obj["server_died"], obj["reason"], obj["failed"])


@dataclass(frozen=True)
class RunFile:
    """A completed run; fields in the file's key order (``retried`` sits between
    ``attempts`` and ``wall_s`` there)."""

    arm: str
    load: float  # the burst or request rate (0.0 for a trace file)
    load_label: str  # the load as it appears in the file name
    seed: int  # the arrivals' seed
    prompt_seed: int  # the prompts' random prefixes: one per (load, seed), same for every arm
    trace: str  # the trace's description
    policy: str | None  # the plugin's policy; None for a stock vLLM arm
    stock: dict[str, int]  # a stock arm's vLLM knobs ({} for a plugin arm)
    vllm_version: str | None  # the vLLM the server ran (None in files from before it was kept)
    cost_model: str | None  # the cost model bound to the policy in the plugin
    max_num_batched_tokens: int
    attempts: tuple[Attempt, ...]
    wall_s: float  # the measured replay's wall time
    finished_at: float  # Unix time the run completed
    summary: dict[str, Any]  # ``ppas.live.results.summarize`` of the replay
    per_request: dict[str, Any]  # per-request arrays (arrivals, latencies, ...)
    steps: tuple[dict[str, Any], ...]  # the server's step-log slice for the run (plugin arms)
    #: ``Experiment.settings_hash`` of the settings the run was made with (None in files
    #: from before it was kept)
    settings: str | None = None

    def __post_init__(self) -> None:
        wrong = [f.name for f in fields(self) if not isinstance(getattr(self, f.name),
                                                                _KINDS[f.name])]
        if wrong:
            raise ValueError(f"wrong type of {', '.join(wrong)}")
        if not self.attempts:
            raise ValueError("a run file records at least one attempt")
        for k in ("completed", "failed"):
            v = self.summary.get(k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"summary.{k} must be an integer >= 0, got {v!r}")
        for k in _FIGURES:
            v = self.summary.get(k)
            if v is not None and (not isinstance(v, int | float) or isinstance(v, bool)):
                raise ValueError(f"summary.{k} must be a number or null, got {v!r}")
        for s in self.steps:
            Step.of(s)

    @property
    def retried(self) -> bool:
        return len(self.attempts) > 1

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "wall_s":
                obj["retried"] = self.retried
            obj[f.name] = getattr(self, f.name)
        if self.settings is None:
            del obj["settings"]
        obj["attempts"] = [a.to_json() for a in self.attempts]
        obj["steps"] = list(self.steps)
        return obj

    @staticmethod
    def from_json(obj: dict[str, Any]) -> RunFile:
        """KeyError/TypeError when ``obj`` lacks a key or is not an object."""
        if not isinstance(obj, dict):
            raise TypeError(f"expected a JSON object, got {type(obj).__name__}")
        args: dict[str, Any] = {f.name: obj.get(f.name) if f.name in _LATER else obj[f.name]
                                for f in fields(RunFile)}
        args["attempts"] = tuple(Attempt.from_json(a) for a in obj["attempts"])
        args["steps"] = tuple(obj["steps"])
        return RunFile(**args)


#: keys files written before them lack
_LATER = ("vllm_version", "settings")
#: the summary's figures: a number, or null when no request completed
_FIGURES = ("avg_latency", "p95_latency", "avg_ttft", "p95_ttft", "avg_tpot", "p95_tpot",
            "makespan")
_NUM = (int, float)
_KINDS: dict[str, type | tuple[type, ...]] = {
    "arm": str, "load": _NUM, "load_label": str, "seed": int, "prompt_seed": int, "trace": str,
    "policy": (str, type(None)), "stock": dict, "vllm_version": (str, type(None)),
    "cost_model": (str, type(None)), "max_num_batched_tokens": int, "attempts": tuple,
    "wall_s": _NUM, "finished_at": _NUM, "summary": dict, "per_request": dict, "steps": tuple,
    "settings": (str, type(None))}


def write_run(path: Path, run: RunFile) -> None:
    """Publish a completed run (atomically: the file is whole or absent)."""
    write_json_atomic(path, run.to_json())


def read_run(path: Path) -> RunFile:
    """A run file; a file that is not one (NaN and Infinity included) is a one-line
    ``PpasError``."""
    try:
        if not path.is_file():  # a FIFO would block the read, a device never end it
            raise ValueError("not a regular file")
        return RunFile.from_json(json.loads(path.read_text(), parse_constant=_no_constant))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PpasError(f"{path}: not a ppas experiment run file ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''})") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")
