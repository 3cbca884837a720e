"""Simulator semantics and invariants (hypothesis over random workloads and policies)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppas.core.errors import PpasError
from ppas.cost.base import CostModel, StepShape
from ppas.cost.roofline import RooflineCostModel
from ppas.engine.simulator import EngineConfig, simulate
from ppas.engine.solo import lower_bound_latency
from ppas.policies import make_policy, policy_names
from ppas.workload import RequestSpec, phase_trace


class ConstantCost(CostModel):
    """1 ms per step + 1 us per token: makes timings easy to check by hand."""

    def step_time(self, step: StepShape) -> float:
        return 1e-3 + 1e-6 * step.num_tokens


def test_single_request_timeline() -> None:
    # 100-token prompt at budget 40: chunks 40, 40, 20 -> first token at the end of step 3.
    trace = [RequestSpec(0.0, 100, 4)]
    res = simulate(trace, make_policy("mbt:40"), ConstantCost(), record_steps=True)
    r = res.requests[0]
    assert [s.num_prefill_tokens for s in res.steps] == [40, 40, 20, 0, 0, 0]
    assert [s.num_decode_tokens for s in res.steps] == [0, 0, 0, 1, 1, 1]
    steps = [1e-3 + 1e-6 * n for n in (40, 40, 20, 1, 1, 1)]
    assert math.isclose(r.first_token_time, sum(steps[:3]))
    assert math.isclose(r.finish_time, sum(steps))
    m = res.request_metrics()[0]
    assert math.isclose(m.tpot, sum(steps[3:]) / 3)


def test_running_before_waiting_fcfs() -> None:
    # Two requests; the second arrives while the first prefills: it only gets leftovers.
    trace = [RequestSpec(0.0, 100, 2), RequestSpec(0.0005, 50, 2)]
    res = simulate(trace, make_policy("mbt:64"), ConstantCost(), record_steps=True)
    # Step 2: the running prefill takes its last 36 tokens first, the newcomer the other 28.
    assert [s.num_prefill_tokens for s in res.steps][:3] == [64, 64, 22]
    assert [s.num_decode_tokens for s in res.steps][:3] == [0, 0, 1]
    a, b = res.requests
    assert a.first_token_time < b.first_token_time


def test_ppas_cap_applies_in_both_loops() -> None:
    # Decodes running + 2 pending prefills -> the prefill tokens of the step are capped.
    trace = [RequestSpec(0.0, 64, 40), RequestSpec(0.01, 20000, 2), RequestSpec(0.01, 20000, 2)]
    res = simulate(trace, make_policy("ppas:n_th=2,b_max=4096,b_cap=256"), ConstantCost(),
                   record_steps=True)
    pressured = [s for s in res.steps if s.pending_prefills >= 2 and s.running_decodes > 0]
    assert pressured and all(s.num_prefill_tokens <= 256 for s in pressured)
    idle = [s for s in res.steps if s.running_decodes == 0 and s.num_prefill_tokens > 0]
    assert any(s.num_prefill_tokens > 256 for s in idle)


def test_preemption_recomputes_and_finishes() -> None:
    # KV for both prompts (2 x 19 blocks of 45) but not for both outputs: as they grow,
    # the later one is preempted and recomputed; both finish. (vLLM admits a request only
    # when its whole sequence so far fits, so the preemption comes from decode growth.)
    trace = [RequestSpec(0.0, 300, 200), RequestSpec(0.0, 300, 200)]
    res = simulate(trace, make_policy("mbt:512"), ConstantCost(),
                   EngineConfig(num_kv_blocks=45), record_steps=True)
    assert all(r.finish_time is not None for r in res.requests)
    assert res.num_preemptions > 0
    assert max(s.kv_blocks_used for s in res.steps) <= 45


def test_request_too_large_for_kv_fails_cleanly() -> None:
    res = simulate([RequestSpec(0.0, 10_000, 2), RequestSpec(0.1, 100, 2)],
                   make_policy("mbt:512"), ConstantCost(), EngineConfig(num_kv_blocks=20))
    assert res.requests[0].failed and res.requests[1].finish_time is not None
    assert res.summary()["failed"] == 1


def test_lower_bound_below_every_policy() -> None:
    cm = RooflineCostModel("rtx5090", "qwen2.5-3b")
    trace = phase_trace("10:0.2,10:1.0,10:0.2", 0)
    lb = sum(lower_bound_latency(s, cm) for s in trace) / len(trace)
    for c in ("mbt:512", "mbt:2048", "mbt:16384", "ppas"):
        assert simulate(trace, make_policy(c), cm).summary()["avg_latency"] >= lb * 0.999


def test_crossover_on_paper_workload() -> None:
    """The paper's finding (§2): 16k beats 2k at low load, 2k beats 16k at high load."""
    cm16 = RooflineCostModel("rtx5090", "qwen2.5-3b", max_num_batched_tokens=16384)
    cm2 = RooflineCostModel("rtx5090", "qwen2.5-3b", max_num_batched_tokens=2048)

    def e2e(cfg: str, cm: CostModel, burst: float) -> float:
        vals = [simulate(phase_trace("10:0.2,10:{burst},10:0.2,10:{burst},10:0.2", s,
                                     burst=burst), make_policy(cfg), cm).summary()["avg_latency"]
                for s in range(5)]
        return sum(vals) / len(vals)

    assert e2e("mbt:16384", cm16, 0.4) < e2e("mbt:2048", cm2, 0.4)
    assert e2e("mbt:2048", cm2, 1.4) < e2e("mbt:16384", cm16, 1.4)


