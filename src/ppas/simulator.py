"""A discrete-step simulator with vLLM V1's scheduling semantics.

One loop iteration is one engine step, exactly as vLLM's ``Scheduler.schedule()``:

1. Running requests first, in order. A request needs ``num_tokens - num_computed`` tokens
   (prompt + outputs so far); a prefill gets ``min(need, token budget left, prefill cap
   left)`` and is skipped when that is 0; a decode gets 1 token while the budget lasts.
   When the paged KV cache (block size 16) cannot hold the new tokens, the *last* running
   request is preempted (recompute: its blocks are freed, ``num_computed`` resets to 0 and
   it goes to the front of the waiting queue); if that is the request itself, the loop stops.
2. Then, only if nobody was preempted, waiting requests FCFS while the token budget and the
   prefill cap last, ``len(running) < max_num_seqs`` and their first chunk's blocks fit.
3. The step's duration comes from the cost model; every request whose computed tokens
   reach its token count samples one token at the step's end (so the first token comes
   from the step that ran the last prompt chunk). A request finishes at its last token.

The policy's ``Decision.prefill_budget`` is the prefill cap; the global token budget is
the policy's ``max_num_batched_tokens`` (P-PAS §3.2). Invariants checked by the tests:
prefill tokens <= cap, all tokens <= budget, KV blocks <= capacity, every request finishes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ppas.config import require
from ppas.cost.base import CostModel, StepShape
from ppas.metrics import RequestMetrics, run_summary
from ppas.policies.base import Decision, Policy, enforced_budget
from ppas.state import SchedulerView, StepRecord
from ppas.workload import RequestSpec, Trace


@dataclass(frozen=True)
class EngineConfig:
    """vLLM engine settings. ``max_num_batched_tokens`` None = the policy's own;
    ``num_kv_blocks`` None = the cost model's KV capacity (unbounded if it has none)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None
    history: int = 16  # recent StepRecords passed to policies

    def __post_init__(self) -> None:
        require(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        require(self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1,
                "max_num_batched_tokens must be >= 1")
        require(self.block_size >= 1, "block_size must be >= 1")
        require(self.num_kv_blocks is None or self.num_kv_blocks >= 1, "num_kv_blocks >= 1")


class SimRequest:
    """Mutable engine-side request; also the ``RequestView`` policies read."""

    __slots__ = ("request_id", "index", "arrival_time", "prompt_tokens", "max_output_tokens",
                 "num_computed_tokens", "num_output_tokens", "is_running", "first_token_time",
                 "last_token_time", "finish_time", "blocks", "num_preemptions", "ttft_slo",
                 "tpot_slo", "slo_class", "failed")

    def __init__(self, index: int, spec: RequestSpec) -> None:
        self.request_id = str(index)
        self.index = index
        self.arrival_time = spec.arrival_s
        self.prompt_tokens = spec.prompt_tokens
        self.max_output_tokens = spec.output_tokens
        self.ttft_slo = spec.ttft_slo
        self.tpot_slo = spec.tpot_slo
        self.slo_class = spec.slo_class
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.is_running = False
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.finish_time: float | None = None
        self.blocks = 0
        self.num_preemptions = 0
        self.failed: str | None = None



class _Chain(Sequence[SimRequest]):
    """Running then waiting, without copying (policies rarely iterate)."""

    __slots__ = ("a", "b")

    def __init__(self, a: list[SimRequest], b: deque[SimRequest]) -> None:
        self.a, self.b = a, b

    def __len__(self) -> int:
        return len(self.a) + len(self.b)

    def __getitem__(self, i):  # type: ignore[no-untyped-def,override]
        if isinstance(i, slice):
            return list(self)[i]
        n = len(self.a)
        if i < 0:
            i += len(self)
        return self.a[i] if i < n else self.b[i - n]

    def __iter__(self) -> Iterator[SimRequest]:
        yield from self.a
        yield from self.b


@dataclass(frozen=True, slots=True)
class StepTrace:
    """Per-step record kept when ``simulate(..., record_steps=True)`` (tests, plots).

    ``num_prefill_tokens`` counts chunks inside a prompt (what the policy's cap limits);
    ``num_decode_tokens`` everything else (decodes, and recompute of output tokens after a
    preemption); ``num_decode_reqs`` the requests past their prompt that got tokens.
    """

    time: float
    duration_s: float
    prefill_budget: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_decode_reqs: int
    pending_prefills: int
    running_decodes: int
    kv_blocks_used: int
    num_preempted: int


@dataclass
class SimResult:
    requests: list[SimRequest]
    num_steps: int
    num_preemptions: int
    kv_blocks_total: int | None
    steps: list[StepTrace] = field(default_factory=list)

    def request_metrics(self) -> list[RequestMetrics]:
        out = []
        for r in self.requests:
            if r.failed or r.finish_time is None or r.first_token_time is None:
                continue
            out.append(RequestMetrics(
                r.arrival_time, r.first_token_time - r.arrival_time,
                r.finish_time - r.arrival_time,
                (r.finish_time - r.first_token_time) / max(r.max_output_tokens - 1, 1),
                r.max_output_tokens, r.ttft_slo, r.tpot_slo, r.slo_class))
        return out

    def summary(self) -> dict[str, float | int]:
        failed = sum(1 for r in self.requests if r.failed)
        return run_summary(self.request_metrics(), failed)


def simulate(
    trace: Trace | Sequence[RequestSpec],
    policy: Policy,
    cost_model: CostModel,
    engine: EngineConfig | None = None,
    record_steps: bool = False,
) -> SimResult:
    """Replay ``trace`` through vLLM V1 step semantics under ``policy``."""
    engine = engine or EngineConfig()
    specs = trace.requests if isinstance(trace, Trace) else tuple(trace)
    reqs = [SimRequest(i, s) for i, s in enumerate(sorted(specs, key=lambda s: s.arrival_s))]
    policy.bind_cost_model(cost_model)
    mbt = engine.max_num_batched_tokens or policy.max_num_batched_tokens
    bs = engine.block_size
    if engine.num_kv_blocks is not None:
        total_blocks: int | None = engine.num_kv_blocks
    elif cost_model.kv_capacity_tokens is not None:
        total_blocks = max(1, cost_model.kv_capacity_tokens // bs)
    else:
        total_blocks = None
    free = total_blocks if total_blocks is not None else 1 << 62
    max_seqs = engine.max_num_seqs
    step_time = cost_model.step_time
    decide = policy.decide

    running: list[SimRequest] = []
    waiting: deque[SimRequest] = deque()
    recent: deque[StepRecord] = deque(maxlen=max(1, engine.history, policy.history_window))
    steps: list[StepTrace] = []
    n_total, n_done, nxt = len(reqs), 0, 0
    now, prev_dt, num_steps, num_preempt = 0.0, 0.0, 0, 0
    chain = _Chain(running, waiting)

    while n_done < n_total:
        while nxt < n_total and reqs[nxt].arrival_time <= now:
            r = reqs[nxt]
            nxt += 1
            need = -(-(r.prompt_tokens + r.max_output_tokens) // bs)
            if total_blocks is not None and need > total_blocks:
                r.failed = "request does not fit in the KV cache"
                n_done += 1
                continue
            waiting.append(r)
        if not running and not waiting:
            if nxt >= n_total:
                break
            now = reqs[nxt].arrival_time
            continue

        n_run_prefill = 0
        for r in running:
            if r.num_computed_tokens < r.prompt_tokens:
                n_run_prefill += 1
        n_pending = n_run_prefill + len(waiting)
        n_decodes = len(running) - n_run_prefill
        view = SchedulerView(now, chain, n_pending, n_decodes, mbt, max_seqs, recent)
        d: Decision = decide(view)
        cap = enforced_budget(d, view)
        if d.decodes_first or d.prefill_order is not None:
            _reorder(running, waiting, d)

        sched, preempted, free = _schedule(running, waiting, mbt, cap, free, bs, max_seqs)
        if not sched and not preempted and cap < mbt:
            # Liveness guard: a cap that would stall the engine with work queued is lifted
            # for this step (the policy can never starve the whole server).
            cap = mbt
            sched, preempted, free = _schedule(running, waiting, mbt, cap, free, bs, max_seqs)
        if not sched:
            # Nothing schedulable (cannot happen with consistent KV accounting): fail the
            # head of the queue rather than loop forever.
            r = waiting.popleft() if waiting else running.pop()
            r.failed, r.is_running = "unschedulable", False
            free += r.blocks
            r.blocks = 0
            n_done += 1
            continue
        num_preempt += preempted

        # Step shape (token-budget view) -> duration.
        p_tok = p_req = p_kv = n_dec = d_ctx = capped = 0
        p_work = 0.0
        for r, n in sched:
            c = r.num_computed_tokens
            if c < r.prompt_tokens:
                capped += n
            if n > 1 or c < r.prompt_tokens:  # a chunk of many tokens costs as a prefill
                p_tok += n
                p_req += 1
                p_work += n * (c + (n + 1) * 0.5)
                p_kv += c + n
            else:
                n_dec += 1
                d_ctx += c
        dt = step_time(StepShape(p_tok, p_req, p_work, p_kv, n_dec, d_ctx))
        launch = now
        now += dt
        num_steps += 1
        recent.append(StepRecord(launch, dt, prev_dt or dt, cap, p_tok, n_dec, p_req, n_dec))
        prev_dt = dt

        any_finished = False
        for r, n in sched:
            r.num_computed_tokens += n
            if r.num_computed_tokens >= r.prompt_tokens + r.num_output_tokens:
                r.num_output_tokens += 1
                if r.first_token_time is None:
                    r.first_token_time = now
                r.last_token_time = now
                if r.num_output_tokens >= r.max_output_tokens:
                    r.finish_time = now
                    r.is_running = False
                    free += r.blocks
                    r.blocks = 0
                    any_finished = True
                    n_done += 1
        if any_finished:
            running[:] = [r for r in running if r.is_running]
        if record_steps:
            used = (total_blocks - free) if total_blocks is not None else 0
            past = [n for r, n in sched if r.num_computed_tokens - n >= r.prompt_tokens]
            steps.append(StepTrace(launch, dt, cap, capped, p_tok + n_dec - capped, len(past),
                                   n_pending, n_decodes, used, preempted))

    return SimResult(reqs, num_steps, num_preempt, total_blocks, steps)


def _reorder(running: list[SimRequest], waiting: deque[SimRequest], d: Decision) -> None:
    """Decodes first (stable), then prefills in the policy's order (unlisted ones after,
    in engine order); the waiting queue is reordered the same way."""
    rank: dict[str, int] = {}
    if d.prefill_order is not None:
        rank = {rid: i for i, rid in enumerate(d.prefill_order)}
    big = len(rank)
    dec = [r for r in running if r.num_computed_tokens >= r.prompt_tokens]
    pre = [r for r in running if r.num_computed_tokens < r.prompt_tokens]
    if rank:
        pre.sort(key=lambda r: rank.get(r.request_id, big))
        w = sorted(waiting, key=lambda r: rank.get(r.request_id, big))
        waiting.clear()
        waiting.extend(w)
    running[:] = dec + pre


def _schedule(
    running: list[SimRequest],
    waiting: deque[SimRequest],
    budget: int,
    cap: int,
    free: int,
    bs: int,
    max_seqs: int,
) -> tuple[list[tuple[SimRequest, int]], int, int]:
    """One vLLM V1 ``schedule()``: returns (scheduled (req, tokens), #preempted, free)."""
    sched: list[tuple[SimRequest, int]] = []
    preempted = 0
    i = 0
    while i < len(running) and budget > 0:
        r = running[i]
        need = r.prompt_tokens + r.num_output_tokens - r.num_computed_tokens
        # The cap applies to chunks inside the prompt, as the policy's N_p counts them (and
        # as ppas.vllm does); past the prompt (decode, or recompute of outputs after a
        # preemption) only the global budget applies.
        in_prompt = r.num_computed_tokens < r.prompt_tokens
        n = min(need, budget, cap) if in_prompt else min(need, budget)
        if n <= 0:
            i += 1
            continue
        extra = -(-(r.num_computed_tokens + n) // bs) - r.blocks
        while extra > free:
            victim = running.pop()  # lowest priority: the last running request
            free += victim.blocks
            victim.blocks = 0
            victim.num_computed_tokens = 0
            victim.is_running = False
            victim.num_preemptions += 1
            waiting.appendleft(victim)
            preempted += 1
            if victim is r:
                break
        if not r.is_running:
            break
        r.blocks += extra
        free -= extra
        sched.append((r, n))
        budget -= n
        if in_prompt:
            cap -= n
        i += 1
    if preempted:
        return sched, preempted, free
    while waiting and budget > 0 and cap > 0 and len(running) < max_seqs:
        r = waiting[0]
        n = min(r.prompt_tokens + r.num_output_tokens - r.num_computed_tokens, budget, cap)
        extra = -(-(r.num_computed_tokens + n) // bs) - r.blocks
        if extra > free:
            break
        waiting.popleft()
        r.is_running = True
        r.blocks += extra
        free -= extra
        running.append(r)
        sched.append((r, n))
        budget -= n
        cap -= n
    return sched, preempted, free


def lower_bound_latency(spec: RequestSpec, cost_model: CostModel,
                        chunks: Sequence[int] = (512, 1024, 2048, 4096, 8192, 16384)) -> float:
    """E2E of one request with the machine to itself: the best prefill chunking (including
    the whole prompt in one step) followed by one decode step per remaining token."""
    best = math.inf
    for c in (*chunks, spec.prompt_tokens):
        t = cost_model.prefill_time(spec.prompt_tokens, c)
        if t < best:
            best = t
    for k in range(1, spec.output_tokens):
        best += cost_model.step_time(StepShape(0, 0, 0.0, 0, 1, spec.prompt_tokens + k - 1))
    return best
