"""Public trace formats read as published (Azure, Mooncake, BurstGPT, ours), detection,
the transformations, drop counting, and the command line's errors (issue 19, item 1)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
from test_cli import run_cli

from ppas.commands import bench
from ppas.core.errors import PpasError
from ppas.cost import make_cost_model
from ppas.engine.prefix_cache import chained_block_hashes
from ppas.engine.simulator import EngineConfig, simulate
from ppas.experiment.traces import WorkloadSpec
from ppas.policies import make_policy
from ppas.workload import RequestSpec, Trace, TraceTransform, load_trace, parse_window
from ppas.workload.files import detect_format, save_trace

DATA = Path(__file__).parent / "data" / "traces"
AZURE = DATA / "azure-2023-code-head.csv"
MOONCAKE = DATA / "mooncake-synthetic-slice.jsonl"
BURSTGPT = DATA / "burstgpt-synthetic.csv"


def _edit(src: Path, tmp: Path, line: int, new: str) -> Path:
    """A copy of ``src`` with 1-based ``line`` replaced by ``new``."""
    lines = src.read_text().splitlines()
    lines[line - 1] = new
    out = tmp / src.name
    out.write_text("\n".join(lines) + "\n")
    return out


# --- detection -------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "fmt"), [(AZURE, "azure"), (MOONCAKE, "mooncake"),
                                           (BURSTGPT, "burstgpt")])
def test_format_is_detected_from_header_or_keys(path: Path, fmt: str) -> None:
    assert detect_format(path, path.read_text()) == fmt
    assert f"({fmt} format)" in load_trace(path).description


def test_our_own_format_reads_as_before(tmp_path: Path) -> None:
    p = tmp_path / "ours.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens,prefix_group,prefix_tokens\n"
                 "0.5,100,4,sys,64\n0,50,2,,\n")
    tr = load_trace(p)
    assert tr.description == "file ours.csv" and tr.dropped == ()
    assert [(r.arrival_s, r.prompt_tokens, r.prefix) for r in tr] == [
        (0.0, 50, ()), (0.5, 100, (("sys", 64),))]
    q = tmp_path / "ours.jsonl"
    q.write_text('{"arrival_s": 1, "prompt_tokens": 9, "output_tokens": 1}\n')
    assert detect_format(q, q.read_text()) == "ppas" and len(load_trace(q)) == 1


def test_our_own_format_priority_column(tmp_path: Path) -> None:
    """vLLM's per-request priority: an integer, absent = 0; written back only when not 0."""
    p = tmp_path / "pri.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens,priority\n0,10,2,-3\n1,10,2,\n")
    tr = load_trace(p)
    assert [r.priority for r in tr] == [-3, 0]
    out = tmp_path / "back.jsonl"
    save_trace(tr, out)
    assert ['"priority"' in line for line in out.read_text().splitlines()] == [True, False]
    assert [r.priority for r in load_trace(out)] == [-3, 0]
    for bad in ("1.5", "x", "true", str(2**31)):
        q = tmp_path / "bad.jsonl"
        q.write_text('{"arrival_s": 0, "prompt_tokens": 9, "output_tokens": 1, "priority": '
                     + (bad if bad != "x" else '"x"') + "}\n")
        with pytest.raises(PpasError, match=r"bad.jsonl:1: priority must be"):
            load_trace(q)


