"""Roofline step-time model from per-GPU achieved throughputs and the model's shapes.

Hardware facts (``ppas.cost.catalog``): the FLOP/s large BF16 GEMMs reach (F_g), the FLOP/s
the attention kernel reaches at the model's head dimension (F_a: ``Hardware.attention_flops``;
the kernel is a parameter, vLLM's by default: FlashAttention-3 on Hopper, FlashAttention-2
elsewhere), the reached bandwidth (BW) and the SM count (S). Nothing here is a per-GPU or per-model
constant; the only calibrated quantities (``ppas/data/roofline_calibration.json``, written
by ``benchmarks/calibrate_roofline.py`` from the RTX 5090 / Qwen2.5-3B runs) are engine and
host costs (per-step, per-request and eager-launch overheads) and two dimensionless
saturation shapes: the expected fraction of a wave lost at the end of a GEMM's tile grid
(tau_g) and of an attention kernel's block grid (tau_a).

Per step, N = prefill tokens + decodes, per layer (tensor-parallel degree t; qkv and
gate-up split their output width over the GPUs, o and down their depth K):

    GEMM i (K_i x out_i per GPU):  max(C_i, weights_i / BW)            (plain roofline)
        C_i = 2 N K_i out_i / F_g + tau_g T_i min(1, w_i)
        w_i = (N / 128) (out_i / 256) / S       waves of 128 x 256 output tiles
        T_i = 2 * 128 * 256 * min(K_i, 2048) * S / F_g   time of one wave (cuBLAS splits
                                                    longer K: split-K / stream-K)
    where the GPU's GEMMs were measured (``catalog.GemmPhysics``, fitted by
    ``benchmarks/kernel_fidelity.py --fit``): F_g, tau_g from the fit and
        lat + ((weights_i / BW_w)^k + C_i^k)^(1 / k)
    with BW_w the bandwidth weight-bound GEMMs reach, lat a kernel's fixed latency and k the
    architecture's knee (a soft max: loads and math overlap imperfectly near the ridge).
    attention (prefill):   max(4 H_q d W / t / F_a * v / w,  KV(p + c) / BW)
        W = sum c (p + (c + 1) / 2) causal pairs; w = blocks / S with blocks = H_q / t x
        (query rows / B_q: ``catalog.ATTENTION_KERNELS``, 64 on FA2 paged KV, 128 on FA3 and
        cuDNN), raised towards 1.6 waves by a split-KV kernel (FA3) when the grid is small;
        v = w + tau_a u waves if w > 1, else one wave; u = (p + B_q) / (p + (c + 1) / 2) <= 1:
        blocks of one chunk are near-equal when its cached context p dominates, so the
        last wave's idle SMs cost the most (the causal triangle of a first chunk fills
        them). This is why eight 2k chunks cost more than one 16k chunk
        (P-PAS §2): 3 waves on an RTX 5090 vs 24.
        The KV term is the memory bound: a chunk of c tokens does 4 H_q d c FLOPs per key
        against 4 H_kv d bytes, so chunks with c H_q / H_kv below F_a / BW (e.g. 51 tokens
        for Qwen3-8B on an H100) are bound by reading their cached context.
    attention (decode):    KV(contexts) / BW
    activations:           N x (norm, SiLU, rotary, KV-write bytes) / BW (vLLM's fused
                           kernels; ``activation_bytes`` overrides it for another implementation)

    step = L (GEMMs + attention + activations) + LM head (a GEMM of one row per request)
           + overhead (+ L eager, when N > the CUDA-graph capture limit) + per_request * reqs
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from importlib import resources

from ppas.core.config import require
from ppas.core.errors import PpasError
from ppas.cost.base import CostModel, StepShape
from ppas.cost.catalog import (
    ATTENTION_KERNELS,
    CUDAGRAPH_MAX_TOKENS,
    HARDWARE,
    MODELS,
    Hardware,
    ModelArch,
)

# Kernel geometry (facts about the kernels, not fitted): cuBLAS's large BF16 tiles are
# 128 x 256 outputs; attention kernels' query rows per block are in
# ``catalog.ATTENTION_KERNELS``; each runs one block per SM at head dim 64-128.
GEMM_TILE = 128 * 256
KV_BLOCK = 128  # keys per split-KV block
# FlashAttention-3 splits the KV of a small grid over more blocks (up to ~1.6 waves); vLLM's
# FlashAttention-2 build splits KV for decoding only, so prefill chunks keep their grid.
SPLIT_KV_WAVES = 1.6
# cuBLAS splits K (split-K / stream-K) beyond about this depth, so one wave of tiles of a
# long-K GEMM (the down projection) lasts no longer than a 2048-deep one.
K_SLICE = 2048
#: Which GEMMs of ``ModelArch.gemms`` are row-parallel under tensor parallelism (split K:
#: o and down), the others column-parallel (split the output width: qkv and gate-up).
ROW_PARALLEL = (False, True, False, True)

#: One GEMM's constants: (seconds per token, tail seconds at a full wave, tokens per wave,
#: weight-read seconds, fixed latency, knee (0: the plain roofline's max)).
Gemm = tuple[float, float, float, float, float, float]


def gemm_terms(hw: Hardware, k: float, out: float, plain_tail_waves: float) -> Gemm:
    """The constants of one GEMM of depth ``k`` and width ``out`` (per GPU) on ``hw``:
    its fitted ``GemmPhysics`` where it has one, else the plain roofline with the
    calibrated tail ``plain_tail_waves``."""
    g = hw.gemm
    fg, sms = hw.gemm_flops, hw.sms
    tau = plain_tail_waves if g is None else g.tail_waves
    bw = hw.bandwidth if g is None else g.weight_bw_gbs * 1e9
    return (2.0 * k * out / fg, tau * 2.0 * GEMM_TILE * min(k, K_SLICE) * sms / fg,
            sms * GEMM_TILE / out, 2.0 * k * out / bw,
            0.0 if g is None else g.latency_s, 0.0 if g is None else g.knee)


def gemm_seconds(g: Gemm, n: float) -> float:
    """Seconds of the GEMM ``g`` (``gemm_terms``) over ``n`` token rows (module doc)."""
    per_tok, tail, wave_tokens, weights, latency, knee = g
    w = n / wave_tokens
    c = n * per_tok + tail * (w if w < 1.0 else 1.0)
    if knee:
        return latency + (weights ** knee + c ** knee) ** (1.0 / knee)
    return c if c > weights else weights


@dataclass(frozen=True)
class RooflineParams:
    """Engine/host costs and saturation shapes (seconds, dimensionless wave fractions)."""

    # Expected fraction of a wave of GEMM tiles / attention blocks left idle at the end of
    # a kernel (0 = perfect packing, 1 = a whole wave lost).
    gemm_tail_waves: float = 0.65
    attn_tail_waves: float = 0.8
    step_overhead_s: float = 0.003  # scheduling, sampling, host sync: every step
    # vLLM replays CUDA graphs for steps of up to ``cudagraph_max_tokens`` tokens; larger
    # steps launch every kernel eagerly, which costs this much more per decoder layer.
    eager_layer_overhead_s: float = 5e-5
    cudagraph_max_tokens: int = CUDAGRAPH_MAX_TOKENS
    per_req_overhead_s: float = 0.00002  # per scheduled request (metadata, sampling)
    mem_util: float = 0.9  # vLLM --gpu-memory-utilization
    reserve_gb: float = 1.5  # CUDA context, graphs, allocator slack (not KV)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            require(v >= 0, f"roofline: {f.name} must be >= 0, got {v}")
        require(self.gemm_tail_waves <= 1 and self.attn_tail_waves <= 1,
                "roofline: tail waves must be in [0, 1]")
        require(0 < self.mem_util <= 1, "roofline: mem_util must be in (0, 1]")

    @staticmethod
    def calibrated() -> RooflineParams:
        """The parameters fitted on RTX 5090 / Qwen2.5-3B (see module docstring)."""
        path = resources.files("ppas") / "data" / "roofline_calibration.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return RooflineParams()
        known = {f.name for f in fields(RooflineParams)}
        return RooflineParams(**{k: v for k, v in data["params"].items() if k in known})


class RooflineCostModel(CostModel):
    def __init__(
        self,
        hardware: Hardware | str,
        model: ModelArch | str,
        params: RooflineParams | None = None,
        tp: int = 1,
        max_num_batched_tokens: int = 16384,
        attention_kernel: str | None = None,
        activation_bytes: float | None = None,
    ) -> None:
        """``attention_kernel``: the attention kernel priced (``catalog.ATTENTION_KERNELS``;
        None: vLLM's on this architecture). ``activation_bytes``: bytes one token moves
        through a layer's memory-bound (non-GEMM, non-attention) kernels (None: vLLM's
        fused kernels, ``ModelArch.activation_bytes_per_token_layer``)."""
        hw = HARDWARE.get(hardware) if isinstance(hardware, str) else hardware
        m = MODELS.get(model) if isinstance(model, str) else model
        require(tp >= 1, f"tensor-parallel degree must be >= 1, got {tp}")
        self.hardware, self.model, self.tp = hw, m, tp
        self.params = p = params or RooflineParams.calibrated()
        self.attention_kernel = kernel = attention_kernel or hw.attention_backend
        fa, bw, sms = hw.attention_flops(kernel, m.head_dim), hw.bandwidth, hw.sms
        L = m.layers
        # GEMMs of one layer, each split over the tp GPUs by its depth or its width.
        self._gemms = tuple(
            gemm_terms(hw, k / tp if row else k, out if row else out / tp, p.gemm_tail_waves)
            for (k, out), row in zip(m.gemms, ROW_PARALLEL, strict=True))
        self._layers = L
        act = m.activation_bytes_per_token_layer if activation_bytes is None else activation_bytes
        self._act_per_tok = act / tp / bw
        self._attn_per_pair = 4.0 * m.q_width / tp / fa
        self._rows = ATTENTION_KERNELS[kernel].block_rows
        self._blocks_per_row = m.heads / tp / self._rows / sms  # waves per query row
        self._tau_a = p.attn_tail_waves
        self._split_kv = ATTENTION_KERNELS[kernel].split_kv
        self._kv_read_per_tok = m.kv_bytes_per_token / L / tp / bw  # one layer
        # The LM head: one row per request (its last token); no tail on the plain roofline.
        self._lm = gemm_terms(hw, m.hidden, m.vocab / tp, 0.0)
        self._gemm_memo: dict[int, float] = {}
        self._lm_memo: dict[int, float] = {}
        self._fixed = p.step_overhead_s
        self._eager = p.eager_layer_overhead_s * L
        self._graph_max = p.cudagraph_max_tokens
        self._per_req = p.per_req_overhead_s
        # KV capacity: vLLM's budget minus weights, activations for one full step, reserve.
        act_bytes = max_num_batched_tokens * (m.hidden * 6 + 2 * m.intermediate) * 2
        free = hw.mem_gb * 1e9 * p.mem_util - m.weight_bytes / tp - act_bytes - p.reserve_gb * 1e9
        if free <= 0 and free + act_bytes > 0:  # the step's activations, not the weights
            raise PpasError(
                f"max_num_batched_tokens={max_num_batched_tokens} needs {act_bytes / 1e9:.1f} GB "
                f"of activations and leaves no KV cache for {m.name} on {hw.name} "
                f"({hw.mem_gb:g} GB); lower the policy's token budget"
            )
        if free <= 0:
            raise PpasError(
                f"model {m.name} ({m.weight_bytes / 1e9:.1f} GB of weights) leaves no KV cache "
                f"on {hw.name} ({hw.mem_gb:g} GB) at tensor-parallel degree {tp}; raise --tp"
            )
        self.kv_capacity_tokens = int(free * tp / m.kv_bytes_per_token)
        self._one_chunk = self._bind_chunk_time()  # (chunk_time's body, constants bound)
        priced = self._priced_search = self._bind_chunk_search()  # (the same)

        def search(p: int, nd: int, k: int, target_s: float, c_max: int, guess: int) -> int:
            return priced(p, nd, k, target_s, c_max, guess, 0)[0]  # (chunk_search's)

        self._search = search
        self._chunk_price = self._bind_chunk_pricer()  # (chunk_pricer's, the same)

    def gemm_time(self, n: int, index: int) -> float:
        """One layer's GEMM ``index`` (0 qkv, 1 o, 2 gate-up, 3 down) over ``n`` tokens."""
        return gemm_seconds(self._gemms[index], n)

    def layer_gemm_time(self, n: int) -> float:
        """One layer's four GEMMs over ``n`` tokens (memoised per ``n``: simulations
        price the same token counts over and over)."""
        t = self._gemm_memo.get(n)
        if t is None:
            t = 0.0
            for g in self._gemms:
                t += gemm_seconds(g, n)
            self._gemm_memo[n] = t
        return t

    def lm_head_time(self, reqs: int) -> float:
        """The LM head over one row per request (memoised per ``reqs``)."""
        t = self._lm_memo.get(reqs)
        if t is None:
            t = self._lm_memo[reqs] = gemm_seconds(self._lm, reqs)
        return t

    def prefill_attention_time(self, step: StepShape) -> float:
        """One layer's attention over the step's prefill chunks."""
        reqs = step.num_prefill_reqs
        if not reqs:
            return 0.0
        c = step.num_prefill_tokens / reqs
        ctx = step.prefill_kv_tokens / reqs - c  # mean cached context of the chunks
        rows = self._rows
        # Blocks: each chunk's query rows in B_q-row blocks (rounded up), per head.
        w = (step.num_prefill_tokens + reqs * (rows - 1) / 2) * self._blocks_per_row
        if self._split_kv and w < SPLIT_KV_WAVES:  # split-KV spreads a small grid
            w = min(SPLIT_KV_WAVES, w * max(1.0, (ctx + c) / KV_BLOCK))
        # Time in waves: one wave when the grid does not fill the SMs, else the waves
        # plus the expected idle tail (larger when the blocks are near-equal).
        u = (ctx + rows) / (ctx + (c + 1) / 2)
        waves = w + self._tau_a * (u if u < 1.0 else 1.0) if w > 1.0 else 1.0
        t_flop = self._attn_per_pair * step.prefill_attn_work * waves / w
        t_kv = self._kv_read_per_tok * step.prefill_kv_tokens
        return t_flop if t_flop > t_kv else t_kv

    def decode_attention_time(self, decode_ctx_tokens: int) -> float:
        """One layer's attention over the decodes' contexts: their KV read."""
        return self._kv_read_per_tok * decode_ctx_tokens

    def device_time(self, step: StepShape) -> float:
        """Seconds the GPU computes for ``step`` (no host, launch or per-request costs)."""
        n = step.num_prefill_tokens + step.num_decodes
        if n == 0:
            return 0.0
        layer = n * self._act_per_tok + self.layer_gemm_time(n)
        layer += self.prefill_attention_time(step)
        layer += self._kv_read_per_tok * step.decode_ctx_tokens
        return self._layers * layer + self.lm_head_time(
            step.num_prefill_reqs + step.num_decodes)

    def step_time(self, step: StepShape) -> float:
        """``device_time(step) + fixed + per-request costs``, with ``device_time`` and its
        memo look-ups inlined: the same operations in the same order (a decode-only step
        adds no prefill attention, where ``device_time`` adds its 0.0 to a positive sum:
        the same float). ``tests/test_roofline.py`` checks it against that sum."""
        n = step.num_prefill_tokens + step.num_decodes
        if n == 0:
            return 0.0
        fixed = self._fixed + (self._eager if n > self._graph_max else 0.0)
        gemms = self._gemm_memo.get(n)
        if gemms is None:
            gemms = self.layer_gemm_time(n)
        layer = n * self._act_per_tok + gemms
        if step.num_prefill_reqs:
            layer += self.prefill_attention_time(step)
        layer += self._kv_read_per_tok * step.decode_ctx_tokens
        reqs = step.num_prefill_reqs + step.num_decodes
        lm = self._lm_memo.get(reqs)
        if lm is None:
            lm = self.lm_head_time(reqs)
        return self._layers * layer + lm + fixed + self._per_req * reqs

    def _plain(self) -> bool:
        """``step_time`` and ``prefill_attention_time`` are this class's own (not a
        subclass's, nor set on the instance): the inlined ``pricer`` and ``chunk_time``
        compute what they would."""
        own = vars(self)
        return (type(self).step_time is RooflineCostModel.step_time
                and type(self).prefill_attention_time is RooflineCostModel.prefill_attention_time
                and "step_time" not in own and "prefill_attention_time" not in own)

    def pricer(self) -> Callable[[int, int, float, int, int, int], float]:
        """``step_time`` of a shape's fields (``CostModel.pricer``), with
        ``prefill_attention_time`` inlined: the same operations in the same order
        (``min``/``max`` as comparisons that pick the same float), without building the
        shape. A subclass that overrides ``step_time`` or ``prefill_attention_time`` (one
        that records the steps it prices) gets the generic pricer, through its own
        ``step_time`` (``_plain``).
        ``tests/test_roofline.py`` checks the equality."""
        if not self._plain():
            return super().pricer()
        fixed0, eager, graph_max = self._fixed, self._eager, self._graph_max
        gemm_memo, lm_memo = self._gemm_memo, self._lm_memo
        act, kv, layers, per_req = self._act_per_tok, self._kv_read_per_tok, self._layers, \
            self._per_req
        rows, bpr, tau, split = self._rows, self._blocks_per_row, self._tau_a, self._split_kv
        app = self._attn_per_pair
        split_waves, kv_block = SPLIT_KV_WAVES, KV_BLOCK

        def price(num_prefill_tokens: int, num_prefill_reqs: int, prefill_attn_work: float,
                  prefill_kv_tokens: int, num_decodes: int, decode_ctx_tokens: int) -> float:
            n = num_prefill_tokens + num_decodes
            if n == 0:
                return 0.0
            fixed = fixed0 + (eager if n > graph_max else 0.0)
            gemms = gemm_memo.get(n)
            if gemms is None:
                gemms = self.layer_gemm_time(n)
            layer = n * act + gemms
            reqs = num_prefill_reqs
            if reqs:  # prefill_attention_time
                c = num_prefill_tokens / reqs
                ctx = prefill_kv_tokens / reqs - c
                w = (num_prefill_tokens + reqs * (rows - 1) / 2) * bpr
                if split and w < split_waves:
                    x = (ctx + c) / kv_block
                    x = w * (x if x > 1.0 else 1.0)
                    w = x if x < split_waves else split_waves
                u = (ctx + rows) / (ctx + (c + 1) / 2)
                waves = w + tau * (u if u < 1.0 else 1.0) if w > 1.0 else 1.0
                t_flop = app * prefill_attn_work * waves / w
                t_kv = kv * prefill_kv_tokens
                layer += t_flop if t_flop > t_kv else t_kv
            layer += kv * decode_ctx_tokens
            reqs += num_decodes
            lm = lm_memo.get(reqs)
            if lm is None:
                lm = self.lm_head_time(reqs)
            return layers * layer + lm + fixed + per_req * reqs

        return price

    def chunk_time(self, prefill_ctx: int, num_decodes: int,
                   decode_ctx_tokens: int) -> Callable[[int], float]:
        """``step_time(StepShape.one_chunk(c, prefill_ctx, num_decodes, decode_ctx_tokens))``
        as a function of ``c``, with ``step_time`` and ``prefill_attention_time`` inlined
        for one chunk: the same operations in the same order, on the shape's fields (one
        request: ``reqs`` is 1; ``causal_pairs`` written out; ``min``/``max`` as
        comparisons that pick the same float), without building shapes.
        ``tests/test_roofline.py`` checks the equality. A subclass that overrides
        ``step_time`` or ``prefill_attention_time`` gets the generic one (``_plain``); the
        model's constants are bound once (``_bind_chunk_time``)."""
        if not self._plain():
            return super().chunk_time(prefill_ctx, num_decodes, decode_ctx_tokens)
        return self._one_chunk(prefill_ctx, num_decodes, decode_ctx_tokens)

    def chunk_search(self) -> Callable[[int, int, int, float, int, int], int]:
        """``largest_fitting`` on ``chunk_time`` (``CostModel.chunk_search``) in one
        function: its probes in its order, each priced as ``chunk_time`` prices it
        (``_bind_chunk_search``); the generic search for a subclass that overrides
        ``step_time`` or ``prefill_attention_time`` (``_plain``)."""
        return self._search if self._plain() else super().chunk_search()

    def priced_chunk_search(
            self) -> Callable[[int, int, int, float, int, int, int], tuple[int, float]]:
        """``chunk_search`` and ``chunk_pricer`` of its answer in one function
        (``CostModel.priced_chunk_search``; ``_bind_chunk_search``: the answer's price
        from its probe's sums), or the generic one for a subclass that overrides
        ``step_time`` or ``prefill_attention_time`` (``_plain``)."""
        return self._priced_search if self._plain() else super().priced_chunk_search()

    def chunk_pricer(self) -> Callable[[int, int, int, int], float]:
        """``chunk_time(p, nd, k)(c)`` as one function of ``(c, p, nd, k)``, ``c >= 1``
        (``CostModel.chunk_pricer``; ``_bind_chunk_pricer``), or the generic one for a
        subclass that overrides ``step_time`` or ``prefill_attention_time``."""
        return self._chunk_price if self._plain() else super().chunk_pricer()

    def _bind_chunk_time(self) -> Callable[[int, int, int], Callable[[int], float]]:
        """``chunk_time``'s body for this class's own pricing: the model's constants bound
        once (``__init__`` calls this after setting them; nothing changes them after), so
        that a call binds only its own three arguments."""
        fixed0, eager, graph_max = self._fixed, self._eager, self._graph_max
        gemm_memo, lm_memo = self._gemm_memo, self._lm_memo
        act, kv, layers, per_req = self._act_per_tok, self._kv_read_per_tok, self._layers, \
            self._per_req
        rows, bpr, tau, split = self._rows, self._blocks_per_row, self._tau_a, self._split_kv
        half_rows = 1 * (rows - 1) / 2  # reqs * (rows - 1) / 2 with reqs = 1
        app = self._attn_per_pair
        split_waves, kv_block = SPLIT_KV_WAVES, KV_BLOCK

        def one_chunk(p: int, nd: int, decode_ctx_tokens: int) -> Callable[[int], float]:
            d_kv = kv * decode_ctx_tokens
            # With a chunk the step has 1 + nd requests: its LM head and per-request costs
            # are the same for every c (step_time's lm and per_req * reqs, computed once).
            lm1 = lm_memo.get(1 + nd)
            if lm1 is None:
                lm1 = self.lm_head_time(1 + nd)
            per_req1 = per_req * (1 + nd)

            def t(c: int) -> float:
                n = c + nd
                if not c:  # the decode-only step
                    return self.step_time(StepShape(0, 0, 0.0, 0, nd, decode_ctx_tokens))
                fixed = fixed0 + (eager if n > graph_max else 0.0)
                gemms = gemm_memo.get(n)
                if gemms is None:
                    gemms = self.layer_gemm_time(n)
                layer = n * act + gemms
                # prefill_attention_time(one_chunk(c, p, ...)): one request
                kv_tokens = p + c
                cf = c / 1
                ctx = kv_tokens / 1 - cf
                w = (c + half_rows) * bpr
                if split and w < split_waves:
                    # min(SPLIT_KV_WAVES, w * max(1.0, x)) as comparisons (same floats)
                    x = (ctx + cf) / kv_block
                    x = w * (x if x > 1.0 else 1.0)
                    w = x if x < split_waves else split_waves
                u = (ctx + rows) / (ctx + (cf + 1) / 2)
                waves = w + tau * (u if u < 1.0 else 1.0) if w > 1.0 else 1.0
                t_flop = app * (c * (p + (c + 1) / 2)) * waves / w
                t_kv = kv * kv_tokens
                layer += t_flop if t_flop > t_kv else t_kv
                layer += d_kv
                return layers * layer + lm1 + fixed + per_req1

            return t

        return one_chunk

    def _bind_chunk_pricer(self) -> Callable[[int, int, int, int], float]:
        """``chunk_pricer``'s body: ``chunk_time``'s arithmetic with the exact rewrites
        of ``_bind_chunk_search`` (whose probes price the same way), the model's
        constants bound once."""
        eager, graph_max = self._eager, self._graph_max
        fixed_small, fixed_big = self._fixed + 0.0, self._fixed + eager
        gemm_memo, lm_memo = self._gemm_memo, self._lm_memo
        layer_gemm_time, lm_head_time = self.layer_gemm_time, self.lm_head_time
        act, kv, layers, per_req = self._act_per_tok, self._kv_read_per_tok, self._layers, \
            self._per_req
        rows, bpr, tau, split = self._rows, self._blocks_per_row, self._tau_a, self._split_kv
        half_rows = 1 * (rows - 1) / 2
        app = self._attn_per_pair
        split_waves, kv_block = SPLIT_KV_WAVES, KV_BLOCK

        def price(c: int, p: int, nd: int, decode_ctx_tokens: int) -> float:
            n = c + nd
            gemms = gemm_memo.get(n)
            if gemms is None:
                gemms = layer_gemm_time(n)
            layer = n * act + gemms
            pf = p / 1
            w = (c + half_rows) * bpr
            if split and w < split_waves:
                x = (pf + c) / kv_block
                x = w * (x if x > 1.0 else 1.0)
                w = x if x < split_waves else split_waves
            s = pf + (c + 1) / 2
            if w > 1.0:
                u = (pf + rows) / s
                waves = w + tau * (u if u < 1.0 else 1.0)
            else:
                waves = 1.0
            t_flop = app * (c * s) * waves / w
            t_kv = kv * (p + c)
            layer += t_flop if t_flop > t_kv else t_kv
            layer += kv * decode_ctx_tokens
            reqs = 1 + nd
            lm = lm_memo.get(reqs)
            if lm is None:
                lm = lm_head_time(reqs)
            return (layers * layer + lm + (fixed_big if n > graph_max else fixed_small)
                    + per_req * reqs)

        return price

    def _bind_chunk_search(
            self) -> Callable[[int, int, int, float, int, int, int], tuple[int, float]]:
        """``priced_chunk_search``'s body (``chunk_search``'s too, its price unread) for
        this class's own pricing, the model's constants bound once (as
        ``_bind_chunk_time``). ``largest_fitting``'s probes are a state machine
        here, so that one copy of ``chunk_time``'s arithmetic prices them all, inlined.
        That arithmetic is ``t``'s with exact rewrites only: for integers below 2**53,
        ``(p + c) / 1 - c / 1`` is ``float(p)``, ``(c / 1 + 1) / 2`` is ``(c + 1) / 2`` and
        ``float(p) + (c + 1) / 2`` is both ``u``'s denominator and the causal pairs'
        factor; ``u`` is read only when ``w > 1``; ``fixed`` takes one of its two values.
        Every probe is a chunk of at least 1 token (never the decode-only step). The
        answer, when not 0, is the last probe that fit (every fitting probe becomes
        ``lo`` or the answer): its layer sum before the decodes' KV read is kept
        (``lo_layer``), so its price beside ``k_step`` decode tokens is ``chunk_pricer``'s
        last three operations, in its order, on the same floats.
        ``tests/test_roofline.py`` checks it against ``largest_fitting`` and
        ``chunk_pricer``."""
        eager, graph_max = self._eager, self._graph_max
        fixed_small, fixed_big = self._fixed + 0.0, self._fixed + eager
        gemm_memo, lm_memo = self._gemm_memo, self._lm_memo
        layer_gemm_time = self.layer_gemm_time
        act, kv, layers, per_req = self._act_per_tok, self._kv_read_per_tok, self._layers, \
            self._per_req
        rows, bpr, tau, split = self._rows, self._blocks_per_row, self._tau_a, self._split_kv
        half_rows = 1 * (rows - 1) / 2
        app = self._attn_per_pair
        split_waves, kv_block = SPLIT_KV_WAVES, KV_BLOCK

        base_memo: dict[int, float] = {}  # n -> n * act + layer_gemm_time(n)

        def search(p: int, nd: int, decode_ctx_tokens: int, target: float, c_max: int,
                   guess: int, k_step: int) -> tuple[int, float]:
            d_kv = kv * decode_ctx_tokens
            lm1 = lm_memo.get(1 + nd)
            if lm1 is None:
                lm1 = self.lm_head_time(1 + nd)
            per_req1 = per_req * (1 + nd)
            pf = p / 1  # chunk_time's ctx, (p + c) / 1 - c / 1, for every c
            pr = pf + rows  # u's numerator
            # largest_fitting's state: 0 the guess, 1 up from it (lo fits), 2 down from it
            # (hi does not), 3 chunk 1 (no guess), 4 c_max (1 fits), 5 bisecting [lo, hi]
            lo = hi = 0
            lo_layer = 0.0
            step = 1
            if 0 < guess <= c_max:
                c, state = guess, 0
            else:
                c, state = 1, 3
            while True:
                # v = chunk_time(p, nd, decode_ctx_tokens)(c), c >= 1
                n = c + nd
                layer = base_memo.get(n)
                if layer is None:
                    gemms = gemm_memo.get(n)
                    if gemms is None:
                        gemms = layer_gemm_time(n)
                    layer = base_memo[n] = n * act + gemms
                w = (c + half_rows) * bpr
                if split and w < split_waves:
                    x = (pf + c) / kv_block
                    x = w * (x if x > 1.0 else 1.0)
                    w = x if x < split_waves else split_waves
                s = pf + (c + 1) / 2
                if w > 1.0:
                    u = pr / s
                    waves = w + tau * (u if u < 1.0 else 1.0)
                else:
                    waves = 1.0
                t_flop = app * (c * s) * waves / w
                t_kv = kv * (p + c)
                layer += t_flop if t_flop > t_kv else t_kv
                fits = (layers * (layer + d_kv) + lm1
                        + (fixed_big if n > graph_max else fixed_small) + per_req1) <= target
                if fits:
                    lo_layer = layer  # (c becomes lo or the answer)
                if state == 0:
                    if fits:
                        lo, state = c, 1
                        c = lo + 1 if lo < c_max else c_max
                        if c == lo:
                            break  # c_max fits
                    else:
                        hi, state = c, 2
                        c = hi - 1 if hi > 1 else 1
                    continue
                if state == 1:
                    if fits:
                        lo, step = c, step * 2
                        c = lo + step
                        if c > c_max:
                            c = c_max
                        if c == lo:
                            break
                        continue
                    hi = c
                elif state == 2:
                    if not fits:
                        if c == 1:
                            return 0, 0.0
                        hi, step = c, step * 2
                        c = hi - step
                        if c < 1:
                            c = 1
                        continue
                    lo = c
                elif state == 5:
                    if fits:
                        lo = c
                    else:
                        hi = c
                elif state == 3:
                    if not fits:
                        return 0, 0.0
                    lo, hi, c, state = 1, c_max, c_max, 4
                    continue
                elif fits:  # state 4: c_max fits
                    lo = c
                    break
                state = 5
                if hi - lo <= 1:
                    break
                c = (lo + hi) // 2
            # chunk_pricer(lo, p, nd, k_step): lo_layer + kv * k_step, then step_time's sums
            n = lo + nd
            return lo, (layers * (lo_layer + kv * k_step) + lm1
                        + (fixed_big if n > graph_max else fixed_small) + per_req1)

        return search

    def decode_steps(self, num_decodes: int, decode_ctx_tokens: int, max_steps: int,
                     start: float, limit: float) -> list[float]:
        """``step_time`` of each decode-only step, inlined: the same operations in the
        same order (bit-identical results; tests check), without building shapes."""
        n = num_decodes
        if n <= 0:
            return super().decode_steps(n, decode_ctx_tokens, max_steps, start, limit)
        # device_time's layer sum up to the decode KV read, in its order (adding the
        # empty prefill attention, 0.0, is exact), then step_time's sums.
        base = n * self._act_per_tok + self.layer_gemm_time(n)
        base += 0.0
        lm = self.lm_head_time(n)
        fixed = self._fixed + (self._eager if n > self._graph_max else 0.0)
        per_req = self._per_req * n
        kv, layers = self._kv_read_per_tok, self._layers
        out: list[float] = []
        append = out.append
        t, ctx, k = start, decode_ctx_tokens, 0
        while k < max_steps and t < limit:
            dt = layers * (base + kv * ctx) + lm + fixed + per_req
            append(dt)
            t += dt
            ctx += n
            k += 1
        return out

    def describe(self) -> dict[str, object]:
        return {"hardware": self.hardware.name, "model": self.model.name, "tp": self.tp,
                "attention_backend": self.attention_kernel,
                "params": asdict(self.params), "kv_capacity_tokens": self.kv_capacity_tokens}
