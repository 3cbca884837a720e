"""``ppas make-tiny-model`` and ``VllmServer``'s argument handling (no server started)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppas.cli import main
from ppas.core.errors import PpasError
from ppas.live.server import VllmServer
from ppas.live.tiny_model import STAMP, TinyModelConfig, make_tiny_model

SMALL = dict(hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
             intermediate_size=128, vocab_size=512, max_position_embeddings=1024)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"hidden_size": 0}, "hidden_size must be >= 1"),
        ({"num_heads": 3}, "multiple of num_heads"),
        ({"num_kv_heads": 3}, "multiple of num_kv_heads"),
        ({"hidden_size": 72, "num_heads": 9, "num_kv_heads": 1}, "multiple of 16"),
        ({"vocab_size": 100}, "vocab_size must be >= 300"),
        ({"hidden_size": 4096, "intermediate_size": 16384}, "over the 60,000,000 limit"),
    ],
)
def test_bad_sizes(kw: dict[str, int], match: str) -> None:
    with pytest.raises(PpasError, match=match):
        TinyModelConfig(**kw)


def test_cli_bad_flag_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["make-tiny-model", str(tmp_path / "m"), "--num-heads", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "multiple of num_heads" in err
    assert not (tmp_path / "m").exists()


def test_generate_idempotent_atomic_and_loadable(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "m"
    make_tiny_model(out, **SMALL)
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", STAMP} <= files
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary left behind
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    make_tiny_model(out, **SMALL)  # same settings: untouched
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime

    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["torch_dtype"] == "float32"
    model = AutoModelForCausalLM.from_pretrained(out)
    assert sum(p.numel() for p in model.parameters()) == TinyModelConfig(**SMALL).num_params
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == 512
    ids = tok("Hello, world! some text")["input_ids"]
    assert ids and max(ids) < 512 and tok.decode(ids) == "Hello, world! some text"

    make_tiny_model(out, **{**SMALL, "seed": 1})  # different settings: replaced
    assert json.loads((out / STAMP).read_text())["seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_refuses_foreign_folder(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(PpasError, match="not a tiny model's \\(keep.txt\\)"):
        make_tiny_model(tmp_path, **SMALL)
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_never_replaces_a_folder_with_user_files(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 11: an older tiny model plus the user's files was replaced, deleting them; '.'
    left a '..old.*' folder; an unwritable folder was a traceback. All fail before any work."""
    old = tmp_path / "m"
    old.mkdir()
    (old / STAMP).write_text(json.dumps({"seed": 99}))
    (old / "config.json").write_text("{}")
    (old / "notes.txt").write_text("mine")
    with pytest.raises(PpasError, match="holds files that are not a tiny model's"):
        make_tiny_model(old, **SMALL)
    assert (old / "notes.txt").read_text() == "mine" and (old / STAMP).exists()
    monkeypatch.chdir(old)
    for here in (".", str(old), str(tmp_path)):
        with pytest.raises(PpasError, match="is the current folder"):
            make_tiny_model(here, **SMALL)
    (tmp_path / "file").write_text("x")
    with pytest.raises(PpasError, match="is a file, not a folder"):
        make_tiny_model(tmp_path / "file" / "m", **SMALL)
    with pytest.raises(PpasError, match="cannot create files in '/sys'"):  # read-only for all
        make_tiny_model("/sys/ppas-tiny", **SMALL)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "m"]


def test_server_command_and_bad_input(tmp_path: Path) -> None:
    with pytest.raises(PpasError, match="missing config.json"):
        VllmServer(tmp_path, policy=None, max_num_batched_tokens=2048)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(PpasError, match="step_log needs the plugin"):
        VllmServer(tmp_path, policy=None, max_num_batched_tokens=2048, step_log="x.jsonl")
    stock = VllmServer(tmp_path, policy=None, max_num_batched_tokens=2048, port=1234)
    assert "--scheduler-cls" not in stock.command() and stock.base_url.endswith(":1234")
    srv = VllmServer(tmp_path, policy="ppas:b_max=2048", max_num_batched_tokens=2048,
                     step_log="s.jsonl", extra_args=["--enforce-eager"])
    cmd = srv.command()
    assert cmd[cmd.index("--scheduler-cls") + 1] == "ppas.vllm.PolicyScheduler"
    extra = json.loads(cmd[cmd.index("--additional-config") + 1])
    assert extra == {"ppas": {"policy": "ppas:b_max=2048", "step_log": "s.jsonl"}}
    assert cmd[-1] == "--enforce-eager" and "float32" in cmd
