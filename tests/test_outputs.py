"""Every output path is checked before work starts, every file is written atomically, and no
input is overwritten (``ppas.core.outputs``; issue 11's data-loss cases for calibrate and sweep)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_calibrate import TRUE, synthetic_log

from ppas.cli import main
from ppas.core.errors import PpasError
from ppas.core.outputs import (
    atomic_output,
    check_output_dir,
    check_output_file,
    write_atomic,
    write_folder,
    write_new_file,
)
from ppas.cost import make_cost_model

RTX = ["--hardware", "rtx5090", "--model", "qwen2.5-3b"]
SMALL_SWEEP = ["sweep", *RTX, "--burst-rates", "0.4,1.0", "--seeds", "0", "--configs",
               "mbt:2048,ppas"]
UNWRITABLE = "/sys/ppas-test"  # sysfs takes no new files, not even from root


def files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        rc = main(args)
    except SystemExit as e:
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_check_paths(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    with pytest.raises(PpasError, match="is a folder; give a file name"):
        check_output_file(tmp_path / "d", "-o")
    with pytest.raises(PpasError, match="is a file, not a folder"):
        check_output_file(tmp_path / "f" / "out.json", "-o")
    with pytest.raises(PpasError, match="is also an input"):
        check_output_file(tmp_path / "d" / ".." / "f", "-o", inputs=[tmp_path / "f"])
    with pytest.raises(PpasError, match="cannot create files in '/sys'"):
        check_output_file(UNWRITABLE + "/x.json", "-o")
    with pytest.raises(PpasError, match="exists and is not a folder"):
        check_output_dir(tmp_path / "f", "--out-dir")
    assert check_output_dir(tmp_path / "new" / "deeper", "--out-dir").name == "deeper"
    assert files(tmp_path) == ["d", "f"]  # checking creates nothing


def test_atomic_writes_leave_nothing_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    write_atomic(target, "old")
    with pytest.raises(RuntimeError), atomic_output(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old" and files(tmp_path) == ["r.json"]

    def boom(p: Path) -> None:
        raise RuntimeError("plot failed")

    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        write_folder(out, {"a.txt": lambda p: p.write_text("a"), "b.png": boom})
    assert not out.exists() and files(tmp_path) == ["r.json"]
    write_folder(out, {"a.txt": lambda p: p.write_text("1")})
    with pytest.raises(RuntimeError):
        write_folder(out, {"a.txt": lambda p: p.write_text("2"), "b.png": boom})
    assert files(tmp_path) == ["out", "out/a.txt", "r.json"] and (out / "a.txt").read_text() == "1"


def test_new_file_names_never_collide(tmp_path: Path) -> None:
    """Two benches started in the same second in one folder both keep their results."""
    names = [write_new_file(tmp_path, "bench-m-20260101-000000", ".json", str(i)).name
             for i in range(3)]
    assert names == ["bench-m-20260101-000000.json", "bench-m-20260101-000000-2.json",
                     "bench-m-20260101-000000-3.json"]
    assert [(tmp_path / n).read_text() for n in names] == ["0", "1", "2"]
    assert len(files(tmp_path)) == 3


def test_calibrate_never_overwrites_its_input(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 11: ``ppas calibrate s.jsonl -o s.jsonl`` replaced the step log, exit 0."""
    log = tmp_path / "s.jsonl"
    synthetic_log(log, TRUE, steps=40)
    before = log.read_bytes()
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    for out, why in ((str(log), "is also an input; refusing to overwrite it"),
                     (str(tmp_path / "." / "s.jsonl"), "is also an input"),
                     (str(tmp_path / "dir"), "is a folder; give a file name"),
                     (str(tmp_path / "file" / "c.json"), "is a file, not a folder"),
                     (UNWRITABLE + "/c.json", "cannot create files in")):
        rc, stdout, err = run_cli(["calibrate", str(log), "-o", out], capsys)
        assert rc == 2 and stdout == "" and err.count("\n") == 1 and why in err, err
    assert log.read_bytes() == before and files(tmp_path) == ["dir", "file", "s.jsonl"]


