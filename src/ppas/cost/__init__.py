"""Cost models behind one interface, ``CostModel.step_time(StepShape) -> seconds``.

``make_cost_model(spec, hardware, model)`` builds one from a spec ``NAME[:ARG]`` through
the ``COST_MODELS`` registry: ``roofline`` (catalog hardware x model, the calibrated
physical parameters) or ``fitted:FILE`` (fitted from vLLM step logs). A new kind is one
``@COST_MODELS.register(NAME)`` factory ``(arg, hardware, model, tp, mbt) -> CostModel``.
"""

from __future__ import annotations

from collections.abc import Callable

from ppas.core.errors import PpasError
from ppas.core.registry import Registry
from ppas.cost.base import CostModel, StepShape, causal_pairs, largest_chunk_within

#: Factory signature: (ARG after the colon or "", hardware, model, tp, max_num_batched_tokens).
CostModelFactory = Callable[[str, str | None, str | None, int, int], CostModel]
COST_MODELS: Registry[CostModelFactory] = Registry("cost model")


@COST_MODELS.register("roofline")
def _roofline(arg: str, hardware: str | None, model: str | None, tp: int,
              mbt: int) -> CostModel:
    from ppas.cost.roofline import RooflineCostModel

    if arg:
        raise PpasError(f"the roofline cost model takes no argument, got 'roofline:{arg}'")
    if not hardware or not model:
        raise PpasError("the roofline cost model needs --hardware and --model")
    return RooflineCostModel(hardware, model, tp=tp, max_num_batched_tokens=mbt)


@COST_MODELS.register("fitted")
def _fitted(arg: str, hardware: str | None, model: str | None, tp: int, mbt: int) -> CostModel:
    from ppas.cost.fitted import FittedCostModel

    if not arg:
        raise PpasError("the fitted cost model needs a file: fitted:FILE")
    return FittedCostModel.from_file(arg)


def cost_model_specs() -> list[str]:
    """The accepted spec forms, for help texts and errors."""
    return [n + (":FILE" if n == "fitted" else "") for n in COST_MODELS.names()]


def make_cost_model(
    spec: str | None,
    hardware: str | None = None,
    model: str | None = None,
    tp: int = 1,
    max_num_batched_tokens: int = 16384,
) -> CostModel:
    name, _, arg = (spec or "roofline").strip().partition(":")
    if name not in COST_MODELS:
        raise PpasError(f"unknown cost model {spec!r}; allowed: {', '.join(cost_model_specs())}")
    return COST_MODELS.get(name)(arg, hardware, model, tp, max_num_batched_tokens)


__all__ = ["COST_MODELS", "CostModel", "StepShape", "causal_pairs", "cost_model_specs",
           "largest_chunk_within", "make_cost_model"]
