"""Stock vLLM's prefill knobs (``vllm:`` policy, ``step_rules`` rule 4b) without vLLM; the
step-by-step check against vLLM's real Scheduler is tests/test_vllm_stock.py."""

from __future__ import annotations

import dataclasses

import pytest

from ppas.core.decision import EngineKnobs, Knob, admission_limit
from ppas.core.errors import PpasError
from ppas.cost.roofline import RooflineCostModel
from ppas.engine.simulator import simulate
from ppas.engine.step_rules import PrefillCadence, long_prefill_limit, prefill_cadence
from ppas.policies import make_policy
from ppas.workload import phase_trace


@pytest.mark.parametrize(
    ("lpt", "adaptive", "reqs", "mbt", "limit"),
    [(0, False, 5, 2048, 0), (256, False, 5, 2048, 256), (256, False, 1, 2048, 0),
     (256, True, 4, 2048, 512), (256, True, 16, 2048, 256), (0, True, 2, 2048, 0)],
)
def test_long_prefill_limit(lpt: int, adaptive: bool, reqs: int, mbt: int, limit: int) -> None:
    assert long_prefill_limit(EngineKnobs(lpt, adaptive), reqs, mbt) == limit


def test_cadence_only_on_033() -> None:
    assert prefill_cadence(EngineKnobs(prefill_schedule_interval=4)) is not None
    assert prefill_cadence(EngineKnobs(prefill_schedule_interval=4,
                                       local_prefill_interval=False)) is None
    assert prefill_cadence(EngineKnobs()) is None
    c = PrefillCadence(3)
    assert c.last_prefill == -3 and not c.capacity_bound  # the first step is never held


@pytest.mark.parametrize(
    ("seqs", "active", "engine", "limit"),
    [(None, None, 256, 256), (8, None, 256, 8), (None, 2, 256, 2), (8, 2, 256, 2),
     (None, 300, 256, 256), (4, None, 2, 4)],
)
def test_admission_limit(seqs: int | None, active: int | None, engine: int, limit: int) -> None:
    knobs = EngineKnobs(max_num_seqs=seqs, max_num_active_seqs=active)
    assert admission_limit(knobs, engine) == limit


def test_active_limit_holds_in_the_simulator() -> None:
    trace = phase_trace("10:0.2,10:1.0,10:0.2", 0, 8000, 16, 1.0)
    cm = RooflineCostModel("rtx5090", "qwen2.5-3b", max_num_batched_tokens=8192)

    def run(spec: str) -> tuple[int, float]:
        res = simulate(trace, make_policy(spec), cm, record_steps=True)
        assert all(r.finish_time is not None for r in res.requests)
        return (max(len(s.scheduled) for s in res.steps),
                float(res.summary()["avg_latency"]))

    plain, one = run("vllm:mbt=8192"), run("vllm:mbt=8192,max_num_active_seqs=1")
    assert plain[0] > 1 and one[0] == 1 and one[1] != plain[1]
    assert run("vllm:mbt=8192,max_num_seqs=1") == one  # the same admission limit


@pytest.mark.parametrize("bad", ["vllm:version=0.31", "vllm:mbt=0",
                                 "vllm:long_prefill_token_threshold=-1",
                                 "vllm:prefill_schedule_interval=0", "vllm:adaptive=maybe",
                                 "vllm:mbt=512,max_num_seqs=1024", "vllm:max_num_seqs=0",
                                 "vllm:max_num_seqs=4,max_num_active_seqs=8",
                                 "vllm:max_num_active_seqs=0"])
def test_bad_config(bad: str) -> None:
    with pytest.raises(PpasError, match="vllm"):
        make_policy(bad)


def test_defaults_are_stock_mbt_and_032_ignores_the_interval() -> None:
    trace = phase_trace("10:0.2,10:1.0,10:0.2", 0, 8000, 16, 1.0)
    cm = RooflineCostModel("rtx5090", "qwen2.5-3b", max_num_batched_tokens=2048)

    def e2e(spec: str) -> float:
        return float(simulate(trace, make_policy(spec), cm).summary()["avg_latency"])

    base = e2e("mbt:2048")
    assert e2e("vllm") == base  # vLLM's defaults: MBT 2048, no threshold, interval 1
    assert e2e("vllm:prefill_schedule_interval=8,version=0.32") == base
    assert e2e("vllm:prefill_schedule_interval=8,version=0.33") != base
    assert e2e("vllm:long_prefill_token_threshold=256") != base


def test_knob_names_are_spelled_once() -> None:
    """``Knob`` is the one spelling: every vLLM knob of ``EngineKnobs`` and every ``vllm:``
    parameter but ``version`` names a knob, and flags derive from the names."""
    from ppas.policies.vllm_stock import KNOB_PARAMS

    ours = {"local_prefill_interval"}  # not a vLLM knob: the release line's behaviour
    knobs = {Knob(f.name) for f in dataclasses.fields(EngineKnobs) if f.name not in ours}
    assert set(KNOB_PARAMS) - {Knob.MAX_NUM_BATCHED_TOKENS} == knobs
    assert KNOB_PARAMS[Knob.MAX_NUM_BATCHED_TOKENS] == "mbt"
    assert Knob.MAX_NUM_ACTIVE_SEQS.flag == "--max-num-active-seqs"
    assert f"{Knob.MAX_NUM_SEQS}" == "max_num_seqs" and Knob("max_num_seqs") is Knob.MAX_NUM_SEQS
