"""An experiment's server: ``[model]`` and ``[engine]`` (``ppas.experiment.spec``, the file)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ppas.core.config import (
    check_at_most,
    check_fields,
    check_keys,
    config_error,
    from_table,
    require,
)
from ppas.core.limits import (
    MAX_NUM_SEQS,
    MAX_OUTPUT_TOKENS,
    MAX_PROMPT_TOKENS,
    MAX_TIMEOUT_S,
    MAX_TP,
    MAX_VOCAB,
)

DTYPES = ("auto", "float32", "float16", "bfloat16")
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: ``vllm serve`` flags ppas sets itself: the server listens on 127.0.0.1 at a port ppas
#: picks (``ppas.live.server``), so ``extra_args`` may not move it
OWN_FLAGS = ("--host", "--port", "--uds")


@dataclass(frozen=True)
class ModelTable:
    """``[model]`` as written (``ModelSpec.parse`` resolves it)."""

    path: str
    vocab_size: int | None = None  # None: the model folder's

    def __post_init__(self) -> None:
        require(bool(self.path.strip()), "must be a local model folder or a Hugging Face id "
                "ORG/NAME", key="path")
        check_fields(self, "vocab_size", at_least=2)
        check_at_most(self, MAX_VOCAB, "vocab_size")


@dataclass(frozen=True)
class ModelSpec:
    """``path``: a local folder (with config.json) or a Hugging Face id ``ORG/NAME``
    (downloaded by vLLM on the machine that runs the experiment)."""

    path: str
    vocab_size: int
    local: bool
    max_position_embeddings: int | None = None

    @staticmethod
    def parse(obj: object) -> ModelSpec:
        t = from_table(ModelTable, obj, "model")
        path, vocab = t.path.strip(), t.vocab_size
        p = Path(path).expanduser()
        if p.is_dir():
            try:
                cfg = json.loads((p / "config.json").read_text())
                file_vocab = int(cfg["vocab_size"])
                ctx = cfg.get("max_position_embeddings")
            except (OSError, ValueError, KeyError, TypeError):
                raise config_error("model", "path", f"{path!r} has no readable config.json "
                                   "with vocab_size (a Hugging Face model folder)") from None
            if vocab is not None and vocab > file_vocab:
                raise config_error("model", "vocab_size", f"must be <= the model's vocab_size "
                                   f"{file_vocab}, got {vocab}")
            return ModelSpec(str(p), vocab or file_vocab, True,
                             int(ctx) if isinstance(ctx, int) else None)
        if path.startswith((".", "/", "~")) or not _HF_ID.match(path):
            raise config_error("model", "path", f"no model folder {path!r} (and not a Hugging "
                               "Face id ORG/NAME); for the demo run `make demo` or "
                               "`ppas make-tiny-model`")
        return ModelSpec(path, vocab or 32000, False)


@dataclass(frozen=True)
class EngineSpec:
    """Engine arguments shared by every arm (``vllm serve`` flags); ``[engine]``'s keys."""

    dtype: str | None = None  # None: ppas.live.server's default (float32 on CPU)
    max_model_len: int | None = None
    max_num_seqs: int = 256
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool | None = None
    enforce_eager: bool | None = None
    startup_timeout_s: float = 900.0
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # the file's [engine.env] NAME = "value" table

    def __post_init__(self) -> None:
        check_fields(self, "dtype", one_of=DTYPES)
        check_fields(self, "max_model_len", "max_num_seqs", "tensor_parallel_size", at_least=1)
        check_at_most(self, MAX_PROMPT_TOKENS + MAX_OUTPUT_TOKENS, "max_model_len")
        check_at_most(self, MAX_NUM_SEQS, "max_num_seqs")
        check_at_most(self, MAX_TP, "tensor_parallel_size")
        check_at_most(self, MAX_TIMEOUT_S, "startup_timeout_s")
        gmu = self.gpu_memory_utilization
        require(gmu is None or 0 < gmu <= 1, f"must be in (0, 1], got {gmu}",
                key="gpu_memory_utilization")
        check_fields(self, "startup_timeout_s", above=0)
        require(all(self.extra_args), "must be a list of strings (vllm serve flags), got "
                f"{list(self.extra_args)!r}", key="extra_args")
        own = [a for a in self.extra_args if a.split("=", 1)[0] in OWN_FLAGS]
        require(not own, f"may not set {', '.join(OWN_FLAGS)} (the server listens on "
                f"127.0.0.1 at a port ppas picks), got {own[0] if own else ''!r}",
                key="extra_args")
        require(all(_ENV_NAME.match(k) for k, _ in self.env), "must be a table NAME = "
                f"\"value\" of environment variables, got {dict(self.env)!r}", key="env")

    @staticmethod
    def parse(obj: object) -> EngineSpec:
        t = check_keys(obj if obj is not None else {}, "engine", EngineSpec)
        env = t.get("env", {})
        if not isinstance(env, Mapping) or not all(
                isinstance(v, str | int | float) and not isinstance(v, bool)
                for v in env.values()):
            raise config_error("engine", "env", "must be a table NAME = \"value\" of "
                               f"environment variables, got {env!r}")
        t["env"] = tuple((str(k), str(v)) for k, v in env.items())
        return from_table(EngineSpec, t, "engine")

    def args(self) -> list[str]:
        """The shared ``vllm serve`` flags (after ``ppas.live.server``'s CPU defaults: later
        flags win in vLLM's argument parser)."""
        a = ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.dtype is not None:
            a += ["--dtype", self.dtype]
        if self.max_model_len is not None:
            a += ["--max-model-len", str(self.max_model_len)]
        if self.gpu_memory_utilization is not None:
            a += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.enable_prefix_caching is not None:
            a.append("--enable-prefix-caching" if self.enable_prefix_caching
                     else "--no-enable-prefix-caching")
        if self.enforce_eager:
            a.append("--enforce-eager")
        return a + list(self.extra_args)
