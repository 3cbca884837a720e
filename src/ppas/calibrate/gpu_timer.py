"""The GPU step timer: a catalog model's exact per-step work, timed on a device.

A decoder stack with the model's exact shapes (random BF16 weights, every layer its own):
fused qkv GEMM, rotary on q and k, the KV-cache write, attention (each prefill chunk
causally over its cached context plus itself, each decode over its context, GQA), o
projection, residual + RMSNorm, fused gate-up GEMM, SiLU-and-mul, down GEMM, and the LM
head on the last token of each request, which is what one vLLM step computes. The GEMMs
are cuBLAS's, as in vLLM; attention is PyTorch's (SDPA's FlashAttention-2, cuDNN or
memory-efficient kernel for the chunks, SDPA or a batched-GEMM form for the decodes: the
fastest on the step is used), not vLLM's FlashAttention-3 build on Hopper, so GEMMs and
attention are also timed on their own. Steps are timed by CUDA-graph replay (device time,
no launch gaps). Not measured: vLLM's host and scheduling costs. torch is imported when a
``StepTimer`` is built, never at import.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from ppas.calibrate.gpu_steps import GpuStep
from ppas.cost.catalog import ModelArch


class StepTimer:
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
    def build(self, step: GpuStep) -> dict[str, Any]:
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

    def attention(self, step: GpuStep, st: dict[str, Any], layer: int, q: Any, k: Any,
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

    def forward(self, step: GpuStep, st: dict[str, Any], parts: str = "all") -> Any:
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

    def pick_backend(self, step: GpuStep, st: dict[str, Any]) -> str:
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

    def measure(self, step: GpuStep, budget_s: float, max_iters: int,
                backend: str | None = None) -> dict[str, Any]:
        """Time the step whole, its GEMMs and its attention. ``backend`` (an SDPA backend
        name, e.g. FLASH_ATTENTION or CUDNN_ATTENTION) forces the attention kernel of
        every part, decodes included; None picks the fastest (``pick_backend``). A
        forced backend that does not take the shape raises RuntimeError."""
        torch = self.torch
        from contextlib import nullcontext

        st = self.build(step)
        if backend is None:
            backend = self.pick_backend(step, st)
        else:
            self.expand_kv = self.decode_matmul = False
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
