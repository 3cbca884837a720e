"""``ppas calibrate STEPLOG [STEPLOG...] -o COST.json``: fit ``ppas.cost.fitted``'s step-time
model to the vLLM plugin's step logs and report the fit error.

A step log (``ppas.vllm``) is JSONL, one object per engine step. The fit uses
``duration_s`` (the step's completion-timed wall time) as the target and the step's shape
from ``prefill_chunks`` (``[chunk_tokens, cached_context_before_chunk]`` pairs) and
``decode_contexts`` (tokens already cached per decode). Other keys are ignored.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from ppas.cost.base import StepShape
from ppas.errors import PpasError

REQUIRED = ("duration_s", "prefill_chunks", "decode_contexts")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def step_record(obj: Any) -> tuple[StepShape, float]:
    """One step-log object -> (shape, seconds); ValueError names what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object (one step)")
    missing = [k for k in REQUIRED if k not in obj]
    if missing:
        raise ValueError(f"step lacks {', '.join(missing)}; is this a ppas.vllm step log?")
    d = obj["duration_s"]
    if not isinstance(d, int | float) or isinstance(d, bool) or not math.isfinite(d) or d < 0:
        raise ValueError(f"duration_s must be a finite number >= 0, got {d!r}")
    chunks = obj["prefill_chunks"]
    if not isinstance(chunks, list) or not all(
            isinstance(c, list) and len(c) == 2 and _is_int(c[0]) and _is_int(c[1])
            and c[0] >= 1 and c[1] >= 0 for c in chunks):
        raise ValueError("prefill_chunks must be a list of [chunk_tokens >= 1, "
                         f"cached_context >= 0] integer pairs, got {chunks!r:.80}")
    ctx = obj["decode_contexts"]
    if not isinstance(ctx, list) or not all(_is_int(k) and k >= 0 for k in ctx):
        raise ValueError(f"decode_contexts must be a list of integers >= 0, got {ctx!r:.80}")
    return StepShape.of([(c, p) for c, p in chunks], ctx), float(d)


def read_step_log(path: str | Path, skip_steps: int = 0) -> list[tuple[StepShape, float]]:
    """All steps of one log, minus its first ``skip_steps`` (warm-up). A malformed line
    raises a PpasError naming ``file:line``."""
    p = Path(path)
    if not p.is_file():
        raise PpasError(f"step log {str(p)!r} does not exist")
    try:
        lines = p.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise PpasError(f"{p}: cannot read step log: {e}") from None
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(step_record(json.loads(line)))
        except json.JSONDecodeError as e:
            raise PpasError(f"{p}:{n}: invalid JSON: {e.msg}") from None
        except ValueError as e:
            raise PpasError(f"{p}:{n}: {e}") from None
    return records[skip_steps:]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("steplogs", nargs="+", metavar="STEPLOG",
                   help="step logs (JSONL) written by the ppas.vllm plugin's step_log")
    p.add_argument("-o", "--output", required=True, metavar="COST.json",
                   help="where to write the fitted model (use as --cost-model fitted:FILE)")
    p.add_argument("--skip-steps", type=int, default=0, metavar="N",
                   help="drop the first N steps of each log (warm-up, compilation; default 0)")
    p.add_argument("--kv-capacity-tokens", type=int, metavar="N",
                   help="the server's KV cache size in tokens, stored with the model")
    p.add_argument("--json", action="store_true", help="print the written model as JSON")


def run(args: argparse.Namespace) -> int:
    from ppas.cost.fitted import fit, fit_stats

    if args.skip_steps < 0:
        raise PpasError(f"--skip-steps must be >= 0, got {args.skip_steps}")
    if args.kv_capacity_tokens is not None and args.kv_capacity_tokens <= 0:
        raise PpasError(f"--kv-capacity-tokens must be > 0, got {args.kv_capacity_tokens}")
    records = []
    for path in args.steplogs:
        records += read_step_log(path, args.skip_steps)
    model = fit(records, kv_capacity_tokens=args.kv_capacity_tokens,
                sources=[str(Path(p)) for p in args.steplogs])
    model.to_file(args.output)
    if args.json:
        print(json.dumps(model.to_dict(), allow_nan=False))
        return 0
    assert model.stats is not None
    print(f"wrote {args.output}")
    print(f"fit on {model.stats.line()}")
    prefill = [r for r in records if r[0].num_prefill_tokens > 0]
    decode = [r for r in records if r[0].num_prefill_tokens == 0 and r[0].num_decodes > 0]
    for name, part in (("steps with prefill", prefill), ("decode-only steps", decode)):
        if part:
            print(f"  {name}: {fit_stats(model, part).line()}")
    units = {"overhead_s": ("ms", 1e3), "per_prefill_token_s": ("us", 1e6),
             "per_attn_pair_s": ("ns", 1e9), "per_decode_s": ("us", 1e6),
             "per_decode_ctx_token_s": ("ns", 1e9)}
    print("coefficients: " + ", ".join(
        f"{n.removesuffix('_s')} {getattr(model, n) * k:.4g} {u}"
        for n, (u, k) in units.items()),
        file=sys.stdout)
    return 0
