"""An experiment's results folder: its layout, which runs are done, and the record of the
settings its runs were made with.

    experiment.json        the experiment's name, fingerprint and source file
    .lock                  held (``fcntl.flock``) by the one experiment writing the folder
    runs/ARM/LOAD-sSEED.json  one completed run each (``ppas.experiment.runfile``)
    failed/ARM/LOAD-sSEED.json  a run in which no request succeeded (not counted; re-run)
    steps/ARM.jsonl        a plugin arm's server step log
    logs/ARM.log, ARM.pid  a server's log; the running server (``ppas.live.server``)
    cost-auto.json         the ``fitted:auto`` arms' cost model

ARM is ``file_name(arm name)`` and LOAD ``WorkloadSpec.load_label(load)``: both injective
(``name_of`` and ``float`` read them back), so no two runs share a file, and no name leaves
its folder (a leading ``.`` is escaped: ``..`` is ``%2E.``).

Invariants:

* a run is complete only when its file parses as a ``RunFile`` of that very (arm, load,
  seed), made with this experiment's settings (``RunFile.settings`` equals
  ``Experiment.settings_hash``; files from before it was recorded count when
  ``experiment.json`` matches) and with at least one request that succeeded; any other file
  is pending (``check``): ``--resume`` re-runs it and ``--report`` lists it, unread; a
  folder written before these names is read where its file holds that very run;
* runs of one folder were all made with one fingerprint: ``check_same`` refuses a resume or
  a report across a change; a missing or unreadable ``experiment.json`` is rebuilt from the
  run files only when every one of them records these settings, else the resume is refused
  (never re-stamped); a run file made for another run or other settings is never
  overwritten;
* one experiment at a time writes the folder (``locked``); a folder with run files is only
  written into again with ``--resume``; before any server starts, servers a killed earlier
  run left behind are stopped (``reap_stale_servers``).
"""

from __future__ import annotations

import fcntl
import json
import os
import string
import sys
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ppas.core.errors import PpasError
from ppas.core.outputs import write_json_atomic
from ppas.experiment.runfile import RunFile, read_run
from ppas.experiment.spec import Experiment
from ppas.live.server import reap_stale

RUNS_DIR = "runs"
FAILED_DIR = "failed"
STEPS_DIR = "steps"
LOGS_DIR = "logs"
AUTO_COST = "cost-auto.json"
STATE_FILE = "experiment.json"
LOCK_FILE = ".lock"

#: a run: (arm name, load, seed)
RunKey = tuple[str, float, int]

_SAFE = frozenset(string.ascii_letters + string.digits + "-_.")


def file_name(name: str) -> str:
    """``name`` as one file name, injectively: ASCII letters, digits, ``-_.`` stay, every
    other character (and a leading ``.``) becomes ``%XX`` per UTF-8 byte (``mbt:64`` ->
    ``mbt%3A64``, ``mbt_64`` stays). ``name_of`` reads it back."""
    return "".join(c if c in _SAFE and not (i == 0 and c == ".")
                   else "".join(f"%{b:02X}" for b in c.encode()) for i, c in enumerate(name))


def name_of(file: str) -> str:
    """The name ``file_name`` made ``file`` from."""
    return urllib.parse.unquote(file, errors="strict")


def run_path(out: Path, arm: str, load_label: str, seed: int) -> Path:
    return out / RUNS_DIR / file_name(arm) / f"{load_label}-s{seed}.json"


@dataclass(frozen=True)
class Checked:
    """What a run's file holds: the run when it is complete, else why not."""

    path: Path
    run: RunFile | None  # the complete run, else None
    problem: str  # "" when complete; "missing" when there is no file
    #: a whole run file made for another run or other settings: never overwritten
    foreign: bool = False

    @property
    def complete(self) -> bool:
        return not self.problem

    @property
    def present(self) -> bool:
        return self.problem != "missing"


