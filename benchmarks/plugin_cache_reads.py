"""What the vLLM plugin's prefix-cache reads cost per step, in vLLM's real Scheduler.

With prefix caching on, the plugin's view gives every waiting request its prefix-cache hit
(``num_cached_tokens``) as vLLM's own lookup (``find_longest_cache_hit``) finds it, and a
policy that orders or admits by it (``ordered``, ``sorted-f``, ``feather``, ``lprs-apc``)
reads it for the whole queue every step. The lookup walks the hit block by block. The
plugin keeps each hit between steps (``ppas.live.prefix_hits``), as the simulator does
(``PrefixCache.hit_blocks``). This prints, side by side for a queue of waiting requests
with such hits: vLLM's lookup for each (the plugin before hits were kept), the first read
of the kept hits (one lookup each), a later step with nothing cached since (a dict lookup
each) and one after vLLM cached a block (one probe each).

    .venv/bin/python benchmarks/plugin_cache_reads.py [--prefix-tokens 8000] [--waiting 100]
        [--json OUT]
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from harness import Table, fail, finish, parser, start


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--prefix-tokens", type=int, default=8000,
                    help="tokens of the cached prefix a waiting request hits (default 8000)")
    ap.add_argument("--waiting", type=int, default=100,
                    help="waiting requests with such a hit, for the per-step figure")
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
    for name, least in (("prefix_tokens", 16), ("waiting", 1), ("repeats", 1)):
        if getattr(a, name) < least:
            fail(ap.prog, f"--{name.replace('_', '-')} must be >= {least}, "
                          f"got {getattr(a, name)}")
    start(a, argv)
    import vllm
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import (
        BlockHash,
        get_request_block_hasher,
        init_none_hash,
        make_block_hash_with_group_id,
    )
    from vllm.v1.request import Request

    from ppas.live.prefix_hits import PrefixHits
    from ppas.live.scheduler_harness import BLOCK_SIZE, fake_output, make_scheduler

    model_dir = os.environ.get("PPAS_TINY_MODEL", ".cache/tiny-qwen2")
    blocks = a.prefix_tokens // BLOCK_SIZE + a.waiting + 64
    sched = make_scheduler(model_dir, policy="mbt:8192", max_num_batched_tokens=8192,
                           num_blocks=2 * blocks, enable_prefix_caching=True)
    init_none_hash(sha256)
    prefix = [(i * 17) % 3000 + 3 for i in range(a.prefix_tokens)]

    def request(rid: str, own: int) -> Request:
        return Request(request_id=rid, prompt_token_ids=prefix + [own + 3] * BLOCK_SIZE,
                       sampling_params=SamplingParams(max_tokens=4, ignore_eos=True),
                       pooling_params=None, arrival_time=time.time(),
                       block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256))

    sched.add_request(request("cached", 1))  # computes the prefix: its blocks cached
    while sched.requests["cached"].num_computed_tokens < a.prefix_tokens:
        out = sched.schedule()
        sched.update_from_output(out, fake_output(out, sched))
    manager = sched.kv_cache_manager
    queue = [request(f"w{i}", 2 + i) for i in range(a.waiting)]

    def vllm_lookup() -> int:
        n = 0
        for r in queue:
            n += int(manager.coordinator.find_longest_cache_hit(r.block_hashes,
                                                                r.num_tokens - 1)[1])
        return n

    def kept(hits: PrefixHits) -> int:
        hits.begin_step()
        return sum(int(hits.lookup(r)[1]) for r in queue)

    def timed(fn: Callable[[], int]) -> tuple[float, int]:
        t0 = time.perf_counter()
        n = 0
        for _ in range(a.repeats):
            n = fn()
        return (time.perf_counter() - t0) / a.repeats, n

    rows = []
    vllm_s, n_vllm = timed(vllm_lookup)
    rows.append(("vLLM's lookup, each request", vllm_s, n_vllm))
    first: list[float] = []
    n_first = 0
    for _ in range(a.repeats):  # a new PrefixHits each time: every hit looked up
        hits = PrefixHits(manager)
        t0 = time.perf_counter()
        n_first = kept(hits)
        first.append(time.perf_counter() - t0)
    rows.append(("kept hits, first read", sum(first) / len(first), n_first))
    hits = PrefixHits(manager)
    kept(hits)
    steady_s, n_steady = timed(lambda: kept(hits))
    rows.append(("kept hits, a later step", steady_s, n_steady))
    # A step after vLLM cached a block (every step that computes a prompt's full block):
    # each kept hit's end is probed once. The block cached here is a spare one under a key
    # no request has, so no hit moves.
    pool = manager.block_pool
    spare = pool.get_new_blocks(1)[0]
    serial = [0]

    def after_insert() -> int:
        serial[0] += 1
        key = make_block_hash_with_group_id(BlockHash(b"ppas-bench-%d" % serial[0]), 0)
        pool.cached_block_hash_to_block.insert(key, spare)
        return kept(hits)

    probed_s, n_probed = timed(after_insert)
    rows.append(("kept hits, after a caching", probed_s, n_probed))
    if len({n for _, _, n in rows}) != 1:
        fail(ap.prog, f"the reads disagree: {rows}")  # (the test suite checks this too)
    hit = n_vllm // a.waiting
    hit_blocks = hit // BLOCK_SIZE
    print(f"{a.waiting} waiting requests, each with a {hit}-token hit ({hit_blocks} blocks "
          f"of {BLOCK_SIZE} tokens); vLLM {vllm.__version__}")
    t = Table(("reads", "<30"), ("ms / step", "10.3f"), ("us / request", "13.2f"),
              ("us / hit block", "15.3f"))
    t.print_header()
    for name, sec, _ in rows:
        t.print_row(name, sec * 1e3, sec / a.waiting * 1e6, sec / a.waiting / hit_blocks * 1e6)
    sched.shutdown()
    finish(a, {"vllm": vllm.__version__, "hit_tokens": hit, "hit_blocks": hit_blocks,
               "block_size": BLOCK_SIZE, "waiting": a.waiting, "repeats": a.repeats,
               "s_per_step": {name: sec for name, sec, _ in rows}}, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
