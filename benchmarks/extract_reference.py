"""Derive the reference figures the simulator is compared against from the shared log.

Reads ../shared/data/ppas-rtx5090-qwen2.5-3b.log (210 runs of the P-PAS artifact) and
writes src/ppas/data/reference_rtx5090_qwen2.5-3b.json: every run's metrics, keyed by
config, burst rate and seed, so the repo never needs ../shared at run time.

    .venv/bin/python benchmarks/extract_reference.py [LOG] [--out FILE]
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from harness import parser, start

from ppas.core.outputs import write_atomic

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT.parent / "shared" / "data" / "ppas-rtx5090-qwen2.5-3b.log"
OUT = ROOT / "src" / "ppas" / "data" / "reference_rtx5090_qwen2.5-3b.json"
KEYS = ("num_requests", "avg_latency", "p95_latency", "avg_ttft", "p95_ttft", "avg_tpot",
        "p95_tpot", "makespan", "failed")


def config_of(name: str, mbt: int) -> str:
    """Artifact config names -> our config strings: mbt_<N>_s256 -> mbt:N, ppas_ -> ppas."""
    return "ppas" if name.startswith("ppas") else f"mbt:{mbt}"


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, json=False)
    ap.add_argument("log", nargs="?", default=str(LOG), help="the artifact log to read")
    ap.add_argument("--out", default=str(OUT), help="the reference file to write")
    args = ap.parse_args(argv)
    start(args, argv)
    runs = []
    for line in Path(args.log).read_text().splitlines():
        if not line.startswith("{'trace_id'"):
            continue
        r = ast.literal_eval(line)
        burst = float(r["phase_schedule"].split(",")[1].split(":")[1])
        runs.append({"config": config_of(r["config_name"], r["max_num_batched_tokens"]),
                     "burst_rate": burst, "seed": r["seed"],
                     "phases": r["phase_schedule"], "prompt_tokens": r["configured_prompt_tokens"],
                     "output_tokens": r["configured_output_tokens"],
                     **{k: r[k] for k in KEYS}})
    doc = {"source": "P-PAS artifact log ppas-rtx5090-qwen2.5-3b.log (Apache-2.0)",
           "hardware": "rtx5090", "model": "qwen2.5-3b", "max_num_seqs": 256, "runs": runs}
    out = write_atomic(args.out, json.dumps(doc, indent=0) + "\n").resolve()
    print(f"wrote {len(runs)} runs to {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()
