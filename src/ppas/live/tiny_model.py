"""``ppas make-tiny-model DIR``: a random-weight Qwen2 model and tokenizer, built offline.

The folder is a normal Hugging Face checkpoint (``config.json``, ``model.safetensors``,
tokenizer files) that ``vllm serve DIR`` loads. Weights are float32 and seeded, so the same
flags give the same model. Invariants: the output folder is either absent or complete (it
is written to a temporary sibling and renamed into place), and an existing complete folder
with the same settings is left untouched (idempotent).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ppas.core.errors import PpasError
from ppas.core.outputs import folder_mode

#: Written last; its presence (with matching settings) marks a complete folder.
STAMP = "ppas_tiny_model.json"
#: Everything a tiny-model folder may hold; a folder with anything else is never replaced.
MODEL_FILES = frozenset({
    STAMP, "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "added_tokens.json", "chat_template.jinja",
})
MAX_PARAMS = 60_000_000


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the model. Defaults give ~4M parameters: fast enough for CPU e2e tests.

    The weights use a larger init scale than Hugging Face's default (0.02) so that greedy
    argmax margins are wide: chunked and unchunked prefill then pick the same tokens even
    though float32 sums differ in the last bits.
    """

    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 704
    vocab_size: int = 4096
    max_position_embeddings: int = 8192
    seed: int = 0
    init_std: float = 0.1

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "intermediate_size", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise PpasError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab_size < 300:
            raise PpasError(
                f"vocab_size must be >= 300 (256 bytes + specials), got {self.vocab_size}"
            )
        if self.hidden_size % self.num_heads:
            raise PpasError(
                f"hidden_size ({self.hidden_size}) must be a multiple of "
                f"num_heads ({self.num_heads})"
            )
        if self.num_heads % self.num_kv_heads:
            raise PpasError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        head_dim = self.hidden_size // self.num_heads
        if head_dim % 16:
            raise PpasError(
                f"head size hidden_size/num_heads = {head_dim} must be a "
                "multiple of 16 (vLLM's CPU attention supports 32, 64, 80, 96, 112, 128, ...)"
            )
        if not self.init_std > 0:
            raise PpasError(f"init_std must be > 0, got {self.init_std}")
        if self.num_params > MAX_PARAMS:
            raise PpasError(
                f"{self.num_params:,} parameters is over the "
                f"{MAX_PARAMS:,} limit; use smaller sizes"
            )

    @property
    def num_params(self) -> int:
        """Parameter count (tied embeddings), computed from the shape alone."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        kv = self.num_kv_heads * (h // self.num_heads)
        attn = h * h + 2 * h * kv + h * h + h + 2 * kv  # q, k, v, o (+ q/k/v biases)
        mlp = 3 * h * i
        return v * h + self.num_layers * (attn + mlp + 2 * h) + h


def _build_tokenizer(vocab_size: int):  # type: ignore[no-untyped-def]
    """A byte-level BPE tokenizer (Qwen2-style) with exactly ``vocab_size`` ids, trained in
    code on a seeded synthetic corpus; ids the merges do not reach are filler tokens."""
    import random
    import string

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    letters = string.ascii_lowercase
    words = ["".join(rng.choices(letters, k=rng.randint(2, 8))) for _ in range(20_000)]
    corpus = (
        " ".join(rng.choices(words, k=64)) + ". Hello, World! 0123456789\n" for _ in range(4000)
    )
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    n = tok.get_vocab_size()
    if n < vocab_size:
        tok.add_tokens([f"<|filler_{k}|>" for k in range(n, vocab_size)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=1 << 30,
    )


def _matches(out: Path, cfg: TinyModelConfig) -> bool:
    try:
        return bool(json.loads((out / STAMP).read_text()) == asdict(cfg))
    except (OSError, ValueError):
        return False


def check_model_dir(out_dir: str | os.PathLike[str]) -> Path:
    """The folder to (re)write, checked before any work: creatable, not the working folder
    or one above it, and either absent, empty, or an earlier tiny model with no other files
    (so replacing it can delete nothing of the user's). Returns the absolute path."""
    from ppas.core.outputs import check_output_dir

    out = Path(os.path.abspath(out_dir))
    cwd = Path.cwd().resolve()
    if out.exists() and (out.resolve() == cwd or out.resolve() in cwd.parents):
        raise PpasError(f"{str(out_dir)!r} is the current folder (or holds it); give a new "
                        "folder name, e.g. ./tiny-model")
    check_output_dir(out, "model folder")
    if out.is_dir():
        other = sorted(p.name for p in out.iterdir() if p.name not in MODEL_FILES)
        if other:
            raise PpasError(f"{out} holds files that are not a tiny model's "
                            f"({', '.join(other[:3])}{', ...' if len(other) > 3 else ''}); "
                            "remove them or give another folder")
        if any(out.iterdir()) and not (out / STAMP).exists():
            raise PpasError(f"{out} exists and is not a tiny model; remove it first")
    return out


def make_tiny_model(
    out_dir: str | os.PathLike[str],
    *,
    hidden_size: int = 256,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 704,
    vocab_size: int = 4096,
    max_position_embeddings: int = 8192,
    seed: int = 0,
) -> Path:
    """Write the model to ``out_dir`` (atomically) unless an identical one is already there.

    Returns the folder. Raises ``PpasError`` on bad sizes or when ``out_dir`` holds
    something else (a file, or a folder that is not one of our models).
    """
    cfg = TinyModelConfig(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings,
        seed=seed,
    )
    out = check_model_dir(out_dir)
    if _matches(out, cfg):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write_model_files(tmp, cfg)
        (tmp / STAMP).write_text(json.dumps(asdict(cfg), indent=2, sort_keys=True))
        os.chmod(tmp, folder_mode())  # mkdtemp's 0700 until complete, then mkdir's mode
        if out.exists():  # an older or different tiny model: replace it
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.replace(out, old / "m")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def write_model_files(folder: Path, cfg: TinyModelConfig) -> None:
    """The checkpoint (weights, config, tokenizer) into ``folder`` (the stamp excepted)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hf_cfg = Qwen2Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        initializer_range=cfg.init_std,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    hf_cfg.architectures = ["Qwen2ForCausalLM"]
    torch.manual_seed(cfg.seed)
    model = Qwen2ForCausalLM(hf_cfg).float().eval()
    with torch.no_grad():  # random biases too, so every layer contributes
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, cfg.init_std)

    model.save_pretrained(folder)
    cfg_path = folder / "config.json"
    data = json.loads(cfg_path.read_text())
    data["torch_dtype"] = data["dtype"] = "float32"
    cfg_path.write_text(json.dumps(data, indent=2, sort_keys=True))
    _build_tokenizer(cfg.vocab_size).save_pretrained(folder)
