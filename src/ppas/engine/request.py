"""The simulator's request: one trace request's state inside an engine (``SimRequest``),
the same object policies read as a ``RequestView``, and why an engine refuses one outright.
"""

from __future__ import annotations

from typing import Any

from ppas.core.errors import PpasError
from ppas.engine.prefix_cache import CachedBlocks, PrefixCache
from ppas.workload import RequestSpec


class SimRequest:
    """Mutable engine-side request; also the ``RequestView`` policies read. Carries vLLM's
    attribute names too (``num_prompt_tokens``, ``num_tokens``) for ``ppas.engine.step_rules``.

    ``max_output_tokens`` is the client's cap (vLLM's ``Request.max_tokens``: what a policy
    reads); ``output_len`` is where the request stops, ``min(its length, the cap)``: the
    engine's alone (in vLLM an EOS, which no scheduler sees coming). Without a cap in the
    trace (``RequestSpec.max_tokens`` None) both are the length."""

    __slots__ = ("request_id", "index", "arrival_time", "prompt_tokens", "num_prompt_tokens",
                 "max_output_tokens", "output_len", "num_computed_tokens", "num_output_tokens",
                 "is_running", "first_token_time", "last_token_time", "finish_time", "blocks",
                 "num_preemptions", "ttft_slo", "tpot_slo", "slo_class", "failed",
                 "block_hashes", "kv", "cache", "first_scheduled_time", "num_hit_tokens",
                 "priority", "hit_memo")

    def __init__(self, index: int, spec: RequestSpec, max_model_len: int | None = None) -> None:
        self.request_id = str(index)
        self.index = index
        self.arrival_time = spec.arrival_s
        self.prompt_tokens = self.num_prompt_tokens = spec.prompt_tokens
        cap = spec.max_tokens
        if cap == 0:  # the client sent none: vLLM's default, the context left
            if max_model_len is None:
                raise PpasError("max_tokens 'default' is vLLM's max_model_len less the "
                                "prompt: give the engine a max_model_len (--max-model-len)")
            cap = max(1, max_model_len - spec.prompt_tokens)
        self.max_output_tokens = spec.output_tokens if cap is None else cap
        self.output_len = spec.output_tokens if cap is None else min(spec.output_tokens, cap)
        self.ttft_slo = spec.ttft_slo
        self.tpot_slo = spec.tpot_slo
        self.slo_class = spec.slo_class
        self.priority = spec.priority  # vLLM's, read under --scheduling-policy priority
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.is_running = False
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.finish_time: float | None = None
        self.blocks = 0
        self.num_preemptions = 0
        self.failed: str | None = None
        # Prefix caching (EngineConfig.prefix_caching): the chained hashes of the full
        # blocks of prompt + outputs, this request's blocks in the pool, the pool itself.
        self.block_hashes: list[int] = []
        self.kv: CachedBlocks | None = None
        self.cache: PrefixCache | None = None
        # PrefixCache.hit_blocks' memo of this request's hit: (blocks, the walk's stop
        # noted, this request: reported in PrefixCache.changed as its hit changes)
        self.hit_memo: list[Any] = PrefixCache.new_memo(self)
        self.first_scheduled_time: float | None = None
        self.num_hit_tokens = 0  # prompt tokens taken from the cache, all admissions

    @property
    def num_cached_tokens(self) -> int:
        """RequestView: the prefix-cache hit this request would get if admitted now."""
        if self.cache is None or self.is_running:
            return 0
        n = self.prompt_tokens + self.num_output_tokens
        return self.cache.hit_blocks(self.block_hashes, n, self.hit_memo) * self.cache.block_size

    @property
    def num_shared_tokens(self) -> int:
        """RequestView: running, the tokens of its blocks that another request holds too;
        waiting, those of its hit that two running requests hold; 0 without caching."""
        cache = self.cache
        if self.kv is None or cache is None:
            return 0
        if self.is_running:
            return cache.shared_blocks(self.kv) * cache.block_size
        hit = cache.hit_blocks(self.block_hashes, self.prompt_tokens + self.num_output_tokens,
                               self.hit_memo)
        return cache.shared_hit(self.block_hashes, hit) * cache.block_size

    @property
    def num_tokens(self) -> int:
        """Prompt plus the output tokens sampled so far (vLLM's ``Request.num_tokens``)."""
        return self.prompt_tokens + self.num_output_tokens


def rejection(r: SimRequest, total_blocks: int | None, block_size: int,
              max_model_len: int | None) -> str | None:
    """Why vLLM would refuse ``r`` outright, or None. vLLM answers HTTP 400 when prompt +
    max_tokens exceed max_model_len; a request whose prompt + outputs can never fit in the
    whole KV cache could never run (vLLM refuses to start with such a max_model_len)."""
    n = r.prompt_tokens + r.max_output_tokens
    if max_model_len is not None and n > max_model_len:
        return f"longer than max_model_len ({max_model_len} tokens)"
    if total_blocks is not None and -(-n // block_size) > total_blocks:
        return f"never fits in the KV cache ({total_blocks * block_size} tokens)"
    return None
