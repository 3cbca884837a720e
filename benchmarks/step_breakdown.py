"""Where the simulator's time goes: the roofline's step time split into its terms, summed
over simulated runs of the paper's workload (issue 21: which term makes the RTX 5090 /
Qwen2.5-0.5B predictions too slow while the Qwen2.5-3B calibration setup is right).

For each model (default Qwen2.5-0.5B and Qwen2.5-3B on the RTX 5090) and fixed budget
(mbt:2048, mbt:16384): the paper's trace (25k-token prompts, 32 outputs, bursts
0.4-1.4, seeds 0-4), every step the engine prices split into GEMMs, prefill attention,
the decodes' KV read, the memory-bound elementwise kernels, the LM head and the host
terms (``step_overhead_s`` per step, ``eager_layer_overhead_s`` x layers per step above
the CUDA-graph capture size, ``per_req_overhead_s`` per scheduled request). Then the same
for one request alone (its prefill steps and its decode steps).

Two sensitivities follow, neither a fit: the mean E2E if the per-step constant scaled with
the layer count (as kernel launches and per-layer host work would) instead of being one
constant, and the fitted GEMM physics of the measured GPUs (A100, H100: Vidur's kernels)
against the plain roofline on the 0.5B's and the 3B's GEMM shapes (is a small hidden size
slower or faster than the plain roofline says where kernels were measured?).

    .venv/bin/python benchmarks/step_breakdown.py [--models qwen2.5-0.5b,qwen2.5-3b] [--json OUT]
"""

from __future__ import annotations

from dataclasses import replace

from harness import Table, fail, finish, parser, start

from ppas.analysis.reference import PAPER_BURSTS
from ppas.analysis.sweep import Grid, run_grid
from ppas.cost.base import StepShape
from ppas.cost.catalog import HARDWARE, MODELS, Hardware, ModelArch
from ppas.cost.roofline import RooflineCostModel, RooflineParams, gemm_seconds, gemm_terms

TERMS = ("gemm", "attn_prefill", "attn_decode", "elementwise", "lm_head", "step_overhead",
         "eager", "per_request")
BUDGETS = ("mbt:2048", "mbt:16384")


