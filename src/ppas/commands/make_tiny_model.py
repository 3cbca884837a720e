"""``ppas make-tiny-model DIR``: a random-weight Qwen2 model and tokenizer, built offline
(``ppas.live.tiny_model``)."""

from __future__ import annotations

import argparse

from ppas.core.limits import MAX_MODEL_DIM, MAX_PROMPT_TOKENS, MAX_SEED, int_arg
from ppas.live.tiny_model import TinyModelConfig, make_tiny_model


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = TinyModelConfig()
    p.add_argument("out_dir", help="folder to write (created atomically)")
    size = int_arg(1, MAX_MODEL_DIM)
    p.add_argument("--hidden-size", type=size, default=d.hidden_size)
    p.add_argument("--num-layers", type=size, default=d.num_layers)
    p.add_argument("--num-heads", type=size, default=d.num_heads)
    p.add_argument("--num-kv-heads", type=size, default=d.num_kv_heads)
    p.add_argument("--intermediate-size", type=size, default=d.intermediate_size)
    p.add_argument("--vocab-size", type=size, default=d.vocab_size)
    p.add_argument("--max-position-embeddings", type=int_arg(1, MAX_PROMPT_TOKENS),
                   default=d.max_position_embeddings)
    p.add_argument("--seed", type=int_arg(0, MAX_SEED), default=d.seed)


def run(args: argparse.Namespace) -> int:
    sizes = {f: getattr(args, f) for f in ("hidden_size", "num_layers", "num_heads",
                                            "num_kv_heads", "intermediate_size", "vocab_size",
                                            "max_position_embeddings", "seed")}
    out = make_tiny_model(args.out_dir, **sizes)
    n = TinyModelConfig(**sizes).num_params
    print(f"tiny Qwen2 model ({n / 1e6:.1f}M params, float32) in {out}")
    return 0
