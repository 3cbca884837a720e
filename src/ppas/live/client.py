"""The live replay: submit a ``Trace`` to an OpenAI-compatible server on the trace's
schedule and record one ``RequestOutcome`` per request (``ppas bench``, ``ppas profile``, the
experiment runner).

Invariants (see ``ppas.live.outcome``): request i is submitted ``arrival_i - arrival_0`` s
after the measured run starts and its latencies count from then; every request yields one
outcome in trace order; trouble during the run is recorded per request, never raised.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ppas.core.errors import PpasError
from ppas.live.http import USAGE_MODES, check_server, normalize_base_url, payload, send
from ppas.live.outcome import BenchResult, RequestOutcome
from ppas.live.prompts import (
    DEFAULT_FILLER,
    DEFAULT_VOCAB,
    PROMPT_FORMATS,
    prompt,
    resolve_vocab_size,
)
from ppas.workload import RequestSpec, Trace


@dataclass(frozen=True)
class ReplayOptions:
    """How ``run_trace`` replays a trace; the defaults are ``ppas bench``'s."""

    prompt_seed: int = 0  # request i's prompt prefix is seeded by (prompt_seed, i)
    prompt_format: str = "tokens"  # PROMPT_FORMATS: token ids, or approximate text
    vocab_size: int | None = None  # prefix ids in [0, N); None: the served model's
    filler_id: int | None = None  # the id after the prefix; None: min(1000, vocab - 1)
    request_timeout_s: float = 1800.0  # per request, after sending
    max_concurrency: int | None = None  # requests in flight; None: the trace's
    num_warmups: int = 0  # unmeasured requests shaped like the first, one at a time
    usage: str = "continuous"  # USAGE_MODES: the stream_options usage to request
    keep_partial_on_cancel: bool = False  # see run_trace

    def __post_init__(self) -> None:
        if self.prompt_format not in PROMPT_FORMATS:
            raise PpasError(f"unknown prompt format {self.prompt_format!r}; allowed: "
                            + ", ".join(PROMPT_FORMATS))
        if self.usage not in USAGE_MODES:
            raise PpasError(f"unknown usage mode {self.usage!r}; allowed: "
                            + ", ".join(USAGE_MODES))