def test_simulate_scheduling_policy_priority_admits_lower_values_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three long prompts (priority 1) then a short one (priority 0): under priority the
    short one is admitted ahead of the queued long ones, so its TTFT drops; FCFS ignores
    the column. ``--vllm-version`` is accepted by every simulating command."""
    p = tmp_path / "pri.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens,priority\n"
                 + "0,4000,8,1\n" * 3 + "0.01,100,8,0\n")
    ttft = {}
    for policy in ("fcfs", "priority"):
        rc, out, _ = run_cli(["simulate", "--trace", str(p), "--hardware", "h100-sxm-80gb",
                              "--model", "qwen3-8b", "--configs", "mbt:2048", "--json",
                              "--scheduling-policy", policy, "--vllm-version", "0.32"], capsys)
        assert rc == 0
        ttft[policy] = json.loads(out)[0]["ttft_p50"]
    assert ttft["priority"] < ttft["fcfs"]
    rc, _, err = run_cli(["sweep", "--hardware", "rtx5090", "--model", "qwen2.5-3b",
                          "--scheduling-policy", "priority"], capsys)
    assert rc == 2 and "needs a trace with a priority column" in err


# --- each format, read as published ------------------------------------------------------

def test_azure_arrivals_are_seconds_from_the_first_row() -> None:
    tr = load_trace(AZURE)
    assert len(tr) == 20
    r0, r1 = tr.requests[:2]
    assert (r0.arrival_s, r0.prompt_tokens, r0.output_tokens) == (0.0, 4808, 10)
    # 18:17:04.0319600 - 18:17:03.9799600
    assert r1.arrival_s == pytest.approx(0.052) and (r1.prompt_tokens, r1.output_tokens) == (
        3180, 8)
    assert tr.duration_s == pytest.approx(tr.requests[-1].arrival_s)


def test_azure_2024_timestamps_with_a_utc_offset(tmp_path: Path) -> None:
    p = tmp_path / "azure2024.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2024-05-10 00:00:00.009930+00:00,2048,28\n"
                 "2024-05-10 00:00:01.509930+00:00,700,300\n")
    tr = load_trace(p, "azure")
    assert [r.arrival_s for r in tr] == pytest.approx([0.0, 1.5])


def test_mooncake_timestamps_in_ms_and_hash_ids_as_prefix_blocks() -> None:
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    tr = load_trace(MOONCAKE)
    assert len(tr) == 20 and tr.duration_s == pytest.approx(19.486)
    for row, r in zip(rows, tr, strict=True):  # the file is in arrival order
        assert r.arrival_s == row["timestamp"] / 1000
        assert r.prompt_tokens == row["input_length"] and r.output_tokens == row["output_length"]
        assert r.prefix_tokens == row["input_length"]  # the hash ids cover the whole prompt
        assert len(r.prefix) == len(row["hash_ids"])


def _shared_blocks(a: RequestSpec, b: RequestSpec, block: int = 16) -> int:
    ha, hb = chained_block_hashes(a.prefix, block), chained_block_hashes(b.prefix, block)
    return next((i for i, (x, y) in enumerate(zip(ha, hb, strict=False)) if x != y),
                min(len(ha), len(hb)))


def test_mooncake_requests_share_k_blocks_of_prompt_for_k_common_hash_ids() -> None:
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    tr = load_trace(MOONCAKE)
    a, b = rows[15], rows[17]  # lines 16 and 18: both start with hash ids 708, 709, ...
    k = next(i for i, (x, y) in enumerate(zip(a["hash_ids"], b["hash_ids"], strict=False))
             if x != y)
    assert k >= 1
    ra, rb = tr.requests[15], tr.requests[17]
    assert _shared_blocks(ra, rb) * 16 == k * 512
    assert _shared_blocks(tr.requests[0], tr.requests[1]) == 0  # different first ids
    # another block size: k blocks of that size; ids then cover part of each prompt
    small = load_trace(MOONCAKE, "mooncake", block_size=256)
    assert _shared_blocks(small.requests[15], small.requests[17]) * 16 == k * 256
    assert small.requests[0].prefix_tokens == 79 * 256
    with pytest.raises(PpasError, match=r":1: hash_ids must be a list of at most 40 block ids"):
        load_trace(MOONCAKE, "mooncake", block_size=1024)  # 79 ids for a 40160-token prompt


def test_mooncake_prefix_reuse_gives_prefix_cache_hits_in_the_simulator() -> None:
    tr = load_trace(MOONCAKE)
    cm = make_cost_model("roofline", "h100-sxm-80gb", "qwen3-8b", 1, 8192)
    res = simulate(tr, make_policy("mbt:8192"), cm, EngineConfig(prefix_caching=True))
    hits = [r.num_hit_tokens for r in res.requests]
    # line 18 shares 5 of its 6 hash ids with line 16; line 19 shares 28 with line 17; line
    # 20 repeats line 16's whole 2752-token prompt (a hit stops one token short, floored
    # to 16-token blocks); no other line shares its first id with an earlier one
    assert hits == [0] * 17 + [5 * 512, 28 * 512, 2751 // 16 * 16]
    assert res.prefix_hit_rate > 0
    plain = Trace(tuple(RequestSpec(r.arrival_s, r.prompt_tokens, r.output_tokens)
                        for r in tr), tr.duration_s)
    res = simulate(plain, make_policy("mbt:8192"), cm, EngineConfig(prefix_caching=True))
    assert res.prefix_hit_rate == 0  # the same lengths without the hash ids: no hit


def test_burstgpt_zero_token_failures_are_dropped_and_counted() -> None:
    tr = load_trace(BURSTGPT)
    assert len(tr) == 17
    assert tr.dropped == (("with 0 prompt or output tokens (failed requests)", 3),)
    assert "dropped 3 with 0 prompt or output tokens" in tr.description
    r = tr.requests[0]
    assert (r.arrival_s, r.prompt_tokens, r.output_tokens) == (0.0, 472, 18)
    assert tr.requests[1].arrival_s == 113.0  # 118 - 5: the 45 s row failed


# --- malformed files: one line naming the file, line and field ---------------------------

@pytest.mark.parametrize(("src", "line", "new", "wanted"), [
    (AZURE, 4, "2023-11-16 18:17:0x.07,3180,8", ":4: TIMESTAMP must be a date and time"),
    (AZURE, 5, "2023-11-16 18:17:04.0781490,110,-27", ":5: GeneratedTokens must be an integer"),
    (AZURE, 6, "2023-11-16 18:17:04.0781490,110", ":6: 2 fields; the header has 3"),
    (MOONCAKE, 3, '{"timestamp": 40, "input_length": "many", "output_length": 1, '
                  '"hash_ids": []}', ":3: input_length must be an integer"),
    (MOONCAKE, 2, '{"timestamp": 0, "input_length": 600, "output_length": 1, '
                  '"hash_ids": [1, 2, 3]}', ":2: hash_ids must be a list of at most 2"),
    (MOONCAKE, 4, '{"timestamp": "noon", "input_length": 6, "output_length": 1, '
                  '"hash_ids": [1]}', ":4: timestamp must be a number of ms"),
    (MOONCAKE, 5, '{"timestamp": 5, "input_length": 6, "hash_ids": [1]}',
     ":5: missing output_length"),
    (BURSTGPT, 7, "178,GPT-4,2204,1.5,2205.5,API log", ":7: Response tokens must be an integer"),
    (BURSTGPT, 3, "soon,ChatGPT,1087,1,1088,Conversation log", ":3: Timestamp must be a number"),
])
def test_a_malformed_row_of_each_format_names_file_line_and_field(
        tmp_path: Path, src: Path, line: int, new: str, wanted: str) -> None:
    bad = _edit(src, tmp_path, line, new)
    with pytest.raises(PpasError) as e:
        load_trace(bad)
    assert str(e.value).startswith(str(bad) + wanted)
    assert "\n" not in str(e.value)


def test_a_forced_format_that_does_not_fit_the_file(tmp_path: Path) -> None:
    with pytest.raises(PpasError, match="azure traces are CSV files"):
        load_trace(MOONCAKE, "azure")
    with pytest.raises(PpasError, match=r":1: CSV header lacks arrival_s"):
        load_trace(AZURE, "ppas")
    with pytest.raises(PpasError, match="header lacks Timestamp, Request tokens"):
        load_trace(AZURE, "burstgpt")
    with pytest.raises(PpasError, match="unknown trace format 'splitwise'; allowed: auto, "):
        load_trace(AZURE, "splitwise")


# --- transformations ---------------------------------------------------------------------

def _trace(arrivals: list[float], pt: int = 100, ot: int = 10) -> Trace:
    reqs = tuple(RequestSpec(a, pt, ot) for a in arrivals)
    return Trace(reqs, arrivals[-1], "t")


def test_window_keeps_shifts_and_counts_the_rest() -> None:
    tr = TraceTransform(window=(10, 20)).apply(_trace([0, 5, 10, 15, 29.5, 30, 40]))
    assert [r.arrival_s for r in tr] == [0, 5, 19.5]
    assert tr.duration_s == 20
    assert tr.excluded == 4 and tr.dropped == ()  # not asked for: not lost
    assert "window 10:20 s (applied before rescaling)" in tr.description
    assert "excluded 4 outside the window 10:20 s" in tr.description
    assert "dropped" not in tr.description
    with pytest.raises(PpasError, match="holds no request"):
        TraceTransform(window=(100, 5)).apply(_trace([0, 1]))


@pytest.mark.parametrize("path", [AZURE, MOONCAKE, BURSTGPT, "ours"])
@pytest.mark.parametrize("window", [(0.0, 5.0), (2.5, 1e4), (0.0, 1e6), (1.0, 1.0)])
def test_window_while_reading_is_the_window_after(path: Path | str, window: tuple[float, float],
                                                  tmp_path: Path) -> None:
    """Issue 19: the window applied while reading keeps, shifts and counts exactly what the
    window applied to the whole trace does."""
    if path == "ours":
        path = tmp_path / "ours.jsonl"
        path.write_text("".join(json.dumps({"arrival_s": 0.7 * i, "prompt_tokens": 5 + i,
                                            "output_tokens": 2}) + "\n" for i in range(20)))
    whole = load_trace(path)
    try:
        after = TraceTransform(window=window).apply(whole)
    except PpasError as e:
        with pytest.raises(PpasError, match="holds no request") as e2:
            load_trace(path, window=window)
        assert str(e2.value) == str(e)
        return
    read = load_trace(path, window=window)
    assert read.requests == after.requests and read.duration_s == after.duration_s
    # every row counted once: kept, dropped (failed, in the window) or excluded (outside it,
    # failed ones included)
    rows = len(whole) + sum(n for _, n in whole.dropped)
    assert len(read) + sum(n for _, n in read.dropped) + read.excluded == rows
    assert read.excluded >= after.excluded


def test_request_limit_is_on_the_requests_kept(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19: a file with more rows than the limit is refused whole (in one line saying
    how to read a slice) but read through a window holding fewer."""
    import ppas.core.limits as limits

    monkeypatch.setattr(limits, "MAX_REQUESTS", 100)
    big = tmp_path / "week.csv"
    big.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                   + "".join(f"{i * 0.5},ChatGPT,{10 + i % 7},{i % 5},{20},Conversation log\n"
                             for i in range(1000)))
    with pytest.raises(PpasError, match=r"week.csv: 800 requests; the limit is 100 per trace "
                       r"\(--window START:DURATION reads a slice\)"):
        load_trace(big)
    tr = load_trace(big, window=(100.0, 60.0))  # rows 200..319
    assert len(tr) == 96 and tr.excluded == 880
    assert tr.dropped == (("with 0 prompt or output tokens (failed requests)", 24),)
    assert tr.requests[0].arrival_s == 0.5 and tr.duration_s == 60
    with pytest.raises(PpasError, match=r"260 requests in the window 0:163 s; the limit is 100"):
        load_trace(big, window=(0.0, 163.0))


