"""``ppas experiment`` with a real trace replayed by window (``windows``: seed i = window i)
at loads that are fractions of a prefill capacity probed on the first arm's server
(``capacity_loads``; ``ppas.experiment.probe``): the keys' validation, the plan's predicted
capacity, a whole experiment against fake servers (the probe, the offered load of every
trace, resume without a second probe, the report's probe lines, P99 E2E and its
prediction, the per-arm figure), and the shipped demo file."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from fake_vllm import FakeLauncher
from hypothesis import given, settings
from hypothesis import strategies as st

from ppas.core.errors import PpasError
from ppas.experiment.plan import estimate, plan_text
from ppas.experiment.probe import ProbeResult, probe_path, read_probe, resolved
from ppas.experiment.report import write_report
from ppas.experiment.runner import Runner
from ppas.experiment.spec import Experiment, load_experiment, parse_experiment
from ppas.experiment.traces import WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]
HEAD = ROOT / "tests" / "data" / "traces" / "azure-2023-code-head.csv"
COST = ROOT / "experiments" / "demo-cpu.cost.json"

# The head slice: 12 requests in 0-1.4 s, 8 in 29.5-30.5 s of the trace's clock.
TEXT = f"""\
name = "cap"
out_dir = "{{out}}"
[model]
path = "{{model}}"
[engine]
max_num_seqs = 16
[workload]
kind = "trace"
file = "{HEAD}"
windows = ["0:1.5", "29:2"]
length_scale = 0.1
capacity_loads = [0.5, 1.5]
probe_prompt_tokens = 256
probe_requests = 3
request_timeout_s = 30
[run]
estimate_cost_model = "fitted:{COST}"
[[arms]]
name = "stock"
baseline = true
[arms.stock]
max_num_batched_tokens = 512
[[arms]]
name = "small"
policy = "mbt:64"
"""


def _text(tmp_path: Path, model: Path, old: str = "", new: str = "") -> str:
    text = TEXT.format(out=tmp_path / "out", model=model)
    assert old in text
    return text.replace(old, new, 1)


def test_windows_are_the_seeds(tmp_path: Path, model: Path) -> None:
    exp = parse_experiment(_text(tmp_path, model), "cap")
    w = exp.workload
    assert w.seeds == (0, 1) and w.windows == ((0.0, 1.5), (29.0, 2.0))
    assert [len(w.base_trace(s)) for s in w.seeds] == [12, 8]
    assert exp.cells() == [(0.5, 0), (0.5, 1), (1.5, 0), (1.5, 1)]
    assert w.load_label(1.5) == "cap1.5"
    with pytest.raises(PpasError, match="the traces need the probed capacity"):
        w.trace(0.5, 0)


def test_each_trace_offers_its_fraction_of_the_capacity(tmp_path: Path, model: Path) -> None:
    w = parse_experiment(_text(tmp_path, model), "cap").workload.with_capacity(2000.0)
    for load in w.loads:
        for s in w.seeds:
            base, tr = w.base_trace(s), w.trace(load, s)
            tokens = sum(r.prompt_tokens for r in tr)
            assert tokens == sum(r.prompt_tokens for r in base)  # only the clock changes
            assert tokens / tr.duration_s == pytest.approx(load * 2000.0)
            assert [r.arrival_s for r in tr] == pytest.approx(
                [r.arrival_s * w.time_scale_at(load, s) for r in base])
            assert "of the probed prefill capacity 2000 tokens/s" in tr.description
    # twice the capacity: the same trace twice as fast
    w2 = w.with_capacity(4000.0)
    assert w2.time_scale_at(0.5, 1) == pytest.approx(w.time_scale_at(0.5, 1) / 2)


WORKLOAD = WorkloadSpec.parse({"kind": "trace", "file": str(HEAD), "windows": ["0:1.5", "29:2"],
                               "length_scale": 0.1, "capacity_loads": [0.5, 1.5]})


@settings(max_examples=40, deadline=None)
@given(cap=st.floats(50.0, 1e6), load=st.floats(0.05, 5.0), seed=st.sampled_from([0, 1]))
def test_offered_load_invariant(cap: float, load: float, seed: int) -> None:
    """Any capacity and load: the trace's prompt tokens over its duration are load x
    capacity, its requests and lengths are the window's, in arrival order, scaled by one
    factor; twice the load is the same trace at half the time scale."""
    w = WORKLOAD.with_capacity(cap)
    base, tr = w.base_trace(seed), w.trace(load, seed)
    assert [(r.prompt_tokens, r.output_tokens) for r in tr] == [
        (r.prompt_tokens, r.output_tokens) for r in base]
    assert sum(r.prompt_tokens for r in tr) / tr.duration_s == pytest.approx(load * cap)
    ts = w.time_scale_at(load, seed)
    assert [r.arrival_s for r in tr] == pytest.approx([r.arrival_s * ts for r in base])
    assert w.time_scale_at(2 * load, seed) == pytest.approx(ts / 2)


BAD = [
    ('windows = ["0:1.5", "29:2"]', 'windows = ["0:1.5", "0:1.5"]',
     "workload.windows: must be 1 to 1000 distinct"),
    ('windows = ["0:1.5", "29:2"]', 'windows = ["0:1.5", "29"]', "workload.windows: bad window"),
    ('windows = ["0:1.5", "29:2"]', 'windows = ["0:1.5"]\nseeds = [0]',
     "workload.windows: replaces window and seeds"),
    ('windows = ["0:1.5", "29:2"]', 'windows = ["0:1.5"]\nwindow = "0:3"',
     "workload.windows: replaces window and seeds"),
    ('windows = ["0:1.5", "29:2"]', 'windows = ["100:2"]', "holds no request of the trace"),
    ("capacity_loads = [0.5, 1.5]", "capacity_loads = [0.5, 0]",
     "workload.capacity_loads: must be 1 to 1000 distinct fractions"),
    ("capacity_loads = [0.5, 1.5]", "capacity_loads = [0.5, 0.5]",
     "workload.capacity_loads: must be 1 to 1000 distinct fractions"),
    ("capacity_loads = [0.5, 1.5]", "capacity_loads = [0.5, 1.5]\nrate = 2.0",
     "workload.rate: cannot be given with capacity_loads"),
    ("capacity_loads = [0.5, 1.5]", "capacity_loads = [0.5, 1.5]\nloads = [1.0]",
     "workload.loads: cannot be given with capacity_loads"),
    ("capacity_loads = [0.5, 1.5]", "capacity_loads = [0.5, 1.5]\ntime_scale = 2.0",
     "workload.time_scale: cannot be given with capacity_loads"),
    ("capacity_loads = [0.5, 1.5]\n", "",
     "workload.probe_prompt_tokens: applies with capacity_loads only"),
    ("probe_prompt_tokens = 256", "probe_prompt_tokens = 0",
     "workload.probe_prompt_tokens: must be >= 1"),
    ("probe_requests = 3", "probe_requests = 5000", "workload.probe_requests: must be <="),
    (f'estimate_cost_model = "fitted:{COST}"', "",
     "run.estimate_cost_model: required with workload.capacity_loads"),
    (f'estimate_cost_model = "fitted:{COST}"',
     f'estimate_cost_model = "fitted:{COST}"\ndevices = ["0", "1"]',
     "run.devices: not with workload.capacity_loads"),
]


@pytest.mark.parametrize(("old", "new", "msg"), BAD)
def test_bad_capacity_keys(tmp_path: Path, model: Path, old: str, new: str, msg: str) -> None:
    with pytest.raises(PpasError, match=msg):
        parse_experiment(_text(tmp_path, model, old, new), "cap")


def test_windows_without_capacity_loads(tmp_path: Path, model: Path) -> None:
    """``windows`` alone: each window replayed at its own clock, or at rate multipliers."""
    text = _text(tmp_path, model, "capacity_loads = [0.5, 1.5]\nprobe_prompt_tokens = 256\n"
                 "probe_requests = 3\n", "loads = [1.0, 2.0]\n")
    w = parse_experiment(text, "cap").workload
    assert w.probe is None and w.seeds == (0, 1)
    assert w.trace(2.0, 1).duration_s == pytest.approx(w.trace(1.0, 1).duration_s / 2)
    assert len(w.trace(1.0, 0)) == 12 and len(w.trace(1.0, 1)) == 8


def test_plan_predicts_the_probe(tmp_path: Path, model: Path) -> None:
    exp = parse_experiment(_text(tmp_path, model), "cap")
    est = estimate(exp)
    assert est.capacity_tok_s is not None and 500 < est.capacity_tok_s < 5000
    plan = plan_text(exp, est, set())
    assert "predicted by the simulator with fitted:" in plan
    assert "windows (seed i replays window i): 0:1.5, 29:2" in plan
    assert "8 runs (0 already complete, 8 to run), 2 server start(s)" in plan


def test_capacity_experiment_against_fake_servers(tmp_path: Path, model: Path) -> None:
    p = tmp_path / "exp.toml"
    p.write_text(_text(tmp_path, model))
    exp = load_experiment(p)
    FakeLauncher.started = []
    runner = Runner(exp, FakeLauncher)
    runner.folder.prepare(resume=False)
    runner.run(estimate(exp))
    out = tmp_path / "out"
    res = read_probe(exp)
    assert res is not None and res.arm == "stock" and res.max_num_batched_tokens == 512
    assert len(res.ttft_s) == 3 and res.prompt_tokens == 256
    assert res.capacity_tok_s == pytest.approx(256 / statistics.median(res.ttft_s))
    # the fake engine prefills 256 tokens in 2 ms + 256 * 20 us, plus HTTP
    assert 256 / 0.0071 / 20 < res.capacity_tok_s < 256 / 0.0071 * 1.01
    full = resolved(exp)
    assert full.workload.capacity_tok_s == res.capacity_tok_s
    assert full.settings_hash() == exp.settings_hash()  # the probe is no setting
    runs = {str(f.relative_to(out)): json.loads(f.read_text())
            for f in sorted((out / "runs").rglob("*.json"))}
    assert len(runs) == 8
    for r in runs.values():
        tr = full.workload.trace(r["load"], r["seed"])
        assert r["per_request"]["arrival_s"] == pytest.approx([q.arrival_s for q in tr])
        assert r["trace"] == tr.description and r["summary"]["failed"] == 0
    # resume: a lost run is replayed with the same trace, and the probe does not run again
    before = probe_path(exp).read_bytes()
    lost = out / "runs" / "small" / "cap1.5-s1.json"
    old = json.loads(lost.read_text())
    lost.unlink()
    FakeLauncher.started = []
    again = Runner(load_experiment(p), FakeLauncher)
    again.folder.prepare(resume=True)
    again.run(estimate(exp))
    assert [la.arm.name for la in FakeLauncher.started] == ["small"]
    assert probe_path(exp).read_bytes() == before
    new = json.loads(lost.read_text())
    assert new["per_request"]["arrival_s"] == pytest.approx(old["per_request"]["arrival_s"])
    assert "probed (capacity probe on stock" in plan_text(exp, estimate(exp), set())
    text, rep = write_report(exp)
    assert text.startswith("loads are fractions of the capacity probe on stock (MBT 512): "
                           "3 prompts of 256 tokens")
    assert "arrival-time scale per load/seed" in text and "P99 E2E" in text
    assert "winner per load" in text and rep["load_name"] == "load"
    assert rep["probe"] is not None and len(rep["probe"]["time_scales"]) == 4
    for c in rep["cells"]:
        assert c["e2e_p99"]["estimate"] >= c["avg_latency"]["estimate"]
    assert any(c["sim_e2e_p99"] is not None for c in rep["cells"] if c["arm"] == "small")
    for f in ("report.png", "report-arms.png"):
        assert (out / f).stat().st_size > 0


def test_a_bad_probe_file_is_one_error(tmp_path: Path, model: Path) -> None:
    exp = parse_experiment(_text(tmp_path, model), "cap")
    probe_path(exp).parent.mkdir(parents=True)
    probe_path(exp).write_text("{}")
    with pytest.raises(PpasError, match="not a probe result"):
        read_probe(exp)
    with pytest.raises(PpasError, match="no probe request succeeded"):
        ProbeResult.of("a", 512, 256, [])


def _committed(name: str, tmp_path: Path) -> Experiment:
    """``experiments/NAME.toml`` as committed, its model folder replaced by a stand-in."""
    text = (ROOT / "experiments" / f"{name}.toml").read_text()
    m = tmp_path / "m"
    m.mkdir(exist_ok=True)
    (m / "config.json").write_text(json.dumps({"vocab_size": 151936,
                                               "max_position_embeddings": 4096}))
    return parse_experiment(text.replace('path = ".cache/tiny-qwen2-26m"', f'path = "{m}"'),
                            name)


def test_demo_file_is_valid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``make demo``'s file: three windows, two capacity loads, vLLM's default budget, the
    tuned stock setting and ours, on the committed trace slice; within its time."""
    monkeypatch.chdir(ROOT)  # its paths are relative to the repository root
    exp = _committed("demo-trace", tmp_path)
    w = exp.workload
    assert w.probe is not None and len(w.windows) == 3 and len(w.loads) == 2
    assert [a.name for a in exp.arms] == ["vllm-default", "stock-tuned", "ordered-finish"]
    assert exp.arms[0].stock_dict() == {exp.arms[0].stock[0][0]: 2048}
    est = estimate(exp)
    total = sum(est.runs.values()) + len(exp.arms) * est.startup_s
    assert total < 10 * 60  # the demo's budget is 12 minutes with the report