def test_output_file_is_a_new_path_or_a_regular_file(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23, data loss 7: ``-o`` onto a FIFO, a symlink or a device replaced the node
    with a regular file (as root, ``-o /dev/null`` would replace /dev/null)."""
    log = tmp_path / "s.jsonl"
    synthetic_log(log, TRUE, steps=40)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = tmp_path / "target.json"
    target.write_text("keep")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere.json")
    for out, why in ((fifo, "is not a regular file"), (link, "is a symlink"),
                     (dangling, "is a symlink"), (Path("/dev/null"), "is not a regular file")):
        rc, stdout, err = run_cli(["calibrate", str(log), "-o", str(out)], capsys)
        assert rc == 2 and stdout == "" and err.count("\n") == 1 and why in err, err
    assert fifo.is_fifo() and link.is_symlink() and dangling.is_symlink()
    assert target.read_text() == "keep" and not (tmp_path / "nowhere.json").exists()
    rc, _, _ = run_cli(["calibrate", str(log), "-o", str(target)], capsys)
    assert rc == 0 and target.read_text() != "keep"  # a regular file is replaced, as before


def test_outputs_follow_the_umask(tmp_path: Path) -> None:
    """Issue 23: every output was 0600 and every folder 0700 whatever the umask, so a team
    could not read the results."""
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "a.txt", "a")
        new = write_new_file(tmp_path, "b", ".json", "{}")
        with atomic_output(tmp_path / "c.png") as tmp:
            tmp.write_bytes(b"png")
        write_folder(tmp_path / "out", {"r.json": lambda p: p.write_text("{}")})
        os.umask(0o027)
        write_atomic(tmp_path / "d.txt", "d")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.rglob("*")}
    assert modes == {"a.txt": 0o644, new.name: 0o644, "c.png": 0o644, "out": 0o755,
                     "r.json": 0o644, "d.txt": 0o640}


def test_sweep_never_replaces_a_records_file_without_force(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23, data loss 8: ``ppas sweep --out-dir D`` silently replaced D/records.json."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "records.json").write_text("days of work")
    argv = [*SMALL_SWEEP, "--out-dir", str(out)]
    rc, stdout, err = run_cli(argv, capsys)
    assert rc == 2 and stdout == "" and err.count("\n") == 1
    assert "already holds records.json" in err and "--force" in err
    assert files(out) == ["records.json"] and (out / "records.json").read_text() == "days of work"
    rc, _, _ = run_cli([*argv, "--force"], capsys)
    assert rc == 0 and json.loads((out / "records.json").read_text())


def test_calibrate_refuses_a_log_given_twice(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23: ``calibrate s.jsonl s.jsonl`` fitted every step twice."""
    log = tmp_path / "s.jsonl"
    synthetic_log(log, TRUE, steps=40)
    os.link(log, tmp_path / "hard.jsonl")
    out = tmp_path / "c.json"
    for second in (log, tmp_path / "." / "s.jsonl", tmp_path / "hard.jsonl"):
        rc, stdout, err = run_cli(["calibrate", str(log), str(second), "-o", str(out)], capsys)
        assert rc == 2 and stdout == "" and err.count("\n") == 1
        assert "is given twice" in err and "give each log once" in err
    assert not out.exists()


def test_calibrate_skips_a_truncated_last_line(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "s.jsonl"
    synthetic_log(log, TRUE, steps=40)
    with open(log, "a") as f:
        f.write('{"step": 41, "time": 1')  # a server killed mid-line
    out = tmp_path / "c.json"
    rc, stdout, err = run_cli(["calibrate", str(log), "-o", str(out)], capsys)
    assert rc == 0 and "fit on 40 steps" in stdout
    assert err.count("\n") == 1 and "s.jsonl:41: skipped a truncated last line" in err
    assert make_cost_model(f"fitted:{out}").step_time  # loadable


def test_fitted_file_with_bad_sources_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "cost.json"
    TRUE.to_file(path)
    obj = json.loads(path.read_text())
    path.write_text(json.dumps({**obj, "sources": 5}))
    with pytest.raises(PpasError, match='"sources" must be a list of file names, got 5'):
        make_cost_model(f"fitted:{path}")


def test_sweep_checks_every_destination_before_work(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder.png").mkdir()
    cases = [
        (["--plot", str(tmp_path / "folder.png")], "is a folder"),
        (["--plot", UNWRITABLE + "/p.png"], "cannot create files in"),
        (["--plot", str(tmp_path / "nodir" / "p.png")], None),  # created when written
        (["--out-dir", str(tmp_path / "file")], "exists and is not a folder"),
        (["--out-dir", str(tmp_path / "file" / "sub")], "is a file, not a folder"),
        (["--out-dir", UNWRITABLE], "cannot create files in"),
    ]
    for extra, why in cases:
        rc, out, err = run_cli([*SMALL_SWEEP, "--phases", "5:{burst}", "--burst-rates", "2,4",
                                *extra], capsys)
        if why is None:
            assert rc == 0 and (tmp_path / "nodir" / "p.png").stat().st_size > 1000
            continue
        assert rc == 2 and out == "" and err.count("\n") == 1 and why in err, (extra, err)
    assert files(tmp_path) == ["file", "folder.png", "nodir", "nodir/p.png"]


def test_sweep_out_dir_is_replaced_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 11: a failing plot left a half-written folder, lost the tables, left *.tmp."""
    out = tmp_path / "out"
    argv = [*SMALL_SWEEP, "--out-dir", str(out)]
    rc, first, _ = run_cli(argv, capsys)
    assert rc == 0 and files(out) == ["e2e_vs_burst.png", "records.json", "tables.txt"]
    before = {n: (out / n).read_bytes() for n in files(out)}

    import ppas.commands.sweep as sweep_cmd

    def broken_plot(*a: object, **k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sweep_cmd, "plot_e2e_vs_burst", broken_plot)
    rc, again, err = run_cli([*argv, "--seeds", "1", "--force"], capsys)
    assert rc == 2 and "No space left on device" in err and err.count("\n") == 1
    assert "mean E2E latency" in again  # the tables were printed before the write failed
    assert {n: (out / n).read_bytes() for n in files(out)} == before  # untouched, no debris
    assert files(tmp_path) == ["out", *(f"out/{n}" for n in sorted(before))]


def test_sweep_removes_stages_of_killed_writers_only(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 11: a SIGKILL while ``ppas sweep --out-dir`` staged left ``.NAME.stage-*``
    behind for good. The next write into the same place removes it once its writer is
    dead, and never a live writer's stage."""
    out = tmp_path / "out"
    code = ("import sys, time\nfrom ppas.core.outputs import write_folder\n"
            "def slow(p):\n    p.write_text('half')\n    time.sleep(120)\n"
            f"write_folder({str(out)!r}, {{'a.txt': slow}})\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not list(tmp_path.glob(".out.stage-*/a.txt")):
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    (killed,) = tmp_path.glob(".out.stage-*")
    assert killed.name.startswith(f".out.stage-{proc.pid}-")  # the writer's pid in the name
    live = tmp_path / f".out.stage-{os.getpid()}-abc"  # a writer still at work
    live.mkdir()
    rc, _, _ = run_cli([*SMALL_SWEEP, "--out-dir", str(out)], capsys)
    assert rc == 0 and not killed.exists() and live.is_dir()
    inside = out / f".out.stage-{proc.pid}-xyz"  # a killed rewrite staged inside the folder
    inside.mkdir()
    (inside / "records.json").write_text("{")
    before = files(out)
    rc, _, _ = run_cli([*SMALL_SWEEP, "--out-dir", str(out), "--force"], capsys)
    assert rc == 0 and files(out) == [n for n in before if not n.startswith(".out.stage")]
    assert files(tmp_path) == [live.name, "out", *(f"out/{n}" for n in files(out))]


def test_plot_failure_leaves_no_tmp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.figure import Figure

    from ppas.analysis.plot import plot_e2e_vs_burst

    def fail(self: Figure, *a: object, **k: object) -> None:
        Path(str(a[0])).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", fail)
    recs = [{"config": "mbt:2048", "burst_rate": 1.0, "avg_latency": 1.0}]
    with pytest.raises(OSError):
        plot_e2e_vs_burst(recs, tmp_path / "p.png")
    assert files(tmp_path) == []


def test_simulate_counts_requests_vllm_rejects(capsys: pytest.CaptureFixture[str]) -> None:
    """Prompts longer than the model's context fail with the reason (vLLM answers 400);
    requests that can never fit in KV fail too; the table shows the count; exit 1."""
    rc, out, err = run_cli(["simulate", *RTX, "--prompt-tokens", "40000", "--configs",
                            "mbt:2048"], capsys)
    assert rc == 1 and "completed no request" in err
    assert "failed: longer than max_model_len (32768 tokens)" in out
    row = next(ln for ln in out.splitlines() if ln.startswith("mbt:2048"))
    assert row.split()[-1] == out.split("requests")[0].split()[-1]  # all of them failed
    rc, out, _ = run_cli(["simulate", *RTX, "--max-model-len", "60000", "--prompt-tokens",
                          "40000", "--configs", "mbt:2048", "--json"], capsys)
    (rec,) = json.loads(out)
    assert rc == 0 and rec["failed"] == 0
    rc, out, _ = run_cli(["simulate", *RTX, "--num-kv-blocks", "100", "--configs",
                          "mbt:2048", "--json"], capsys)
    (rec,) = json.loads(out)
    assert rc == 1 and rec["failed"] == rec["num_requests"] > 0
    assert rec["failure_reasons"] == {"never fits in the KV cache (1600 tokens)":
                                      rec["num_requests"]}


def test_sweep_with_no_successful_request_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli([*SMALL_SWEEP, "--prompt-tokens", "40000"], capsys)
    assert rc == 1 and "failed requests, mean over seeds" in out
    assert "4 of 4 runs completed no request" in err


def test_bom_csv_trace_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "t.csv"
    csv.write_bytes(b"\xef\xbb\xbfarrival_s,prompt_tokens,output_tokens\r\n0,1000,4\r\n1,800,4\r\n")
    rc, out, _ = run_cli(["simulate", *RTX, "--trace", str(csv), "--configs", "mbt:2048",
                          "--json"], capsys)
    assert rc == 0 and json.loads(out)[0]["num_requests"] == 2


@pytest.mark.parametrize("row,why", [
    ('{"arrival_s": 1e308, "prompt_tokens": 10, "output_tokens": 2}',
     "arrival_s must be a number in [0, 1e+07]"),
    ('{"arrival_s": 0, "prompt_tokens": 1e20, "output_tokens": 2}',
     "prompt_tokens must be an integer in [1, 10000000]"),
    ('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 1' + "0" * 400 + "}",
     "output_tokens"),
])
def test_trace_values_are_bounded(tmp_path: Path, row: str, why: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(row + "\n")
    rc, out, err = run_cli(["simulate", *RTX, "--trace", str(path)], capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1 and f"t.jsonl:1: {why}" in err, err


def test_json_outputs_write_null_for_metrics_without_a_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23: ``simulate --json`` and ``records.json`` held ``NaN``, which is not JSON.
    A run that completed no request now writes ``null`` for its latencies."""

    def strict(text: str) -> object:
        def no_constant(name: str) -> object:
            raise ValueError(f"not JSON: {name}")
        return json.loads(text, parse_constant=no_constant)

    rc, out, _ = run_cli(["simulate", *RTX, "--prompt-tokens", "40000", "--configs",
                          "mbt:2048", "--json"], capsys)
    (rec,) = strict(out)  # type: ignore[misc]
    assert rc == 1 and rec["avg_ttft"] is None and rec["failed"] == rec["num_requests"] > 0
    od = tmp_path / "od"
    rc, _, _ = run_cli([*SMALL_SWEEP, "--prompt-tokens", "40000", "--out-dir", str(od)], capsys)
    recs = strict((od / "records.json").read_text())
    assert rc == 1 and all(r["avg_latency"] is None for r in recs)  # type: ignore[attr-defined]


def test_cluster_run_with_no_success_exits_1_like_one_engine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23: a cluster run where every request failed exited 0 (one engine exits 1)."""
    toml = tmp_path / "c.toml"
    toml.write_text('[[pools]]\nname = "gpu"\ninstances = 2\nhardware = "h200"\n'
                    'model = "llama3.2-3b"\nnum_kv_blocks = 2\n')
    argv = ["simulate", "--cluster", str(toml), "--mixed", "--request-rate", "5",
            "--duration", "2"]
    for extra in ([], ["--json"]):
        rc, out, err = run_cli([*argv, *extra], capsys)
        assert rc == 1 and "1 of 1 runs completed no request" in err and out
        if extra:
            assert json.loads(out)[0]["avg_ttft"] is None
    toml.write_text(toml.read_text().replace("num_kv_blocks = 2", "num_kv_blocks = 4000"))
    rc, _, err = run_cli(argv, capsys)
    assert rc == 0 and err == ""
