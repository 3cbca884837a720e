"""Per-step cost of ``ppas.vllm.PolicyScheduler`` vs vLLM's stock ``Scheduler``.

Both run vLLM's real V1 scheduler on CPU with a fake KV cache (no model), on the same
request mix: 256 running decodes plus 8 long prompts being prefilled (each replaced when it
finishes). One timed call = ``schedule()`` + ``update_from_output()``; the hand-made model
output is built outside the timed region. Stock and plugin calls are interleaved (order
alternating every rep) so that drift hits both equally. The headline plugin uses
``mbt:<MBT>`` so it schedules exactly what stock does: the ratio is pure plugin overhead
(view, policy decision, cap hook, step accounting). ``ppas`` (which schedules less prefill
per step under this pressure) and ``mbt`` with the JSONL step log are reported too, the log
written per step (the default: durable under SIGKILL) and with a 256-step buffer (the
pre-issue-11 default) side by side.

    PPAS_TINY_MODEL=.cache/tiny-qwen2 .venv/bin/python benchmarks/plugin_overhead.py
        [--reps 1500] [--warmup 100] [--json OUT]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

from harness import Table, finish, parser, start
from vllm.v1.core.sched.scheduler import Scheduler

from ppas.live.scheduler_harness import fake_output, make_request, make_scheduler, tiny_model_dir

MBT = 16384
NUM_DECODES = 256
NUM_PREFILLS = 8
PREFILL_LEN = 4000


class Mix:
    """Keeps one scheduler at 256 decodes + 8 prefills; identical across schedulers."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.next_id = 0
        for i in range(NUM_DECODES):
            sched.add_request(make_request(f"d{i}", 64, 7000, seed=i))
        while any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.running) or (
            sched.waiting
        ):
            self.step()
        self.top_up()

    def top_up(self) -> None:
        live = sum(1 for rid in self.sched.requests if rid.startswith("p"))
        for _ in range(NUM_PREFILLS - live):
            self.next_id += 1
            rid = f"p{self.next_id}"
            self.sched.add_request(make_request(rid, PREFILL_LEN, 1, seed=10_000 + self.next_id))

    def step(self) -> int:
        """One schedule + update; returns the timed nanoseconds."""
        t0 = time.perf_counter_ns()
        out = self.sched.schedule()
        t1 = time.perf_counter_ns()
        fake = fake_output(out, self.sched)
        t2 = time.perf_counter_ns()
        self.sched.update_from_output(out, fake)
        t3 = time.perf_counter_ns()
        return (t1 - t0) + (t3 - t2)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--reps", type=int, default=1500)
    ap.add_argument("--warmup", type=int, default=100)
    args = ap.parse_args(argv)
    start(args, argv)
    model = tiny_model_dir()
    log_dir = tempfile.mkdtemp(prefix="ppas-overhead-")
    variants: dict[str, Scheduler] = {
        "stock": make_scheduler(model, policy=None, max_num_batched_tokens=MBT,
                                max_num_seqs=512, num_blocks=200_000),
        f"plugin mbt:{MBT}": make_scheduler(model, policy=f"mbt:{MBT}",
                                            max_num_batched_tokens=MBT, max_num_seqs=512,
                                            num_blocks=200_000),
        f"plugin mbt:{MBT} + step log": make_scheduler(
            model, policy=f"mbt:{MBT}", max_num_batched_tokens=MBT, max_num_seqs=512,
            num_blocks=200_000, step_log=f"{log_dir}/steps.jsonl"),
        f"plugin mbt:{MBT} + log, 256 buf": make_scheduler(
            model, policy=f"mbt:{MBT}", max_num_batched_tokens=MBT, max_num_seqs=512,
            num_blocks=200_000, step_log=f"{log_dir}/steps-buffered.jsonl"),
        "plugin ppas (default)": make_scheduler(model, policy="ppas", max_num_batched_tokens=MBT,
                                                max_num_seqs=512, num_blocks=200_000),
    }
    # The step log's default writes every step to the OS (durable under SIGKILL); the
    # buffered variant is the pre-issue-11 behaviour (256 steps per write), for comparison.
    variants[f"plugin mbt:{MBT} + log, 256 buf"].step_log.flush_every = 256  # type: ignore[attr-defined]
    mixes = {name: Mix(s) for name, s in variants.items()}
    times: dict[str, list[int]] = {name: [] for name in mixes}
    names = list(mixes)
    for rep in range(args.warmup + args.reps):
        order = names if rep % 2 == 0 else names[::-1]
        for name in order:
            ns = mixes[name].step()
            mixes[name].top_up()
            if rep >= args.warmup:
                times[name].append(ns)
    base = statistics.median(times["stock"])
    print(f"schedule()+update_from_output() per step, {NUM_DECODES} running decodes + "
          f"{NUM_PREFILLS} x {PREFILL_LEN}-token prefills, MBT {MBT}, {args.reps} reps")
    t = Table(("variant", "<32"), ("median us", "10.1f"), ("ratio", "7.3f"))
    t.print_header()
    results = {}
    for name in names:
        med = statistics.median(times[name])
        results[name] = {"median_us": med / 1000, "ratio": med / base}
        t.print_row(name, med / 1000, med / base)
    print("reproduce: PPAS_TINY_MODEL=.cache/tiny-qwen2 .venv/bin/python "
          "benchmarks/plugin_overhead.py")
    finish(args, results, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
