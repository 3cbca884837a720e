"""An experiment's results folder: its layout, which runs are done, and the record of the
settings its runs were made with.

    experiment.json        the experiment's name, fingerprint and source file
    runs/ARM/LOAD-sSEED.json  one completed run each (``ppas.experiment.runfile``)
    steps/ARM.jsonl        a plugin arm's server step log
    logs/ARM.log, ARM.pid  a server's log; the running server (``ppas.live.server``)
    cost-auto.json         the ``fitted:auto`` arms' cost model

Invariants: runs of one folder were all made with one fingerprint (``check_same`` refuses
a resume or a report across a change); a folder with completed runs is only written into
again with ``--resume``; before any server starts, servers a killed earlier run left
behind are stopped (``reap_stale_servers``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

from ppas.core.errors import PpasError
from ppas.core.outputs import write_json_atomic
from ppas.experiment.runfile import RunFile, read_run
from ppas.experiment.spec import Experiment
from ppas.live.server import reap_stale

RUNS_DIR = "runs"
STEPS_DIR = "steps"
LOGS_DIR = "logs"
AUTO_COST = "cost-auto.json"
STATE_FILE = "experiment.json"

#: a run: (arm name, load, seed)
RunKey = tuple[str, float, int]


def slug(name: str) -> str:
    """An arm name as a file name."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def run_path(out: Path, arm: str, load_label: str, seed: int) -> Path:
    return out / RUNS_DIR / slug(arm) / f"{load_label}-s{seed}.json"


class ResultsFolder:
    """``exp.out_dir`` seen through ``exp``'s arms and cells."""

    def __init__(self, exp: Experiment, stream: TextIO = sys.stderr) -> None:
        self.exp = exp
        self.out = Path(exp.out_dir)
        self.stream = stream

    def run_path(self, arm: str, load: float, seed: int) -> Path:
        return run_path(self.out, arm, self.exp.workload.load_label(load), seed)

    def completed(self) -> set[RunKey]:
        return {(arm.name, load, seed) for arm in self.exp.arms
                for load, seed in self.exp.cells()
                if self.run_path(arm.name, load, seed).is_file()}

    def runs(self, arm: str | None = None) -> list[RunFile]:
        """The completed runs (of ``arm``, or of every arm), in (arm order, load, seed)
        order."""
        return [read_run(p) for a in self.exp.arms if arm in (None, a.name)
                for load, seed in self.exp.cells()
                if (p := self.run_path(a.name, load, seed)).is_file()]

    def arm_dir(self, arm: str) -> Path:
        return self.out / RUNS_DIR / slug(arm)

    def step_log(self, arm: str) -> Path:
        return (self.out / STEPS_DIR / f"{slug(arm)}.jsonl").resolve()

    def server_log(self, arm: str) -> Path:
        return self.out / LOGS_DIR / f"{slug(arm)}.log"

    def pid_file(self, arm: str) -> Path:
        return self.out / LOGS_DIR / f"{slug(arm)}.pid"

    # -- the folder's state --------------------------------------------------------------
    def prepare(self, resume: bool) -> None:
        """Check the folder against ``resume`` and record the experiment in it."""
        if self.out.exists() and not self.out.is_dir():
            raise PpasError(f"out_dir {str(self.out)!r} exists and is not a folder")
        n = len(self.completed())
        if n and not resume:
            raise PpasError(f"{self.out} already holds {n} completed runs of an experiment; "
                            "pass --resume to finish it, or set another out_dir (--out-dir)")
        if resume:
            self.check_same("--resume")
        self.reap_stale_servers()
        self.out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.out / STATE_FILE, {"name": self.exp.name,
                                                  "fingerprint": self.exp.fingerprint(),
                                                  "source": self.exp.source})

    def reap_stale_servers(self) -> None:
        """Stop the servers a killed earlier run of this folder left running."""
        for f in sorted((self.out / LOGS_DIR).glob("*.pid")):
            pid = reap_stale(f)
            if pid is not None:
                print(f"stopped server pid {pid} left running by an earlier run ({f.name})",
                      file=self.stream, flush=True)

    def check_same(self, what: str) -> None:
        """Refuse a folder whose runs were made with other settings."""
        state = self.out / STATE_FILE
        if not state.is_file():
            return
        try:
            old = json.loads(state.read_text()).get("fingerprint")
        except (OSError, ValueError):
            old = None
        if old is not None and old != self.exp.fingerprint():
            diff = [k for k in old if old.get(k) != self.exp.fingerprint().get(k)]
            raise PpasError(f"{what}: the experiment's {', '.join(diff) or 'settings'} "
                            f"changed since the runs in {self.out} were made; restore "
                            "the file or use another out_dir")
