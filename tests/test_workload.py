"""Trace generators: bit-identity with the P-PAS artifact, gamma, files."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ppas.errors import PpasError
from ppas.reference import reference_runs
from ppas.workload import gamma_trace, load_trace, parse_phases, phase_trace, save_trace


def artifact_generator(phases: str, seed: int) -> list[float]:
    """The P-PAS benchmark's piecewise-Poisson loop, written independently from the spec."""
    rng = random.Random(seed)
    out, t0 = [], 0.0
    for part in phases.split(","):
        dur, rate = map(float, part.split(":"))
        t = t0
        while True:
            t += rng.expovariate(rate)
            if t >= t0 + dur:
                break
            out.append(t)
        t0 += dur
    return out


def test_reproduces_all_210_request_counts() -> None:
    runs = reference_runs()
    assert len(runs) == 210
    for r in runs:
        assert len(phase_trace(r["phases"], r["seed"])) == r["num_requests"], r


@pytest.mark.parametrize("seed", range(5))
def test_bit_identical_arrivals(seed: int) -> None:
    phases = "10:0.2,10:1.4,10:0.2,10:1.4,10:0.2"
    got = [r.arrival_s for r in phase_trace(phases, seed)]
    assert got == artifact_generator(phases, seed)


def test_burst_placeholder() -> None:
    assert parse_phases("10:0.2,10:{burst}", 0.8)[1].rate == 0.8


@pytest.mark.parametrize("bad", ["10", "a:b", "10:-1", "0:1", "", "10:{burst}"])
def test_bad_phases(bad: str) -> None:
    with pytest.raises(PpasError):
        parse_phases(bad)


def test_gamma_mean_rate() -> None:
    t = gamma_trace(2.0, 4000, seed=1, burstiness=0.5)
    rate = len(t) / t.requests[-1].arrival_s
    assert 1.8 < rate < 2.2


def test_trace_file_roundtrip(tmp_path: Path) -> None:
    t = phase_trace("5:1.0", 3, 100, 8)
    f = tmp_path / "t.jsonl"
    save_trace(t, f)
    assert load_trace(f).requests == t.requests
    c = tmp_path / "t.csv"
    c.write_text("arrival_s,prompt_tokens,output_tokens\n0.5,10,2\n0.1,20,3\n")
    assert [r.prompt_tokens for r in load_trace(c)] == [20, 10]


@pytest.mark.parametrize("name,text,needle", [
    ("a.jsonl", '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1}\n{bad\n', "a.jsonl:2"),
    ("b.jsonl", '{"arrival_s": 0, "prompt_tokens": 5}\n', "b.jsonl:1: missing output_tokens"),
    ("c.csv", "arrival_s,prompt_tokens,output_tokens\n0,5,1\n1,x,1\n", "c.csv:3"),
    ("d.csv", "arrival,prompt_tokens\n", "d.csv:1"),
    ("e.jsonl", '{"arrival_s": -1, "prompt_tokens": 5, "output_tokens": 1}\n', "e.jsonl:1"),
    ("f.txt", "x", "allowed: .csv, .jsonl"),
    ("g.jsonl", "", "no requests"),
])
def test_malformed_trace_files(tmp_path: Path, name: str, text: str, needle: str) -> None:
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(PpasError) as e:
        load_trace(f)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_trace_file(tmp_path: Path) -> None:
    with pytest.raises(PpasError, match="does not exist"):
        load_trace(tmp_path / "nope.csv")
