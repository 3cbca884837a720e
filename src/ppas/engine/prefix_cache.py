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
from typing import Any

from ppas.core.config import require


def chained_block_hashes(
    segments: Sequence[tuple[Hashable, int]], block_size: int
) -> list[int]:
    """Chained hashes of the full blocks of the token sequence ``segments`` describes.

    A segment ``(stream, n)`` stands for tokens ``(stream, 0) .. (stream, n - 1)``; block
    ``i``'s hash is ``hash((hash of block i - 1, block i's token ranges))``, a block of one
    range ``(stream, off, off + block_size)`` named by ``stream, off`` (a range of a
    segment never continues another's: every segment starts at its stream's token 0, so
    the ranges of equal blocks are equal), so two sequences get equal hashes for block
    ``i`` iff their first ``(i + 1) * block_size`` tokens are equal (up to hash collisions
    of Python's 64-bit tuple hash)."""
    out: list[int] = []
    parent = 0
    parts: list[tuple[Hashable, int, int]] = []  # the partly filled block's token ranges
    fill = 0
    for stream, n in segments:
        if n <= 0:
            continue
        off = 0
        if fill:  # the partly filled block first
            off = min(block_size - fill, n)
            parts.append((stream, 0, off))
            fill += off
            if fill < block_size:
                continue  # (the segment is used up)
            parent = hash((parent, tuple(parts)))
            out.append(parent)
            parts.clear()
            fill = 0
        while n - off >= block_size:  # whole blocks of this segment: one range each,
            parent = hash((parent, stream, off))  # (stream, off, off + block_size) named
            out.append(parent)  # by its start (a block of two or more ranges: above)
            off += block_size
        if off < n:
            parts.append((stream, off, n))
            fill = n - off
    return out