def test_time_scale_and_rate_rescale_arrivals() -> None:
    tr = TraceTransform(time_scale=0.5).apply(_trace([0, 2, 4, 8]))
    assert [r.arrival_s for r in tr] == [0, 1, 2, 4] and tr.duration_s == 4
    assert "arrival times x0.5" in tr.description
    tr = TraceTransform(rate=2.0).apply(_trace([0, 2, 4, 8]))  # 4 requests / 8 s = 0.5 req/s
    assert len(tr) / tr.duration_s == pytest.approx(2.0)
    assert [r.arrival_s for r in tr] == pytest.approx([0, 0.5, 1, 2])
    assert "rate 2 req/s (was 0.5" in tr.description
    # the window first, then the rate: the window's own mean rate is rescaled
    tr = TraceTransform(window=(0, 4), rate=1.0).apply(_trace([0, 1, 2, 3, 100]))
    assert len(tr) == 4 and tr.duration_s == pytest.approx(4.0)
    with pytest.raises(PpasError, match="time scale or a rate, not both"):
        TraceTransform(time_scale=2, rate=1)
    with pytest.raises(PpasError, match="same instant"):
        TraceTransform(rate=1).apply(_trace([0, 0]))


def test_length_scale_keeps_one_token_and_shared_prefixes() -> None:
    tr = load_trace(MOONCAKE)
    small = TraceTransform(length_scale=0.01).apply(tr)
    assert "lengths x0.01 (at least 1 token)" in small.description
    for big, r in zip(tr, small, strict=True):
        assert r.prompt_tokens == max(1, round(big.prompt_tokens * 0.01))
        assert r.output_tokens == max(1, round(big.output_tokens * 0.01)) >= 1
        assert r.prefix_tokens <= r.prompt_tokens
    a, b = small.requests[15], small.requests[17]  # lines 16 and 18 share blocks
    assert a.prefix[:3] == b.prefix[:3] and a.prefix[0][1] == 5


