"""The model clock when the policy's cost model is off in absolute speed (simulated).

In every other simulated figure the engine prices its steps with the policy's own cost
model, so the model is exact by construction. Live it is not: a model fitted on another
day or host, or a catalog GPU that is not the one running, prices every step too fast or
too slow, and ``ordered``'s aging deadline, drain floor and load gate (the rules that
compare model seconds with the wall clock) misread every wait and load by that factor.
``ordered``'s model clock (``src/ppas/policies/model_clock.py``) measures the factor from
the steps the engine runs. Here the engine runs on one cost model and the policy is bound
to another:

* ``slower``: the engine 2x slower than the policy's roofline (a host slower than the day
  its model was fitted: the CPU case, where the fitted model ran 1.9x fast), arrivals 2x
  slower too, so each load is the trace's;
* ``faster``: the engine 0.5x, arrivals 2x faster;
* ``wrong-gpu``: the engine an A100's roofline, the policy an H100's, one model
  (Qwen2.5-7B), the A100's loads.

Arms: ``calibrated`` (``ordered`` bound to the engine's own model: what a perfect
calibration gives), ``clock`` (``ordered``, the wrong model, the clock on: the default) and
``model-seconds`` (``ordered:clock_band=0``, the wrong model as it is). Printed per
workload, case and load: mean E2E, P99 TTFT and P99 TPOT, the ratio of mean E2E and P99
TTFT to ``calibrated``'s, and the clock's scale at the end of the run; then the geometric
mean of the E2E ratio over loads and the worst P99 TTFT ratio, per arm.

    python benchmarks/model_clock.py                      # both traces, 4 loads, 3 cases
    python benchmarks/model_clock.py --traces azure --loads 1,2 --cases slower

With ``--step-log LOG --cost-model SPEC`` it reads a live run instead: the vLLM plugin's
step log replayed through the clock (``ModelClock``, the band of ``--band``) for each
window of ``--windows``, side by side: where the scale moved, and the ratio every
``--every`` steps (the figures of the clock's module doc, "The window"):

    python benchmarks/model_clock.py --windows 64,256 \
        --step-log benchmarks/results/live-steps-20261207-ordered.jsonl \
        --cost-model fitted:experiments/demo-cpu.cost.json

(that log is the ``ordered`` arm of ``experiments/real-traffic-cpu-model-clock.toml``,
2026-12-07, 12:04 UTC).

Workloads are ``real_traffic.py``'s (the Azure code hour, the Mooncake slice); the
policy's KV capacity is the engine's (as the vLLM plugin gives it vLLM's blocks).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from harness import Table, fail, finish, parser, start
from real_traffic import TRACES, Workload, rate_scales, workloads

from ppas.analysis.tune import Figures, figures_of
from ppas.calibrate.fit import read_steps, sample
from ppas.core.errors import PpasError
from ppas.core.steplog import Step
from ppas.core.view import StepRecord
from ppas.cost import make_cost_model
from ppas.cost.base import CostModel, StepShape
from ppas.cost.catalog import MAX_MODEL_LEN
from ppas.engine.simulator import EngineConfig, EngineSim, replay
from ppas.policies import make_policy
from ppas.policies.model_clock import MIN_STEPS, WINDOW, ModelClock
from ppas.policies.ordered import Ordered
from ppas.workload import Trace, load_trace

#: ``--step-log``'s bins of a step's prefill tokens (name, upper bound).
SHAPE_BINS = (("0 (decodes)", 0), ("1-128", 128), ("129-512", 512), ("513-1024", 1024),
              ("over 1024", 1 << 62))
ARMS = (("calibrated", "ordered"), ("clock", "ordered"),
        ("model-seconds", "ordered:clock_band=0"))


class Scaled(CostModel):
    """``inner``'s step times times ``factor`` (an engine uniformly slower or faster)."""

    def __init__(self, inner: CostModel, factor: float) -> None:
        self.inner, self.factor = inner, factor
        self.kv_capacity_tokens = inner.kv_capacity_tokens

    def step_time(self, step: StepShape) -> float:
        return self.factor * self.inner.step_time(step)


# case -> (engine GPU, policy GPU, model, engine speed factor); None: the workload's pair
CASES: dict[str, tuple[str | None, str | None, str | None, float]] = {
    "slower": (None, None, None, 2.0),
    "faster": (None, None, None, 0.5),
    "wrong-gpu": ("a100-sxm-80gb", "h100-sxm-80gb", "qwen2.5-7b", 1.0),
}


