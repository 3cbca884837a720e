"""Running an experiment: one server per arm, every (load, seed) replayed on it.

Invariants:

* the arrivals of a (load, seed) are the same for every arm; the prompts' random prefixes
  are seeded per (load, seed) (``prompt_seed``), so no two runs on one server share a
  prefix (no prefix-cache hits) while every arm sees the same prompts;
* a run is written, atomically, only once it is complete (``runs/ARM/LOAD-sSEED.json``:
  summary, per-request arrays, the server's step-log slice for the run, the attempts); a
  run file present means that run is done, so ``--resume`` skips exactly those and a kill
  at any moment loses at most the run in flight;
* a server found dead after a run (``/health`` does not answer) is restarted and the run
  retried once; both attempts are recorded in the run file;
* SIGINT/SIGTERM: the run in flight is abandoned, servers are stopped, completed runs stay;
* SIGKILL: the servers die with the process (Linux, ``ppas.live.server.spawn_group``); each
  running server is recorded in ``logs/ARM.pid``, and the next run into the folder first
  stops any server a dead run left there (``prepare``), so none holds the device or port;
* ``fitted:auto`` arms start only after every calibration arm's runs are done; the model is
  fitted from those runs' step slices (``cost-auto.json``), so a resume refits the same one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TextIO

from ppas.core.decision import Knob
from ppas.core.errors import PpasError
from ppas.core.steplog import HEADER_KEY
from ppas.experiment.spec import FITTED_AUTO, ArmSpec, Experiment

RUNS_DIR = "runs"
STEPS_DIR = "steps"
LOGS_DIR = "logs"
AUTO_COST = "cost-auto.json"
STATE_FILE = "experiment.json"


class Interrupted(BaseException):
    """SIGINT/SIGTERM: stop now, keep what is complete."""


def slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def run_path(out: Path, arm: str, load_label: str, seed: int) -> Path:
    return out / RUNS_DIR / slug(arm) / f"{load_label}-s{seed}.json"


# ---------------------------------------------------------------- servers


class Server(Protocol):
    base_url: str

    def __enter__(self) -> Server: ...

    def __exit__(self, *exc: object) -> None: ...


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


Launcher = Callable[[Launch], AbstractContextManager[Any]]


def vllm_launcher(launch: Launch) -> AbstractContextManager[Any]:
    """``vllm serve`` through ``ppas.live.server.VllmServer`` (plugin or stock)."""
    from ppas.live.server import VllmServer

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


# ---------------------------------------------------------------- progress


@dataclass
class Progress:
    """A text progress bar whose ETA is the simulator's estimate of the work left, scaled
    by how the finished work compared with its own estimate."""

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


# ---------------------------------------------------------------- one run


@dataclass
class _ArmServer:
    """The arm's live server, restartable."""

    launcher: Launcher
    launch: Launch
    ctx: AbstractContextManager[Any] | None = None
    base_url: str = ""
    starts: int = 0
    fresh: bool = True  # no run yet on this start: the next run warms it up

    def start(self) -> float:
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


def _read_steps(path: Path | None, offset: int, t_start: float) -> list[dict[str, Any]]:
    """Step-log lines appended after ``offset`` and launched after ``t_start`` (the
    measured run's start on the monotonic clock shared with the engine process)."""
    if path is None or not path.exists():
        return []
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    out = []
    for line in data.decode(errors="replace").splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a concurrent flush belongs to no run
        if isinstance(obj, dict) and HEADER_KEY not in obj and (  # a server run's header
                float(obj.get("time", t_start)) >= t_start):
            out.append(obj)
    return out


