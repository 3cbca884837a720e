"""The cluster simulator: equivalence with one engine, invariants under random clusters."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppas.cli import main
from ppas.cluster.config import ClusterConfig, LinkConfig, PoolConfig, SloConfig
from ppas.cluster.simulator import simulate_cluster
from ppas.cost.base import CostModel, StepShape
from ppas.cost.roofline import RooflineCostModel
from ppas.engine.simulator import EngineConfig, simulate
from ppas.policies import make_policy
from ppas.workload import RequestSpec, mixed_trace, phase_trace

HW = {"hardware": "h200", "model": "qwen2.5-3b"}


class ConstantCost(CostModel):
    """1 ms per step + 1 us per token."""

    def step_time(self, step: StepShape) -> float:
        return 1e-3 + 1e-6 * step.num_tokens


def const(pool: PoolConfig, mbt: int) -> CostModel:
    return ConstantCost()


def times(reqs):  # type: ignore[no-untyped-def]
    return [(r.first_token_time, r.last_token_time, r.finish_time, r.num_preemptions, r.failed)
            for r in reqs]


def test_one_instance_pass_through_is_the_engine() -> None:
    """One mixed instance behind pass-through reproduces ``simulate`` exactly."""
    for policy, trace in (("ppas", phase_trace("10:0.2,10:1.2,10:0.2", 3, 25000, 32)),
                          ("mbt:2048", mixed_trace(8.0, 20, 1)),
                          ("sloweave", mixed_trace(8.0, 20, 2))):
        cm = RooflineCostModel("h200", "qwen2.5-3b",
                               max_num_batched_tokens=make_policy(policy).max_num_batched_tokens)
        cfg = ClusterConfig((PoolConfig("m", policy=policy, **HW),), router="pass-through")
        res = simulate_cluster(trace, cfg)
        ref = simulate(trace, make_policy(policy), cm)
        assert times(r.prefill for r in res.requests) == times(ref.requests)
        assert res.request_metrics() == ref.request_metrics()


def test_one_instance_tight_kv_is_the_engine() -> None:
    trace = mixed_trace(30.0, 10, 4)
    cfg = ClusterConfig((PoolConfig("m", policy="mbt:1024", num_kv_blocks=3000, **HW),),
                        router="pass-through")
    res = simulate_cluster(trace, cfg, const)
    ref = simulate(trace, make_policy("mbt:1024"), ConstantCost(), EngineConfig(num_kv_blocks=3000))
    assert ref.num_preemptions > 0
    assert times(r.prefill for r in res.requests) == times(ref.requests)


def test_disaggregated_timeline() -> None:
    """One request: prefill on P (whole prompt, one token), transfer, decode on D."""
    link = LinkConfig(bandwidth_gbs=1.0, latency_s=0.01)
    cfg = ClusterConfig((PoolConfig("p", role="prefill", policy="mbt:4096", **HW),
                         PoolConfig("d", role="decode", policy="mbt:4096", **HW)), link=link)
    res = simulate_cluster([RequestSpec(0.5, 1000, 5)], cfg, const)
    (cr,) = res.requests
    assert cr.prefill is not None and cr.decode is not None and not cr.deflected
    step1 = 1e-3 + 1000e-6
    assert math.isclose(cr.prefill.finish_time, 0.5 + step1)
    xfer = 0.01 + 1000 * 36864 / 1e9  # Qwen2.5-3B: 36,864 B per token at 1 GB/s
    assert cr.transfer_start == cr.prefill.finish_time
    assert math.isclose(cr.transfer_end, cr.transfer_start + xfer)
    # D recomputes the last prompt token (1 token) and samples the first output token.
    m = res.request_metrics()[0]
    assert math.isclose(m.ttft, step1 + xfer + (1e-3 + 1e-6))
    assert math.isclose(m.e2e, m.ttft + 4 * (1e-3 + 1e-6))
    assert res.instances[0].outstanding_tokens == res.instances[1].outstanding_tokens == 0


def test_deflection_and_laps_move_requests() -> None:
    trace = mixed_trace(20.0, 20, 0)
    base = dict(role="decode", instances=3, policy="tbt-ladder:tbt_slo=0.05", **HW)
    pre = PoolConfig("p", role="prefill", policy="mbt:8192", **HW)
    off = simulate_cluster(trace, ClusterConfig((pre, PoolConfig("d", **base))))
    on = simulate_cluster(trace, ClusterConfig((pre, PoolConfig("d", deflection="ladder",
                                                                 **base))))
    assert off.num_deflected == 0 < on.num_deflected
    assert all(r.decode is None for r in on.requests if r.deflected)
    laps_pre = PoolConfig("p", role="prefill", policy="mbt:8192", queue="laps", **HW)
    laps = simulate_cluster(trace, ClusterConfig((laps_pre, PoolConfig("d", **base))))
    short = [i for i, r in enumerate(trace) if r.prompt_tokens <= 256]

    def short_ttft(res) -> float:  # type: ignore[no-untyped-def]
        ms = res.request_metrics()
        return sum(ms[i].ttft for i in short) / len(short)

    assert short_ttft(laps) < short_ttft(off)


@st.composite
def clusters(draw):  # type: ignore[no-untyped-def]
    disagg = draw(st.booleans())
    kv = draw(st.one_of(st.none(), st.integers(40, 400)))
    pol = draw(st.sampled_from(["mbt:256", "mbt:64", "ppas:n_th=2,b_max=512,b_cap=64",
                                "sarathi:budget=128", "tbt-ladder:tbt_slo=0.002,mbt=4096"]))
    router = draw(st.sampled_from(["round-robin", "least-outstanding-tokens",
                                   "earliest-completion"]))
    if disagg:
        pools = (PoolConfig("p", role="prefill", instances=draw(st.integers(1, 2)),
                            policy=draw(st.sampled_from(["mbt:256", "mbt:64"])),
                            num_kv_blocks=kv, queue=draw(st.sampled_from(["fcfs", "laps:10"])),
                            **HW),
                 PoolConfig("d", role="decode", instances=draw(st.integers(1, 3)), policy=pol,
                            num_kv_blocks=kv,
                            deflection=draw(st.sampled_from(["off", "ladder:tbt_slo=0.002"])),
                            **HW))
    else:
        pools = (PoolConfig("m", instances=draw(st.integers(1, 4)), policy=pol,
                            num_kv_blocks=kv, **HW),)
    link = LinkConfig(draw(st.sampled_from([0.01, 1.0, 100.0])), draw(st.sampled_from([0, 1e-3])))
    return ClusterConfig(pools, router=router, link=link, slo=SloConfig(ttft_s=0.05))


requests = st.lists(st.tuples(st.floats(0, 0.05), st.integers(1, 600), st.integers(1, 40)),
                    min_size=1, max_size=25)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), requests)
def test_invariants(cfg: ClusterConfig, reqs: list[tuple[float, int, int]]) -> None:
    trace = [RequestSpec(a, p, o) for a, p, o in reqs]
    res = simulate_cluster(trace, cfg, const)
    for cr in res.requests:
        assert cr.finishes == 1  # every request finishes (or fails) exactly once
        if cr.failed:
            continue
        m = cr.metrics()
        assert m is not None and m.ttft > 0 and m.e2e >= m.ttft
        if cr.decode is not None:  # went through the prefill pool and the link
            assert cr.prefill is not None and cr.prefill.finish_time is not None
            assert cr.transfer_start is not None and cr.transfer_end is not None
            assert cr.transfer_start >= cr.prefill.finish_time  # never before the prefill
            assert cr.decode.first_token_time is not None
            assert cr.decode.first_token_time > cr.transfer_end
        assert cr.last is not None and cr.last.num_output_tokens == cr.spec.output_tokens
    for inst in res.instances:
        e = inst.engine
        if e.total_blocks is not None:
            assert inst.max_kv_blocks_used <= e.total_blocks  # KV never over capacity
            assert e.free_blocks == e.total_blocks  # everything released at the end
        assert inst.outstanding_tokens == 0 and not e.running and not e.waiting
    assert sum(1 for r in res.requests if r.failed) + len(res.request_metrics()) == len(trace)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), requests)
def test_running_ahead_changes_nothing(cfg: ClusterConfig, reqs: list[tuple[float, int, int]]
                                       ) -> None:
    """Instances that run decode steps ahead and are rewound when a request joins them
    give the same results as instances kept at the next arrival."""
    trace = [RequestSpec(a, p, o) for a, p, o in reqs]
    ahead = simulate_cluster(trace, cfg, const)
    kept = simulate_cluster(trace, cfg, const, run_ahead=False)
    assert ahead.request_metrics() == kept.request_metrics()
    assert [r.instance for r in ahead.requests] == [r.instance for r in kept.requests]


def test_roofline_run_ahead_mixed_lengths() -> None:
    trace = mixed_trace(30.0, 20, 5)
    cfg = ClusterConfig((PoolConfig("m", instances=4, policy="ppas:b_max=8192", **HW),))
    a = simulate_cluster(trace, cfg)
    b = simulate_cluster(trace, cfg, run_ahead=False)
    assert a.request_metrics() == b.request_metrics()
    assert sum(x.engine.num_steps for x in a.instances) == sum(
        x.engine.num_steps for x in b.instances)


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        rc = main(args)
    except SystemExit as e:  # argparse errors
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_cluster_sweep(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plot = tmp_path / "sweep.png"
    rc, out, err = cli(["simulate", "--cluster", str(EXAMPLES / "cluster-disaggregated.toml"),
                        "--mixed", "--request-rate", "8", "--duration", "10",
                        "--instances", "4,8", "--pd-ratios", "1:3,1:1", "--json",
                        "--plot", str(plot)], capsys)
    assert rc == 0, err
    recs = json.loads(out)
    assert [r["layout"] for r in recs] == ["1P:3D", "2P:2D", "2P:6D", "4P:4D"]
    for r in recs:
        assert r["failed"] == 0 and r["num_requests"] == recs[0]["num_requests"]
        assert r["ttft_p50"] <= r["ttft_p95"] <= r["ttft_p99"]
        assert 0 <= r["ttft_attainment"] <= 1 and r["deflected"] >= 0
    assert plot.stat().st_size > 0
    rc, out, _ = cli(["simulate", "--cluster", str(EXAMPLES / "cluster-colocated.toml"),
                      "--request-rate", "2", "--num-prompts", "20", "--prompt-tokens", "2000",
                      "--output-tokens", "16"], capsys)
    assert rc == 0 and "16 mixed" in out and "ttft_p95" in out


@pytest.mark.parametrize("args, needle", [
    (["--cluster", "/nonexistent.toml"], "does not exist"),
    (["--cluster", str(EXAMPLES / "cluster-colocated.toml"), "--pd-ratios", "1:3"],
     "needs a disaggregated cluster"),
    (["--cluster", str(EXAMPLES / "cluster-disaggregated.toml"), "--pd-ratios", "1-3"],
     "P:D pairs"),
    (["--cluster", str(EXAMPLES / "cluster-disaggregated.toml"), "--instances", "1"],
     "at least 2 instances"),
    (["--cluster", str(EXAMPLES / "cluster-colocated.toml"), "--mixed"], "--request-rate"),
    (["--instances", "4"], "need --cluster FILE"),
])
def test_cli_cluster_errors(args: list[str], needle: str,
                            capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = cli(["simulate", *args], capsys)
    assert rc == 2 and needle in err and err.count("\n") == 1 and out == ""


def test_prefill_instance_holds_kv_until_the_transfer_ends() -> None:
    """The prompt's KV stays on the prefill instance while it crosses the link; with room
    for one prompt, the next waits for the transfer (backpressure), then runs."""
    pools = (PoolConfig("p", role="prefill", policy="mbt:1024", num_kv_blocks=60, **HW),
             PoolConfig("d", role="decode", policy="mbt:1024", **HW))
    cfg = ClusterConfig(pools, router="round-robin", link=LinkConfig(0.01, 0.0))
    trace = [RequestSpec(0.0, 600, 4), RequestSpec(0.001, 600, 4)]
    first, second = simulate_cluster(trace, cfg, const).requests
    assert first.transfer_end is not None and first.transfer_end > 1.0  # 22 MB at 10 MB/s
    assert second.prefill is not None and second.prefill.first_scheduled_time is not None
    assert second.prefill.first_scheduled_time == first.transfer_end
    # With room for both, the second prompt does not wait for the link.
    roomy = ClusterConfig((dataclasses.replace(pools[0], num_kv_blocks=200), pools[1]),
                          router="round-robin", link=LinkConfig(0.01, 0.0))
    _, second = simulate_cluster(trace, roomy, const).requests
    assert second.prefill is not None and second.prefill.first_scheduled_time < 0.01
