"""An experiment's stock arms set every knob the supported vLLM lines have (issue 19, item 6):
``max_num_active_seqs``, ``prefill_schedule_interval``,
``long_prefill_token_threshold_adaptive``, ``max_num_seqs``; not the partial-prefill
knobs vLLM removed before 0.32."""

from __future__ import annotations

import pytest

from ppas.core.errors import PpasError
from ppas.experiment.arms import STOCK_ARGS, ArmSpec

ALL = {"max_num_batched_tokens": 2048, "long_prefill_token_threshold": 256,
       "long_prefill_token_threshold_adaptive": True, "prefill_schedule_interval": 4,
       "max_num_seqs": 64, "max_num_active_seqs": 8}


def test_a_stock_arm_sets_every_knob_and_is_simulated() -> None:
    arm = ArmSpec.parse({"name": "stock", "stock": ALL}, 0)
    assert arm.stock_dict() == ALL and arm.max_num_batched_tokens == 2048
    assert arm.stock_flags() == [
        "--long-prefill-token-threshold", "256", "--long-prefill-token-threshold-adaptive",
        "--prefill-schedule-interval", "4", "--max-num-active-seqs", "8"]
    sim, why = arm.sim_policy("0.32.0")
    assert why == "" and sim == (
        "vllm:mbt=2048,long_prefill_token_threshold=256,adaptive=true,"
        "prefill_schedule_interval=4,max_num_seqs=64,max_num_active_seqs=8,version=0.32")
    off = ArmSpec.parse({"name": "s", "stock": {"max_num_batched_tokens": 512,
                                                "long_prefill_token_threshold_adaptive": False}},
                        0)
    assert off.stock_flags() == []


def test_every_stock_knob_is_modelled_and_the_removed_ones_are_gone() -> None:
    from ppas.policies.vllm_stock import KNOB_PARAMS

    assert set(STOCK_ARGS) == set(KNOB_PARAMS)
    with pytest.raises(PpasError, match=r"arms\[0\]\.stock\.max_num_partial_prefills: unknown "
                                        r"key; allowed: .*max_num_active_seqs"):
        ArmSpec.parse({"name": "s", "stock": {"max_num_batched_tokens": 512,
                                              "max_num_partial_prefills": 2}}, 0)


@pytest.mark.parametrize(("stock", "wanted"), [
    ({"long_prefill_token_threshold_adaptive": 1},
     "arms[0].stock.long_prefill_token_threshold_adaptive: must be true or false, got 1"),
    ({"max_num_active_seqs": 0}, "arms[0].stock.max_num_active_seqs: must be an integer >= 1"),
    ({"max_num_seqs": 4096}, "max_num_seqs must be in [1, mbt=512]"),
    ({"max_num_seqs": 16, "max_num_active_seqs": 32},
     "max_num_active_seqs must be in [1, max_num_seqs]"),
])
def test_bad_stock_knob_values(stock: dict[str, object], wanted: str) -> None:
    with pytest.raises(PpasError) as e:
        ArmSpec.parse({"name": "s", "stock": {"max_num_batched_tokens": 512, **stock}}, 0)
    assert wanted in str(e.value)
