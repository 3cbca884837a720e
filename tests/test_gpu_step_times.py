"""The GPU step timer (ppas.calibrate.gpu_timer) computes the work of a vLLM step: checked
on CPU against naive attention; the roofline comparison (ppas.calibrate.gpu_steps) on the
saved H200 runs; and the command line of benchmarks/gpu_step_times.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ppas.calibrate import gpu_steps
from ppas.calibrate.gpu_steps import GpuStep, full_steps, load_records, predict, smoke_steps
from ppas.calibrate.gpu_timer import StepTimer
from ppas.core.errors import PpasError

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


def bench(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_step_times.py"),
                           *argv], capture_output=True, text=True, env=env, check=False)


def naive(q, k, v, visible):
    """q [rows, heads, d]; k, v [keys, kv_heads, d]; row i sees keys [0, visible[i])."""
    heads, kvh = q.shape[1], k.shape[1]
    out = torch.empty_like(q)
    for i in range(q.shape[0]):
        for h in range(heads):
            kk = k[: visible[i], h // (heads // kvh)].float()
            vv = v[: visible[i], h // (heads // kvh)].float()
            w = torch.softmax(kk @ q[i, h].float() / math.sqrt(q.shape[-1]), dim=0)
            out[i, h] = (w @ vv).to(q.dtype)
    return out


@pytest.mark.parametrize("chunk,cached", [(5, 0), (4, 9)])
def test_chunk_attends_causally_over_its_cached_context(chunk, cached):
    m = gpu_steps.SMOKE_MODEL
    h = StepTimer(m, "cpu")
    step = GpuStep("t", ((chunk, cached),))
    torch.manual_seed(0)  # build() draws the cached context from the global generator
    st = h.build(step)
    n = chunk
    g = torch.Generator().manual_seed(0)  # fixed inputs: a bf16 tolerance, not a draw, decides
    q = torch.randn(n, m.heads, m.head_dim, dtype=torch.bfloat16, generator=g)
    k = torch.randn(n, m.kv_heads, m.head_dim, dtype=torch.bfloat16, generator=g)
    v = torch.randn(n, m.kv_heads, m.head_dim, dtype=torch.bfloat16, generator=g)
    h.attention(step, st, 0, q, k, v)
    kc, vc = st["caches"][0][0]
    keys, vals = kc[0].transpose(0, 1), vc[0].transpose(0, 1)  # [p + c, kv_heads, d]
    assert torch.equal(keys[cached:], k)  # the step's KV was written after the context
    want = naive(q, keys, vals, [cached + i + 1 for i in range(chunk)])
    got = st["attn"].view(n, m.heads, m.head_dim)
    assert torch.allclose(got.float(), want.float(), atol=2e-2)


@pytest.mark.parametrize("matmul", [False, True])
def test_decodes_attend_over_their_whole_context(matmul):
    m = gpu_steps.SMOKE_MODEL
    h = StepTimer(m, "cpu")
    h.decode_matmul = matmul
    step = GpuStep("t", ((3, 2),), decodes=2, decode_ctx=6)
    torch.manual_seed(0)  # build() draws the cached context from the global generator
    st = h.build(step)
    n = 3 + 2
    g = torch.Generator().manual_seed(0)  # fixed inputs: a bf16 tolerance, not a draw, decides
    q = torch.randn(n, m.heads, m.head_dim, dtype=torch.bfloat16, generator=g)
    k = torch.randn(n, m.kv_heads, m.head_dim, dtype=torch.bfloat16, generator=g)
    v = torch.randn(n, m.kv_heads, m.head_dim, dtype=torch.bfloat16, generator=g)
    h.attention(step, st, 0, q, k, v)
    kc, vc = st["caches"][0][1]
    got = st["attn"].view(n, m.heads, m.head_dim)
    for j in range(2):
        keys, vals = kc[j].transpose(0, 1), vc[j].transpose(0, 1)  # [ctx + 1, kvh, d]
        assert torch.equal(keys[6], k[3 + j])
        want = naive(q[3 + j: 4 + j], keys, vals, [7])
        assert torch.allclose(got[3 + j].float(), want[0].float(), atol=2e-2)


def test_smoke_run_writes_one_line_per_step_and_compares(tmp_path):
    out = tmp_path / "steps.jsonl"
    proc = bench("--smoke", "--out", str(out), "--budget-s", "0.01", "--max-iters", "2")
    assert proc.returncode == 0, proc.stderr
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["step"] for r in recs] == [s.name for s in smoke_steps()]
    assert all(r["measured_all_s"] > 0 and r["measured_gemm_s"] > 0 for r in recs)
    # A saved run of a catalog model is re-judged against the roofline without a GPU.
    for r in recs:
        r["model"] = "qwen2.5-3b"
    saved = tmp_path / "saved.jsonl"
    saved.write_text("".join(json.dumps(r) + "\n" for r in recs))
    proc = bench("--compare", str(saved))
    assert proc.returncode == 0, proc.stderr
    assert "h200 / qwen2.5-3b" in proc.stdout and "median |error|" in proc.stdout


def test_bad_input_is_one_line_exit_2_and_nothing_is_overwritten(tmp_path):
    out = tmp_path / "steps.jsonl"
    out.write_text("keep\n")
    not_steps = tmp_path / "not-steps.jsonl"
    not_steps.write_text('{"model": "qwen2.5-3b"}\n')
    for argv in (["--compare", str(not_steps)], ["--smoke", "--out", str(out)],
                 ["--hardware", "tpu"], ["--models", "gpt-9"], ["--backends", "FA3"],
                 ["--compare", str(tmp_path / "missing.jsonl")]):
        proc = bench(*argv)
        assert proc.returncode == 2
        err = proc.stderr.strip()
        assert err.startswith("gpu_step_times: ") and "\n" not in err
    assert out.read_text() == "keep\n"


@pytest.mark.parametrize("model", ["qwen2.5-0.5b", "qwen3-8b"])
def test_extended_suite_covers_decode_batches_mixed_steps_and_fits_in_memory(model):
    """Issue 21's prepared device check: every kind of step, and no step whose KV caches
    (every layer's, as the timer allocates them) pass the suite's memory bound."""
    steps = gpu_steps.extended_steps(model)
    kinds = {s.kind for s in steps}
    assert kinds == {"prefill", "decode", "mixed"}
    assert max(s.decodes for s in steps) >= 128
    kv = gpu_steps.MODELS.get(model).kv_bytes_per_token
    for s in steps:
        tokens = sum(c + p for c, p in s.chunks) + s.decodes * (s.decode_ctx + 1)
        assert tokens * kv <= gpu_steps.EXTENDED_KV_BYTES * 1.05, s.name


def test_compare_keeps_runs_of_forced_backends_apart(tmp_path):
    base = {"hardware": "h200", "model": "qwen2.5-3b", "step": "prefill 512 @0",
            "chunks": [[512, 0]], "decodes": 0, "decode_ctx": 0, "measured_all_s": 0.009,
            "measured_gemm_s": 0.005, "measured_attention_s": 0.001}
    recs = [dict(base, forced_backend=b) for b in ("FLASH_ATTENTION", "CUDNN_ATTENTION")]
    text = "\n".join(gpu_steps.comparison(recs))
    assert "attention FLASH_ATTENTION only" in text and "attention CUDNN_ATTENTION only" in text


@pytest.mark.parametrize("change,why", [
    ({"measured_all_s": 0}, "measured_all_s must be a time in (0,"),
    ({"measured_gemm_s": "1"}, "measured_gemm_s must be a time"),
    ({"chunks": "x"}, "chunks must be [[tokens >= 1, context >= 0], ...]"),
    ({"chunks": [[10**30, 0]]}, "chunks must be"),
    ({"decodes": 10**9}, "decodes must be an integer in [0, 1048576]"),
    ({"decodes": 1e9}, "decodes must be an integer"),
    ({"decode_ctx": -1}, "decode_ctx must be an integer"),
    ({"model": None}, "model must be a string"),
])
def test_compare_refuses_bad_values_in_one_line(tmp_path, change, why):
    """Issue 23: these were tracebacks (ZeroDivisionError, a 1e9-element list, ...). The
    reader names the file, the line and the bound; the command line prints it as one line
    (``test_compare_on_binary_or_empty_file_is_one_line_exit_2``)."""
    rec = {"hardware": "h200", "model": "qwen2.5-3b", "step": "prefill 64 @0",
           "chunks": [[64, 0]], "decodes": 0, "decode_ctx": 0, "measured_all_s": 0.001,
           "measured_gemm_s": 0.0005, "measured_attention_s": 0.0001}
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(rec) + "\n")
    assert len(load_records(str(good))) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rec) + "\n" + json.dumps({**rec, **change}) + "\n")
    with pytest.raises(PpasError) as e:
        load_records(str(bad))
    assert "\n" not in str(e.value) and f"bad.jsonl line 2: {why}" in str(e.value), e.value


@pytest.mark.parametrize("content,why", [
    (b"\x00\xff\xfe\x89PNG\r\n", "is not text"),
    (b"", "holds no step records"),
    (b"\n\n", "holds no step records"),
])
def test_compare_on_binary_or_empty_file_is_one_line_exit_2(tmp_path, content, why):
    """Issue 23: a binary file was a UnicodeDecodeError traceback; an empty one printed
    nothing and exited 0."""
    f = tmp_path / "f.jsonl"
    f.write_bytes(content)
    proc = bench("--compare", str(f))
    err = proc.stderr.strip()
    assert proc.returncode == 2 and err.startswith("gpu_step_times: ") and why in err, err
    assert "\n" not in err


def test_roofline_parts_add_up_to_its_device_time():
    from ppas.cost.roofline import RooflineCostModel

    cm = RooflineCostModel("h200", "qwen2.5-3b")
    for step in full_steps("qwen2.5-3b"):
        p = predict(cm, step)
        # The rest (activations, LM head) is positive and small next to the two parts.
        rest = p["predicted_all_s"] - p["predicted_gemm_s"] - p["predicted_attention_s"]
        assert 0 < rest < 0.5 * p["predicted_all_s"]


# -- held out: device times measured on an H200 (never fitted; docs/results/held-out-gpus.md) --
RUNS = sorted((ROOT / "benchmarks" / "results").glob("h200-steps-run*.jsonl"))


def held_out(runs=RUNS):
    from ppas.cost.roofline import RooflineCostModel

    models = {}
    for path in runs:
        for r in load_records(str(path)):
            cm = models.setdefault(r["model"], RooflineCostModel(r["hardware"], r["model"]))
            step = GpuStep(r["step"], tuple(tuple(c) for c in r["chunks"]), r["decodes"],
                          r["decode_ctx"])
            yield step, r, predict(cm, step)


def test_h200_runs_are_saved_and_cover_both_models():
    recs = [r for _, r, _ in held_out()]
    assert len(RUNS) >= 3
    assert {r["model"] for r in recs} == {"qwen2.5-3b", "qwen3-8b", "llama3.2-3b", "qwen2.5-7b"}
    assert all(r["device_name"] == "NVIDIA H200" for r in recs)


def test_roofline_gemms_match_the_h200_on_large_steps():
    """cuBLAS is vLLM's GEMM library, so this part is like for like: within 5% for every
    step of >= 8192 tokens (measured: within 3.1%). The roofline was fitted on an RTX 5090."""
    checked = 0
    for step, r, p in held_out():
        if step.shape.num_tokens >= 8192:
            assert abs(p["predicted_gemm_s"] / r["measured_gemm_s"] - 1) < 0.05, step.name
            checked += 1
    assert checked >= 30


def test_roofline_prices_a_whole_prompt_against_a_16k_chunk_as_the_h200_does():
    for run in RUNS:
        named = {(r["model"], step.name): (r["measured_all_s"], p["predicted_all_s"])
                 for step, r, p in held_out([run])}
        for model in {m for m, _ in named}:
            m25, p25 = named[(model, "prefill 25000 @0")]
            m16, p16 = named[(model, "prefill 16384 @0")]
            assert abs((p25 / p16) / (m25 / m16) - 1) < 0.05, (run.name, model)
