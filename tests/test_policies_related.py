"""The related-work policies as we read them (DLFP, SLOWeave, FlowPrefill, LPRS + APC):
each rule on hand-made views."""

from __future__ import annotations

from policy_views import dec, guarded, pre, view, wait

from ppas.core.view import StepRecord
from ppas.cost.base import StepShape
from ppas.cost.roofline import RooflineCostModel
from ppas.policies import make_policy
from ppas.policies.base import last_prefill_token_time

CM = RooflineCostModel("rtx5090", "qwen2.5-3b")


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
        return CM.step_time(StepShape.one_chunk(n, 0, 2, 2 * 25000))

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


def test_flowprefill_single_prefill_runs_full_budget() -> None:
    p = make_policy("flowprefill")
    p.bind_cost_model(CM)
    d = p.decide(view([dec(0), pre(0, ttft=1.0)]))
    assert d.prefill_budget == 16384 and d.prefill_order is None


def test_flowprefill_slack_edf_order_and_small_chunks() -> None:
    p = make_policy("flowprefill")
    p.bind_cost_model(CM)
    reqs = [
        # (10 tokens left: the step can admit waiting ones, so they are listed)
        pre(0, done=24990, arrival=9.0, ttft=0.5),  # deadline 9.5 < now: infeasible, -1/9.5
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


def test_lprs_chunk_minimises_asymmetric_penalty() -> None:
    p = make_policy("lprs-apc:target_s=0.1,under_w=1,over_w=4")
    p.bind_cost_model(CM)
    v = view([dec(0), pre(0, done=0, prompt=100000)])
    c = p.decide(v).prefill_budget

    def pen(n: int) -> float:
        t = CM.step_time(StepShape.one_chunk(n, 0, 1, 25000))
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


def test_last_prefill_token_time_reads_the_latest_prefill_step() -> None:
    decode_only = StepRecord(9.5, 0.01, 0.01, 0, 0, 4, 0, 4)
    untimed = StepRecord(9.6, 0.0, 0.0, 512, 512, 0, 1, 0)
    steps = (guarded(1024, 0.05, 0.05), guarded(2046, 0.1, 0.1), decode_only, untimed)
    assert last_prefill_token_time(steps) == 0.1 / 2048  # decode tokens count too
    assert last_prefill_token_time((decode_only, untimed)) is None
    assert last_prefill_token_time(()) is None


def test_model_based_policies_keep_the_bound_cost_model() -> None:
    for spec in ("sloweave", "lprs-apc", "tbt-ladder"):
        p = make_policy(spec)
        assert p.cost_model is None
        p.bind_cost_model(CM)
        assert p.cost_model is CM
        p.bind_cost_model(None)
        assert p.cost_model is None
