"""Why requests miss their SLO at a rate: attainment, and the misses by kind and prompt length.

Capacity (``analysis/capacity.py``, the issue-20 bar) is the largest rate scale at which a
share of requests meets TTFT <= 5x solo and TPOT <= 100 ms. This prints, for each config at
each rate scale of one of ``real_traffic.py``'s workloads, the share that attains, the
shares that miss TTFT and TPOT (a request can miss both), the TTFT misses by prompt length
(under 2k tokens, 2k-8k, 8k and over), the median wait of the short TTFT misses before
their first chunk was scheduled, and the mean E2E at the workload's own rate, so that a
config's capacity and its mean latency are read side by side.

    python benchmarks/slo_misses.py --trace mooncake --hardware h100-sxm-80gb \\
        --model qwen3-8b --scales 0.25,0.347 \\
        --configs 'vllm:mbt=16384,prefill_schedule_interval=2;ordered;
                   vllm:mbt=2048,long_prefill_token_threshold=512'

Simulated (roofline cost model, prefix caching off, the model's context as max_model_len),
as ``real_traffic.py``.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

from harness import Table, fail, finish, parser, start
from real_traffic import SLO, add_one_workload, one_workload, rate_scales

from ppas.core.errors import PpasError
from ppas.core.slo import SloSpec
from ppas.cost.catalog import MAX_MODEL_LEN
from ppas.engine.setup import engine_for
from ppas.engine.simulator import EngineConfig, simulate
from ppas.engine.solo import SoloTable
from ppas.workload import TraceTransform, load_trace

#: Prompt length classes of the TTFT misses (tokens): [0, 2k), [2k, 8k), [8k, inf).
SHORT, LONG = 2048, 8192


def misses(trace: Any, config: str, hardware: str, model: str, engine: EngineConfig,
           slo: SloSpec, solo: SoloTable | None) -> tuple[dict[str, float], SoloTable]:
    """One run's attainment and misses (shares of the completed requests)."""
    e = engine_for(config, hardware, model, config=engine)
    solo = solo or SoloTable(e.cost_model)
    res = simulate(trace, e.policy, e.cost_model, engine)
    done = [r for r in res.requests
            if not r.failed and r.finish_time is not None and r.first_token_time is not None]
    ms = res.request_metrics(slo, solo)  # the same requests, in the same order
    n = len(ms)
    assert n == len(done) and n > 0
    ttft = [(m, r) for m, r in zip(ms, done, strict=True)
            if m.ttft_slo is not None and m.ttft > m.ttft_slo]
    waits = [r.first_scheduled_time - r.arrival_time for _, r in ttft
             if r.prompt_tokens < SHORT and r.first_scheduled_time is not None]
    return {
        "attainment": sum(m.meets_slo() for m in ms) / n,
        "ttft_miss": len(ttft) / n,
        "tpot_miss": sum(1 for m in ms if m.tpot_slo is not None and m.tpot > m.tpot_slo) / n,
        "ttft_miss_short": sum(1 for _, r in ttft if r.prompt_tokens < SHORT) / n,
        "ttft_miss_mid": sum(1 for _, r in ttft if SHORT <= r.prompt_tokens < LONG) / n,
        "ttft_miss_long": sum(1 for _, r in ttft if r.prompt_tokens >= LONG) / n,
        "short_miss_wait_median_s": statistics.median(waits) if waits else float("nan"),
        "mean_e2e": sum(m.e2e for m in ms) / n,
    }, solo


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, hardware="h100-sxm-80gb", model="qwen3-8b")
    add_one_workload(ap)
    ap.add_argument("--scales", default="0.25,0.347",
                    help="rate scales of the workload's own rate (default 0.25,0.347)")
    ap.add_argument("--slo", default=SLO, help=f"the SLO (default {SLO})")
    args = ap.parse_args(argv)
    prog = Path(sys.argv[0]).name
    scales = rate_scales(args.scales, "--scales", prog)
    try:
        SloSpec.parse(args.slo)
    except PpasError as e:
        fail(prog, str(e))
    w, configs = one_workload(args, prog)
    start(args)
    try:
        slo = SloSpec.parse(args.slo)
        raw = load_trace(w.path, "auto", 512)
        base = w.transform.apply(raw)
        engine = EngineConfig(max_model_len=MAX_MODEL_LEN.get(args.model))
        print(f"{w.name} on {args.hardware} / {args.model}: {base.description}, "
              f"{len(base)} requests; SLO {slo}; shares of the completed requests")
        t = Table(("config", "<52"), ("scale", ">6"), ("attain", ">7.3f"),
                  ("TTFT miss", ">10.3f"), ("<2k", ">6.3f"), ("2k-8k", ">6.3f"),
                  (">=8k", ">6.3f"), ("TPOT miss", ">10.3f"), ("short wait", ">11.3f"),
                  ("E2E x1", ">8.3f"))
        t.print_header()
        rows: list[dict[str, Any]] = []
        solo: SoloTable | None = None
        for c in configs:
            at_one, solo = misses(base, c, args.hardware, args.model, engine, slo, solo)
            for s in scales:
                tr = base if s == 1 else TraceTransform(time_scale=1 / s).apply(base)
                f, solo = misses(tr, c, args.hardware, args.model, engine, slo, solo)
                t.print_row(c[:52], f"{s:g}", f["attainment"], f["ttft_miss"],
                            f["ttft_miss_short"], f["ttft_miss_mid"], f["ttft_miss_long"],
                            f["tpot_miss"], f["short_miss_wait_median_s"], at_one["mean_e2e"])
                rows.append({"config": c, "scale": s, **f, "mean_e2e_x1": at_one["mean_e2e"]})
    except PpasError as e:
        fail(prog, str(e))
    finish(args, {"workload": w.name, "hardware": args.hardware, "model": args.model,
                  "slo": str(slo), "rows": rows})


if __name__ == "__main__":
    main()
