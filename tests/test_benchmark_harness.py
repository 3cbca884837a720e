"""benchmarks/harness.py through a benchmark run as a user runs it: the command echo, the
results JSON (written atomically, its path checked before any work) and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bench(name: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *argv], cwd=ROOT,
                          capture_output=True, text=True, env=env, check=False)


def test_echo_table_and_results_json(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    argv = ("--duration", "5", "--instances", "8", "--pd-ratios", "1:1", "--json", str(out))
    proc = bench("cluster_ttft_breakdown.py", *argv)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("$ ") and lines[0].endswith(
        "benchmarks/cluster_ttft_breakdown.py " + " ".join(argv))
    header = lines[2]
    assert header.split()[:3] == ["layout", "pool", "n"] and header == header.rstrip()
    assert [ln.split()[0] for ln in lines[3:5]] == ["4P:4D", "4P:4D"]
    doc = json.loads(out.read_text())
    assert doc["command"] == lines[0][2:]
    assert set(doc["results"]) == {"4P:4D slowest 5%", "4P:4D all", "4P:4D deflected"}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left


def test_bad_arguments_are_one_line_exit_2(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    for name, argv in (("prefix_policies.py", ["--seeds", "0"]),
                       ("paper_grid.py", ["--json", str(blocker / "r.json")]),
                       ("decision_cost.py", ["--no-such-flag"]),
                       ("cluster_ttft_breakdown.py", ["--seed", "x"])):
        proc = bench(name, *argv)
        assert proc.returncode == 2, (name, proc.stderr)
        assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert proc.stderr.startswith(f"{name}: error: ")
