"""Roofline step-time model: GEMMs, attention over the cached context, weight and KV
traffic, plus a per-step overhead. Only physical quantities are calibrated (achieved
fractions of peak FLOP/s and bandwidth, saturation sizes, overheads); hardware and model
facts come from ``ppas.cost.catalog``. The calibrated values live in
``ppas/data/roofline_calibration.json`` (written by ``benchmarks/calibrate_roofline.py``
from the RTX 5090 / Qwen2.5-3B data only).

Per step with N = prefill tokens + decodes, per layer (tensor-parallel degree t):

    t_gemm = max(2 N P_layer / (F eff_g(N)),  W_layer / BW)      eff_g(N) = g N / (N + n_g)
    t_attn = sum over chunks max(4 H_q d c (p + (c+1)/2) / (F eff_a(c')), KV(p + c) / BW)
             + KV(decode contexts) / BW_decode                     eff_a(c) = a c / (c + n_a)
    c'     = c ((p + c) / c)^e   (a long cached context restores parallelism: split-KV)
    step   = L (t_gemm + t_attn) + t_lm_head + overhead (+ L eager, when N > CUDA-graph max)
             + per_request * requests

where F, BW are the hardware peaks times the achieved fractions. The saturation terms
model why many small chunks cost more than one large chunk (P-PAS §2: 2k vs 16k chunks).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from importlib import resources

from ppas.config import require
from ppas.cost.base import CostModel, StepShape
from ppas.cost.catalog import HARDWARE, MODELS, Hardware, ModelArch
from ppas.errors import PpasError

REF_HIDDEN, REF_HEADS = 2048, 16  # Qwen2.5-3B, the calibration model


@dataclass(frozen=True)
class RooflineParams:
    """Achieved-efficiency parameters (dimensionless fractions, token counts, seconds)."""

    gemm_eff: float = 0.54  # fraction of peak FLOP/s reached by large GEMMs
    # Saturation sizes are stated for Qwen2.5-3B's shapes (hidden 2048, 16 query heads) and
    # scale with the parallel work a token brings: a GEMM's output tiles grow with the
    # hidden size, attention's thread blocks with the number of query heads per GPU.
    gemm_n_half: float = 180.0  # tokens at which GEMM efficiency is half its maximum
    attn_eff: float = 0.47  # fraction of peak FLOP/s reached by prefill attention
    attn_c_half: float = 600.0  # query-chunk length at which attention eff. is half
    # How much a long cached context restores attention parallelism for short chunks
    # (split-KV kernels): the chunk counts as c * ((p + c) / c) ** attn_ctx_exp query rows.
    # 0 = query length alone decides the efficiency.
    attn_ctx_exp: float = 0.0
    bw_eff: float = 0.85  # fraction of peak memory bandwidth for weights and KV reads
    # Decode attention (one query row per request over its whole KV) reaches a lower
    # fraction of peak bandwidth than streaming reads do.
    decode_bw_eff: float = 0.85
    step_overhead_s: float = 0.004  # scheduling, sampling, host sync: every step
    # vLLM replays CUDA graphs for steps of up to ``cudagraph_max_tokens`` tokens (its
    # default capture sizes end at 512); larger steps launch every kernel eagerly, which
    # costs this much more per decoder layer.
    eager_layer_overhead_s: float = 0.0
    cudagraph_max_tokens: int = 512
    per_req_overhead_s: float = 0.00002  # per scheduled request (metadata, sampling)
    mem_util: float = 0.9  # vLLM --gpu-memory-utilization
    reserve_gb: float = 1.5  # CUDA context, graphs, allocator slack (not KV)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            require(v >= 0, f"roofline: {f.name} must be >= 0, got {v}")
        require(0 < self.gemm_eff <= 1 and 0 < self.attn_eff <= 1 and 0 < self.bw_eff <= 1
                and 0 < self.decode_bw_eff <= 1,
                "roofline: efficiencies must be in (0, 1]")
        require(0 < self.mem_util <= 1, "roofline: mem_util must be in (0, 1]")

    @staticmethod
    def calibrated() -> RooflineParams:
        """The parameters fitted on RTX 5090 / Qwen2.5-3B (see module docstring)."""
        path = resources.files("ppas") / "data" / "roofline_calibration.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return RooflineParams()
        return RooflineParams(**data["params"])


class RooflineCostModel(CostModel):
    def __init__(
        self,
        hardware: Hardware | str,
        model: ModelArch | str,
        params: RooflineParams | None = None,
        tp: int = 1,
        max_num_batched_tokens: int = 16384,
    ) -> None:
        hw = HARDWARE.get(hardware) if isinstance(hardware, str) else hardware
        m = MODELS.get(model) if isinstance(model, str) else model
        require(tp >= 1, f"tensor-parallel degree must be >= 1, got {tp}")
        self.hardware, self.model, self.tp = hw, m, tp
        self.params = p = params or RooflineParams.calibrated()
        flops = hw.bf16_tflops * 1e12
        bw = hw.mem_bw_gbs * 1e9 * p.bw_eff
        L = m.layers
        # Per-token constants, whole model, per GPU (tensor parallel splits every term).
        self._gemm_flops_per_tok = 2.0 * L * m.layer_params / tp
        self._gemm_peak = flops * p.gemm_eff
        self._weight_time = m.weight_bytes / tp / bw
        self._attn_flops_per_pair = 4.0 * L * m.q_width / tp
        self._attn_peak = flops * p.attn_eff
        self._kv_read_per_tok = m.kv_bytes_per_token / tp / bw
        self._decode_kv_per_tok = m.kv_bytes_per_token / tp / (hw.mem_bw_gbs * 1e9
                                                               * p.decode_bw_eff)
        self._lm_head_per_req = 2.0 * m.hidden * m.vocab / tp / self._gemm_peak
        self._n_g = p.gemm_n_half * REF_HIDDEN / (m.hidden / tp)
        self._n_a = p.attn_c_half * REF_HEADS / (m.heads / tp)
        self._ctx_exp = p.attn_ctx_exp
        self._fixed = p.step_overhead_s
        self._eager = p.eager_layer_overhead_s * m.layers
        self._graph_max = p.cudagraph_max_tokens
        self._per_req = p.per_req_overhead_s
        # KV capacity: vLLM's budget minus weights, activations for one full step, reserve.
        act_bytes = max_num_batched_tokens * (m.hidden * 6 + 2 * m.intermediate) * 2
        free = hw.mem_gb * 1e9 * p.mem_util - m.weight_bytes / tp - act_bytes - p.reserve_gb * 1e9
        if free <= 0:
            raise PpasError(
                f"model {m.name} ({m.weight_bytes / 1e9:.1f} GB of weights) leaves no KV cache "
                f"on {hw.name} ({hw.mem_gb:g} GB) at tensor-parallel degree {tp}; raise --tp"
            )
        self.kv_capacity_tokens = int(free * tp / m.kv_bytes_per_token)

    def step_time(self, step: StepShape) -> float:
        n = step.num_prefill_tokens + step.num_decodes
        if n == 0:
            return 0.0
        # GEMMs: compute-bound with size-dependent efficiency, or weight-read bound.
        t_gemm = self._gemm_flops_per_tok * (n + self._n_g) / self._gemm_peak
        if t_gemm < self._weight_time:
            t_gemm = self._weight_time
        # Prefill attention: causal pairs at chunk-length-dependent efficiency (mean chunk
        # length of the step), or KV-read bound; decode attention reads its KV once.
        t_attn = 0.0
        if step.num_prefill_reqs:
            c_mean = step.num_prefill_tokens / step.num_prefill_reqs
            if self._ctx_exp:
                c_mean *= (step.prefill_kv_tokens / step.num_prefill_tokens) ** self._ctx_exp
            t_flop = (self._attn_flops_per_pair * step.prefill_attn_work
                      * (c_mean + self._n_a) / c_mean / self._attn_peak)
            t_kv = self._kv_read_per_tok * step.prefill_kv_tokens
            t_attn = t_flop if t_flop > t_kv else t_kv
        t_attn += self._decode_kv_per_tok * step.decode_ctx_tokens
        reqs = step.num_prefill_reqs + step.num_decodes
        fixed = self._fixed + (self._eager if n > self._graph_max else 0.0)
        return (t_gemm + t_attn + self._lm_head_per_req * reqs + fixed
                + self._per_req * reqs)

    def decode_steps(self, num_decodes: int, decode_ctx_tokens: int, max_steps: int,
                     start: float, limit: float) -> list[float]:
        """``step_time`` of each decode-only step, inlined: the same operations in the
        same order (bit-identical results; tests check), without building shapes."""
        n = num_decodes
        if n <= 0:
            return super().decode_steps(n, decode_ctx_tokens, max_steps, start, limit)
        t_gemm = self._gemm_flops_per_tok * (n + self._n_g) / self._gemm_peak
        if t_gemm < self._weight_time:
            t_gemm = self._weight_time
        lm = self._lm_head_per_req * n
        fixed = self._fixed + (self._eager if n > self._graph_max else 0.0)
        per_req = self._per_req * n
        kv = self._decode_kv_per_tok
        out: list[float] = []
        append = out.append
        t, ctx, k = start, decode_ctx_tokens, 0
        while k < max_steps and t < limit:
            dt = t_gemm + (0.0 + kv * ctx) + lm + fixed + per_req
            append(dt)
            t += dt
            ctx += n
            k += 1
        return out

    def describe(self) -> dict[str, object]:
        return {"hardware": self.hardware.name, "model": self.model.name, "tp": self.tp,
                "params": asdict(self.params), "kv_capacity_tokens": self.kv_capacity_tokens}
