"""``tbt-ladder``'s chunk rule (``TbtLadder.chunk_rule``): runs taken with it are the steps
``step()`` takes one at a time (every step's record, every request's times and blocks, the
gaps), and the rule is ``decide`` on every view of a run."""

from __future__ import annotations

from chunk_run_engines import engine, state
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_views import dec, pre, view

from ppas.cost.roofline import RooflineCostModel
from ppas.engine.simulator import EngineSim, replay
from ppas.policies import make_policy
from ppas.workload import RequestSpec

CM = RooflineCostModel("h200", "qwen2.5-3b")


def run(specs: list[RequestSpec], policy: str, kv: int | None, runs: bool,
        mbt: int | None = None) -> tuple[EngineSim, int]:
    """``specs`` replayed with every step's record kept, chunk runs on or off; also the
    steps taken in chunk runs."""
    sim, counter = engine(policy, CM, kv, runs, mbt)
    replay(sim, specs)
    return sim, counter.steps


workloads = st.lists(st.tuples(st.floats(0, 1), st.integers(1, 6000), st.integers(1, 60)),
                     min_size=1, max_size=20)
configs = st.tuples(st.sampled_from([0.008, 0.012, 0.02, 0.05]),
                    st.sampled_from(["2048/1024/512/256/128", "300/77", "4096/1000/10",
                                     "/".join(str(c) for c in range(4096, 0, -37))]),
                    st.sampled_from([None, 2048]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads, configs, st.one_of(st.none(), st.integers(40, 800), st.integers(250, 1500)))
def test_ladder_chunk_runs_equal_single_steps(reqs: list[tuple[float, int, int]],
                                              cfg: tuple[float, str, int | None],
                                              kv: int | None) -> None:
    """Random arrivals, ladders, SLOs (some no rung fits: the smallest chunk), an engine
    budget below the policy's, KV caches that run short (preemption)."""
    slo, chunks, mbt = cfg
    policy = f"tbt-ladder:tbt_slo={slo},chunks={chunks}"
    specs = [RequestSpec(a, p, o) for a, p, o in reqs]
    fast, _ = run(specs, policy, kv, True, mbt)
    slow, none = run(specs, policy, kv, False, mbt)
    assert none == 0
    assert state(fast) == state(slow)


def test_ladder_chunk_runs_take_most_steps() -> None:
    """Long prompts beside a few decodes: most steps go in runs (the test above is not
    vacuous), the same steps."""
    specs = [RequestSpec(0.01 * i, 8000 + 97 * i, 30 + 3 * i) for i in range(12)]
    for slo in (0.012, 0.03):
        policy = f"tbt-ladder:tbt_slo={slo}"
        fast, in_runs = run(specs, policy, None, True)
        slow, _ = run(specs, policy, None, False)
        assert state(fast) == state(slow)
        assert in_runs >= fast.num_steps // 2, (slo, in_runs, fast.num_steps)


def test_ladder_chunk_rule_is_decide() -> None:
    """Along runs stepped singly, the rule made at a run's first step gives ``decide``'s
    budget at every step of it (the queue behind P growing by arrivals), whatever the
    search's guess left by the steps before."""
    checked = 0
    fine = "/".join(str(c) for c in range(4096, 0, -37))  # (rungs close: a change shows)
    for slo in (0.008, 0.015, 0.05):
        sim = EngineSim(make_policy(f"tbt-ladder:tbt_slo={slo},chunks={fine}"), CM)
        sim._chunk_runs = False
        sim.add_request(RequestSpec(0.0, 200, 50))
        sim.add_request(RequestSpec(0.0, 200, 80))
        sim.step()
        for p in (6000, 3000, 700, 50):
            sim.add_request(RequestSpec(sim.now, p, 5))
        rule, key = None, None
        while sim.has_work():
            if sim.num_steps % 7 == 0 and len(sim.requests) < 12:
                sim.add_request(RequestSpec(sim.now, 300 + 500 * len(sim.requests), 3))
            view = sim._view()
            head = [r for r in sim.running if r.num_computed_tokens < r.prompt_tokens]
            decodes = [r for r in sim.running if r.num_computed_tokens >= r.prompt_tokens]
            if len(head) == 1 and decodes:
                now_key = (tuple(sim.running), head[0])
                if rule is None or key != now_key:
                    rule, key = sim.policy.chunk_rule(view), now_key
                assert rule is not None
                p = head[0]
                dctx = sum(r.num_computed_tokens for r in decodes)
                guess = sim.policy._last
                b, dt = rule(sim.now, p.num_computed_tokens, dctx)
                assert dt == 0.0  # (unpriced)
                sim.policy._last = guess
                assert b == sim.policy.decide(view).prefill_budget
                checked += 1
            else:
                rule = None
            sim.step()
    assert checked > 50


def test_no_rule_without_a_cost_model_or_decodes() -> None:
    p = make_policy("tbt-ladder")
    sim = EngineSim(p, CM)
    sim.add_request(RequestSpec(0.0, 3000, 5))
    assert p.chunk_rule(sim._view()) is None  # (no decode running)
    p.cost_model = None
    assert p.chunk_rule(sim._view()) is None


def test_ladder_chunk_rule_at_a_rungs_exact_price() -> None:
    """Hand-made views whose SLO is exactly a rung's price at the decodes' summed context:
    ``decide`` and the rule both take that rung (``<=``), and a rule that priced the
    decodes even one token further on would drop to the next."""
    for ctxs, done in (([3000, 5000], 4096), ([100] * 7, 0), ([20000], 12345)):
        reqs = [dec(i, c) for i, c in enumerate(ctxs)] + [pre(0, done)]
        n, dctx = len(ctxs), sum(ctxs)
        for rung in (2048, 512, 128):
            slo = CM.chunk_time(done, n, dctx)(rung)
            p = make_policy(f"tbt-ladder:tbt_slo={slo!r}")
            p.bind_cost_model(CM)
            v = view(reqs)
            rule = p.chunk_rule(v)
            assert rule is not None
            assert p.decide(v).prefill_budget == rung
            assert rule(v.now, done, dctx)[0] == rung
