"""``ppas calibrate`` and ``FittedCostModel``: recover known coefficients from a synthetic
step log in the plugin's format; reject malformed logs and model files with one line."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest

from ppas.calibrate.fit import read_steps, sample
from ppas.cli import main
from ppas.core.errors import PpasError
from ppas.cost import make_cost_model
from ppas.cost.base import StepShape, largest_chunk_within
from ppas.cost.fitted import COEFFICIENTS, FittedCostModel, fit, nnls

TRUE = FittedCostModel(overhead_s=0.004, per_prefill_token_s=2.5e-5, per_attn_pair_s=3e-10,
                       per_decode_s=1.2e-4, per_decode_ctx_token_s=4e-8,
                       per_prefill_req_s=1.5e-4, eager_s=1.2e-3)


def synthetic_log(path: Path, model: FittedCostModel, steps: int = 400, seed: int = 0,
                  noise: float = 0.0, decodes: bool = True, max_chunk: int = 2048) -> None:
    """Steps shaped like a chunked-prefill server's (``ppas.vllm`` keys), timed by ``model``
    times (1 + uniform noise)."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(steps):
            chunks = [[rng.randint(1, max_chunk), rng.choice([0, rng.randint(0, 24000)])]
                      for _ in range(rng.choice([0, 0, 1, 1, 2]))]
            ctx = [rng.randint(100, 26000) for _ in range(rng.randint(0, 12) if decodes else 0)]
            if not chunks and not ctx:
                ctx = [rng.randint(100, 26000)] if decodes else []
                chunks = [] if decodes else [[rng.randint(1, max_chunk), 0]]
            t = model.step_time(StepShape.of([(c, p) for c, p in chunks], ctx))
            t *= 1 + rng.uniform(-noise, noise)
            p_tokens = sum(c for c, _ in chunks)
            f.write(json.dumps({
                "step": i + 1, "time": 100.0 + i, "duration_s": t, "interval_s": t,
                "pending_prefills": len(chunks), "running_decodes": len(ctx),
                "prefill_budget": 2048, "num_prefill_tokens": p_tokens,
                "num_decode_tokens": len(ctx), "num_prefill_reqs": len(chunks),
                "num_decode_reqs": len(ctx), "prefill_chunks": chunks, "decode_contexts": ctx,
            }) + "\n")


def read_step_log(path: Path) -> list[tuple[StepShape, float]]:
    """The log's steps as the fit takes them."""
    return [sample(s) for s in read_steps(path)]


