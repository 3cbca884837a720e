"""A request's latency with an idle engine to itself, on a cost model: the bound
``mean_lower_bound`` reports, and the reference of relative SLOs (``ttft=5x``,
``ppas.core.slo``).

TTFT alone is the best chunking of the prompt (its chunks of 512..16384 tokens or the whole
prompt in one step, whichever the cost model prices fastest; the first token is sampled at
the end of the last chunk); then one decode step per remaining output token, with the
context growing by one a step. TPOT alone = those decode steps / max(output - 1, 1) (the
one definition, ``tpot_of``); E2E alone = TTFT + the decode steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ppas.core.metrics import tpot_of
from ppas.core.slo import SoloLatency
from ppas.cost import CostModel
from ppas.workload import RequestSpec

#: Prefill chunkings tried for the solo TTFT (besides the whole prompt in one step).
CHUNKS = (512, 1024, 2048, 4096, 8192, 16384)


def solo_latency(prompt_tokens: int, output_tokens: int, cost_model: CostModel,
                 chunks: Sequence[int] = CHUNKS) -> SoloLatency:
    """TTFT, TPOT and E2E of one request alone on an idle engine (module doc)."""
    ttft = math.inf
    for c in (*chunks, prompt_tokens):
        t = cost_model.prefill_time(prompt_tokens, c)
        if t < ttft:
            ttft = t
    e2e = ttft  # added up step by step, in order: the bound's figure since it was written
    for dt in cost_model.decode_steps(1, prompt_tokens, output_tokens - 1, 0.0, math.inf):
        e2e += dt
    return SoloLatency(ttft, tpot_of(ttft, e2e, output_tokens), e2e)


def lower_bound_latency(spec: RequestSpec, cost_model: CostModel,
                        chunks: Sequence[int] = CHUNKS) -> float:
    """E2E of one request with the machine to itself (``solo_latency``'s E2E)."""
    return solo_latency(spec.prompt_tokens, spec.output_tokens, cost_model, chunks).e2e


class SoloTable:
    """``solo_latency`` on one cost model, computed once per (prompt, output) shape."""

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        self._cache: dict[tuple[int, int], SoloLatency] = {}

    def __call__(self, prompt_tokens: int, output_tokens: int) -> SoloLatency:
        key = (prompt_tokens, output_tokens)
        s = self._cache.get(key)
        if s is None:
            s = self._cache[key] = solo_latency(prompt_tokens, output_tokens, self.cost_model)
        return s


__all__ = ["CHUNKS", "SoloTable", "lower_bound_latency", "solo_latency"]