def test_output_scale_scales_outputs_alone() -> None:
    tr = Trace((RequestSpec(0, 100, 13), RequestSpec(1, 95, 1), RequestSpec(2, 5, 2)), 2, "t")
    out = TraceTransform(output_scale=10).apply(tr)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in out] == [
        (0, 100, 130), (1, 95, 10), (2, 5, 20)]
    assert "output lengths x10 (at least 1 token)" in out.description
    low = TraceTransform(output_scale=0.1).apply(tr)
    assert [r.output_tokens for r in low] == [1, 1, 1]  # rounded, at least 1
    both = TraceTransform(length_scale=0.5, output_scale=4).apply(tr)
    assert [(r.prompt_tokens, r.output_tokens) for r in both] == [(50, 24), (48, 4), (2, 4)]
    huge = Trace((RequestSpec(0, 10, 20_000),), 1, "t")
    with pytest.raises(PpasError, match="output scale 100 makes a request of 2000000 output"):
        TraceTransform(output_scale=100).apply(huge)
    for bad in (0.0, -1.0, 101.0, math.nan, math.inf):
        with pytest.raises(PpasError, match="output_scale must be a number"):
            TraceTransform(output_scale=bad)


def test_max_tokens_sets_the_clients_cap() -> None:
    """``--max-tokens``: N caps every request (longer outputs stop at N, as vLLM's length
    stop); 0 leaves vLLM's default to the engine; the prompts and arrivals stay."""
    tr = Trace((RequestSpec(0, 100, 13), RequestSpec(1, 95, 1), RequestSpec(2, 5, 40)), 2, "t")
    assert [r.max_tokens for r in tr] == [None] * 3  # a file's outputs are the caps
    capped = TraceTransform(max_tokens=20).apply(tr)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.max_tokens) for r in capped] == [
        (0, 100, 13, 20), (1, 95, 1, 20), (2, 5, 20, 20)]
    assert "max_tokens 20 (longer outputs stop there)" in capped.description
    default = TraceTransform(output_scale=2, max_tokens=0).apply(tr)
    assert [(r.output_tokens, r.max_tokens) for r in default] == [(26, 0), (2, 0), (80, 0)]
    assert "max_tokens vLLM's default (max_model_len less the prompt)" in default.description
    for bad in (-1, 2_000_000):
        with pytest.raises(PpasError, match="max_tokens must be 0 .* or an integer in"):
            TraceTransform(max_tokens=bad)


