"""Whether a process is still running, for cleaning up after a killed ``ppas`` command.

Invariants: a process counts as alive while it exists and is not a zombie (an exited child
nobody has reaped is dead). ``start_time`` is the kernel's start tick of the process (Linux
``/proc/PID/stat`` field 22); (pid, start_time) names one process for good, even after
its pid is reused. Off Linux ``start_time`` is ``None`` and ``alive`` falls back to
``kill(pid, 0)`` (a zombie or a reused pid then counts as alive: callers only ever leave
alone what they cannot prove dead).
"""

from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` from field 3 (state) on, or None (no such process, or not Linux)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # the command name (field 2) may hold spaces


def start_time(pid: int) -> int | None:
    """The start tick of live process ``pid``; None if it is gone, a zombie, or off Linux."""
    f = _stat_fields(pid)
    if f is None or f[0] in ("Z", "X"):
        return None
    return int(f[19])  # field 22


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    if pid <= 0:
        return False
    if os.path.isdir("/proc/self"):
        return start_time(pid) is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["alive", "start_time"]
