"""``schedule()`` with the policy's prefill cap spent and 1,000 prompts waiting, on vLLM 0.32
and 0.33 side by side (each in its own venv, on its real V1 scheduler, CPU, no model).

vLLM 0.33's waiting loop skips a request cut to 0 tokens and scans on where 0.32 stops
(``ppas.live.versions``): without the plugin's admission stop every waiting prompt costs a
hook call and a prefix-cache lookup on every step. Mix (identical in both venvs): 32 running
decodes, long prompts being prefilled under ``ppas:n_th=2,b_max=16384,b_cap=2048`` (the cap
of 2048 is spent by the running prefills on most steps), 1,000 waiting 2,000-token prompts
(topped up after every step), prefix caching on. Timed: ``schedule()`` alone; hook calls
per step are counted. Variants: stock vLLM, the plugin, and (0.33 only) the plugin with its
admission stop switched off, to show what the stop saves. Target: plugin on 0.33 within
1.5x of the plugin on 0.32.

    .venv/bin/python benchmarks/admission_scan.py            # builds neither venv:
        [--python-032 .venv/bin/python] [--python-033 .venv-vllm033/bin/python]
        [--reps 300] [--warmup 30] [--json OUT]              # make venv / make test-vllm033
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import Table, finish, parser, start

ROOT = Path(__file__).resolve().parent.parent
MBT = 16384
POLICY = "ppas:n_th=2,b_max=16384,b_cap=2048"
NUM_DECODES = 32
NUM_WAITING = 1000
WAITING_LEN = 2000


def measure(reps: int, warmup: int) -> dict[str, Any]:
    """Runs inside one venv: median schedule() time and hook calls per variant."""
    import vllm

    from ppas.live.scheduler_harness import (
        fake_output,
        make_request,
        make_scheduler,
        tiny_model_dir,
    )

    model = tiny_model_dir()
    line = ".".join(vllm.__version__.split(".")[:2])
    variants: dict[str, Any] = {}
    for name in ("stock", "plugin", "plugin, admission stop off"):
        if name == "plugin, admission stop off" and line == "0.32":
            continue  # 0.32 breaks by itself: the stop is never engaged there
        sched = make_scheduler(model, policy=None if name == "stock" else POLICY,
                               max_num_batched_tokens=MBT, max_num_seqs=512,
                               num_blocks=400_000, enable_prefix_caching=True)
        if name.endswith("off"):
            sched._stops_admission = False  # type: ignore[attr-defined]
        calls = [0]
        hook = sched._reserve_prefill_lookahead

        def counted(*a: Any, _h: Any = hook, _c: list[int] = calls) -> int:
            _c[0] += 1
            return int(_h(*a))

        sched._reserve_prefill_lookahead = counted  # type: ignore[method-assign,assignment]
        variants[name] = (sched, calls)
    seq = [0]

    def add_waiting(sched: Any) -> None:
        while len(sched.waiting) < NUM_WAITING:
            seq[0] += 1
            sched.add_request(make_request(f"w{seq[0]}", WAITING_LEN, 1, seed=50_000 + seq[0]))

    def step(sched: Any) -> int:
        t0 = time.perf_counter_ns()
        out = sched.schedule()
        t1 = time.perf_counter_ns()
        sched.update_from_output(out, fake_output(out, sched))
        return t1 - t0

    for sched, _ in variants.values():
        for i in range(NUM_DECODES):
            sched.add_request(make_request(f"d{i}", 64, 100_000, seed=i))
        step(sched)  # the decodes' prompts, alone
        for i in range(2):
            sched.add_request(make_request(f"p{i}", 8000, 1, seed=1000 + i))
        add_waiting(sched)
    times: dict[str, list[int]] = {n: [] for n in variants}
    calls_per_step: dict[str, list[int]] = {n: [] for n in variants}
    names = list(variants)
    for rep in range(warmup + reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            sched, calls = variants[name]
            before = calls[0]
            ns = step(sched)
            add_waiting(sched)
            if rep >= warmup:
                times[name].append(ns)
                calls_per_step[name].append(calls[0] - before)
    return {
        "vllm": vllm.__version__,
        "median_us": {n: statistics.median(t) / 1000 for n, t in times.items()},
        "hook_calls": {n: statistics.median(c) for n, c in calls_per_step.items()},
    }


def run_in(python: str, reps: int, warmup: int) -> dict[str, Any]:
    if not Path(python).exists():
        raise SystemExit(f"admission_scan: {python} not found; build it (make venv / "
                         "make test-vllm033) or pass --python-032/--python-033")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), VLLM_TARGET_DEVICE="cpu")
    env.setdefault("PPAS_TINY_MODEL", str(ROOT / ".cache" / "tiny-qwen2"))
    proc = subprocess.run(
        [python, __file__, "--child", "--reps", str(reps), "--warmup", str(warmup)],
        env=env, capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"admission_scan: {python} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--python-032", default=str(ROOT / ".venv/bin/python"))
    ap.add_argument("--python-033", default=str(ROOT / ".venv-vllm033/bin/python"))
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(measure(a.reps, a.warmup)))
        return 0
    start(a, argv)
    r32 = run_in(a.python_032, a.reps, a.warmup)
    r33 = run_in(a.python_033, a.reps, a.warmup)
    print(f"schedule() per step: cap ({POLICY}) spent by running prefills, {NUM_DECODES} "
          f"decodes, {NUM_WAITING} x {WAITING_LEN}-token prompts waiting, prefix caching on, "
          f"{a.reps} reps; median us (hook calls per step)")
    t = Table(("variant", "<28"), ("vLLM " + r32["vllm"], ">20"), ("vLLM " + r33["vllm"], ">20"),
              ("0.33/0.32", ">10"))
    t.print_header()
    for name in r33["median_us"]:
        cells = []
        for r in (r32, r33):
            us = r["median_us"].get(name)
            cells.append(f"{us:9.1f} ({r['hook_calls'][name]:5.0f})" if us is not None
                         else f"{'-':>9s} {'':7s}")
        ratio = (f"{r33['median_us'][name] / r32['median_us'][name]:10.2f}"
                 if name in r32["median_us"] else f"{'-':>10s}")
        t.print_row(name, cells[0], cells[1], ratio)
    ratio = r33["median_us"]["plugin"] / r32["median_us"]["plugin"]
    print(f"plugin, 0.33 vs 0.32: {ratio:.2f}x (target <= 1.5x: "
          f"{'met' if ratio <= 1.5 else 'NOT met'})")
    print("reproduce: make venv test-vllm033 && .venv/bin/python benchmarks/admission_scan.py")
    finish(a, {"vllm_0.32": r32, "vllm_0.33": r33}, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
