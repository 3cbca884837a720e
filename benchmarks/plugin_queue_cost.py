"""What a policy costs per step in vLLM's real Scheduler with a long waiting queue and
prefix caching on (vLLM's default), beside stock vLLM on the same queue.

Both run vLLM's real V1 scheduler on CPU with a fake KV cache (no model). The queue is kept
at ``--waiting`` requests: prompts of four 2,048-token shared prefixes plus 64-2,063 tokens
of their own, 16 outputs each, topped up after every step, so the cache holds the prefixes
and every waiting prompt has a hit. One timed call is ``schedule()``; the policy's
``decide()`` is timed inside it. A policy that orders the queue or admits by KV footprint
(``ordered``, ``sorted-f``) reads every waiting request through the plugin's view every step
(no waiting log: with prefix caching a request's uncached tokens move with the cache), so
its cost grows with the queue; stock vLLM's does not.

    PPAS_TINY_MODEL=.cache/tiny-qwen2 .venv/bin/python benchmarks/plugin_queue_cost.py
        [--waiting 100,300] [--policies 'mbt:2048;ordered:c_max=2048'] [--reps 100]
        [--cost-model fitted:experiments/demo-cpu.cost.json] [--json OUT]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

from harness import Table, fail, finish, parser, start

BUDGET = 2048
PREFIX = 2048
GROUPS = 4


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--waiting", default="100,300",
                    help="waiting queue lengths, comma-separated (default 100,300)")
    ap.add_argument("--policies", default="mbt:2048;ordered:c_max=2048",
                    help="plugin policies, ';'-separated (their budget at most 2048)")
    ap.add_argument("--cost-model", default="fitted:experiments/demo-cpu.cost.json",
                    help="the plugin's cost_model key (default: the demo's CPU fit)")
    ap.add_argument("--reps", type=int, default=100, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=20)
    a = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in a.waiting.split(",")]
    except ValueError:
        fail(ap.prog, f"--waiting must be integers separated by commas, got {a.waiting!r}")
    if not sizes or min(sizes) < 1 or max(sizes) > 5000:
        fail(ap.prog, f"--waiting must be 1..5000, got {a.waiting!r}")
    policies = [p.strip() for p in a.policies.split(";") if p.strip()]
    if not policies:
        fail(ap.prog, "--policies must name at least one policy")
    for name, least in (("reps", 1), ("warmup", 0)):
        if getattr(a, name) < least:
            fail(ap.prog, f"--{name} must be >= {least}, got {getattr(a, name)}")
    start(a, argv)
    from ppas.core.errors import PpasError
    from ppas.live.scheduler_harness import (
        fake_output,
        make_request,
        make_scheduler,
        tiny_model_dir,
    )

    model = tiny_model_dir()
    prefixes = [[(g * 1009 + i * 17) % 3000 + 3 for i in range(PREFIX)] for g in range(GROUPS)]

    def request(i: int) -> Any:
        own = [(i * 7 + j * 13) % 3000 + 3 for j in range(64 + (i * 37) % 2000)]
        ids = prefixes[i % GROUPS] + own
        return make_request(f"r{i}", len(ids), 16, token_ids=ids, arrival=time.time())

    def run(policy: str | None, n: int) -> dict[str, float]:
        try:
            s = make_scheduler(model, policy=policy, max_num_batched_tokens=BUDGET,
                               max_num_seqs=16, num_blocks=20_000, enable_prefix_caching=True,
                               cost_model=a.cost_model if policy is not None else None)
        except PpasError as e:
            fail(ap.prog, f"policy {policy!r}: {e}")
        decide: list[int] = []
        if policy is not None:
            pol = s.ppas_policy  # type: ignore[attr-defined]
            inner = pol.decide

            def timed(view: Any) -> Any:
                t = time.perf_counter_ns()
                d = inner(view)
                decide.append(time.perf_counter_ns() - t)
                return d

            pol.decide = timed
        nxt = 0
        for _ in range(n):
            s.add_request(request(nxt))
            nxt += 1
        steps: list[int] = []
        for _ in range(a.warmup + a.reps):
            t0 = time.perf_counter_ns()
            out = s.schedule()
            steps.append(time.perf_counter_ns() - t0)
            s.update_from_output(out, fake_output(out, s))
            while len(s.waiting) < n:
                s.add_request(request(nxt))
                nxt += 1
        s.shutdown()
        return {"schedule_us": statistics.median(steps[a.warmup:]) / 1e3,
                "decide_us": statistics.median(decide[a.warmup:]) / 1e3 if decide else 0.0}

    print(f"schedule() per step, prefix caching on, {GROUPS} shared {PREFIX}-token prefixes, "
          f"MBT {BUDGET}, 16 running at most, median of {a.reps} steps")
    t = Table(("waiting", ">8"), ("scheduler", "<28"), ("schedule() us", "14.0f"),
              ("x stock", "8.2f"), ("decide() us", "12.0f"), ("us / waiting", "13.1f"))
    t.print_header()
    results: dict[str, dict[str, dict[str, float]]] = {}
    for n in sizes:
        stock = run(None, n)
        rows = {"stock": stock}
        t.print_row(n, "stock vLLM", stock["schedule_us"], 1.0, 0.0, 0.0)
        for p in policies:
            r = rows[p] = run(p, n)
            t.print_row(n, p, r["schedule_us"], r["schedule_us"] / stock["schedule_us"],
                        r["decide_us"], r["decide_us"] / n)
        results[str(n)] = rows
    finish(a, results, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
