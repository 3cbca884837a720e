"""Who makes the P99 TTFT: the slowest 1% of first tokens, and how their prefill ran.

For each config at each load of one of ``real_traffic.py``'s workloads, it prints the
run's mean E2E, P99 TTFT and P99 TPOT, the prefill steps (how many, their mean prefill
tokens, decodes riding and duration), and the tail: the requests whose TTFT is in the top
1% (at least one). For the tail it gives the median prompt and output against every
request's, and the means of the wait before the first chunk was scheduled, the time from
there to the first token, the prefill steps that carried the prompt, its tokens per step
and their share of the step's budget, and the decodes riding those steps. So a TTFT tail reads as
"long prompts waiting for their first chunk" or "long prompts chunked thin", and the
effect of a budget rule on it can be seen.

    python benchmarks/ttft_tail.py --trace mooncake --hardware h100-sxm-80gb --model qwen3-8b \\
        --configs 'ordered;ordered:c_min=8192,c_max=8192;vllm:mbt=16384,prefill_schedule_interval=2'

Simulated (roofline cost model, prefix caching off, the model's context as max_model_len),
as ``real_traffic.py``.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness import Table, fail, finish, parser, start
from real_traffic import add_one_workload, one_workload, rate_scales

from ppas.core.errors import PpasError
from ppas.core.metrics import percentiles
from ppas.cost.catalog import MAX_MODEL_LEN
from ppas.engine.setup import engine_for
from ppas.engine.simulator import EngineConfig, simulate
from ppas.workload import TraceTransform, load_trace

#: The tail: the requests whose TTFT is in this top share (at least one request).
TAIL = 0.01


def tail_of(trace: Any, config: str, hardware: str, model: str,
            engine: EngineConfig) -> dict[str, float]:
    """One run's figures (module doc)."""
    e = engine_for(config, hardware, model, config=engine)
    res = simulate(trace, e.policy, e.cost_model, engine, record_steps=True)
    done = [r for r in res.requests
            if not r.failed and r.finish_time is not None and r.first_token_time is not None]
    if not done:
        raise PpasError(f"{config}: no request completed")
    tails = percentiles(res.request_metrics(), (99,))
    ttft = {r.request_id: r.first_token_time - r.arrival_time for r in done}  # type: ignore[operator]
    k = max(1, int(len(done) * TAIL))
    tail = sorted(done, key=lambda r: (-ttft[r.request_id], r.request_id))[:k]
    chunks: dict[str, list[tuple[Any, int]]] = defaultdict(list)  # prefill steps by request
    for s in res.steps:
        for rid, n in s.scheduled:
            chunks[rid].append((s, n))
    prefill = [s for s in res.steps if s.num_prefill_tokens]
    per: list[tuple[float, float, int, float, float, float]] = []
    for r in tail:
        first = r.first_token_time
        assert first is not None  # (done: every request here has its first token)
        steps = [(s, n) for s, n in chunks[r.request_id] if s.time < first]
        wait = (r.first_scheduled_time if r.first_scheduled_time is not None else first
                ) - r.arrival_time
        per.append((wait, ttft[r.request_id] - wait, len(steps),
                    statistics.fmean(n for _, n in steps) if steps else 0.0,
                    statistics.fmean(n / s.prefill_budget for s, n in steps
                                     if s.prefill_budget) if steps else 0.0,
                    statistics.fmean(s.num_decode_reqs for s, _ in steps) if steps else 0.0))
    return {
        "mean_e2e": statistics.fmean(r.finish_time - r.arrival_time for r in done),  # type: ignore[operator]
        "p99_ttft": tails["ttft_p99"], "p99_tpot": tails["tpot_p99"],
        "prefill_steps": len(prefill),
        "step_prefill_tokens": statistics.fmean(s.num_prefill_tokens for s in prefill)
        if prefill else 0.0,
        "step_decodes": statistics.fmean(s.num_decode_reqs for s in prefill) if prefill else 0.0,
        "step_ms": 1e3 * statistics.fmean(s.duration_s for s in prefill) if prefill else 0.0,
        "tail_requests": k,
        "tail_prompt_median": statistics.median(r.prompt_tokens for r in tail),
        "prompt_median": statistics.median(r.prompt_tokens for r in done),
        "tail_output_median": statistics.median(r.max_output_tokens for r in tail),
        "output_median": statistics.median(r.max_output_tokens for r in done),
        "tail_wait_s": statistics.fmean(p[0] for p in per),
        "tail_prefill_s": statistics.fmean(p[1] for p in per),
        "tail_steps": statistics.fmean(p[2] for p in per),
        "tail_tokens_per_step": statistics.fmean(p[3] for p in per),
        "tail_budget_share": statistics.fmean(p[4] for p in per),
        "tail_decodes": statistics.fmean(p[5] for p in per),
    }


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, hardware="h100-sxm-80gb", model="qwen3-8b")
    add_one_workload(ap)
    ap.add_argument("--loads", default="1",
                    help="rate multipliers of the workload's own rate (default 1)")
    args = ap.parse_args(argv)
    prog = Path(sys.argv[0]).name
    loads = rate_scales(args.loads, "--loads", prog)
    w, configs = one_workload(args, prog)
    start(args)
    rows: list[dict[str, Any]] = []
    try:
        base = w.transform.apply(load_trace(w.path, "auto", 512))
        engine = EngineConfig(max_model_len=MAX_MODEL_LEN.get(args.model))
        print(f"{w.name} on {args.hardware} / {args.model}: {base.description}, "
              f"{len(base)} requests; tail = the top {TAIL:.0%} of TTFTs; times in s")
        t = Table(("config", "<40"), ("load", ">5"), ("E2E", ">7.3f"), ("P99 TTFT", ">8.3f"),
                  ("P99 TPOT", ">8.4f"), ("steps", ">6d"), ("tok/step", ">8.0f"),
                  ("riding", ">6.1f"), ("ms", ">6.1f"), ("tail prompt", ">11.0f"),
                  ("all", ">6.0f"), ("tail out", ">8.0f"), ("all", ">6.0f"), ("wait", ">6.2f"),
                  ("prefill", ">7.2f"),
                  ("its steps", ">9.1f"), ("tok/step", ">8.0f"), ("share", ">5.2f"),
                  ("riding", ">6.1f"))
        t.print_header()
        for c in configs:
            for x in loads:
                tr = base if x == 1 else TraceTransform(time_scale=1 / x).apply(base)
                f = tail_of(tr, c, args.hardware, args.model, engine)
                t.print_row(c[:40], f"{x:g}", f["mean_e2e"], f["p99_ttft"], f["p99_tpot"],
                            f["prefill_steps"], f["step_prefill_tokens"], f["step_decodes"],
                            f["step_ms"], f["tail_prompt_median"], f["prompt_median"],
                            f["tail_output_median"], f["output_median"],
                            f["tail_wait_s"], f["tail_prefill_s"], f["tail_steps"],
                            f["tail_tokens_per_step"], f["tail_budget_share"],
                            f["tail_decodes"])
                rows.append({"config": c, "load": x, **f})
    except PpasError as e:
        fail(prog, str(e))
    finish(args, {"workload": w.name, "hardware": args.hardware, "model": args.model,
                  "tail_share": TAIL, "rows": rows})


if __name__ == "__main__":
    main()