def run(trace: Trace, spec: str, engine_cm: CostModel, believed: CostModel | None,
        engine: EngineConfig) -> tuple[Figures, float]:
    """``spec`` on ``engine_cm``, bound to ``believed`` (None: the engine's own model);
    its figures and the model clock's scale at the end (1 without a clock)."""
    policy = make_policy(spec)
    sim = EngineSim(policy, engine_cm, engine)
    if believed is not None:
        kv = engine_cm.kv_capacity_tokens
        policy.bind_cost_model(believed if kv is None else believed.with_kv_capacity(kv))
    f = figures_of(replay(sim, trace.requests))
    clock = policy._clock if isinstance(policy, Ordered) else None
    return f, 1.0 if clock is None else clock.scale


def one(w: Workload, case: str, loads: list[float]) -> dict[str, Any]:
    t0 = time.perf_counter()
    eng_gpu, pol_gpu, model, factor = CASES[case]
    eng_gpu = eng_gpu or "h100-sxm-80gb"
    pol_gpu = pol_gpu or eng_gpu
    model = model or "qwen3-8b"
    mbt = make_policy("ordered").max_num_batched_tokens
    base: Callable[[str], CostModel] = lambda gpu: make_cost_model(  # noqa: E731
        "roofline", gpu, model, 1, mbt)
    believed = base(pol_gpu)
    engine_cm = Scaled(base(eng_gpu), factor) if factor != 1 else base(eng_gpu)
    engine = EngineConfig(max_model_len=MAX_MODEL_LEN.get(model))
    raw = load_trace(w.path, "auto", 512)
    print(f"\n== {w.name}, {case}: engine {eng_gpu} x{factor:g}, policy's model {pol_gpu}, "
          f"{model}; arrivals x{factor:g} slower at each load")
    t = Table(("arm", "<14"), ("load", ">5"), ("mean E2E", ">9.3f"), ("P99 TTFT", ">9.3f"),
              ("P99 TPOT", ">9.4f"), ("E2E/cal", ">8.3f"), ("TTFT/cal", ">9.3f"),
              ("scale", ">6.3f"))
    t.print_header()
    figs: dict[str, dict[float, Figures]] = {a: {} for a, _ in ARMS}
    rows: list[dict[str, Any]] = []
    for x in loads:
        trace = w.transform.at_load(x / factor).apply(raw)
        for arm, spec in ARMS:
            f, scale = run(trace, spec, engine_cm, None if arm == "calibrated" else believed,
                           engine)
            figs[arm][x] = f
            cal = figs["calibrated"][x]
            t.print_row(arm, f"x{x:g}", f.mean_e2e, f.p99_ttft, f.p99_tpot,
                        f.mean_e2e / cal.mean_e2e, f.p99_ttft / cal.p99_ttft, scale)
            rows.append({**f.record(), "arm": arm, "load": x, "scale": scale})
    summary: dict[str, dict[str, float]] = {}
    for arm, _ in ARMS[1:]:
        e2e = [figs[arm][x].mean_e2e / figs["calibrated"][x].mean_e2e for x in loads]
        ttft = [figs[arm][x].p99_ttft / figs["calibrated"][x].p99_ttft for x in loads]
        summary[arm] = {"geomean_e2e_ratio": statistics.geometric_mean(e2e),
                        "worst_e2e_ratio": max(e2e), "worst_ttft_ratio": max(ttft)}
        print(f"  {arm:<14} against calibrated: mean E2E x{summary[arm]['geomean_e2e_ratio']:.3f}"
              f" (geomean over loads, worst x{max(e2e):.3f}), P99 TTFT worst "
              f"x{max(ttft):.3f}")
    return {"workload": w.name, "case": case, "engine": eng_gpu, "policy_model": pol_gpu,
            "model": model, "factor": factor, "rows": rows, "summary": summary,
            "wall_s": time.perf_counter() - t0}


