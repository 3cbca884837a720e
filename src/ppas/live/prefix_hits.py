"""Waiting requests' prefix-cache hits in vLLM's cache, kept between steps.

A policy that orders or admits by a waiting prompt's hit (``ordered``, ``sorted-f``,
``feather``, ``lprs-apc``) reads it for the whole queue every step. vLLM's own lookup
(``find_longest_cache_hit``) walks the hit block by block, about 0.73 us a block
(``benchmarks/plugin_cache_reads.py``): 100 waiting requests with 8k-token hits would cost
37 ms a step. ``PrefixHits`` keeps each hit from step to step, as the simulator does
(``ppas.engine.prefix_cache.PrefixCache.hit_blocks``): a dict lookup per request and
step, and one probe more where the block after its end was cached since (a newly arrived
request: a walk of its hit, as vLLM makes when it admits it).

Exact where vLLM's lookup is the plain longest run: one full-attention KV cache group,
hashes at the block size, no EAGLE drop, no context parallelism (``plain``). There the
hit is the longest run of the request's block hashes, from its first and within
``(num_tokens - 1) // block_size``, that the cache maps; the blocks are what
``get_cached_block`` returns for each, the first block of its key.

Invariant (plain): a kept hit's blocks are, key for key, what ``get_cached_block`` returns
now, and the run ends where the cache first misses. It holds because
* vLLM removes an entry of its hash -> block map only through the map's ``pop`` (eviction
  of a reused block, a block whose hashes move), which is hooked: a kept hit that holds
  the popped block is dropped and looked up again when next read. Popping another block of
  the same key leaves the first block first (the map's dict keeps insertion order);
* ``reset_prefix_cache`` replaces the map: every kept hit is dropped, the new map hooked;
* an insertion appends a block to its key (never before the first) or caches a key not
  mapped before, which can only lengthen a run at its end, and only by caching the key
  at its end, where its probe missed: the map's ``insert`` is hooked too, each kept hit's
  miss is noted under that key (``make_block_hash_with_group_id`` of its hash and group
  0, as ``get_cached_block`` makes it), and inserting that key marks the hit for one more
  probe at its end;
* a kept hit is for one ``Request`` object and one token count; a request that leaves
  the queue (computes tokens, finishes) is forgotten at the next step.
Elsewhere (hybrid models, EAGLE, DCP/PCP, finer hashes) the lookup is vLLM's own, read
again once the map has changed since (a pop or an insertion: the lookup reads only the
map). ``tests/test_vllm_prefix.py`` checks every read against vLLM's lookup.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.v1.core.kv_cache_coordinator import UnitaryKVCacheCoordinator
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
from vllm.v1.request import Request


class _Hit:
    """One waiting request's kept hit: its blocks, for this request object and bound."""

    __slots__ = ("request", "limit", "blocks", "tokens", "inserts", "pops", "end", "miss",
                 "stale")

    def __init__(self, request: Request, limit: int, blocks: list[Any], tokens: int,
                 pops: int = -1) -> None:
        self.request = request
        self.limit = limit  # plain: (num_tokens - 1) // block_size; else num_tokens
        self.blocks = blocks
        self.tokens = tokens
        self.inserts = -1  # not plain: the map's insertions counted at its lookup
        self.pops = pops  # not plain: the map's removals counted at its lookup
        self.end = -1  # plain: the run's bound at its last probe (-1: never probed)
        self.miss: Any = None  # plain: the key its last probe missed, noted (None: none)
        self.stale = True  # plain: that key was inserted since (the end probed again)


