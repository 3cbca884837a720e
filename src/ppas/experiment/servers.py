"""One arm's server over the experiment: what to launch, start, health, stop, and the
restart-and-retry-once rule for a server that dies during a run.

Invariants:

* a server is started and stopped by the same thread (``ppas.live.server``: it dies with
  the thread that started it), and every start keeps its own log (``ARM.log``,
  ``ARM.2.log``, ...);
* a run is retried at most once, and only when the server is found dead (``/health`` does
  not answer) after it or before it could start; every attempt is recorded
  (``ppas.experiment.runfile.Attempt``); a failure while the server is healthy is raised.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO, TypeVar

from ppas.core.errors import PpasError
from ppas.experiment.runfile import Attempt
from ppas.experiment.spec import ArmSpec
from ppas.live.server import VllmServer


@dataclass(frozen=True)
class Launch:
    """Everything needed to start one arm's server."""

    arm: ArmSpec
    model: str
    max_num_batched_tokens: int
    max_num_seqs: int
    policy: str | None
    cost_model: str | None  # ppas.cost spec bound to the policy in the plugin
    step_log: Path | None
    log_path: Path
    pid_file: Path  # where the running server is recorded (``ppas.live.server.reap_stale``)
    extra_args: tuple[str, ...]
    env: dict[str, str]
    startup_timeout_s: float


#: ``launcher(launch)`` is a context manager whose ``__enter__`` returns a started server
#: with a ``base_url`` (the tests' fake servers implement it too)
Launcher = Callable[[Launch], AbstractContextManager[Any]]


def vllm_launcher(launch: Launch) -> AbstractContextManager[Any]:
    """``vllm serve`` through ``ppas.live.server.VllmServer`` (plugin or stock)."""
    return VllmServer(launch.model, policy=launch.policy,
                      max_num_batched_tokens=launch.max_num_batched_tokens,
                      max_num_seqs=launch.max_num_seqs, step_log=launch.step_log,
                      extra_args=launch.extra_args, env=launch.env,
                      startup_timeout_s=launch.startup_timeout_s, log_path=launch.log_path,
                      cost_model=launch.cost_model, pid_file=launch.pid_file)


def healthy(base_url: str, timeout_s: float = 10.0, tries: int = 3) -> bool:
    """Whether ``/health`` answers 200 (a busy 2-core host may be slow: a few tries)."""
    for k in range(tries):
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=timeout_s) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        if k + 1 < tries:
            time.sleep(1.0)
    return False


class Measured(Protocol):
    """What a run's measurement tells the retry rule."""

    @property
    def failed(self) -> int: ...


M = TypeVar("M", bound=Measured)


@dataclass
class ArmServer:
    """The arm's live server, restartable."""

    launcher: Launcher
    launch: Launch
    ctx: AbstractContextManager[Any] | None = None
    base_url: str = ""
    starts: int = 0
    fresh: bool = True  # no run yet on this start: the next run warms it up

    def start(self) -> float:
        """Start the server; returns the seconds it took to answer."""
        t = time.monotonic()
        self.starts += 1
        launch = self.launch
        if self.starts > 1:  # keep every server's log
            launch = dataclasses.replace(launch, log_path=launch.log_path.with_name(
                f"{launch.log_path.stem}.{self.starts}.log"))
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        if launch.step_log is not None:
            launch.step_log.parent.mkdir(parents=True, exist_ok=True)
        ctx = self.launcher(launch)
        srv = ctx.__enter__()
        self.ctx, self.base_url, self.fresh = ctx, srv.base_url, True
        return time.monotonic() - t

    def stop(self) -> None:
        ctx, self.ctx = self.ctx, None
        if ctx is not None:
            ctx.__exit__(None, None, None)

    def run_with_retry(self, measure: Callable[[], M],
                       stream: TextIO = sys.stderr) -> tuple[M | None, tuple[Attempt, ...]]:
        """``measure()`` once, or twice when the server died during the first: the last
        attempt's measurement (None if it measured nothing) and the attempts. The server is
        restarted after every death, so the next run finds it up."""
        attempts: list[Attempt] = []
        while True:
            died = ""
            result: M | None = None
            try:
                result = measure()
            except PpasError as e:  # server down before the run (or warm-up failed)
                if healthy(self.base_url):
                    raise
                died = str(e).splitlines()[0]
            if not died and not healthy(self.base_url):
                died = "the server stopped answering /health during the run"
            attempts.append(Attempt(len(attempts) + 1, bool(died), died,
                                    None if result is None else result.failed))
            if not died:
                return result, tuple(attempts)
            print(f"{self.launch.arm.name}: server died ({died}); restarting it", file=stream,
                  flush=True)
            self.stop()
            self.start()
            if len(attempts) >= 2:
                return result, tuple(attempts)
