"""Chunk runs (``EngineSim._chunk_run``, ``Policy.chunk_rule``): the steps of one prompt's
chunks beside the same decodes, taken in one go, must be exactly the steps ``step()``
takes one at a time: every step's record, every request's times and blocks, the gaps."""

from __future__ import annotations

import math
from collections import deque

from chunk_run_engines import engine, state
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_views import dec, pre, view, wait

from ppas.cost.roofline import RooflineCostModel
from ppas.engine.simulator import EngineSim, replay
from ppas.policies import make_policy
from ppas.workload import RequestSpec

CM = RooflineCostModel("h200", "qwen2.5-3b")
PRICE = CM.chunk_pricer()  # (a chunk run's step price: Policy.chunk_rule's second value)


def run(specs: list[RequestSpec], policy: str, kv: int | None,
        runs: bool) -> tuple[EngineSim, int]:
    """``specs`` replayed with every step's record kept; chunk runs on or off. Also the
    steps taken in chunk runs."""
    sim, counter = engine(policy, CM, kv, runs)
    replay(sim, specs)
    return sim, counter.steps


workloads = st.lists(st.tuples(st.floats(0, 1), st.integers(1, 4000), st.integers(1, 60),
                               st.sampled_from([None, None, 0.013, 0.03])),
                     min_size=1, max_size=20)
configs = st.tuples(st.sampled_from([0.012, 0.015, 0.02, 0.03, 0.05]),
                    st.sampled_from([64, 300, 4096]), st.sampled_from([0.0, 0.001]),
                    st.sampled_from([4096, 8192]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads, configs, st.one_of(st.none(), st.integers(40, 800), st.integers(250, 1500)))
def test_chunk_runs_equal_single_steps(reqs: list[tuple[float, int, int, float | None]],
                                       cfg: tuple[float, int, float, int],
                                       kv: int | None) -> None:
    tpot, c_max, margin, mbt = cfg
    policy = f"sloweave:tpot_s={tpot},c_max={c_max},margin_s={margin},mbt={mbt}"
    specs = [RequestSpec(a, p, o, tpot_slo=s) for a, p, o, s in reqs]
    fast, _ = run(specs, policy, kv, True)
    slow, none = run(specs, policy, kv, False)
    assert none == 0
    assert state(fast) == state(slow)


def drive(specs: list[RequestSpec], policy: str, kv: int | None, runs: bool,
          grid: float) -> tuple[EngineSim, list[tuple[float, int]], int]:
    """``specs`` added as they arrive, the engine driven to each arrival and to every
    multiple of ``grid`` seconds by ``run_until(limit)`` (``arrivals`` False: no run goes
    past a limit), chunk runs on or off (decode runs in both); the clock and steps at
    every limit, and the steps taken in chunk runs."""
    sim, counter = engine(policy, CM, kv, runs)
    specs = sorted(specs, key=lambda s: s.arrival_s)
    marks = []
    i = 0
    while True:
        while i < len(specs) and specs[i].arrival_s <= sim.now:
            sim.add_request(specs[i])
            i += 1
        nxt = specs[i].arrival_s if i < len(specs) else math.inf
        if sim.has_work():
            sim.run_until(min(nxt, (math.floor(sim.now / grid) + 1) * grid))
        elif i < len(specs):
            sim.idle_until(nxt)
        else:
            return sim, marks, counter.steps
        marks.append((sim.now, sim.num_steps))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads, configs, st.one_of(st.none(), st.integers(250, 1500)),
       st.sampled_from([0.004, 0.011, 0.05]))
def test_run_until_a_limit_equals_single_steps(
        reqs: list[tuple[float, int, int, float | None]], cfg: tuple[float, int, float, int],
        kv: int | None, grid: float) -> None:
    """``run_until(limit)`` without ``arrivals`` (chunk runs cut at every limit, on a grid
    finer than most runs) takes the steps single steps take up to each limit."""
    tpot, c_max, margin, mbt = cfg
    policy = f"sloweave:tpot_s={tpot},c_max={c_max},margin_s={margin},mbt={mbt}"
    specs = [RequestSpec(a, p, o, tpot_slo=s) for a, p, o, s in reqs]
    fast, fast_marks, _ = drive(specs, policy, kv, True, grid)
    slow, slow_marks, none = drive(specs, policy, kv, False, grid)
    assert none == 0
    assert fast_marks == slow_marks
    assert state(fast) == state(slow)


