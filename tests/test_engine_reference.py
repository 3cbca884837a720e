"""The engine loop (``ppas.engine.simulator``) against its earlier form
(``tests/engine_reference.py``): on random runs, under every policy, FCFS and priority,
with and without prefix caching, a small KV cache (preemptions) and stock vLLM's prefill
knobs, the same steps (step traces), the same floats (every request's times, the
inter-token gaps in the order taken), the same finishing order, and views whose N_p/N_d
(kept as requests move) are what ``step_rules.counts`` finds."""

from __future__ import annotations

import engine_reference as ref
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppas.core.view import (
    OutputLengths,
    SchedulerView,
    StepRecord,
    make_step_record,
    make_view,
)
from ppas.cost.base import StepShape, make_shape
from ppas.cost.roofline import RooflineCostModel
from ppas.engine import step_rules
from ppas.engine.result import SimResult
from ppas.engine.simulator import EngineConfig, EngineSim, replay
from ppas.policies import make_policy, policy_names
from ppas.policies.base import Policy
from ppas.workload import RequestSpec

CM = RooflineCostModel("h200", "qwen2.5-3b")
POLICIES = [*policy_names(), "vllm:long_prefill_token_threshold=256",
            "vllm:prefill_schedule_interval=4,version=0.33", "vllm:mbt=512,max_num_seqs=3"]


def checked(policy: Policy) -> Policy:
    """``policy``, asserting at each decision that the view's counts are the requests'."""
    decide = policy.decide

    def check(view: SchedulerView) -> object:
        running = [r for r in view.requests if r.is_running]
        assert (view.num_pending_prefills, view.num_running_decodes) == step_rules.counts(
            running, len(view.requests) - len(running))  # type: ignore[arg-type]
        return decide(view)

    policy.decide = check  # type: ignore[method-assign,assignment]
    return policy


def drive(sim: EngineSim | ref.EngineSim, specs: list[RequestSpec]) -> list[str]:
    """``simulate``'s loop (``replay``) on ``sim``; the ids of the finished requests, in
    order."""
    replay(sim, specs)  # type: ignore[arg-type]  # (the reference engine: the same calls)
    return [r.request_id for r in sim.finished]


def outcome(res: SimResult) -> tuple[object, ...]:
    return ([(r.first_scheduled_time, r.first_token_time, r.last_token_time, r.finish_time,
              r.num_preemptions, r.failed, r.num_output_tokens, r.num_hit_tokens)
             for r in res.requests], res.num_steps, res.num_preemptions, res.steps,
            res.gaps.one, res.gaps.values, res.gaps.counts)


requests = st.lists(st.tuples(st.floats(0, 2), st.integers(1, 1500), st.integers(1, 120),
                              st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=25)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(POLICIES), requests, st.one_of(st.none(), st.integers(20, 400)),
       st.sampled_from(("fcfs", "priority")), st.booleans(), st.booleans(), st.booleans())
def test_engine_equals_reference(name: str, reqs: list[tuple[float, int, int, int, int]],
                                 kv: int | None, scheduling: str, skip: bool, caching: bool,
                                 record: bool) -> None:
    specs = [RequestSpec(a, p, o, priority=pr,
                         prefix=((f"doc{g}", min(p, 256)),) if g else ())
             for a, p, o, pr, g in reqs]
    eng = EngineConfig(num_kv_blocks=kv, scheduling_policy=scheduling,
                       priority_skips_self_preempted=skip, prefix_caching=caching)
    new = EngineSim(checked(make_policy(name)), CM, eng, record_steps=record)
    old = ref.EngineSim(make_policy(name), CM, ref.EngineConfig(**vars(eng)),
                        record_steps=record)
    assert drive(new, specs) == drive(old, specs)
    assert outcome(new.result()) == outcome(old.result())
    assert list(new.recent) == list(old.recent)


def test_a_chunk_before_decodes_keeps_its_place() -> None:
    """A prompt chunked by vLLM's long-prefill limit runs ahead of decodes admitted after
    it: its first token, its finish and its recompute gap keep their place in vLLM's order
    among the decodes' (the last prompt finishes on the same step as some decodes)."""
    for out in range(1, 40):
        specs = [RequestSpec(0.0, 1000, 1), RequestSpec(0.0, 10, out),
                 RequestSpec(0.0, 12, out + 1), RequestSpec(0.01, 900, 2)]
        for kv in (None, 70):
            eng = EngineConfig(num_kv_blocks=kv)
            name = "vllm:long_prefill_token_threshold=64"
            new = EngineSim(make_policy(name), CM, eng)
            old = ref.EngineSim(make_policy(name), CM, ref.EngineConfig(**vars(eng)))
            assert drive(new, specs) == drive(old, specs), (out, kv)
            assert outcome(new.result()) == outcome(old.result()), (out, kv)


def test_builders_make_the_dataclasses() -> None:
    """The positional builders give objects equal (and hashing equal) to the classes'."""
    rec = StepRecord(1.5, 0.25, 0.0, 2048, 100, 7, 1, 7, 5050.0, 100, 700)
    args = (1.5, 0.25, 0.0, 2048, 100, 7, 1, 7, 5050.0, 100, 700)
    assert make_step_record(*args) == rec
    assert hash(make_step_record(*args)) == hash(rec)
    assert type(make_step_record(*args)) is StepRecord
    assert make_shape(100, 1, 2.5, 300, 7, 4000) == StepShape(100, 1, 2.5, 300, 7, 4000)
    lengths = OutputLengths()
    view = SchedulerView(1.0, (), 2, 3, 2048, 256, (), None, 7, True, lengths, 32)
    assert make_view(1.0, (), 2, 3, 2048, 256, (), None, 7, True, lengths, 32) == view
