"""Output files, the one place that writes them.

Invariants, for every file a ``ppas`` command writes (JSON, text, plots, step-log fits):

* the path is checked before any work starts (``check_output_file``/``check_output_dir``):
  a new path or an existing regular file (never a folder, a symlink, a device or a FIFO,
  which a rename would replace), not under a file, in a folder we can create files in, and
  never one of the command's inputs; a bad path is a one-line ``PpasError``;
* files and folders get the modes a plain ``open``/``mkdir`` would give (0666/0777 less the
  umask): a temporary file stays private (0600) until it is complete, then takes its mode;
* it is written atomically (``write_atomic``/``atomic_output``): a temporary file in the same
  folder, flushed and fsynced, renamed over the target. Readers see the old file or the whole
  new one; a failure (or Ctrl-C) removes the temporary file, so nothing half-written stays;
* a folder of several files (``write_folder``) is staged completely before any file of it
  is published, so a failure leaves the folder as it was (or absent). The staging folder
  ``.NAME.stage-PID-XXXX`` names the process writing it: one left by a killed writer
  (SIGKILL skips every cleanup) is removed by the next ``write_folder`` into the same place
  once that process is dead; a live writer's is never touched.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ppas.core.errors import PpasError
from ppas.core.processes import alive

StrPath = str | os.PathLike[str]


def _umask() -> int:
    """The process's umask: from /proc on Linux (no window in which another thread's new
    file would get a different one), else by setting it and setting it back."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a new file gets from ``open``: 0666 less the umask."""
    return 0o666 & ~_umask()


def folder_mode() -> int:
    """The mode a new folder gets from ``mkdir``: 0777 less the umask."""
    return 0o777 & ~_umask()


def _nearest_existing(p: Path) -> Path:
    a = p
    while not os.path.lexists(a) and a != a.parent:
        a = a.parent
    return a


