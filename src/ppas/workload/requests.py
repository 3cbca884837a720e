"""A trace's requests: ``RequestSpec`` (arrival, lengths, SLOs, the shared prompt prefix),
``Trace`` (requests in arrival order) and SLO classes.

Every generator in this package returns a ``Trace``: requests sorted by arrival time
(seconds from the trace start).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ppas.core.config import require
from ppas.core.limits import MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS

Segments = tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a trace. ``slo_class`` names an SLO class (see ``SloClass``).

    ``prefix``: the shared content at the start of the prompt, as segments
    ``(stream, length)``; a segment's tokens are the first ``length`` tokens of the named
    stream, so requests share exactly the prompt prefix their segments agree on (a prefix
    group is one segment ``(group, shared length)``; a session's turns are one stream
    growing turn by turn). The rest of the prompt (``prompt_tokens - sum of lengths``) is
    unique to the request. Empty = a prompt shared with nobody (every trace before prefix
    caching).

    ``priority``: vLLM's per-request ``priority`` (lower is served first), read only by an
    engine under ``--scheduling-policy priority`` (``EngineConfig.scheduling_policy``).

    ``max_tokens``: the client's ``max_tokens``, a cap: the request stops after
    ``min(output_tokens, max_tokens)`` outputs (``output_tokens`` is where it stops on its
    own, at an EOS). None: the cap is ``output_tokens`` (a replay with ``ignore_eos``, every
    trace read from a file); 0: the client sent none, so vLLM's default, ``max_model_len``
    less the prompt (``TraceTransform.max_tokens``). Engines and policies see the cap
    (vLLM's ``Request.max_tokens``), never the length."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    ttft_slo: float | None = None
    tpot_slo: float | None = None
    slo_class: str | None = None
    prefix: Segments = ()
    priority: int = 0
    max_tokens: int | None = None

    @property
    def prefix_tokens(self) -> int:
        return sum(n for _, n in self.prefix)


#: Requests a reader or a transformation left out: ``(why, how many)``, in the order dropped.
Dropped = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Trace:
    """``description`` says in words where the requests came from and what was done to them
    (format, transformations, drops); ``dropped`` counts every request lost (a failed one in
    the file, one longer than a limit), by reason; ``excluded`` the requests outside the
    time window asked for (not lost: not asked for)."""

    requests: tuple[RequestSpec, ...]
    duration_s: float
    description: str = ""
    dropped: Dropped = ()
    excluded: int = 0

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[RequestSpec]:
        return iter(self.requests)


def check_lengths(prompt_tokens: int, output_tokens: int) -> None:
    """A generator's fixed lengths are within the per-request limits (``core.limits``)."""
    require(1 <= prompt_tokens <= MAX_PROMPT_TOKENS,
            f"prompt tokens must be in [1, {MAX_PROMPT_TOKENS}], got {prompt_tokens}")
    require(1 <= output_tokens <= MAX_OUTPUT_TOKENS,
            f"output tokens must be in [1, {MAX_OUTPUT_TOKENS}], got {output_tokens}")


@dataclass(frozen=True, slots=True)
class SloClass:
    """A request class with latency SLOs (seconds) and its share of the traffic."""

    name: str
    ttft_slo: float | None
    tpot_slo: float | None
    weight: float = 1.0
    prompt_tokens: int | None = None
    output_tokens: int | None = None


def assign_slo_classes(trace: Trace, classes: Sequence[SloClass], seed: int) -> Trace:
    """Tag each request with a class drawn by weight (seeded); a class may override the
    request's lengths."""
    require(len(classes) > 0, "need at least one SLO class")
    rng = random.Random(seed ^ 0x5105)
    weights = [c.weight for c in classes]
    out = []
    for r in trace:
        c = rng.choices(classes, weights)[0]
        pt = c.prompt_tokens or r.prompt_tokens
        prefix = r.prefix if sum(n for _, n in r.prefix) <= pt else ()
        out.append(RequestSpec(r.arrival_s, pt, c.output_tokens or r.output_tokens,
                               c.ttft_slo, c.tpot_slo, c.name, prefix, r.priority))
    return Trace(tuple(out), trace.duration_s, trace.description + " + slo classes",
                 trace.dropped, trace.excluded)