def test_live_real_traffic_file_is_valid(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20's live comparison: the demo's trace, model and probe, eight windows that
    do not overlap, the tuned stock setting (a baseline) against ``ordered``."""
    monkeypatch.chdir(ROOT)
    exp = _committed("real-traffic-cpu", tmp_path)
    w = exp.workload
    assert w.probe is not None and len(w.windows) == 8 and w.loads == (0.4, 0.9)
    spans = sorted((s, s + d) for s, d in w.windows)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert [(a.name, a.baseline) for a in exp.arms] == [("stock-tuned", True),
                                                        ("ordered", False)]


def test_settings_hash_of_older_files_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workload's new fields (windows, probe, capacity) stay out of the fingerprint
    unless given, so a results folder made before them still resumes: the hash this file
    had at 38ccea1."""
    monkeypatch.chdir(ROOT)
    exp = load_experiment(ROOT / "experiments" / "h100-qwen2.5-3b.toml")
    assert exp.settings_hash() == "25757b9c9bdfb792"
    assert "windows" not in exp.workload.settings_text


def test_windows_and_probe_are_in_the_settings(tmp_path: Path, model: Path) -> None:
    a = parse_experiment(_text(tmp_path, model), "cap")
    b = parse_experiment(_text(tmp_path, model, '"29:2"', '"29:3"'), "cap")
    c = parse_experiment(_text(tmp_path, model, "probe_requests = 3", "probe_requests = 4"),
                         "cap")
    assert len({a.settings_hash(), b.settings_hash(), c.settings_hash()}) == 3
