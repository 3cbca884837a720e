"""Decision rules of P-PAS (and ppas-auto, P-PAS with parameters derived from the cost
model) and of the static budgets (vLLM's mbt, Sarathi-Serve), on hand-made views."""

from __future__ import annotations

from policy_views import dec, pre, view, wait

from ppas.cost.roofline import RooflineCostModel
from ppas.policies import make_policy
from ppas.policies.auto import PpasAuto, PpasAutoConfig, derive

CM = RooflineCostModel("rtx5090", "qwen2.5-3b")


def test_ppas_caps_under_pressure() -> None:
    p = make_policy("ppas")
    v = view([dec(0), pre(0), wait(0)])
    assert p.decide(v).prefill_budget == 2048


def test_ppas_no_decodes_gives_b_max() -> None:
    p = make_policy("ppas:n_th=2,b_max=16384,b_cap=2048")
    assert p.decide(view([pre(0), wait(0), wait(1)])).prefill_budget == 16384


def test_ppas_below_threshold_gives_b_max() -> None:
    p = make_policy("ppas")
    assert p.decide(view([dec(0), wait(0)])).prefill_budget == 16384


def test_ppas_empty_view() -> None:
    assert make_policy("ppas").decide(view([])).prefill_budget == 16384


def test_ppas_global_budget_is_b_max() -> None:
    assert make_policy("ppas:b_max=8192,b_cap=1024").max_num_batched_tokens == 8192


def test_mbt_fixed() -> None:
    p = make_policy("mbt:2048")
    assert p.max_num_batched_tokens == 2048
    assert p.decide(view([dec(0), wait(0)])).prefill_budget == 2048


def test_sarathi_decodes_count_in_budget() -> None:
    p = make_policy("sarathi:budget=512")
    d = p.decide(view([dec(i) for i in range(10)] + [wait(0)]))
    assert d.prefill_budget == 502 and d.decodes_first
    assert p.max_num_batched_tokens == 512


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
