"""Profile a live server's step costs with a designed probe workload (``ppas profile``).

Vidur profiles operators; we profile the real engine's own steps. A server running the
ppas plugin with a ``step_log`` records every step's shape and completion-timed duration;
this module sends requests shaped so that the log covers the four axes the cost model
separates (``ppas.cost.fitted``), then fits it:

* prefill chunk sizes x cached contexts: for each (c, p), one request of p tokens fills the
  prefix cache (itself a prefill probe on an empty cache), then one request of p + c tokens
  sharing that prefix computes a chunk of c tokens on top of p cached ones
  (``ppas.live.prompts.token_prompt`` prompts of one seed and index are prefixes of each other),
  with one output token, so its step holds exactly that chunk (with p a multiple of the
  server's KV block size; the server's budget may split a chunk, which the log records);
* decode batch sizes x decode contexts: b prompts of k tokens are sent once to fill the
  cache, then again at once with ``decode_tokens`` output tokens: after short cached
  prefills the server runs decode-only steps of b decodes at contexts k ... k + T.

Every step of the probe lands in the log with its real shape (chunking by the server's
budget, block-aligned prefix hits), so the fit never relies on the design being met
exactly. A step log shared with other traffic during the probe mixes that traffic in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ppas.calibrate.fit import fit_and_save, read_steps
from ppas.core.config import require
from ppas.core.errors import PpasError
from ppas.core.steplog import read_step_log
from ppas.cost.fitted import FittedCostModel
from ppas.live.client import ReplayOptions, run_trace
from ppas.workload import RequestSpec, Trace


@dataclass(frozen=True)
class ProbeDesign:
    """The probe grid. Defaults suit a GPU serving a 32k-context model; shrink them for
    a smaller context or a CPU server."""

    chunk_sizes: tuple[int, ...] = (128, 512, 2048, 8192)
    contexts: tuple[int, ...] = (0, 4096, 16384)
    decode_batches: tuple[int, ...] = (1, 8, 32, 128)
    decode_contexts: tuple[int, ...] = (1024, 16384)
    decode_tokens: int = 16
    repeats: int = 1

    def __post_init__(self) -> None:
        for name in ("chunk_sizes", "decode_batches", "decode_contexts"):
            v = getattr(self, name)
            require(len(v) > 0 and all(x >= 1 for x in v),
                    f"--{name.replace('_', '-')} must be integers >= 1, got {v}")
        require(len(self.contexts) > 0 and all(x >= 0 for x in self.contexts),
                f"--contexts must be integers >= 0, got {self.contexts}")
        require(self.decode_tokens >= 2, f"--decode-tokens must be >= 2, got "
                f"{self.decode_tokens}")
        require(self.repeats >= 1, f"--repeats must be >= 1, got {self.repeats}")

    @property
    def max_tokens(self) -> int:
        """The longest request (prompt + output) the design sends."""
        return max(max(self.contexts) + max(self.chunk_sizes) + 1,
                   max(self.decode_contexts) + self.decode_tokens)


@dataclass(frozen=True)
class Probe:
    """One probe: ``warm`` fills the prefix cache, then ``measured`` runs; both with
    prompts seeded by ``seed`` (request i of both traces shares the prompt of index i)."""

    label: str
    seed: int
    warm: Trace | None
    measured: tuple[Trace, ...]


def _trace(specs: list[tuple[int, int]], label: str) -> Trace:
    return Trace(tuple(RequestSpec(0.0, p, o) for p, o in specs), 0.0, label)


def probes(design: ProbeDesign, seed: int = 0) -> list[Probe]:
    """The probe plan, in the order it is sent. Seeds are distinct per probe, so no probe
    hits another's cached prefix."""
    out: list[Probe] = []
    s = seed * 100_000
    for _ in range(design.repeats):
        for p in design.contexts:
            for c in design.chunk_sizes:
                # Own seed per (p, c): a longer request after a shorter one of the same
                # prompt would hit the shorter one's cached tokens beyond p.
                warm = _trace([(p, 1)], f"cache {p}") if p else None
                out.append(Probe(f"chunk {c} on ctx {p}", s, warm,
                                 (_trace([(p + c, 1)], "chunk"),)))
                s += 1
        for k in design.decode_contexts:
            for b in design.decode_batches:
                out.append(Probe(f"decode {b} x ctx {k}", s, _trace([(k, 1)] * b, "cache"),
                                 (_trace([(k, design.decode_tokens)] * b, "decode"),)))
                s += 1
    return out


def count_steps(path: Path) -> int:
    """Steps in a step log (``ppas.core.steplog``'s reader); 0 when it does not exist yet."""
    return len(read_step_log(path).steps) if path.is_file() else 0


def wait_for_log(path: Path, before: int, settle_s: float = 1.0, timeout_s: float = 30.0
                 ) -> int:
    """Wait until the server has flushed the probe's steps (the plugin flushes when it
    goes idle): the step count has grown past ``before`` and not changed for
    ``settle_s``. Returns the count."""
    deadline = time.monotonic() + timeout_s
    last, since = count_steps(path), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        n = count_steps(path)
        if n != last:
            last, since = n, time.monotonic()
        elif n > before and time.monotonic() - since >= settle_s:
            return n
    return last


async def send_probes(base_url: str, model: str, plan: list[Probe], *, vocab_size: int,
                      filler_id: int, request_timeout_s: float,
                      on_probe: Callable[[int, Probe], None] | None = None) -> None:
    """Send every probe (warm-up trace, then its measured traces, each to completion).
    A failed request fails the profile with one line: a step log with holes would still
    fit, but the user asked for a designed grid."""
    for i, probe in enumerate(plan):
        if on_probe is not None:
            on_probe(i, probe)
        for trace in ((probe.warm,) if probe.warm else ()) + probe.measured:
            res = await run_trace(base_url, model, trace, ReplayOptions(
                prompt_seed=probe.seed, vocab_size=vocab_size, filler_id=filler_id,
                request_timeout_s=request_timeout_s))
            bad = [o for o in res.outcomes if not o.success]
            if bad:
                raise PpasError(f"probe {probe.label!r} ({trace.description}): request "
                                f"failed: {bad[0].error}")


def profile(base_url: str, model: str, step_log: str | Path, design: ProbeDesign,
            output: str | Path, *, vocab_size: int, filler_id: int = 1000, seed: int = 0,
            request_timeout_s: float = 600.0, kv_capacity_tokens: int | None = None,
            on_probe: Callable[[int, Probe], None] | None = None) -> FittedCostModel:
    """Run the probe against the server, fit ``ppas.cost.fitted`` to the steps it logged
    (only those: steps already in the log are skipped) and save it to ``output``. Returns
    the model."""
    log = Path(step_log)
    before = count_steps(log)
    plan = probes(design, seed)
    asyncio.run(send_probes(base_url, model, plan, vocab_size=vocab_size, filler_id=filler_id,
                            request_timeout_s=request_timeout_s, on_probe=on_probe))
    after = wait_for_log(log, before)
    if after <= before:
        raise PpasError(f"the step log {str(log)!r} got no steps from the probe; is the server "
                        "running the ppas plugin with this step_log "
                        "(--additional-config '{\"ppas\": {\"step_log\": ...}}') on this host?")
    steps = read_steps(log)[before:]  # steps of every server run in the log, in order
    return fit_and_save(steps, output, kv_capacity_tokens=kv_capacity_tokens,
                        sources=[f"{log} (steps {before + 1}-{after}, ppas profile)"])
