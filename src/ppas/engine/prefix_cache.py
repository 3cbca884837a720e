"""vLLM V1 automatic prefix caching: a paged block pool whose full blocks are content-hashed.

The semantics follow vLLM 0.32's ``v1/core`` (``kv_cache_utils``, ``block_pool``,
``kv_cache_manager``, ``single_type_kv_cache_manager`` for full attention):

* Content identity. A request's tokens are cut into blocks of ``block_size`` (16) tokens;
  each *full* block gets a hash chained on its parent's, ``h_i = H(h_{i-1}, tokens of block
  i)``, so equal hashes mean equal whole prefixes. Partial blocks are never cached.
  Token contents are described by *segments* ``(stream id, length)``: the tokens of a
  segment are the first ``length`` tokens of its stream, so two requests share exactly the
  blocks their segment lists agree on (``chained_block_hashes``).
* Hit. A waiting (new or preempted) request looks up the longest prefix of its block
  hashes that is in the cache (``lookup``). The hit is capped at ``num_tokens - 1`` tokens
  (vLLM must compute at least the last token to get logits), floored to whole blocks, so a
  fully cached prompt still recomputes its last block.
* Pool. Blocks with reference count 0 are free. The free queue is vLLM's: freed blocks
  without a hash go to the front (reused first, LIFO), freed hashed blocks go to the back
  in the order given (a request frees its blocks tail first, so its tail is evicted
  first); allocation pops from the front, evicting a popped block's hash. Blocks never
  used sit between the two, so the cache evicts least recently freed blocks first (LRU),
  and only once no never-hashed block is left. A hit on a free cached block takes it off
  the queue ("touch"); so admitting a request needs ``new blocks + free hit blocks`` free
  blocks.
* Caching. When a request is allocated slots for ``n`` new tokens, its blocks that are
  full after those tokens (capped at its known tokens) are hashed into the cache at once,
  at schedule time, as vLLM does (``cache_blocks(request, num_tokens_to_cache)``). If
  another block already holds the same hash both stay; lookups return the first.

``PrefixCache`` knows nothing about scheduling; the simulator calls it where vLLM's
scheduler calls the KV cache manager. Invariant (tested): ``num_free + blocks held by
requests == num_blocks``; a block is in the free queue iff its reference count is 0.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from ppas.core.config import require


def chained_block_hashes(
    segments: Sequence[tuple[Hashable, int]], block_size: int
) -> list[int]:
    """Chained hashes of the full blocks of the token sequence ``segments`` describes.

    A segment ``(stream, n)`` stands for tokens ``(stream, 0) .. (stream, n - 1)``; block
    ``i``'s hash is ``hash((hash of block i - 1, block i's token ranges))``, so two
    sequences get equal hashes for block ``i`` iff their first ``(i + 1) * block_size``
    tokens are equal (up to hash collisions of Python's 64-bit tuple hash)."""
    out: list[int] = []
    parent = 0
    parts: list[tuple[Hashable, int, int]] = []
    fill = 0
    for stream, n in segments:
        off = 0
        while off < n:
            take = min(block_size - fill, n - off)
            parts.append((stream, off, off + take))
            fill += take
            off += take
            if fill == block_size:
                parent = hash((parent, tuple(parts)))
                out.append(parent)
                parts.clear()
                fill = 0
    return out


@dataclass(slots=True)
class CachedBlocks:
    """A request's blocks in the pool: ``block_ids`` in token order, the first
    ``num_cached`` of them hashed into the cache."""

    block_ids: list[int] = field(default_factory=list)
    num_cached: int = 0


class PrefixCache:
    """vLLM V1's block pool with automatic prefix caching (see the module docstring).

    ``num_blocks`` None = unbounded (nothing is ever evicted)."""

    def __init__(self, num_blocks: int | None, block_size: int = 16) -> None:
        require(num_blocks is None or num_blocks >= 1, "num_blocks must be >= 1")
        require(block_size >= 1, "block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._next_id = 0  # blocks never used: ids _next_id .. num_blocks - 1
        self._front: list[int] = []  # freed unhashed blocks, reused first (LIFO)
        self._back: OrderedDict[int, None] = OrderedDict()  # freed hashed blocks, LRU first
        self._ref: dict[int, int] = {}
        self._hash: dict[int, int] = {}  # block id -> its hash, for hashed blocks
        self._cached: dict[int, dict[int, None]] = {}  # hash -> block ids holding it
        # hit_blocks' watchers: hash -> (memo cell, position) of every walk that passed it;
        # evicting the hash's last holder cuts each such memo back to that position.
        self._watch: dict[int, list[tuple[list[int], int]]] = {}
        self.num_queries = 0  # tokens looked up (the prompt part), for hit rates
        self.num_hits = 0  # tokens served from the cache

    # -- queries ---------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks with reference count 0 (never used, freed, or cached and unreferenced)."""
        fresh = (1 << 62) if self.num_blocks is None else self.num_blocks - self._next_id
        return fresh + len(self._front) + len(self._back)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._hash)

    def lookup(self, hashes: Sequence[int], num_tokens: int) -> list[int]:
        """Block ids of the longest cached prefix of ``hashes``, at most
        ``(num_tokens - 1) // block_size`` blocks (the last token is always computed)."""
        limit = min(len(hashes), max(0, num_tokens - 1) // self.block_size)
        out: list[int] = []
        cached = self._cached
        for i in range(limit):
            ids = cached.get(hashes[i])
            if not ids:
                break
            out.append(next(iter(ids)))
        return out

    def hit_blocks(self, hashes: Sequence[int], num_tokens: int, memo: list[int]) -> int:
        """``len(self.lookup(hashes, num_tokens))``, kept in ``memo`` (a one-element list
        owned by the caller, ``[0]`` to start; one per ``hashes``) between calls.

        Invariant: ``hashes[:memo[0]]`` are all cached. It holds because every hash the walk
        passes is watched, and evicting a hash's last holder cuts each watching memo back
        to that hash's position (``_pop_free``); a hash added since is found by resuming
        the walk at ``memo[0]``. So a query costs one dict lookup plus the blocks the hit
        grew by, not a walk of the whole hit (a waiting request is asked every step)."""
        limit = min(len(hashes), max(0, num_tokens - 1) // self.block_size)
        h = memo[0]
        if h < limit:
            cached = self._cached
            watch = self._watch
            while h < limit:
                x = hashes[h]
                if x not in cached:
                    break
                w = watch.get(x)
                if w is None:
                    watch[x] = [(memo, h)]
                else:
                    w.append((memo, h))
                h += 1
            memo[0] = h
            return h
        return limit

    def blocks_needed(self, req: CachedBlocks, num_computed: int, hit: Sequence[int],
                      num_new_tokens: int) -> int:
        """Free blocks that allocating ``num_new_tokens`` after ``num_computed`` computed
        tokens and the ``hit`` blocks takes: new blocks plus hit blocks now free."""
        total = num_computed + len(hit) * self.block_size + num_new_tokens
        new = -(-total // self.block_size) - len(req.block_ids) - len(hit)
        evictable = sum(1 for b in hit if self._ref[b] == 0)
        return max(new, 0) + evictable

    # -- updates ---------------------------------------------------------------
    def allocate(self, req: CachedBlocks, hashes: Sequence[int], num_computed: int,
                 hit: Sequence[int], num_new_tokens: int, num_tokens: int) -> bool:
        """vLLM's ``allocate_slots``: take the ``hit`` blocks, allocate blocks for
        ``num_new_tokens`` more tokens and cache the blocks full after them (at most
        ``num_tokens`` known tokens). False (and nothing changed) when the pool is short."""
        assert not hit or not req.block_ids, "prefix hits only for a request holding no blocks"
        if self.blocks_needed(req, num_computed, hit, num_new_tokens) > self.num_free:
            return False
        for b in hit:  # touch
            if self._ref[b] == 0:
                del self._back[b]
            self._ref[b] += 1
        req.block_ids.extend(hit)
        req.num_cached += len(hit)
        total = num_computed + len(hit) * self.block_size + num_new_tokens
        for _ in range(-(-total // self.block_size) - len(req.block_ids)):
            req.block_ids.append(self._pop_free())
        full = min(min(total, num_tokens) // self.block_size, len(hashes))
        for i in range(req.num_cached, full):
            b = req.block_ids[i]
            h = hashes[i]
            self._hash[b] = h
            self._cached.setdefault(h, {})[b] = None
        req.num_cached = max(req.num_cached, full)
        return True

    def grow_decode(self, req: CachedBlocks, hashes: Sequence[int], num_computed: int) -> bool:
        """``allocate(req, hashes, num_computed, (), 1, num_computed + 1)``: one token
        after ``num_computed`` (a decode: no hit, the token the last known one), without
        the general path's second check. False (and nothing changed) when its block does
        not fit."""
        bs = self.block_size
        new = -(-(num_computed + 1) // bs) - len(req.block_ids)
        if new > 0:
            if new > self.num_free:
                return False
            for _ in range(new):
                req.block_ids.append(self._pop_free())
        full = (num_computed + 1) // bs
        if full > len(hashes):
            full = len(hashes)
        for i in range(req.num_cached, full):
            b = req.block_ids[i]
            h = hashes[i]
            self._hash[b] = h
            self._cached.setdefault(h, {})[b] = None
        if full > req.num_cached:
            req.num_cached = full
        return True

    def free(self, req: CachedBlocks) -> None:
        """Release a request's blocks, tail first (vLLM's ``free``)."""
        for b in reversed(req.block_ids):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                if b in self._hash:
                    self._back[b] = None
                else:
                    self._front.append(b)
        req.block_ids.clear()
        req.num_cached = 0

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        self.num_queries += num_tokens
        self.num_hits += num_hit_tokens

    def _pop_free(self) -> int:
        if self._front:
            b = self._front.pop()
        elif self.num_blocks is None or self._next_id < self.num_blocks:
            b = self._next_id
            self._next_id += 1
        else:
            b, _ = self._back.popitem(last=False)  # evict the least recently freed
            h = self._hash.pop(b)
            ids = self._cached[h]
            del ids[b]
            if not ids:
                del self._cached[h]
                for memo, pos in self._watch.pop(h, ()):
                    if memo[0] > pos:
                        memo[0] = pos
        self._ref[b] = 1
        return b

    def check(self) -> None:
        """Internal consistency (tests): refcounts, queue membership, block count."""
        held = sum(1 for r in self._ref.values() if r > 0)
        in_queue = set(self._front) | set(self._back)
        assert len(in_queue) == len(self._front) + len(self._back)
        for b, r in self._ref.items():
            assert r >= 0
            assert (r == 0) == (b in in_queue), (b, r)
        assert all(b in self._hash for b in self._back)
        assert all(b not in self._hash for b in self._front)
        if self.num_blocks is not None:
            assert held + self.num_free == self.num_blocks
        for h, ids in self._cached.items():
            assert ids and all(self._hash[b] == h for b in ids)


__all__ = ["CachedBlocks", "PrefixCache", "chained_block_hashes"]
