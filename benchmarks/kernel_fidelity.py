"""The roofline's GEMMs against measured kernels: before and after the fitted GEMM physics.

Every GEMM row of Vidur's per-operator profiles (A100, H100, A40: QKV, O, gate-up, down of
one decoder layer, 1..4096 tokens, TP 1..8) and every step of our H200 runs
(``ppas.calibrate.kernels``) is priced by the roofline twice, side by side:

* before: the plain roofline (the catalog's literature throughputs, 0.9 of the datasheet
  bandwidth, the RTX 5090's calibrated wave tail), i.e. the catalog without ``GemmPhysics``;
* after: with each GPU's fitted ``GemmPhysics`` (``ppas/data/kernel_physics.json``).

Per GPU: median and P90 |error| of single GEMMs and of a layer's four-GEMM sum (H200: the
GEMMs of a whole step), by token band and by GEMM; rows of the held-out model (A100:
Llama-3-8B, H100: InternLM-20B, H200: Llama-3.2-3B and Qwen2.5-7B; A40, one model only: its
TP-2 rows) are reported apart and never enter the fit.

``--fit`` refits the physics first (scipy least squares on log error, held-out rows
excluded) and writes ``src/ppas/data/kernel_physics.json`` (or ``--out``): per GPU the GEMM
throughput and the bandwidth weight-bound GEMMs reach; per architecture family and way of
running the kernels (Ampere, timed alone: A100 + A40; Hopper timed alone: H100; Hopper in
CUDA graphs: H200) a GEMM kernel's fixed latency, the wave tail and the knee.

    .venv/bin/python benchmarks/kernel_fidelity.py [--fit] [--vidur DIR] [--json OUT]
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from harness import Table, fail, finish, parser, start
from scipy.optimize import least_squares

from ppas.calibrate.gpu_steps import load_records, step_errors, step_of
from ppas.calibrate.kernels import (
    BANDS,
    HELD_OUT_MODEL,
    HELD_OUT_TP,
    OPS,
    KernelRow,
    abs_errors,
    predict,
    read_step_runs,
    read_vidur,
    summary,
)
from ppas.core.errors import PpasError
from ppas.core.outputs import write_atomic
from ppas.cost.base import StepShape
from ppas.cost.catalog import HARDWARE, PHYSICS_FILE, GemmPhysics, Hardware
from ppas.cost.roofline import RooflineCostModel, RooflineParams

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "ppas" / "data" / PHYSICS_FILE
VIDUR = [p / "shared" / "data" / "vidur-profiling" for p in (ROOT.parent, ROOT.parents[1])]
STEP_RUNS = sorted((ROOT / "benchmarks" / "results").glob("h200-steps-run*.jsonl"))
# Physical ranges of the fit: throughput at most 7% above the datasheet peak (boost
# clocks), weight bandwidth at most the datasheet's; a kernel's latency under 30 us.
TFLOPS_RANGE, BW_RANGE = (0.3, 1.07), (0.3, 1.0)
FAMILY_BOUNDS = {"latency_s": (0.0, 30e-6), "tail_waves": (0.0, 1.0), "knee": (1.0, 16.0)}


def fit_family(gpus: Sequence[Hardware], rows: Sequence[KernelRow],
               tail: float) -> tuple[dict[str, GemmPhysics], int, float]:
    """Least squares on log(predicted / measured) over ``rows`` (single GEMMs and H200
    steps, fit rows only): per GPU (TFLOP/s, weight GB/s), shared (latency, tail, knee).
    Returns the physics per GPU name, the row count and the final cost."""
    names = [g.name for g in gpus]
    by_gpu = {n: [r for r in rows if r.gpu == n] for n in names}

    def physics(x: np.ndarray) -> dict[str, GemmPhysics]:
        lat, tau, knee = x[-3:]
        return {g.name: GemmPhysics(float(x[2 * i]) * g.bf16_tflops,
                                    float(x[2 * i + 1]) * g.mem_bw_gbs, float(lat) * 1e-6,
                                    float(tau), float(knee))
                for i, g in enumerate(gpus)}

    def residuals(x: np.ndarray) -> np.ndarray:
        out = []
        for g in gpus:
            hw = replace(g, gemm=physics(x)[g.name])
            out += [math.log(predict(hw, r, tail) / r.seconds) for r in by_gpu[g.name]]
        return np.array(out)

    x0 = [v for _ in gpus for v in (0.75, 0.85)] + [5.0, 0.3, 2.0]
    lo = [v for _ in gpus for v in (TFLOPS_RANGE[0], BW_RANGE[0])] + [0.0, 0.0, 1.0]
    hi = [v for _ in gpus for v in (TFLOPS_RANGE[1], BW_RANGE[1])] + [30.0, 1.0, 16.0]
    sol = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.05)
    return physics(sol.x), sum(len(v) for v in by_gpu.values()), float(sol.cost)


def fit(rows: Sequence[KernelRow], tail: float) -> dict[str, object]:
    """Fit every architecture family with measured GPUs; the document ``kernel_physics.json``
    holds (``ppas.cost.catalog.load_gemm_physics`` reads it)."""
    train = [r for r in rows if not r.held_out and r.op != "layer"]
    # Kernels share their shape (latency, tail, knee) within an architecture family and a
    # way of running them: Vidur timed each operator alone (eager, CUDA events), our step
    # runs replay whole steps as CUDA graphs (kernels back to back, as vLLM runs them).
    families: dict[str, list[Hardware]] = {}
    for name in sorted({r.gpu for r in train}):
        hw = replace(HARDWARE.get(name), gemm=None)
        how = "graphs" if any(r.op == "step" for r in train if r.gpu == name) else "eager"
        families.setdefault(f"{hw.family}/{how}", []).append(hw)
    doc: dict[str, dict[str, object]] = {"families": {}, "gpus": {}}
    for fam, gpus in families.items():
        phys, n, cost = fit_family(gpus, train, tail)
        p0 = phys[gpus[0].name]
        doc["families"][fam] = {"latency_s": p0.latency_s, "tail_waves": p0.tail_waves,
                                "knee": p0.knee, "gpus": [g.name for g in gpus],
                                "rows": n, "cost": cost}
        for g in gpus:
            models = sorted({r.model for r in train if r.gpu == g.name})
            held = HELD_OUT_MODEL.get(g.name)
            out = (f"TP {HELD_OUT_TP[g.name]}" if g.name in HELD_OUT_TP else
                   ", ".join(held) if isinstance(held, tuple) else str(held))
            doc["gpus"][g.name] = {
                "family": fam, "tflops": phys[g.name].tflops,
                "weight_bw_gbs": phys[g.name].weight_bw_gbs,
                "fitted_on": f"{len([r for r in train if r.gpu == g.name])} measured GEMM "
                             f"rows of {', '.join(models)} (held out: {out})"}
    return {"format": "ppas-kernel-physics/1",
            "command": "python benchmarks/kernel_fidelity.py --fit", **doc}


def physics_from(doc: dict[str, object]) -> dict[str, GemmPhysics]:
    fams, gpus = doc["families"], doc["gpus"]
    assert isinstance(fams, dict) and isinstance(gpus, dict)
    return {n: GemmPhysics(g["tflops"], g["weight_bw_gbs"], fams[g["family"]]["latency_s"],
                           fams[g["family"]]["tail_waves"], fams[g["family"]]["knee"])
            for n, g in gpus.items()}


def report(rows: Sequence[KernelRow], before: Callable[[str], Hardware],
           after: Callable[[str], Hardware], tail: float) -> dict[str, object]:
    """Print the side-by-side tables; return their figures."""
    results: dict[str, object] = {}
    gpus = list(dict.fromkeys(r.gpu for r in rows))
    table = Table(("GPU", "<14"), ("rows", "<9"), ("kernels", "<7"), ("n", ">5"),
                  ("median before", ">13"), ("after", ">6"), ("P90 before", ">11"),
                  ("after", ">6"))
    print("\n|error| of the roofline's GEMM time, before -> after the fitted physics")
    table.print_header()
    for gpu in gpus:
        for held in (False, True):
            for kind in ("gemm", "layer"):
                sel = [r for r in rows if r.gpu == gpu and r.held_out == held
                       and ((r.op in OPS) if kind == "gemm" else r.op in ("layer", "step"))]
                if not sel:
                    continue
                b = summary(abs_errors(before(gpu), sel, tail))
                a = summary(abs_errors(after(gpu), sel, tail))
                label = "held out" if held else "fit"
                what = "GEMM" if kind == "gemm" else ("step" if sel[0].op == "step" else "layer")
                table.print_row(gpu, label, what, len(sel), f"{b[0]:.1%}", f"{a[0]:.1%}",
                                f"{b[1]:.1%}", f"{a[1]:.1%}")
                results[f"{gpu}/{label}/{what}"] = {"rows": len(sel), "median_before": b[0],
                                                    "median_after": a[0], "p90_before": b[1],
                                                    "p90_after": a[1]}
    for title, key, values in (("token band", "band", [name for _, name in BANDS]),
                               ("GEMM", "op", list(OPS))):
        print(f"\nmedian |error| by {title}, all rows of each GPU (fit and held out), "
              "before -> after")
        t = Table((title, "<10"), *((g, ">24") for g in gpus))
        t.print_header()
        for v in values:
            cells = []
            for gpu in gpus:
                sel = [r for r in rows if r.gpu == gpu and getattr(r, key) == v
                       and r.op != "layer"]
                if not sel:
                    cells.append("-")
                    continue
                b_med = summary(abs_errors(before(gpu), sel, tail))[0]
                a_med = summary(abs_errors(after(gpu), sel, tail))[0]
                cells.append(f"{b_med:6.1%} -> {a_med:5.1%} ({len(sel)})")
                results[f"{gpu}/{key}={v}"] = {"rows": len(sel), "median_before": b_med,
                                               "median_after": a_med}
            t.print_row(v, *cells)
    return results


#: Whole steps priced before and after (the roofline's device time, one GPU): a decode of
#: one request and of 32 on 8k contexts, and prefill chunks of 512, 2k and 16k tokens.
STEPS = (("decode 1 @8k", StepShape.of([], [8192])),
         ("decode 32 @8k", StepShape.of([], [8192] * 32)),
         ("prefill 512", StepShape.of([(512, 0)], [])),
         ("prefill 2k", StepShape.of([(2048, 0)], [])),
         ("prefill 16k", StepShape.of([(16384, 0)], [])))


def step_changes(gpus: Sequence[str], model: str, before: Callable[[str], Hardware],
                 after: Callable[[str], Hardware]) -> dict[str, object]:
    """Print the device time of a few whole steps of ``model`` before -> after."""
    print(f"\n{model}: device time of whole steps (ms), before -> after")
    t = Table(("GPU", "<14"), *((name, ">17") for name, _ in STEPS))
    t.print_header()
    out: dict[str, object] = {}
    for gpu in gpus:
        b = RooflineCostModel(before(gpu), model)
        a = RooflineCostModel(after(gpu), model)
        cells = [(b.device_time(s), a.device_time(s)) for _, s in STEPS]
        t.print_row(gpu, *(f"{x * 1e3:6.2f} -> {y * 1e3:6.2f}" for x, y in cells))
        out[f"{gpu}/{model}"] = {name: c for (name, _), c in zip(STEPS, cells, strict=True)}
    return out


def whole_steps(paths: Sequence[Path]) -> dict[str, object]:
    """Whole H200 steps (device time), priced with vLLM's kernels (the simulator's: FA3 on
    Hopper, fused elementwise kernels; what the roofline priced before the kernel became a
    parameter) and with the kernels each run executed (PyTorch's FlashAttention-2 or cuDNN
    per step, as logged, and PyTorch's elementwise ops). The attention figures are
    published ones; no H200 measurement enters them."""
    print("\nwhole H200 steps: median (P90) |error| of device time, priced with vLLM's "
          "kernels -> the logged ones")
    t = Table(("run", "<22"), ("model", "<12"), ("GEMMs", "<8"), ("n", ">3"),
              ("vLLM's kernels", ">16"), ("logged kernels", ">16"), ("prefill", ">15"),
              ("decode", ">15"), ("mixed", ">15"))
    t.print_header()
    out: dict[str, object] = {}
    for path in paths:
        recs = load_records(str(path))
        for model in dict.fromkeys(r["model"] for r in recs):
            sel = [r for r in recs if r["model"] == model]
            b, a = step_errors(sel, "vllm"), step_errors(sel, "logged")
            sb, sa = summary([abs(e) for e in b]), summary([abs(e) for e in a])
            kinds = {}
            for kind in ("prefill", "decode", "mixed"):
                idx = [i for i, r in enumerate(sel) if step_of(r).kind == kind]
                kinds[kind] = (summary([abs(b[i]) for i in idx])[0],
                               summary([abs(a[i]) for i in idx])[0])
            held = model in HELD_OUT_MODEL["h200"]
            t.print_row(path.name, model, "held out" if held else "fit", len(sel),
                        f"{sb[0]:.1%} ({sb[1]:.0%})", f"{sa[0]:.1%} ({sa[1]:.0%})",
                        *(f"{x:.1%} -> {y:.1%}" for x, y in kinds.values()))
            out[f"{path.name}/{model}"] = {
                "steps": len(sel), "gemms_held_out": held, "median_before": sb[0],
                "p90_before": sb[1], "median_after": sa[0], "p90_after": sa[1],
                **{f"{k}_median": v for k, v in kinds.items()}}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--vidur", help="folder of Vidur's *-mlp.csv (default ../shared/data/"
                                    "vidur-profiling)")
    ap.add_argument("--fit", action="store_true", help="refit the physics and write --out")
    ap.add_argument("--out", default=str(OUT), help="the physics file --fit writes")
    args = ap.parse_args(argv)
    start(args, argv)
    vidur = Path(args.vidur) if args.vidur else next((p for p in VIDUR if p.is_dir()), None)
    if vidur is None or not vidur.is_dir():
        fail("kernel_fidelity.py", f"Vidur profiles not found ({args.vidur or VIDUR[0]}); "
                                   "pass --vidur DIR")
    try:
        rows = read_vidur(vidur) + read_step_runs(STEP_RUNS)
    except PpasError as e:
        fail("kernel_fidelity.py", str(e))
    tail = RooflineParams.calibrated().gemm_tail_waves
    physics = {n: HARDWARE.get(n).gemm for n in HARDWARE.names()}
    results: dict[str, object] = {}
    if args.fit:
        t0 = time.perf_counter()
        doc = fit(rows, tail)
        write_atomic(args.out, json.dumps(doc, indent=2) + "\n")
        print(json.dumps(doc, indent=2))
        print(f"fitted in {time.perf_counter() - t0:.0f} s; written to {args.out}")
        physics = dict(physics_from(doc))
        results["physics"] = doc
    print(f"{len(rows)} measured rows: " + ", ".join(
        f"{g} {sum(1 for r in rows if r.gpu == g)}" for g in dict.fromkeys(r.gpu for r in rows)))

    def before(gpu: str) -> Hardware:
        return replace(HARDWARE.get(gpu), gemm=None)

    def after(gpu: str) -> Hardware:
        return replace(HARDWARE.get(gpu), gemm=physics.get(gpu))

    results["errors"] = report(rows, before, after, tail)
    gpus = list(dict.fromkeys(r.gpu for r in rows))
    results["steps"] = {**step_changes(gpus, "qwen2.5-3b", before, after),
                        **step_changes(gpus, "qwen3-8b", before, after)}
    results["whole_steps"] = whole_steps(STEP_RUNS)
    finish(args, results, argv)


if __name__ == "__main__":
    main()
