"""ppas.analysis.headroom: the forced-decision wrapper, the resumable run and its copies,
and the rollout's guarantee (never worse than its base) on tiny traces; and the command
line of benchmarks/headroom.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppas.analysis import headroom
from ppas.core.view import RequestSnapshot, SchedulerView
from ppas.cost.base import StepShape
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


# ---------------------------------------------------------------- real traces (issue 20)

def _mixed(gaps: list[float], prompts: list[int], outputs: list[int]) -> list[RequestSpec]:
    t, out = 0.0, []
    for g, p, o in zip(gaps, prompts, outputs, strict=False):
        t += g
        out.append(RequestSpec(t, p, o))
    return out


#: A long prompt, then short ones arriving behind it: FCFS makes them wait.
MIXED = _mixed([0.0, 0.0, 0.01, 0.01, 0.01, 0.2, 0.0, 0.01],
               [12000, 9000, 300, 200, 400, 8000, 150, 250], [8, 6, 10, 4, 6, 5, 3, 7])
ORDER_ONLY = headroom.ActionSet(budgets=(), limits=(), prompts_ahead=0, shortest=3, srpt=True)


def _view(waiting: list[tuple[str, float, int, int]], now: float = 10.0) -> SchedulerView:
    reqs = [RequestSnapshot(rid, arr, p, c) for rid, arr, p, c in waiting]
    return SchedulerView(now, reqs, len(reqs), 0, 8192, 256)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 10.0), st.integers(1, 5000), st.integers(0, 100)),
                min_size=0, max_size=8), st.sampled_from((None, 0.5, 3.0)))
def test_shortest_first_is_a_permutation_aged_first(
        rows: list[tuple[float, int, int]], aging: float | None) -> None:
    waiting = [(str(k), a, p, min(c, p - 1)) for k, (a, p, c) in enumerate(rows)]
    view = _view(waiting)
    order = headroom.shortest_first(view, aging)
    assert sorted(order) == sorted(w[0] for w in waiting)
    by_id = {w[0]: w for w in waiting}
    old = [rid for rid in order if aging is not None and by_id[rid][1] < view.now - aging]
    assert list(order[:len(old)]) == old  # the aged ones first, FCFS (stable)
    assert [int(r) for r in old] == sorted(int(r) for r in old)
    young = order[len(old):]
    left = [by_id[r][2] - by_id[r][3] for r in young]
    assert left == sorted(left)


def test_ordered_orders_the_waiting_queue_only() -> None:
    base = make_policy("mbt:8192")
    view = _view([("a", 0.0, 5000, 0), ("b", 1.0, 100, 0), ("c", 9.5, 50, 0)])
    assert headroom.ShortestFirst(base).decide(view).prefill_order == ("c", "b", "a")
    assert headroom.ShortestFirst(base, aging_s=5.0).decide(view).prefill_order == ("a", "b", "c")
    assert headroom.ShortestFirst(base).decide(view).prefill_budget == 8192


def test_order_actions() -> None:
    """Base first; each order action keeps the base's cap and puts a waiting prompt first;
    none repeats the FCFS order."""
    view = _view([("a", 0.0, 5000, 0), ("b", 1.0, 100, 0), ("c", 2.0, 50, 0),
                  ("d", 3.0, 70, 0)])
    own = Decision(4096)
    acts = headroom.actions(view, own, headroom.TRACE_ACTIONS)
    assert acts[0] is own
    orders = [d for d in acts if d.prefill_order is not None]
    assert [d.prefill_order for d in orders] == [("c",), ("d",), ("b",), ("c", "d", "b", "a")]
    assert all(d.prefill_budget == 4096 for d in orders)
    assert not [d for d in headroom.actions(view, own) if d.prefill_order]  # issue 9's set


def test_ordering_finds_headroom_on_mixed_prompts() -> None:
    """Short prompts queued behind long ones: reordering alone lowers the mean E2E; the
    found script replays to its value."""
    base = make_policy("mbt:2048")
    cm = _cm(base)
    rec = headroom.Scripted(base, record=True)
    v0 = headroom.Run(MIXED, rec, cm).finish()
    r = headroom.rollout(MIXED, base, cm, rec.taken, v0, [base], space=ORDER_ONLY)
    assert r.value < 0.9 * v0
    assert any(d.prefill_order for d in r.script)
    assert headroom.Run(MIXED, headroom.Scripted(base, r.script), cm).finish() == \
        pytest.approx(r.value, rel=1e-12)


@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 0.3), st.integers(50, 9000), st.integers(2, 12)),
                min_size=1, max_size=6),
       st.sampled_from(("mbt:2048", "vllm:mbt=4096,max_num_seqs=3,version=0.33")),
       st.sampled_from(("mean", "p99")))
def test_trace_rollout_property(rows: list[tuple[float, int, int]], config: str,
                                obj: str) -> None:
    """Mixed lengths, ordering actions and the shortest-first continuation: never worse
    than the base, for either objective; the lower bound never exceeds the mean."""
    trace = _mixed(*map(list, zip(*rows, strict=True)))  # type: ignore[arg-type]
    base = make_policy(config)
    cm = _cm(base)
    objective = headroom.MeanE2E() if obj == "mean" else headroom.P99TtftUnderTpot(0.05)
    rec = headroom.Scripted(base, record=True)
    v0 = headroom.Run(trace, rec, cm, objective=objective).finish()
    r = headroom.rollout(trace, base, cm, rec.taken, v0, [base, headroom.ShortestFirst(base)],
                         space=headroom.TRACE_ACTIONS, objective=objective)
    assert r.value <= v0
    assert headroom.Run(trace, headroom.Scripted(base, r.script), cm,
                        objective=objective).finish() == pytest.approx(r.value, rel=1e-12)
    run = headroom.Run(trace, headroom.Scripted(base), cm)
    want = run.copy([]).finish()
    rest = run.rest_alone()
    while run.to_decision():
        assert headroom.lower_bound(run.sim, run.i, rest, run.d_min) <= want + 1e-9
        run.step()


def test_objectives_read_the_run() -> None:
    base = make_policy("mbt:2048")
    cm = _cm(base)
    res = simulate(MIXED, make_policy("mbt:2048"), cm)
    run = headroom.Run(MIXED, headroom.Scripted(base), cm)
    run.finish()
    e2e = [r.finish_time - r.arrival_time for r in res.requests]
    assert headroom.MeanE2E(3).value(run.sim) == pytest.approx(sum(e2e[3:]) / 5, rel=1e-12)
    ttft = [r.first_token_time - r.arrival_time for r in res.requests]
    loose = headroom.P99TtftUnderTpot(10.0).value(run.sim)
    assert loose == pytest.approx(float(np.percentile(ttft, 99)), rel=1e-12)
    tight = headroom.P99TtftUnderTpot(1e-6).value(run.sim)
    assert tight > headroom.INFEASIBLE > loose


def test_busiest_windows() -> None:
    specs = [RequestSpec(float(t), 100, 2) for t in range(100)]
    e2e = [10.0 if 40 <= t < 50 or 80 <= t < 85 else 1.0 for t in range(100)]
    wins = headroom.busiest_windows(specs, e2e, 10.0, 2)
    assert wins == [(40.0, 50.0), (75.0, 85.0)]  # ties: the earliest start
    assert all(b <= c for (_, b), (c, _) in zip(wins, wins[1:], strict=False))
    assert len(headroom.busiest_windows(specs, e2e, 10.0, 50)) <= 100 // 10 + 1


@pytest.mark.parametrize("obj", ("mean", "p99"))
def test_splice_never_worse_and_replays(obj: str) -> None:
    trace = [RequestSpec(s.arrival_s + k * 0.6, s.prompt_tokens, s.output_tokens)
             for k in range(3) for s in MIXED]
    trace.sort(key=lambda r: r.arrival_s)
    base = make_policy("mbt:2048")
    cm = _cm(base)
    objective = headroom.MeanE2E() if obj == "mean" else headroom.P99TtftUnderTpot(0.1)
    sp = headroom.splice_windows(trace, base, cm, objective,
                                 lambda e2e: [(0.6, 0.9)], [base, headroom.ShortestFirst(base)],
                                 every=2, tails=[headroom.ShortestFirst(base, 0.5)])
    assert len(sp.firsts) == 4 and sp.value <= min(sp.firsts)
    assert sp.base_value == headroom.Run(trace, headroom.Scripted(base), cm,
                                         objective=objective).finish()
    tail = {p.spec: p for p in (base, headroom.ShortestFirst(base),
                                headroom.ShortestFirst(base, 0.5))}
    assert headroom.Run(trace, headroom.Scripted(tail[sp.tail], sp.script), cm,
                        objective=objective).finish() == pytest.approx(sp.value, rel=1e-12)
    (w,) = sp.windows
    assert w.value <= w.base_value and w.requests > 0


@pytest.mark.parametrize("argv", (["--trace", "/nonexistent.csv"],
                                  ["--trace", "T", "--windows", "-1"],
                                  ["--trace", "T", "--loads", "x"],
                                  ["--trace", "T", "--base", "mbt:2048"],
                                  ["--trace", "T", "--tpot-slo", "0"],
                                  ["--trace", "T", "--objective", "nope"]))
def test_trace_mode_bad_input_is_one_line_exit_2(argv: list[str], tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,4\n1,200,3\n")
    argv = [str(trace) if x == "T" else x for x in argv]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "headroom.py"), *argv],
                          capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_trace_mode_runs(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n"
                     + "".join(f"{k * 0.05:.2f},{[6000, 200, 300][k % 3]},4\n"
                               for k in range(30)))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "headroom.py"),
                           "--trace", str(trace), "--base", "vllm:mbt=2048",
                           "--loads", "1", "--window-s", "1", "--windows", "1",
                           "--json", str(tmp_path / "out.json")],
                          capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "best schedule found (hindsight)" in proc.stdout
    assert (tmp_path / "out.json").is_file()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8192), st.integers(0, 30000)), min_size=1,
                max_size=6),
       st.lists(st.integers(0, 30000), max_size=40),
       st.sampled_from((("h100-sxm-80gb", "qwen3-8b"), ("rtx5090", "qwen2.5-3b"))))
def test_no_step_is_faster_than_fastest_step(chunks: list[tuple[int, int]],
                                             decodes: list[int],
                                             gpu: tuple[str, str]) -> None:
    """``srpt_bound``'s premise, for the roofline: any step (chunks with cached context,
    decodes beside them) takes at least ``fastest_step`` of its prefill tokens, and a
    one-decode step is the cheapest decode step."""
    cm = RooflineCostModel(*gpu, max_num_batched_tokens=16384)
    shape = StepShape.of(chunks, decodes)
    assert cm.step_time(shape) >= headroom.fastest_step(cm, shape.num_prefill_tokens) - 1e-15
    assert cm.step_time(shape) >= cm.step_time(StepShape(0, 0, 0.0, 0, 1, 0)) - 1e-15
    if decodes:
        assert cm.step_time(StepShape.of([], decodes)) >= \
            cm.step_time(StepShape(0, 0, 0.0, 0, 1, 0)) - 1e-15


@settings(max_examples=10, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 0.3), st.integers(50, 9000), st.integers(2, 12)),
                min_size=1, max_size=8), st.sampled_from(("mbt:2048", "mbt:8192")))
def test_srpt_bound_is_below_every_schedule(rows: list[tuple[float, int, int]],
                                            config: str) -> None:
    trace = _mixed(*map(list, zip(*rows, strict=True)))  # type: ignore[arg-type]
    base = make_policy(config)
    cm = _cm(base)
    bound = headroom.srpt_bound(trace, cm, base.max_num_batched_tokens)
    for pol in (base, headroom.ShortestFirst(base)):
        res = simulate(trace, pol, cm)
        mean = sum(r.finish_time - r.arrival_time for r in res.requests) / len(trace)
        assert bound <= mean + 1e-12
    rec = headroom.Scripted(base, record=True)
    v0 = headroom.Run(trace, rec, cm).finish()
    r = headroom.rollout(trace, base, cm, rec.taken, v0, [base, headroom.ShortestFirst(base)],
                         space=headroom.TRACE_ACTIONS)
    assert bound <= r.value + 1e-12


def test_srpt_bound_orders_short_first() -> None:
    """Two prompts at once: the short one's wait is all the bound charges."""
    cm = _cm(make_policy("mbt:8192"))
    rate = headroom.peak_prefill_rate(cm, 8192)
    d_min = cm.step_time(StepShape(0, 0, 0.0, 0, 1, 0))
    trace = [RequestSpec(0.0, 6000, 1), RequestSpec(0.0, 1000, 3)]
    want = (1000 / rate + 7000 / rate + 2 * d_min) / 2
    assert headroom.srpt_bound(trace, cm, 8192) == pytest.approx(want, rel=1e-12)


