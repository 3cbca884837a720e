"""Running an experiment: one server per arm, every (load, seed) replayed on it.

The parts, each with its invariants: the results folder and what is done
(``ppas.experiment.folder``), one run's file (``runfile``), an arm's server and the retry
rule (``servers``), one replay (``measure``), stopping (``stopping``), arms in parallel
(``devices``), the progress bar (``progress``). This module puts them in order:

* a run is written, atomically, only once it is complete, so ``--resume`` skips exactly the
  runs whose file is a complete run (``ResultsFolder.check``) and a kill at any moment
  loses at most the run in flight; a run in which no request succeeded is failed: kept
  under ``failed/``, never counted, and the experiment stops (exit 1) for ``--resume``;
* SIGINT/SIGTERM: the run in flight is abandoned, servers are stopped, completed runs stay;
* SIGKILL: the servers die with the process (Linux, ``ppas.live.server.spawn_group``); each
  running server is recorded in ``logs/ARM.pid``, and the next run into the folder first
  stops any server a dead run left there (``ResultsFolder.prepare``);
* ``fitted:auto`` arms start only after every calibration arm's runs are done; the model is
  fitted from those runs' step slices (``cost-auto.json``), so a resume refits the same one.
"""

from __future__ import annotations

import sys
import time
from functools import partial
from pathlib import Path
from typing import TextIO

from ppas.calibrate.fit import fit_and_save
from ppas.core.decision import Knob
from ppas.core.errors import PpasError
from ppas.core.steplog import Step
from ppas.cost import make_cost_model
from ppas.experiment.devices import run_on_devices
from ppas.experiment.folder import AUTO_COST, ResultsFolder
from ppas.experiment.measure import Measurement, measure, prompt_seed
from ppas.experiment.plan import Estimate
from ppas.experiment.probe import resolved, run_probe, with_probe, write_probe
from ppas.experiment.progress import Progress
from ppas.experiment.runfile import Attempt, RunFile, write_run
from ppas.experiment.servers import ArmServer, Launch, Launcher, vllm_launcher
from ppas.experiment.spec import FITTED_AUTO, ArmSpec, Experiment
from ppas.experiment.stopping import Interrupted, StopFlag
from ppas.live.versions import installed_vllm_version
from ppas.policies import make_policy

__all__ = ["Interrupted", "Runner"]


