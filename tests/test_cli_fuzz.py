"""Random argument vectors for every ``ppas`` command, run in-process (issue 11).

Each example runs in a fresh folder holding some inputs (a good and a bad step log, trace
files, a fitted model, a model folder, a plain file where a folder is expected). Whatever the
arguments, the command must: raise nothing but argparse's SystemExit, print no traceback,
exit 0, 1 (``NO_SUCCESS``: a run that completed no request) or 2 (bad input, one line on
stderr), leave every input byte for byte as it was, and leave no temporary file or staging
folder behind. ``ppas bench`` talks to an in-test fake server (or a closed port);
make-tiny-model gets a stub for the weights and ``ppas experiment`` runs with --dry-run (their
argument handling and output folders are what is fuzzed here).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_bench import FILLER, PROMPT, SEED, VOCAB, FakeServer
from test_calibrate import TRUE, synthetic_log

from ppas.cli import main
from ppas.core.errors import NO_SUCCESS

INTS = ["0", "1", "2", "-1", "1e9", "99999999999999999999", "x", "", "nan", "1.5"]
FLOATS = ["0", "0.5", "1", "-1", "1e9", "inf", "nan", "x", "1e-9", ""]
PATHS_OUT = ["out.json", "steps.jsonl", "dir", "file/x.json", "/sys/ppas/x.json", "new/x.json",
             "trace.csv"]

COST = {
    "--hardware": ["rtx5090", "h100-sxm-80gb", "nope", ""],
    "--model": ["qwen2.5-3b", "qwen2.5-0.5b", "gpt"],
    "--cost-model": ["roofline", "fitted:cost.json", "fitted:bad.json", "fitted:none.json",
                     "magic"],
    "--tp": ["1", "8", "0", "1e9", "x"],
    "--max-num-seqs": ["1", "4", "0", "1e12", "x"],
    "--num-kv-blocks": ["1", "2000", "0", "x"],
    "--max-model-len": ["100", "30000", "0", "x"],
    "--prompt-tokens": ["300", "2000", "40000", "0", "1e12", "-5", "x"],
    "--output-tokens": ["1", "4", "0", "1e12", "x"],
    "--configs": ["mbt:2048", "mbt:2048,ppas", "ppas:b_cap=0", "mbt:10000000", "fast", ""],
}
SIMULATE = {
    **COST,
    "--phases": ["5:{burst}", "1:0", "10:x", "{burst}", "1e300:1", "5:1,5:{burst}"],
    "--burst-rate": FLOATS,
    "--seed": INTS,
    "--trace": ["trace.csv", "bom.csv", "huge.jsonl", "bad.jsonl", "none.csv", "dir"],
    "--request-rate": ["inf", "20", "0", "-1", "nan", "1e9"],
    "--num-prompts": ["3", "0", "1e9", "x"],
    "--burstiness": FLOATS,
}
SWEEP = {
    **COST,
    "--burst-rates": ["2", "1,3", "1e9", "-1", "x", "", "2,2"],
    "--seeds": ["0", "0,1", "-1", "99999999999", "x", "0,0"],
    "--phases": ["5:{burst}", "5:1", "1e300:{burst}", "x:{burst}"],
    "--plot": ["p.png", "p.bmp", "dir", "new/p.png", "file/p.png", "/sys/ppas/p.png"],
    "--out-dir": ["od", "dir", "file", "file/sub", "/sys/ppas"],
}
BENCH = {
    "--model": ["fake", "other"],
    "--request-rate": ["inf", "100", "0", "nan", "1e9"],
    "--num-prompts": ["2", "0", "1e9", "x"],
    "--burstiness": FLOATS,
    "--phases": ["1:0"],
    "--trace": ["trace.csv", "bad.jsonl"],
    "--seed": INTS,
    "--prompt-seed": INTS,
    "--prompt-tokens": [str(PROMPT), "0", "1e12", "x"],
    "--output-tokens": ["2", "0", "1e12"],
    "--prompt-format": ["tokens", "text", "bytes"],
    "--vocab-size": [str(VOCAB), "100", "0", "1e12"],
    "--filler-token": [str(FILLER), "99999", "-1"],
    "--request-timeout": ["0.001", "30", "0", "-1", "inf"],
    "--max-concurrency": ["1", "0", "x"],
    "--num-warmups": ["1", "0", "1001", "-1"],
    "--stream-usage": ["continuous", "final", "off", "x"],
    "--goodput": ["ttft:500", "ttft:-1", "xyz:5", "ttft"],
    "--percentile-metrics": ["ttft,e2el", "foo", ""],
    "--metric-percentiles": ["50,99", "101", "x"],
    "--result-dir": ["res", "dir", "file", "/sys/ppas", "file/sub"],
    "--result-filename": ["r.json", "trace.csv", "a/b.json", "dir", ""],
}
BENCH_FLAGS = ("--save-result", "--json")
CALIBRATE = {
    "--skip-steps": ["0", "3", "-1", "1e20", "x"],
    "--kv-capacity-tokens": ["1000", "0", "1e20", "x"],
}
TINY = {
    "--hidden-size": ["64", "0", "1e9", "x"],
    "--num-heads": ["2", "3", "0"],
    "--num-kv-heads": ["1", "2", "0"],
    "--vocab-size": ["300", "10", "1e12"],
    "--seed": INTS,
}


def make_inputs(d: Path) -> None:
    synthetic_log(d / "steps.jsonl", TRUE, steps=30)
    with open(d / "truncated.jsonl", "w") as f:
        f.write((d / "steps.jsonl").read_text() + '{"step": 31, "dur')
    (d / "bad.jsonl").write_text('{"arrival_s": "x"}\n')
    (d / "trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,140,2\n0.01,140,2\n")
    (d / "bom.csv").write_bytes(b"\xef\xbb\xbf" + (d / "trace.csv").read_bytes())
    (d / "huge.jsonl").write_text('{"arrival_s": 1e308, "prompt_tokens": 1e20, '
                                  '"output_tokens": 2}\n')
    TRUE.to_file(d / "cost.json")
    (d / "bad.json").write_text('{"format": "ppas-fitted-cost-model/1", "sources": 5}')
    (d / "dir").mkdir()
    (d / "file").write_text("not a folder")
    (d / "model").mkdir()
    (d / "model" / "config.json").write_text(json.dumps(
        {"vocab_size": 4096, "max_position_embeddings": 8192}))


def snapshot(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def extras(options: dict[str, list[str]],
           flags: tuple[str, ...] = ("--json",)) -> st.SearchStrategy[list[str]]:
    """Up to four ``--flag value`` pairs (or bare flags) drawn from ``options``."""
    pair = st.sampled_from(sorted(options)).flatmap(
        lambda k: st.sampled_from(options[k]).map(lambda v: [k, v]))
    parts = st.lists(st.one_of(pair, st.sampled_from(flags).map(lambda f: [f])), max_size=4)
    return parts.map(lambda ps: [x for p in ps for x in p])


def argv_strategy(base: list[str], options: dict[str, list[str]],
                  flags: tuple[str, ...] = ("--json",)) -> st.SearchStrategy[list[str]]:
    return extras(options, flags).map(lambda e: base + e)


@contextlib.contextmanager
def in_fresh_folder() -> Iterator[Path]:
    old = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="ppas-fuzz-") as t:
        d = Path(t)
        make_inputs(d)
        os.chdir(d)
        try:
            yield d
        finally:
            os.chdir(old)


def named_outputs(argv: list[str]) -> set[str]:
    """Files the user named as outputs: the only existing files a command may replace."""
    def last(flag: str) -> str | None:
        vals = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
        return vals[-1] if vals else None

    out = {v for v in (last("-o"), last("--plot")) if v}
    if last("--result-filename"):
        out.add(os.path.normpath(os.path.join(last("--result-dir") or ".",
                                              last("--result-filename") or "")))
    return out


def check(argv: list[str]) -> None:
    """Run one argument vector and assert the contract (see the module doc)."""
    with in_fresh_folder() as d:
        before = snapshot(d)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as e:  # argparse: usage line + one error line
                rc = int(e.code or 0)
        text = err.getvalue()
        assert "Traceback" not in text, (argv, text)
        assert rc in (0, NO_SUCCESS, 2), (argv, rc, text)
        if rc == 2:
            last = text.strip().splitlines()[-1]
            assert last.startswith("ppas") and ": error:" in last, (argv, text)
        after = snapshot(d)
        changed = [k for k, v in before.items() if after.get(k) != v]
        out_flags = ("-o", "--plot", "--result-filename")
        inputs = {a for i, a in enumerate(argv) if a in before and argv[i - 1] not in out_flags}
        allowed = named_outputs(argv) - inputs  # an input is never overwritten, even if named
        assert set(changed) <= allowed, (argv, "an input changed", changed)
        stray = [p for p in d.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]
        assert not stray, (argv, stray)


FUZZ = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(argv_strategy(["simulate", "--hardware", "rtx5090", "--model", "qwen2.5-3b",
                      "--configs", "mbt:2048", "--phases", "5:{burst}"], SIMULATE))
@example(["simulate", "--hardware", "rtx5090", "--model", "qwen2.5-3b", "--phases", "1:0"])
@example(["simulate", "--hardware", "rtx5090", "--model", "qwen2.5-3b", "--request-rate", "1",
          "--burstiness", "inf"])
@example(["simulate", "--cost-model", "fitted:bad.json"])
@example(["simulate", "--hardware", "rtx5090", "--model", "qwen2.5-3b", "--trace", "huge.jsonl"])
def test_fuzz_simulate(argv: list[str]) -> None:
    check(argv)


@FUZZ
@given(argv_strategy(["sweep", "--hardware", "rtx5090", "--model", "qwen2.5-3b", "--configs",
                      "mbt:2048", "--burst-rates", "2", "--seeds", "0", "--phases",
                      "5:{burst}"], SWEEP))
@example(["sweep", "--hardware", "rtx5090", "--model", "qwen2.5-3b", "--burst-rates", "1e9"])
@example(["sweep", "--hardware", "rtx5090", "--model", "qwen2.5-3b", "--burst-rates", "2",
          "--seeds", "0", "--phases", "5:{burst}", "--plot", "dir"])
@example(["sweep", "--hardware", "rtx5090", "--model", "qwen2.5-3b", "--burst-rates", "2",
          "--seeds", "0", "--phases", "5:{burst}", "--out-dir", "file/sub"])
def test_fuzz_sweep(argv: list[str]) -> None:
    check(argv)


@settings(FUZZ, max_examples=60)
@given(st.lists(st.sampled_from(["steps.jsonl", "truncated.jsonl", "bad.jsonl", "none.jsonl",
                                 "cost.json", "dir"]), min_size=1, max_size=2),
       st.sampled_from(PATHS_OUT), extras(CALIBRATE))
@example(["steps.jsonl"], "steps.jsonl", [])  # issue 11: the step log was overwritten
@example(["truncated.jsonl", "steps.jsonl"], "./truncated.jsonl", ["--json"])
def test_fuzz_calibrate(logs: list[str], out: str, extra: list[str]) -> None:
    check(["calibrate", *logs, "-o", out, *extra])


@pytest.fixture(scope="module")
def fake_server() -> Iterator[str]:
    with FakeServer(n=4) as base:
        yield base


@pytest.fixture(scope="module")
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@settings(FUZZ, max_examples=40,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_bench(fake_server: str, closed_port: int, data: st.DataObject) -> None:
    url = data.draw(st.sampled_from([fake_server, fake_server + "/v1",
                                     f"http://127.0.0.1:{closed_port}",
                                     "http://127.0.0.1:99999", "ftp://x", "localhost:1"]))
    base = ["bench", "--base-url", url, "--model", "fake", "--request-rate", "inf",
            "--num-prompts", "2", "--prompt-tokens", str(PROMPT), "--output-tokens", "2",
            "--seed", str(SEED), "--vocab-size", str(VOCAB), "--filler-token", str(FILLER),
            "--disable-tqdm"]
    check(data.draw(argv_strategy(base, BENCH, BENCH_FLAGS)))


@settings(FUZZ,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_make_tiny_model(monkeypatch: pytest.MonkeyPatch, data: st.DataObject) -> None:
    import ppas.live.tiny_model as tm

    def fake_weights(folder: Path, cfg: tm.TinyModelConfig) -> None:  # no torch: seconds each
        (folder / "config.json").write_text(json.dumps({"vocab_size": cfg.vocab_size}))

    monkeypatch.setattr(tm, "write_model_files", fake_weights)
    out = data.draw(st.sampled_from(["m", ".", "dir", "file", "file/m", "/sys/ppas/m", "model",
                                     "new/m", ""]))
    check(data.draw(argv_strategy(["make-tiny-model", out, "--hidden-size", "64",
                                   "--num-heads", "2", "--num-kv-heads", "1", "--vocab-size",
                                   "300"], TINY)))


@settings(FUZZ, max_examples=20)
@given(st.sampled_from([str(Path(__file__).resolve().parent.parent / "experiments" /
                            "demo-cpu.toml"), "trace.csv", "none.toml", "dir"]),
       extras({"--out-dir": ["od", "dir", "file", "file/sub", "/sys/ppas"]},
              ("--dry-run", "--report")))
def test_fuzz_experiment(spec: str, extra: list[str]) -> None:
    """Only what runs without a server: --dry-run and --report (--dry-run always added)."""
    check(["experiment", spec, "--dry-run", *extra])


CLUSTER = {
    "--cluster": [str(Path(__file__).resolve().parent.parent / "examples" / f)
                  for f in ("cluster-colocated.toml", "cluster-disaggregated.toml")]
                 + ["none.toml", "trace.csv"],
    "--instances": ["1,2", "0", "1e9", "x"],
    "--pd-ratios": ["1:1", "0:1", "x"],
    "--duration": ["5", "1e9", "-1", "x"],
    "--request-rate": ["2", "0", "1e9"],
    "--prompt-tokens": ["100", "0", "1e12"],
    "--plot": ["c.png", "dir", "/sys/ppas/c.png"],
    "--trace": ["trace.csv", "huge.jsonl"],
    "--seed": INTS,
}


@settings(FUZZ, max_examples=30)
@given(argv_strategy(["simulate", "--cluster", str(Path(__file__).resolve().parent.parent
                                                   / "examples" / "cluster-colocated.toml"),
                      "--prompt-tokens", "2000"], CLUSTER, ("--mixed", "--json")))
def test_fuzz_simulate_cluster(argv: list[str]) -> None:
    check(argv)


PROFILE = {
    "--step-log": ["steps.jsonl", "new.jsonl", "dir", "file/s.jsonl", "/dev/null"],
    "-o": PATHS_OUT,
    "--repeats": INTS,
    "--decode-tokens": INTS,
    "--vocab-size": INTS,
    "--filler-token": INTS,
    "--seed": INTS,
    "--request-timeout": FLOATS,
    "--kv-capacity-tokens": INTS,
    "--chunk-sizes": ["64", "0", "x", "64,64", ""],
    "--contexts": ["0", "-1", "x"],
}


@settings(FUZZ, max_examples=40,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_profile(closed_port: int, data: st.DataObject) -> None:
    """Issue 23: ``ppas profile``'s flags and paths, against a closed port (every probe
    fails to connect): bounds and paths are refused before any request."""
    url = data.draw(st.sampled_from([f"http://127.0.0.1:{closed_port}", "localhost:1",
                                     "http://u:p@127.0.0.1:99999"]))
    base = ["profile", "--base-url", url, "--model", "m", "--step-log", "steps.jsonl",
            "-o", "c.json", "--contexts", "0", "--chunk-sizes", "64"]
    check(data.draw(argv_strategy(base, PROFILE)))
