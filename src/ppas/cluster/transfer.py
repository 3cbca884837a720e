"""KV-cache transfer between a prefill and a decode instance.

Bytes per token come from the model catalog (``ModelArch.kv_bytes_per_token``:
2 (K and V) x layers x kv_heads x head_dim x dtype bytes; Qwen2.5-3B: 36,864 B). With
tensor parallelism every GPU of the pair sends its share over its own link, so the
transfer of one request takes ``latency + tokens x bytes_per_token / (tp x bandwidth)``.
Transfers into one decode instance queue FIFO on its link (``Link``).
"""

from __future__ import annotations

from ppas.cluster.config import LinkConfig
from ppas.cost.base import CostModel
from ppas.cost.catalog import MODELS


def kv_bytes_per_token(cost_model: CostModel, model: str | None) -> int:
    """KV bytes per token of the served model: the roofline model's architecture, else the
    catalog entry named ``model``; 0 when unknown (a fitted cost model without a model
    name: transfers then cost only the link latency)."""
    arch = getattr(cost_model, "model", None)
    if arch is not None and hasattr(arch, "kv_bytes_per_token"):
        return int(arch.kv_bytes_per_token)
    if model and model in MODELS:
        return MODELS.get(model).kv_bytes_per_token
    return 0


class Link:
    """One decode instance's inbound link. Invariant: a transfer starts no earlier than
    ``ready`` (its prefill's end) and no earlier than the previous transfer's end."""

    __slots__ = ("busy_until", "seconds_per_token", "latency_s")

    def __init__(self, config: LinkConfig, bytes_per_token: int, tp: int = 1) -> None:
        self.busy_until = 0.0
        self.seconds_per_token = bytes_per_token / (config.bandwidth_gbs * 1e9 * tp)
        self.latency_s = config.latency_s

    def duration(self, tokens: int) -> float:
        return self.latency_s + tokens * self.seconds_per_token

    def schedule(self, ready: float, tokens: int) -> tuple[float, float]:
        """Book a transfer of ``tokens`` tokens' KV whose data is ready at ``ready``:
        returns (start, end)."""
        start = ready if ready > self.busy_until else self.busy_until
        end = start + self.duration(tokens)
        self.busy_until = end
        return start, end
