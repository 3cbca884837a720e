"""The prefix cache against a brute-force reference of vLLM's block pool (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppas.engine.prefix_cache import CachedBlocks, PrefixCache, chained_block_hashes

BS = 4


class ReferencePool:
    """vLLM's pool written the obvious way: one free-queue list initialised [0..n-1],
    ``popleft`` to allocate (evicting the block's hash), unhashed freed blocks prepended,
    hashed ones appended, a hit removes a free block from wherever it is in the list, and
    a lookup compares whole token prefixes (no hashes)."""

    def __init__(self, n: int) -> None:
        self.queue = list(range(n))
        self.ref = [0] * n
        self.content: list[tuple[object, ...] | None] = [None] * n  # full prefix of the block
        self.stamp = [0] * n  # when the block was cached: a lookup takes the oldest copy
        self.clock = 0

    def lookup(self, tokens: tuple[object, ...], num_tokens: int) -> list[int]:
        out: list[int] = []
        for i in range(max(0, num_tokens - 1) // BS):
            if (i + 1) * BS > len(tokens):
                break
            want = tokens[: (i + 1) * BS]
            hits = [b for b in range(len(self.ref)) if self.content[b] == want]
            if not hits:
                break
            out.append(min(hits, key=lambda b: self.stamp[b]))
        return out

    def allocate(self, held: list[int], tokens: tuple[object, ...], computed: int,
                 hit: list[int], new: int) -> bool:
        total = computed + len(hit) * BS + new
        need = max(-(-total // BS) - len(held) - len(hit), 0)
        need += sum(1 for b in hit if self.ref[b] == 0)
        if need > len(self.queue):
            return False
        for b in hit:
            if self.ref[b] == 0:
                self.queue.remove(b)
            self.ref[b] += 1
        held.extend(hit)
        while len(held) < -(-total // BS):
            b = self.queue.pop(0)
            self.content[b] = None
            self.ref[b] = 1
            held.append(b)
        for i in range(min(total, len(tokens)) // BS):
            if self.content[held[i]] is None:
                self.content[held[i]] = tokens[: (i + 1) * BS]
                self.clock += 1
                self.stamp[held[i]] = self.clock
        return True

    def free(self, held: list[int]) -> None:
        front, back = [], []
        for b in reversed(held):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (back if self.content[b] is not None else front).append(b)
        self.queue = front[::-1] + self.queue + back
        held.clear()


def expand(segments: list[tuple[str, int]]) -> tuple[object, ...]:
    return tuple((s, i) for s, n in segments for i in range(n))


segments_st = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 14)), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_blocks=st.integers(2, 8),
    reqs=st.lists(segments_st, min_size=1, max_size=5),
    ops=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(1, 9)),
                 max_size=60),
)
def test_matches_reference_pool(n_blocks: int, reqs: list[list[tuple[str, int]]],
                                ops: list[tuple[int, int, int]]) -> None:
    pool, ref = PrefixCache(n_blocks, BS), ReferencePool(n_blocks)
    tokens = [expand(r) for r in reqs]
    hashes = [chained_block_hashes(r, BS) for r in reqs]
    state = [CachedBlocks() for _ in reqs]
    held: list[list[int]] = [[] for _ in reqs]
    computed = [0] * len(reqs)
    memos = [PrefixCache.new_memo() for _ in reqs]  # hit_blocks' memos, kept across every operation
    for who, kind, n in ops:
        i = who % len(reqs)
        if kind == 2 or computed[i] >= len(tokens[i]):  # finish: free everything
            pool.free(state[i])
            ref.free(held[i])
            computed[i] = 0
        elif kind == 3 and held[i]:  # one token, as a decode (grow_decode)
            ok = pool.grow_decode(state[i], hashes[i], computed[i])
            assert ok == ref.allocate(held[i], tokens[i], computed[i], [], 1)
            if ok:
                computed[i] += 1
        else:
            hit = hit_ref = []
            if not held[i]:
                hit = pool.lookup(hashes[i], len(tokens[i]))
                hit_ref = ref.lookup(tokens[i], len(tokens[i]))
                assert len(hit) == len(hit_ref)
                assert len(hit) * BS <= len(tokens[i]) - 1  # the last token is computed
            base = computed[i] + len(hit) * BS
            new = min(n, len(tokens[i]) - base)
            ok = pool.allocate(state[i], hashes[i], computed[i], hit, new, len(tokens[i]))
            ok_ref = ref.allocate(held[i], tokens[i], computed[i], hit_ref, new)
            assert ok == ok_ref
            if ok:
                computed[i] = base + new
        pool.check()
        assert pool.num_free == len(ref.queue)
        # Blocks held jointly: every holder's blocks, less the blocks held; and each
        # holder's blocks another holds too.
        assert pool.num_shared == (sum(len(s.block_ids) for s in state)
                                   - (n_blocks - pool.num_free))
        for s in state:
            assert pool.shared_blocks(s) == sum(
                1 for b in s.block_ids if sum(b in t.block_ids for t in state) > 1)
        # Same set of cached prefixes (content, not ids).
        cached = {tuple(ref.content[b]) for b in range(n_blocks) if ref.content[b] is not None}
        assert pool.num_cached_blocks == sum(1 for c in ref.content if c is not None)
        for t, hs in zip(tokens, hashes, strict=True):
            for k, h in enumerate(hs):
                assert (h in pool._cached) == (t[: (k + 1) * BS] in cached)
            # Prefix-closed (PrefixCache.hit_blocks): a block cached only with its parent.
            flags = [h in pool._cached for h in hs]
            assert flags == sorted(flags, reverse=True)
        # The memoised hit is the lookup's, at every length the request could be asked at.
        for t, hs, memo in zip(tokens, hashes, memos, strict=True):
            for m in (len(t), max(1, len(t) - BS - 1), 1):
                assert pool.hit_blocks(hs, m, memo) == len(pool.lookup(hs, m))


@given(st.lists(segments_st, min_size=2, max_size=4))
def test_hashes_equal_iff_prefixes_equal(reqs: list[list[tuple[str, int]]]) -> None:
    toks = [expand(r) for r in reqs]
    hs = [chained_block_hashes(r, BS) for r in reqs]
    for a in range(len(reqs)):
        assert len(hs[a]) == len(toks[a]) // BS
        for b in range(len(reqs)):
            for k in range(min(len(hs[a]), len(hs[b]))):
                same = toks[a][: (k + 1) * BS] == toks[b][: (k + 1) * BS]
                assert (hs[a][k] == hs[b][k]) == same


@given(prefix=st.integers(0, 60), suffix=st.integers(1, 30))
def test_unbounded_cache_hits_whole_shared_prefix(prefix: int, suffix: int) -> None:
    # A second request sharing `prefix` tokens hits every full block of it, capped so that
    # at least one token of its own is computed.
    pool = PrefixCache(None, BS)
    segs1 = [("sys", prefix), ("u1", suffix)] if prefix else [("u1", suffix)]
    segs2 = [("sys", prefix), ("u2", suffix)] if prefix else [("u2", suffix)]
    h1, h2 = chained_block_hashes(segs1, BS), chained_block_hashes(segs2, BS)
    r1 = CachedBlocks()
    assert pool.allocate(r1, h1, 0, [], prefix + suffix, prefix + suffix)
    hit = pool.lookup(h2, prefix + suffix)
    assert len(hit) == min(prefix // BS, (prefix + suffix - 1) // BS)
    pool.free(r1)
    # The same prompt again: a full hit less the last block (the last-token rule).
    again = pool.lookup(h1, prefix + suffix)
    assert len(again) == (prefix + suffix - 1) // BS


def test_lru_evicts_least_recently_freed_tail_first() -> None:
    pool = PrefixCache(4, BS)
    a, b = CachedBlocks(), CachedBlocks()
    ha = chained_block_hashes([("a", 8)], BS)
    hb = chained_block_hashes([("b", 8)], BS)
    assert pool.allocate(a, ha, 0, [], 8, 8)
    assert pool.allocate(b, hb, 0, [], 8, 8)
    pool.free(a)
    pool.free(b)
    c = CachedBlocks()
    # One new block evicts a's tail block: a keeps its first block only.
    assert pool.allocate(c, chained_block_hashes([("c", 4)], BS), 0, [], 3, 3)
    assert len(pool.lookup(ha, 9)) == 1 and len(pool.lookup(hb, 9)) == 2


def test_a_hash_held_three_times_is_found_in_caching_order() -> None:
    # Three requests compute the same two blocks while each holds a block of its own
    # already (no lookup: vLLM caches both copies). A lookup returns the first holder; once
    # its blocks are evicted, the next holder in caching order, then the last.
    pool = PrefixCache(6, BS)
    hs = chained_block_hashes([("a", 8)], BS)
    reqs = [CachedBlocks() for _ in range(3)]
    for r in reqs:
        assert pool.allocate(r, hs, 0, [], 1, 8)
    for r in reqs:
        assert pool.allocate(r, hs, 1, [], 7, 8)
    pool.check()
    assert pool.num_cached_blocks == 6
    assert pool.lookup(hs, 9) == reqs[0].block_ids
    memo = PrefixCache.new_memo()
    assert pool.hit_blocks(hs, 9, memo) == 2
    held = [list(r.block_ids) for r in reqs]
    for r in reqs:
        pool.free(r)
    for k in range(3):
        assert pool.lookup(hs, 9) == held[k]
        assert pool.hit_blocks(hs, 9, memo) == 2
        # Two new blocks evict the least recently freed: the k-th request's pair.
        assert pool.allocate(CachedBlocks(), chained_block_hashes([("x", k + 1)], BS), 0,
                             [], 8, 8)
        pool.check()
    assert pool.lookup(hs, 9) == [] and pool.hit_blocks(hs, 9, memo) == 0


def test_dead_memos_leave_the_watch_lists_and_live_ones_are_still_cut() -> None:
    # A shared prefix walked by a thousand requests, each done with its memo once admitted
    # (memo[0] = -1): the watch lists stay bounded, and a live memo is still cut when the
    # prefix is evicted.
    pool = PrefixCache(2, BS)
    hs = chained_block_hashes([("s", 8)], BS)
    r = CachedBlocks()
    assert pool.allocate(r, hs, 0, [], 8, 8)
    pool.free(r)
    live = PrefixCache.new_memo()
    assert pool.hit_blocks(hs, 9, live) == 2
    for _ in range(1000):
        memo = PrefixCache.new_memo()
        assert pool.hit_blocks(hs, 9, memo) == 2
        memo[0] = -1
    assert max(len(w) for w in pool._watch.values()) <= 128
    assert pool.allocate(CachedBlocks(), chained_block_hashes([("x", 8)], BS), 0, [], 8, 8)
    assert pool.lookup(hs, 9) == [] and pool.hit_blocks(hs, 9, live) == 0
