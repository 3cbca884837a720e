"""One OpenAI-compatible ``/v1/completions`` server (vLLM, SGLang, ...) as the live replay
sees it: its URL, a check that it serves the model, and one streamed request.

A request succeeds only if its stream ended with ``[DONE]`` after at least the requested
number of output tokens (``ignore_eos`` makes that count exact); any trouble is recorded in
its ``RequestOutcome.error`` on one line, never raised.

Tokens are counted from the stream: with ``stream_options.continuous_usage_stats`` (vLLM,
SGLang) each chunk's cumulative ``usage.completion_tokens`` gives the exact count per chunk;
otherwise each chunk carrying text counts as one token, and a final ``usage`` block, when
sent, overrides the total. ITLs are gaps between token-carrying chunks (as ``vllm bench
serve``); TPOT = (last token - first token) / max(tokens - 1, 1) is exact either way.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from ppas.core.errors import PpasError
from ppas.live.outcome import RequestOutcome

if TYPE_CHECKING:
    import aiohttp

USAGE_MODES = ("continuous", "final", "off")  # what stream_options usage to request


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


def public_url(url: str) -> str:
    """``url`` fit to save or share: no ``user:password@``, query or fragment (a base URL
    with credentials still sends them; only what is written down loses them)."""
    parts = urlsplit(url.strip())
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def one_line(text: str, limit: int = 200) -> str:
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
        raise PpasError(f"cannot connect to {base_url} ({one_line(why)}); is the server "
                        "up? --base-url expects http://HOST:PORT") from None
    except (aiohttp.ClientError, TimeoutError) as e:
        raise PpasError(f"server at {base_url} did not answer /v1/models within "
                        f"{timeout_s:g} s ({type(e).__name__})") from None


def payload(model: str, prompt: list[int] | str, max_tokens: int, usage: str,
            priority: int = 0) -> dict[str, Any]:
    """A streamed completion of exactly ``max_tokens`` greedy tokens (``ignore_eos``);
    ``priority`` (a trace's column) is sent when not 0, vLLM's default (a server without
    ``--scheduling-policy priority`` rejects it, as vLLM does)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "ignore_eos": True,
    }
    if priority:
        body["priority"] = priority
    if usage != "off":
        body["stream_options"] = {"include_usage": True,
                                  "continuous_usage_stats": usage == "continuous"}
    return body


async def read_stream(resp: aiohttp.ClientResponse, out: RequestOutcome, start: float) -> None:
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
            out.error = f"bad stream: not JSON: {one_line(data.decode(errors='replace'), 80)}"
            return
        if not isinstance(obj, dict):
            out.error = "bad stream: chunk is not a JSON object"
            return
        if "error" in obj:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            out.error = f"stream error: {one_line(str(msg))}"
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
        out.e2e = last - start


async def send(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                out: RequestOutcome, start: float, timeout_s: float) -> None:
    """One request; never raises for server-side trouble, records it in ``out.error``."""
    import aiohttp

    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, json=body) as resp:
                if resp.status != 200:
                    text = await resp.text(errors="replace")
                    out.error = f"http {resp.status}: {one_line(text)}"
                    return
                await read_stream(resp, out, start)
    except TimeoutError:
        out.error = f"timeout: not finished {timeout_s:g} s after sending"
    except aiohttp.ClientError as e:  # refused, reset, disconnected, truncated payload
        out.error = f"connection error: {type(e).__name__}: {one_line(str(e))}"
    except ValueError as e:  # an SSE line longer than aiohttp's reader limit
        out.error = f"bad stream: {one_line(str(e))}"
