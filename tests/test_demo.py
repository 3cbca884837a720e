"""``ppas demo`` plumbing offline: fake servers stand in for ``vllm serve`` (streams from
``test_bench.FakeServer``, step logs timed by a known cost model), so the records, the
calibration, the simulated errors, the files and the table are checked without vLLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_bench import FakeServer
from test_calibrate import TRUE, synthetic_log

import ppas.server
from ppas.cli import main
from ppas.demo import DemoSettings, format_demo_table
from ppas.errors import PpasError


class FakeVllmServer:
    """``VllmServer``'s interface; records how it was started, writes a step log on exit."""

    started: list[tuple[str | None, int]] = []

    def __init__(self, model_dir: str, *, policy: str | None, max_num_batched_tokens: int,
                 step_log: Path, **kwargs: Any) -> None:
        self.fake = FakeServer(model=model_dir)
        self.step_log = step_log
        FakeVllmServer.started.append((policy, max_num_batched_tokens))

    def __enter__(self) -> FakeVllmServer:
        self.base_url = self.fake.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.fake.__exit__(*exc)
        synthetic_log(self.step_log, TRUE, steps=50, seed=len(FakeVllmServer.started))


def test_demo_runs_every_config_and_burst(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 5000,
                                                   "max_position_embeddings": 4096}))
    monkeypatch.setattr(ppas.server, "VllmServer", FakeVllmServer)
    FakeVllmServer.started = []
    out = tmp_path / "demo"
    rc = main(["demo", "--model-dir", str(model), "--out-dir", str(out), "--phases",
               "1:2,1:{burst}", "--burst-rates", "1,4", "--prompt-tokens", "140",
               "--output-tokens", "3", "--small-budget", "64", "--large-budget", "512",
               "--max-num-seqs", "64"])
    assert rc == 0
    assert FakeVllmServer.started == [("mbt:64", 64), ("mbt:512", 512),
                                      ("ppas:n_th=2,b_max=512,b_cap=64", 512)]
    text = capsys.readouterr().out
    assert "burst 1: best fixed budget mbt:" in text and "burst 4: best fixed budget" in text
    records = json.loads((out / "demo.json").read_text())
    assert len(records) == 6
    for r in records:
        assert r["failed"] == 0 and r["completed"] > 0
        assert r["sim_avg_latency"] > 0
        assert r["sim_error"] == pytest.approx((r["sim_avg_latency"] - r["avg_latency"])
                                               / r["avg_latency"])
    assert (out / "cost.json").is_file() and (out / "demo.png").stat().st_size > 0
    assert len(list(out.glob("bench-*.json"))) == 6


def test_demo_settings_are_validated(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(PpasError, match="small-budget < --large-budget"):
        DemoSettings("m", "o", small_budget=4096, large_budget=2048)
    with pytest.raises(PpasError, match="max_num_seqs <= max_num_batched_tokens"):
        DemoSettings("m", "o", small_budget=64, max_num_seqs=128)
    assert main(["demo", "--model-dir", str(tmp_path), "--out-dir", str(tmp_path / "o")]) == 2
    assert "missing config.json" in capsys.readouterr().err
    assert main(["demo", "--model-dir", str(tmp_path), "--burst-rates", "x"]) == 2
    assert "--burst-rates: " in capsys.readouterr().err


def test_demo_table_names_the_winner_per_burst() -> None:
    def rec(cfg: str, b: float, e2e: float) -> dict[str, Any]:
        return {"config": cfg, "burst_rate": b, "avg_latency": e2e, "p95_latency": e2e,
                "avg_ttft": 0.1, "avg_tpot": 0.01, "makespan": 10.0, "failed": 0,
                "sim_avg_latency": e2e * 1.1, "sim_error": 0.1}
    table = format_demo_table([rec("mbt:256", 1, 0.5), rec("mbt:2048", 1, 0.4),
                               rec("ppas:x", 1, 0.41), rec("mbt:256", 3, 0.9),
                               rec("mbt:2048", 3, 1.2), rec("ppas:x", 3, 0.85)])
    assert "burst 1: best fixed budget mbt:2048 (0.400 s)" in table
    assert "burst 3: best fixed budget mbt:256 (0.900 s)" in table
    assert "+10.0%" in table