async def run_trace(
    base_url: str,
    model: str,
    trace: Trace,
    options: ReplayOptions = ReplayOptions(),  # noqa: B008 (frozen: one shared default)
    *,
    on_start: Callable[[], None] | None = None,
    on_done: Callable[[RequestOutcome], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> BenchResult:
    """Replay ``trace`` (request i submitted ``arrival_i - arrival_0`` s after the start)
    and return one outcome per request. Request i's prompt prefix is seeded by
    (``prompt_seed``, i): replaying with the same ``prompt_seed`` against a server with prefix
    caching serves the prompts from its cache, so give each run on one server its own.
    Shared prefixes (``RequestSpec.prefix``) are ``segment_prompt`` ids, then the request's
    own part as above: the server's prefix cache sees exactly the trace's sharing.
    Raises PpasError only before the run (bad URL, server down, failed warm-up); trouble
    during the run is recorded per request.
    ``vocab_size`` None takes the served model's vocabulary (``resolve_vocab_size``; a note
    goes to ``log``, default stderr, when it cannot be known); ``filler_id`` None is
    ``min(1000, vocab_size - 1)``.
    ``on_start`` is called when the measured run begins, ``on_done`` per request. With
    ``keep_partial_on_cancel``, a cancellation, SIGINT or SIGTERM (in the main thread: the
    run installs handlers for both) returns the partial result with unfinished requests
    failed as ``cancelled`` instead of raising; a signal before the measured run starts
    raises ``Interrupted``."""
    if len(trace) == 0:
        raise PpasError("the trace has no requests")
    if options.prompt_format == "text" and any(r.prefix for r in trace):
        raise PpasError("the trace shares prompt prefixes; they need --prompt-format tokens "
                        "(token ids, not words)")
    base = normalize_base_url(base_url)
    reqs = trace.requests
    t_first = reqs[0].arrival_s
    outcomes = [RequestOutcome(i, r.arrival_s, r.arrival_s - t_first, r.prompt_tokens,
                               r.output_tokens) for i, r in enumerate(reqs)]
    caught: list[signal.Signals] = []
    installed = _install_signal_handlers(caught) if options.keep_partial_on_cancel else []
    try:
        return await _replay(base, model, trace, outcomes, options, caught,
                             on_start=on_start, on_done=on_done, log=log)
    except asyncio.CancelledError:
        if caught:  # a signal before the measured run: nothing to keep
            raise Interrupted(caught[0]) from None
        raise
    finally:
        loop = asyncio.get_running_loop()
        for sig in installed:
            loop.remove_signal_handler(sig)


class Interrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM before the measured run started; the CLI exits 128 + signal."""

    def __init__(self, sig: signal.Signals) -> None:
        super().__init__(sig.name)
        self.signum = int(sig)


def _install_signal_handlers(caught: list[signal.Signals]) -> list[signal.Signals]:
    """SIGINT and SIGTERM cancel the current task once (what Ctrl-C does under asyncio.run),
    so ``timeout``, ``kill`` and a container stop keep the partial results too."""
    if threading.current_thread() is not threading.main_thread():
        return []
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def on_signal(sig: signal.Signals) -> None:
        if not caught:  # a second signal must not cut the clean-up short
            caught.append(sig)
            task.cancel()

    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    return installed


async def _replay(base: str, model: str, trace: Trace, outcomes: list[RequestOutcome],
                  opt: ReplayOptions, caught: list[signal.Signals], *,
                  on_start: Callable[[], None] | None,
                  on_done: Callable[[RequestOutcome], None] | None,
                  log: Callable[[str], None] | None) -> BenchResult:
    import aiohttp

    reqs = trace.requests
    url = f"{base}/v1/completions"
    # No client-side connection cap: concurrency is the trace's (or --max-concurrency).
    # aiohttp's default 300 s total timeout is replaced by the per-request one in send.
    connector = aiohttp.TCPConnector(limit=0)
    no_timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=no_timeout) as session:
        card = await check_server(session, base, model)
        vocab_size = opt.vocab_size
        if opt.prompt_format == "tokens" and vocab_size is None:
            vocab_size, note = resolve_vocab_size(model, card)
            if note is not None:
                (log or _log_stderr)(note)
        vocab = vocab_size or DEFAULT_VOCAB
        filler = min(DEFAULT_FILLER, vocab - 1) if opt.filler_id is None else opt.filler_id
        if opt.prompt_format == "tokens" and not 0 <= filler < vocab:
            raise PpasError(f"filler token id {filler} must be in [0, vocab size {vocab})")

        def body(spec: RequestSpec, index: int) -> dict[str, Any]:
            return payload(model, prompt(spec, index, opt.prompt_seed, opt.prompt_format, vocab,
                                         filler), spec.output_tokens, opt.usage,
                           spec.priority)

        for k in range(opt.num_warmups):  # same shape as the first request, distinct prefixes
            w = RequestOutcome(-1 - k, 0.0, 0.0, reqs[0].prompt_tokens, reqs[0].output_tokens)
            await send(session, url, body(reqs[0], w.index), w, time.perf_counter(),
                       opt.request_timeout_s)
            if not w.success:
                raise PpasError(f"warm-up request {k + 1} failed: {w.error}")
        sem = asyncio.Semaphore(opt.max_concurrency) if opt.max_concurrency else None
        if on_start is not None:
            on_start()
        t0 = time.perf_counter()

        async def one(out: RequestOutcome) -> None:
            spec = reqs[out.index]
            start = t0 + out.scheduled_s
            await asyncio.sleep(max(0.0, start - time.perf_counter()))
            # Built at its send time: long prompts of a long trace are never all in memory.
            b = body(spec, out.index)
            try:
                if sem is None:
                    await send(session, url, b, out, start, opt.request_timeout_s)
                else:
                    async with sem:
                        await send(session, url, b, out, start, opt.request_timeout_s)
            finally:
                out.end_s = time.perf_counter() - t0
            if on_done is not None:
                on_done(out)

        tasks = [asyncio.create_task(one(o)) for o in outcomes]
        interrupted = False
        try:
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if not opt.keep_partial_on_cancel:
                raise
            interrupted = True
            for o in outcomes:
                if not o.success and not o.error:
                    o.error = "cancelled: run interrupted before this request finished"
        ends = [o.end_s for o in outcomes if o.end_s is not None]
    return BenchResult(outcomes, max(ends, default=0.0), trace.description, interrupted,
                       caught[0].name if caught else "")


def _log_stderr(msg: str) -> None:
    print(f"ppas bench: note: {msg}", file=sys.stderr)