def _check_writable_dir(d: Path, what: str, target: Path) -> None:
    """``d`` (the folder ``target`` goes in, maybe not created yet) can take new files."""
    base = _nearest_existing(d)
    if not base.is_dir():
        raise PpasError(f"{what} {str(target)!r}: {str(base)!r} is a file, not a folder")
    try:  # a real probe: os.access() says yes to root on folders it cannot write
        fd, probe = tempfile.mkstemp(dir=base, prefix=".ppas-probe-")
    except OSError as e:
        raise PpasError(f"{what} {str(target)!r}: cannot create files in {str(base)!r} "
                        f"({e.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and a.samefile(b))
    except OSError:
        return False


def check_output_file(path: StrPath, what: str, inputs: Iterable[StrPath] = ()) -> Path:
    """Validate a file destination before work starts; returns it as a Path."""
    p = Path(path)
    if p.is_dir():
        raise PpasError(f"{what} {str(p)!r} is a folder; give a file name")
    if os.path.lexists(p) and not stat.S_ISREG(os.lstat(p).st_mode):
        kind = "a symlink" if p.is_symlink() else "not a regular file"
        raise PpasError(f"{what} {str(p)!r} is {kind}; give a new path or a regular file "
                        "(writing would replace it)")
    for i in inputs:
        if _same_file(p, Path(i)):
            raise PpasError(f"{what} {str(p)!r} is also an input; refusing to overwrite it "
                            "(give another file name)")
    _check_writable_dir(p.parent, what, p)
    return p


def check_output_dir(path: StrPath, what: str, inputs: Iterable[StrPath] = ()) -> Path:
    """Validate a destination folder (existing or to be created) before work starts."""
    p = Path(path)
    if os.path.lexists(p) and not p.is_dir():
        raise PpasError(f"{what} {str(p)!r} exists and is not a folder")
    for i in inputs:
        ip = Path(i)
        if _same_file(p, ip):
            raise PpasError(f"{what} {str(p)!r} is also an input; give another folder")
    _check_writable_dir(p, what, p)
    return p


@contextmanager
def atomic_output(path: StrPath) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is fsynced and renamed over
    ``path``, on any failure removed. For writers that want a file name (matplotlib)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, file_mode())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: StrPath, data: str | bytes) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` atomically; returns the path."""
    raw = data.encode() if isinstance(data, str) else data
    with atomic_output(path) as tmp:
        tmp.write_bytes(raw)
    return Path(path)


def finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float replaced by None, in nested dicts, lists and
    tuples: JSON has no NaN, so a metric with no value (a run that completed no request)
    is written as ``null`` and the file stays valid JSON for any reader."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def json_text(obj: Any, allow_nan: bool = False) -> str:
    return json.dumps(obj, indent=1, allow_nan=allow_nan) + "\n"


def write_json_atomic(path: StrPath, obj: Any, allow_nan: bool = False) -> Path:
    """``obj`` as indented JSON, atomically (no NaN unless ``allow_nan``)."""
    return write_atomic(path, json_text(obj, allow_nan))


def write_new_file(folder: StrPath, stem: str, suffix: str, data: str | bytes) -> Path:
    """Publish ``data`` under a name no other writer holds: ``stem + suffix``, else
    ``stem-2 + suffix``, ... The whole file is written first and then hard-linked into
    place, which fails instead of overwriting when another process took the name."""
    d = Path(folder)
    raw = data.encode() if isinstance(data, str) else data
    d.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=d, prefix=f".{stem}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, file_mode())
        for k in range(1, 10_000):
            target = d / (f"{stem}{suffix}" if k == 1 else f"{stem}-{k}{suffix}")
            try:
                os.link(tmp, target)
                return target
            except FileExistsError:
                continue
        raise PpasError(f"no free file name for {stem}{suffix} in {str(d)!r}")
    finally:
        tmp.unlink(missing_ok=True)


#: ``write_folder``'s staging folders: ``.NAME.stage-PID-XXXX`` (XXXX from mkdtemp, no "-").
_STAGE = re.compile(r"\..+\.stage-(\d+)-[^-]+")


def remove_stale_stages(folder: StrPath) -> list[Path]:
    """Remove the staging folders in ``folder`` whose writing process is dead; returns them.
    A live process's (or a reused pid's: it counts as alive) is left alone."""
    d = Path(folder)
    if not d.is_dir():
        return []
    gone = []
    for p in sorted(d.iterdir()):
        m = _STAGE.fullmatch(p.name)
        if m and p.is_dir() and not p.is_symlink() and not alive(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p)
    return gone


def write_folder(path: StrPath, files: Mapping[str, Callable[[Path], None]]) -> Path:
    """Write several files into folder ``path``: each ``files[name](tmp_path)`` writes one
    file to the path it is given. All are staged first (in a hidden folder beside or inside
    ``path``); only when every writer succeeded are they renamed into place, each file
    replacing its old version atomically. On failure the staging folder is removed and
    ``path`` is untouched (or still absent)."""
    out = Path(path)
    fresh = not out.exists()
    parent = out.parent if fresh else out
    parent.mkdir(parents=True, exist_ok=True)
    for d in {out.parent, out}:  # a killed first write staged beside, a rewrite inside
        remove_stale_stages(d)
    stage = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.stage-{os.getpid()}-"))
    try:
        for name, write in files.items():
            target = stage / name
            write(target)
            with open(target, "rb+") as f:
                os.fsync(f.fileno())
        if fresh:
            os.chmod(stage, folder_mode())
            os.replace(stage, out)  # the folder appears complete or not at all
        else:
            for name in files:
                os.replace(stage / name, out / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return out


__all__ = ["atomic_output", "check_output_dir", "check_output_file", "file_mode", "finite",
           "folder_mode", "json_text",
           "remove_stale_stages", "write_atomic", "write_folder", "write_json_atomic",
           "write_new_file"]
