"""``ppas.core.metrics.RunSummary``: one definition of a run's figures for the simulator,
the cluster and ``ppas bench``."""

from __future__ import annotations

import math

import pytest

from ppas.core.metrics import RUN_KEYS, Gaps, RequestMetrics, RunSummary


def req(arrival: float, e2e: float, **kw: float) -> RequestMetrics:
    return RequestMetrics(arrival_s=arrival, ttft=e2e / 2, e2e=e2e, tpot=0.01,
                          output_tokens=10, **kw)  # type: ignore[arg-type]


def test_makespan_counts_completed_requests_and_failures_count_in_num_requests() -> None:
    s = RunSummary.of([req(1.0, 2.0), req(2.0, 0.5), req(3.0, 4.0)], failed=2)
    assert (s.num_requests, s.failed, s.completed) == (5, 2, 3)
    assert s.makespan == pytest.approx(7.0 - 1.0)  # last completion - first submission
    assert s.mean_e2e == pytest.approx(6.5 / 3)
    assert s.good is None and s.slo_attainment is None and s.goodput is None
    assert tuple(s.record()) == RUN_KEYS
    assert s.record()["avg_latency"] == s.mean_e2e  # E2E's name in run records


def test_end_s_overrides_the_completion() -> None:
    """A live request is done when its stream closed (``end_s``), after its last token."""
    s = RunSummary.of([req(0.0, 1.0, end_s=1.25)])
    assert s.makespan == 1.25 and s.mean_e2e == 1.0


def test_slos_give_attainment_and_goodput() -> None:
    reqs = [req(0.0, 1.0, e2e_slo=1.0), req(0.0, 2.0, e2e_slo=1.0), req(0.0, 1.0, ttft_slo=0.1)]
    s = RunSummary.of(reqs, failed=1)
    assert s.good == 1  # equal to its SLO meets it; TTFT 0.5 > 0.1 misses
    assert s.slo_attainment == pytest.approx(1 / 4)
    assert s.goodput == pytest.approx(1 / 2.0)
    rec = s.record()
    assert rec["slo_attainment"] == s.slo_attainment and rec["goodput"] == s.goodput


def test_a_run_with_no_completed_request_is_nan() -> None:
    s = RunSummary.of([], failed=3)
    assert (s.num_requests, s.failed) == (3, 3)
    assert math.isnan(s.makespan) and math.isnan(s.mean_e2e) and s.good is None


def test_gaps_repeat_is_that_many_appends() -> None:
    # Gaps.repeat writes a step's equal gaps at once: the same doubles, in the same place
    # of ``one``, as appending each (so every mean and quantile is the same float).
    a, b = Gaps(), Gaps()
    odd = float.fromhex("0x1.fffffffffffffp-2")
    for value, count in ((0.1, 3), (1 / 3, 1), (2.5e-7, 0), (odd, 5)):
        a.repeat(value, count)
        for _ in range(count):
            b.one.append(value)
        a.add(7.0, 4)
        b.add(7.0, 4)
    assert a.one.tobytes() == b.one.tobytes()
    assert (a.values, a.counts) == (b.values, b.counts)
    assert a.mean() == b.mean() and a.quantiles((50, 99)) == b.quantiles((50, 99))
