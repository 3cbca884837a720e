"""Hardware and model catalogs for the roofline cost model: public, measured facts only.

A GPU is described by what its kernels *reach*, not by one efficiency factor carried
across parts (issue 10): the dense BF16 GEMM throughput with FP32 accumulation (what
PyTorch's BF16 GEMMs use), the attention-forward throughput of the backend vLLM picks on
that architecture, the achievable memory bandwidth, and the SM count that sets how GEMM
tiles and attention blocks quantise into waves. Every figure cites its source in
``shared/spec/catalog-facts.md``; corrections are made here, never fitted away:

* RTX 5090: 209.5 TFLOP/s is the dense FP32-accumulate peak; 419 is its FP16-accumulate
  figure (838 the sparse one). GeForce parts run FP32 accumulation at half rate (RTX 4090:
  165 vs 330). The P-PAS paper (§2) measured one Qwen2.5-3B gate-up GEMM (16384 x 2048 x
  22016, 1.478 TFLOP) in 6.66 ms = 222 TFLOP/s, above the 209.5 spec through boost
  clocks, and FlashAttention over one layer's first 16k causal tokens (1.100 TFLOP) in
  5.83 ms = 188.6 TFLOP/s. Those two measurements are the card's achieved throughputs.
* Datacenter parts run FP32 accumulation at full rate and reach another fraction of peak:
  A100 SXM cuBLAS 250-290 TFLOP/s (we take the middle, 270), FlashAttention-2 up to ~230;
  H100 SXM cuBLAS 600-780 (middle, 690), FlashAttention-3 ~620 at head dim 128 and 16k
  tokens (the shape class of our prompts). H200 has the H100's compute die and clocks.
* Memory bandwidth: the datasheet figure times 0.9, the fraction measured on an H200 in
  this workplace (device copy ~4.3 of 4.8 TB/s); the H200 uses the measurement itself.
* L40S has no public measured figure in the facts page: its GEMM and attention are
  estimated from the datasheet peak with the A100's reached fractions (full-rate FP32
  accumulation, FlashAttention-2) and marked as an estimate.
* The per-layer weight count uses q/o widths ``heads * head_dim``, which differs from
  ``hidden`` for Qwen3-0.6B (16 x 128 = 2048 vs hidden 1024).
* A40 (sm_86, GA102): not in the facts page; NVIDIA's A40 datasheet gives 149.7 TFLOP/s
  dense BF16 tensor (299.4 sparse; professional GA102 parts run FP32 accumulation at full
  rate), 696 GB/s GDDR6, 48 GiB; 84 SMs (10,752 CUDA cores / 128 per SM).
* Attention physics (``AttentionKernel``, ``attention_flops``): the attention kernel is a
  parameter of the cost model, vLLM's per architecture by default (``ATTENTION_BACKEND``).
  What a kernel reaches at head dim 128 on large shapes is a published figure per
  (kernel, architecture): FlashAttention-2 on Ampere ~230 TFLOP/s (Dao 2023), on Hopper
  ~35% of peak (it has no wgmma/TMA path: Shah et al. 2024), FlashAttention-3 on Hopper
  ~620 at head dim 128, 16k tokens. cuDNN's fused attention (PyTorch's SDPA on Hopper) is
  the same class of kernel as FlashAttention-3 (wgmma, TMA, warp specialisation) and has no
  figure in the facts page: it is priced as FlashAttention-3 (an assumption; the H200 runs
  that timed it are held out and judge it). The head-dimension dependence is the softmax's:
  every query-key pair costs 4d tensor-core FLOPs per head plus one exponential on the
  special-function units (16 per clock per SM on Ampere, Hopper, Ada and Blackwell), so a
  kernel reaches ``d / (d + d0)`` of its large-head-dim throughput with ``d0 = (tensor FLOP
  per clock per SM) / (4 x 16)``: 64 on Hopper (989 TFLOP/s at 1.83 GHz over 132 SMs), 32
  on the A100, 16 on the A40/L40S, 8 on the RTX 5090 (half-rate FP32 accumulation). On the
  H100 this gives FlashAttention-3 744 TFLOP/s at head dim 256 from 620 at 128: the paper's
  ~740 (its "up to" figure, reached at head dim 256), a check, not a fit.
* GEMM physics (``GemmPhysics``): where measured kernels exist (Vidur's per-operator
  profiles of A100, H100, A40; our H200 step runs), ``benchmarks/kernel_fidelity.py --fit``
  fits what each GPU's GEMMs reach and each architecture's kernel shape, and writes
  ``ppas/data/kernel_physics.json``, read here. GPUs without such data (RTX 5090, L40S)
  keep the plain roofline (no entry).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources

from ppas.core.config import require
from ppas.core.registry import Registry

#: Memory bandwidth reached by streaming kernels, as a fraction of the datasheet figure:
#: an H200 in this workplace copies ~4.3 of its 4.8 TB/s (catalog-facts.md).
BW_FRACTION = 0.9
#: Reached fractions of the FP32-accumulate peak used only for GPUs without a public
#: measurement (A100's middle cuBLAS figure 270/312, FlashAttention-2 ~230/312).
ESTIMATE_GEMM_FRACTION, ESTIMATE_ATTN_FRACTION = 270 / 312, 230 / 312

#: vLLM's default attention backend by GPU architecture (catalog-facts.md): FlashAttention-3
#: on Hopper (sm_90), FlashAttention-2 on Ampere, Ada and GeForce Blackwell (no FA3 there).
ATTENTION_BACKEND = {"sm_80": "flash-attn-2", "sm_86": "flash-attn-2", "sm_89": "flash-attn-2",
                     "sm_90": "flash-attn-3", "sm_120": "flash-attn-2"}
#: Special-function-unit exponentials per clock per SM (the softmax's exp), on every
#: architecture here (Ampere, Ada, Hopper, GeForce Blackwell): the FlashAttention-3 paper's
#: 3.9 TFLOP/s for the H100 SXM is 16 x 132 SMs x 1.83 GHz.
SFU_EXP_PER_CLOCK_SM = 16


@dataclass(frozen=True, slots=True)
class AttentionKernel:
    """One attention kernel's geometry (facts about the kernel build, not fitted): query
    rows per thread block (``block_rows``) and whether it splits the KV of a small prefill
    grid over more blocks (``split_kv``: FlashAttention-3 does, and so does PyTorch's
    FlashAttention-2 build, whose forward applies flash-attn's num_splits heuristic; vLLM's
    paged FlashAttention-2 build and cuDNN split for decoding only). ``family`` names the
    kernel whose published throughput it has (the same code, another build)."""

    name: str
    block_rows: int
    split_kv: bool
    family: str = ""

    @property
    def throughput_of(self) -> str:
        return self.family or self.name


ATTENTION_KERNELS = {k.name: k for k in (
    AttentionKernel("flash-attn-2", 64, False),
    AttentionKernel("flash-attn-3", 128, True),
    AttentionKernel("sdpa-flash-attn-2", 64, True, family="flash-attn-2"),
    AttentionKernel("cudnn", 128, False),
)}
#: Published reached attention throughput at head dim 128, large shapes, where the kernel
#: is not vLLM's on that architecture (vLLM's own is the GPU's ``attn_tflops``): as a
#: fraction of the dense BF16 peak, or ``None`` for "as vLLM's kernel there".
#: FlashAttention-2 on Hopper ~35% (Shah et al. 2024); cuDNN on Hopper priced as FA3.
OTHER_ATTENTION: dict[tuple[str, str], float | None] = {
    ("flash-attn-2", "hopper"): 0.35,
    ("cudnn", "hopper"): None,
}
#: The head dimension the catalog's attention figures are quoted at.
ATTN_REFERENCE_HEAD_DIM = 128

#: Architecture families: GPUs of one family share their GEMM kernels' shape (fixed latency,
#: wave tail, roofline knee: ``GemmPhysics``); throughput and bandwidth are per GPU.
FAMILY = {"sm_80": "ampere", "sm_86": "ampere", "sm_89": "ada", "sm_90": "hopper",
          "sm_120": "blackwell-consumer"}

#: vLLM captures CUDA graphs for steps of up to this many tokens (its default capture sizes
#: end at 512 in the releases we target) and launches larger steps eagerly.
CUDAGRAPH_MAX_TOKENS = 512


@dataclass(frozen=True, slots=True)
class GemmPhysics:
    """What one GPU's BF16 GEMMs reach, fitted from measured kernels (module doc). One GEMM
    of ``n`` tokens, depth K and width N (per GPU) takes

        latency + (weights^knee + compute^knee)^(1 / knee)
        weights = 2 K N bytes / weight_bw,   compute = 2 n K N / tflops + tail (waves)

    ``tflops`` and ``weight_bw_gbs`` are the GPU's (its tensor cores and memory);
    ``latency_s`` (a kernel's ramp-up and drain), ``tail_waves`` (fraction of a wave of
    output tiles lost at the end of the grid) and ``knee`` (how sharply a GEMM turns from
    streaming its weights to computing: infinity is the plain roofline's max, 1 no
    overlap of loads and math) are its architecture's (``FAMILY``)."""

    tflops: float
    weight_bw_gbs: float
    latency_s: float
    tail_waves: float
    knee: float
    source: str = ""

    def __post_init__(self) -> None:
        require(self.tflops > 0 and self.weight_bw_gbs > 0,
                "gemm physics: tflops and weight_bw_gbs must be > 0")
        require(0 <= self.latency_s < 1e-3, "gemm physics: latency_s must be in [0, 1 ms)")
        require(0 <= self.tail_waves <= 1, "gemm physics: tail_waves must be in [0, 1]")
        require(self.knee >= 1, "gemm physics: knee must be >= 1")