class Runner:
    """Executes an ``Experiment`` into its folder (see the module docstring)."""

    def __init__(self, exp: Experiment, launcher: Launcher | None = None,
                 stream: TextIO | None = None) -> None:
        self.exp = exp
        self.folder = ResultsFolder(exp, stream)
        self.launcher = launcher or vllm_launcher  # looked up here: tests replace it
        self.stream = stream if stream is not None else sys.stderr
        self.stop = StopFlag()
        self.progress: Progress | None = None

    # -- the whole experiment ----------------------------------------------------------------
    def run(self, est: Estimate) -> None:
        """Run every pending arm; raises ``Interrupted`` on SIGINT/SIGTERM."""
        devices = self.exp.run.devices
        self.exp = resolved(self.exp)  # a resume replays the traces of the folder's probe
        done = self.folder.completed()
        self.progress = Progress(self.exp.num_runs() - len(done),
                                 est.remaining_s(self.exp, done), self.stream)
        with self.stop.signals(raise_outside_runs=not devices):
            if not devices:
                for order, cells in self.exp.rounds():
                    for arm in order:
                        self.run_arm(arm, None, est, cells)
            else:
                run_on_devices(self.exp.arm_order(), devices,
                               lambda arm, dev: self.run_arm(arm, dev, est), self.stop)
        if self.stop.is_set():
            raise Interrupted

    def run_arm(self, arm: ArmSpec, device: str | None, est: Estimate,
                cells: list[tuple[float, int]] | None = None) -> None:
        """The arm's pending runs of ``cells`` (default: every cell) on one server start
        (restarted if it dies)."""
        done = self.folder.completed()
        pending = [(load, seed) for load, seed in (cells or self.exp.cells())
                   if (arm.name, load, seed) not in done]
        if not pending or self.stop.is_set():
            return
        launch = self.launch_for(arm, device)
        vllm_version = installed_vllm_version()  # what the server runs (sys.executable's)
        srv = ArmServer(self.launcher, launch)
        where = f" on device {device}" if device is not None else ""
        print(f"{arm.name}: starting the server{where} (MBT {launch.max_num_batched_tokens}, "
              f"{len(pending)} runs)...", file=self.stream, flush=True)
        try:
            up = srv.start()
            self._tick(est.startup_s, up, False, f"{arm.name}: server up in {up:.0f} s")
            self.probe(srv)
            for load, seed in pending:
                if self.stop.is_set():
                    raise Interrupted
                m, attempts = srv.run_with_retry(partial(self.measure, srv, load, seed),
                                                 self.stream)
                if m is None:
                    w = self.exp.workload
                    raise PpasError(f"arm {arm.name}: the server died twice at {w.load_name} "
                                    f"{w.load_label(load)} seed {seed}; see {launch.log_path}")
                run = self.run_file(launch, load, seed, m, attempts, vllm_version)
                if not m.summary.get("completed"):
                    self.failed(run, launch)
                write_run(self.folder.run_path(arm.name, load, seed), run)
                self._tick(est.runs.get((arm.name, load, seed), m.wall_s), m.wall_s, True,
                           self._run_line(run))
        finally:
            srv.stop()

    def probe(self, srv: ArmServer) -> None:
        """``capacity_loads``: measure the capacity on this server before its first run,
        once per folder (``ppas.experiment.probe``)."""
        w = self.exp.workload
        if w.probe is None or w.capacity_tok_s is not None:
            return
        res = run_probe(self.exp, srv)
        write_probe(self.exp, res)
        self.exp = with_probe(self.exp, res)
        scales = ", ".join(f"{w.load_label(load)} x{self.exp.workload.time_scale_at(load, s):.3g}"
                           for load in w.loads for s in w.seeds)
        print(f"{res.describe()}; arrival-time scale per load and seed: {scales}",
              file=self.stream, flush=True)

    def failed(self, run: RunFile, launch: Launch) -> None:
        """A run in which no request succeeded: kept under ``failed/`` (never counted, so
        ``--resume`` runs it again) and the experiment stops."""
        path = self.folder.failed_path(run.arm, run.load, run.seed)
        write_run(path, run)
        w, s = self.exp.workload, run.summary
        why = ", ".join(f"{k} x{v}" for k, v in (s.get("failure_reasons") or {}).items())
        raise PpasError(f"arm {run.arm}: no request succeeded at {w.load_name} "
                        f"{run.load_label} seed {run.seed} ({s.get('failed')} failed"
                        + (f": {why}" if why else "") + f"); the run is kept in {path} and "
                        f"not counted; see {launch.log_path}")

    def measure(self, srv: ArmServer, load: float, seed: int) -> Measurement:
        """One replay (``ppas.experiment.measure``); the tests wrap it."""
        return measure(self.exp, srv, load, seed, self.stop)

    # -- what a server runs ------------------------------------------------------------------
    def launch_for(self, arm: ArmSpec, device: str | None) -> Launch:
        e = self.exp.engine
        cost = arm.cost_model
        if arm.auto_fitted:
            cost = f"fitted:{self.auto_cost_model().resolve()}"
        mbt = arm.max_num_batched_tokens
        if mbt is None:
            assert arm.policy is not None
            pol = make_policy(arm.policy)
            pol.bind_cost_model(make_cost_model(cost) if cost else None)
            mbt = pol.max_num_batched_tokens
            if e.max_num_seqs > mbt:
                raise PpasError(f"arm {arm.name}: its policy's max_num_batched_tokens {mbt} "
                                f"< engine.max_num_seqs {e.max_num_seqs}; set the arm's "
                                "max_num_batched_tokens or lower engine.max_num_seqs")
        extra = [*e.args(), *arm.stock_flags()]
        seqs = arm.stock_dict().get(Knob.MAX_NUM_SEQS, e.max_num_seqs)
        env = dict(e.env)
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
        f = self.folder
        return Launch(arm, self.exp.model.path, mbt, seqs, arm.policy, cost,
                      f.step_log(arm.name) if arm.plugin else None, f.server_log(arm.name),
                      f.pid_file(arm.name), tuple(extra), env, e.startup_timeout_s)

    def auto_cost_model(self) -> Path:
        """Fit ``cost-auto.json`` from the calibration arms' run files (deterministic)."""
        steps = [s for a in self.exp.arms if a.calibrates
                 for r in self.folder.runs(a.name) for s in r.steps]
        if not steps:
            raise PpasError(f"{FITTED_AUTO}: the calibration arms' runs recorded no steps; "
                            "cannot fit a cost model")
        path = self.folder.out / AUTO_COST
        fit_and_save(map(Step.of, steps), path, sources=[
            str(self.folder.arm_dir(a.name)) for a in self.exp.arms if a.calibrates])
        return path

    # -- records -----------------------------------------------------------------------------
    def run_file(self, launch: Launch, load: float, seed: int, m: Measurement,
                 attempts: tuple[Attempt, ...], vllm_version: str | None) -> RunFile:
        arm, w = launch.arm, self.exp.workload
        return RunFile(
            arm=arm.name, load=load, load_label=w.load_label(load), seed=seed,
            prompt_seed=prompt_seed(self.exp, load, seed),
            trace=w.trace(load, seed).description, policy=arm.policy, stock=arm.stock_dict(),
            vllm_version=vllm_version, cost_model=launch.cost_model,
            max_num_batched_tokens=launch.max_num_batched_tokens, attempts=attempts,
            wall_s=m.wall_s, finished_at=time.time(), summary=m.summary,
            per_request=m.result.per_request(), steps=tuple(m.steps),
            settings=self.exp.settings_hash())

    def _run_line(self, run: RunFile) -> str:
        w, e2e = self.exp.workload, run.summary["avg_latency"]
        return (f"{run.arm} {w.load_name} {run.load_label} seed {run.seed}: "
                f"{run.summary['completed']}/{len(w.trace(run.load, run.seed))} ok, mean E2E "
                + ("n/a" if e2e is None else f"{e2e:.3f} s")
                + (" (retried after a server death)" if run.retried else ""))

    def _tick(self, est_s: float, wall_s: float, run_done: bool, line: str) -> None:
        if self.progress is not None:
            self.progress.item(est_s, wall_s, run_done, line)
