"""Quality of a policy's decisions on real traces: mean E2E, P99 TTFT and P99 TPOT per load.

    .venv/bin/python benchmarks/predictive_quality.py [--configs 'predictive;...']
        [--azure FILE] [--mooncake FILE] [--gpus h100,a100] [--loads 1,1.5,2,3] [--json OUT]

The workloads of ``benchmarks/real_traffic.py`` (simulated, roofline cost model, the
model's context as max_model_len): the first hour of the Azure 2023 code trace, and
Mooncake's first 600 s slowed 1.33x with requests over 32k tokens dropped, each at
``--loads`` times its rate, on H100 SXM / Qwen3-8B and A100 SXM / Qwen2.5-7B. Per run it
prints the three figures and the CPU seconds the simulation took. Made to compare two
versions of one policy (docs/results/trace-speed.md, ``predictive``): run it once per
version, e.g. the old one from an archived ``src/`` under ``PYTHONPATH``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from harness import Table, fail, finish, parser, start

from ppas.analysis.tune import figures
from ppas.core.errors import PpasError
from ppas.cost.catalog import MAX_MODEL_LEN
from ppas.engine.setup import engine_for
from ppas.engine.simulator import EngineConfig
from ppas.workload import TraceTransform, load_trace

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "traces"
GPUS = {"h100": ("h100-sxm-80gb", "qwen3-8b"), "a100": ("a100-sxm-80gb", "qwen2.5-7b")}
WORKLOADS = {  # as benchmarks/real_traffic.py's
    "azure": TraceTransform(window=(0.0, 3600.0)),
    "mooncake": TraceTransform(window=(0.0, 600.0), time_scale=1.33, drop_longer_than=32768),
}


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--configs", default="predictive", help="';'-separated policy configs")
    ap.add_argument("--azure", default=str(TRACES / "azure-2023-code.csv"))
    ap.add_argument("--mooncake", default=str(TRACES / "mooncake-synthetic.jsonl"))
    ap.add_argument("--traces", default="azure,mooncake")
    ap.add_argument("--gpus", default="h100,a100")
    ap.add_argument("--loads", default="1,1.5,2,3")
    args = ap.parse_args(argv)
    start(args, argv)
    configs = [c for c in args.configs.split(";") if c]
    try:
        loads = [float(x) for x in args.loads.split(",")]
    except ValueError:
        fail("predictive_quality.py", f"--loads must be numbers, got {args.loads!r}")
    traces = [w for w in args.traces.split(",") if w]
    gpus = [g for g in args.gpus.split(",") if g]
    for w in traces:
        if w not in WORKLOADS:
            fail("predictive_quality.py", f"--traces: unknown {w!r}; known: azure, mooncake")
        if not Path(getattr(args, w)).is_file():
            fail("predictive_quality.py", f"trace file {getattr(args, w)!r} not found")
    for g in gpus:
        if g not in GPUS:
            fail("predictive_quality.py", f"--gpus: unknown {g!r}; known: h100, a100")
    t = Table(("trace", "<9"), ("gpu", "<5"), ("load", ">5"), ("config", "<28"),
              ("mean E2E", ">9.4f"), ("P99 TTFT", ">9.4f"), ("P99 TPOT", ">9.5f"),
              ("cpu s", ">7.1f"))
    t.print_header()
    rows: list[dict[str, Any]] = []
    for w in traces:
        raw = load_trace(getattr(args, w), "auto", 512)
        for g in gpus:
            hw, model = GPUS[g]
            engine = EngineConfig(max_model_len=MAX_MODEL_LEN.get(model))
            for x in loads:
                trace = WORKLOADS[w].at_load(x).apply(raw)
                for c in configs:
                    try:
                        cm = engine_for(c, hw, model).cost_model
                    except PpasError as e:
                        fail("predictive_quality.py", str(e))
                    c0 = time.process_time()
                    f = figures(trace, c, cm, engine, x)
                    cpu = time.process_time() - c0
                    t.print_row(w, g, f"x{x:g}", c, f.mean_e2e, f.p99_ttft, f.p99_tpot, cpu)
                    rows.append({"trace": w, "gpu": g, "config": c, "cpu_s": cpu,
                                 **f.record()})
    finish(args, rows, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
