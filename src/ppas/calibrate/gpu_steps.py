"""One engine step's device time measured on a GPU, beside the roofline's prediction.

Held-out check of the cost model (``ppas.cost.roofline``): its engine and wave-tail
constants were fitted on RTX 5090 / Qwen2.5-3B runs alone; a GPU's own kernels run the
exact per-step work of a catalog model (``ppas.calibrate.gpu_timer``) and the roofline
predicts the same steps for that GPU from the catalog's throughputs. Nothing is fitted.
Here: the steps measured (``GpuStep``, ``full_steps``), the measured records
(``RECORD_KEYS``, ``load_records``) and their comparison with the roofline
(``predict``, ``comparison``). No torch.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ppas.core.errors import PpasError
from ppas.core.limits import MAX_CONTEXT_TOKENS, MAX_NUM_SEQS, MAX_PROMPT_TOKENS, MAX_TIME_S
from ppas.cost.base import StepShape
from ppas.cost.catalog import HARDWARE, MODELS, ModelArch
from ppas.cost.roofline import RooflineCostModel

PROMPT = 25000  # the paper grid's prompt


@dataclass(frozen=True)
class GpuStep:
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


def full_steps(model: str) -> list[GpuStep]:
    """The shapes that decide the paper grid's schedules: whole and chunked prefills (the
    §2 comparison: eight 2k chunks of a 16k prompt vs one 16k chunk), decode-only steps of
    one to many requests on 25k contexts, and decodes riding a chunk."""
    steps = [GpuStep(f"prefill {c} @0", ((c, 0),)) for c in (512, 2048, 8192, 16384, PROMPT)]
    steps += [GpuStep(f"s2 2k-chunk {i}", ((2048, 2048 * i),)) for i in range(8)]
    steps += [GpuStep(f"prefill {c} @{p}", ((c, p),))
              for c, p in ((64, 8192), (512, 8192), (2048, 16384), (8192, 16384),
                           (16384, 8192))]
    big = model != "qwen2.5-3b"  # 4x the KV per token: fewer long decodes fit
    for n in (1, 2, 8) if big else (1, 2, 8, 32):
        steps.append(GpuStep(f"decode {n} @25k", (), n, PROMPT))
    steps.append(GpuStep("decode 128 @2k", (), 128, 2048))
    steps += [GpuStep(f"mixed {c}@8192 + {n} decode", ((c, 8192),), n, PROMPT)
              for c, n in ((64, 1), (512, 1), (2048, 2), (16384, 2))]
    return steps


#: Device memory the extended suite's KV caches may take (the timer allocates every
#: layer's cache for the step): leaves room for an 8B model's weights on an 80 GB GPU.
EXTENDED_KV_BYTES = 40e9


def extended_steps(model: str) -> list[GpuStep]:
    """Issue 21's held-out shapes for a device session: decode batches of 1..256 requests,
    mixed steps (a chunk with decodes riding along), and prefill chunks of 128..8192
    tokens on an empty and on an 8k cached context. Decode batches whose KV caches would
    pass ``EXTENDED_KV_BYTES`` for ``model`` are left out."""
    kv = MODELS.get(model).kv_bytes_per_token
    steps = [GpuStep(f"prefill {c} @{p}", ((c, p),))
             for c, p in ((128, 0), (512, 0), (2048, 0), (8192, 0), (2048, 8192),
                          (8192, 8192))]
    steps += [GpuStep(f"decode {n} @{k}", (), n, k)
              for n, k in ((1, 8192), (8, 8192), (32, 8192), (128, 2048), (256, 1024))
              if n * (k + 1) * kv <= EXTENDED_KV_BYTES]
    steps += [GpuStep(f"mixed {c}@{p} + {n} decode", ((c, p),), n, k)
              for c, p, n, k in ((512, 8192, 32, 2048), (2048, 8192, 8, 8192),
                                 (8192, 0, 64, 1024))
              if n * (k + 1) * kv <= EXTENDED_KV_BYTES]
    return steps


def smoke_steps() -> list[GpuStep]:
    return [GpuStep("prefill 64 @0", ((64, 0),)), GpuStep("prefill 32 @64", ((32, 64),)),
            GpuStep("decode 4 @96", (), 4, 96),
            GpuStep("mixed 16@32 + 2 decode", ((16, 32),), 2, 48)]


SMOKE_MODEL = ModelArch("smoke-tiny", 2, 128, 4, 2, 32, 256, 512, True)


#: PyTorch SDPA backend (as ``gpu_timer`` records it) -> the kernel the roofline prices:
#: SDPA's FLASH_ATTENTION is PyTorch's FlashAttention-2 build, CUDNN_ATTENTION cuDNN's
#: fused attention; the memory-efficient kernel (CUTLASS, Ampere instructions) has no
#: published figure and is priced as FlashAttention-2, its instruction class.
SDPA_KERNELS = {"FLASH_ATTENTION": "sdpa-flash-attn-2", "CUDNN_ATTENTION": "cudnn",
                "EFFICIENT_ATTENTION": "sdpa-flash-attn-2"}


def logged_kernel(record: dict[str, Any]) -> str | None:
    """The attention kernel a step record ran (its forced or picked SDPA backend), None
    where it names none (a CPU smoke run: the roofline's default)."""
    name = str(record.get("forced_backend") or record.get("backend") or "")
    return SDPA_KERNELS.get(name.split("+")[0].split("/")[0])


def torch_activation_bytes(m: ModelArch) -> int:
    """Bytes one token moves per layer through ``gpu_timer``'s memory-bound PyTorch ops,
    counted from its code (vLLM fuses these; ``ModelArch.activation_bytes_per_token_layer``):
    two RMSNorms (read and write h each: 4h), two residual adds (read 2h, write h: 6h),
    rotary on q and on k as six elementwise ops and a cat (9 q_width + 9 kv_width), the
    KV-cache writes (read and write k and v: 4 kv_width), the attention output's copy
    (2 q_width), SiLU then the multiply on gate-up's halves (2I + 3I)."""
    h, i, q, kv = m.hidden, m.intermediate, m.q_width, m.kv_width
    return m.dtype_bytes * (10 * h + 11 * q + 13 * kv + 5 * i)


def predict(cm: RooflineCostModel, step: GpuStep) -> dict[str, float]:
    """The roofline's device time for the step, and its GEMM and attention parts."""
    shape = step.shape
    n = shape.num_tokens
    layers = cm.model.layers
    gemm = layers * sum(cm.gemm_time(n, i) for i in range(4))
    attn = layers * (cm.prefill_attention_time(shape)
                     + cm.decode_attention_time(shape.decode_ctx_tokens))
    return {"predicted_all_s": cm.device_time(shape), "predicted_gemm_s": gemm,
            "predicted_attention_s": attn}


class StepPricer:
    """The roofline for each (hardware, model, attention kernel) of step records, built
    once. ``kernels="logged"`` prices what the run executed: the attention kernel each
    record names (``logged_kernel``) and PyTorch's elementwise traffic
    (``torch_activation_bytes``); ``"vllm"`` prices vLLM's kernels instead (what the
    simulator runs: the architecture's attention backend and fused elementwise kernels)."""

    def __init__(self, kernels: str = "logged") -> None:
        if kernels not in ("logged", "vllm"):
            raise PpasError(f"kernels must be 'logged' or 'vllm', got {kernels!r}")
        self.kernels = kernels
        self._models: dict[tuple[str, str, str | None], RooflineCostModel] = {}

    def model_for(self, record: dict[str, Any]) -> RooflineCostModel:
        hw, model = record["hardware"], record["model"]
        kernel = logged_kernel(record) if self.kernels == "logged" else None
        key = (hw, model, kernel)
        cm = self._models.get(key)
        if cm is None:
            act = (torch_activation_bytes(MODELS.get(model)) if self.kernels == "logged"
                   else None)
            cm = self._models[key] = RooflineCostModel(hw, model, attention_kernel=kernel,
                                                       activation_bytes=act)
        return cm

    def predict(self, record: dict[str, Any]) -> dict[str, float]:
        return predict(self.model_for(record), step_of(record))


def step_of(record: dict[str, Any]) -> GpuStep:
    return GpuStep(record["step"], tuple(tuple(c) for c in record["chunks"]),  # type: ignore[misc]
                   record["decodes"], record["decode_ctx"])


def step_errors(records: list[dict[str, Any]], kernels: str = "logged") -> list[float]:
    """predicted / measured - 1 of each record's whole-step device time."""
    pricer = StepPricer(kernels)
    return [pricer.predict(r)["predicted_all_s"] / r["measured_all_s"] - 1 for r in records]


def comparison(records: list[dict[str, Any]], kernels: str = "logged") -> list[str]:
    """Side-by-side table and summaries of measured vs predicted (re-predicted now) with
    ``StepPricer(kernels)``."""
    lines = []
    pricer = StepPricer(kernels)
    by_model: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in records:  # runs with a forced attention backend are compared per backend
        by_model.setdefault((r["hardware"], r["model"], r.get("forced_backend") or ""),
                            []).append(r)
    for (hw, model, forced), recs in by_model.items():
        if model not in MODELS or hw not in HARDWARE:
            lines.append(f"{hw} / {model}: not in the catalog; measured only")
            continue
        lines.append(f"\n{hw} / {model} ({recs[0].get('device_name', '?')}, "
                     f"torch {recs[0].get('torch', '?')}"
                     + (f", attention {forced} only" if forced else "")
                     + "): device time per step, ms; priced: "
                     + ("the logged attention kernel, PyTorch's elementwise ops"
                        if kernels == "logged" else "vLLM's kernels"))
        lines.append(f"{'step':<30} {'measured':>9} {'roofline':>9} {'err':>7}   "
                     f"{'GEMMs m/p':>15} {'attention m/p':>15}  backend")
        errs: dict[str, list[float]] = {}
        named: dict[str, tuple[float, float, float, float]] = {}
        for r in recs:
            step = step_of(r)
            p = pricer.predict(r)
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


def load_records(path: str) -> list[dict[str, Any]]:
    """The step records of a JSON-lines file as ``benchmarks/gpu_step_times.py --out``
    writes them; a file that cannot be read, holds none or anything else, or a value out of
    its bounds, is a ``PpasError`` naming the file and line."""
    try:
        with open(path, encoding="utf-8") as f:
            recs = [json.loads(line) for line in f if line.strip()]
    except OSError as e:
        raise PpasError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise PpasError(f"{path} is not text (JSON lines as --out writes)") from None
    except json.JSONDecodeError as e:
        raise PpasError(f"{path} is not JSON lines ({e.msg} at line {e.lineno})") from None
    for i, r in enumerate(recs, 1):
        missing = [k for k in RECORD_KEYS if not isinstance(r, dict) or k not in r]
        if missing:
            raise PpasError(f"{path} line {i} is not a step record (as --out writes): it "
                            f"lacks {', '.join(missing)}")
        if problem := bad_value(r):
            raise PpasError(f"{path} line {i}: {problem}")
    if not recs:
        raise PpasError(f"{path} holds no step records (as --out writes)")
    return recs