def replay_log(path: str, steps: list[Step], spec: str, cm: CostModel, windows: list[int],
               band: float, every: int) -> dict[str, Any]:
    """The step log read from ``path`` through one clock per window (module doc)."""
    out: dict[str, Any] = {"step_log": path, "cost_model": spec, "steps": len(steps),
                           "band": band, "windows": {}}
    total = sum(secs for _, secs in map(sample, steps))
    priced = sum(cm.step_time(shape) for shape, _ in map(sample, steps))
    out["ratio_all"] = total / priced if priced > 0 else math.nan
    print(f"\n== {path}: {len(steps)} steps, cost model {spec}, band {band:g}; the whole "
          f"log's ratio (measured / priced step time): {out['ratio_all']:.3f}")
    # By the step's prefill tokens: where the model's error lies (its prices are a fit).
    bins: dict[str, list[float]] = {}
    for shape, secs in map(sample, steps):
        p = shape.num_prefill_tokens
        name = next(n for n, hi in SHAPE_BINS if p <= hi)
        b = bins.setdefault(name, [0, 0.0, 0.0, 0])
        b[0] += 1
        b[1] += secs
        b[2] += cm.step_time(shape)
        b[3] += shape.num_decodes
    t = Table(("prefill tokens", "<15"), ("steps", ">6"), ("measured ms", ">12.1f"),
              ("priced ms", ">10.1f"), ("ratio", ">6.3f"), ("decodes/step", ">13.2f"),
              indent="  ")
    t.print_header()
    out["by_prefill_tokens"] = {}
    for name, _ in SHAPE_BINS:
        if name in bins:
            n, m, q, d = bins[name]
            t.print_row(name, int(n), 1e3 * m / n, 1e3 * q / n, m / q, d / n)
            out["by_prefill_tokens"][name] = {"steps": n, "measured_s": m, "priced_s": q,
                                              "decodes": d}
    for w in windows:
        clock = ModelClock(cm, band, window=w, min_steps=min(MIN_STEPS, w))
        moves: list[tuple[int, float]] = []
        ratios: list[float] = []
        for i, s in enumerate(steps, 1):
            shape, secs = sample(s)
            # (the clock reads the launch, the duration and the shape)
            rec = StepRecord(float(i) if s.time is None else s.time, secs, 0.0, 0,
                             shape.num_prefill_tokens, shape.num_decodes,
                             shape.num_prefill_reqs, shape.num_decodes,
                             shape.prefill_attn_work, shape.prefill_kv_tokens,
                             shape.decode_ctx_tokens)
            if clock.note([rec]):
                moves.append((i, clock.scale))
            r = clock.ratio()
            if i % every == 0 and r is not None:
                ratios.append(r)
        lo, hi = (min(ratios), max(ratios)) if ratios else (math.nan, math.nan)
        print(f"  window {w:>4}: ratio every {every} steps {lo:.3f}-{hi:.3f}; the scale moved "
              f"{len(moves)} times" + (": " + ", ".join(f"step {i} -> {k:.3f}"
                                                        for i, k in moves) if moves else ""))
        out["windows"][str(w)] = {"moves": moves, "ratios": ratios,
                                  "final_scale": clock.scale}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--step-log", metavar="LOG", help="replay a plugin step log (see above)")
    ap.add_argument("--cost-model", metavar="SPEC", help="with --step-log: the policy's model")
    ap.add_argument("--windows", default=str(WINDOW), help="with --step-log: clock windows")
    ap.add_argument("--band", type=float, default=1.25, help="with --step-log: the band")
    ap.add_argument("--every", type=int, default=200, help="with --step-log: ratio every N")
    ap.add_argument("--traces", default="azure,mooncake", help="azure and/or mooncake")
    ap.add_argument("--azure", default=str(TRACES / "azure-2023-code.csv"))
    ap.add_argument("--mooncake", default=str(TRACES / "mooncake-synthetic.jsonl"))
    ap.add_argument("--loads", default="1,1.5,2,3", help="rate multipliers (default 1,1.5,2,3)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    args = ap.parse_args(argv)
    args.quick = False
    if args.step_log is not None:
        if not args.cost_model:
            fail(ap.prog, "--step-log needs --cost-model (e.g. fitted:FILE)")
        try:
            windows = [int(x) for x in args.windows.split(",")]
        except ValueError:
            fail(ap.prog, f"--windows must be comma-separated integers, got {args.windows!r}")
        if not windows or any(w < 1 for w in windows):
            fail(ap.prog, f"--windows must be integers >= 1, got {args.windows!r}")
        if not 1 < args.band <= 100:
            fail(ap.prog, f"--band must be in (1, 100], got {args.band}")
        if args.every < 1:
            fail(ap.prog, f"--every must be >= 1, got {args.every}")
        try:
            steps = read_steps(args.step_log)
            cm = make_cost_model(args.cost_model, None, None)
        except PpasError as e:
            fail(ap.prog, str(e))
        start(args, argv)
        res = replay_log(args.step_log, steps, args.cost_model, cm, windows, args.band,
                         args.every)
        finish(args, res, argv)
        return 0
    loads = rate_scales(args.loads, "--loads", ap.prog)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad or not cases:
        fail(ap.prog, f"--cases must name some of {', '.join(CASES)}, got {args.cases!r}")
    start(args, argv)
    results = [one(w, c, loads) for w in workloads(args) for c in cases]
    finish(args, results, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