class Recording(RooflineCostModel):
    """The roofline, adding every priced step's terms to ``totals`` (seconds)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.totals = dict.fromkeys(TERMS, 0.0)
        self.steps = 0

    def terms(self, step: StepShape) -> dict[str, float]:
        n = step.num_prefill_tokens + step.num_decodes
        if n == 0:
            return dict.fromkeys(TERMS, 0.0)
        L, reqs = self._layers, step.num_prefill_reqs + step.num_decodes
        return {"gemm": L * self.layer_gemm_time(n),
                "attn_prefill": L * self.prefill_attention_time(step),
                "attn_decode": L * self.decode_attention_time(step.decode_ctx_tokens),
                "elementwise": L * n * self._act_per_tok,
                "lm_head": self.lm_head_time(reqs),
                "step_overhead": self._fixed,
                "eager": self._eager if n > self._graph_max else 0.0,
                "per_request": self._per_req * reqs}

    def step_time(self, step: StepShape) -> float:
        t = super().step_time(step)
        parts = self.terms(step)
        assert abs(sum(parts.values()) - t) <= 1e-9 * max(t, 1e-3)
        for k, v in parts.items():
            self.totals[k] += v
        self.steps += 1
        return t

    def decode_steps(self, num_decodes: int, decode_ctx_tokens: int, max_steps: int,
                     start: float, limit: float) -> list[float]:
        # The generic loop through step_time (equal by contract), so every step is recorded.
        out: list[float] = []
        t, ctx = start, decode_ctx_tokens
        while len(out) < max_steps and t < limit:
            dt = self.step_time(StepShape(0, 0, 0.0, 0, num_decodes, ctx))
            out.append(dt)
            t += dt
            ctx += num_decodes
        return out


def mbt_of(config: str) -> int:
    return int(config.split("=")[-1]) if "=" in config else int(config.split(":")[1])


def grid_breakdown(hw: str, model: str, params: RooflineParams | None = None
                   ) -> dict[str, dict[str, float]]:
    """Per budget: the terms summed over the whole grid, the step count, the mean E2E."""
    out = {}
    for config in BUDGETS:
        cm = Recording(hw, model, params, max_num_batched_tokens=mbt_of(config))
        recs = run_grid(Grid((config,), PAPER_BURSTS),
                        lambda _c, cm=cm: cm)  # type: ignore[misc]
        e2e = sum(float(r["avg_latency"]) for r in recs) / len(recs)
        out[config] = {**cm.totals, "steps": cm.steps, "mean_e2e_s": e2e}
    return out


def solo(hw: str, model: str, chunk: int, prompt: int = 25000, outputs: int = 32
         ) -> dict[str, float]:
    """One request alone: its prefill chunks, then its decode steps (terms summed)."""
    cm = Recording(hw, model, max_num_batched_tokens=chunk)
    for d in range(0, prompt, chunk):
        cm.step_time(StepShape.of([(min(chunk, prompt - d), d)], []))
    for k in range(outputs - 1):
        cm.step_time(StepShape.of([], [prompt + 1 + k]))
    return {**cm.totals, "steps": cm.steps}


def print_breakdown(title: str, rows: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}")
    t = Table(("run", "<26"), ("steps", ">7"), *((k, ">13") for k in TERMS), ("total s", ">9"))
    t.print_header()
    for name, r in rows.items():
        total = sum(r[k] for k in TERMS)
        t.print_row(name, int(r["steps"]),
                    *(f"{r[k]:7.2f} {r[k] / total:4.0%}" for k in TERMS), f"{total:9.2f}")


def gemm_shapes(models: list[str]) -> dict[str, object]:
    """Fitted GEMM physics / plain roofline, a layer's four GEMMs, per measured GPU."""
    print("\na layer's GEMMs on GPUs with measured kernels: fitted physics / plain roofline")
    tokens = (1, 32, 512, 2048, 16384)
    t = Table(("GPU", "<14"), ("model", "<13"), *((f"n={n}", ">8") for n in tokens))
    t.print_header()
    tail = RooflineParams.calibrated().gemm_tail_waves
    out: dict[str, object] = {}
    for gpu in ("a100-sxm-80gb", "h100-sxm-80gb"):
        fitted = HARDWARE.get(gpu)
        plain = replace(fitted, gemm=None)
        for model in models:
            m = MODELS.get(model)

            def layer(hw: Hardware, n: int, m: ModelArch = m) -> float:
                return sum(gemm_seconds(gemm_terms(hw, k, o, tail), n) for k, o in m.gemms)

            ratios = [layer(fitted, n) / layer(plain, n) for n in tokens]
            t.print_row(gpu, model, *(f"{r:8.2f}" for r in ratios))
            out[f"{gpu}/{model}"] = dict(zip(map(str, tokens), ratios, strict=True))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, hardware="rtx5090")
    ap.add_argument("--models", default="qwen2.5-0.5b,qwen2.5-3b", help="comma-separated")
    args = ap.parse_args(argv)
    start(args, argv)
    models = [m for m in args.models.split(",") if m]
    bad = [m for m in models if m not in MODELS] + (
        [] if args.hardware in HARDWARE else [args.hardware])
    if bad or not models:
        fail("step_breakdown.py", f"unknown model or hardware {bad[0] if bad else '(none)'!r}; "
                                  f"models: {', '.join(MODELS.names())}")
    results: dict[str, object] = {}
    base = RooflineParams.calibrated()
    for model in models:
        layers = MODELS.get(model).layers
        grid = grid_breakdown(args.hardware, model)
        print_breakdown(f"{args.hardware} / {model}: seconds (share) summed over the paper "
                        "grid's 30 runs per budget", grid)
        alone = {f"alone, chunks of {mbt_of(c)}": solo(args.hardware, model, mbt_of(c))
                 for c in BUDGETS}
        print_breakdown(f"{args.hardware} / {model}: one 25k-prompt, 32-output request alone",
                        alone)
        per_layer = replace(base, step_overhead_s=base.step_overhead_s * layers / 36)
        scaled = grid_breakdown(args.hardware, model, per_layer)
        print("  mean E2E over the grid, s: " + ", ".join(
            f"{c} {grid[c]['mean_e2e_s']:.3f} (per-step constant x layers/36 = "
            f"{per_layer.step_overhead_s * 1e3:.2f} ms: {scaled[c]['mean_e2e_s']:.3f}, "
            f"{scaled[c]['mean_e2e_s'] / grid[c]['mean_e2e_s'] - 1:+.1%})" for c in BUDGETS))
        results[model] = {"grid": grid, "alone": alone, "per_layer_overhead": {
            "step_overhead_s": per_layer.step_overhead_s,
            **{c: scaled[c]["mean_e2e_s"] for c in BUDGETS}}}
    results["gemm_fitted_over_plain"] = gemm_shapes(models)
    finish(args, results, argv)


if __name__ == "__main__":
    main()
