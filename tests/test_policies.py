"""Decision rules of the core policies and config-string parsing."""

from __future__ import annotations

import pytest

from ppas.errors import PpasError
from ppas.policies import make_policy, policy_names
from ppas.state import RequestSnapshot, SchedulerView
from ppas.step_rules import view_counts


def view(reqs: list[RequestSnapshot], mbt: int = 16384) -> SchedulerView:
    np_, nd = view_counts(reqs)
    return SchedulerView(0.0, reqs, np_, nd, mbt, 256)


def running_decode(i: int) -> RequestSnapshot:
    return RequestSnapshot(f"d{i}", 0.0, 100, 100, 3, 32, True)


def running_prefill(i: int) -> RequestSnapshot:
    return RequestSnapshot(f"p{i}", 0.0, 25000, 4096, 0, 32, True)


def waiting(i: int) -> RequestSnapshot:
    return RequestSnapshot(f"w{i}", 1.0, 25000)


def test_ppas_caps_under_pressure() -> None:
    p = make_policy("ppas")
    v = view([running_decode(0), running_prefill(0), waiting(0)])
    assert p.decide(v).prefill_budget == 2048


def test_ppas_no_decodes_gives_b_max() -> None:
    p = make_policy("ppas:n_th=2,b_max=16384,b_cap=2048")
    assert p.decide(view([running_prefill(0), waiting(0), waiting(1)])).prefill_budget == 16384


def test_ppas_below_threshold_gives_b_max() -> None:
    p = make_policy("ppas")
    assert p.decide(view([running_decode(0), waiting(0)])).prefill_budget == 16384


def test_ppas_counts_running_and_waiting_prefills() -> None:
    # One running prefill + one waiting request = N_p 2 >= N_th 2 (the paper counts both).
    p = make_policy("ppas")
    v = view([running_decode(0), running_prefill(0), waiting(0)])
    assert v.num_pending_prefills == 2 and v.num_running_decodes == 1
    assert p.decide(v).prefill_budget == 2048
    p3 = make_policy("ppas:n_th=3")
    assert p3.decide(v).prefill_budget == 16384


def test_ppas_empty_view() -> None:
    assert make_policy("ppas").decide(view([])).prefill_budget == 16384


def test_ppas_global_budget_is_b_max() -> None:
    assert make_policy("ppas:b_max=8192,b_cap=1024").max_num_batched_tokens == 8192


def test_mbt_fixed() -> None:
    p = make_policy("mbt:2048")
    assert p.max_num_batched_tokens == 2048
    assert p.decide(view([running_decode(0), waiting(0)])).prefill_budget == 2048


def test_sarathi_decodes_count_in_budget() -> None:
    p = make_policy("sarathi:budget=512")
    d = p.decide(view([running_decode(i) for i in range(10)] + [waiting(0)]))
    assert d.prefill_budget == 502 and d.decodes_first
    assert p.max_num_batched_tokens == 512


@pytest.mark.parametrize("spec,needle", [
    ("nope", "allowed: "),
    ("ppas:b_cap=99999", "b_cap must be in"),
    ("ppas:n_th=0", "n_th must be >= 1"),
    ("ppas:x=1", "unknown parameter 'x'; allowed: n_th, b_max, b_cap"),
    ("ppas:n_th=2,b_max", "expected key=value"),
    ("mbt:abc", "not a valid int"),
    ("mbt:0", "budget must be >= 1"),
    ("mbt:1.5", "not a valid int"),
    ("ppas:n_th=2,n_th=3", "given twice"),
    ("", "empty policy config"),
])
def test_bad_configs(spec: str, needle: str) -> None:
    with pytest.raises(PpasError) as e:
        make_policy(spec)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


def test_every_registered_policy_parses_with_defaults() -> None:
    for name in policy_names():
        p = make_policy(name)
        assert p.max_num_batched_tokens >= 1
        assert p.decide(view([running_decode(0), waiting(0)])).prefill_budget >= 0


def test_enforced_budget_liveness() -> None:
    from ppas.policies import Decision
    from ppas.step_rules import enforced_budget

    idle = view([waiting(0)])
    assert enforced_budget(Decision(0), idle) == 16384  # would stall: lifted
    busy = view([running_decode(0), waiting(0)])
    assert enforced_budget(Decision(0), busy) == 0  # decode-only step is fine
    assert enforced_budget(Decision(-5), busy) == 0
    assert enforced_budget(Decision(300), busy) == 300