def test_drop_longer_than_counts_and_reports() -> None:
    tr = Trace((RequestSpec(0, 100, 10), RequestSpec(1, 95, 10), RequestSpec(2, 5, 1)), 2, "t")
    out = TraceTransform(drop_longer_than=105).apply(tr)
    assert [r.prompt_tokens for r in out] == [95, 5]
    assert out.dropped == (("longer than 105 tokens (prompt + output)", 1),)
    assert "dropped 1 longer than 105 tokens" in out.description
    with pytest.raises(PpasError, match="every request of the trace is longer than 3"):
        TraceTransform(drop_longer_than=3).apply(tr)
    # drops add up: the reader's, then the transformation's
    both = TraceTransform(drop_longer_than=1000).apply(load_trace(BURSTGPT))
    assert [n for _, n in both.dropped] == [3, 6]


@pytest.mark.parametrize("text", ["10", "a:5", "-1:5", "0:0", "0:inf", ""])
def test_bad_window(text: str) -> None:
    with pytest.raises(PpasError, match="expected START:DURATION"):
        parse_window(text)


# --- the command line -------------------------------------------------------------------

SIM = ["simulate", "--hardware", "h100-sxm-80gb", "--model", "qwen3-8b", "--configs", "mbt:2048"]


def test_simulate_prints_and_records_every_transformation_and_drop(
        capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--trace", str(BURSTGPT), "--window", "0:500", "--time-scale", "0.5",
             "--length-scale", "0.5", "--drop-longer-than", "700"]
    rc, out, _ = run_cli([*SIM, *flags], capsys)
    assert rc == 0
    header = out.splitlines()[0]
    for words in ("(burstgpt format)", "dropped 3 with 0 prompt or output tokens",
                  "window 0:500 s (applied before rescaling)", "arrival times x0.5",
                  "lengths x0.5", "excluded 4 outside the window 0:500 s",
                  "dropped 3 longer than 700 tokens", "10 requests (6 dropped, 4 excluded "
                  "by the window)"):
        assert words in header
    rc, out, _ = run_cli([*SIM, *flags, "--json"], capsys)
    rec = json.loads(out)[0]
    assert rec["trace"] == header.removeprefix("trace: ").rsplit(", 10 requests", 1)[0]
    assert rec["trace_dropped"] == {"with 0 prompt or output tokens (failed requests)": 3,
                                    "longer than 700 tokens (prompt + output)": 3}
    assert rec["trace_excluded"] == 4
    assert rec["num_requests"] == 17 - 4 - 3


