"""Cost models behind one interface, ``CostModel.step_time(StepShape) -> seconds``.

``make_cost_model(spec, hardware, model)``: ``roofline`` (catalog hardware x model, the
calibrated physical parameters) or ``fitted:FILE`` (fitted from vLLM step logs).
"""

from __future__ import annotations

from ppas.cost.base import CostModel, StepShape, largest_chunk_within
from ppas.errors import PpasError

COST_MODELS = ("roofline", "fitted:FILE")


def make_cost_model(
    spec: str | None,
    hardware: str | None = None,
    model: str | None = None,
    tp: int = 1,
    max_num_batched_tokens: int = 16384,
) -> CostModel:
    spec = (spec or "roofline").strip()
    if spec == "roofline":
        from ppas.cost.roofline import RooflineCostModel

        if not hardware or not model:
            raise PpasError("the roofline cost model needs --hardware and --model")
        return RooflineCostModel(hardware, model, tp=tp,
                                 max_num_batched_tokens=max_num_batched_tokens)
    if spec.startswith("fitted:") and len(spec) > len("fitted:"):
        from ppas.cost.fitted import FittedCostModel

        return FittedCostModel.from_file(spec[len("fitted:"):])
    raise PpasError(f"unknown cost model {spec!r}; allowed: {', '.join(COST_MODELS)}")


__all__ = ["CostModel", "StepShape", "largest_chunk_within", "make_cost_model"]
