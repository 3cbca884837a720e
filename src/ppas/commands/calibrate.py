"""``ppas calibrate STEPLOG [STEPLOG...] -o COST.json``: fit ``ppas.cost.fitted``'s step-time
model to the vLLM plugin's step logs (``ppas.calibrate.fit`` fits and saves it) and report
the fit."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ppas.calibrate.fit import fit_and_save, read_steps, sample
from ppas.core.errors import PpasError
from ppas.core.limits import MAX_KV_TOKENS, MAX_SKIP_STEPS, int_arg
from ppas.core.outputs import check_output_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("steplogs", nargs="+", metavar="STEPLOG",
                   help="step logs (JSONL) written by the ppas.vllm plugin's step_log")
    p.add_argument("-o", "--output", required=True, metavar="COST.json",
                   help="where to write the fitted model (use as --cost-model fitted:FILE)")
    p.add_argument("--skip-steps", type=int_arg(0, MAX_SKIP_STEPS), default=0, metavar="N",
                   help="drop the first N steps of each server run in each log (warm-up, "
                   "compilation; default 0)")
    p.add_argument("--kv-capacity-tokens", type=int_arg(1, MAX_KV_TOKENS), metavar="N",
                   help="the server's KV cache size in tokens, stored with the model")
    p.add_argument("--json", action="store_true", help="print the written model as JSON")


def run(args: argparse.Namespace) -> int:
    from ppas.cost.fitted import fit_stats

    seen: dict[tuple[int, int], str] = {}
    for path in args.steplogs:
        if not Path(path).is_file():
            raise PpasError(f"step log {path!r} does not exist")
        st = os.stat(path)  # the same file by any name would fit its steps twice
        if (first := seen.setdefault((st.st_dev, st.st_ino), path)) != path or \
                args.steplogs.count(path) > 1:
            raise PpasError(f"step log {path!r} is given twice (also as {first!r}); "
                            "give each log once")
    check_output_file(args.output, "-o/--output", inputs=args.steplogs)
    steps = [s for path in args.steplogs for s in read_steps(path, args.skip_steps)]
    model = fit_and_save(steps, args.output, kv_capacity_tokens=args.kv_capacity_tokens,
                         sources=[str(Path(p)) for p in args.steplogs])
    if args.json:
        print(json.dumps(model.to_dict(), allow_nan=False))
        return 0
    assert model.stats is not None
    print(f"wrote {args.output}")
    print(f"fit on {model.stats.line()}")
    records = [sample(s) for s in steps]
    prefill = [r for r in records if r[0].num_prefill_tokens > 0]
    decode = [r for r in records if r[0].num_prefill_tokens == 0 and r[0].num_decodes > 0]
    for name, part in (("steps with prefill", prefill), ("decode-only steps", decode)):
        if part:
            print(f"  {name}: {fit_stats(model, part).line()}")
    print(model.coefficients_line())
    return 0
