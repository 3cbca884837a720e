"""The step log (``ppas.core.steplog``): versioned run headers, per-step durability under SIGKILL,
tolerant reading of a truncated last line (issue 11). No vLLM needed: the writer is ours."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ppas.calibrate.fit import read_steps
from ppas.core.errors import PpasError
from ppas.core.steplog import (
    FORMAT_VERSION,
    StepLogHeader,
    StepLogRecord,
    StepLogWriter,
    rank_path,
    read_step_log,
)

HEADER: StepLogHeader = {"ppas_step_log": FORMAT_VERSION, "started": "2026-01-01T00:00:00",
                         "started_unix": 0.0, "pid": 1, "policy": "mbt:2048",
                         "cost_model": None, "server": {"max_num_batched_tokens": 2048},
                         "data_parallel_rank": 0, "data_parallel_size": 1}


def record(step: int) -> StepLogRecord:
    return {"step": step, "time": float(step), "duration_s": 0.01 + step * 1e-4,
            "interval_s": 0.01, "pending_prefills": 1, "running_decodes": step % 3,
            "prefill_budget": 2048, "num_prefill_tokens": 100 + step, "num_decode_tokens": 2,
            "num_prefill_reqs": 1, "num_decode_reqs": 2, "prefill_chunks": [[100 + step, 0]],
            "decode_contexts": [50, 60]}


def test_sigkill_loses_at_most_the_current_step(tmp_path: Path) -> None:
    """Issue 11: 100 steps written, then SIGKILL, left 0 lines (a 256-step buffer)."""
    log = tmp_path / "steps.jsonl"
    code = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_steplog import HEADER, record
        from ppas.core.steplog import StepLogWriter
        w = StepLogWriter({str(log)!r}, HEADER)
        for i in range(1, 101):
            w.write(record(i))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert p.returncode == -signal.SIGKILL, p.stderr
    (run,) = read_step_log(log).runs
    assert run.header == HEADER and [s.record["step"] for s in run.steps] == list(range(1, 101))


def test_runs_appended_to_one_file_are_told_apart(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    for n in (3, 5):
        w = StepLogWriter(str(log), {**HEADER, "pid": n})
        for i in range(1, n + 1):
            w.write(record(i))
        w.close()
    runs = read_step_log(log).runs
    assert [(r.header["pid"] if r.header else None, len(r.steps)) for r in runs] == [(3, 3),
                                                                                      (5, 5)]
    assert len(read_steps(log)) == 8
    assert len(read_steps(log, skip_steps=2)) == 1 + 3  # warm-up skipped per server run


def test_truncated_last_line_is_skipped_with_one_warning(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    w = StepLogWriter(str(log), HEADER)
    for i in range(1, 11):
        w.write(record(i))
    w.close()
    with open(log, "ab") as f:
        f.write(json.dumps(record(11)).encode()[:37])  # what a kill mid-write leaves
    warnings: list[str] = []
    assert len(read_steps(log, warn=warnings.append)) == 10
    assert len(warnings) == 1 and f"{log}:12: skipped a truncated last line" in warnings[0]
    # A bad line that is not the last one (or ends with a newline) is still an error.
    with open(log, "ab") as f:
        f.write(b"\n")
    with pytest.raises(PpasError, match=r"steps.jsonl:12: invalid JSON"):
        read_steps(log)


def test_format_0_logs_still_read_and_unknown_versions_are_named(tmp_path: Path) -> None:
    old = tmp_path / "old.jsonl"
    old.write_text("".join(json.dumps(record(i)) + "\n" for i in range(1, 8)))
    (run,) = read_step_log(old).runs
    assert run.header is None and len(read_steps(old)) == 7
    new = tmp_path / "new.jsonl"
    new.write_text(json.dumps({**HEADER, "ppas_step_log": 99}) + "\n")
    with pytest.raises(PpasError, match="new.jsonl:1: step log format 99 is not supported"):
        read_steps(new)


def test_record_type_is_the_writer_and_reader_contract() -> None:
    """Every key the reader (calibrate) needs is a field of StepLogRecord."""
    from ppas.core.steplog import REQUIRED

    assert set(REQUIRED) <= set(StepLogRecord.__annotations__)
    assert set(record(1)) == set(StepLogRecord.__annotations__)
    assert set(HEADER) == set(StepLogHeader.__annotations__)


def test_reading_from_an_offset_sees_only_the_later_run(tmp_path: Path) -> None:
    """What the experiment runner does: the file's size before a run, then that run's
    steps only; an error still names the line of the whole file."""
    log = tmp_path / "steps.jsonl"
    w = StepLogWriter(str(log), HEADER)
    for i in range(1, 4):
        w.write(record(i))
    w.flush()
    offset = log.stat().st_size
    for i in range(4, 6):
        w.write(record(i))
    w.close()
    got = read_step_log(log, offset)
    assert [s.record["step"] for s in got.steps] == [4, 5]
    assert got.runs[0].header is None  # the header lies before the offset
    assert got.steps[0].time == 4.0 and got.steps[0].prefill_chunks == ((104, 0),)
    with open(log, "ab") as f:
        f.write(b'{"step": 6}\n')
    with pytest.raises(PpasError, match=r"steps.jsonl:7: step lacks duration_s"):
        read_step_log(log, offset)


@pytest.mark.parametrize("change,why", [
    ({"duration_s": -1}, "duration_s must be a finite number >= 0"),
    ({"duration_s": True}, "duration_s must be a finite number >= 0"),
    ({"prefill_chunks": [[0, 0]]}, "prefill_chunks must be a list of"),
    ({"decode_contexts": [1.5]}, "decode_contexts must be a list of integers"),
    # Issue 23: absurd sizes and counts that contradict the lists were accepted.
    ({"prefill_chunks": [[100, 10**30]]}, "prefill_chunks must be a list of"),
    ({"prefill_chunks": [[10**30, 0]]}, "prefill_chunks must be a list of"),
    ({"decode_contexts": [10**30]}, "decode_contexts must be a list of integers in"),
    ({"duration_s": 1e300}, "duration_s must be a finite number >= 0 and <= 1e"),
    ({"num_prefill_tokens": 5}, "num_prefill_tokens is 5 but its lists make 101"),
    ({"num_prefill_reqs": 3}, "num_prefill_reqs is 3 but its lists make 1"),
    ({"num_decode_reqs": 0}, "num_decode_reqs is 0 but its lists make 2"),
])
def test_step_of_names_what_is_wrong(change: dict[str, object], why: str) -> None:
    from ppas.core.steplog import Step

    assert Step.of(dict(record(1))).decode_contexts == (50, 60)
    with pytest.raises(ValueError, match=why):
        Step.of({**record(1), **change})


def test_rank_files_and_headers(tmp_path: Path) -> None:
    """Data parallel: one file per rank (all suffixed when size > 1), the rank in the
    header; a header from before the rank keys existed reads as rank 0 of 1."""
    assert rank_path("/d/steps.jsonl", 0, 1) == "/d/steps.jsonl"
    assert rank_path("/d/steps.jsonl", 0, 2) == "/d/steps.dp0.jsonl"
    assert rank_path("/d/steps.jsonl", 1, 2) == "/d/steps.dp1.jsonl"
    assert rank_path("steps", 3, 4) == "steps.dp3"
    assert rank_path("/d.x/.log", 1, 2) == "/d.x/.log.dp1"
    assert rank_path("a.b.jsonl", 1, 2) == "a.b.dp1.jsonl"
    log = tmp_path / "s.jsonl"
    old = {k: v for k, v in HEADER.items() if not k.startswith("data_parallel")}
    log.write_text(json.dumps(old) + "\n" + json.dumps(record(1)) + "\n"
                   + json.dumps({**HEADER, "data_parallel_rank": 1, "data_parallel_size": 2})
                   + "\n" + json.dumps(record(2)) + "\n")
    assert [(r.dp_rank, r.dp_size) for r in read_step_log(log).runs] == [(0, 1), (1, 2)]
    assert read_step_log(log).runs[1].steps[0].record["step"] == 2
    for rank, size, msg in ((2, 2, "data_parallel_rank must be an integer in \\[0, 1\\]"),
                            (-1, 2, "data_parallel_rank must"), ("0", 2, "data_parallel_rank"),
                            (0, 0, "data_parallel_size must be an integer in \\[1, "),
                            (0, True, "data_parallel_size must"),
                            (0, 10**9, "data_parallel_size must")):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps({**HEADER, "data_parallel_rank": rank,
                                   "data_parallel_size": size}) + "\n")
        with pytest.raises(PpasError, match=r"bad.jsonl:1: " + msg):
            read_step_log(bad)
