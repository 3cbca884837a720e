"""The P-PAS main experiment in the simulator, side by side with the paper's measurements.

Simulates the whole grid (RTX 5090 / Qwen2.5-3B, 25k prompt / 32 output, bursts 0.4-1.4,
configs mbt:512 ... mbt:16384 and ppas, seeds 0-4 = 210 runs) and compares every cell with
the measured runs shipped in ``ppas/data`` (derived from the artifact log):

* per-cell mean E2E error, share of the 42 cells within 15%, median absolute error;
* the same for TTFT, TPOT, P95 E2E and makespan (where the model is weakest);
* the crossover (16k beats 2k at 0.4; 2k beats 16k at 1.0-1.4), simulated and measured;
* P-PAS's geometric-mean improvement vs mbt:2048 and mbt:16384, simulated and measured;
* wall time of the 210 simulated runs vs the GPU time the measured runs took.

    .venv/bin/python benchmarks/paper_grid.py [--json OUT]       (or: make paper)
"""

from __future__ import annotations

import time

from harness import Table, finish, parser, start

from ppas.analysis.reference import PAPER_BURSTS, PAPER_CONFIGS, accuracy, reference_runs
from ppas.analysis.sweep import Grid, improvement, run_grid
from ppas.cost.base import StepShape
from ppas.cost.roofline import RooflineCostModel
from ppas.engine.setup import engine_for


def main(argv: list[str] | None = None) -> None:
    args = parser(__doc__).parse_args(argv)
    start(args, argv)
    grid = Grid(PAPER_CONFIGS, PAPER_BURSTS)
    t0 = time.perf_counter()
    recs = run_grid(grid, lambda c: engine_for(c, "rtx5090", "qwen2.5-3b").cost_model)
    wall = time.perf_counter() - t0
    ref = reference_runs()

    acc = accuracy(recs, "avg_latency")
    print("mean E2E latency (s): simulated / measured (error), mean of 5 seeds")
    table = Table(("config", ">10"), *((f"{b:g}", ">20") for b in PAPER_BURSTS))
    table.print_header()
    for c in PAPER_CONFIGS:
        cells = [acc["cells"][(c, b)] for b in PAPER_BURSTS]
        table.print_row(c, *(f"{s:7.2f}/{r:6.2f} ({e:+4.0%})" for s, r, e in cells))
    print()
    print(f"{'metric':<12} {'cells within 15%':>17} {'median |err|':>13} {'worst cell':>24}")
    for key in ("avg_latency", "p95_latency", "avg_ttft", "p95_ttft", "avg_tpot", "makespan"):
        a = accuracy(recs, key)
        worst = max(a["cells"].items(), key=lambda kv: abs(kv[1][2]))
        print(f"{key:<12} {a['within15']:>16.0%} {a['median_abs_err']:>13.1%} "
              f"{worst[0][0] + ' @' + format(worst[0][1], 'g'):>16} {worst[1][2]:+6.0%}")
    print("  (targets for avg_latency: >= 80% of cells within 15%, median |err| <= 10%)")
    print()
    print("crossover (mean E2E, s)      simulated            measured")
    for b in (0.4, 1.0, 1.2, 1.4):
        s2, r2 = acc["cells"][("mbt:2048", b)][:2]
        s16, r16 = acc["cells"][("mbt:16384", b)][:2]
        print(f"  burst {b:>3}: 2k vs 16k   {s2:6.2f} vs {s16:6.2f} ({'2k' if s2 < s16 else '16k'})"
              f"   {r2:6.2f} vs {r16:6.2f} ({'2k' if r2 < r16 else '16k'})")
    print()
    print("P-PAS geometric-mean improvement (%)   simulated  measured")
    gains: dict[str, dict[str, float]] = {}
    for key in ("avg_latency", "p95_latency", "avg_ttft", "avg_tpot", "makespan"):
        for base in ("mbt:2048", "mbt:16384"):
            sim, real = improvement(recs, "ppas", base, key), improvement(ref, "ppas", base, key)
            gains[f"{key} vs {base}"] = {"simulated": sim, "measured": real}
            print(f"  {key:<12} vs {base:<10} {sim:>14.1f} {real:>9.1f}")
    # Held out of the calibration: the paper's §2 prefill-time change from 2k to 16k chunks
    # for one 25k prompt on the RTX 5090, for two other model sizes (and the 3B itself).
    # The paper's totals are device (kernel) time (see benchmarks/cost_models.py); the
    # change with the host's per-step costs is printed beside it.
    print()
    print("25k-prompt prefill, 2k -> 16k chunks (RTX 5090)   device time   +host   paper §2")
    for model, paper in (("qwen2.5-0.5b", -10.5), ("qwen2.5-3b", -11.6), ("qwen2.5-7b", -0.6)):
        cm = RooflineCostModel("rtx5090", model)

        def total(chunk: int, device: bool, cm: RooflineCostModel = cm) -> float:
            return sum((cm.device_time if device else cm.step_time)(
                StepShape.of([(min(chunk, 25000 - d), d)], [])) for d in range(0, 25000, chunk))

        t2, t16 = total(2048, True), total(16384, True)
        h = 100 * (total(16384, False) / total(2048, False) - 1)
        print(f"  {model:<14} {t2 * 1e3:7.0f} -> {t16 * 1e3:6.0f} ms {100 * (t16 / t2 - 1):+8.1f}% "
              f"{h:+7.1f}% {paper:+8.1f}%")
    gpu = sum(float(r["makespan"]) for r in ref)
    print()
    print(f"speed: 210 simulated runs in {wall:.2f} s wall; the measured runs took "
          f"{gpu / 60:.0f} min of GPU time (sum of makespans, excluding server restarts): "
          f"{gpu / wall:,.0f}x faster (target: grid under 10 s)")
    finish(args, {"mean_e2e_s": {f"{c} @{b:g}": {"simulated": v[0], "measured": v[1]}
                                 for (c, b), v in acc["cells"].items()},
                  "ppas_improvement_pct": gains}, argv)


if __name__ == "__main__":
    main()
