"""Build vLLM's real V1 scheduler on CPU without a model, as vLLM's own tests do
(``tests/v1/core/utils.py::create_scheduler``), and drive it with hand-made model outputs.

The tests of the plugin (``tests/test_vllm_*.py``, ``tests/test_differential.py``) and the
scheduler benchmarks (``benchmarks/plugin_overhead.py``, ``benchmarks/admission_scan.py``)
build their schedulers here. Imports vLLM and torch: load it only where vLLM is installed.
"""

from __future__ import annotations

import functools
import json
import os
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK_SIZE = 16
EOS = 0


def tiny_model_dir(tmp_root: Path | None = None) -> str:
    """``$PPAS_TINY_MODEL`` if set, else a tiny model generated under ``tmp_root``."""
    env = os.environ.get("PPAS_TINY_MODEL")
    if env and Path(env, "config.json").is_file():
        return env
    from ppas.live.tiny_model import make_tiny_model

    root = tmp_root or Path(".cache")
    return str(make_tiny_model(root / "tiny-qwen2"))


def make_scheduler(
    model_dir: str,
    *,
    policy: str | None,
    max_num_batched_tokens: int,
    max_num_seqs: int = 256,
    num_blocks: int = 10_000,
    enable_prefix_caching: bool = False,
    step_log: str | None = None,
    cost_model: str | None = None,
    async_scheduling: bool = False,
    cls: type[Scheduler] | None = None,
    data_parallel: tuple[int, int] = (0, 1),
    scheduling_policy: str = "fcfs",
) -> Scheduler:
    """A ``PolicyScheduler`` (``policy`` given) or stock ``Scheduler`` with a fake KV cache
    of ``num_blocks`` blocks of ``BLOCK_SIZE`` tokens and no tensors. ``data_parallel`` is
    ``(rank, size)``: the scheduler of that data-parallel engine core (its config only;
    no process group, no coordinator). ``scheduling_policy``: vLLM's
    ``--scheduling-policy`` (fcfs, priority)."""
    additional: dict[str, Any] = {}
    if policy is not None:
        additional = {"ppas": {"policy": policy}}
        if step_log:
            additional["ppas"]["step_log"] = step_log
        if cost_model:
            additional["ppas"]["cost_model"] = cost_model
    vllm_config = make_vllm_config(
        model_dir, json.dumps(additional), max_num_batched_tokens, max_num_seqs, num_blocks,
        enable_prefix_caching, async_scheduling,
        *(() if data_parallel == (0, 1) else (data_parallel,)),  # one cache key per config
        **({} if scheduling_policy == "fcfs" else {"scheduling_policy": scheduling_policy}),
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    if cls is None:
        if policy is None:
            cls = AsyncScheduler if async_scheduling else Scheduler
        else:
            from ppas.live.plugin import PolicyScheduler

            cls = PolicyScheduler
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        block_size=BLOCK_SIZE,
        log_stats=False,
        structured_output_manager=StructuredOutputManager(vllm_config),
    )


@functools.lru_cache(maxsize=64)
def make_vllm_config(
    model_dir: str,
    additional_json: str,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    num_blocks: int,
    enable_prefix_caching: bool,
    async_scheduling: bool,
    data_parallel: tuple[int, int] = (0, 1),
    scheduling_policy: str = "fcfs",
) -> VllmConfig:
    """The VllmConfig of ``make_scheduler`` (cached: building a ModelConfig reads files)."""
    model_config = ModelConfig(model=model_dir, dtype="float32", seed=0, max_model_len=8192)
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=model_config.max_model_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        async_scheduling=async_scheduling,
        policy=scheduling_policy,  # type: ignore[arg-type]  # checked by vLLM
    )
    cache_config = CacheConfig(
        block_size=BLOCK_SIZE,
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=enable_prefix_caching,
    )
    rank, size = data_parallel
    vllm_config = VllmConfig(
        # (0, 1): ParallelConfig(), what VllmConfig builds by default
        parallel_config=ParallelConfig(data_parallel_size=size, data_parallel_rank=rank),
        scheduler_config=scheduler_config,
        model_config=model_config,
        cache_config=cache_config,
        additional_config=json.loads(additional_json),
    )
    cache_config.num_gpu_blocks = num_blocks
    return vllm_config


_hash_ready = False


def make_request(
    rid: str, prompt_len: int, max_tokens: int, *, seed: int = 0, arrival: float = 0.0,
    ttft_slo: float | None = None, tpot_slo: float | None = None, priority: int = 0,
    token_ids: list[int] | None = None,
) -> Request:
    """A request of ``prompt_len`` distinct-ish token ids (no accidental prefix sharing;
    ``token_ids`` gives them instead), with optional SLOs where the plugin reads them
    (``SamplingParams.extra_args``) and vLLM's ``priority``."""
    global _hash_ready
    if not _hash_ready:
        init_none_hash(sha256)
        _hash_ready = True
    ids = token_ids if token_ids is not None else [
        (seed * 7919 + i * 31 + 1) % 3000 + 3 for i in range(prompt_len)]
    assert len(ids) == prompt_len
    slos = {k: v for k, v in (("ttft_slo", ttft_slo), ("tpot_slo", tpot_slo)) if v is not None}
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0,
                            extra_args=slos or None)
    return Request(
        request_id=rid,
        prompt_token_ids=ids,
        sampling_params=params,
        pooling_params=None,
        arrival_time=arrival,
        priority=priority,
        block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256),
    )


def fake_output(out: SchedulerOutput, sched: Scheduler, token: int = 7) -> ModelRunnerOutput:
    """What the model runner would return: one sampled token for every scheduled request
    whose prompt is complete after this step, nothing for mid-prefill chunks."""
    req_ids = list(out.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for rid in req_ids:
        r = sched.requests[rid]
        sampled.append([token] if r.num_computed_tokens >= r.num_tokens else [])
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )


def add_all(sched: Scheduler, reqs: Iterable[Request]) -> None:
    for r in reqs:
        sched.add_request(r)


CheckFn = Callable[[Scheduler, SchedulerOutput, dict[str, tuple[int, int]]], None]


def drive(
    sched: Scheduler,
    arrivals: dict[int, list[Request]],
    *,
    check: CheckFn | None = None,
    before_step: Callable[[Scheduler, int], None] | None = None,
    max_steps: int = 20_000,
) -> tuple[dict[str, int], dict[str, str]]:
    """Run schedule -> fake output -> update until no request is left.

    ``arrivals[k]`` are added before step k. ``check(sched, out, running_before)`` sees each
    step's output with ``running_before[rid] = (num_computed, num_prompt)`` of the requests
    running before the step. Returns (output tokens per request, finish reason per request).
    """
    pending = dict(arrivals)
    tokens: dict[str, int] = defaultdict(int)
    finished: dict[str, str] = {}
    step = 0
    while True:
        for r in pending.pop(step, []):
            sched.add_request(r)
        if before_step is not None:
            before_step(sched, step)
        if not sched.has_requests() and not pending:
            return dict(tokens), finished
        before = {r.request_id: (r.num_computed_tokens, r.num_prompt_tokens)
                  for r in sched.running}
        out = sched.schedule()
        if check is not None:
            check(sched, out, before)
        outputs = sched.update_from_output(out, fake_output(out, sched))
        for eco in outputs.values():
            for o in eco.outputs:
                tokens[o.request_id] += len(o.new_token_ids)
                if o.finish_reason is not None:
                    finished[o.request_id] = str(o.finish_reason)
        step += 1
        assert step < max_steps, "requests did not finish"
