"""Measured GEMM kernels beside the roofline's prediction for them (issue 21).

Two sources, both read-only measurements of real GPUs:

* Vidur's per-operator profiles (``shared/data/vidur-profiling``, MIT): one decoder layer's
  QKV, O, gate-up (or up) and down GEMMs of a model shape on A100, H100 and A40, for
  1..4096 tokens (Llama-3-8B: 32k) and tensor parallelism 1..8, the median of many runs;
* our H200 step runs (``benchmarks/results/h200-steps-run*.jsonl``,
  ``benchmarks/gpu_step_times.py``): the four GEMMs of every layer of one engine step.

Each measurement becomes a ``KernelRow``: the GEMMs it ran (depth K, width N per GPU, as
tensor parallelism splits them: QKV and gate-up by width, O and down by depth), the token
rows ``n`` and the measured seconds. ``predict`` prices a row with the roofline's own GEMM
rule (``ppas.cost.roofline.gemm_seconds``) on a ``Hardware``, so a fit of the catalog's
``GemmPhysics`` and the benchmark judge exactly what the simulator runs.

One model per GPU is held out of every fit (``held_out``); the A40 has one model only, so
its tensor-parallel degree 2 is held out instead. No torch, no scipy.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ppas.calibrate.gpu_steps import load_records
from ppas.core.errors import PpasError
from ppas.cost.catalog import MODELS, Hardware
from ppas.cost.roofline import ROW_PARALLEL, gemm_seconds, gemm_terms

#: Vidur's GPU names -> the catalog's (Vidur profiled 80 GB SXM A100s and H100s).
VIDUR_GPUS = {"a100": "a100-sxm-80gb", "h100": "h100-sxm-80gb", "a40": "a40"}
#: The four GEMMs of a layer: Vidur's operator names, in ``ModelArch.gemms`` order.
OPS = ("qkv", "o", "gate_up", "down")
VIDUR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
#: Held out of every fit: one model per GPU (the A40's single model: its TP degree 2).
HELD_OUT_MODEL = {"a100-sxm-80gb": "Meta-Llama-3-8B", "h100-sxm-80gb": "internlm-20b",
                  "h200": ("llama3.2-3b", "qwen2.5-7b")}
HELD_OUT_TP = {"a40": 2}
#: Token-count bands of the report (upper bounds, inclusive).
BANDS = ((16, "1-16"), (128, "17-128"), (512, "129-512"), (2048, "513-2k"),
         (1 << 30, ">2k"))


@dataclass(frozen=True, slots=True)
class KernelRow:
    """One measurement: ``gemms`` ((K, N) per GPU, each run ``repeat`` times: the layers of
    a step) over ``tokens`` rows took ``seconds``. ``op`` names one GEMM or "layer" (the
    four GEMMs of one layer) or "step" (the GEMMs of all layers of an H200 step)."""

    gpu: str
    model: str
    tp: int
    tokens: int
    op: str
    gemms: tuple[tuple[float, float], ...]
    repeat: int
    seconds: float

    @property
    def held_out(self) -> bool:
        m = HELD_OUT_MODEL.get(self.gpu, ())
        return (self.model in m if isinstance(m, tuple) else self.model == m) or \
            HELD_OUT_TP.get(self.gpu) == self.tp

    @property
    def band(self) -> str:
        return next(name for top, name in BANDS if self.tokens <= top)


def layer_shapes(hidden: int, heads: int, kv_heads: int, head_dim: int, mlp_out: int,
                 intermediate: int, tp: int) -> tuple[tuple[float, float], ...]:
    """(K, N) per GPU of the QKV, O, (gate-)up and down GEMMs at TP degree ``tp``."""
    full = ((hidden, (heads + 2 * kv_heads) * head_dim), (heads * head_dim, hidden),
            (hidden, mlp_out), (intermediate, hidden))
    return tuple((k / tp, n) if row else (k, n / tp)
                 for (k, n), row in zip(full, ROW_PARALLEL, strict=True))


def read_vidur(folder: str | Path) -> list[KernelRow]:
    """Every GEMM row and every layer's GEMM sum of Vidur's ``<gpu>_<model>-mlp.csv``."""
    files = sorted(Path(folder).glob("*-mlp.csv"))
    if not files:
        raise PpasError(f"no Vidur profiles (*-mlp.csv) in {folder}")
    rows: list[KernelRow] = []
    for f in files:
        gpu, model = f.name.removesuffix("-mlp.csv").split("_", 1)
        if gpu not in VIDUR_GPUS:
            continue
        with f.open(newline="") as fh:
            for r in csv.DictReader(fh):
                h, heads, kvh = int(r["n_embd"]), int(r["n_head"]), int(r["n_kv_head"])
                inter = int(r["n_expanded_embd"])
                gated = r["use_gated_mlp"] == "True"
                tp, n = int(r["num_tensor_parallel_workers"]), int(r["num_tokens"])
                shapes = layer_shapes(h, heads, kvh, h // heads, (2 if gated else 1) * inter,
                                      inter, tp)
                times = [float(r[f"time_stats.{v}.median"]) * 1e-3 for v in VIDUR_OPS]
                name = VIDUR_GPUS[gpu]
                rows += [KernelRow(name, model, tp, n, op, (s,), 1, t)
                         for op, s, t in zip(OPS, shapes, times, strict=True)]
                rows.append(KernelRow(name, model, tp, n, "layer", shapes, 1, sum(times)))
    return rows


def read_step_runs(paths: Iterable[str | Path]) -> list[KernelRow]:
    """The GEMM time of every step of our GPU step runs (all layers, TP 1)."""
    rows = []
    for path in paths:
        for r in load_records(str(path)):
            if r["model"] not in MODELS:
                continue
            m = MODELS.get(r["model"])
            n = sum(c for c, _ in r["chunks"]) + r["decodes"]
            shapes = tuple((float(k), float(o)) for k, o in m.gemms)
            rows.append(KernelRow(r["hardware"], m.name, 1, n, "step", shapes, m.layers,
                                  r["measured_gemm_s"]))
    return rows


def predict(hw: Hardware, row: KernelRow, plain_tail_waves: float) -> float:
    """The roofline's seconds for ``row`` on ``hw`` (``plain_tail_waves``: the calibrated
    tail used where ``hw`` has no fitted ``GemmPhysics``)."""
    return row.repeat * sum(gemm_seconds(gemm_terms(hw, k, n, plain_tail_waves), row.tokens)
                            for k, n in row.gemms)


def abs_errors(hw: Hardware, rows: Sequence[KernelRow], plain_tail_waves: float) -> list[float]:
    """|predicted / measured - 1| of each row."""
    return [abs(predict(hw, r, plain_tail_waves) / r.seconds - 1) for r in rows]


def summary(errors: Sequence[float]) -> tuple[float, float]:
    """(median, P90) of absolute errors (nan, nan when empty)."""
    if not errors:
        return float("nan"), float("nan")
    s = sorted(errors)
    return statistics.median(s), s[max(0, math.ceil(0.9 * len(s)) - 1)]  # nearest rank


__all__ = ["BANDS", "KernelRow", "OPS", "abs_errors", "layer_shapes", "predict",
           "read_step_runs", "read_vidur", "summary"]
