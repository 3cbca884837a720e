"""A fake ``vllm serve`` for experiment tests: an OpenAI-compatible streaming server in its
own process, with a step log in the plugin's format, that can die on purpose.

One engine serves requests one at a time: a prompt is prefilled in chunks of
``--mbt`` tokens (``OVERHEAD_S + PER_TOKEN_S * chunk`` each), then its output tokens are
streamed ``OVERHEAD_S`` apart; every step is logged (``time``, ``duration_s``,
``prefill_chunks``, ``decode_contexts``). With ``FAKE_DIE_AFTER=N`` and
``FAKE_DIE_MARKER=FILE`` in the environment, the first server process that completes N
requests while FILE does not exist creates FILE and exits at once (a crash mid-run). With
``FAKE_FAIL_WHILE=FILE`` it answers every completion with HTTP 500 while FILE exists.
Like vLLM it does not watch its parent: ``FakeLauncher`` starts it the way ``VllmServer``
starts vLLM (``ppas.live.server.spawn_group``: own process group, dies with its parent on Linux,
recorded in the launch's pid file), so the tests see what a real server would do.

``FakeLauncher`` is ``ppas.experiment.servers``'s launcher interface around it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

OVERHEAD_S = 0.002
PER_TOKEN_S = 2e-5


def serve(port: int, step_log: str | None, mbt: int) -> None:
    from aiohttp import web

    die_after = int(os.environ.get("FAKE_DIE_AFTER", "0"))
    marker = os.environ.get("FAKE_DIE_MARKER")
    fail_while = os.environ.get("FAKE_FAIL_WHILE")
    lock = asyncio.Lock()
    done = [0]
    log = open(step_log, "a") if step_log else None  # noqa: SIM115

    def step(chunks: list[list[int]], ctx: list[int], dur: float) -> None:
        if log is not None:
            log.write(json.dumps({"time": time.monotonic(), "duration_s": dur,
                                  "prefill_chunks": chunks, "decode_contexts": ctx}) + "\n")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": request.app["model"], "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if fail_while and os.path.exists(fail_while):
            return web.json_response({"error": "fake failure"}, status=500)
        prompt = body["prompt"]
        n_prompt = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        async with lock:
            c = 0
            while c < n_prompt:
                k = min(mbt, n_prompt - c)
                dur = OVERHEAD_S + PER_TOKEN_S * k
                await asyncio.sleep(dur)
                step([[k, c]], [], dur)
                c += k
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = int(body["max_tokens"])
        for i in range(n):
            if i:
                await asyncio.sleep(OVERHEAD_S)
                step([], [n_prompt + i], OVERHEAD_S)
            chunk = {"choices": [{"index": 0, "text": "a", "finish_reason": None}],
                     "usage": {"prompt_tokens": n_prompt, "completion_tokens": i + 1}}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        if log is not None:
            log.flush()
        done[0] += 1
        if die_after and marker and done[0] >= die_after and not os.path.exists(marker):
            Path(marker).write_text("died\n")
            os._exit(1)
        return resp

    async def main() -> None:
        app = web.Application()
        app["model"] = os.environ.get("FAKE_MODEL", "fake")
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()  # serve until killed

    asyncio.run(main())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeLauncher:
    """``Launcher``: ``FakeLauncher(launch)`` is a context manager with ``base_url``."""

    started: list[Any] = []

    def __init__(self, launch: Any) -> None:
        self.launch = launch
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> FakeLauncher:
        from ppas.live.server import spawn_group  # not in the server process

        FakeLauncher.started.append(self.launch)
        cmd = [sys.executable, __file__, "--port", str(self.port),
               "--mbt", str(self.launch.max_num_batched_tokens)]
        if self.launch.step_log is not None:
            cmd += ["--step-log", str(self.launch.step_log)]
        env = {**os.environ, **self.launch.env, "FAKE_MODEL": self.launch.model}
        self.launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.launch.step_log is not None:
            self.launch.step_log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.launch.log_path, "wb") as log:
            self.proc = spawn_group(cmd, stdout=log, env=env, pid_file=self.launch.pid_file)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=1):
                    return self
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.__exit__()
        raise RuntimeError("fake server did not start")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            self.proc = None
            self.launch.pid_file.unlink(missing_ok=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--step-log")
    ap.add_argument("--mbt", type=int, default=2048)
    a = ap.parse_args()
    serve(a.port, a.step_log, a.mbt)
