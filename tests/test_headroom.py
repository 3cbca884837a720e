"""ppas.analysis.headroom: the forced-decision wrapper, the resumable run and its copies,
and the rollout's guarantee (never worse than its base) on tiny traces; and the command
line of benchmarks/headroom.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppas.analysis import headroom
from ppas.core.view import SchedulerView
from ppas.cost.roofline import RooflineCostModel
from ppas.engine.simulator import EngineConfig, simulate
from ppas.policies import Decision, Policy, make_policy
from ppas.workload import PAPER_PHASES, RequestSpec, phase_trace

ROOT = Path(__file__).resolve().parents[1]

STOCK = ("vllm:mbt=8192,long_prefill_token_threshold=0,adaptive=false,"
         "prefill_schedule_interval=1,max_num_active_seqs=2,version=0.33")
CADENCE = ("vllm:mbt=4096,long_prefill_token_threshold=512,adaptive=true,"
           "prefill_schedule_interval=4,version=0.33")
POLICIES = ("mbt:1024", "predictive:c_max=8192", STOCK, CADENCE)


def _cm(policy):  # type: ignore[no-untyped-def]
    return RooflineCostModel("rtx5090", "qwen2.5-3b",
                             max_num_batched_tokens=policy.max_num_batched_tokens)


def _trace(gaps: list[float], prompt: int = 6000, output: int = 6) -> list[RequestSpec]:
    t, out = 0.0, []
    for g in gaps:
        t += g
        out.append(RequestSpec(t, prompt, output))
    return out


TINY = _trace([0.0, 0.05, 0.05, 0.3, 0.02, 0.4])


@pytest.mark.parametrize("config", POLICIES)
def test_scripted_without_script_is_the_base(config: str) -> None:
    base = make_policy(config)
    ref = simulate(TINY, make_policy(config), _cm(base)).requests
    got = simulate(TINY, headroom.Scripted(base), _cm(base)).requests
    assert [(r.first_token_time, r.finish_time) for r in got] == \
        [(r.first_token_time, r.finish_time) for r in ref]
    run = headroom.Run(TINY, headroom.Scripted(base), _cm(base))
    assert run.finish() == pytest.approx(
        sum(r.finish_time - r.arrival_time for r in ref) / len(ref), rel=1e-12)


@pytest.mark.parametrize("config", POLICIES)
def test_recorded_script_and_copies_reproduce_the_run(config: str) -> None:
    base = make_policy(config)
    cm = _cm(base)
    rec = headroom.Scripted(base, record=True)
    want = headroom.Run(TINY, rec, cm).finish()
    assert rec.taken
    assert headroom.Run(TINY, headroom.Scripted(base, rec.taken), cm).finish() == want
    # A copy at every decision step, finished there, ends the same as the whole run; so
    # does the original, stepped on after being copied.
    run = headroom.Run(TINY, headroom.Scripted(base, rec.taken), cm)
    n = 0
    while run.to_decision():
        assert run.copy(rec.taken).finish() == want
        run.step()
        n += 1
    assert n == len(rec.taken)
    assert headroom.mean_e2e(run.sim) == want


@pytest.mark.parametrize("config", ("mbt:8192", STOCK))
def test_copies_with_a_small_kv_cache(config: str) -> None:
    """Room for two prompts and no more: admission waits for blocks, decodes preempt."""
    base = make_policy(config)
    cm = _cm(base)
    small = EngineConfig(num_kv_blocks=750)
    ref = simulate(TINY, make_policy(config), cm, small)
    assert ref.num_preemptions > 0
    want = sum(r.finish_time - r.arrival_time for r in ref.requests) / len(ref.requests)
    run = headroom.Run(TINY, headroom.Scripted(base), cm, small)
    while run.to_decision():
        assert run.copy([]).finish() == pytest.approx(want, rel=1e-12)
        run.step()
    assert headroom.mean_e2e(run.sim) == pytest.approx(want, rel=1e-12)


def test_a_forced_decision_changes_the_run() -> None:
    """The wrapper's script is applied: a cap of 1 token at the first decision steps
    slows the first prompt down."""
    base = make_policy("mbt:8192")
    cm = _cm(base)
    want = headroom.Run(TINY, headroom.Scripted(base), cm).finish()
    slow = headroom.Run(TINY, headroom.Scripted(base, [Decision(1)] * 5), cm).finish()
    assert slow > want


def test_actions_base_first_and_distinct() -> None:
    base = make_policy("mbt:8192")
    cm = _cm(base)
    run = headroom.Run(TINY, headroom.Scripted(base), cm)
    seen_decode_only = False
    while run.to_decision():
        view = run.sim._view()
        own = base.decide(view)
        acts = headroom.actions(view, own)
        assert acts[0] is own
        caps = [headroom.enforced_budget(d, view) for d in acts]
        assert len(set(caps)) == len(caps)
        assert all(0 <= c <= view.max_num_batched_tokens for c in caps)
        seen_decode_only |= 0 in caps
        run.step()
    assert seen_decode_only  # offered whenever a decode runs beside a waiting prompt


@pytest.mark.parametrize("config", ("mbt:1024", STOCK, "predictive:c_max=8192"))
def test_rollout_never_worse_than_its_base(config: str) -> None:
    base = make_policy(config)
    cm = _cm(base)
    first, values, steps, sims = headroom.improve(TINY, base, cm, 2, [base])
    assert first == headroom.Run(TINY, headroom.Scripted(base), cm).finish()
    assert len(values) == 2 and values[1] <= values[0] <= first
    assert steps > 0 and sims >= steps


class SmallChunks(Policy):
    """A global budget of 16k tokens but a prefill cap of 256 at every step."""

    name = "small-chunks"
    Config = object

    def __init__(self) -> None:
        super().__init__(None)

    @property
    def max_num_batched_tokens(self) -> int:
        return 16384

    def decide(self, view: SchedulerView) -> Decision:
        return Decision(256)


def _rollout(trace, base, cm, heuristics=()):  # type: ignore[no-untyped-def]
    rec = headroom.Scripted(base, record=True)
    value = headroom.Run(trace, rec, cm).finish()
    return headroom.rollout(trace, base, cm, rec.taken, value, list(heuristics))


@pytest.mark.parametrize("heuristics", ((), ("limit",)))
def test_rollout_improves_a_poor_base(heuristics: tuple[str, ...]) -> None:
    """Small chunks are far from the best schedule on a burst of long prompts."""
    base = SmallChunks()
    cm = _cm(base)
    h = [headroom.LimitAsCap(m, 16384) for m in (1, 2)] if heuristics else []
    r = _rollout(TINY, base, cm, h)
    assert r.value < 0.95 * r.base_value
    assert headroom.Run(TINY, headroom.Scripted(base, r.script), cm).finish() == \
        pytest.approx(r.value, rel=1e-12)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.floats(0.0, 0.6), min_size=1, max_size=5),
       st.sampled_from(("mbt:2048", STOCK)))
def test_rollout_property(gaps: list[float], config: str) -> None:
    base = make_policy(config)
    cm = _cm(base)
    trace = _trace(gaps, prompt=3000, output=4)
    r = _rollout(trace, base, cm, [base])  # asserts monotonicity at every step
    assert r.value <= r.base_value
    assert headroom.Run(trace, headroom.Scripted(base, r.script), cm).finish() == \
        pytest.approx(r.value, rel=1e-12)


@pytest.mark.parametrize("argv", (["--seeds", "0"], ["--iterations", "0"],
                                  ["--bursts", "x"], ["--bursts", "0.5"],
                                  ["--hardware", "nope"], ["--policy", "nope:"],
                                  ["--stock", "0.4=mbt:2048"], ["--stock", "9=vllm:mbt=512"],
                                  ["--seeds", "two"]))
def test_bad_input_is_one_line_exit_2(argv: list[str]) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "headroom.py"), *argv],
                          capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 2
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("active", (1, 2, 3))
def test_limit_as_cap_is_the_stock_limit(active: int) -> None:
    """Without a threshold or an interval, a stock setting's admission limit applied
    through the cap schedules as the knob does (paper trace, whole prompts per step)."""
    cfg = (f"vllm:mbt=32768,max_num_active_seqs={active},version=0.33")
    stock = make_policy(cfg)
    cm = _cm(stock)
    trace = phase_trace(PAPER_PHASES, 0, 25000, 32, 1.4)
    want = [r.finish_time for r in simulate(trace, make_policy(cfg), cm).requests]
    got = [r.finish_time for r in simulate(trace, headroom.LimitAsCap.of(stock), cm).requests]
    assert got == want