def test_simulate_cluster_takes_the_trace_flags(capsys: pytest.CaptureFixture[str]) -> None:
    cluster = Path(__file__).parent.parent / "examples" / "cluster-colocated.toml"
    rc, out, err = run_cli(["simulate", "--cluster", str(cluster), "--trace", str(AZURE),
                            "--length-scale", "0.1", "--json"], capsys)
    assert rc == 0, err
    rec = json.loads(out)[0]
    assert "(azure format); lengths x0.1" in rec["trace"] and rec["trace_dropped"] == {}


@pytest.mark.parametrize(("flags", "wanted"), [
    (["--trace-format", "sharegpt"], "argument --trace-format: invalid choice: 'sharegpt'"),
    (["--time-scale", "2", "--rate", "1"], "argument --rate: not allowed with argument"),
    (["--window", "5"], "argument --window: bad window '5'; expected START:DURATION"),
    (["--length-scale", "0"], "argument --length-scale: must be a number in (0, 100]"),
    (["--trace-format", "mooncake"], "mooncake traces are JSONL files"),
    (["--window", "9999:10"], "window 9999:10 s holds no request"),
])
def test_simulate_bad_trace_flag_is_one_line_exit_2(
        capsys: pytest.CaptureFixture[str], flags: list[str], wanted: str) -> None:
    rc, out, err = run_cli([*SIM, "--trace", str(AZURE), *flags], capsys)
    assert rc == 2 and out == ""
    assert wanted in err and "Traceback" not in err
    assert len(err.strip().splitlines()) in (1, 2)  # argparse adds its usage line


def test_trace_flags_without_a_trace(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli([*SIM, "--rate", "2", "--window", "0:10"], capsys)
    assert rc == 2
    assert err.strip() == "ppas simulate: error: --window, --rate apply to --trace only"


def test_bench_replays_the_same_transformed_trace() -> None:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--base-url", "http://127.0.0.1:1", "--model", "m", "--trace",
                         str(AZURE), "--rate", "4", "--length-scale", "0.25"])
    tr = bench.trace_from_args(args)
    assert "(azure format); rate 4 req/s" in tr.description and "lengths x0.25" in tr.description
    assert len(tr) / tr.duration_s == pytest.approx(4.0)
    with pytest.raises(PpasError, match="--time-scale applies to --trace only"):
        bench.trace_from_args(p.parse_args(["--base-url", "http://x", "--model", "m",
                                            "--time-scale", "2"]))


def test_experiment_trace_workload_takes_format_and_transformations() -> None:
    w = WorkloadSpec.parse({"kind": "trace", "file": str(BURSTGPT), "format": "burstgpt",
                            "window": "100:400", "rate": 0.05, "drop_longer_than": 3000})
    tr = w.trace(0.0, 0)
    assert "window 100:400 s" in tr.description and "rate 0.05 req/s" in tr.description
    assert dict(tr.dropped)["longer than 3000 tokens (prompt + output)"] == 1
    # the rate is the window's (12 requests in 400 s), rescaled before the length filter
    assert (len(tr) + 1) / tr.duration_s == pytest.approx(0.05)
    with pytest.raises(PpasError, match=r"workload\.window: bad window 'x'"):
        WorkloadSpec.parse({"kind": "trace", "file": str(BURSTGPT), "window": "x"})
    with pytest.raises(PpasError, match=r"workload\.format: must be one of"):
        WorkloadSpec.parse({"kind": "trace", "file": str(BURSTGPT), "format": "csv"})
    with pytest.raises(PpasError, match="time scale or a rate, not both"):
        WorkloadSpec.parse({"kind": "trace", "file": str(BURSTGPT), "rate": 1,
                            "time_scale": 2})
    with pytest.raises(PpasError, match=r"workload\.rate: applies to kind = \"trace\" only"):
        WorkloadSpec.parse({"kind": "gamma", "request_rates": [1.0], "rate": 1})
