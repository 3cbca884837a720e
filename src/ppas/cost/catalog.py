"""Hardware and model catalogs for the roofline cost model (public datasheet/config facts).

Sources: vendor datasheets and the models' Hugging Face ``config.json`` (see
``shared/spec/catalog-facts.md``). Corrections made here, not fitted away:

* RTX 5090 dense BF16 tensor throughput is 419 TFLOP/s, not ~209.5: the P-PAS paper
  measured one Qwen2.5-3B gate-up GEMM (16384 x 2048 x 22016, 1.48 TFLOP) in 6.66 ms,
  i.e. 222 TFLOP/s, which a 209.5 TFLOP/s part cannot reach. 209.5 is half of the
  datasheet's 419 dense figure (the FP16-accumulate/sparsity row confusion).
* The per-layer weight count uses q/o widths ``heads * head_dim``, which differs from
  ``hidden`` for Qwen3-0.6B (16 x 128 = 2048 vs hidden 1024); the spec's formula assumes
  ``heads * head_dim == hidden``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppas.config import require
from ppas.registry import Registry


@dataclass(frozen=True, slots=True)
class Hardware:
    name: str
    bf16_tflops: float  # dense tensor-core peak, TFLOP/s
    mem_bw_gbs: float  # memory bandwidth, GB/s
    mem_gb: float  # device memory, GB (10^9 bytes)

    def __post_init__(self) -> None:
        require(self.bf16_tflops > 0 and self.mem_bw_gbs > 0 and self.mem_gb > 0,
                f"hardware {self.name}: figures must be > 0")


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
    def layer_params(self) -> int:
        """Weights per decoder layer: q, k, v, o projections and the SwiGLU MLP."""
        h = self.hidden
        return h * (self.q_width + 2 * self.kv_width) + self.q_width * h + 3 * h * self.intermediate

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


HARDWARE: Registry[Hardware] = Registry("hardware")
MODELS: Registry[ModelArch] = Registry("model")

for _hw in (
    Hardware("rtx5090", 419.0, 1792.0, 34.2),  # 32 GiB GDDR7
    Hardware("a100-sxm-80gb", 312.0, 2039.0, 85.9),  # 80 GiB HBM2e
    Hardware("h100-sxm-80gb", 989.0, 3350.0, 85.9),  # 80 GiB HBM3
    Hardware("h200", 989.0, 4800.0, 150.0),  # 141 GB HBM3e; ~139.8 GiB visible
    Hardware("l40s", 362.0, 864.0, 51.5),  # 48 GiB GDDR6
):
    HARDWARE.add(_hw.name, _hw)

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