class ResultsFolder:
    """``exp.out_dir`` seen through ``exp``'s arms and cells."""

    def __init__(self, exp: Experiment, stream: TextIO | None = None) -> None:
        self.exp = exp
        self.out = Path(exp.out_dir)
        self.stream = stream if stream is not None else sys.stderr

    def run_path(self, arm: str, load: float, seed: int) -> Path:
        return run_path(self.out, arm, self.exp.workload.load_label(load), seed)

    def failed_path(self, arm: str, load: float, seed: int) -> Path:
        return (self.out / FAILED_DIR / file_name(arm)
                / f"{self.exp.workload.load_label(load)}-s{seed}.json")

    # -- which runs are done -------------------------------------------------------------
    def check(self, arm: str, load: float, seed: int) -> Checked:
        """Whether the run's file is a complete run of (arm, load, seed) (the module's
        invariants)."""
        p = self.run_path(arm, load, seed)
        if not os.path.lexists(p):
            old = self._legacy_path(arm, load, seed)
            if old != p and os.path.lexists(old):
                c = self._check(old, arm, load, seed)
                if c.complete:
                    return c
            return Checked(p, None, "missing")
        return self._check(p, arm, load, seed)

    def _legacy_path(self, arm: str, load: float, seed: int) -> Path:
        """Where folders written before the injective names kept the run (arm names with
        ``_`` for other characters, loads as ``%g``): read when it holds this very run."""
        slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in arm)
        label = "trace" if self.exp.workload.kind == "trace" else f"{load:g}"
        return self.out / RUNS_DIR / slug / f"{label}-s{seed}.json"

    def _check(self, p: Path, arm: str, load: float, seed: int) -> Checked:
        try:
            r = read_run(p)
        except PpasError as e:
            return Checked(p, None, str(e).removeprefix(f"{p}: "))
        if (r.arm, r.load, r.seed) != (arm, load, seed):
            return Checked(p, None, f"holds the run of arm {r.arm!r} at {r.load!r} seed "
                           f"{r.seed}, not this one", foreign=True)
        if r.settings is not None and r.settings != self.exp.settings_hash():
            return Checked(p, None, "made with other settings (its settings hash "
                           f"{r.settings} is not this experiment's "
                           f"{self.exp.settings_hash()})", foreign=True)
        if not r.summary.get("completed"):
            return Checked(p, None, "no request succeeded")
        return Checked(p, r, "")

    def checks(self, arm: str | None = None) -> list[Checked]:
        """Every planned run's check (of ``arm``, or of every arm), in (arm order, load,
        seed) order."""
        return [self.check(a.name, load, seed) for a in self.exp.arms
                if arm in (None, a.name) for load, seed in self.exp.cells()]

    def completed(self) -> set[RunKey]:
        return {(arm.name, load, seed) for arm in self.exp.arms
                for load, seed in self.exp.cells() if self.check(arm.name, load, seed).complete}

    def runs(self, arm: str | None = None) -> list[RunFile]:
        """The complete runs (of ``arm``, or of every arm), in (arm order, load, seed)
        order."""
        return [c.run for c in self.checks(arm) if c.run is not None]

    def ignored(self) -> list[Checked]:
        """The planned runs' files that are there but not complete runs."""
        return [c for c in self.checks() if c.present and not c.complete]

    def run_files(self) -> list[Path]:
        """Every file under ``runs/``, planned or not."""
        d = self.out / RUNS_DIR
        return sorted(p for p in d.rglob("*") if not p.is_dir()) if d.is_dir() else []

    def arm_dir(self, arm: str) -> Path:
        return self.out / RUNS_DIR / file_name(arm)

    def step_log(self, arm: str) -> Path:
        return (self.out / STEPS_DIR / f"{file_name(arm)}.jsonl").resolve()

    def server_log(self, arm: str) -> Path:
        return self.out / LOGS_DIR / f"{file_name(arm)}.log"

    def pid_file(self, arm: str) -> Path:
        return self.out / LOGS_DIR / f"{file_name(arm)}.pid"

    # -- the folder's state --------------------------------------------------------------
    def check_path(self) -> None:
        """``out_dir`` is a folder or absent."""
        if os.path.lexists(self.out) and not self.out.is_dir():
            raise PpasError(f"out_dir {str(self.out)!r} exists and is not a folder; set "
                            "another out_dir (--out-dir)")

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the folder's lock: a second experiment into it is refused in one line."""
        self.check_path()
        self.out.mkdir(parents=True, exist_ok=True)
        f = open(self.out / LOCK_FILE, "a+")  # noqa: SIM115 (held while inside)
        try:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                who = f.read().strip() or "another process"
                raise PpasError(f"{self.out} is in use by another ppas experiment ({who}); "
                                "wait for it to finish or set another out_dir "
                                "(--out-dir)") from None
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()}\n")
            f.flush()
            yield
        finally:
            f.close()  # releases the lock

    def prepare(self, resume: bool) -> None:
        """Check the folder against ``resume`` and record the experiment in it (call it
        inside ``locked``)."""
        self.check_path()
        files = self.run_files()
        if files and not resume:
            raise PpasError(f"{self.out} already holds {len(files)} run files of an "
                            "experiment; pass --resume to finish it, or set another out_dir "
                            "(--out-dir)")
        if resume:
            self.check_same("--resume", rebuild=True)
            foreign = [c for c in self.checks() if c.foreign]
            if foreign:
                raise PpasError(f"--resume: {foreign[0].path} {foreign[0].problem}"
                                + (f" (and {len(foreign) - 1} more)" if len(foreign) > 1
                                   else "") + "; move them away or set another out_dir")
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

    def _state(self) -> dict[str, Any] | None:
        """``experiment.json``'s fingerprint; None when it is missing or unreadable."""
        try:
            old = json.loads((self.out / STATE_FILE).read_text()).get("fingerprint")
        except (OSError, ValueError, AttributeError):
            return None
        return old if isinstance(old, dict) else None

    def check_same(self, what: str, rebuild: bool = False) -> None:
        """Refuse a folder whose runs were made with other settings. ``rebuild``: a missing
        or unreadable ``experiment.json`` is accepted only when every run file records
        these settings (``prepare`` then writes it again)."""
        state = self.out / STATE_FILE
        old = self._state()
        new = self.exp.fingerprint()
        if old is not None:
            if old != new:
                diff = [k for k in old if old.get(k) != new.get(k)]
                raise PpasError(f"{what}: the experiment's {', '.join(diff) or 'settings'} "
                                f"changed since the runs in {self.out} were made; restore "
                                "the file or use another out_dir")
            return
        files = self.run_files()
        if not rebuild or not files:
            return
        mine = self.exp.settings_hash()
        other = []
        for p in files:
            try:
                r = read_run(p)
            except PpasError:
                continue  # not a run: re-run where planned, never counted
            if r.settings != mine:
                other.append(p)
        how = "unreadable" if os.path.lexists(state) else "missing"
        if other:
            raise PpasError(f"{what}: {state} is {how} and {len(other)} run file(s) (e.g. "
                            f"{other[0]}) do not record this experiment's settings; restore "
                            f"{STATE_FILE} or set another out_dir")
        print(f"{what}: {STATE_FILE} was {how}; every run file records this experiment's "
              "settings, so it is written again", file=self.stream, flush=True)