def test_fit_recovers_known_coefficients(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    synthetic_log(log, TRUE)
    model = fit(read_step_log(log))
    for name in COEFFICIENTS:
        assert getattr(model, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    assert model.stats is not None
    assert model.stats.mape < 1e-6 and model.stats.r2 > 1 - 1e-9
    assert model.stats.num_steps == 400 and model.stats.unfitted == ()


def test_fit_with_noise_is_close_and_sums_match(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    synthetic_log(log, TRUE, steps=2000, seed=1, noise=0.05)
    records = read_step_log(log)
    model = fit(records)
    # Decode terms (< 1 ms a step) drown in +-5% noise on 50 ms prefill steps; the
    # dominant terms must come back.
    for name in ("overhead_s", "per_prefill_token_s", "per_attn_pair_s"):
        assert getattr(model, name) == pytest.approx(getattr(TRUE, name), rel=0.1), name
    assert model.stats is not None
    assert 0.01 < model.stats.mape < 0.05  # the noise is uniform +-5%: mean |err| ~ 2.5%
    assert abs(model.stats.total_error) < 0.01  # least squares with an intercept


def test_unexercised_features_stay_zero(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    synthetic_log(log, TRUE, steps=100, decodes=False)
    model = fit(read_step_log(log))
    assert model.per_decode_s == model.per_decode_ctx_token_s == 0.0
    assert model.stats is not None
    assert model.stats.unfitted == ("per_decode_s", "per_decode_ctx_token_s")
    assert model.per_prefill_token_s == pytest.approx(TRUE.per_prefill_token_s, rel=1e-6)


def test_host_overhead_terms_are_fitted_only_where_the_log_identifies_them(
        tmp_path: Path) -> None:
    """Eager launch (steps above the CUDA-graph capture size) and per-chunk host cost: a
    log with steps on both sides of 512 tokens and several chunks per step recovers them;
    one whose steps all run as graphs leaves the eager cost unfitted (0), not guessed."""
    both, graphs = tmp_path / "both.jsonl", tmp_path / "graphs.jsonl"
    synthetic_log(both, TRUE)
    model = fit(read_step_log(both))
    assert model.eager_s == pytest.approx(TRUE.eager_s, rel=1e-6)
    assert model.per_prefill_req_s == pytest.approx(TRUE.per_prefill_req_s, rel=1e-6)
    synthetic_log(graphs, TRUE, max_chunk=250)  # 2 chunks + 12 decodes <= 512
    small = fit(read_step_log(graphs))
    assert small.stats is not None and "eager_s" in small.stats.unfitted
    assert small.eager_s == 0.0
    assert small.per_prefill_req_s == pytest.approx(TRUE.per_prefill_req_s, rel=1e-6)
    # The capture size is the model's: the same steps priced eagerly above it only.
    step = StepShape.of([(600, 0)], [])
    assert model.step_time(step) - dataclasses.replace(
        model, cudagraph_max_tokens=1024).step_time(step) == pytest.approx(TRUE.eager_s)


def test_model_file_without_the_host_terms_loads_them_as_zero(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": "ppas-fitted-cost-model/1", "coefficients": {
        n: 1e-3 if n == "overhead_s" else 0.0 for n in COEFFICIENTS[:5]}}))
    m = FittedCostModel.from_file(path)
    assert m.eager_s == m.per_prefill_req_s == 0.0 and m.cudagraph_max_tokens == 512
    back = tmp_path / "new.json"
    TRUE.to_file(back)
    assert FittedCostModel.from_file(back) == TRUE


@pytest.mark.parametrize("seed", range(20))
def test_nnls_meets_kkt_conditions(seed: int) -> None:
    """x >= 0; where x > 0 the gradient vanishes, where x = 0 it points outward."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(30, 5)) * np.array([1, 1e3, 1e-6, 10, 1e9])
    b = rng.normal(size=30)
    x = nnls(a, b)
    assert (x >= 0).all()
    g = (a.T @ (b - a @ x)) * np.linalg.norm(a, axis=0) ** -1  # per unit-norm column
    scale = np.linalg.norm(b)
    assert (g <= 1e-9 * scale).all()
    assert np.allclose(g[x > 0], 0, atol=1e-9 * scale)
    unconstrained = np.linalg.lstsq(a, b, rcond=None)[0]
    if (unconstrained >= 0).all():  # compare per unit-norm column, as the solver works
        norms = np.linalg.norm(a, axis=0)
        assert np.allclose(x * norms, unconstrained * norms, atol=1e-9 * scale)


def test_cli_writes_loadable_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    synthetic_log(logs[0], TRUE, steps=60, seed=2)
    synthetic_log(logs[1], TRUE, steps=60, seed=3)
    out = tmp_path / "sub" / "cost.json"
    assert main(["calibrate", *map(str, logs), "-o", str(out), "--skip-steps", "10"]) == 0
    text = capsys.readouterr().out
    assert "fit on 100 steps: MAPE 0.0%" in text and "decode-only steps" in text
    model = FittedCostModel.from_file(out)
    assert model == make_cost_model(f"fitted:{out}")
    assert model.overhead_s == pytest.approx(TRUE.overhead_s, rel=1e-6)
    assert model.sources == tuple(map(str, logs))
    assert not list(out.parent.glob(".cost.json.*"))  # no temporary file left behind


def test_round_trip_and_monotone_search(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    m = FittedCostModel(0.01, 1e-5, 1e-9, 1e-4, 1e-8, kv_capacity_tokens=50000)
    m.to_file(path)
    back = FittedCostModel.from_file(path)
    assert back == m and back.kv_capacity_tokens == 50000
    step = StepShape.of([(512, 1000)], [2000, 3000])
    assert back.step_time(step) == pytest.approx(
        0.01 + 512e-5 + 1e-9 * 512 * (1000 + 513 / 2) + 2e-4 + 5000e-8)
    c = largest_chunk_within(back, 0.05, num_decodes=4, c_max=16384)
    assert back.step_time(StepShape.of([(c, 0)], [0] * 4)) <= 0.05
    assert back.step_time(StepShape.of([(c + 1, 0)], [0] * 4)) > 0.05


@pytest.mark.parametrize("line,why", [
    ("{not json", "invalid JSON"),
    ('{"duration_s": 0.1, "prefill_chunks": []}', "lacks decode_contexts"),
    ('{"duration_s": -1, "prefill_chunks": [], "decode_contexts": []}', "duration_s must"),
    ('{"duration_s": 0.1, "prefill_chunks": [[5]], "decode_contexts": []}', "prefill_chunks"),
    ('{"duration_s": 0.1, "prefill_chunks": [], "decode_contexts": [1.5]}', "decode_contexts"),
    ("[1, 2]", "expected a JSON object"),
])
def test_malformed_log_names_file_and_line(tmp_path: Path, line: str, why: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "bad.jsonl"
    synthetic_log(log, TRUE, steps=3)
    with open(log, "a") as f:
        f.write("\n" + line + "\n")
    assert main(["calibrate", str(log), "-o", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{log}:5: " in err and why in err
    assert not (tmp_path / "c.json").exists()


def test_calibrate_input_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", str(tmp_path / "none.jsonl"), "-o", str(tmp_path / "c")]) == 2
    assert "does not exist" in capsys.readouterr().err
    log = tmp_path / "empty.jsonl"
    log.write_text("")
    assert main(["calibrate", str(log), "-o", str(tmp_path / "c")]) == 2
    assert "no steps to fit" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def light_log(path: Path, seed: int = 0) -> None:
    """A light run's log (issue 10: 176 steps, 11 requests, rarely more than one decode per
    step): each prefill step carries the previous request's decode, so only the very first
    step has none; the per-decode cost is then the per-step overhead's own feature but for
    a handful of steps, and their timing noise decides the split."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(176):
            chunks = [[rng.randint(1500, 2048), 0]] if i % 16 == 0 else []
            ctx = [] if i == 0 else [2000 + i % 16] * (2 if i % 50 == 7 else 1)
            t = TRUE.step_time(StepShape.of([(c, p) for c, p in chunks], ctx))
            t *= (0.5 if i == 0 else 1.0) + rng.uniform(-0.03, 0.03)  # a fast first step
            f.write(json.dumps({"duration_s": t, "prefill_chunks": chunks,
                                "decode_contexts": ctx}) + "\n")