def _bench_headroom():  # type: ignore[no-untyped-def]
    """``benchmarks/headroom.py`` as a module (its siblings on the path, as when run)."""
    import importlib
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module("headroom")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_bisect_aging_keeps_only_tail_safe_bounds_inside_the_interval() -> None:
    """Between a tail-safe grid bound and an unsafe better-scoring one, every bound kept is
    tail-safe by its own run's figures, lies inside the interval, replays to its value,
    and the best comes last; a grid without such a pair runs nothing."""
    bench = _bench_headroom()
    base = make_policy("mbt:2048")
    cm = _cm(base)
    objective = headroom.MeanE2E()
    fcfs = headroom.Run(MIXED, headroom.Scripted(base), cm, None, objective)
    v0 = fcfs.finish()
    stock = headroom.tail_figures(fcfs.sim)
    assert bench.tail_safe(stock, stock)
    unsafe = {**stock, "p99_ttft": 2 * stock["p99_ttft"]}
    assert not bench.tail_safe(unsafe, stock)
    lo, hi = 1e-3, 1e3
    found = bench.bisect_aging(MIXED, base, cm, objective,
                               [(lo, v0, stock), (hi, 0.5 * v0, unsafe)], stock)
    assert found, "the interval's low end (FCFS-like) is safe, so a bound near it is too"
    assert [v for _, v, _ in found] == sorted((v for _, v, _ in found), reverse=True)
    for g, v, f in found:
        assert lo < g < hi and bench.tail_safe(f, stock)
        run = headroom.Run(MIXED, headroom.Scripted(headroom.ShortestFirst(base, g)), cm,
                           None, objective)
        assert run.finish() == pytest.approx(v, rel=1e-12)
    assert bench.bisect_aging(MIXED, base, cm, objective,
                              [(lo, v0, stock), (hi, 0.5 * v0, stock)], stock) == []
    assert bench.bisect_aging(MIXED, base, cm, objective,
                              [(lo, v0, stock), (hi, 2 * v0, unsafe)], stock) == []
