"""Prefix caching in the simulator, Feather and Sorted-F (hypothesis for the invariants)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppas.core.errors import PpasError
from ppas.core.view import RequestSnapshot, SchedulerView
from ppas.cost.base import CostModel, StepShape
from ppas.engine.simulator import EngineConfig, simulate
from ppas.policies import make_policy
from ppas.policies.feather import ChunkedHashTree
from ppas.policies.sortedf import f_metric
from ppas.workload import RequestSpec, prefix_group_trace


class ConstantCost(CostModel):
    """1 ms per step + 1 us per token."""

    def step_time(self, step: StepShape) -> float:
        return 1e-3 + 1e-6 * step.num_tokens


@st.composite
def prefix_workloads(draw: st.DrawFn) -> tuple[list[RequestSpec], str, int]:
    n = draw(st.integers(1, 12))
    groups = draw(st.integers(1, 3))
    reqs = []
    for _ in range(n):
        shared = draw(st.integers(0, 1200))
        g = draw(st.integers(0, groups - 1))
        rest = draw(st.integers(1, 300))
        prefix = ((f"g{g}", shared),) if shared else ()
        reqs.append(RequestSpec(draw(st.floats(0, 1)), shared + rest, draw(st.integers(1, 10)),
                                prefix=prefix))
    b = draw(st.sampled_from([64, 512, 2048]))
    spec = draw(st.sampled_from([
        f"mbt:{b}", f"feather:budget={b},chunk=64,max_wait_s=0.05", f"sorted-f:budget={b}",
        f"sorted-f:budget={b},metric=none", "lprs-apc", f"ppas:b_max={b},b_cap={b // 4}"]))
    need = max(-(-(r.prompt_tokens + r.output_tokens) // 16) for r in reqs)
    return reqs, spec, need + draw(st.integers(0, 200))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix_workloads())
def test_invariants_with_prefix_caching(w: tuple[list[RequestSpec], str, int]) -> None:
    reqs, spec, blocks = w
    pol = make_policy(spec)
    res = simulate(reqs, pol, ConstantCost(), EngineConfig(num_kv_blocks=blocks,
                                                           prefix_caching=True),
                   record_steps=True)
    for s in res.steps:
        assert s.num_prefill_tokens <= s.prefill_budget
        assert s.num_prefill_tokens + s.num_decode_tokens <= pol.max_num_batched_tokens
        assert s.kv_blocks_used <= blocks  # KV never over capacity, shared blocks once
    for r in res.requests:
        assert r.failed is None and r.num_output_tokens == r.max_output_tokens
        assert r.num_hit_tokens % 16 == 0 and r.num_hit_tokens <= r.prompt_tokens - 1
        assert r.blocks == 0
    assert 0.0 <= res.prefix_hit_rate < 1.0
    # Every token of a prompt is either computed or taken from the cache: with no
    # preemption, prefill chunks + first-admission hits = all prompt tokens.
    if res.num_preemptions == 0:
        computed = sum(s.num_prefill_tokens for s in res.steps)
        assert computed + sum(r.num_hit_tokens for r in res.requests) == sum(
            r.prompt_tokens for r in res.requests)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 700), st.integers(1, 200)),
                min_size=1, max_size=8))
def test_sequential_hits_are_the_shared_full_blocks(
        spec: list[tuple[int, int, int]]) -> None:
    # One request at a time, unbounded KV: every request hits exactly the full blocks of
    # its group's prefix that an earlier request computed, capped by the last-token rule.
    prefix = {g: 0 for g in range(3)}
    reqs = []
    for i, (g, shared, rest) in enumerate(spec):
        reqs.append(RequestSpec(float(i), shared + rest, 2, prefix=((f"g{g}", shared),)))
    res = simulate(reqs, make_policy("mbt:4096"), ConstantCost(),
                   EngineConfig(max_num_seqs=1, prefix_caching=True))
    for r, (g, shared, rest) in zip(res.requests, spec, strict=True):
        expect = min(prefix[g], shared, shared + rest - 1) // 16 * 16
        assert r.num_hit_tokens == expect
        prefix[g] = max(prefix[g], shared)


def test_caching_without_sharing_changes_nothing() -> None:
    # Unique prompts, no preemption: prefix caching on or off, the same run.
    tr = [RequestSpec(0.01 * i, 500 + 37 * i, 8) for i in range(30)]
    a = simulate(tr, make_policy("mbt:512"), ConstantCost(), EngineConfig())
    b = simulate(tr, make_policy("mbt:512"), ConstantCost(), EngineConfig(prefix_caching=True))
    assert [r.finish_time for r in a.requests] == [r.finish_time for r in b.requests]
    assert b.prefix_hit_rate == 0.0


def test_hits_shorten_prefill() -> None:
    tr = prefix_group_trace(float("inf"), 40, 0, 2, 4000, 100, 8)
    off = simulate(tr, make_policy("mbt:2048"), ConstantCost())
    on = simulate(tr, make_policy("mbt:2048"), ConstantCost(), EngineConfig(prefix_caching=True))
    assert on.prefix_hit_rate > 0.8
    assert on.summary()["makespan"] < 0.5 * off.summary()["makespan"]


# -- Feather ---------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.floats(0.005, 0.2))
def test_feather_never_starves_past_max_wait(seed: int, max_wait: float) -> None:
    # After arrival + max_wait_s, no later arrival is first scheduled ahead of a request.
    rng = random.Random(seed)
    reqs = []
    for i in range(rng.randint(2, 25)):
        g = rng.randint(0, 3)
        reqs.append(RequestSpec(rng.uniform(0, 0.3), 512 * rng.randint(1, 3) + rng.randint(1, 99),
                                rng.randint(1, 30), prefix=((f"g{g}", 512 * (1 + i % 2)),)))
    spec = f"feather:budget=1024,min_batch={rng.randint(0, 3)},max_wait_s={max_wait}"
    res = simulate(reqs, make_policy(spec), ConstantCost(),
                   EngineConfig(num_kv_blocks=rng.choice([400, 4000]), prefix_caching=True))
    done = [r for r in res.requests if r.first_scheduled_time is not None]
    assert len(done) == len(reqs)
    for r in done:
        for s in done:
            if s.arrival_time > r.arrival_time and (
                    s.first_scheduled_time >= r.arrival_time + max_wait):  # type: ignore[operator]
                assert r.first_scheduled_time <= s.first_scheduled_time  # type: ignore[operator]


@given(st.lists(st.lists(st.integers(0, 3), max_size=4), min_size=1, max_size=8),
       st.lists(st.integers(0, 7), max_size=8))
def test_hash_tree_pops_most_overlap(paths: list[list[int]], batch: list[int]) -> None:
    # Keys as chained prefixes (tuples); brute force: overlap = longest prefix of the
    # request's path that some batch member's path starts with.
    keys = [[tuple(p[: j + 1]) for j in range(len(p))] for p in paths]
    members = [paths[b % len(paths)] for b in batch]
    tree = ChunkedHashTree()
    for m in members:
        tree.add_batch([tuple(m[: j + 1]) for j in range(len(m))])
    for k in keys:
        tree.add_waiting(k)
    got = []
    while (best := tree.pop_best()) is not None:
        got.append(best)
    want = []
    for i, p in enumerate(paths):
        ov = max((j + 1 for j in range(len(p)) for m in members if m[: j + 1] == p[: j + 1]),
                 default=0)
        want.append((-ov, i))
    assert [(i, ov) for ov, i in ((-o, i) for o, i in sorted(want))] == got


def test_feather_groups_requests_by_prefix() -> None:
    h = {g: [hash((g, k)) for k in range(64)] for g in "ab"}  # 64 blocks = 2 levels
    run = RequestSnapshot("r", 0.0, 1024, 1024, 1, 8, True, block_hashes=h["a"])
    wait = [RequestSnapshot(f"w{i}", 0.1 * i, 1024, block_hashes=h["ab"[i % 2]])
            for i in range(6)]
    view = SchedulerView(1.0, [run, *wait], 6, 1, 8192, 256)
    d = make_policy("feather:min_batch=0").decide(view)
    assert d.prefill_order == ("w0", "w2", "w4")  # group a joins; STOP at group b
    assert d.prefill_budget == 3 * 1024
    # Aged requests go first whatever their prefix.
    old = SchedulerView(1.0, [run, *wait], 6, 1, 8192, 256)
    d = make_policy("feather:min_batch=0,max_wait_s=0.85").decide(old)
    assert d.prefill_order[:2] == ("w0", "w1")


# -- Sorted-F ----------------------------------------------------------------------------------


def test_sorted_f_batches_short_outputs_within_budget() -> None:
    w = [RequestSnapshot(f"w{i}", 0.0, 100, max_output_tokens=o)
         for i, o in enumerate([400, 10, 12, 11, 900])]
    view = SchedulerView(0.0, w, 5, 0, 8192, 256)
    d = make_policy("sorted-f:kv_tokens=100000").decide(view)
    # Sorted by output; F = sum o / |X|^2 falls while adding 10, 11, 12 and rises at 400.
    assert d.prefill_order == ("w1", "w3", "w2")
    assert f_metric(33, 3) < f_metric(433, 4)
    # MC-SF adds everything that fits; a small budget admits only what fits.
    assert make_policy("sorted-f:kv_tokens=100000,metric=none").decide(view).prefill_order == (
        "w1", "w3", "w2", "w0", "w4")
    assert make_policy("sorted-f:kv_tokens=260,metric=none").decide(view).prefill_order == (
        "w1", "w3")


def test_sorted_f_beats_fcfs_on_a_blocking_backlog() -> None:
    # FCFS admits the long request first and the KV budget then holds the short ones back;
    # Sorted-F runs the short ones first (the paper's "FCFS can be arbitrarily bad").
    tr = [RequestSpec(0.0, 2900, 200)] + [RequestSpec(0.0, 100, 10) for _ in range(20)]
    eng = EngineConfig(num_kv_blocks=200)
    fcfs = simulate(tr, make_policy("mbt:4096"), ConstantCost(), eng).summary()
    sf = simulate(tr, make_policy("sorted-f:budget=4096,kv_tokens=3200"), ConstantCost(),
                  eng).summary()
    assert sf["avg_latency"] < 0.5 * fcfs["avg_latency"]


@pytest.mark.parametrize("bad", ["sorted-f:metric=g", "sorted-f:kv_tokens=0",
                                 "feather:chunk=500", "feather:cached_fraction=0"])
def test_bad_configs(bad: str) -> None:
    with pytest.raises(PpasError):
        make_policy(bad)


def test_predictive_counts_cache_hits_as_done() -> None:
    from ppas.policies.predictive import kv_admission_cap

    run = RequestSnapshot("r", 0.0, 100, 100, 1, 8, True)
    cold = RequestSnapshot("w", 0.0, 1000)
    warm = RequestSnapshot("w", 0.0, 1000, num_cached_tokens=992)
    assert kv_admission_cap(SchedulerView(1.0, [run, cold], 1, 1, 4096, 256), 10**6, 4096) == 1000
    assert kv_admission_cap(SchedulerView(1.0, [run, warm], 1, 1, 4096, 256), 10**6, 4096) == 8


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix_workloads(), st.booleans())
def test_a_waiting_requests_hit_is_the_caches_lookup(
        w: tuple[list[RequestSpec], str, int], ordered: bool) -> None:
    # The hit a policy reads (num_cached_tokens, memoised by PrefixCache.hit_blocks between
    # steps) is a fresh walk of the cache at every step, through evictions and preemptions.
    reqs, spec, blocks = w
    pol = make_policy("ordered" if ordered else spec)
    decide = pol.decide

    def checked(view: SchedulerView) -> object:
        holders: dict[int, int] = {}  # block id -> running requests holding it
        for r in view.requests:
            cache = getattr(r, "cache", None)
            if not r.is_running and cache is not None:
                walk = cache.lookup(r.block_hashes, r.num_tokens)  # type: ignore[attr-defined]
                assert r.num_cached_tokens == len(walk) * cache.block_size
            if r.is_running and cache is not None:
                for b in r.kv.block_ids:  # type: ignore[attr-defined]
                    holders[b] = holders.get(b, 0) + 1
        # What the footprint rule credits (ppas.policies.kv_room, "Shared blocks"): the
        # running requests' joint blocks, and each one's blocks another holds too.
        bs = 16
        assert view.kv_shared_tokens == bs * sum(n - 1 for n in holders.values())
        for r in view.requests:
            if r.is_running:
                ids = r.kv.block_ids  # type: ignore[attr-defined]
                assert r.num_shared_tokens == bs * sum(1 for b in ids if holders[b] > 1)
            elif getattr(r, "cache", None) is not None:  # its hit, held by two running
                walk = r.cache.lookup(r.block_hashes, r.num_tokens)  # type: ignore[attr-defined]
                assert r.num_shared_tokens == bs * sum(1 for b in walk
                                                       if holders.get(b, 0) > 1)
        return decide(view)

    pol.decide = checked  # type: ignore[method-assign, assignment]
    simulate(reqs, pol, ConstantCost(), EngineConfig(num_kv_blocks=blocks, prefix_caching=True))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix_workloads())
def test_every_hit_change_is_reported_in_the_waiting_log(
        w: tuple[list[RequestSpec], str, int]) -> None:
    # WaitingLog.hits: a waiting request whose hit differs from the one it had when last
    # read (here: every step) is listed since, whether another request's blocks were
    # cached (the hit grows) or evicted (it is cut).
    reqs, spec, blocks = w
    pol = make_policy(spec)
    decide = pol.decide
    last: dict[str, int] = {}
    pos = [0]
    changes = [0]

    def checked(view: SchedulerView) -> object:
        log = view.waiting_log
        assert log is not None and log.hits is not None
        listed = {r.request_id for r in log.hits[pos[0] - log.hits_base:]}
        pos[0] = log.hits_end
        for r in view.requests:
            if r.is_running:
                last.pop(r.request_id, None)  # (admitted: read again once it waits)
                continue
            hit = r.num_cached_tokens
            before = last.get(r.request_id)
            if before is not None and before != hit:
                changes[0] += 1
                assert r.request_id in listed, (r.request_id, before, hit)
            last[r.request_id] = hit
        return decide(view)

    pol.decide = checked  # type: ignore[method-assign, assignment]
    simulate(reqs, pol, ConstantCost(), EngineConfig(num_kv_blocks=blocks, prefix_caching=True))


def test_a_hit_grown_by_another_requests_caching_is_reported() -> None:
    # Two requests of one 640-token prefix arrive together; the second waits while the
    # first is prefilled in 128-token chunks, so its hit grows as the first's blocks are
    # cached, step after step, and each growth is reported.
    reqs = [RequestSpec(0.0, 700, 2, prefix=(("g", 640),)),
            RequestSpec(0.0, 700, 2, prefix=(("g", 640),))]
    pol = make_policy("mbt:128")
    decide = pol.decide
    seen: list[tuple[int, bool]] = []

    def watched(view: SchedulerView) -> object:
        log = view.waiting_log
        assert log is not None and log.hits is not None
        for r in view.requests:
            if not r.is_running and r.request_id == "1":
                seen.append((r.num_cached_tokens, any(h is r for h in log.hits)))
        return decide(view)

    pol.decide = watched  # type: ignore[method-assign, assignment]
    simulate(reqs, pol, ConstantCost(), EngineConfig(num_kv_blocks=200, prefix_caching=True,
                                                     max_num_seqs=1))
    hits = [h for h, _ in seen]
    assert hits == sorted(hits) and hits[0] < hits[-1] == 640
    assert all(reported for h, reported in seen[1:] if h > hits[0])
