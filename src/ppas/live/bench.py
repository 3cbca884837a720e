"""The live benchmark: replay a ``Trace`` against an OpenAI-compatible ``/v1/completions``
endpoint (vLLM, SGLang, ...) and measure what the paper's client measures (spec "Metrics").

Invariants:

* every trace request yields exactly one ``RequestOutcome``, in trace order, whether it
  succeeded, failed, timed out or was cut off; a failure carries a one-line reason and the
  run goes on;
* latencies are measured from the request's *scheduled* submission time (run start + its
  arrival offset), so client lateness counts against the server as in the paper;
* a request succeeds only if its stream ended with ``[DONE]`` after at least the requested
  number of output tokens (``ignore_eos`` makes that count exact).

Tokens are counted from the stream: with ``stream_options.continuous_usage_stats`` (vLLM,
SGLang) each chunk's cumulative ``usage.completion_tokens`` gives the exact count per chunk;
otherwise each chunk carrying text counts as one token, and a final ``usage`` block, when
sent, overrides the total. ITLs are gaps between token-carrying chunks (as ``vllm bench
serve``); TPOT = (last token - first token) / max(tokens - 1, 1) is exact either way.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ppas.core.errors import PpasError
from ppas.core.metrics import tpot_of
from ppas.core.outputs import (
    check_output_dir,
    check_output_file,
    json_text,
    write_json_atomic,
    write_new_file,
)
from ppas.workload import (
    RequestSpec,
    Trace,
)

if TYPE_CHECKING:
    import aiohttp

PREFIX_TOKENS = 128  # spec: each prompt starts with 128 random ids (defeats prefix caching)
DEFAULT_VOCAB = 32000  # prefix ids when the served model's vocabulary cannot be known
DEFAULT_FILLER = 1000
METRICS = ("ttft", "tpot", "itl", "e2el")
METRIC_NAMES = {
    "ttft": "Time to First Token",
    "tpot": "Time per Output Token (excl. 1st token)",
    "itl": "Inter-token Latency",
    "e2el": "End-to-end Latency",
}
USAGE_MODES = ("continuous", "final", "off")
# Plain words that common BPE vocabularies encode as one token each (text prompts only).
_WORDS = (
    "time year people way day man thing woman life child world school state family "
    "student group country problem hand part place case week company system program "
    "question work government number night point home water room mother area money "
    "story fact month lot right study book eye job word business issue side kind head"
).split()


# ---------------------------------------------------------------- per-request results


@dataclass(slots=True)
class RequestOutcome:
    """What one request did. Times are seconds; ``scheduled_s``/``end_s`` count from the run
    start, ``ttft``/``latency``/``itl`` from the scheduled submission."""

    index: int
    arrival_s: float  # the trace's arrival time
    scheduled_s: float  # submission time from the run start (= arrival - first arrival)
    prompt_tokens: int  # as sent; replaced by the server's usage.prompt_tokens when given
    requested_tokens: int
    output_tokens: int = 0  # tokens received (also for failures: what arrived before)
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    latency: float | None = None  # last token - scheduled submission; successes only
    end_s: float | None = None  # when the request finished or failed, from the run start
    error: str = ""  # "" on success, else "<category>: detail" on one line

    @property
    def success(self) -> bool:
        return not self.error and self.latency is not None

    @property
    def tpot(self) -> float | None:
        """``metrics.tpot_of``; None for a failed request (it has no TPOT)."""
        if not self.success or self.ttft is None or self.latency is None:
            return None
        return tpot_of(self.ttft, self.latency, self.output_tokens)


@dataclass
class BenchResult:
    """All outcomes of one run, in trace order (one per trace request)."""

    outcomes: list[RequestOutcome]
    duration_s: float  # first submission -> last request ended (success or failure)
    description: str = ""
    interrupted: bool = False  # Ctrl-C: unfinished requests are failed as "cancelled"
    interrupted_by: str = ""  # "SIGINT" / "SIGTERM" when a signal stopped the run

    def summary(
        self,
        goodput: Mapping[str, float] | None = None,
        percentile_metrics: Sequence[str] = ("ttft", "tpot", "itl"),
        percentiles: Sequence[float] = (99.0,),
    ) -> dict[str, Any]:
        return summarize(self, goodput, percentile_metrics, percentiles)

    def per_request(self) -> dict[str, list[Any]]:
        """Per-request arrays in trace order (``vllm bench serve`` names; None where a
        failed request has no value)."""
        o = self.outcomes
        return {
            "arrival_s": [r.arrival_s for r in o],
            "scheduled_s": [r.scheduled_s for r in o],
            "end_s": [r.end_s for r in o],
            "input_lens": [r.prompt_tokens for r in o],
            "output_lens": [r.output_tokens for r in o],
            "ttfts": [r.ttft for r in o],
            "tpots": [r.tpot for r in o],
            "itls": [list(r.itl) for r in o],
            "e2els": [r.latency for r in o],
            "errors": [r.error for r in o],
        }


# ---------------------------------------------------------------- metrics


def _pword(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p)


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _pct(xs: Sequence[float], p: float) -> float | None:
    import numpy as np

    return float(np.percentile(xs, p)) if xs else None  # numpy linear, as the paper


def metric_values(result: BenchResult) -> dict[str, list[float]]:
    """Seconds per metric over successful requests (``itl`` pools all gaps)."""
    ok = [r for r in result.outcomes if r.success]
    return {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": [t for r in ok if (t := r.tpot) is not None],
        "itl": [g for r in ok for g in r.itl],
        "e2el": [r.latency for r in ok if r.latency is not None],
    }


def good_requests(result: BenchResult, goodput: Mapping[str, float]) -> int:
    """Successful requests meeting every given SLO (milliseconds, ``ttft``/``tpot``/``e2el``;
    ``vllm bench serve --goodput``: a value equal to the SLO meets it)."""
    n = 0
    for r in result.outcomes:
        if not r.success:
            continue
        vals = {"ttft": r.ttft, "tpot": r.tpot, "e2el": r.latency}
        if all((v := vals[k]) is not None and v * 1000.0 <= slo for k, slo in goodput.items()):
            n += 1
    return n


def summarize(
    result: BenchResult,
    goodput: Mapping[str, float] | None = None,
    percentile_metrics: Sequence[str] = ("ttft", "tpot", "itl"),
    percentiles: Sequence[float] = (99.0,),
) -> dict[str, Any]:
    """Run-level metrics. Seconds under the simulator's record names (``avg_latency``,
    ``p95_latency``, ``avg_ttft``, ``p95_ttft``, ``avg_tpot``, ``p95_tpot``, ``makespan``)
    and milliseconds under ``vllm bench serve`` names (``mean_ttft_ms``, ``p99_itl_ms``...).
    Means and percentiles are over successful requests; None when there are none."""
    o = result.outcomes
    ok = [r for r in o if r.success]
    vals = metric_values(result)
    ends = [r.end_s for r in ok if r.end_s is not None]
    makespan = max(ends) - min(r.scheduled_s for r in o) if ends else None
    dur = result.duration_s
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    s: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(o) - len(ok),
        "num_requests": len(o),
        "interrupted": result.interrupted,
        "interrupted_by": result.interrupted_by,
        "failure_reasons": dict(Counter(r.error.split(":")[0] for r in o if not r.success)),
        "duration": dur,
        "makespan": makespan,
        "avg_latency": _mean(vals["e2el"]),
        "p95_latency": _pct(vals["e2el"], 95),
        "avg_ttft": _mean(vals["ttft"]),
        "p95_ttft": _pct(vals["ttft"], 95),
        "avg_tpot": _mean(vals["tpot"]),
        "p95_tpot": _pct(vals["tpot"], 95),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / dur if dur > 0 else None,
        "output_throughput": out_tokens / dur if dur > 0 else None,
        "total_token_throughput": (in_tokens + out_tokens) / dur if dur > 0 else None,
    }
    if goodput:
        good = good_requests(result, goodput)
        s["goodput_slos_ms"] = dict(goodput)
        s["good_requests"] = good
        s["request_goodput"] = good / dur if dur > 0 else None
    for m in percentile_metrics:
        xs = [x * 1000.0 for x in vals[m]]
        s[f"mean_{m}_ms"] = _mean(xs)
        s[f"median_{m}_ms"] = _pct(xs, 50)
        s[f"std_{m}_ms"] = _std(xs)
        for p in percentiles:
            s[f"p{_pword(p)}_{m}_ms"] = _pct(xs, p)
    return s


def _std(xs: Sequence[float]) -> float | None:
    import numpy as np

    return float(np.std(xs)) if xs else None


def format_table(s: Mapping[str, Any], percentile_metrics: Sequence[str],
                 percentiles: Sequence[float]) -> str:
    """The ``vllm bench serve`` result table, plus the paper's seconds-based lines."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]

    def row(name: str, v: Any, digits: int = 2) -> None:
        if v is None:
            lines.append(f"{name:<40} {'n/a':<10}")
        elif isinstance(v, float):
            lines.append(f"{name:<40} {v:<10.{digits}f}")
        else:
            lines.append(f"{name:<40} {v:<10}")

    row("Successful requests:", s["completed"])
    row("Failed requests:", s["failed"])
    for reason, n in sorted(s["failure_reasons"].items()):
        row(f"  {reason}:", n)
    row("Benchmark duration (s):", s["duration"])
    row("Makespan (s):", s["makespan"])
    row("Total input tokens:", s["total_input_tokens"])
    row("Total generated tokens:", s["total_output_tokens"])
    row("Request throughput (req/s):", s["request_throughput"])
    if "request_goodput" in s:
        row("Request goodput (req/s):", s["request_goodput"])
    row("Output token throughput (tok/s):", s["output_throughput"])
    row("Total token throughput (tok/s):", s["total_token_throughput"])
    lines.append("{s:{c}^{n}}".format(s=" Paper metrics (s) ", n=50, c="-"))
    for key, name in (("latency", "E2E"), ("ttft", "TTFT"), ("tpot", "TPOT")):
        row(f"Mean {name} (s):", s[f"avg_{key}"], 4)
        row(f"P95 {name} (s):", s[f"p95_{key}"], 4)
    for m in percentile_metrics:
        lines.append("{s:{c}^{n}}".format(s=f" {METRIC_NAMES[m]} ", n=50, c="-"))
        label = m.upper()
        row(f"Mean {label} (ms):", s[f"mean_{m}_ms"])
        row(f"Median {label} (ms):", s[f"median_{m}_ms"])
        for p in percentiles:
            row(f"P{_pword(p)} {label} (ms):", s[f"p{_pword(p)}_{m}_ms"])
    lines.append("=" * 50)
    return "\n".join(lines)


