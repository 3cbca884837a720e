"""A step's device time measured on a real GPU beside the roofline's prediction for it.

Held-out check of the cost model (``ppas.cost.roofline``): a GPU's own kernels run the
exact per-step work of a catalog model (``ppas.calibrate.gpu_timer``) and the roofline
predicts the same steps for that GPU (``ppas.calibrate.gpu_steps``). Nothing is fitted.

    PYTHONPATH=src python3 benchmarks/gpu_step_times.py --hardware h200 \
        --models qwen2.5-3b,qwen3-8b --out h200-steps.jsonl
    python benchmarks/gpu_step_times.py --compare benchmarks/results/h200-steps.jsonl

``--out`` is written one JSON line per measured step as it finishes (a killed run keeps
every step already measured); ``--compare`` re-judges a saved file against the current
roofline without a GPU, pricing the attention kernel each step ran (its logged SDPA
backend) and PyTorch's elementwise ops, or with ``--kernels vllm`` vLLM's kernels.
``--smoke`` runs a tiny model on whatever device is present (CPU here) to check the timer.

``--suite extended`` measures issue 21's held-out shapes instead (decode batches of 1-256,
mixed steps, prefill chunks on an empty and an 8k context: ``extended_steps``), and
``--backends FLASH_ATTENTION,CUDNN_ATTENTION`` times every step once per forced attention
kernel (compared per backend). The prepared device check (not yet run): 2 models x 14 steps
x 2 backends, three timings of at most 0.2 s each (about 34 s of timing, plus building the
models and capturing the graphs), sized for an 8-minute device call:

    PYTHONPATH=src python3 benchmarks/gpu_step_times.py --hardware h200 --suite extended \
        --models qwen2.5-0.5b,qwen3-8b --backends FLASH_ATTENTION,CUDNN_ATTENTION \
        --budget-s 0.2 --max-iters 10 --out $OUT/h200-steps-run4.jsonl
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

from harness import parser

from ppas.calibrate.gpu_steps import (
    SMOKE_MODEL,
    comparison,
    extended_steps,
    full_steps,
    load_records,
    smoke_steps,
)
from ppas.calibrate.gpu_timer import StepTimer
from ppas.core.errors import PpasError
from ppas.cost.catalog import HARDWARE, MODELS

#: PyTorch's SDPA backends a run may force (FlashAttention-2, cuDNN, memory-efficient).
BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")


def fail(msg: str) -> NoReturn:
    print(f"gpu_step_times: {msg}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser(__doc__, hardware="h200", json=False)
    ap.add_argument("--models", default="qwen2.5-3b,qwen3-8b", help="comma-separated")
    ap.add_argument("--out", help="JSON-lines file to write (must not exist)")
    ap.add_argument("--compare", help="print the comparison for a saved file and exit")
    ap.add_argument("--kernels", choices=("logged", "vllm"), default="logged",
                    help="--compare prices the attention kernel and elementwise ops each "
                         "step ran (logged, default) or vLLM's (the simulator's)")
    ap.add_argument("--budget-s", type=float, default=0.4, help="timing budget per measurement")
    ap.add_argument("--max-iters", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="tiny model and shapes (any device)")
    ap.add_argument("--suite", choices=("full", "extended"), default="full",
                    help="full: the paper grid's steps; extended: issue 21's held-out shapes")
    ap.add_argument("--backends", default="",
                    help="comma-separated SDPA backends to force, each step once per backend "
                         f"({', '.join(BACKENDS)}; default: the fastest per step)")
    a = ap.parse_args(argv)
    if a.compare:
        try:
            print("\n".join(comparison(load_records(a.compare), a.kernels)))
        except PpasError as e:
            fail(str(e))
        return 0
    if a.hardware not in HARDWARE:
        fail(f"unknown --hardware {a.hardware!r}; allowed: {', '.join(sorted(HARDWARE))}")
    models = [s for s in a.models.split(",") if s]
    bad = [s for s in models if s not in MODELS]
    if bad and not a.smoke:
        fail(f"unknown model {bad[0]!r}; allowed: {', '.join(sorted(MODELS))}")
    backends = [b for b in a.backends.split(",") if b]
    if any(b not in BACKENDS for b in backends):
        fail(f"unknown --backends {a.backends!r}; allowed: {', '.join(BACKENDS)}")
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
            h = StepTimer(arch, device)
            print(f"{model}: built on {device} in {time.perf_counter() - t0:.1f} s", flush=True)
            steps = (smoke_steps() if a.smoke else
                     extended_steps(model) if a.suite == "extended" else full_steps(model))
            for step, forced in ((s, b) for s in steps for b in backends or [None]):
                try:
                    timed = h.measure(step, a.budget_s, a.max_iters, forced)
                except RuntimeError as e:  # the forced kernel does not take this shape
                    print(f"  {step.name:<30} {forced}: not run ({str(e)[:60]})", flush=True)
                    continue
                rec = {**meta, "model": arch.name, "step": step.name,
                       "chunks": [list(c) for c in step.chunks], "decodes": step.decodes,
                       "decode_ctx": step.decode_ctx, "suite": a.suite,
                       "forced_backend": forced, **timed}
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
