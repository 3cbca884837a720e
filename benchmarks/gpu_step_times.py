"""A step's device time measured on a real GPU beside the roofline's prediction for it.

Held-out check of the cost model (``ppas.cost.roofline``): its engine and wave-tail
constants were fitted on RTX 5090 / Qwen2.5-3B runs alone; here a GPU's own kernels run
the exact per-step work of a catalog model and the roofline predicts the same steps for
that GPU from the catalog's throughputs. Nothing is fitted here.

What runs: a decoder stack with the model's exact shapes (random BF16 weights, every
layer its own): fused qkv GEMM, rotary on q and k, the KV-cache write, attention (each
prefill chunk causally over its cached context plus itself, each decode over its context,
GQA), o projection, residual + RMSNorm, fused gate-up GEMM, SiLU-and-mul, down GEMM, and
the LM head on the last token of each request, which is what one vLLM step computes. The
GEMMs are cuBLAS's, as in vLLM; attention is PyTorch's (SDPA's FlashAttention-2, cuDNN or
memory-efficient kernel for the chunks, SDPA or a batched-GEMM form for the decodes: the
fastest on the step is used), not vLLM's FlashAttention-3 build on Hopper, so GEMMs and
attention are also timed on their own. Steps are
timed by CUDA-graph replay (device time, no launch gaps; vLLM replays graphs up to 512
tokens and launches eagerly above, which only adds host time). Not measured: vLLM's host
and scheduling costs (the roofline's fitted per-step overhead), which need the engine.

    PYTHONPATH=src python3 benchmarks/gpu_step_times.py --hardware h200 \
        --models qwen2.5-3b,qwen3-8b --out h200-steps.jsonl
    python benchmarks/gpu_step_times.py --compare benchmarks/results/h200-steps.jsonl

``--out`` is written one JSON line per measured step as it finishes (a killed run keeps
every step already measured); ``--compare`` re-judges a saved file against the current
roofline without a GPU. ``--smoke`` runs a tiny model on whatever device is present (CPU
here) to check the harness.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ppas.core.limits import MAX_CONTEXT_TOKENS, MAX_NUM_SEQS, MAX_PROMPT_TOKENS, MAX_TIME_S
from ppas.cost.base import StepShape
from ppas.cost.catalog import HARDWARE, MODELS, ModelArch
from ppas.cost.roofline import RooflineCostModel

PROMPT = 25000  # the paper grid's prompt


@dataclass(frozen=True)
class Step:
    """One engine step: prefill chunks (tokens, cached context) and ``decodes`` requests
    each with ``decode_ctx`` tokens of context."""

    name: str
    chunks: tuple[tuple[int, int], ...] = ()
    decodes: int = 0
    decode_ctx: int = 0

    @property
    def shape(self) -> StepShape:
        return StepShape.of(list(self.chunks), [self.decode_ctx] * self.decodes)

    @property
    def kind(self) -> str:
        if self.chunks and self.decodes:
            return "mixed"
        return "prefill" if self.chunks else "decode"


def full_steps(model: str) -> list[Step]:
    """The shapes that decide the paper grid's schedules: whole and chunked prefills (the
    §2 comparison: eight 2k chunks of a 16k prompt vs one 16k chunk), decode-only steps of
    one to many requests on 25k contexts, and decodes riding a chunk."""
    steps = [Step(f"prefill {c} @0", ((c, 0),)) for c in (512, 2048, 8192, 16384, PROMPT)]
    steps += [Step(f"s2 2k-chunk {i}", ((2048, 2048 * i),)) for i in range(8)]
    steps += [Step(f"prefill {c} @{p}", ((c, p),))
              for c, p in ((64, 8192), (512, 8192), (2048, 16384), (8192, 16384),
                           (16384, 8192))]
    big = model != "qwen2.5-3b"  # 4x the KV per token: fewer long decodes fit
    for n in (1, 2, 8) if big else (1, 2, 8, 32):
        steps.append(Step(f"decode {n} @25k", (), n, PROMPT))
    steps.append(Step("decode 128 @2k", (), 128, 2048))
    steps += [Step(f"mixed {c}@8192 + {n} decode", ((c, 8192),), n, PROMPT)
              for c, n in ((64, 1), (512, 1), (2048, 2), (16384, 2))]
    return steps


def smoke_steps() -> list[Step]:
    return [Step("prefill 64 @0", ((64, 0),)), Step("prefill 32 @64", ((32, 64),)),
            Step("decode 4 @96", (), 4, 96), Step("mixed 16@32 + 2 decode", ((16, 32),), 2, 48)]


SMOKE_MODEL = ModelArch("smoke-tiny", 2, 128, 4, 2, 32, 256, 512, True)


class Harness:
    """Builds the model's layers on the device and times steps (needs torch)."""

    def __init__(self, arch: ModelArch, device: str) -> None:
        import torch
        import torch.nn.functional as F

        self.torch, self.F, self.arch, self.device = torch, F, arch, device
        self.dtype = torch.bfloat16
        self.cuda = device.startswith("cuda")
        m, dev, dt = arch, device, self.dtype
        gen = torch.Generator(device=dev).manual_seed(0)

        def w(k: int, n: int) -> Any:
            return (torch.randn(k, n, device=dev, dtype=dt, generator=gen) / math.sqrt(k))

        self.layers = [
            {"qkv": w(m.hidden, m.q_width + 2 * m.kv_width), "o": w(m.q_width, m.hidden),
             "gu": w(m.hidden, 2 * m.intermediate), "down": w(m.intermediate, m.hidden),
             "n1": torch.ones(m.hidden, device=dev, dtype=dt),
             "n2": torch.ones(m.hidden, device=dev, dtype=dt)}
            for _ in range(m.layers)]
        self.lm = w(m.hidden, m.vocab)
        self.expand_kv = False  # KV heads expanded for a backend without native GQA
        self.decode_matmul = False  # decode attention as batched GEMMs (see attention)
        self.eager = False  # the last timing fell back to eager launches

    # -- one step -------------------------------------------------------------------
    def build(self, step: Step) -> dict[str, Any]:
        """Static inputs of a step: activations, per-layer KV caches, rotary tables."""
        torch, m, dev, dt = self.torch, self.arch, self.device, self.dtype
        n_tok = sum(c for c, _ in step.chunks) + step.decodes
        d, kvh = m.head_dim, m.kv_heads
        caches = []
        for _ in range(m.layers):
            per = []
            for c, p in step.chunks:
                per.append((torch.randn(1, kvh, p + c, d, device=dev, dtype=dt),
                            torch.randn(1, kvh, p + c, d, device=dev, dtype=dt)))
            if step.decodes:
                k1 = step.decode_ctx + 1
                per.append((torch.randn(step.decodes, kvh, k1, d, device=dev, dtype=dt),
                            torch.randn(step.decodes, kvh, k1, d, device=dev, dtype=dt)))
            caches.append(per)
        last = []
        o = 0
        for c, _ in step.chunks:
            o += c
            last.append(o - 1)
        last += list(range(o, o + step.decodes))
        return {"x": torch.randn(n_tok, m.hidden, device=dev, dtype=dt),
                "qkv": torch.randn(n_tok, m.q_width + 2 * m.kv_width, device=dev, dtype=dt),
                "cos": torch.rand(n_tok, 1, d // 2, device=dev, dtype=dt),
                "sin": torch.rand(n_tok, 1, d // 2, device=dev, dtype=dt),
                "attn": torch.empty(n_tok, m.q_width, device=dev, dtype=dt),
                "caches": caches, "last": torch.tensor(last, device=dev), "n": n_tok}

    def rotary(self, t: Any, cos: Any, sin: Any) -> Any:
        h = t.shape[-1] // 2
        a, b = t[..., :h], t[..., h:]
        return self.torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

    def attention(self, step: Step, st: dict[str, Any], layer: int, q: Any, k: Any,
                  v: Any) -> None:
        """Write the KV of this step's tokens and attend; result into ``st['attn']``."""
        torch, F, m = self.torch, self.F, self.arch
        from torch.nn.attention.bias import causal_lower_right

        o = 0
        out = st["attn"]
        for i, (c, p) in enumerate(step.chunks):
            kc, vc = st["caches"][layer][i]
            kc[0, :, p:p + c].copy_(k[o:o + c].transpose(0, 1))
            vc[0, :, p:p + c].copy_(v[o:o + c].transpose(0, 1))
            qi = q[o:o + c].transpose(0, 1).unsqueeze(0)
            if self.expand_kv:
                g = m.heads // m.kv_heads
                kc, vc = kc.repeat_interleave(g, dim=1), vc.repeat_interleave(g, dim=1)
            if p == 0:
                a = F.scaled_dot_product_attention(qi, kc, vc, is_causal=True, enable_gqa=True)
            else:
                a = F.scaled_dot_product_attention(qi, kc, vc, enable_gqa=True,
                                                   attn_mask=causal_lower_right(c, p + c))
            out[o:o + c].view(c, m.heads, m.head_dim).copy_(a[0].transpose(0, 1))
            o += c
        if step.decodes:
            n, g = step.decodes, m.heads // m.kv_heads
            kc, vc = st["caches"][layer][len(step.chunks)]
            kc[:, :, step.decode_ctx].copy_(k[o:o + n])
            vc[:, :, step.decode_ctx].copy_(v[o:o + n])
            # GQA for one query token: a group's heads are the query rows of its KV head.
            qd = q[o:o + n].view(n, m.kv_heads, g, m.head_dim)
            if self.decode_matmul:
                # Scores over the whole context as one batched GEMM, softmax, then the
                # values: every key block is its own tile, so the grid fills the GPU
                # whatever the batch (what split-KV decode kernels achieve); SDPA's
                # kernels run one block per (request, KV head) and leave most SMs idle.
                sc = torch.matmul(qd, kc.transpose(-1, -2)) * (m.head_dim ** -0.5)
                a = torch.matmul(torch.softmax(sc.float(), dim=-1).to(qd.dtype), vc)
            else:
                a = F.scaled_dot_product_attention(qd, kc, vc)
            out[o:o + n].copy_(a.reshape(n, m.q_width))

    def forward(self, step: Step, st: dict[str, Any], parts: str = "all") -> Any:
        """One step's device work. ``parts``: 'all', 'gemm' (the four GEMMs of every
        layer alone) or 'attention' (every layer's attention alone)."""
        F, m = self.F, self.arch
        x = st["x"]
        n = st["n"]
        eps = 1e-6
        qw, kw = m.q_width, m.kv_width
        for li, lw in enumerate(self.layers):
            if parts == "gemm":
                h = x @ lw["qkv"]
                h = st["attn"] @ lw["o"]
                g = x @ lw["gu"]
                h = g[:, :m.intermediate] @ lw["down"]
                continue
            if parts == "attention":  # the step's q, k, v as a given input
                qkv = st["qkv"]
                q = qkv[:, :qw].view(n, m.heads, m.head_dim)
                k = qkv[:, qw:qw + kw].view(n, m.kv_heads, m.head_dim)
                v = qkv[:, qw + kw:].view(n, m.kv_heads, m.head_dim)
                self.attention(step, st, li, q, k, v)
                continue
            h = F.rms_norm(x, (m.hidden,), lw["n1"], eps)
            qkv = h @ lw["qkv"]
            q = self.rotary(qkv[:, :qw].view(n, m.heads, m.head_dim), st["cos"], st["sin"])
            k = self.rotary(qkv[:, qw:qw + kw].view(n, m.kv_heads, m.head_dim), st["cos"],
                            st["sin"])
            v = qkv[:, qw + kw:].view(n, m.kv_heads, m.head_dim)
            self.attention(step, st, li, q, k, v)
            x = x + st["attn"] @ lw["o"]
            h = F.rms_norm(x, (m.hidden,), lw["n2"], eps)
            g = h @ lw["gu"]
            a = F.silu(g[:, :m.intermediate]) * g[:, m.intermediate:]
            x = x + a @ lw["down"]
        if parts == "all":
            return x[st["last"]] @ self.lm
        return None

    def time(self, fn: Callable[[], Any], budget_s: float, max_iters: int) -> tuple[float, int]:
        """Median seconds of ``fn`` (CUDA-graph replay on a GPU), and the repeats."""
        torch = self.torch
        if not self.cuda:
            fn()
            t0 = time.perf_counter()
            fn()
            first = time.perf_counter() - t0
            reps = max(2, min(max_iters, int(budget_s / max(first, 1e-6))))
            xs = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                xs.append(time.perf_counter() - t0)
            return statistics.median(xs), reps
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                fn()
            run = graph.replay
        except RuntimeError:  # not capturable: eager, timed by events (launch gaps count)
            torch.cuda.synchronize()
            self.eager = True
            run = fn
        run()
        torch.cuda.synchronize()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ev[0].record()
        run()
        ev[1].record()
        torch.cuda.synchronize()
        first = ev[0].elapsed_time(ev[1]) / 1e3
        reps = max(3, min(max_iters, int(budget_s / max(first, 1e-6))))
        xs = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            b.synchronize()
            xs.append(a.elapsed_time(b) / 1e3)
        del graph
        return statistics.median(xs), reps

    def pick_backend(self, step: Step, st: dict[str, Any]) -> str:
        """The fastest way this step's attention runs here (eager probe): each SDPA
        backend that takes the shape (FlashAttention-2, cuDNN, memory-efficient) for the
        prefill chunks, and SDPA or the batched-GEMM form for the decodes (see
        ``attention``). KV heads are expanded to the query heads only where no backend
        takes GQA natively (the copy is then measured too: recorded as '+expand')."""
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if not self.cuda:
            return "default"
        best, best_t = "default", math.inf
        for expand in (False, True):
            for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
                be = getattr(SDPBackend, name, None)
                for matmul in (False, True) if step.decodes else (False,):
                    if be is None:
                        continue
                    self.expand_kv, self.decode_matmul = expand, matmul
                    try:
                        with sdpa_kernel([be]), torch.no_grad():
                            self.forward(step, st, "attention")
                            torch.cuda.synchronize()
                            t0 = time.perf_counter()
                            for _ in range(2):
                                self.forward(step, st, "attention")
                            torch.cuda.synchronize()
                    except RuntimeError:
                        continue
                    t = time.perf_counter() - t0
                    if t < best_t:
                        best, best_t = (name + ("+expand" if expand else "")
                                        + ("/matmul-decode" if matmul else "")), t
            if best != "default":
                break
        self.expand_kv = "+expand" in best
        self.decode_matmul = "/matmul-decode" in best
        return best

    def measure(self, step: Step, budget_s: float, max_iters: int) -> dict[str, Any]:
        torch = self.torch
        from contextlib import nullcontext

        st = self.build(step)
        backend = self.pick_backend(step, st)
        ctx: Any = nullcontext()
        if backend != "default":
            from torch.nn.attention import SDPBackend, sdpa_kernel
            ctx = sdpa_kernel([getattr(SDPBackend, backend.split("+")[0].split("/")[0])])
        out: dict[str, Any] = {"backend": backend}
        self.eager = False
        with torch.no_grad(), ctx:
            for parts in ("all", "gemm", "attention"):
                def run(parts: str = parts) -> Any:
                    return self.forward(step, st, parts)
                t, reps = self.time(run, budget_s, max_iters)
                out[f"measured_{parts}_s"] = t
                out[f"reps_{parts}"] = reps
        out["timing"] = ("cpu-wall" if not self.cuda else
                         "eager-events" if self.eager else "cuda-graph")
        st.clear()  # free the step's KV caches before the next step
        if self.cuda:
            torch.cuda.empty_cache()
        return out


def predict(cm: RooflineCostModel, step: Step) -> dict[str, float]:
    """The roofline's device time for the step, and its GEMM and attention parts."""
    shape = step.shape
    n = shape.num_tokens
    layers = cm.model.layers
    gemm = layers * sum(cm.gemm_time(n, i) for i in range(4))
    attn = layers * (cm.prefill_attention_time(shape)
                     + cm.decode_attention_time(shape.decode_ctx_tokens))
    return {"predicted_all_s": cm.device_time(shape), "predicted_gemm_s": gemm,
            "predicted_attention_s": attn}


def comparison(records: list[dict[str, Any]]) -> list[str]:
    """Side-by-side table and summaries of measured vs predicted (re-predicted now)."""
    lines = []
    by_model: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        by_model.setdefault((r["hardware"], r["model"]), []).append(r)
    for (hw, model), recs in by_model.items():
        if model not in MODELS or hw not in HARDWARE:
            lines.append(f"{hw} / {model}: not in the catalog; measured only")
            continue
        cm = RooflineCostModel(hw, model)
        lines.append(f"\n{hw} / {model} ({recs[0].get('device_name', '?')}, "
                     f"torch {recs[0].get('torch', '?')}): device time per step, ms")
        lines.append(f"{'step':<30} {'measured':>9} {'roofline':>9} {'err':>7}   "
                     f"{'GEMMs m/p':>15} {'attention m/p':>15}  backend")
        errs: dict[str, list[float]] = {}
        named: dict[str, tuple[float, float, float, float]] = {}
        for r in recs:
            step = Step(r["step"], tuple(tuple(c) for c in r["chunks"]),  # type: ignore[misc]
                        r["decodes"], r["decode_ctx"])
            p = predict(cm, step)
            m_all, p_all = r["measured_all_s"], p["predicted_all_s"]
            err = p_all / m_all - 1
            errs.setdefault(step.kind, []).append(err)
            named[step.name] = (m_all, p_all, r["measured_gemm_s"], p["predicted_gemm_s"])
            lines.append(
                f"{step.name:<30} {m_all * 1e3:9.2f} {p_all * 1e3:9.2f} {err:+7.1%}   "
                f"{r['measured_gemm_s'] * 1e3:7.2f}/{p['predicted_gemm_s'] * 1e3:<7.2f} "
                f"{r['measured_attention_s'] * 1e3:7.2f}/{p['predicted_attention_s'] * 1e3:<7.2f}"
                f"  {r.get('backend', '')}")
        allerr = [e for v in errs.values() for e in v]
        lines.append("median |error|: " + ", ".join(
            f"{k} {statistics.median(abs(e) for e in v):.1%} (n={len(v)})"
            for k, v in sorted(errs.items()))
            + f"; all {statistics.median(abs(e) for e in allerr):.1%}, "
            f"worst {max(allerr, key=abs):+.1%}")
        lines += ratio_lines(named)
    return lines


def ratio_lines(named: dict[str, tuple[float, float, float, float]]) -> list[str]:
    """The ratios the schedules depend on, measured vs predicted (whole steps, or their
    GEMMs alone: ``part`` 0 or 2)."""
    out = []

    def ratio(label: str, num: Sequence[str], den: Sequence[str], part: int = 0) -> None:
        if all(k in named for k in (*num, *den)):
            mv = sum(named[k][part] for k in num) / sum(named[k][part] for k in den)
            pv = sum(named[k][part + 1] for k in num) / sum(named[k][part + 1] for k in den)
            out.append(f"  {label}: measured {mv:.3f}, roofline {pv:.3f}")

    s2 = [f"s2 2k-chunk {i}" for i in range(8)]
    ratio("§2: eight 2k chunks / one 16k chunk (16k prompt)", s2, ["prefill 16384 @0"])
    ratio("§2, GEMMs alone: eight 2k chunks / one 16k chunk", s2, ["prefill 16384 @0"], 2)
    ratio("decode-only step: 2 requests / 1 (25k contexts)", ["decode 2 @25k"],
          ["decode 1 @25k"])
    ratio("16k chunk + 2 decodes / decode-only step of 2", ["mixed 16384@8192 + 2 decode"],
          ["decode 2 @25k"])
    ratio("64-token chunk + 1 decode / decode-only step of 1", ["mixed 64@8192 + 1 decode"],
          ["decode 1 @25k"])
    ratio("whole 25k prompt / 16k chunk @0", ["prefill 25000 @0"], ["prefill 16384 @0"])
    if out:
        out.insert(0, "ratios the schedules rest on:")
    return out


RECORD_KEYS = ("hardware", "model", "step", "chunks", "decodes", "decode_ctx",
               "measured_all_s", "measured_gemm_s", "measured_attention_s")


def fail(msg: str) -> None:
    print(f"gpu_step_times: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _is_int(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def bad_value(r: dict[str, Any]) -> str | None:
    """What is wrong with a step record's values (None when they are usable)."""
    for k in ("hardware", "model", "step"):
        if not isinstance(r[k], str):
            return f"{k} must be a string, got {r[k]!r:.40}"
    for k in ("measured_all_s", "measured_gemm_s", "measured_attention_s"):
        v = r[k]
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= MAX_TIME_S:
            return f"{k} must be a time in (0, {MAX_TIME_S:g}] s, got {v!r:.40}"
    c = r["chunks"]
    if not isinstance(c, list) or not all(
            isinstance(x, list) and len(x) == 2 and _is_int(x[0], 1, MAX_PROMPT_TOKENS)
            and _is_int(x[1], 0, MAX_CONTEXT_TOKENS) for x in c):
        return f"chunks must be [[tokens >= 1, context >= 0], ...], got {c!r:.40}"
    if not _is_int(r["decodes"], 0, MAX_NUM_SEQS):
        return f"decodes must be an integer in [0, {MAX_NUM_SEQS}], got {r['decodes']!r:.40}"
    if not _is_int(r["decode_ctx"], 0, MAX_CONTEXT_TOKENS):
        return (f"decode_ctx must be an integer in [0, {MAX_CONTEXT_TOKENS}], "
                f"got {r['decode_ctx']!r:.40}")
    return None


def load(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            recs = [json.loads(line) for line in f if line.strip()]
        for i, r in enumerate(recs, 1):
            missing = [k for k in RECORD_KEYS if not isinstance(r, dict) or k not in r]
            if missing:
                fail(f"{path} line {i} is not a step record (as --out writes): it lacks "
                     f"{', '.join(missing)}")
            if problem := bad_value(r):
                fail(f"{path} line {i}: {problem}")
        if not recs:
            fail(f"{path} holds no step records (as --out writes)")
        return recs
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    except UnicodeDecodeError:
        fail(f"{path} is not text (JSON lines as --out writes)")
    except json.JSONDecodeError as e:
        fail(f"{path} is not JSON lines ({e.msg} at line {e.lineno})")
    return []


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hardware", default="h200", help="catalog GPU to predict for")
    ap.add_argument("--models", default="qwen2.5-3b,qwen3-8b", help="comma-separated")
    ap.add_argument("--out", help="JSON-lines file to write (must not exist)")
    ap.add_argument("--compare", help="print the comparison for a saved file and exit")
    ap.add_argument("--budget-s", type=float, default=0.4, help="timing budget per measurement")
    ap.add_argument("--max-iters", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="tiny model and shapes (any device)")
    a = ap.parse_args(argv)
    if a.compare:
        print("\n".join(comparison(load(a.compare))))
        return 0
    if a.hardware not in HARDWARE:
        fail(f"unknown --hardware {a.hardware!r}; allowed: {', '.join(sorted(HARDWARE))}")
    models = [s for s in a.models.split(",") if s]
    bad = [s for s in models if s not in MODELS]
    if bad and not a.smoke:
        fail(f"unknown model {bad[0]!r}; allowed: {', '.join(sorted(MODELS))}")
    if not (a.budget_s > 0 and a.max_iters >= 1):
        fail("--budget-s must be > 0 and --max-iters >= 1")
    if a.out and os.path.exists(a.out):
        fail(f"--out {a.out} exists; choose a new file (nothing is overwritten)")
    try:
        import torch
    except ImportError:
        fail("measuring needs torch (use --compare FILE to judge a saved run)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not a.smoke:
        fail("no GPU found; run with --smoke to check the harness on CPU")
    meta = {"hardware": a.hardware, "torch": torch.__version__,
            "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    out = open(a.out, "x") if a.out else None  # noqa: SIM115 (appended line by line)
    records = []
    t_start = time.perf_counter()
    try:
        for model in (["smoke-tiny"] if a.smoke else models):
            arch = SMOKE_MODEL if a.smoke else MODELS.get(model)
            t0 = time.perf_counter()
            h = Harness(arch, device)
            print(f"{model}: built on {device} in {time.perf_counter() - t0:.1f} s", flush=True)
            for step in smoke_steps() if a.smoke else full_steps(model):
                rec = {**meta, "model": arch.name, "step": step.name,
                       "chunks": [list(c) for c in step.chunks], "decodes": step.decodes,
                       "decode_ctx": step.decode_ctx, **h.measure(step, a.budget_s, a.max_iters)}
                records.append(rec)
                if out:
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
                print(f"  {step.name:<30} {rec['measured_all_s'] * 1e3:9.3f} ms "
                      f"(gemm {rec['measured_gemm_s'] * 1e3:.3f}, attention "
                      f"{rec['measured_attention_s'] * 1e3:.3f}, {rec['backend']})", flush=True)
            del h
            if device == "cuda":
                torch.cuda.empty_cache()
    finally:
        if out:
            out.close()
    if not a.smoke:
        print("\n".join(comparison(records)))
    print(f"wall {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
