"""The experiment's progress bar: runs done, time elapsed, and an ETA that is the plan's
estimate of the work left (``ppas.experiment.plan``) scaled by how the finished work
compared with its own estimate."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TextIO


@dataclass
class Progress:
    """One line per finished item (a server start, a run); safe across worker threads."""

    total_runs: int
    remaining_est_s: float
    stream: TextIO = sys.stderr
    done_runs: int = 0
    measured_s: float = 0.0  # wall time of finished items
    estimated_s: float = 0.0  # their estimate
    t0: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def item(self, est_s: float, wall_s: float, run_done: bool, line: str) -> None:
        with self.lock:
            self.remaining_est_s = max(0.0, self.remaining_est_s - est_s)
            self.measured_s += wall_s
            self.estimated_s += est_s
            self.done_runs += run_done
            scale = self.measured_s / self.estimated_s if self.estimated_s > 0 else 1.0
            eta = self.remaining_est_s * scale
            n = 24
            k = round(n * self.done_runs / max(1, self.total_runs))
            bar = "#" * k + "." * (n - k)
            print(f"[{bar}] {self.done_runs}/{self.total_runs} runs, "
                  f"{_dur(time.monotonic() - self.t0)} elapsed, ETA {_dur(eta)} | {line}",
                  file=self.stream, flush=True)


def _dur(s: float) -> str:
    s = max(0, round(s))
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
