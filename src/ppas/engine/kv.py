"""The simulated engine's paged KV cache (``KvPool``): block counts alone, or vLLM's block
pool with automatic prefix caching. Invariant: blocks held <= capacity; a request's
``blocks`` is what it holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from ppas.engine.prefix_cache import CachedBlocks, PrefixCache, chained_block_hashes
from ppas.engine.request import SimRequest
from ppas.workload import RequestSpec


class KvPool:
    """The paged KV cache: block counts only (``cache`` None, prefix caching off: the
    fast path, identical to vLLM for prompts nobody shares), or vLLM's block pool with
    automatic prefix caching (``ppas.engine.prefix_cache``). A request's ``blocks`` is the
    number of blocks it holds either way."""

    __slots__ = ("cache", "bs", "num_free")

    def __init__(self, total_blocks: int | None, bs: int, caching: bool) -> None:
        self.bs = bs
        self.cache = PrefixCache(total_blocks, bs) if caching else None
        #: Free blocks when ``cache`` is None (block counts only; the simulator's hot loop
        #: reads and updates it directly, as ``needed``/``grow`` would).
        self.num_free = total_blocks if total_blocks is not None else 1 << 62

    @property
    def free(self) -> int:
        return self.num_free if self.cache is None else self.cache.num_free

    def register(self, r: SimRequest, spec: RequestSpec) -> None:
        """Content of the request's tokens: its shared prefix segments, then a unique
        rest of prompt, then its outputs (unique: nobody else samples them)."""
        if self.cache is None:
            return
        rest = r.prompt_tokens - spec.prefix_tokens
        segs: list[tuple[object, int]] = list(spec.prefix)
        if rest > 0:
            segs.append((("prompt", r.index), rest))
        segs.append((("output", r.index), r.output_len))
        r.block_hashes = chained_block_hashes(segs, self.bs)
        r.kv = CachedBlocks()
        r.cache = self.cache

    def lookup(self, r: SimRequest) -> list[int]:
        """The prefix-cache hit (block ids) of a request about to be admitted."""
        if self.cache is None:
            return []
        return self.cache.lookup(r.block_hashes, r.prompt_tokens + r.num_output_tokens)

    def needed(self, r: SimRequest, n: int, hit: Sequence[int] = ()) -> int:
        """Free blocks that ``n`` more tokens (after ``hit``) take."""
        if self.cache is None or r.kv is None:
            return -(-(r.num_computed_tokens + n) // self.bs) - r.blocks
        return self.cache.blocks_needed(r.kv, r.num_computed_tokens, hit, n)

    def grow(self, r: SimRequest, n: int, hit: Sequence[int] = ()) -> None:
        """Allocate for ``hit`` and ``n`` new tokens (the caller checked ``needed``); a
        hit moves ``num_computed_tokens`` past the cached blocks."""
        if self.cache is None or r.kv is None:
            extra = -(-(r.num_computed_tokens + n) // self.bs) - r.blocks
            r.blocks += extra
            self.num_free -= extra
            return
        admitted = not r.kv.block_ids  # (a running request holds a block at least)
        ok = self.cache.allocate(r.kv, r.block_hashes, r.num_computed_tokens, hit, n,
                                 r.prompt_tokens + r.num_output_tokens)
        assert ok, "allocate after a successful needed() check"
        r.blocks = len(r.kv.block_ids)
        if hit:
            r.num_computed_tokens += len(hit) * self.bs
            if r.first_scheduled_time is None:
                r.num_hit_tokens = len(hit) * self.bs
        if admitted:  # its memo is done: no longer watched (PrefixCache.hit_blocks)
            r.hit_memo[0] = -1
            r.hit_memo = PrefixCache.new_memo(r)

    def take(self, blocks: int) -> None:
        """Decode runs (no prefix caching): ``blocks`` more held (fewer when rewound)."""
        assert self.cache is None
        self.num_free -= blocks

    def release(self, r: SimRequest) -> None:
        if self.cache is None or r.kv is None:
            self.num_free += r.blocks
        else:
            self.cache.free(r.kv)
        r.blocks = 0