SMALL = RooflineCostModel("l40s", "qwen2.5-0.5b")


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[RequestSpec], str, int]:
    n = draw(st.integers(1, 10))
    # the clients' max_tokens: none (the cap is the length) or a cap some stop before
    loose = draw(st.booleans())
    reqs = []
    for _ in range(n):
        o = draw(st.integers(1, 12))
        max_tokens = o + draw(st.integers(0, 30)) if loose else None
        reqs.append(RequestSpec(draw(st.floats(0, 2)), draw(st.integers(1, 3000)), o,
                                max_tokens=max_tokens))
    b = draw(st.sampled_from([16, 64, 256, 1024, 4096]))
    cap = draw(st.integers(1, b))
    name = draw(st.sampled_from(policy_names()))
    spec = {"mbt": f"mbt:{b}", "ppas": f"ppas:n_th={draw(st.integers(1, 4))},b_max={b},b_cap={cap}",
            "sarathi": f"sarathi:budget={b}"}.get(name, name)
    need = max(-(-(r.prompt_tokens + (r.max_tokens or r.output_tokens)) // 16) for r in reqs)
    blocks = need + draw(st.integers(0, 400))
    return reqs, spec, blocks


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_invariants(w: tuple[list[RequestSpec], str, int]) -> None:
    reqs, spec, blocks = w
    pol = make_policy(spec)
    res = simulate(reqs, pol, SMALL, EngineConfig(num_kv_blocks=blocks), record_steps=True)
    mbt = pol.max_num_batched_tokens
    for s in res.steps:
        assert s.num_prefill_tokens <= s.prefill_budget  # policy cap enforced
        assert s.num_tokens <= mbt  # global budget
        assert s.kv_blocks_used <= blocks  # KV never over capacity
        # Decodes are never dropped by the policy: only the global budget or a
        # preemption can leave a running decode out of a step.
        assert (s.num_decode_reqs >= s.running_decodes or s.num_preempted > 0
                or s.num_tokens >= mbt)
    # Every request finishes, with all its output tokens (where it stops, at or before its
    # cap), after it arrived.
    for r in res.requests:
        assert r.failed is None and r.finish_time is not None
        assert r.num_output_tokens == r.output_len <= r.max_output_tokens
        assert r.arrival_time <= r.first_token_time <= r.finish_time


def test_model_that_does_not_fit_is_a_clear_error() -> None:
    import pytest

    from ppas.core.errors import PpasError
    from ppas.cost.catalog import Hardware

    with pytest.raises(PpasError, match="leaves no KV cache .* raise --tp"):
        RooflineCostModel(Hardware("tiny-gpu", 100.0, 500.0, 8.0), "qwen3-8b")
    # Tensor parallelism splits the weights: the same model fits on two of them.
    assert RooflineCostModel(Hardware("tiny-gpu", 100.0, 500.0, 16.0), "qwen3-8b",
                             tp=2).kv_capacity_tokens > 0


BLOCK = 16
request = st.tuples(
    st.floats(0.0, 2.0, allow_nan=False),
    st.integers(1, 3000),
    st.integers(1, 8),
    st.one_of(st.none(), st.floats(0.05, 2.0)),
    st.one_of(st.none(), st.floats(0.005, 0.1)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(request, min_size=1, max_size=8), extra_blocks=st.integers(0, 200),
       name=st.sampled_from(policy_names()))
def test_engine_invariants_with_each_policy(reqs: list[tuple[float, int, int, float | None,
                                                             float | None]],
                                            extra_blocks: int, name: str) -> None:
    specs = [RequestSpec(a, p, o, ttft, tpot) for a, p, o, ttft, tpot in reqs]
    biggest = max(math.ceil((s.prompt_tokens + s.output_tokens) / BLOCK) for s in specs)
    blocks = biggest + extra_blocks  # every request fits alone; several may not
    policy = make_policy(name)
    res = simulate(specs, policy, SMALL, EngineConfig(num_kv_blocks=blocks, max_num_seqs=4),
                   record_steps=True)
    mbt = policy.max_num_batched_tokens
    for s in res.steps:
        assert s.num_prefill_tokens <= s.prefill_budget
        assert s.num_tokens <= mbt
        assert s.kv_blocks_used <= blocks
        if s.running_decodes and not s.num_preempted:
            assert s.num_decode_tokens >= 1  # a policy never stalls running decodes
    for r in res.requests:
        assert r.failed is None and r.finish_time is not None
        assert r.num_output_tokens == r.max_output_tokens


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.floats(0, 5), st.integers(1, 6000), st.integers(1, 60),
                          st.integers(0, 200)), min_size=1, max_size=30),
       st.sampled_from(["vllm", "vllm:mbt=2048", "vllm:mbt=512,max_num_seqs=8"]),
       st.sampled_from([None, 400]))