def test_run_until_a_limit_cuts_runs() -> None:
    """The test above is not vacuous: runs are taken, and cut at the grid's limits."""
    specs = [RequestSpec(0.01 * i, 8000 + 97 * i, 30 + 3 * i) for i in range(12)]
    policy = "sloweave:tpot_s=0.015"
    whole, _ = run(specs, policy, None, True)
    fast, fast_marks, in_runs = drive(specs, policy, None, True, 0.011)
    slow, slow_marks, _ = drive(specs, policy, None, False, 0.011)
    assert fast_marks == slow_marks and state(fast) == state(slow)
    assert in_runs > fast.num_steps // 2
    assert len(fast_marks) > 3 * len(specs)  # (most limits are the grid's, inside runs)


def test_chunk_runs_follow_the_policy_and_step_records_set_later() -> None:
    """``run_until`` finds chunk runs again when ``record_steps`` or the policy is set
    after the engine was made: with steps recorded every step is recorded (none taken
    in a run), and a policy without a rule set in sloweave's place gets none."""
    specs = [RequestSpec(0.01 * i, 8000 + 97 * i, 30 + 3 * i) for i in range(6)]
    sim = EngineSim(make_policy("sloweave:tpot_s=0.015"), CM)
    sim.record_steps = True
    replay(sim, specs)
    assert len(sim.steps) == sim.num_steps > 0
    sim = EngineSim(make_policy("sloweave:tpot_s=0.015"), CM)
    sim.policy = make_policy("mbt:2048")
    sim.policy.bind_cost_model(CM)
    taken = 0
    take = sim._chunk_run

    def counted(limit: float) -> bool:
        nonlocal taken
        taken += 1
        return take(limit)

    sim._chunk_run = counted  # type: ignore[method-assign]
    replay(sim, specs)
    assert taken == 0 and sim.num_steps > 0


def test_chunk_runs_take_most_steps() -> None:
    """Long prompts beside a few decodes: most steps go in runs (the test above is not
    vacuous), the same steps."""
    specs = [RequestSpec(0.01 * i, 8000 + 97 * i, 30 + 3 * i) for i in range(12)]
    policy = "sloweave:tpot_s=0.015"
    fast, in_runs = run(specs, policy, None, True)
    slow, _ = run(specs, policy, None, False)
    assert state(fast) == state(slow)
    assert in_runs > fast.num_steps // 2


def test_chunk_runs_stop_before_the_kv_cache_runs_short() -> None:
    """Thirty decodes crossing their blocks at different steps beside one prompt, in a KV
    cache that runs short inside what would be a run: the run stops before the step
    that preempts (KvPool.needed), as stepping does."""
    specs = [RequestSpec(0.0, 10 + 5 * i, 300) for i in range(30)] + \
        [RequestSpec(0.05, 3000, 20)]
    for kv in range(340, 420, 5):
        fast, in_runs = run(specs, "sloweave:tpot_s=0.016", kv, True)
        slow, _ = run(specs, "sloweave:tpot_s=0.016", kv, False)
        assert state(fast) == state(slow), kv
        assert in_runs and fast.num_preemptions


def test_a_rules_price_on_another_cost_model_is_not_the_steps() -> None:
    """A policy bound to another cost model than the engine's (a misprediction study)
    searches on its own, but the engine prices the steps on its own model: its chunk runs
    equal its single steps (the rule's price is read only on the engine's model)."""
    specs = [RequestSpec(0.0, 200, 40), RequestSpec(0.0, 300, 60),
             RequestSpec(0.01, 5000, 5), RequestSpec(0.02, 3000, 8)]
    other = RooflineCostModel("h100-sxm-80gb", "qwen2.5-3b")
    assert other.chunk_pricer()(512, 300, 2, 600) != PRICE(512, 300, 2, 600)
    sims = []
    for runs in (True, False):
        sim = EngineSim(make_policy("sloweave:tpot_s=0.02"), CM)
        sim.policy.bind_cost_model(other)
        sim.recent = deque(maxlen=None)
        sim._chunk_runs = runs and sim._chunk_runs
        replay(sim, specs)
        sims.append(sim)
    assert state(sims[0]) == state(sims[1])  # (an engine trusting any rule's price fails)