def test_light_log_fits_what_it_can_and_names_the_rest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "light.jsonl"
    light_log(log)
    out = tmp_path / "cost.json"
    assert main(["calibrate", str(log), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    model = FittedCostModel.from_file(out)
    assert model.stats is not None and model.stats.unidentified
    assert "not identifiable from this log" in text
    for name in model.stats.unidentified:
        assert name in text and getattr(model, name) == 0.0
    assert model.overhead_s > 0
    # What the log does pin down is still reproduced: summed step time and decode steps.
    assert abs(model.stats.total_error) < 0.01
    decode = StepShape.of([], [2005])
    assert model.step_time(decode) == pytest.approx(TRUE.step_time(decode), rel=0.05)


def test_short_log_fits_the_overhead_only(tmp_path: Path) -> None:
    log = tmp_path / "short.jsonl"
    synthetic_log(log, TRUE, steps=1)
    model = fit(read_step_log(log))
    assert model.overhead_s > 0 and model.stats is not None
    assert model.stats.mape < 1e-9  # one step: the overhead alone reproduces it
    assert set(model.stats.unidentified) | set(model.stats.unfitted) == set(COEFFICIENTS[1:])


@pytest.mark.parametrize("content,why", [
    (None, "does not exist"),
    ("{", "invalid JSON"),
    ('{"format": "other"}', "not a fitted cost model"),
    ('{"format": "ppas-fitted-cost-model/1", "coefficients": {"overhead_s": 1}}',
     "must give overhead_s, per_prefill_token_s"),
    ('{"format": "ppas-fitted-cost-model/1", "coefficients": {"overhead_s": 0.1, '
     '"per_prefill_token_s": -1, "per_attn_pair_s": 0, "per_decode_s": 0, '
     '"per_decode_ctx_token_s": 0}}', "per_prefill_token_s must be a finite number >= 0"),
    ('{"format": "ppas-fitted-cost-model/1", "coefficients": {"overhead_s": "x", '
     '"per_prefill_token_s": 0, "per_attn_pair_s": 0, "per_decode_s": 0, '
     '"per_decode_ctx_token_s": 0}}', "overhead_s must be a number"),
])
def test_bad_model_file_is_one_line_error(tmp_path: Path, content: str | None,
                                          why: str) -> None:
    path = tmp_path / "cost.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(PpasError, match=why) as e:
        make_cost_model(f"fitted:{path}")
    assert "\n" not in str(e.value)


def test_fit_and_save_writes_what_it_returns(tmp_path: Path) -> None:
    from ppas.calibrate.fit import fit_and_save

    log, out = tmp_path / "steps.jsonl", tmp_path / "cost.json"
    synthetic_log(log, TRUE, steps=50)
    model = fit_and_save(read_steps(log), out, sources=[str(log)], kv_capacity_tokens=1000)
    assert FittedCostModel.from_file(out) == model
    assert model.sources == (str(log),) and model.kv_capacity_tokens == 1000
