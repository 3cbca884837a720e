"""An experiment file that puts a tuned stock setting (``ppas tune``) live against policies,
on the same trace file with the same transformations, at the same rate multipliers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from ppas.analysis.tune import short_name
from ppas.core.decision import Knob
from ppas.policies import Policy, make_policy
from ppas.policies.vllm_stock import KNOB_PARAMS, VllmStockConfig
from ppas.workload import TraceTransform


@dataclass(frozen=True)
class TunedTrace:
    """The trace as ``ppas tune`` replayed it."""

    file: str
    format: str | None
    block_size: int | None
    transform: TraceTransform
    loads: tuple[float, ...]


def _q(v: object) -> str:
    """A TOML value (strings as JSON strings: the same escapes)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_q(x) for x in v) + "]"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _model_based(p: Policy) -> bool:
    """Whether the policy predicts with a cost model (it derives tables from one)."""
    return type(p).bind_cost_model is not Policy.bind_cost_model


def tuned_experiment(name: str, model_path: str, trace: TunedTrace, stock: str,
                     policies: Sequence[str], *, cost_model: str, hardware: str | None,
                     catalog_model: str | None, max_model_len: int | None,
                     max_num_seqs: int) -> str:
    """The experiment file's text (``ppas.experiment.spec``'s format): the ``vllm:`` setting
    ``stock`` as a stock arm (the baseline) and each policy as a plugin arm. Model-based
    policies get ``cost_model`` when it is ``fitted:FILE``, else ``fitted:auto`` (then a
    plugin arm with the stock setting's MBT calibrates when no other arm does)."""
    cfg = make_policy(stock).config
    assert isinstance(cfg, VllmStockConfig)
    fitted = cost_model.startswith("fitted:")
    tf = trace.transform
    lines = [f"# Written by ppas tune: the tuned stock setting against {', '.join(policies)}.",
             f"name = {_q(name)}",
             f"description = {_q(f'tuned stock {short_name(stock)} vs ' + ', '.join(policies))}",
             "", "[model]", f"path = {_q(model_path)}",
             "", "[engine]", f"max_num_seqs = {max_num_seqs}"]
    if max_model_len is not None:
        lines.append(f"max_model_len = {max_model_len}")
    lines += ["", "[workload]", 'kind = "trace"', f"file = {_q(trace.file)}"]
    if trace.format:
        lines.append(f"format = {_q(trace.format)}")
    if trace.block_size:
        lines.append(f"block_size = {trace.block_size}")
    if tf.window is not None:
        lines.append(f"window = {_q(f'{tf.window[0]:g}:{tf.window[1]:g}')}")
    for key in ("time_scale", "rate", "length_scale", "drop_longer_than"):
        if getattr(tf, key) is not None:
            lines.append(f"{key} = {_q(getattr(tf, key))}")
    lines += [f"loads = {_q([float(x) for x in trace.loads])}", "seeds = [0]", "", "[run]"]
    if fitted:
        lines.append(f"estimate_cost_model = {_q(cost_model)}")
    else:
        lines += ['estimate_cost_model = "roofline"', f"hardware = {_q(hardware)}",
                  f"catalog_model = {_q(catalog_model)}"]
    lines += ["", "[[arms]]", f"name = {_q('stock-tuned')}", "baseline = true", "[arms.stock]"]
    for knob, param in KNOB_PARAMS.items():
        v = getattr(cfg, param)
        if v is None or (knob is not Knob.MAX_NUM_BATCHED_TOKENS
                         and v == getattr(VllmStockConfig(), param)):
            continue
        lines.append(f"{knob.value} = {_q(v)}")
    arms: list[tuple[str, str, str | None]] = []
    for p in policies:
        pol = make_policy(p)
        need = _model_based(pol)
        arms.append((p, p, cost_model if fitted and need else "fitted:auto" if need else None))
    if not fitted and all(c is not None for _, _, c in arms):
        arms.insert(0, (f"mbt:{cfg.mbt}", f"mbt:{cfg.mbt}", None))
    for arm_name, policy, cm in arms:
        lines += ["", "[[arms]]", f"name = {_q(arm_name)}", f"policy = {_q(policy)}"]
        if cm is not None:
            lines.append(f"cost_model = {_q(cm)}")
            lines.append(f"max_num_batched_tokens = {make_policy(policy).max_num_batched_tokens}")
    return "\n".join(lines) + "\n"
