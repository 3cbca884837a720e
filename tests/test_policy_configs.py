"""Policy config strings: every registered policy parses with its defaults and decides on
any view; bad strings are one-line errors naming the config and the allowed values."""

from __future__ import annotations

import pytest
from policy_views import dec, pre, view, wait

from ppas.core.errors import PpasError
from ppas.policies import make_policy, policy_names


def test_every_registered_policy_parses_with_defaults() -> None:
    for name in policy_names():
        p = make_policy(name)
        assert p.max_num_batched_tokens >= 1
        assert p.decide(view([dec(0), wait(0)])).prefill_budget >= 0


def test_configs_parse() -> None:
    p = make_policy("sloweave:tpot_s=0.01,c_max=2048")
    assert p.config.tpot_s == 0.01 and p.config.c_max == 2048
    assert make_policy("predictive:c_min=256,c_max=8192").max_num_batched_tokens == 8192
    assert make_policy("dlfp:8192").config.target_s == 8192  # positional = first field


@pytest.mark.parametrize("spec,needle", [
    ("nope", "allowed: "),
    ("ppas:b_cap=99999", "b_cap must be in"),
    ("ppas:n_th=0", "n_th must be >= 1"),
    ("ppas:x=1", "ppas.x: unknown key; allowed: n_th, b_max, b_cap"),
    ("ppas:n_th=2,b_max", "expected key=value"),
    ("mbt:abc", "mbt.budget: must be an integer, got 'abc'"),
    ("mbt:0", "budget must be >= 1"),
    ("mbt:1.5", "mbt.budget: must be an integer, got '1.5'"),
    ("ppas:n_th=2,n_th=3", "ppas.n_th: given twice"),
    ("", "empty policy config"),
])
def test_bad_configs(spec: str, needle: str) -> None:
    with pytest.raises(PpasError) as e:
        make_policy(spec)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


@pytest.mark.parametrize("spec, fragment", [
    ("dlfp:c_min=0", "c_min must be >= 1"),
    ("dlfp:c_init=10", "c_init must be in"),
    ("dlfp-completion:target_s=0", "dlfp-completion.target_s: must be in [1e-06, 1e+07] s"),
    ("sloweave:tpot_s=-1", "sloweave.tpot_s: must be in [1e-06, 1e+07] s, got -1.0"),
    # Issue 23: times far below any step and reference prompts beyond any context.
    ("dlfp:target_s=1e-300", "dlfp.target_s: must be in [1e-06, 1e+07] s, got 1e-300"),
    ("sarathi:tbt_slo=1e-300", "sarathi.tbt_slo: must be in [1e-06, 1e+07] s"),
    ("lprs-apc:target_s=1e300", "lprs-apc.target_s: must be in [1e-06, 1e+07] s"),
    ("tbt-ladder:tbt_slo=1e-9", "tbt-ladder.tbt_slo: must be in [1e-06"),
    ("feather:max_wait_s=1e-300", "feather.max_wait_s: must be in [1e-06"),
    ("ppas-auto:ref_prompt=9999999999", "ppas-auto.ref_prompt: must be <= 10000000, got"),
    ("ppas-auto:c_limit=1e18", "ppas-auto.c_limit: must be <= 10000000"),
    ("ppas-auto:ref_outputs=1e12", "ppas-auto.ref_outputs: must be <= 1000000"),
    ("sloweave:mbt=100", "mbt must be >= c_max"),
    ("flowprefill:batch_tokens=0", "batch_tokens must be >= 1"),
    ("lprs-apc:max_concurrent=0", "max_concurrent must be >= 1"),
    ("lprs-apc:c_max=10", "c_max must be >= l_min"),
    ("ppas-auto:max_loss=1.5", "max_loss must be in [0, 1)"),
    ("ppas-auto:c_limit=100", "c_limit must be >= 256"),
    ("predictive:c_min=4096,c_max=1024", "c_max must be >= c_min"),
    ("predictive:bogus=1", "predictive.bogus: unknown key; allowed: "),
    ("predictive:replan=0", "predictive: replan must be >= 1"),
    ("ordered:drain=-1", "ordered: drain must be in [0, 1000]"),
    ("ordered:finish=true", "ordered: finish must be off, gate or burst, got 'true'"),
    ("sloweave:tpot_s=abc", "sloweave.tpot_s: must be a number, got 'abc'"),
    ("dlfp-completion:c_min=0", "dlfp-completion: c_min must be >= 1"),  # its own name
    ("ppas:n_th=0", "ppas: n_th must be >= 1"),
])
def test_config_errors_are_one_line(spec: str, fragment: str) -> None:
    with pytest.raises(PpasError) as e:
        make_policy(spec)
    assert fragment in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", policy_names())
def test_policies_run_without_cost_model_and_on_empty_views(name: str) -> None:
    p = make_policy(name)
    p.bind_cost_model(None)
    for v in (view([]), view([dec(0)]), view([pre(0)]), view([dec(0), pre(0), wait(1)])):
        d = p.decide(v)
        assert 0 <= d.prefill_budget <= p.max_num_batched_tokens