class Runner:
    """Executes an ``Experiment`` into its folder (see the module docstring)."""

    def __init__(self, exp: Experiment, launcher: Launcher | None = None,
                 stream: TextIO = sys.stderr) -> None:
        self.exp = exp
        self.out = Path(exp.out_dir)
        self.launcher = launcher or vllm_launcher
        self.stream = stream
        self.stop = threading.Event()
        self._measuring = 0
        self._cond = threading.Condition()
        self.errors: list[BaseException] = []
        self.progress: Progress | None = None

    # -- bookkeeping ------------------------------------------------------------------------
    def completed(self) -> set[tuple[str, float, int]]:
        done = set()
        w = self.exp.workload
        for arm in self.exp.arms:
            for load, seed in self.exp.cells():
                if run_path(self.out, arm.name, w.load_label(load), seed).is_file():
                    done.add((arm.name, load, seed))
        return done

    def prepare(self, resume: bool) -> None:
        """Check the folder against ``resume`` and record the experiment in it."""
        from ppas.live.bench import write_json_atomic

        if self.out.exists() and not self.out.is_dir():
            raise PpasError(f"out_dir {str(self.out)!r} exists and is not a folder")
        state = self.out / STATE_FILE
        n = len(self.completed())
        if n and not resume:
            raise PpasError(f"{self.out} already holds {n} completed runs of an experiment; "
                            "pass --resume to finish it, or set another out_dir (--out-dir)")
        if resume:
            self.check_same("--resume")
        self.reap_stale_servers()
        self.out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(state, {"name": self.exp.name, "fingerprint": self.exp.fingerprint(),
                                  "source": self.exp.source})

    def reap_stale_servers(self) -> None:
        """Stop the servers a killed earlier run of this folder left running."""
        from ppas.live.server import reap_stale

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

    # -- cost model for fitted:auto -----------------------------------------------------------
    def calibration_steps(self) -> list[dict[str, Any]]:
        steps: list[dict[str, Any]] = []
        for arm in self.exp.arms:
            if arm.calibrates:
                steps += self.arm_steps(arm)
        return steps

    def arm_steps(self, arm: ArmSpec) -> list[dict[str, Any]]:
        steps: list[dict[str, Any]] = []
        for load, seed in self.exp.cells():
            p = run_path(self.out, arm.name, self.exp.workload.load_label(load), seed)
            if p.is_file():
                steps += json.loads(p.read_text()).get("steps", [])
        return steps

    def auto_cost_model(self) -> Path:
        """Fit ``cost-auto.json`` from the calibration arms' run files (deterministic)."""
        from ppas.calibrate.fit import step_record
        from ppas.cost.fitted import fit

        steps = self.calibration_steps()
        if not steps:
            raise PpasError(f"{FITTED_AUTO}: the calibration arms' runs recorded no steps; "
                            "cannot fit a cost model")
        model = fit([step_record(s) for s in steps], sources=[
            str(self.out / RUNS_DIR / slug(a.name)) for a in self.exp.arms if a.calibrates])
        path = self.out / AUTO_COST
        model.to_file(path)
        return path

    def launch_for(self, arm: ArmSpec, device: str | None) -> Launch:
        from ppas.policies import make_policy

        e = self.exp.engine
        cost = arm.cost_model
        if arm.auto_fitted:
            cost = f"fitted:{self.auto_cost_model().resolve()}"
        mbt = arm.max_num_batched_tokens
        if mbt is None:
            from ppas.cost import make_cost_model

            assert arm.policy is not None
            pol = make_policy(arm.policy)
            pol.bind_cost_model(make_cost_model(cost) if cost else None)
            mbt = pol.max_num_batched_tokens
            if e.max_num_seqs > mbt:
                raise PpasError(f"arm {arm.name}: its policy's max_num_batched_tokens {mbt} "
                                f"< engine.max_num_seqs {e.max_num_seqs}; set the arm's "
                                "max_num_batched_tokens or lower engine.max_num_seqs")
        stock = arm.stock_dict()
        extra = list(e.args())
        for k, v in stock.items():
            if k != Knob.MAX_NUM_BATCHED_TOKENS:
                extra += [Knob(k).flag, str(v)]
        env = dict(e.env)
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
        s = slug(arm.name)
        return Launch(arm, self.exp.model.path, mbt, e.max_num_seqs, arm.policy, cost,
                      (self.out / STEPS_DIR / f"{s}.jsonl").resolve() if arm.plugin else None,
                      self.out / LOGS_DIR / f"{s}.log", self.out / LOGS_DIR / f"{s}.pid",
                      tuple(extra), env,
                      e.startup_timeout_s)

    # -- measuring -----------------------------------------------------------------------------
    def _measure(self, srv: _ArmServer, load: float, seed: int) -> tuple[Any, list[Any], float]:
        """One replay of the (load, seed) trace; returns (BenchResult, steps, wall s). The
        warm-up requests go before the first run on each server start."""
        from ppas.live.bench import run_trace

        w = self.exp.workload
        trace = w.trace(load, seed)
        step_log = srv.launch.step_log
        offset = step_log.stat().st_size if step_log is not None and step_log.exists() else 0
        t_start = [time.monotonic()]

        def started() -> None:
            t_start[0] = time.monotonic()

        async def go() -> Any:
            task = asyncio.ensure_future(run_trace(
                srv.base_url, self.exp.model.path, trace, prompt_seed=self.prompt_seed(load, seed),
                vocab_size=self.exp.model.vocab_size,
                filler_id=min(1000, self.exp.model.vocab_size - 1),
                request_timeout_s=w.request_timeout_s,
                num_warmups=w.warmup_requests if srv.fresh else 0, on_start=started))
            while not task.done():
                await asyncio.wait({task}, timeout=0.2)
                if self.stop.is_set() and not task.done():
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
                    raise Interrupted
            return task.result()

        t0 = time.monotonic()
        self._measuring += 1
        try:
            result = asyncio.run(go())
        finally:
            self._measuring -= 1
        srv.fresh = False
        wall = time.monotonic() - t0
        time.sleep(0.3)  # the engine flushes its step log when it goes idle
        return result, _read_steps(step_log, offset, t_start[0]), wall

    def prompt_seed(self, load: float, seed: int) -> int:
        return 1000 * seed + self.exp.workload.loads.index(load) + 1

    def run_arm(self, arm: ArmSpec, device: str | None, estimates: dict[str, Any]) -> None:
        from ppas.live.bench import write_json_atomic

        w = self.exp.workload
        done = self.completed()
        pending = [(load, seed) for load, seed in self.exp.cells()
                   if (arm.name, load, seed) not in done]
        if not pending or self.stop.is_set():
            return
        from ppas.live.versions import installed_vllm_version

        launch = self.launch_for(arm, device)
        vllm_version = installed_vllm_version()  # what the server runs (sys.executable's)
        srv = _ArmServer(self.launcher, launch)
        prog = self.progress
        where = f" on device {device}" if device is not None else ""
        print(f"{arm.name}: starting the server{where} (MBT {launch.max_num_batched_tokens}, "
              f"{len(pending)} runs)...", file=self.stream, flush=True)
        try:
            up = srv.start()
            if prog is not None:
                prog.item(estimates["startup"], up, False, f"{arm.name}: server up in {up:.0f} s")
            for load, seed in pending:
                if self.stop.is_set():
                    raise Interrupted
                attempts: list[dict[str, Any]] = []
                while True:
                    died = ""
                    try:
                        result, steps, wall = self._measure(srv, load, seed)
                    except PpasError as e:  # server down before the run (or warm-up failed)
                        if healthy(srv.base_url):
                            raise
                        result, steps, wall, died = None, [], 0.0, str(e).splitlines()[0]
                    if not died and not healthy(srv.base_url):
                        died = "the server stopped answering /health during the run"
                    attempts.append({"attempt": len(attempts) + 1, "server_died": bool(died),
                                     "reason": died,
                                     "failed": None if result is None
                                     else result.summary()["failed"]})
                    if not died:
                        break
                    print(f"{arm.name}: server died ({died}); restarting it", file=self.stream,
                          flush=True)
                    srv.stop()
                    srv.start()
                    if len(attempts) >= 2:
                        break
                if result is None:
                    raise PpasError(f"arm {arm.name}: the server died twice at {w.load_name} "
                                    f"{w.load_label(load)} seed {seed}; see {launch.log_path}")
                trace = w.trace(load, seed)
                summary = result.summary()
                rec = {"arm": arm.name, "load": load, "load_label": w.load_label(load),
                       "seed": seed, "prompt_seed": self.prompt_seed(load, seed),
                       "trace": trace.description, "policy": arm.policy,
                       "stock": arm.stock_dict(), "vllm_version": vllm_version,
                       "cost_model": launch.cost_model,
                       "max_num_batched_tokens": launch.max_num_batched_tokens,
                       "attempts": attempts, "retried": len(attempts) > 1,
                       "wall_s": wall, "finished_at": time.time(), "summary": summary,
                       "per_request": result.per_request(), "steps": steps}
                write_json_atomic(run_path(self.out, arm.name, w.load_label(load), seed), rec)
                if prog is not None:
                    est = estimates["runs"].get((arm.name, load, seed), wall)
                    e2e = summary["avg_latency"]
                    prog.item(est, wall, True,
                              f"{arm.name} {w.load_name} {w.load_label(load)} seed {seed}: "
                              f"{summary['completed']}/{len(trace)} ok, mean E2E "
                              + ("n/a" if e2e is None else f"{e2e:.3f} s")
                              + (" (retried after a server death)" if len(attempts) > 1 else ""))
        finally:
            srv.stop()

    # -- the whole experiment ----------------------------------------------------------------
    @contextlib.contextmanager
    def _signals(self, raise_outside_runs: bool) -> Iterator[None]:
        def handler(signum: int, frame: FrameType | None) -> None:
            self.stop.set()
            with self._cond:
                self._cond.notify_all()
            if raise_outside_runs and not self._measuring:
                raise Interrupted

        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def run(self, estimates: dict[str, Any]) -> None:
        """Run every pending arm; raises ``Interrupted`` on SIGINT/SIGTERM."""
        order = self.exp.arm_order()
        devices = self.exp.run.devices
        done = self.completed()
        pending_runs = self.exp.num_runs() - len(done)
        rem = sum(v for k, v in estimates["runs"].items() if k not in done)
        rem += estimates["startup"] * sum(
            1 for a in order if any((a.name, c[0], c[1]) not in done for c in self.exp.cells()))
        self.progress = Progress(pending_runs, rem, self.stream)
        with self._signals(raise_outside_runs=not devices):
            if not devices:
                for arm in order:
                    self.run_arm(arm, None, estimates)
            else:
                self._run_parallel(order, devices, estimates)
        if self.stop.is_set():
            raise Interrupted

    def _run_parallel(self, order: tuple[ArmSpec, ...], devices: tuple[str, ...],
                      estimates: dict[str, Any]) -> None:
        """One worker per device; a fitted:auto arm waits until every calibration arm is
        finished (or failed: then it fails too)."""
        queue = list(order)
        running_cal = {a.name for a in order if a.calibrates}

        def next_arm() -> ArmSpec | None:
            with self._cond:
                while True:
                    if self.stop.is_set() or self.errors or not queue:
                        return None
                    for a in queue:
                        if not a.auto_fitted or not running_cal:
                            queue.remove(a)
                            return a
                    self._cond.wait(0.5)

        def worker(dev: str) -> None:
            while (arm := next_arm()) is not None:
                try:
                    self.run_arm(arm, dev, estimates)
                except BaseException as e:  # noqa: BLE001 (reported by the main thread)
                    if not isinstance(e, Interrupted):
                        self.errors.append(e)
                    self.stop.set()
                finally:
                    with self._cond:
                        running_cal.discard(arm.name)
                        self._cond.notify_all()

        threads = [threading.Thread(target=worker, args=(d,), daemon=True) for d in devices]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
        if self.errors:
            raise self.errors[0]
