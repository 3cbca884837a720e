"""Argument helpers shared by ``ppas simulate`` and ``ppas sweep`` (flags are a contract)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from ppas.analysis.sweep import RECORD_KEYS
from ppas.core.errors import NO_SUCCESS, PpasError
from ppas.core.limits import (
    MAX_KV_BLOCKS,
    MAX_LIST_ITEMS,
    MAX_NUM_SEQS,
    MAX_OUTPUT_TOKENS,
    MAX_PROMPT_TOKENS,
    MAX_RATE,
    MAX_SEED,
    MAX_TP,
    int_arg,
)
from ppas.core.outputs import finite
from ppas.core.slo import SLO_HELP, SloSpec
from ppas.cost import CostModel
from ppas.cost.catalog import HARDWARE, MAX_MODEL_LEN, MODELS
from ppas.engine.setup import engine_for
from ppas.engine.simulator import SCHEDULING_POLICIES, EngineConfig
from ppas.live.versions import RELEASE_LINES
from ppas.policies import make_policy
from ppas.policies.vllm_stock import VERSIONS


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


def floats(text: str, what: str, hi: float = MAX_RATE) -> list[float]:
    """Comma-separated numbers in (0, hi] (burst rates), at most MAX_LIST_ITEMS."""
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PpasError(f"{what}: {text!r} is not a comma-separated list of numbers") from None
    if not vals or not all(math.isfinite(v) and 0 < v <= hi for v in vals):
        raise PpasError(f"{what}: values must be finite numbers > 0, at most {hi:g}, "
                        f"got {text!r}")
    if len(vals) > MAX_LIST_ITEMS:
        raise PpasError(f"{what}: {len(vals)} values; the limit is {MAX_LIST_ITEMS}")
    return _once(vals, what)


def _once(vals: list[Any], what: str) -> list[Any]:
    """``vals`` when no value repeats (a repeat would run, and count, twice)."""
    if twice := sorted({v for v in vals if vals.count(v) > 1}):
        raise PpasError(f"{what}: {', '.join(f'{v:g}' for v in twice)} given twice; "
                        "give each value once")
    return vals


def ints(text: str, what: str, hi: int = MAX_SEED) -> list[int]:
    """Comma-separated integers in [0, hi] (seeds), at most MAX_LIST_ITEMS."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PpasError(f"{what}: {text!r} is not a comma-separated list of integers") from None
    if not vals or any(not 0 <= v <= hi for v in vals):
        raise PpasError(f"{what}: need integers in [0, {hi}], got {text!r}")
    if len(vals) > MAX_LIST_ITEMS:
        raise PpasError(f"{what}: {len(vals)} values; the limit is {MAX_LIST_ITEMS}")
    return _once(vals, what)


def add_cost_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hardware", help=f"GPU for the roofline model: {', '.join(HARDWARE)}")
    p.add_argument("--model", help=f"model for the roofline model: {', '.join(MODELS)}")
    p.add_argument("--cost-model", default="roofline",
                   help="roofline (needs --hardware/--model) or fitted:FILE from ppas calibrate")
    p.add_argument("--tp", type=int_arg(1, MAX_TP), default=1,
                   help="tensor-parallel degree (roofline)")
    p.add_argument("--max-num-seqs", type=int_arg(1, MAX_NUM_SEQS), default=256)
    p.add_argument("--num-kv-blocks", type=int_arg(1, MAX_KV_BLOCKS), default=None,
                   help="KV capacity in 16-token blocks (default: from GPU memory); the "
                   "policies' KV admission reads it too")
    p.add_argument("--max-model-len", type=int_arg(1, MAX_PROMPT_TOKENS + MAX_OUTPUT_TOKENS),
                   default=None, help="vLLM's max_model_len: longer requests (prompt + output) "
                   "fail as vLLM rejects them (default: the --model's context, else none)")
    p.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, default="fcfs",
                   help="vLLM's --scheduling-policy: priority admits lower values of the "
                        "trace's 'priority' column first (a policy's order applies within a "
                        "level) and preempts the highest first")
    p.add_argument("--vllm-version", choices=VERSIONS, default="0.33",
                   help="the vLLM release line whose step rules are simulated (they differ "
                        "under --scheduling-policy priority; ppas tune: also whose knobs it "
                        "searches)")


def engine_config(args: argparse.Namespace, prefix_caching: bool = False) -> EngineConfig:
    """The simulated engine that the flags of ``add_cost_args`` describe."""
    line = RELEASE_LINES[args.vllm_version]
    return EngineConfig(max_num_seqs=args.max_num_seqs, num_kv_blocks=args.num_kv_blocks,
                        prefix_caching=prefix_caching, max_model_len=max_model_len(args),
                        scheduling_policy=args.scheduling_policy,
                        priority_skips_self_preempted=line.skips_self_preempted)


def add_shape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt-tokens", type=int_arg(1, MAX_PROMPT_TOKENS), default=25000)
    p.add_argument("--output-tokens", type=int_arg(1, MAX_OUTPUT_TOKENS), default=32)
    from ppas.policies import policy_names

    p.add_argument("--configs", default="mbt:2048,mbt:16384,ppas",
                   help="policy config strings, e.g. mbt:2048,ppas:n_th=2,b_max=16384,b_cap=2048;"
                   f" policies: {', '.join(policy_names())}")
    p.add_argument("--json", action="store_true", help="print only a JSON array of run records")


def add_slo_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup,
                required: bool = False) -> None:
    """``--slo``: the SLOs attainment and goodput are measured against (``ppas.core.slo``)."""
    p.add_argument("--slo", type=_slo, required=required, default=None,
                   help=f"SLOs for attainment and goodput: {SLO_HELP}")


def _slo(text: str) -> SloSpec:
    try:
        return SloSpec.parse(text)
    except PpasError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def check_common(args: argparse.Namespace) -> None:
    if args.cost_model == "roofline":
        if not args.hardware or not args.model:
            raise PpasError("the roofline cost model needs --hardware and --model "
                            f"(hardware: {', '.join(HARDWARE)}; models: {', '.join(MODELS)})")
        HARDWARE.get(args.hardware)
        MODELS.get(args.model)


def cost_model_for(args: argparse.Namespace, config: str) -> CostModel:
    return engine_for(config, args.hardware, args.model, cost_model=args.cost_model,
                      tp=args.tp).cost_model


def max_model_len(args: argparse.Namespace) -> int | None:
    """--max-model-len, else the catalog model's context (roofline), else None."""
    if args.max_model_len is not None:
        return int(args.max_model_len)
    if args.cost_model == "roofline" and args.model:
        return MAX_MODEL_LEN.get(args.model)
    return None


def no_success_exit(records: Sequence[dict[str, Any]], what: str) -> int:
    """The exit code for a finished run: 0, or NO_SUCCESS (one line on stderr) when some run
    completed no request at all (its metrics are nan)."""
    bad = [r for r in records if int(r.get("num_requests", 0)) - int(r.get("failed", 0)) <= 0]
    if not bad:
        return 0
    print(f"ppas {what}: {len(bad)} of {len(records)} runs completed no request (see the "
          "failed column); exit code " + str(NO_SUCCESS), file=sys.stderr)
    return NO_SUCCESS


def print_json(records: Sequence[dict[str, Any]]) -> None:
    out = [{k: r.get(k) for k in RECORD_KEYS} | {k: v for k, v in r.items()
                                                 if k not in RECORD_KEYS} for r in records]
    json.dump(finite(out), sys.stdout, indent=1, allow_nan=False)  # no value: null
    sys.stdout.write("\n")
