"""Trace generators: bit-identity with the P-PAS artifact, gamma, files."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ppas.analysis.reference import reference_runs
from ppas.core.errors import PpasError
from ppas.workload import (
    RequestSpec,
    gamma_trace,
    load_trace,
    parse_lengths,
    parse_phases,
    phase_trace,
    prefix_group_trace,
    save_trace,
    session_trace,
)


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
    # Issue 23: these were read silently (true as 1 s, the last of two columns, cells
    # past the header dropped).
    ("h.jsonl", '{"arrival_s": true, "prompt_tokens": 5, "output_tokens": 1}\n',
     "h.jsonl:1: arrival_s must be a number, got True"),
    ("i.jsonl", '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": false}\n',
     "i.jsonl:1: output_tokens must be a number, got False"),
    ("j.csv", "arrival_s,prompt_tokens,output_tokens,prompt_tokens\n0,5,1,9\n",
     "j.csv:1: CSV header names prompt_tokens twice"),
    ("k.csv", "arrival_s,prompt_tokens,output_tokens\n0,5,1\n1,5,1,7\n",
     "k.csv:3: more cells than the header's 3 columns"),
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


# -- prefix groups, sessions, mixed lengths ---------------------------------------------


def test_prefix_group_trace_shares_group_prefix() -> None:
    t = prefix_group_trace(float("inf"), 200, seed=3, num_groups=4, prefix_tokens=1000,
                           suffix_tokens="10-50", output_tokens=8)
    assert all(r.arrival_s == 0.0 for r in t)
    groups = {r.prefix for r in t}
    assert groups == {((f"group{g}", 1000),) for g in range(4)}
    assert all(1010 <= r.prompt_tokens <= 1050 and r.prefix_tokens == 1000 for r in t)
    # Same seed: the same arrivals as gamma_trace.
    g = prefix_group_trace(2.0, 50, 7, 3, 100, 10, 4)
    assert [r.arrival_s for r in g] == [r.arrival_s for r in gamma_trace(2.0, 50, 7)]


def test_zipf_groups_are_skewed() -> None:
    t = prefix_group_trace(float("inf"), 2000, 1, 8, 64, 16, 4, zipf=1.5)
    counts = [sum(1 for r in t if r.prefix[0][0] == f"group{g}") for g in range(8)]
    assert counts[0] > 3 * counts[7]


def test_session_turns_extend_the_previous_prompt() -> None:
    t = session_trace(5, 4, seed=2, session_rate=1.0, system_tokens=300, first_tokens=200,
                      turn_tokens="50-100", output_tokens=16, think_s=2.0)
    assert len(t) == 20
    by_session: dict[str, list[RequestSpec]] = {}
    for r in t:
        assert r.prefix[0] == ("system", 300) and r.prefix_tokens == r.prompt_tokens
        by_session.setdefault(r.prefix[1][0], []).append(r)
    for turns in by_session.values():
        assert len(turns) == 4
        for a, b in zip(turns, turns[1:], strict=False):
            assert a.arrival_s < b.arrival_s
            assert 50 <= b.prefix[1][1] - a.prefix[1][1] <= 100


def test_length_values() -> None:
    d = parse_lengths("512:0.75,8192:0.25")
    xs = [d.sample(random.Random(i)) for i in range(400)]
    assert set(xs) == {512, 8192} and 60 < xs.count(8192) < 140
    assert all(16 <= parse_lengths("16-64").sample(random.Random(i)) <= 64 for i in range(50))
    assert parse_lengths("25000").sample(random.Random(0)) == 25000


@pytest.mark.parametrize("bad", ["", "a-b", "5:x", "0", "10-5", "5:-1,6:1", "5:inf", "5,6", "0:0"])
def test_bad_lengths(bad: str) -> None:
    with pytest.raises(PpasError):
        parse_lengths(bad)


def test_prefix_roundtrip_and_csv_groups(tmp_path: Path) -> None:
    t = session_trace(3, 2, 0, 1.0, 64, 32, 16, 4, 1.0)
    f = tmp_path / "s.jsonl"
    save_trace(t, f)
    assert load_trace(f).requests == t.requests
    c = tmp_path / "g.csv"
    c.write_text("arrival_s,prompt_tokens,output_tokens,prefix_group,prefix_tokens\n"
                 "0,100,2,sys,64\n0.5,40,2,,\n")
    a, b = load_trace(c)
    assert a.prefix == (("sys", 64),) and b.prefix == ()


@pytest.mark.parametrize("obj,needle", [
    ('"prefix": [["a", 500]]', "more than prompt_tokens"),
    ('"prefix": "a"', "list of [stream, tokens]"),
    ('"prefix": [["a", 0]]', "tokens >= 1"),
    ('"prefix_group": "a"', "needs prefix_tokens"),
    ('"prefix_tokens": 5', "needs prefix_group"),
    ('"prefix": [["a", 5]], "prefix_group": "a", "prefix_tokens": 5', "not both"),
    ('"prefix": [[null, 5]]', "need a non-empty stream"),  # issue 23: became "None"
    ('"prefix": [[["a"], 5]]', "need a non-empty stream"),
    ('"prefix": [["a", true]]', "tokens >= 1"),
])
def test_bad_prefix(tmp_path: Path, obj: str, needle: str) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"arrival_s": 0, "prompt_tokens": 100, "output_tokens": 1, ' + obj + "}\n")
    with pytest.raises(PpasError) as e:
        load_trace(f)
    assert needle in str(e.value) and "p.jsonl:1" in str(e.value)


def test_weighted_ranges() -> None:
    d = parse_lengths("200-800:0.7,4000-12000:0.3")
    xs = [d.sample(random.Random(i)) for i in range(500)]
    assert all(200 <= x <= 800 or 4000 <= x <= 12000 for x in xs)
    assert 100 < sum(1 for x in xs if x >= 4000) < 200 and d.max == 12000
