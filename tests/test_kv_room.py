"""The footprint rule by the future peak of KV use (``ppas.policies.kv_room``): against a
step-by-step count of the bounds it states, against the sum of the footprints, and in the
simulator (no preemption with exact lengths, more requests running than the sum allows)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from ppas.core.view import RequestSnapshot
from ppas.cost.roofline import RooflineCostModel
from ppas.engine.simulator import EngineConfig, simulate
from ppas.policies import make_policy
from ppas.policies.kv_room import KvRoom
from ppas.policies.ordered import Ordered
from ppas.workload import RequestSpec

SLACK = 16

#: A running request: (prompt, outputs it has, max outputs, prompt computed?).
running_requests = st.lists(
    st.tuples(st.integers(1, 3000), st.integers(0, 400), st.integers(1, 400), st.booleans()),
    max_size=12)
candidates = st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 400)), max_size=8)


def snapshots(rows: list[tuple[int, int, int, bool]]) -> list[RequestSnapshot]:
    out = []
    for i, (p, o, cap, prefilled) in enumerate(rows):
        o = min(o, cap) if prefilled else 0
        out.append(RequestSnapshot(f"r{i}", 0.0, p, num_computed_tokens=p if prefilled else 0,
                                   num_output_tokens=o, max_output_tokens=cap, is_running=True))
    return out


def peak_fits(reqs: list[RequestSnapshot], admitted: list[tuple[int, int]], capacity: int
              ) -> bool:
    """The module doc's bounds counted step by step: every future step's KV use, and the
    horizon's, within ``capacity``."""
    decodes, prompts = [], list(admitted)  # (b, r outputs left); (b, f)
    for r in reqs:
        b = r.prompt_tokens + r.num_output_tokens + SLACK
        if r.num_computed_tokens < r.prompt_tokens:
            prompts.append((b, r.prompt_tokens + r.max_output_tokens + SLACK))
        else:
            decodes.append((b, r.max_output_tokens - r.num_output_tokens))
    last = max((left for _, left in decodes), default=0)
    for s in range(last + 1):
        use = (sum(b + s for b, left in decodes if left >= s)
               + sum(min(f, b + s) for b, f in prompts))
        if use > capacity:
            return False
    return sum(f for _, f in prompts) <= capacity


@settings(max_examples=300, deadline=None)
@given(running_requests, candidates, st.integers(0, 60_000))
def test_admits_exactly_what_the_peak_allows(rows: list[tuple[int, int, int, bool]],
                                            cands: list[tuple[int, int]], capacity: int
                                            ) -> None:
    """Admissions one after another: each is admitted iff the step-by-step count of the
    bounds stays within the capacity with it; the sum rule admits a subset."""
    reqs = snapshots(rows)
    held = sum(r.prompt_tokens + r.max_output_tokens + SLACK for r in reqs)
    room = KvRoom(capacity, capacity - held, reqs, SLACK)
    admitted: list[tuple[int, int]] = []
    for p, out in cands:
        b, f = p + SLACK, p + out + SLACK
        want = peak_fits(reqs, [*admitted, (b, f)], capacity)
        if f <= capacity - held - sum(f for _, f in admitted):
            assert want  # whatever the sum admits the peak admits
        assert room.admit(b, f) == want
        if want:
            admitted.append((b, f))
    assert room.room == capacity - held - sum(f for _, f in admitted)


@given(running_requests, st.integers(1, 3000), st.integers(1, 400), st.integers(0, 60_000))
def test_without_the_peak_it_is_the_sum(rows: list[tuple[int, int, int, bool]], p: int,
                                        out: int, capacity: int) -> None:
    reqs = snapshots(rows)
    left = capacity - sum(r.prompt_tokens + r.max_output_tokens + SLACK for r in reqs)
    room = KvRoom(capacity, left, reqs, SLACK, peak=False)
    assert room.admit(p + SLACK, p + out + SLACK) == (p + out + SLACK <= left)


def test_a_finishing_decode_makes_room_the_sum_does_not_see() -> None:
    # 10,000 KV tokens. A decode at 3,000 tokens of context with 100 outputs left frees
    # its 3,116 a hundred steps from now, when a 2,000-token prompt admitted now with
    # 5,000 outputs holds 2,116 of its 7,016; the sum of the two footprints is 10,132.
    dec = RequestSnapshot("d", 0.0, 3000, 3000, 0, 100, is_running=True)
    b, f = 2000 + SLACK, 7000 + SLACK
    held = 3100 + SLACK
    assert f > 10_000 - held  # the sum refuses it
    assert KvRoom(10_000, 10_000 - held, [dec], SLACK).admit(b, f)
    assert not KvRoom(10_000, 10_000 - held, [dec], SLACK, peak=False).admit(b, f)
    # A decode that outlives the newcomer's growth keeps it out.
    long = RequestSnapshot("d", 0.0, 3000, 3000, 0, 6000, is_running=True)
    held = 9000 + SLACK
    assert not KvRoom(12_000, 12_000 - held, [long], SLACK).admit(b, f)


