"""One measured replay of a (load, seed) trace on an arm's running server.

Invariants: the arrivals of a (load, seed) are the same for every arm, and its prompts'
random prefixes are seeded per (load, seed) (``prompt_seed``), so no two runs on one server
share a prefix (no prefix-cache hits) while every arm sees the same prompts; the warm-up
requests go before the first run of each server start; the run's step slice is the step-log
lines written after the run started; a set ``StopFlag`` cancels the replay and raises
``Interrupted`` (nothing of the run is kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppas.core.steplog import read_step_log
from ppas.experiment.servers import ArmServer
from ppas.experiment.spec import Experiment
from ppas.experiment.stopping import Interrupted, StopFlag
from ppas.live.client import ReplayOptions, run_trace
from ppas.live.outcome import BenchResult
from ppas.live.results import summarize


@dataclass(frozen=True)
class Measurement:
    result: BenchResult
    summary: dict[str, Any]  # ``ppas.live.results.summarize(result)``
    steps: list[dict[str, Any]]  # the server's step-log lines of the run
    wall_s: float

    @property
    def failed(self) -> int:
        return int(self.summary["failed"])


def prompt_seed(exp: Experiment, load: float, seed: int) -> int:
    return 1000 * seed + exp.workload.loads.index(load) + 1


def measure(exp: Experiment, srv: ArmServer, load: float, seed: int,
            stop: StopFlag) -> Measurement:
    """One replay of the (load, seed) trace on ``srv``."""
    w = exp.workload
    trace = w.trace(load, seed)
    step_log = srv.launch.step_log
    offset = step_log.stat().st_size if step_log is not None and step_log.exists() else 0
    t_start = [time.monotonic()]

    def started() -> None:
        t_start[0] = time.monotonic()

    async def go() -> BenchResult:
        task = asyncio.ensure_future(run_trace(
            srv.base_url, exp.model.path, trace, ReplayOptions(
                prompt_seed=prompt_seed(exp, load, seed),
                vocab_size=exp.model.vocab_size,
                filler_id=min(1000, exp.model.vocab_size - 1),
                request_timeout_s=w.request_timeout_s,
                num_warmups=w.warmup_requests if srv.fresh else 0), on_start=started))
        while not task.done():
            await asyncio.wait({task}, timeout=0.2)
            if stop.is_set() and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                raise Interrupted
        return task.result()

    t0 = time.monotonic()
    with stop.measuring():
        result = asyncio.run(go())
    srv.fresh = False
    wall = time.monotonic() - t0
    time.sleep(0.3)  # the engine flushes its step log when it goes idle
    return Measurement(result, summarize(result), _read_steps(step_log, offset, t_start[0]),
                       wall)


def _read_steps(path: Path | None, offset: int, t_start: float) -> list[dict[str, Any]]:
    """Step-log lines appended after ``offset`` and launched after ``t_start`` (the
    measured run's start on the monotonic clock shared with the engine process)."""
    if path is None or not path.exists():
        return []
    return [dict(s.record) for s in read_step_log(path, offset).steps
            if s.time is None or s.time >= t_start]