class PrefixHits:
    """vLLM's ``find_longest_cache_hit`` of each waiting request, kept between steps
    (module doc: where it is exact, and why). ``begin_step`` once a step, before reads."""

    __slots__ = ("_m", "_coord", "_pool", "_map", "plain", "_bs", "_hits", "_by_block",
                 "_inserts", "_pops", "_misses")

    def __init__(self, manager: Any) -> None:
        self._m = manager  # vLLM's KVCacheManager
        coord = self._coord = manager.coordinator
        self._pool = coord.block_pool
        groups = coord.single_type_managers
        g = groups[0] if len(groups) == 1 else None
        #: The lookup is the plain longest run (module doc), so hits are kept.
        self.plain = (type(coord) is UnitaryKVCacheCoordinator
                      and type(g) is FullAttentionManager
                      and not getattr(g, "use_eagle", True)
                      and getattr(coord, "dcp_world_size", 1) == 1
                      and getattr(coord, "pcp_world_size", 1) == 1
                      and getattr(self._pool, "hash_block_size", None) == g.block_size)
        self._bs = int(g.block_size) if g is not None else 0
        self._hits: dict[str, _Hit] = {}
        self._by_block: dict[int, set[str]] = {}  # block id -> kept hits that hold it
        self._misses: dict[Any, set[str]] = {}  # key -> kept hits whose end missed it
        self._map: Any = None
        self._inserts = 0  # insertions into the watched map
        self._pops = 0  # removals from it
        self._watch()

    def __len__(self) -> int:
        return len(self._hits)

    def _watch(self) -> None:
        """Forget every kept hit and hook the pool's current hash -> block map."""
        self._hits.clear()
        self._by_block.clear()
        self._misses.clear()
        m = self._map = self._pool.cached_block_hash_to_block
        pop = type(m).pop.__get__(m)  # the class's own, even if m.pop was hooked before
        insert = type(m).insert.__get__(m)

        def hooked_pop(key: Any, block_id: int) -> Any:
            self._pops += 1
            if self._by_block and block_id in self._by_block:  # (plain only)
                for rid in self._by_block.pop(block_id):
                    self._drop(rid)
            return pop(key, block_id)

        def hooked_insert(key: Any, block: Any) -> None:
            self._inserts += 1
            if self._misses:  # (plain only)
                rids = self._misses.pop(key, None)
                if rids is not None:
                    hits = self._hits
                    for rid in rids:
                        h = hits.get(rid)
                        if h is not None and h.miss == key:
                            h.miss = None
                            h.stale = True
            insert(key, block)

        m.pop = hooked_pop
        m.insert = hooked_insert

    def _drop(self, rid: str) -> None:
        h = self._hits.pop(rid, None)
        if h is None:
            return
        if h.miss is not None:
            self._unmiss(rid, h.miss)
        by_block = self._by_block
        for b in h.blocks:
            holders = by_block.get(b.block_id)
            if holders is not None:
                holders.discard(rid)
                if not holders:
                    del by_block[b.block_id]

    def _unmiss(self, rid: str, key: Any) -> None:
        """``rid``'s kept hit no longer waits for ``key``."""
        rids = self._misses.get(key)
        if rids is not None:
            rids.discard(rid)
            if not rids:
                del self._misses[key]

    def begin_step(self) -> None:
        """A new step: forget requests that left the queue (computed tokens, finished)."""
        if self._pool.cached_block_hash_to_block is not self._map:
            self._watch()
            return
        gone = [rid for rid, h in self._hits.items()
                if h.request.num_computed_tokens or h.request.is_finished()]
        for rid in gone:
            self._drop(rid)

    def lookup(self, request: Request) -> tuple[Sequence[Any], int]:
        """vLLM's ``get_computed_blocks`` lookup for a waiting request, without its stats:
        (the first group's hit blocks, the hit's tokens)."""
        if not self._m.prefix_cache_lookup_enabled(request):
            return (), 0
        if self._pool.cached_block_hash_to_block is not self._map:
            self._watch()  # reset_prefix_cache since the step began
        rid = request.request_id
        h = self._hits.get(rid)
        if not self.plain:
            if (h is None or h.request is not request or h.limit != request.num_tokens
                    or h.inserts != self._inserts or h.pops != self._pops):
                blocks, n, *_ = self._coord.find_longest_cache_hit(request.block_hashes,
                                                                   request.num_tokens - 1)
                h = self._hits[rid] = _Hit(request, request.num_tokens,
                                           list(blocks[0]) if blocks else [], int(n),
                                           self._pops)
                h.inserts = self._inserts
            return h.blocks, h.tokens
        limit = (request.num_tokens - 1) // self._bs
        hashes = request.block_hashes
        end = min(limit, len(hashes))
        if h is None or h.request is not request or h.limit != limit:
            self._drop(rid)
            h = self._hits[rid] = _Hit(request, limit, [], 0)
        elif not h.stale and h.end == end:
            return h.blocks, h.tokens  # its miss not cached since its probe, nothing popped
        h.stale = False
        h.end = end
        blocks = h.blocks
        if len(blocks) < end:  # the run ends at the first miss: probe from there
            get = self._pool.get_cached_block
            by_block = self._by_block
            while len(blocks) < end:
                found = get(hashes[len(blocks)], [0])
                if not found:  # noted: inserting this key marks the hit stale
                    key = make_block_hash_with_group_id(hashes[len(blocks)], 0)
                    if h.miss != key:
                        if h.miss is not None:
                            self._unmiss(rid, h.miss)
                        h.miss = key
                        rids = self._misses.get(key)
                        if rids is None:
                            self._misses[key] = {rid}
                        else:
                            rids.add(rid)
                    break
                b = found[0]
                blocks.append(b)
                holders = by_block.get(b.block_id)
                if holders is None:
                    by_block[b.block_id] = {rid}
                else:
                    holders.add(rid)
            h.tokens = len(blocks) * self._bs
        return blocks, h.tokens