def test_long_outputs_run_more_requests_and_none_is_preempted() -> None:
    """In the simulator, with exact lengths and a tight cache (the engine's, which the policy
    sees): the peak rule never makes vLLM preempt (nor does the sum), and it runs more
    requests at once than the sum, so the burst finishes sooner."""
    cm = RooflineCostModel("h100-sxm-80gb", "qwen3-8b", max_num_batched_tokens=4096)
    reqs = [RequestSpec(i * 0.05, 500 + (i * 7919) % 1500, 50 + (i * 104729) % 900)
            for i in range(80)]
    engine = EngineConfig(num_kv_blocks=2500)  # 40,000 tokens (~20 footprints): the policy's too
    runs = {}
    for spec in ("ordered", "ordered:kv_peak=false"):
        pol = make_policy(spec)
        pol.bind_cost_model(cm)
        res = simulate(reqs, pol, cm, engine, record_steps=True)
        assert isinstance(pol, Ordered) and pol.kv_capacity == 2500 * 16  # the engine's cache
        assert res.num_preemptions == 0
        assert all(r.finish_time is not None for r in res.requests)
        runs[spec] = res
    most = {k: max(s.num_decode_reqs for s in r.steps) for k, r in runs.items()}
    assert most["ordered"] > most["ordered:kv_peak=false"]

    def mean_e2e(spec: str) -> float:
        done = runs[spec].requests
        return sum(r.finish_time - r.arrival_time for r in done) / len(done)  # type: ignore[operator]
    assert mean_e2e("ordered") < mean_e2e("ordered:kv_peak=false")


#: Running requests in prefix groups: (group, extra prompt, outputs it has, max outputs,
#: prompt computed?); a request of group g holds the group's shared prefix, then its own.
grouped_requests = st.lists(
    st.tuples(st.integers(0, 2), st.integers(1, 2000), st.integers(0, 300),
              st.integers(1, 300), st.booleans()), max_size=10)


@settings(max_examples=400, deadline=None)
@given(grouped_requests, st.lists(st.integers(0, 3000), min_size=3, max_size=3),
       st.lists(st.tuples(st.integers(0, 3), st.integers(1, 2000), st.integers(1, 400)),
                max_size=8),
       st.integers(0, 40_000))
def test_shared_blocks_credited_never_overfill_the_cache(
        rows: list[tuple[int, int, int, int, bool]], prefixes: list[int],
        cands: list[tuple[int, int, int]], capacity: int) -> None:
    """With prefix groups, the rule credits the blocks the running requests share
    (module doc, "Shared blocks"): E, plus each admitted prompt's hit on blocks two of
    them hold, less each finished decode's e_j. Whatever it admits, what the requests
    really hold (a group's prefix once while any member runs, each request's own tokens
    by the bounds) stays within the capacity at every future step and at the horizon;
    and it admits at least what the rule without the credit admits. A candidate of
    group 3 shares nothing."""
    reqs: list[RequestSnapshot] = []
    group: list[int] = []
    for i, (g, extra, o, cap, prefilled) in enumerate(rows):
        p = prefixes[g] + extra
        o = min(o, cap) if prefilled else 0
        reqs.append(RequestSnapshot(f"r{i}", 0.0, p, num_computed_tokens=p if prefilled else 0,
                                    num_output_tokens=o, max_output_tokens=cap,
                                    is_running=True))
        group.append(g)
    members = [group.count(g) for g in range(3)]
    shared = sum(prefixes[g] * (members[g] - 1) for g in range(3) if members[g])
    reqs = [dataclasses.replace(r, num_shared_tokens=prefixes[g] if members[g] > 1 else 0)
            for r, g in zip(reqs, group, strict=True)]
    held = sum(r.prompt_tokens + r.max_output_tokens + SLACK for r in reqs)
    credited = KvRoom(capacity, capacity - held, reqs, SLACK, shared=shared)
    plain = KvRoom(capacity, capacity - held, reqs, SLACK)
    admitted: list[tuple[int, int, int]] = []  # (b, f, group)
    same = True  # both rules have admitted the same so far
    for g, extra, out in cands:
        p = (prefixes[g] if g < 3 else 0) + extra
        b, f = p + SLACK, p + out + SLACK
        h = prefixes[g] if g < 3 and members[g] > 1 else 0  # its hit two requests hold
        by_plain = plain.admit(b, f) if same else False
        by_credit = credited.admit(b, f, RequestSnapshot("w", 0.0, p, num_shared_tokens=h))
        assert by_credit or not by_plain  # from the same state, the credit only adds room
        same = same and by_plain == by_credit
        if by_credit:
            admitted.append((b, f, g))
    if not admitted:
        return
    prefixes = [*prefixes, 0]

    def true_use(s: int | None) -> int:  # s None: the horizon, every decode finished
        alive = [False] * 4
        use = 0
        for b, f, g in admitted:  # a hit on a group's prefix: held once, by the group
            use += (min(f, b + s) if s is not None else f) - (prefixes[g] if members[g:g + 1]
                                                              and members[g] else 0)
            alive[g] = True
        for r, g in zip(reqs, group, strict=True):
            b = r.prompt_tokens + r.num_output_tokens + SLACK
            if r.num_computed_tokens < r.prompt_tokens:  # a prompt: never finishes
                f = r.prompt_tokens + r.max_output_tokens + SLACK
                own = (min(f, b + s) if s is not None else f) - prefixes[g]
            elif s is not None and r.max_output_tokens - r.num_output_tokens >= s:
                own = b + s - prefixes[g]
            else:
                continue
            use += own
            alive[g] = True
        return use + sum(prefixes[g] for g in range(3) if alive[g] and members[g])

    last = max((r.max_output_tokens for r in reqs), default=0)
    assert all(true_use(s) <= capacity for s in range(last + 1))
    assert true_use(None) <= capacity