def _first_uncached(cached: dict[int, int], hashes: Sequence[int], lo: int, hi: int) -> int:
    """The first position in ``[lo, hi]`` whose hash is not ``cached``, by bisection, given
    ``hashes[:lo]`` cached and ``hashes[hi]`` not (or ``hi`` the bound): the cache is
    prefix-closed (``PrefixCache.hit_blocks``)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if hashes[mid] in cached:
            lo = mid + 1
        else:
            hi = mid
    return lo


@dataclass(slots=True, eq=False)
class CachedBlocks:
    """A request's blocks in the pool: ``block_ids`` in token order, the first
    ``num_cached`` of them hashed into the cache; ``num_shared`` of them held by another
    request too (reference count > 1; kept by the pool)."""

    block_ids: list[int] = field(default_factory=list)
    num_cached: int = 0
    num_shared: int = 0


class PrefixCache:
    """vLLM V1's block pool with automatic prefix caching (see the module docstring).

    ``num_blocks`` None = unbounded (nothing is ever evicted).

    Layout (for speed; the semantics are the module doc's): block ids are taken in order
    from the never-used range, so ``_ref`` and ``_hash`` are lists indexed by block id, as
    long as the ids taken so far (``_next_id``); a hash's holders are its first (the one a
    lookup returns, ``_cached``) and, rarely, later ones in the order they were cached
    (``_dups``), which is the order of one insertion-ordered set of holders."""

    def __init__(self, num_blocks: int | None, block_size: int = 16) -> None:
        require(num_blocks is None or num_blocks >= 1, "num_blocks must be >= 1")
        require(block_size >= 1, "block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._next_id = 0  # blocks never used: ids _next_id .. num_blocks - 1
        self._front: list[int] = []  # freed unhashed blocks, reused first (LIFO)
        self._back: OrderedDict[int, None] = OrderedDict()  # freed hashed blocks, LRU first
        self._ref: list[int] = []  # reference count by block id (ids taken so far)
        self._hash: list[int | None] = []  # block id -> its hash, None if unhashed
        self._num_hashed = 0
        self._cached: dict[int, int] = {}  # hash -> the first block holding it
        self._dups: dict[int, dict[int, None]] = {}  # hash -> later holders, in order
        # hit_blocks' watchers: hash -> (memo cell, position) of every walk that passed it;
        # evicting the hash's last holder cuts each such memo back to that position.
        self._watch: dict[int, list[tuple[list[Any], int]]] = {}
        #: With ``changed`` (a list, set by the engine): the memos whose hit may grow,
        #: by the uncached hash their walk stopped at (``hit_blocks``), and the owners
        #: (a memo's third slot) of the memos whose hit changed, appended as it changes:
        #: cut by an eviction (``_cut``) or grown by the caching of that hash (``_add``).
        self._stops: dict[int, list[list[Any]]] = {}
        self.changed: list[Any] | None = None
        #: References beyond a block's first, summed over the held blocks: the blocks
        #: requests hold jointly, counted once per holder beyond the first. Invariant:
        #: ``sum(len(blocks) per holder) == blocks held + num_shared`` (``check``).
        self.num_shared = 0
        # Who holds a block: its one holder while its reference count is 1 (``_sole``,
        # by block id), all of them while it is 2 or more (``_holders``), so that each
        # holder's ``CachedBlocks.num_shared`` moves when a count crosses 1 <-> 2.
        self._sole: list[CachedBlocks | None] = []
        self._holders: dict[int, list[CachedBlocks]] = {}
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
        return self._num_hashed

    def shared_blocks(self, req: CachedBlocks) -> int:
        """How many of ``req``'s blocks another holder holds too (reference count > 1):
        the references its release would take off shared blocks. O(1): kept by the pool
        as counts cross 1 <-> 2."""
        return req.num_shared

    def shared_hit(self, hashes: Sequence[int], num_blocks: int) -> int:
        """How many of the first ``num_blocks`` blocks of a hit (``lookup``'s, which
        ``num_blocks`` must not exceed) two holders hold (reference count > 1)."""
        refs = list(map(self._ref.__getitem__, map(self._cached.__getitem__,
                                                    hashes[:num_blocks])))
        return num_blocks - refs.count(0) - refs.count(1)

    @staticmethod
    def new_memo(owner: Any = None) -> list[Any]:
        """A fresh memo for ``hit_blocks``: [hit, position of the noted stop, owner,
        position of the watched hash] (-1: none)."""
        return [0, -1, owner, -1]

    def lookup(self, hashes: Sequence[int], num_tokens: int) -> list[int]:
        """Block ids of the longest cached prefix of ``hashes``, at most
        ``(num_tokens - 1) // block_size`` blocks (the last token is always computed)."""
        limit = min(len(hashes), max(0, num_tokens - 1) // self.block_size)
        out: list[int] = []
        cached = self._cached
        for i in range(limit):
            b = cached.get(hashes[i])
            if b is None:
                break
            out.append(b)
        return out

    def hit_blocks(self, hashes: Sequence[int], num_tokens: int, memo: list[Any]) -> int:
        """``len(self.lookup(hashes, num_tokens))``, kept in ``memo`` (``new_memo()``; one
        per ``hashes``) between calls: O(log) dict lookups where the hit moved, two where
        it did not (a waiting request is asked every step), not a walk of the whole hit.

        **The cache is prefix-closed**: a hash is cached only while its parent is (the
        hash of the block before it in any chain). A block is hashed by the request that
        computed it, which holds a block of its parent's hash then. Every held block of a
        hash has a held block of its parent's (a request holds its prefix), and a freed
        one was freed together with a block of its parent's hash, just before it
        (``free``: tail first), or after the request last touched it (a lookup takes a
        hit's blocks from its first): so in the LRU queue each block of a hash has a block
        of its parent's hash after it, or held, and the last block of the parent's hash is
        evicted after every block of the child's. So ``hashes[:k]`` are all cached iff
        ``hashes[k - 1]`` is, and the hit is found by galloping and bisection.

        ``memo[0]``: the hit when last asked, a bound that holds (``hashes[:memo[0]]`` all
        cached) while ``memo[3]``, the position whose hash is watched, is ``memo[0] - 1``:
        by the closure a hit loses that block first, and its eviction cuts the memo back
        to it (``_cut``), which then watches nothing until asked again, when one lookup
        of ``hashes[memo[0] - 1]`` confirms the bound (or the hit is found below it).
        A caller done with a memo (its request admitted) sets ``memo[0] = -1``: cuts skip
        it, and a watch list drops such entries when it doubles.

        With ``changed`` set, the memo's owner (``memo[2]``) is reported there as its hit
        changes (``WaitingLog.hits``): cut by an eviction (``_cut``), or grown by the
        caching of the hash its walk stopped at (``memo[1]``, its position; ``_grown``).
        By the closure those are the only changes. A hash's position in any chain is the
        same (chained hashes encode the whole prefix)."""
        limit = min(len(hashes), max(0, num_tokens - 1) // self.block_size)
        cached = self._cached
        h = memo[0]
        if h > 0 and hashes[h - 1] not in cached:  # the bound no longer holds: below it
            hi = h - 1  # (uncached)
            step = 1
            lo = hi - step
            while lo >= 0 and hashes[lo] not in cached:
                hi = lo
                step += step
                lo = hi - step
            h = _first_uncached(cached, hashes, lo + 1 if lo >= 0 else 0, hi)
        elif h < limit and hashes[h] in cached:  # grown: gallop, then bisect
            lo, step = h + 1, 1  # hashes[:lo] cached
            hi = lo + step - 1
            while hi < limit and hashes[hi] in cached:
                lo = hi + 1
                step += step
                hi = lo + step - 1
            h = _first_uncached(cached, hashes, lo, hi if hi < limit else limit)
        memo[0] = h
        if h > 0 and memo[3] != h - 1:  # watch the hit's last block (the closure)
            memo[3] = h - 1
            x = hashes[h - 1]
            w = self._watch.get(x)
            if w is None:
                self._watch[x] = [(memo, h - 1)]
            else:
                w.append((memo, h - 1))
                n = len(w)
                if n >= 64 and not n & (n - 1):  # at each doubling: drop the dead, if
                    live = [e for e in w if e[0][0] >= 0]  # half are (amortised O(1))
                    if 2 * len(live) <= n:
                        w[:] = live
        if h >= limit:
            return limit
        if self.changed is not None and memo[1] != h:
            self._stop(hashes[h], h, memo)
        return h

    def _stop(self, x: int, pos: int, memo: list[Any]) -> None:
        """Note that ``memo``'s walk stopped at the uncached hash ``x`` (position ``pos``)."""
        memo[1] = pos
        w = self._stops.get(x)
        if w is None:
            self._stops[x] = [memo]
            return
        w.append(memo)
        n = len(w)
        if n >= 64 and not n & (n - 1):  # (as the watch lists: the dead dropped)
            live = [m for m in w if m[0] >= 0]
            if 2 * len(live) <= n:
                w[:] = live

    def blocks_needed(self, req: CachedBlocks, num_computed: int, hit: Sequence[int],
                      num_new_tokens: int) -> int:
        """Free blocks that allocating ``num_new_tokens`` after ``num_computed`` computed
        tokens and the ``hit`` blocks takes: new blocks plus hit blocks now free."""
        total = num_computed + len(hit) * self.block_size + num_new_tokens
        new = -(-total // self.block_size) - len(req.block_ids) - len(hit)
        ref = self._ref
        evictable = sum(1 for b in hit if ref[b] == 0)
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
        ref, sole = self._ref, self._sole
        for b in hit:  # touch
            r = ref[b]
            if r == 0:
                del self._back[b]
                sole[b] = req
            else:
                self.num_shared += 1
                req.num_shared += 1
                if r == 1:  # shared from now on: by its one holder too
                    first = sole[b]
                    assert first is not None
                    first.num_shared += 1
                    sole[b] = None
                    self._holders[b] = [first, req]
                else:
                    self._holders[b].append(req)
            ref[b] = r + 1
        ids = req.block_ids
        ids.extend(hit)
        req.num_cached += len(hit)
        total = num_computed + len(hit) * self.block_size + num_new_tokens
        new = -(-total // self.block_size) - len(ids)
        if new > 0:
            self._take(req, new)
        full = min(min(total, num_tokens) // self.block_size, len(hashes))
        if full > req.num_cached:
            self._add(ids, hashes, req.num_cached, full)
            req.num_cached = full
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
            self._take(req, new)
        full = (num_computed + 1) // bs
        if full > len(hashes):
            full = len(hashes)
        if full > req.num_cached:
            self._add(req.block_ids, hashes, req.num_cached, full)
            req.num_cached = full
        return True

    def free(self, req: CachedBlocks) -> None:
        """Release a request's blocks, tail first (vLLM's ``free``)."""
        ref, hashed, back, front = self._ref, self._hash, self._back, self._front
        sole, holders = self._sole, self._holders
        shared = 0
        for b in reversed(req.block_ids):
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                sole[b] = None
                if hashed[b] is not None:
                    back[b] = None
                else:
                    front.append(b)
            else:
                shared += 1
                others = holders[b]
                for k, h in enumerate(others):  # (by identity; a handful of holders)
                    if h is req:
                        del others[k]
                        break
                if r == 1:  # its last other holder holds it alone now
                    last = others[0]
                    last.num_shared -= 1
                    sole[b] = last
                    del holders[b]
        self.num_shared -= shared
        req.num_shared = 0
        req.block_ids.clear()
        req.num_cached = 0

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        self.num_queries += num_tokens
        self.num_hits += num_hit_tokens

    def _take(self, req: CachedBlocks, n: int) -> None:
        """Append ``n`` free blocks to ``req``'s, each with reference count 1, in the order
        ``n`` single pops take them (the caller checked ``num_free``): freed unhashed blocks
        last-freed first, then never-used ones in id order, then cached ones least recently
        freed first (evicting their hashes)."""
        ref, sole = self._ref, self._sole
        out = req.block_ids
        front = self._front
        if front:
            k = min(n, len(front))
            taken = front[-k:]
            del front[-k:]
            taken.reverse()
            for b in taken:
                ref[b] = 1
                sole[b] = req
            out.extend(taken)
            n -= k
        if n:
            nid = self._next_id
            k = n if self.num_blocks is None else min(n, self.num_blocks - nid)
            if k:
                out.extend(range(nid, nid + k))
                ref.extend([1] * k)
                self._hash.extend([None] * k)
                sole.extend([req] * k)
                self._next_id = nid + k
                n -= k
        if n:  # evict the least recently freed (``_unhash``; its one-holder case inlined)
            back, hashed, cached, dups = self._back, self._hash, self._cached, self._dups
            watch = self._watch
            unhashed = 0
            for _ in range(n):
                b, _ = back.popitem(last=False)
                h = hashed[b]
                assert h is not None  # (blocks in the back queue are hashed)
                if h in dups:
                    self._unhash(b)
                else:  # b is the hash's one holder
                    hashed[b] = None
                    del cached[h]
                    w = watch.pop(h, None)
                    if w is not None:
                        self._cut_watchers(w)
                    unhashed += 1
                ref[b] = 1
                sole[b] = req
                out.append(b)
            self._num_hashed -= unhashed

    def _add(self, ids: list[int], hashes: Sequence[int], start: int, end: int) -> None:
        """Cache blocks ``ids[start:end]`` under ``hashes[start:end]``."""
        hashed, cached = self._hash, self._cached
        stops = self._stops
        for i in range(start, end):
            b = ids[i]
            h = hashes[i]
            hashed[b] = h
            if h in cached:  # another block holds it already: a later holder
                self._dups.setdefault(h, {})[b] = None
            else:
                cached[h] = b
                if stops:
                    w = stops.pop(h, None)
                    if w is not None:
                        self._grown(w, i)
        self._num_hashed += end - start

    def _grown(self, memos: list[list[Any]], pos: int) -> None:
        """The hash at ``pos`` that ``memos``' walks stopped at is cached: those still
        stopped there grow (``changed``)."""
        changed = self.changed
        assert changed is not None
        for memo in memos:
            if memo[0] == pos:
                changed.append(memo[2])
            if memo[1] == pos:
                memo[1] = -1

    def _unhash(self, b: int) -> None:
        """Evict block ``b``'s hash; if it was the hash's last holder, the hash leaves the
        cache and every ``hit_blocks`` memo that walked past it is cut back to it."""
        h = self._hash[b]
        assert h is not None
        self._hash[b] = None
        self._num_hashed -= 1
        dups = self._dups.get(h)
        if self._cached[h] == b:
            if dups:  # the next holder in caching order becomes the first
                first = next(iter(dups))
                del dups[first]
                self._cached[h] = first
                if not dups:
                    del self._dups[h]
                return
            del self._cached[h]
            self._cut(h)
        else:
            assert dups is not None
            del dups[b]
            if not dups:
                del self._dups[h]

    def _cut(self, h: int) -> None:
        """Hash ``h`` has left the cache: every ``hit_blocks`` memo that watches it is
        cut back to its position there."""
        w = self._watch.pop(h, None)
        if w is not None:
            self._cut_watchers(w)

    def _cut_watchers(self, watchers: list[tuple[list[Any], int]]) -> None:
        """``_cut`` of the memos that watched the hash (the watch list, taken out)."""
        changed = self.changed
        for memo, pos in watchers:
            if memo[3] == pos:
                memo[3] = -1  # (its watch is spent: the next ask confirms the bound)
            if memo[0] > pos:
                memo[0] = pos
                if changed is not None:
                    changed.append(memo[2])

    def check(self) -> None:
        """Internal consistency (tests): refcounts, queue membership, block count."""
        held = sum(1 for r in self._ref if r > 0)
        assert self.num_shared == sum(r - 1 for r in self._ref if r > 0)
        assert len(self._sole) == self._next_id
        for b, r in enumerate(self._ref):
            assert (self._sole[b] is not None) == (r == 1), (b, r)
            assert len(self._holders.get(b, ())) == (r if r > 1 else 0), (b, r)
            if r == 1:
                assert b in self._sole[b].block_ids  # type: ignore[union-attr]
            for holder in self._holders.get(b, ()):
                assert b in holder.block_ids
        in_queue = set(self._front) | set(self._back)
        assert len(in_queue) == len(self._front) + len(self._back)
        assert len(self._ref) == len(self._hash) == self._next_id
        for b, r in enumerate(self._ref):
            assert r >= 0
            assert (r == 0) == (b in in_queue), (b, r)
        assert all(self._hash[b] is not None for b in self._back)
        assert all(self._hash[b] is None for b in self._front)
        if self.num_blocks is not None:
            assert held + self.num_free == self.num_blocks
        holders: dict[int, list[int]] = {}
        for b, h in enumerate(self._hash):
            if h is not None:
                holders.setdefault(h, []).append(b)
        assert self._num_hashed == sum(map(len, holders.values()))
        assert set(holders) == set(self._cached)
        for h, bs in holders.items():
            assert sorted([self._cached[h], *self._dups.get(h, ())]) == sorted(bs)


__all__ = ["CachedBlocks", "PrefixCache", "chained_block_hashes"]
