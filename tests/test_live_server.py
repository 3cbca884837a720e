"""``ppas.live.server``: stopping a server never leaves its process group running, even when
the stop itself is cut short (offline: a stand-in process, no vLLM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ppas.live.server import VllmServer, spawn_group

#: A "server" that ignores SIGTERM (and writes its pid once it has said so).
DEAF = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\ntime.sleep(600)\n")


class SecondSignal(BaseException):
    """What the experiment's handler raises on a second SIGTERM (``Interrupted``)."""


def _group_gone(pgid: int, proc: subprocess.Popen[bytes], within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader: a zombie still counts as a group member
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups, Linux")
def test_a_stop_cut_short_by_a_second_signal_still_kills_the_group(tmp_path: Path) -> None:
    """Issue 23: a server ignoring SIGTERM outlived ``ppas`` after two SIGTERMs: the second
    one raised inside the graceful wait, before the SIGKILL."""
    (tmp_path / "config.json").write_text("{}")
    srv = VllmServer(tmp_path, policy=None, max_num_batched_tokens=64)
    log = open(tmp_path / "log", "wb")  # noqa: SIM115 (closed by _stop)
    proc = spawn_group([sys.executable, "-c", DEAF], stdout=log, env=os.environ)
    srv._proc, srv._log_file = proc, log
    deadline = time.monotonic() + 30
    while b"ready" not in (tmp_path / "log").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    pgid = os.getpgid(proc.pid)

    def second_sigterm(signum: int, frame: object) -> None:
        raise SecondSignal

    old = signal.signal(signal.SIGALRM, second_sigterm)
    # arrives during the 60 s graceful wait (2 s: _stop reaches it first on a loaded machine)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        with pytest.raises(SecondSignal):
            srv._stop(grace_s=60.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    gone = _group_gone(pgid, proc)
    if not gone:
        os.killpg(pgid, signal.SIGKILL)  # the stand-in must not outlive the test either
        proc.wait()
    assert gone, "the server outlived its stop"
