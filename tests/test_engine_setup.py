"""``engine_for``: the cost model is sized at the budget the engine runs with."""

from __future__ import annotations

import pytest

from ppas.cost.roofline import RooflineCostModel, RooflineParams
from ppas.engine.setup import engine_for
from ppas.engine.simulator import EngineConfig
from ppas.policies import make_policy


def _kv(mbt: int, params: RooflineParams | None = None) -> int:
    return RooflineCostModel("rtx5090", "qwen2.5-3b", params,
                             max_num_batched_tokens=mbt).kv_capacity_tokens


def test_the_roofline_is_sized_at_the_policys_budget() -> None:
    e = engine_for("mbt:2048", "rtx5090", "qwen2.5-3b")
    assert e.policy.max_num_batched_tokens == e.max_num_batched_tokens == 2048
    assert isinstance(e.cost_model, RooflineCostModel)
    assert e.cost_model.kv_capacity_tokens == _kv(2048) > _kv(16384)
    assert e.config == EngineConfig()


def test_a_built_policy_and_the_engines_own_budget() -> None:
    pol = make_policy("ppas")
    cfg = EngineConfig(max_num_seqs=8, max_num_batched_tokens=4096)
    e = engine_for(pol, "rtx5090", "qwen2.5-3b", config=cfg)
    assert e.policy is pol and e.config is cfg and e.max_num_batched_tokens == 4096
    assert e.cost_model.kv_capacity_tokens == _kv(4096)  # type: ignore[attr-defined]


def test_trial_params_and_bad_names() -> None:
    p = RooflineParams(step_overhead_s=0.01)
    e = engine_for("mbt:8192", "rtx5090", "qwen2.5-3b", params=p)
    assert e.cost_model.params == p  # type: ignore[attr-defined]
    assert e.cost_model.kv_capacity_tokens == _kv(8192, p)  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="nope"):
        engine_for("mbt:8192", "nope", "qwen2.5-3b")
