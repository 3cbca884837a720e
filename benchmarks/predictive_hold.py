"""How sticky ``predictive``'s picks are, and how often a held pick is not the full search's.

    .venv/bin/python benchmarks/predictive_hold.py [--azure FILE] [--mooncake FILE]
        [--overload 3] [--configs 'predictive:hold=1;predictive:hold=16;predictive:hold=32']
        [--json OUT]

The rows of ``benchmarks/trace_speed.py`` (H100 SXM / Qwen3-8B, roofline, the model's
context as max_model_len): the first hour of the Azure code trace and the Mooncake file,
each as published and ``--overload`` times faster ("" for a file: not run). Per config
and row, along the config's own run: the decisions that need a projection, the
projections and the share of them whose pick (budget, admission limit) repeats the
projection before (``repeat``: how sticky the picks are), the decisions that followed a
held plan (``hold``) and the share of those at which the full search, run beside it on
the same view (its answer not used), picks the held plan's pick too (``hit``). The
shadow searches make the runs slower than the policy's own: this measures decisions,
not speed (``benchmarks/trace_speed.py``). docs/results/trace-speed.md ("Holding a
repeated pick").
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness import Table, fail, finish, parser, start

from ppas.core.decision import Decision
from ppas.core.errors import PpasError
from ppas.core.view import SchedulerView
from ppas.cost.base import CostModel
from ppas.cost.catalog import MAX_MODEL_LEN
from ppas.engine.setup import engine_for
from ppas.engine.simulator import EngineConfig, simulate
from ppas.policies.predictive import Predictive
from ppas.workload import Trace, TraceTransform, load_trace

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "traces"
HARDWARE, MODEL = "h100-sxm-80gb", "qwen3-8b"


def count(policy: Predictive, cost_model: CostModel, trace: Trace) -> dict[str, int]:
    """Runs ``trace`` under ``policy`` and counts its decisions (module doc)."""
    n = {"decisions": 0, "projections": 0, "repeats": 0, "followed": 0, "hits": 0}
    project, follow, decide = policy._project, policy._follow, policy.decide
    plan: list[tuple[int, int] | None] = [None]  # the last projection's pick
    shadow: list[tuple[int, int] | None] = [None]  # the full search's, at a follow

    def projected(v: SchedulerView) -> tuple[int, int]:
        before = policy._last_pick
        out = project(v)
        n["projections"] += 1
        n["repeats"] += before is not None and policy._last_pick == before
        plan[0] = policy._last_pick
        return out

    def followed(v: SchedulerView) -> int:
        out = follow(v)
        keep = policy._last_pick
        project(v)  # the full search on the same view (only its pick is read)
        shadow[0], policy._last_pick = policy._last_pick, keep
        return out

    def decided(v: SchedulerView) -> Decision:
        k = n["projections"]
        shadow[0] = None
        d = decide(v)
        if n["projections"] > k:
            n["decisions"] += 1
        elif shadow[0] is not None:  # a held plan was followed (not projected after all)
            n["decisions"] += 1
            n["followed"] += 1
            n["hits"] += shadow[0] == plan[0]
        return d

    policy._project = projected  # type: ignore[method-assign,assignment]
    policy._follow = followed  # type: ignore[method-assign,assignment]
    policy.decide = decided  # type: ignore[method-assign,assignment]
    simulate(trace, policy, cost_model, EngineConfig(max_model_len=MAX_MODEL_LEN.get(MODEL)))
    return n


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--azure", default=str(TRACES / "azure-2023-code.csv"))
    ap.add_argument("--mooncake", default=str(TRACES / "mooncake-synthetic.jsonl"))
    ap.add_argument("--overload", type=float, default=3.0)
    ap.add_argument("--configs", default="predictive:hold=1;predictive:hold=16;predictive:hold=32",
                    help="';'-separated predictive configs")
    args = ap.parse_args(argv)
    if not 0 < args.overload <= 100:
        fail("predictive_hold.py", f"--overload must be in (0, 100], got {args.overload:g}")
    for path in (args.azure, args.mooncake):
        if path and not Path(path).is_file():
            fail("predictive_hold.py", f"trace file {path!r} not found")
    configs = [c for c in args.configs.split(";") if c]
    try:
        for c in configs:
            if not isinstance(engine_for(c, HARDWARE, MODEL).policy, Predictive):
                fail("predictive_hold.py", f"--configs: {c!r} is not a predictive config")
    except PpasError as e:
        fail("predictive_hold.py", str(e))
    start(args, argv)
    cases: list[tuple[str, Trace]] = []
    for name, path, window in (("azure-code 1h", args.azure, (0.0, 3600.0)),
                               ("mooncake", args.mooncake, None)):
        if path:
            base = load_trace(path, "auto", 512, window)
            cases.append((name, base))
            if args.overload != 1:
                cases.append((f"{name} x{args.overload:g}",
                              TraceTransform(time_scale=1 / args.overload).apply(base)))
    t = Table(("trace", "<16"), ("config", "<20"), ("decisions", ">9d"),
              ("projections", ">11d"), ("repeat", ">6.3f"), ("followed", ">8d"),
              ("hit", ">5.3f"))
    t.print_header()
    rows: list[dict[str, object]] = []
    for name, trace in cases:
        for c in configs:
            s = engine_for(c, HARDWARE, MODEL)
            policy = s.policy
            assert isinstance(policy, Predictive)  # (checked above)
            n = count(policy, s.cost_model, trace)
            repeat = n["repeats"] / max(1, n["projections"] - 1)
            hit = n["hits"] / n["followed"] if n["followed"] else float("nan")
            t.print_row(name, c, n["decisions"], n["projections"], repeat, n["followed"], hit)
            rows.append({"trace": name, "config": c, **n, "repeat": repeat, "hit": hit})
    finish(args, rows, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
