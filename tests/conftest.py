"""Fixtures shared by test modules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# No property test here is about speed: under ``make test`` (2 cores, a ``vllm serve`` beside
# this worker) hypothesis's default 200 ms per-example deadline and its too-slow health check
# fail at random, as Flaky/DeadlineExceeded. Tests that set either keep their own value.
settings.register_profile("ppas", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ppas")


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    """A stand-in model folder: a ``config.json`` with what ``ppas experiment`` reads of a
    local model (its vocabulary size and context), no weights."""
    m = tmp_path / "model"
    m.mkdir()
    (m / "config.json").write_text(json.dumps({"vocab_size": 5000,
                                               "max_position_embeddings": 4096}))
    return m


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n 2 --dist loadgroup`` (``make test``) the tests that start a real
    ``vllm serve`` run one after another on one worker, so that at most one server shares
    the two cores with the other worker's tests (each server uses every core it sees)."""
    for item in items:
        if item.get_closest_marker("e2e") is not None:
            item.add_marker(pytest.mark.xdist_group("vllm-serve"))
