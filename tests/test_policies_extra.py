"""The seed policies (dlfp, sloweave, flowprefill, lprs-apc) and ours (ppas-auto,
predictive): each rule on hand-made views, edge cases, config errors, and engine
invariants under ``simulate`` on random small traces with a small KV cache."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppas.cost.base import StepShape
from ppas.cost.roofline import RooflineCostModel
from ppas.errors import PpasError
from ppas.policies import make_policy, policy_names
from ppas.policies.auto import PpasAuto, PpasAutoConfig, derive
from ppas.policies.costs import StepCosts, chunk_shape
from ppas.policies.predictive import Predictive, kv_admission_cap, project
from ppas.simulator import EngineConfig, simulate
from ppas.state import RequestSnapshot, SchedulerView, StepRecord
from ppas.step_rules import view_counts
from ppas.workload import RequestSpec

NEW = ("dlfp", "dlfp-completion", "sloweave", "flowprefill", "lprs-apc", "ppas-auto",
       "predictive")
CM = RooflineCostModel("rtx5090", "qwen2.5-3b")


def view(reqs: list[RequestSnapshot], now: float = 10.0, mbt: int = 16384,
         steps: tuple[StepRecord, ...] = ()) -> SchedulerView:
    np_, nd = view_counts(reqs)
    return SchedulerView(now, reqs, np_, nd, mbt, 256, steps)


def dec(i: int, ctx: int = 25000, out: int = 3, last: float | None = 9.99,
        tpot: float | None = None) -> RequestSnapshot:
    return RequestSnapshot(f"d{i}", 0.0, ctx, ctx, out, 32, True, last, None, tpot)


def pre(i: int, done: int = 4096, prompt: int = 25000, arrival: float = 5.0,
        ttft: float | None = None) -> RequestSnapshot:
    return RequestSnapshot(f"p{i}", arrival, prompt, done, 0, 32, True, None, ttft)


def wait(i: int, prompt: int = 25000, arrival: float = 6.0,
         ttft: float | None = None) -> RequestSnapshot:
    return RequestSnapshot(f"w{i}", arrival, prompt, ttft_slo=ttft)


def guarded(budget: int, duration: float, interval: float) -> StepRecord:
    return StepRecord(9.0, duration, interval, budget, budget, 2, 1, 2)


def test_all_new_policies_registered() -> None:
    assert set(NEW) <= set(policy_names())


# --- DLFP ---------------------------------------------------------------------------

def test_dlfp_full_budget_without_decodes() -> None:
    p = make_policy("dlfp:c_max=8192")
    steps = (guarded(1024, 0.2, 0.2),)
    assert p.decide(view([pre(0), wait(1)], steps=steps)).prefill_budget == 8192


def test_dlfp_initial_chunk_without_guarded_history() -> None:
    unguarded = StepRecord(9.0, 0.3, 0.3, 16384, 16384, 0, 1, 0)
    d = make_policy("dlfp:c_init=1024").decide(view([dec(0), pre(0)], steps=(unguarded,)))
    assert d.prefill_budget == 1024


def test_dlfp_proportional_law_and_variants() -> None:
    # Last guarded step: budget 2048, completion-timed 0.1 s, interval 0.025 s; target 0.05.
    steps = (guarded(4096, 0.05, 0.05), guarded(2048, 0.1, 0.025))
    v = view([dec(0), pre(0)], steps=steps)
    assert make_policy("dlfp").decide(v).prefill_budget == 4096  # 2048 * 0.05 / 0.025
    assert make_policy("dlfp-completion").decide(v).prefill_budget == 1024  # 2048 * 0.5


def test_dlfp_clamps() -> None:
    v = view([dec(0), pre(0)], steps=(guarded(2048, 10.0, 10.0),))
    assert make_policy("dlfp:c_min=300").decide(v).prefill_budget == 300
    v = view([dec(0), pre(0)], steps=(guarded(8192, 0.001, 0.001),))
    assert make_policy("dlfp:c_max=9000").decide(v).prefill_budget == 9000


# --- SLOWeave -----------------------------------------------------------------------

def test_sloweave_whole_prompt_without_decodes() -> None:
    p = make_policy("sloweave")
    p.bind_cost_model(CM)
    assert p.decide(view([pre(0)])).prefill_budget == p.max_num_batched_tokens == 32768


def test_sloweave_decode_only_when_deadline_passed() -> None:
    p = make_policy("sloweave:tpot_s=0.025")
    p.bind_cost_model(CM)
    assert p.decide(view([dec(0, last=9.9), pre(0)], now=10.0)).prefill_budget == 0


def test_sloweave_largest_chunk_meeting_deadline() -> None:
    p = make_policy("sloweave:tpot_s=0.08,margin_s=0.002")
    p.bind_cost_model(CM)
    v = view([dec(0, last=10.0), dec(1, last=10.05), pre(0, done=0)], now=10.0)
    c = p.decide(v).prefill_budget
    budget = 0.08 - 0.002  # earliest deadline 10.08

    def t(n: int) -> float:
        return CM.step_time(chunk_shape(n, 0, 2, 2 * 25000))

    assert 0 < c < 4096
    assert t(c) <= budget < t(c + 1)


def test_sloweave_request_slo_overrides_default_and_caps() -> None:
    p = make_policy("sloweave:tpot_s=0.01")
    p.bind_cost_model(CM)
    loose = view([dec(0, last=10.0, tpot=10.0), pre(0, done=0)], now=10.0)
    assert p.decide(loose).prefill_budget == 4096  # C_max
    short = view([dec(0, last=10.0, tpot=10.0), pre(0, done=0, prompt=300)], now=10.0)
    assert p.decide(short).prefill_budget == 300  # L_t


def test_sloweave_model_free_fallback_uses_last_step() -> None:
    p = make_policy("sloweave:tpot_s=0.5,margin_s=0")
    p.bind_cost_model(None)
    # 1014 prefill + 10 decode tokens in 1 s -> 1/1024 s/token -> 512 tokens - 1 decode.
    step = StepRecord(9.0, 1.0, 1.0, 1014, 1014, 10, 1, 10)
    v = view([dec(0, last=10.0), pre(0)], now=10.0, steps=(step,))
    assert p.decide(v).prefill_budget == 511


# --- FlowPrefill ---------------------------------------------------------------------

def test_flowprefill_single_prefill_runs_full_budget() -> None:
    p = make_policy("flowprefill")
    p.bind_cost_model(CM)
    d = p.decide(view([dec(0), pre(0, ttft=1.0)]))
    assert d.prefill_budget == 16384 and d.prefill_order is None


def test_flowprefill_slack_edf_order_and_small_chunks() -> None:
    p = make_policy("flowprefill")
    p.bind_cost_model(CM)
    reqs = [
        pre(0, done=0, arrival=9.0, ttft=0.5),  # deadline 9.5 < now: infeasible, key -1/9.5
        wait(1, prompt=1000, arrival=9.9, ttft=5.0),  # feasible, deadline 14.9
        wait(2, prompt=1000, arrival=9.95, ttft=1.0),  # feasible, deadline 10.95 (EDF first)
        wait(3, prompt=1000, arrival=9.0),  # no SLO
        wait(4, prompt=25000, arrival=9.5, ttft=0.6),  # deadline 10.1, prefill > 0.1 s: -1/10.1
    ]
    d = p.decide(view(reqs, now=10.0))
    # sign(slack) / deadline, descending: EDF among feasible, then no-SLO (key 0), then
    # infeasible ones (the later deadline first, as the formula orders them).
    assert d.prefill_order == ("w2", "w1", "w3", "w4", "p0")
    assert d.prefill_budget == 2048


# --- LPRS + APC ----------------------------------------------------------------------

def test_lprs_chunk_minimises_asymmetric_penalty() -> None:
    p = make_policy("lprs-apc:target_s=0.1,under_w=1,over_w=4")
    p.bind_cost_model(CM)
    v = view([dec(0), pre(0, done=0, prompt=100000)])
    c = p.decide(v).prefill_budget

    def pen(n: int) -> float:
        t = CM.step_time(chunk_shape(n, 0, 1, 25000))
        return 0.1 - t if t < 0.1 else 4 * (t - 0.1)

    assert pen(c) == min(pen(n) for n in (256, 512, 1024, 2048, 4096, 8192))


def test_apc_caps_concurrency_and_ages() -> None:
    p = make_policy("lprs-apc:max_concurrent=1,rem_weight=0")
    p.bind_cost_model(CM)
    v = view([dec(0), wait(1, prompt=300, arrival=9.0), wait(2, prompt=300, arrival=5.0)])
    d = p.decide(v)
    assert d.prefill_order == ("w2",)  # oldest first
    assert d.prefill_budget == 300  # only the one admitted prefill's tokens


def test_apc_remaining_work_weighs_against_age() -> None:
    p = make_policy("lprs-apc:max_concurrent=1,rem_weight=1")
    p.bind_cost_model(CM)
    # The old request has 100k tokens left (seconds of prefill); the young one 100 tokens.
    v = view([dec(0), wait(1, prompt=100000, arrival=9.0), wait(2, prompt=100, arrival=9.5)])
    assert p.decide(v).prefill_order == ("w2",)


# --- ppas-auto -----------------------------------------------------------------------

def test_ppas_auto_reproduces_paper_values_on_its_setup() -> None:
    assert derive(CM, PpasAutoConfig(), 32768) == (2, 2048, 16384)


def test_ppas_auto_rows_follow_prompt_length() -> None:
    p = make_policy("ppas-auto")
    assert isinstance(p, PpasAuto)
    p.bind_cost_model(CM)
    long_row = p.params_for(view([dec(0), pre(0, prompt=32768), wait(1, prompt=32768)]))
    short_row = p.params_for(view([dec(0), pre(0, prompt=512, done=0), wait(1, prompt=512)]))
    assert long_row == derive(CM, PpasAutoConfig(), 32768)
    assert short_row == derive(CM, PpasAutoConfig(), 512)
    assert short_row[2] <= long_row[2]  # short prompts: a smaller efficient chunk


def test_ppas_auto_rule_and_unbound_defaults() -> None:
    p = make_policy("ppas-auto")  # not bound: the paper's values
    assert p.decide(view([dec(0), pre(0), wait(1)])).prefill_budget == 2048
    assert p.decide(view([dec(0), pre(0)])).prefill_budget == 16384
    assert p.decide(view([])).prefill_budget == 16384


# --- predictive ----------------------------------------------------------------------

def test_predictive_no_decodes_and_empty_view_take_c_max() -> None:
    p = make_policy("predictive")
    p.bind_cost_model(CM)
    assert p.decide(view([])).prefill_budget == 16384
    assert p.decide(view([pre(0), wait(1), wait(2)])).prefill_budget == 16384


def test_predictive_without_cost_model_falls_back_to_ppas() -> None:
    p = make_policy("predictive")
    p.bind_cost_model(None)
    assert p.decide(view([dec(0), pre(0), wait(1)])).prefill_budget == 2048
    assert p.decide(view([dec(0), pre(0)])).prefill_budget == 16384


def test_predictive_choice_is_the_projection_argmin() -> None:
    p = make_policy("predictive")
    assert isinstance(p, Predictive)
    p.bind_cost_model(CM)
    assert p.costs is not None
    v = view([dec(0, out=3), dec(1, out=20), pre(0), wait(1), wait(2)])
    queue = [(4096, 25000, 32), (0, 25000, 32), (0, 25000, 32)]
    decs = [(29, 25000), (12, 25000)]
    rate = 4 / 10.0  # 5 requests in the view, the oldest arrived at 0, now = 10
    scores = {a: project(p.costs, a, 16384, queue, decs, arrival_rate=rate)
              for a in p.candidates}
    assert p.decide(v).prefill_budget == min(scores, key=lambda a: scores[a])


def test_projection_charges_future_arrivals_for_the_busy_period() -> None:
    costs = StepCosts(CM, (2048,))
    t = CM.prefill_time(32768, 2048)  # busy period of a lone chunk-aligned prompt
    got = project(costs, 2048, 2048, [(0, 32768, 1)], [], arrival_rate=0.5)
    assert got == pytest.approx(t + 0.5 * 0.5 * t * t, rel=1e-9)


def test_projection_of_a_lone_prompt_is_its_prefill_time() -> None:
    # Exact on chunk-aligned prompts (a partial last chunk is interpolated in the table).
    costs = StepCosts(CM, (2048, 16384))
    got = project(costs, 2048, 16384, [(0, 32768, 1)], [])
    assert got == pytest.approx(CM.prefill_time(32768, 16384), rel=1e-9)
    got = project(costs, 2048, 16384, [(0, 25000, 1)], [])
    assert got == pytest.approx(CM.prefill_time(25000, 16384), rel=0.05)


def test_projection_decode_only_sum() -> None:
    costs = StepCosts(CM, (2048,))
    # Two decodes (3 and 5 steps left), no prompt: decode-only steps, linearised.
    w = costs.dec_base + 2 * costs.dec_alone + 2 * costs.dec_kv * 1000
    w1 = costs.dec_base + costs.dec_alone + costs.dec_kv * 1000
    got = project(costs, 0, 2048, [], [(3, 1000), (5, 1000)])
    assert got == pytest.approx(3 * w + (3 * w + 2 * w1), rel=1e-9)


def test_predictive_protects_many_decodes_and_finishes_lone_prompt() -> None:
    p = make_policy("predictive")
    p.bind_cost_model(CM)
    many = [dec(i, out=1) for i in range(8)] + [pre(0), wait(1), wait(2), wait(3)]
    assert p.decide(view(many)).prefill_budget < 16384
    # One decode with 31 tokens to go and one short prompt: finish the prompt in one step
    # rather than hold it for 31 decode-only steps.
    assert p.decide(view([dec(0, out=1), pre(0, done=0, prompt=2000)])).prefill_budget >= 2000
    # ... but a decode on its last token goes first (a shortest-remaining-first effect).
    assert p.decide(view([dec(0, out=31), pre(0, done=0, prompt=2000)])).prefill_budget == 0


def test_kv_admission_cap_admits_only_what_fits() -> None:
    running = [dec(0, ctx=1000), pre(0, done=500, prompt=1000)]  # 2 x (1000 + 32 + 16)
    reqs = [*running, wait(1, prompt=1000), wait(2, prompt=1000)]
    v = view(reqs)
    assert kv_admission_cap(v, 10_000, 16384) == 500 + 1000 + 1000  # both waiting fit
    assert kv_admission_cap(v, 2 * 1048 + 1048, 16384) == 500 + 1000  # only the first
    assert kv_admission_cap(v, 2 * 1048, 16384) == 500  # running prefill only
    assert kv_admission_cap(v, 10_000, 700) == 700  # never above the budget
    idle = view([wait(1, prompt=5000)])
    assert kv_admission_cap(idle, 1000, 2048) == 2048  # an idle engine admits its head


def test_predictive_kv_guard_needs_a_capacity() -> None:
    p = make_policy("predictive")
    p.bind_cost_model(CM)
    assert isinstance(p, Predictive) and p.kv_capacity == CM.kv_capacity_tokens
    assert p.kv_capacity is not None
    # Nothing running, three waiting prompts, capacity for about one and a half of them.
    v = view([wait(i, prompt=p.kv_capacity * 2 // 3) for i in range(3)])
    assert p.decide(v).prefill_budget == 16384  # the first prompt alone exceeds the budget
    small = view([dec(0, ctx=p.kv_capacity * 2 // 3), wait(1, prompt=p.kv_capacity // 2)])
    assert p.decide(small).prefill_budget == 0  # the waiting one cannot finish: hold it


def test_step_costs_table_matches_cost_model() -> None:
    costs = StepCosts(CM, (2048,))
    exact = CM.prefill_time(8192, 2048)
    assert costs.prefill_time(2048, 0, 8192) == pytest.approx(exact, rel=1e-12)
    assert costs.prefill_time(2048, 4096, 8192) == pytest.approx(
        sum(CM.step_time(chunk_shape(2048, p)) for p in (4096, 6144)), rel=1e-12)
    one = CM.step_time(StepShape(0, 0, 0.0, 0, 1, 0))
    assert costs.dec_base + costs.dec_alone == pytest.approx(one, rel=1e-9)


# --- edge cases shared by all ---------------------------------------------------------

@pytest.mark.parametrize("name", NEW)
def test_policies_run_without_cost_model_and_on_empty_views(name: str) -> None:
    p = make_policy(name)
    p.bind_cost_model(None)
    for v in (view([]), view([dec(0)]), view([pre(0)]), view([dec(0), pre(0), wait(1)])):
        d = p.decide(v)
        assert 0 <= d.prefill_budget <= p.max_num_batched_tokens


@pytest.mark.parametrize("spec, fragment", [
    ("dlfp:c_min=0", "c_min must be >= 1"),
    ("dlfp:c_init=10", "c_init must be in"),
    ("dlfp-completion:target_s=0", "target_s must be > 0"),
    ("sloweave:tpot_s=-1", "tpot_s must be > 0"),
    ("sloweave:mbt=100", "mbt must be >= c_max"),
    ("flowprefill:batch_tokens=0", "batch_tokens must be >= 1"),
    ("lprs-apc:max_concurrent=0", "max_concurrent must be >= 1"),
    ("lprs-apc:c_max=10", "c_max must be >= l_min"),
    ("ppas-auto:max_loss=1.5", "max_loss must be in [0, 1)"),
    ("ppas-auto:c_limit=100", "c_limit must be >= 256"),
    ("predictive:c_min=4096,c_max=1024", "c_max must be >= c_min"),
    ("predictive:bogus=1", "unknown parameter 'bogus'"),
    ("sloweave:tpot_s=abc", "not a valid float"),
])
def test_config_errors_are_one_line(spec: str, fragment: str) -> None:
    with pytest.raises(PpasError) as e:
        make_policy(spec)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_configs_parse() -> None:
    p = make_policy("sloweave:tpot_s=0.01,c_max=2048")
    assert p.config.tpot_s == 0.01 and p.config.c_max == 2048
    assert make_policy("predictive:c_min=256,c_max=8192").max_num_batched_tokens == 8192
    assert make_policy("dlfp:8192").config.target_s == 8192  # positional = first field


# --- engine invariants under simulate -------------------------------------------------

SMALL = RooflineCostModel("rtx5090", "qwen2.5-0.5b")
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
       name=st.sampled_from(NEW))
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
