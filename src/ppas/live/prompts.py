"""The prompts a live replay sends (``ppas.live.client``): the paper's shape (128 random ids,
then one filler id repeated), shared-prefix segments for traces that share prompt prefixes,
and the served model's vocabulary that bounds the random ids.

Invariant: a prompt is a pure function of (seed, request index or stream name, length), so a
replay with the same ``prompt_seed`` sends the same prompts, and two requests share exactly
the prefix their trace says they share.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ppas.workload import RequestSpec

PREFIX_TOKENS = 128  # spec: each prompt starts with 128 random ids (defeats prefix caching)
DEFAULT_VOCAB = 32000  # prefix ids when the served model's vocabulary cannot be known
DEFAULT_FILLER = 1000
PROMPT_FORMATS = ("tokens", "text")
# Plain words that common BPE vocabularies encode as one token each (text prompts only).
_WORDS = (
    "time year people way day man thing woman life child world school state family "
    "student group country problem hand part place case week company system program "
    "question work government number night point home water room mother area money "
    "story fact month lot right study book eye job word business issue side kind head"
).split()


def token_prompt(index: int, seed: int, prompt_tokens: int, vocab_size: int,
                 filler_id: int) -> list[int]:
    """The paper's prompt: 128 random ids seeded by (seed, index), then ``filler_id``
    repeated; exactly ``prompt_tokens`` ids, all in ``[0, vocab_size)``."""
    rng = random.Random(seed * 1_000_003 + index)
    n = min(PREFIX_TOKENS, prompt_tokens)
    return [rng.randrange(vocab_size) for _ in range(n)] + [filler_id] * (prompt_tokens - n)


def text_prompt(index: int, seed: int, prompt_tokens: int) -> str:
    """A text prompt of ``prompt_tokens`` words (about as many tokens): 128 random words
    seeded by (seed, index), then one filler word repeated."""
    rng = random.Random(seed * 1_000_003 + index)
    n = min(PREFIX_TOKENS, prompt_tokens)
    return " ".join([rng.choice(_WORDS) for _ in range(n)] + ["hello"] * (prompt_tokens - n))


def segment_prompt(stream: str, seed: int, tokens: int, vocab_size: int) -> list[int]:
    """The first ``tokens`` ids of a shared stream (``RequestSpec.prefix``): random ids
    seeded by (seed, stream name), so every request naming the stream starts the same way
    and a longer segment extends a shorter one."""
    rng = random.Random(f"{seed}/{stream}")
    return [rng.randrange(vocab_size) for _ in range(tokens)]


def prompt(spec: RequestSpec, index: int, seed: int, prompt_format: str, vocab_size: int,
           filler_id: int) -> list[int] | str:
    """Request ``index``'s prompt: its shared prefix segments, then its own part."""
    if prompt_format == "text":
        return text_prompt(index, seed, spec.prompt_tokens)
    shared = [t for stream, n in spec.prefix for t in segment_prompt(stream, seed, n, vocab_size)]
    rest = spec.prompt_tokens - len(shared)
    return shared + (token_prompt(index, seed, rest, vocab_size, filler_id) if rest else [])


def model_vocab_size(folder: str | os.PathLike[str]) -> int | None:
    """How many token ids a local model folder accepts: the tokenizer's largest id + 1
    (``tokenizer.json``: vocabulary and added tokens; vLLM rejects larger ids as "out of
    vocabulary"), capped by ``config.json``'s ``vocab_size``; None when neither is readable."""
    d = Path(folder)
    sizes = []
    try:
        tok = json.loads((d / "tokenizer.json").read_text())
        vocab = tok["model"]["vocab"]
        ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
        ids += [t["id"] for t in tok.get("added_tokens") or []]
        sizes.append(max(int(i) for i in ids) + 1)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    try:
        sizes.append(int(json.loads((d / "config.json").read_text())["vocab_size"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    sizes = [n for n in sizes if n >= 1]
    return min(sizes) if sizes else None


def resolve_vocab_size(model: str, card: Mapping[str, Any]) -> tuple[int, str | None]:
    """The prefix-id range for ``--prompt-format tokens``: the served model's vocabulary,
    read from ``model`` when it is a local folder, else from the folder the server reports
    (vLLM's ``/v1/models`` ``root``). Returns (size, None), or (DEFAULT_VOCAB, a one-line
    note) when no folder can be read."""
    for where in (model, card.get("root")):
        if isinstance(where, str) and where and Path(where).is_dir():
            n = model_vocab_size(where)
            if n is not None:
                return n, None
    return DEFAULT_VOCAB, (f"the vocabulary of {model!r} is unknown (no local model folder "
                           f"and the server reports none); prefix ids are drawn from "
                           f"[0, {DEFAULT_VOCAB}): set --vocab-size to the model's")