# ---------------------------------------------------------------- prompts


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


# ---------------------------------------------------------------- HTTP


def normalize_base_url(url: str) -> str:
    """``http://HOST:PORT[/v1][/]`` -> ``http://HOST:PORT`` (no trailing ``/v1``)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PpasError(f"bad --base-url {url!r}; expected http://HOST:PORT (optionally /v1)")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise PpasError(f"bad --base-url {url!r}: the port must be in [1, 65535]")
    base = url.strip().rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _one_line(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]


async def check_server(session: aiohttp.ClientSession, base_url: str, model: str,
                       timeout_s: float = 10.0) -> dict[str, Any]:
    """Fail with one line when nothing answers at ``base_url`` or ``model`` is not served.
    Probes ``/v1/models``, then ``/health`` for servers without a model list. Returns the
    served model's card (vLLM's gives ``root``, the model path, and ``max_model_len``), or
    ``{}`` when the server lists none."""
    import aiohttp

    to = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with session.get(f"{base_url}/v1/models", timeout=to) as r:
            if r.status == 200:
                try:
                    data = await r.json(content_type=None)
                    cards = [m for m in data.get("data", []) if isinstance(m, dict)]
                    ids = [m["id"] for m in cards]
                except (ValueError, KeyError, AttributeError, TypeError):
                    return {}  # answered, but not with an OpenAI model list: still a server
                if ids and model not in ids:
                    raise PpasError(f"model {model!r} is not served at {base_url}; "
                                    f"served: {', '.join(map(str, ids))}")
                return next((c for c in cards if c["id"] == model), {})
        async with session.get(f"{base_url}/health", timeout=to) as r:
            if r.status != 200:
                raise PpasError(f"server at {base_url} answers /v1/models and /health with "
                                f"HTTP {r.status}; is it an OpenAI-compatible server?")
            return {}
    except aiohttp.ClientConnectorError as e:
        why = e.os_error.strerror or str(e.os_error)
        raise PpasError(f"cannot connect to {base_url} ({_one_line(why)}); is the server "
                        "up? --base-url expects http://HOST:PORT") from None
    except (aiohttp.ClientError, TimeoutError) as e:
        raise PpasError(f"server at {base_url} did not answer /v1/models within "
                        f"{timeout_s:g} s ({type(e).__name__})") from None


def _payload(model: str, prompt: list[int] | str, max_tokens: int, usage: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "ignore_eos": True,
    }
    if usage != "off":
        body["stream_options"] = {"include_usage": True,
                                  "continuous_usage_stats": usage == "continuous"}
    return body


async def _read_stream(resp: aiohttp.ClientResponse, out: RequestOutcome, start: float) -> None:
    """Consume one SSE completion stream into ``out`` (see the module doc for counting)."""
    counted, final_usage, last, done = 0, None, None, False
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue  # blank separators, comments, event:/id: fields
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            break
        now = time.perf_counter()
        try:
            obj = json.loads(data)
        except ValueError:
            out.error = f"bad stream: not JSON: {_one_line(data.decode(errors='replace'), 80)}"
            return
        if not isinstance(obj, dict):
            out.error = "bad stream: chunk is not a JSON object"
            return
        if "error" in obj:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            out.error = f"stream error: {_one_line(str(msg))}"
            return
        usage = obj.get("usage")
        ct = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            out.prompt_tokens = usage["prompt_tokens"]
        choices = obj.get("choices") or []
        if choices and isinstance(choices[0], dict):
            new = max(ct - counted, 0) if isinstance(ct, int) else int(bool(choices[0].get("text")))
            if new:
                if last is None:
                    out.ttft = now - start
                else:
                    out.itl.append(now - last)
                last, counted = now, counted + new
                out.output_tokens = counted  # kept if the stream breaks later
        if isinstance(ct, int):
            final_usage = ct
    out.output_tokens = final_usage if final_usage is not None else counted
    if not done:
        out.error = (f"cut off: stream ended without [DONE] after {out.output_tokens} of "
                     f"{out.requested_tokens} tokens")
    elif out.output_tokens < out.requested_tokens or last is None:
        out.error = f"cut off: {out.output_tokens} of {out.requested_tokens} tokens"
    else:
        out.latency = last - start


async def _send(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                out: RequestOutcome, start: float, timeout_s: float) -> None:
    """One request; never raises for server-side trouble, records it in ``out.error``."""
    import aiohttp

    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, json=body) as resp:
                if resp.status != 200:
                    text = await resp.text(errors="replace")
                    out.error = f"http {resp.status}: {_one_line(text)}"
                    return
                await _read_stream(resp, out, start)
    except TimeoutError:
        out.error = f"timeout: not finished {timeout_s:g} s after sending"
    except aiohttp.ClientError as e:  # refused, reset, disconnected, truncated payload
        out.error = f"connection error: {type(e).__name__}: {_one_line(str(e))}"
    except ValueError as e:  # an SSE line longer than aiohttp's reader limit
        out.error = f"bad stream: {_one_line(str(e))}"


# ---------------------------------------------------------------- the model's vocabulary


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


# ---------------------------------------------------------------- the run


def segment_prompt(stream: str, seed: int, tokens: int, vocab_size: int) -> list[int]:
    """The first ``tokens`` ids of a shared stream (``RequestSpec.prefix``): random ids
    seeded by (seed, stream name), so every request naming the stream starts the same way
    and a longer segment extends a shorter one."""
    rng = random.Random(f"{seed}/{stream}")
    return [rng.randrange(vocab_size) for _ in range(tokens)]


def _prompt(spec: RequestSpec, index: int, seed: int, prompt_format: str, vocab_size: int,
            filler_id: int) -> list[int] | str:
    if prompt_format == "text":
        return text_prompt(index, seed, spec.prompt_tokens)
    shared = [t for stream, n in spec.prefix for t in segment_prompt(stream, seed, n, vocab_size)]
    rest = spec.prompt_tokens - len(shared)
    return shared + (token_prompt(index, seed, rest, vocab_size, filler_id) if rest else [])


async def run_trace(
    base_url: str,
    model: str,
    trace: Trace,
    *,
    prompt_seed: int = 0,
    prompt_format: str = "tokens",
    vocab_size: int | None = None,
    filler_id: int | None = None,
    request_timeout_s: float = 1800.0,
    max_concurrency: int | None = None,
    num_warmups: int = 0,
    usage: str = "continuous",
    on_start: Callable[[], None] | None = None,
    on_done: Callable[[RequestOutcome], None] | None = None,
    keep_partial_on_cancel: bool = False,
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
    if prompt_format not in ("tokens", "text"):
        raise PpasError(f"unknown prompt format {prompt_format!r}; allowed: tokens, text")
    if usage not in USAGE_MODES:
        raise PpasError(f"unknown usage mode {usage!r}; allowed: {', '.join(USAGE_MODES)}")
    if len(trace) == 0:
        raise PpasError("the trace has no requests")
    if prompt_format == "text" and any(r.prefix for r in trace):
        raise PpasError("the trace shares prompt prefixes; they need --prompt-format tokens "
                        "(token ids, not words)")
    base = normalize_base_url(base_url)
    url = f"{base}/v1/completions"
    reqs = trace.requests
    t_first = reqs[0].arrival_s
    outcomes = [RequestOutcome(i, r.arrival_s, r.arrival_s - t_first, r.prompt_tokens,
                               r.output_tokens) for i, r in enumerate(reqs)]
    caught: list[signal.Signals] = []
    installed = _install_signal_handlers(caught) if keep_partial_on_cancel else []
    try:
        return await _run(base, url, model, trace, outcomes, prompt_seed, prompt_format,
                          vocab_size, filler_id, request_timeout_s, max_concurrency,
                          num_warmups, usage, on_start, on_done, keep_partial_on_cancel,
                          log, caught)
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


async def _run(base: str, url: str, model: str, trace: Trace, outcomes: list[RequestOutcome],
               prompt_seed: int, prompt_format: str, vocab_size: int | None,
               filler_id: int | None, request_timeout_s: float, max_concurrency: int | None,
               num_warmups: int, usage: str, on_start: Callable[[], None] | None,
               on_done: Callable[[RequestOutcome], None] | None, keep_partial_on_cancel: bool,
               log: Callable[[str], None] | None, caught: list[signal.Signals]) -> BenchResult:
    import aiohttp

    reqs = trace.requests
    # No client-side connection cap: concurrency is the trace's (or --max-concurrency).
    # aiohttp's default 300 s total timeout is replaced by the per-request one in _send.
    connector = aiohttp.TCPConnector(limit=0)
    no_timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=no_timeout) as session:
        card = await check_server(session, base, model)
        if prompt_format == "tokens" and vocab_size is None:
            vocab_size, note = resolve_vocab_size(model, card)
            if note is not None:
                (log or _log_stderr)(note)
        vocab = vocab_size or DEFAULT_VOCAB
        filler = min(DEFAULT_FILLER, vocab - 1) if filler_id is None else filler_id
        if prompt_format == "tokens" and not 0 <= filler < vocab:
            raise PpasError(f"filler token id {filler} must be in [0, vocab size {vocab})")
        for k in range(num_warmups):  # same shape as the first request, distinct prefixes
            w = RequestOutcome(-1 - k, 0.0, 0.0, reqs[0].prompt_tokens, reqs[0].output_tokens)
            body = _payload(model, _prompt(reqs[0], w.index, prompt_seed, prompt_format, vocab,
                                           filler), w.requested_tokens, usage)
            await _send(session, url, body, w, time.perf_counter(), request_timeout_s)
            if not w.success:
                raise PpasError(f"warm-up request {k + 1} failed: {w.error}")
        sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        if on_start is not None:
            on_start()
        t0 = time.perf_counter()

        async def one(out: RequestOutcome) -> None:
            spec = reqs[out.index]
            start = t0 + out.scheduled_s
            await asyncio.sleep(max(0.0, start - time.perf_counter()))
            # Built at its send time: long prompts of a long trace are never all in memory.
            body = _payload(model, _prompt(spec, out.index, prompt_seed, prompt_format, vocab,
                                           filler), spec.output_tokens, usage)
            try:
                if sem is None:
                    await _send(session, url, body, out, start, request_timeout_s)
                else:
                    async with sem:
                        await _send(session, url, body, out, start, request_timeout_s)
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
            if not keep_partial_on_cancel:
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


# ---------------------------------------------------------------- results file


def check_result_path(folder: str | os.PathLike[str] | None, filename: str | None,
                      inputs: Sequence[str | os.PathLike[str]] = ()) -> Path:
    """Where a results file will go, checked before the run (``ppas.core.outputs``): the file
    ``folder/filename`` (never one of ``inputs``), or, without a file name, the folder in
    which ``save_result`` will make a fresh name. Raises a one-line PpasError."""
    d = Path(folder if folder is not None else ".")
    if filename is not None:
        if not filename or Path(filename).name != filename:
            raise PpasError(f"--result-filename {filename!r} must be a file name "
                            "(put the folder in --result-dir)")
        return check_output_file(d / filename, "--result-filename", inputs)
    return check_output_dir(d, "--result-dir")


def result_record(result: BenchResult, summary: Mapping[str, Any], *, started: datetime,
                  base_url: str, model: str, seed: int, prompt_format: str) -> dict[str, Any]:
    """The results file's object: run facts, the summary, per-request arrays."""
    return {"date": started.isoformat(timespec="seconds"), "backend": "openai",
            "base_url": base_url, "model": model, "trace": result.description, "seed": seed,
            "prompt_format": prompt_format, **summary, **result.per_request()}


def save_result(dest: Path, record: Mapping[str, Any], *, named: bool, model: str,
                started: datetime) -> Path:
    """Write ``record`` atomically: over the file ``dest`` (``named``), or into the folder
    ``dest`` under a fresh ``bench-MODEL-TIME[-k].json`` that no concurrent run can take."""
    if named:
        return write_json_atomic(dest, record)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(model.rstrip("/")).name) or "model"
    return write_new_file(dest, f"bench-{slug}-{started:%Y%m%d-%H%M%S}", ".json",
                          json_text(record))
