"""What the vLLM plugin's prefix-cache reads cost per step, in vLLM's real Scheduler.

With prefix caching on, the plugin's view gives every waiting request its prefix-cache hit
(``num_cached_tokens``) by vLLM's own lookup (``find_longest_cache_hit``), and a policy
that orders or admits by it (``ordered``, ``sorted-f``, ``feather``, ``lprs-apc``) reads it
for the whole queue every step. The lookup walks the hit block by block, so a step costs
about (waiting requests) x (blocks of their hits) of it; the simulator memoises hits
between steps (``PrefixCache.hit_blocks``), the plugin does not. This prints the measured
cost per block and the per-step cost it implies for a queue of waiting requests.

    .venv/bin/python benchmarks/plugin_cache_reads.py [--prefix-tokens 8000] [--waiting 100]
        [--json OUT]
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from harness import Table, fail, finish, parser, start


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--prefix-tokens", type=int, default=8000,
                    help="tokens of the cached prefix a waiting request hits (default 8000)")
    ap.add_argument("--waiting", type=int, default=100,
                    help="waiting requests with such a hit, for the per-step figure")
    ap.add_argument("--repeats", type=int, default=200)
    a = ap.parse_args(argv)
    for name, least in (("prefix_tokens", 16), ("waiting", 1), ("repeats", 1)):
        if getattr(a, name) < least:
            fail(ap.prog, f"--{name.replace('_', '-')} must be >= {least}, "
                          f"got {getattr(a, name)}")
    start(a, argv)
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    from ppas.live.plugin import _CacheReads
    from ppas.live.scheduler_harness import BLOCK_SIZE, fake_output, make_scheduler

    model_dir = os.environ.get("PPAS_TINY_MODEL", ".cache/tiny-qwen2")
    blocks = a.prefix_tokens // BLOCK_SIZE + 64
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
    reads = _CacheReads(sched.kv_cache_manager)
    waiting = request("waiting", 2)
    hit = reads.hit(waiting)
    t0 = time.perf_counter()
    for _ in range(a.repeats):
        reads.hit(waiting)
    per_lookup = (time.perf_counter() - t0) / a.repeats
    hit_blocks = hit // BLOCK_SIZE
    per_block = per_lookup / max(1, hit_blocks)
    per_step = per_lookup * a.waiting
    t = Table(("hit tokens", ">10"), ("blocks", ">7"), ("us / lookup", "12.0f"),
              ("us / block", "11.2f"), ("waiting", ">8"), ("ms / step", "10.1f"))
    t.print_header()
    t.print_row(hit, hit_blocks, per_lookup * 1e6, per_block * 1e6, a.waiting, per_step * 1e3)
    sched.shutdown()
    finish(a, {"hit_tokens": hit, "hit_blocks": hit_blocks, "s_per_lookup": per_lookup,
               "s_per_block": per_block, "waiting": a.waiting, "s_per_step": per_step}, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