def test_stock_vllm_never_reads_max_tokens(
        reqs: list[tuple[float, int, int, int]], spec: str, kv_blocks: int | None) -> None:
    """vLLM's scheduler admits and preempts on the tokens a request holds, never on its
    ``max_tokens``: a stock setting's run is the same, request by request, whether the
    caps are the lengths or caps the requests stop before (``RequestSpec.max_tokens``)."""
    cm = RooflineCostModel("rtx5090", "qwen2.5-3b")
    engine = EngineConfig(num_kv_blocks=kv_blocks)
    exact = [RequestSpec(a, p, o) for a, p, o, _ in sorted(reqs)]
    capped = [RequestSpec(a, p, o, max_tokens=o + extra) for a, p, o, extra in sorted(reqs)]

    def times(specs: list[RequestSpec]) -> list[tuple[object, ...]]:
        res = simulate(specs, make_policy(spec), cm, engine)
        return [(r.first_token_time, r.finish_time, r.num_output_tokens, r.num_preemptions,
                 r.failed) for r in res.requests]

    assert times(exact) == times(capped)


def test_vllms_default_max_tokens_is_the_context_left() -> None:
    """``max_tokens=0`` (the client sent none): vLLM's default, ``max_model_len`` less the
    prompt; the request still stops at its own length, and one whose length would pass
    the context stops at its end."""
    cm = RooflineCostModel("rtx5090", "qwen2.5-3b")
    reqs = [RequestSpec(0.0, 1000, 20, max_tokens=0), RequestSpec(0.0, 3000, 5000, max_tokens=0)]
    res = simulate(reqs, make_policy("vllm"), cm, EngineConfig(max_model_len=4096))
    a, b = res.requests
    assert (a.max_output_tokens, a.output_len, a.num_output_tokens) == (3096, 20, 20)
    assert (b.max_output_tokens, b.output_len, b.num_output_tokens) == (1096, 1096, 1096)
    assert not a.failed and not b.failed
    with pytest.raises(PpasError, match="give the engine a max_model_len"):
        simulate(reqs[:1], make_policy("vllm"), cm, EngineConfig())  # no context to fill
