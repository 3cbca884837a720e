"""Fixtures shared by test modules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    """A stand-in model folder: a ``config.json`` with what ``ppas experiment`` reads of a
    local model (its vocabulary size and context), no weights."""
    m = tmp_path / "model"
    m.mkdir()
    (m / "config.json").write_text(json.dumps({"vocab_size": 5000,
                                               "max_position_embeddings": 4096}))
    return m