@dataclass(frozen=True, slots=True)
class Hardware:
    """One GPU. ``bf16_tflops`` is the datasheet's dense BF16 peak with FP32 accumulation;
    ``gemm_tflops`` / ``attn_tflops`` are what large GEMMs / vLLM's attention backend here
    reach (attention: at head dim 128; None: estimated from the peak, see ``ESTIMATE_*``);
    ``mem_bw_gbs`` is the datasheet bandwidth, ``achieved_bw_gbs`` the reached one (None:
    ``BW_FRACTION`` of it)."""

    name: str
    bf16_tflops: float  # dense tensor-core peak with FP32 accumulate, TFLOP/s
    mem_bw_gbs: float  # datasheet memory bandwidth, GB/s
    mem_gb: float  # device memory, GB (10^9 bytes)
    sms: int = 128  # streaming multiprocessors (wave quantisation of GEMM tiles / blocks)
    arch: str = "sm_80"
    gemm_tflops: float | None = None
    attn_tflops: float | None = None
    achieved_bw_gbs: float | None = None
    source: str = ""
    gemm: GemmPhysics | None = None  # fitted GEMM physics (None: the plain roofline)
    # The clock the datasheet's tensor peak is quoted at (GHz): with ``sms`` it gives the
    # tensor FLOP per clock per SM, which sets the softmax's share (``softmax_head_dim``).
    peak_clock_ghz: float = 1.41  # (the A100's; give each GPU its own)

    def __post_init__(self) -> None:
        require(self.bf16_tflops > 0 and self.mem_bw_gbs > 0 and self.mem_gb > 0
                and self.sms > 0 and self.peak_clock_ghz > 0,
                f"hardware {self.name}: figures must be > 0")
        for v in (self.gemm_tflops, self.attn_tflops, self.achieved_bw_gbs):
            require(v is None or v > 0, f"hardware {self.name}: figures must be > 0")
        require(self.arch in ATTENTION_BACKEND,
                f"hardware {self.name}: arch must be one of {', '.join(ATTENTION_BACKEND)}")

    @property
    def attention_backend(self) -> str:
        return ATTENTION_BACKEND[self.arch]

    @property
    def family(self) -> str:
        return FAMILY[self.arch]

    @property
    def gemm_flops(self) -> float:
        """FLOP/s reached by large BF16 GEMMs (full waves): fitted where measured."""
        if self.gemm is not None:
            return self.gemm.tflops * 1e12
        t = self.gemm_tflops or self.bf16_tflops * ESTIMATE_GEMM_FRACTION
        return t * 1e12

    @property
    def attn_flops(self) -> float:
        """FLOP/s reached by the attention backend's forward pass on large shapes."""
        t = self.attn_tflops or self.bf16_tflops * ESTIMATE_ATTN_FRACTION
        return t * 1e12

    @property
    def softmax_head_dim(self) -> float:
        """``d0``: the head dimension at which a query-key pair's exponential costs as much
        as its tensor-core FLOPs (tensor FLOP per clock per SM / (4 x 16 exp per clock per
        SM)); attention reaches ``d / (d + d0)`` of its large-head-dim throughput."""
        per_clock_sm = self.bf16_tflops * 1e12 / (self.sms * self.peak_clock_ghz * 1e9)
        return per_clock_sm / (4 * SFU_EXP_PER_CLOCK_SM)

    def attention_flops(self, kernel: str | None = None, head_dim: int = 128) -> float:
        """FLOP/s the attention ``kernel`` (None: vLLM's here) reaches on large shapes at
        ``head_dim``: its published figure at head dim 128, scaled by the softmax's share."""
        require((kernel or self.attention_backend) in ATTENTION_KERNELS,
                f"unknown attention kernel {kernel!r}; allowed: {', '.join(ATTENTION_KERNELS)}")
        name = ATTENTION_KERNELS[kernel or self.attention_backend].throughput_of
        if name == self.attention_backend:
            base = self.attn_flops
        else:
            require((name, self.family) in OTHER_ATTENTION,
                    f"no published throughput of {name} on {self.family} ({self.name})")
            frac = OTHER_ATTENTION[(name, self.family)]
            base = self.attn_flops if frac is None else frac * self.bf16_tflops * 1e12
        d0, d, d_ref = self.softmax_head_dim, head_dim, ATTN_REFERENCE_HEAD_DIM
        return base * (d / (d + d0)) / (d_ref / (d_ref + d0))

    @property
    def bandwidth(self) -> float:
        """Bytes/s reached by streaming reads (weights, KV cache, activations)."""
        return (self.achieved_bw_gbs or self.mem_bw_gbs * BW_FRACTION) * 1e9


