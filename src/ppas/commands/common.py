"""Argument helpers shared by ``ppas simulate`` and ``ppas sweep`` (flags are a contract)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from ppas.cost import CostModel, make_cost_model
from ppas.cost.catalog import HARDWARE, MODELS
from ppas.errors import PpasError
from ppas.policies import make_policy
from ppas.sweep import RECORD_KEYS


def split_configs(text: str) -> list[str]:
    """``'mbt:2048,ppas:n_th=2,b_cap=1024,mbt:16384'`` -> three config strings. A comma
    piece holding ``=`` but no ``:`` continues the previous config's parameters; ``;``
    always separates."""
    out: list[str] = []
    for chunk in text.split(";"):
        for piece in chunk.split(","):
            piece = piece.strip()
            if not piece:
                continue
            if out and "=" in piece and ":" not in piece and ":" in out[-1]:
                out[-1] += "," + piece
            else:
                out.append(piece)
    if not out:
        raise PpasError("no policy configs given; e.g. --configs mbt:2048,mbt:16384,ppas")
    for c in out:
        make_policy(c)  # validate early: one line naming the problem
    return out


def floats(text: str, what: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PpasError(f"{what}: {text!r} is not a comma-separated list of numbers") from None
    if not vals or not all(math.isfinite(v) and v > 0 for v in vals):
        raise PpasError(f"{what}: values must be finite numbers > 0, got {text!r}")
    return vals


def ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PpasError(f"{what}: {text!r} is not a comma-separated list of integers") from None
    if not vals or any(v < 0 for v in vals):
        raise PpasError(f"{what}: need integers >= 0, got {text!r}")
    return vals


def add_cost_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hardware", help=f"GPU for the roofline model: {', '.join(HARDWARE)}")
    p.add_argument("--model", help=f"model for the roofline model: {', '.join(MODELS)}")
    p.add_argument("--cost-model", default="roofline",
                   help="roofline (needs --hardware/--model) or fitted:FILE from ppas calibrate")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (roofline)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="KV capacity in 16-token blocks (default: from GPU memory)")


def add_shape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt-tokens", type=int, default=25000)
    p.add_argument("--output-tokens", type=int, default=32)
    from ppas.policies import policy_names

    p.add_argument("--configs", default="mbt:2048,mbt:16384,ppas",
                   help="policy config strings, e.g. mbt:2048,ppas:n_th=2,b_max=16384,b_cap=2048;"
                   f" policies: {', '.join(policy_names())}")
    p.add_argument("--json", action="store_true", help="print only a JSON array of run records")


def check_common(args: argparse.Namespace) -> None:
    if args.prompt_tokens < 1 or args.output_tokens < 1:
        raise PpasError("--prompt-tokens and --output-tokens must be >= 1")
    if args.max_num_seqs < 1:
        raise PpasError("--max-num-seqs must be >= 1")
    if args.tp < 1:
        raise PpasError("--tp must be >= 1")
    if args.num_kv_blocks is not None and args.num_kv_blocks < 1:
        raise PpasError("--num-kv-blocks must be >= 1")
    if args.cost_model == "roofline":
        if not args.hardware or not args.model:
            raise PpasError("the roofline cost model needs --hardware and --model "
                            f"(hardware: {', '.join(HARDWARE)}; models: {', '.join(MODELS)})")
        HARDWARE.get(args.hardware)
        MODELS.get(args.model)


def cost_model_for(args: argparse.Namespace, config: str) -> CostModel:
    return make_cost_model(args.cost_model, args.hardware, args.model, args.tp,
                           make_policy(config).max_num_batched_tokens)


def print_json(records: Sequence[dict[str, Any]]) -> None:
    out = [{k: r.get(k) for k in RECORD_KEYS} | {k: v for k, v in r.items()
                                                 if k not in RECORD_KEYS} for r in records]
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
