"""Where ``predictive``'s decision time goes, against what the speed bar leaves a decision.

    .venv/bin/python benchmarks/predictive_cost.py [--trace FILE] [--overload 3]
        [--window START:DUR] [--configs 'predictive;predictive:hold=1,replan=16'] [--json OUT]

Replays one trace (default: the whole Mooncake synthetic file, three times faster, as the
``mooncake x3`` row of ``benchmarks/trace_speed.py``) on H100 SXM / Qwen3-8B (roofline, the
model's context as max_model_len) under each config, with ``perf_counter`` around the
policy's ``decide``, its projection (``Predictive._project``) and the read of the
projection's inputs (``projection.horizon_work``). Per config it prints the decisions,
the projections, the CPU seconds of the run, the engine's share (the run less ``decide``),
milliseconds per projection and microseconds per read, and the budget per decision that
the issue's bar (10 CPU s per trace-hour) leaves once the engine has its share:
``(bar x span / 3600 - engine) / decisions``. docs/results/trace-speed.md ("Where
``predictive``'s time goes").
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from harness import Table, fail, finish, parser, start, timed

import ppas.policies.predictive as predictive_mod
from ppas.core.errors import PpasError
from ppas.cost.catalog import MAX_MODEL_LEN
from ppas.engine.setup import engine_for
from ppas.engine.simulator import EngineConfig, simulate
from ppas.policies.predictive import Predictive
from ppas.workload import TraceTransform, load_trace

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "traces"
BAR_S_PER_HOUR = 10.0
HARDWARE, MODEL = "h100-sxm-80gb", "qwen3-8b"


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--trace", default=str(TRACES / "mooncake-synthetic.jsonl"))
    ap.add_argument("--overload", type=float, default=3.0,
                    help="replay the trace this many times faster (default 3)")
    ap.add_argument("--window", metavar="START:DUR", help="replay only these seconds")
    ap.add_argument("--configs", default="predictive;predictive:hold=1,replan=16",
                    help="';'-separated predictive configs")
    args = ap.parse_args(argv)
    if not Path(args.trace).is_file():
        fail("predictive_cost.py", f"trace file {args.trace!r} not found")
    if not 0 < args.overload <= 100:
        fail("predictive_cost.py", f"--overload must be in (0, 100], got {args.overload:g}")
    window = None
    if args.window:
        try:
            w0, w1 = (float(x) for x in args.window.split(":"))
        except ValueError:
            fail("predictive_cost.py", f"--window must be START:DUR, got {args.window!r}")
        window = (w0, w1)
    start(args, argv)
    try:
        trace = load_trace(args.trace, "auto", 512, window)
        setups = [(c, engine_for(c, HARDWARE, MODEL)) for c in args.configs.split(";") if c]
    except PpasError as e:
        fail("predictive_cost.py", str(e))
    for c, s in setups:
        if not isinstance(s.policy, Predictive):
            fail("predictive_cost.py", f"--configs: {c!r} is not a predictive config")
    trace = TraceTransform(time_scale=1 / args.overload).apply(trace)
    engine = EngineConfig(max_model_len=MAX_MODEL_LEN.get(MODEL))
    span = trace.duration_s
    print(f"{Path(args.trace).name} x{args.overload:g}: {len(trace)} requests over {span:.0f} s; "
          f"{HARDWARE} / {MODEL}; bar {BAR_S_PER_HOUR:g} CPU s per trace-hour")
    t = Table(("config", "<26"), ("decisions", ">9d"), ("projections", ">11d"),
              ("cpu s", ">7.2f"), ("engine s", ">8.2f"), ("ms/projection", ">13.2f"),
              ("us/read", ">7.0f"), ("us/decision left by the bar", ">27.0f"))
    t.print_header()
    rows = []
    original = predictive_mod.horizon_work
    for c, s in setups:
        policy = s.policy
        assert isinstance(policy, Predictive)  # (checked above: one line, exit 2)
        acc = {k: 0.0 for k in ("decide", "decide_n", "project", "project_n", "read",
                                "read_n")}
        # Every part on the process CPU clock, as the run: the engine's share is the run
        # less decide() (wall-clock parts would count other jobs' time on a loaded host),
        # and nested calls' seconds never exceed their caller's on one clock.
        cpu_clock = time.process_time
        policy.decide = timed(policy.decide, acc, "decide",  # type: ignore[method-assign]
                              cpu_clock)
        policy._project = timed(policy._project, acc, "project",  # type: ignore[method-assign]
                                cpu_clock)
        predictive_mod.horizon_work = timed(original, acc, "read", cpu_clock)
        try:
            c0 = time.process_time()
            simulate(trace, policy, s.cost_model, engine)
            cpu = time.process_time() - c0
        finally:
            predictive_mod.horizon_work = original
        engine_s = cpu - acc["decide"]
        n_dec, n_proj, n_read = int(acc["decide_n"]), int(acc["project_n"]), int(acc["read_n"])
        left = (BAR_S_PER_HOUR * span / 3600 - engine_s) / max(1, n_dec)
        per_proj = acc["project"] / max(1, n_proj)
        per_read = acc["read"] / max(1, n_read)
        t.print_row(c, n_dec, n_proj, cpu, engine_s, per_proj * 1e3, per_read * 1e6,
                    left * 1e6)
        rows.append({"config": c, "span_s": span, "requests": len(trace), "cpu_s": cpu,
                     "decide_s": acc["decide"], "engine_s": engine_s, "decisions": n_dec,
                     "projections": n_proj, "project_s": acc["project"],
                     "reads": n_read, "read_s": acc["read"],
                     "bar_s_per_decision": left})
    finish(args, rows, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