@dataclass(frozen=True, slots=True)
class ModelArch:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    dtype_bytes: int = 2  # BF16

    def __post_init__(self) -> None:
        require(min(self.layers, self.hidden, self.heads, self.kv_heads, self.head_dim,
                    self.intermediate, self.vocab) > 0, f"model {self.name}: sizes must be > 0")

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def gemms(self) -> tuple[tuple[int, int], ...]:
        """(K, output width) of each GEMM of one decoder layer: fused qkv, o, fused
        gate-up, down (vLLM fuses q/k/v and gate/up into one GEMM each)."""
        h, i = self.hidden, self.intermediate
        return ((h, self.q_width + 2 * self.kv_width), (self.q_width, h), (h, 2 * i), (i, h))

    @property
    def layer_params(self) -> int:
        """Weights per decoder layer: q, k, v, o projections and the SwiGLU MLP."""
        return sum(k * n for k, n in self.gemms)

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def num_params(self) -> int:
        return self.layers * self.layer_params + self.embed_params

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) x layers x kv_heads x head_dim x bytes. Qwen2.5-3B: 36,864 B."""
        return 2 * self.layers * self.kv_width * self.dtype_bytes

    @property
    def activation_bytes_per_token_layer(self) -> int:
        """Bytes one token moves through a layer's memory-bound kernels (vLLM's fused
        kernels): two fused residual-add + RMSNorm (read x and residual, write both: 4h
        each), SiLU-and-mul (read 2I, write I), rotary on q and k (read and write), the
        KV-cache write (k and v)."""
        h, i = self.hidden, self.intermediate
        return self.dtype_bytes * (8 * h + 3 * i + 2 * (self.q_width + self.kv_width)
                                   + 2 * self.kv_width)


#: Fitted GEMM physics (``benchmarks/kernel_fidelity.py --fit``), attached to its GPUs.
PHYSICS_FILE = "kernel_physics.json"


def load_gemm_physics() -> dict[str, GemmPhysics]:
    """GPU name -> its fitted ``GemmPhysics`` ({} when the file is absent)."""
    try:
        doc = json.loads((resources.files("ppas") / "data" / PHYSICS_FILE).read_text())
    except FileNotFoundError:
        return {}
    out = {}
    for name, g in doc["gpus"].items():
        fam = doc["families"][g["family"]]
        out[name] = GemmPhysics(g["tflops"], g["weight_bw_gbs"], fam["latency_s"],
                                fam["tail_waves"], fam["knee"], source=g["fitted_on"])
    return out


HARDWARE: Registry[Hardware] = Registry("hardware")
_PHYSICS = load_gemm_physics()
MODELS: Registry[ModelArch] = Registry("model")

for _hw in (
    Hardware("rtx5090", 209.5, 1792.0, 34.2, sms=170, arch="sm_120",  # 32 GiB GDDR7
             gemm_tflops=222.0, attn_tflops=188.6, peak_clock_ghz=2.407,
             source="peak: NVIDIA Blackwell spec (FP32 accumulate); reached: P-PAS paper §2 "
                    "(gate-up GEMM 6.66 ms, FlashAttention-2 16k chunk 5.83 ms)"),
    Hardware("a100-sxm-80gb", 312.0, 2039.0, 85.9, sms=108, arch="sm_80",  # 80 GiB HBM2e
             gemm_tflops=270.0, attn_tflops=230.0, peak_clock_ghz=1.41,
             source="cuBLAS 250-290 TFLOP/s, FlashAttention-2 up to ~230 (Dao 2023)"),
    Hardware("h100-sxm-80gb", 989.0, 3350.0, 85.9, sms=132, arch="sm_90",  # 80 GiB HBM3
             gemm_tflops=690.0, attn_tflops=620.0, peak_clock_ghz=1.83,
             source="cuBLAS 600-780 TFLOP/s; FlashAttention-3 ~620 at head dim 128, 16k "
                    "(Shah et al. 2024)"),
    Hardware("h200", 989.0, 4800.0, 150.0, sms=132, arch="sm_90",  # 141 GB HBM3e
             gemm_tflops=690.0, attn_tflops=620.0, achieved_bw_gbs=4300.0,
             peak_clock_ghz=1.83,
             source="H100 compute die and clocks; bandwidth: device copy ~4.3 TB/s measured "
                    "on an H200 in this workplace"),
    Hardware("l40s", 362.0, 864.0, 51.5, sms=142, arch="sm_89",  # 48 GiB GDDR6
             peak_clock_ghz=2.52,
             source="datasheet peak (FP32 accumulate); reached throughputs estimated with "
                    "the A100's fractions (no public measurement in the facts page)"),
    Hardware("a40", 149.7, 696.0, 51.5, sms=84, arch="sm_86",  # 48 GiB GDDR6
             peak_clock_ghz=1.74,
             source="NVIDIA A40 datasheet (149.7 TFLOP/s dense BF16 tensor, 696 GB/s, 48 GiB; "
                    "84 SMs); attention estimated with the A100's fraction; GEMMs fitted on "
                    "Vidur's A40 kernel profile"),
):
    HARDWARE.add(_hw.name, replace(_hw, gemm=_PHYSICS.get(_hw.name)))


for _m in (
    ModelArch("qwen2.5-0.5b", 24, 896, 14, 2, 64, 4864, 151936, True),
    ModelArch("qwen2.5-3b", 36, 2048, 16, 2, 128, 11008, 151936, True),
    ModelArch("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, False),
    ModelArch("smollm3-3b", 36, 2048, 16, 4, 128, 11008, 128256, True),
    ModelArch("llama3.2-1b", 16, 2048, 32, 8, 64, 8192, 128256, True),
    ModelArch("llama3.2-3b", 28, 3072, 24, 8, 128, 8192, 128256, True),
    ModelArch("qwen3-0.6b", 28, 1024, 16, 8, 128, 3072, 151936, True),
    ModelArch("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936, False),
):
    MODELS.add(_m.name, _m)

#: Each model's context (``max_position_embeddings`` of its config.json): vLLM's default
#: max_model_len, above which it rejects a request (prompt + output).
MAX_MODEL_LEN: dict[str, int] = {
    "qwen2.5-0.5b": 32768, "qwen2.5-3b": 32768, "qwen2.5-7b": 32768, "smollm3-3b": 65536,
    "llama3.2-1b": 131072, "llama3.2-3b": 131072, "qwen3-0.6b": 40960, "qwen3-8b": 40960,
}