def test_chunk_rule_is_decide() -> None:
    """Along runs stepped singly, the rule made at a run's first step gives ``decide``'s
    budget at every step of it wherever either is short of P's prompt left
    (``Policy.chunk_rule``), with the queue behind P (whose prompts ``decide`` counts)
    growing by arrivals."""
    checked = short = 0
    for tpot, c_max in ((0.015, 4096), (0.03, 4096), (0.03, 300)):
        sim = EngineSim(make_policy(f"sloweave:tpot_s={tpot},c_max={c_max}"), CM)
        sim._chunk_runs = False
        sim.add_request(RequestSpec(0.0, 200, 50))
        sim.add_request(RequestSpec(0.0, 200, 80))
        sim.step()
        for p in (6000, 3000, 700, 50):  # (beside two decodes; the rest queued behind)
            sim.add_request(RequestSpec(sim.now, p, 5))
        rule, key = None, None
        while sim.has_work():
            if sim.num_steps % 7 == 0 and len(sim.requests) < 12:
                sim.add_request(RequestSpec(sim.now, 300 + 500 * len(sim.requests), 3))
            view = sim._view()
            head = [r for r in sim.running if r.num_computed_tokens < r.prompt_tokens]
            decodes = [r for r in sim.running if r.num_computed_tokens >= r.prompt_tokens]
            if (len(head) == 1 and decodes
                    and all(r.last_token_time == sim.now for r in decodes)):
                now_key = (tuple(sim.running), head[0])  # (the same but for arrivals)
                if rule is None or key != now_key:  # (a new run: a new rule)
                    rule, key = sim.policy.chunk_rule(view), now_key
                assert rule is not None
                p = head[0]
                left = p.prompt_tokens - p.num_computed_tokens
                dctx = sum(r.num_computed_tokens for r in decodes)
                b, dt = rule(sim.now, p.num_computed_tokens, dctx)
                d = sim.policy.decide(view).prefill_budget
                assert min(b, left) == min(d, left)
                # the step's price, given with every chunk, to the bit
                assert dt == (PRICE(b, p.num_computed_tokens, len(decodes), dctx) if b
                              else 0.0)
                checked += 1
                short += b < left
            else:
                rule = None
            sim.step()
    assert checked > 40 and short > 20


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 30000), min_size=1, max_size=8), st.integers(0, 20000),
       st.integers(1, 30000), st.integers(1, 4096), st.integers(0, 3),
       st.floats(0.5, 5000.0))
def test_chunk_rule_is_decide_at_the_boundary(decodes: list[int], done: int, rest: int,
                                               c: int, n_wait: int, now: float) -> None:
    """On a hand-made view whose budget sits just above the price of chunk ``c`` as
    ``decide`` searches it (its mean decode context, truncated, times the decodes), the
    rule gives ``decide``'s budget (wherever either is short of P's prompt left): a rule
    that priced anything else (the decodes' exact context, say) would miss by one."""
    n = len(decodes)
    dctx = sum(decodes)
    t = CM.chunk_time(done, n, dctx // n * n)(c)
    policy = make_policy(f"sloweave:tpot_s={t + 0.001 + 1e-12!r}")
    policy.bind_cost_model(CM)
    reqs = [dec(i, k, last=now) for i, k in enumerate(decodes)]
    reqs.append(pre(0, done, done + rest))
    reqs.extend(wait(i) for i in range(n_wait))
    v = view(reqs, now)
    rule = policy.chunk_rule(v)
    assert rule is not None
    (b, dt), d = rule(now, done, dctx), policy.decide(v).prefill_budget
    assert min(b, rest) == min(d, rest)
    assert dt == (PRICE(b, done, n, dctx) if b else 0.0)  # (the exact context's price)


def test_a_subclass_that_decides_otherwise_steps_singly() -> None:
    """A rule is taken only from the class whose ``decide`` it mirrors: a subclass with its
    own ``decide`` and the inherited rule gets no chunk runs (nor does a policy without a
    rule); its instances' wrapped ``decide`` (timing) keeps them."""
    sw = make_policy("sloweave")

    class Other(type(sw)):  # type: ignore[misc]
        def decide(self, view):  # type: ignore[no-untyped-def]
            return super().decide(view)

    assert EngineSim(make_policy("sloweave"), CM)._chunk_runs
    assert not EngineSim(Other(sw.config), CM)._chunk_runs
    assert not EngineSim(make_policy("mbt:8192"), CM)._chunk_runs
    wrapped = make_policy("sloweave")
    wrapped.decide = wrapped.decide  # type: ignore[method-assign]
    assert EngineSim(wrapped, CM)._chunk_runs
