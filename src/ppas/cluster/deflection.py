"""Prefill deflection: send a prompt to a decode node when its TTFT is predicted lower
there than through the prefill pool (arXiv 2607.02043 [R abstract; detail I]).

For each decode node, the chunk is the largest ladder entry that keeps the node's resident
decodes within the TBT SLO (``ppas.policies.deflection.ladder_chunk``, the rule the node's
``tbt-ladder`` policy applies each step). The deflected prompt, behind the prompts already
deflected there, then takes ``ceil((backlog + P) / c)`` such steps (our reading [I]: each
step priced at the prompt's mid-point context). It is deflected to the node with the
lowest such TTFT if that beats the pool's prediction, ``queue + execution`` (+ the KV
transfer and the decode node's first step, which the pool path also pays), and the node's
free KV holds the whole request. ``off`` never deflects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ppas.core.config import check_times
from ppas.core.registry import Configured, NoConfig, Registry
from ppas.cost.base import CostModel, StepShape
from ppas.policies.deflection import LADDER, ladder_chunk, parse_ladder


class DecodeNodeView(Protocol):
    """What the deflection rule reads about one decode node."""

    cost_model: CostModel

    @property
    def kv_free_tokens(self) -> int: ...

    def load(self) -> tuple[int, int, int]:
        """(prompt tokens not yet computed, running decodes, their context tokens)."""
        ...


DEFLECTIONS: Registry[Any] = Registry("deflection rule")


@dataclass(frozen=True)
class LadderConfig:
    tbt_slo: float = 0.05
    chunks: str = "/".join(map(str, LADDER))

    def __post_init__(self) -> None:
        check_times(self, "tbt_slo")
        parse_ladder(self.chunks)


@DEFLECTIONS.register_class("ladder")
class Deflection(Configured):
    Config = LadderConfig

    def __init__(self, config: LadderConfig, spec: str | None = None) -> None:
        super().__init__(config, spec)
        self.ladder = parse_ladder(config.chunks)

    def predicted_ttft(self, node: DecodeNodeView, prompt_tokens: int) -> float:
        """Predicted TTFT of a prompt deflected to ``node`` now; inf if no chunk fits."""
        backlog, n_dec, ctx = node.load()
        c = ladder_chunk(node.cost_model, self.config.tbt_slo, n_dec, ctx, 0, self.ladder)
        if c == 0:
            return float("inf")
        steps = -(-(backlog + prompt_tokens) // c)
        mid = prompt_tokens // 2
        n = min(c, prompt_tokens)
        t = node.cost_model.step_time(StepShape.one_chunk(n, mid, n_dec, ctx))
        return steps * t

    def choose(self, prompt_tokens: int, output_tokens: int,
               nodes: Sequence[DecodeNodeView], pool_ttft: float) -> int | None:
        """Position of the decode node to deflect to, or None (use the prefill pool)."""
        best, best_t = None, pool_ttft
        need = prompt_tokens + output_tokens
        for i, node in enumerate(nodes):
            if node.kv_free_tokens < need:
                continue
            t = self.predicted_ttft(node, prompt_tokens)
            if t < best_t:
                best, best_t = i, t
        return best


@DEFLECTIONS.register_class("off")
class Off(Configured):
    """Never deflects: ``make_deflection`` returns None for it."""

    Config = NoConfig


def make_deflection(spec: str) -> Deflection | None:
    """``off`` -> None; ``ladder[:tbt_slo=S,chunks=2048/1024/...]`` -> the rule."""
    rule = DEFLECTIONS.make(spec)
    return rule if isinstance(rule, Deflection) else None
