"""vLLM adapter: ``--scheduler-cls ppas.vllm.PolicyScheduler`` runs a ppas policy in vLLM V1.

    vllm serve MODEL --scheduler-cls ppas.vllm.PolicyScheduler --max-num-batched-tokens 16384 \\
        --additional-config '{"ppas": {"policy": "ppas:n_th=2,b_max=16384,b_cap=2048",
                                       "step_log": "/tmp/steps.jsonl"}}'

Config keys under ``ppas`` (``PluginConfig``): ``policy`` (required, a policy config string),
``step_log`` (JSONL path, ``ppas.core.steplog``: a header line per server run, then one line
per step; under ``--data-parallel-size N > 1`` every engine core runs its own policy and
writes its own file, ``steps.jsonl`` -> ``steps.dp0.jsonl`` ... ``steps.dp{N-1}.jsonl``,
its header carrying ``data_parallel_rank`` and ``data_parallel_size``; see
``ppas.core.steplog.rank_path``), ``step_log_flush`` (steps per write, default 1: each
step reaches the OS when it completes, so a killed server loses at most the step being
written),
``cost_model`` (a ``ppas.cost.make_cost_model`` spec such as ``fitted:FILE``, bound to the
policy; default none). Supported vLLM release lines: ``SUPPORTED_VLLM`` (0.32.x, 0.33.x;
checked at startup against the installed scheduler's source, see ``ppas.live.versions``).

The hook (no copy of vLLM's ``schedule()``)
------------------------------------------
Every rule of a step (what a prefill chunk is, N_p/N_d, liveness, ordering, the cap,
recompute accounting, token times) is ``ppas.engine.step_rules``', shared with the simulator;
this module only connects them to vLLM. Both loops of vLLM's ``Scheduler.schedule()``
(running, then waiting) pass every request's token count through
``_reserve_prefill_lookahead(request, num_computed, num_new)`` right before the
``num_new_tokens == 0`` test: the running loop then *skips* the request; the waiting loop
*stops admission* on vLLM 0.32 (``break``) but skips the request and scans on
(``continue``) on 0.33, where the plugin stops it through the loop's own admission limit
(``max_num_active_reqs``, restored when ``schedule()`` returns) once the cap cuts a waiting
prompt to 0 tokens, so admission stays FCFS and costs O(1) hook calls on both lines. That
is the paper patch's cap behaviour, so we override only that method, with
``step_rules.PrefillCap``. What differs between vLLM release lines, and the startup check
that the installed scheduler's source still has these call sites, is
``ppas.live.versions``. Invariants, per step:

* sum of prefill-chunk tokens scheduled <= the enforced budget (the cap is charged before
  allocation; a request that then fails allocation ends its loop, so an over-charge can only
  leave the cap unused, never exceeded);
* every prefill chunk <= the decision's ``chunk_limit`` where it sets one (the same clamp);
* chunks past the prompt (decodes, recompute tails) pass through untouched;
* the global budget is vLLM's own ``max_num_scheduled_tokens`` (= the policy's MBT, checked).

Ordering (``step_rules`` rule 3): ``prefill_order`` sorts the FCFS waiting queue (a deque)
and permutes running prefill chunks. Under ``--scheduling-policy priority`` the policy's
order applies *within* a priority level: the plugin keeps the waiting queue as vLLM's FCFS
deque and ``step_rules.order_waiting`` sorts it every step by ``step_rules.priority_key``
(vLLM's heap key ``(priority, arrival_time, request_id)`` with the policy's rank after
``priority``), so without an order admission is exactly stock vLLM's heap order, and with
one a policy never lifts a request above a more urgent level (the docstring of rule 3 says
why). Preempted and skipped requests re-enter at the head as under FCFS and are re-sorted
before the next admission (vLLM admits nobody on a step that preempted).
``kv_holding_waiting`` (KV-connector loads, paused streaming sessions, drained before
``waiting``) keeps vLLM's own order. Times: the view's ``now``, arrivals and last-token times are on
``wall_clock`` (vLLM's request clock, ``time.time``), step launch/completion on
``step_clock`` (``time.monotonic``); the differential test replaces both with one
synthetic clock.
Where requests stop: vLLM frees every finished request through ``_free_request``, where
the plugin notes its outputs against its ``max_tokens`` (``OutputLengths``, the view's
``output_lengths``; aborted, refused and failed requests aside), so a policy can tell a cap
from a length (``ordered``'s rule 4); the startup check confirms the method exists.
Prefix caching (vLLM's default): the view reads vLLM's cache without changing it
(``_CacheReads``): a waiting request's hit (``num_cached_tokens``, the lookup of
``get_computed_blocks`` without its stats, kept between steps by ``PrefixHits``, which
counts the pops and insertions of vLLM's hash -> block map), and for the footprint rules' credit
(``ppas.policies.kv_room``, "Shared blocks") the running requests' joint blocks
(``kv_shared_tokens``) and each request's shared ones (``num_shared_tokens``, from
``ref_cnt``); the startup check confirms the attributes they use exist.
``prefill_schedule_interval > 1`` is refused at startup where vLLM applies it (0.33
always, 0.32 under data-parallel MoE): it holds all prefill on most steps, so the policy's
budget would silently go unused there; on 0.32 without data-parallel MoE vLLM ignores it.
"""

from __future__ import annotations

import json
import os
import time
import weakref
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any, overload

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import FCFSRequestQueue, SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from ppas.core.config import from_table, require
from ppas.core.decision import Knob
from ppas.core.errors import PpasError
from ppas.core.steplog import (
    FORMAT_VERSION,
    StepLogHeader,
    StepLogRecord,
    StepLogWriter,
    rank_path,
)
from ppas.core.view import OutputLengths, RequestView, SchedulerView, StepRecord
from ppas.engine import step_rules
from ppas.live.prefix_hits import PrefixHits
from ppas.live.versions import SUPPORTED_VLLM as SUPPORTED_VLLM  # re-exported
from ppas.live.versions import ReleaseLine, check_scheduler, data_parallel_rank
from ppas.policies import Decision, Policy, make_policy, policy_names

logger = init_logger("vllm.ppas")  # under "vllm." so vLLM's log handler prints it

def check_vllm_version(version: str) -> ReleaseLine:
    """The release line of ``version`` once the installed ``Scheduler``'s source confirms
    every call site the hook needs for that line (``ppas.live.versions``); else PpasError."""
    return check_scheduler(version, Scheduler)


def check_prefill_interval(vllm_config: Any, release: ReleaseLine, version: str) -> None:
    """Refuse ``prefill_schedule_interval > 1`` where vLLM applies it: on held steps vLLM
    schedules no prefill at all, so the policy's budget would be silently unused."""
    interval = int(getattr(vllm_config.scheduler_config, "prefill_schedule_interval", 1))
    if interval <= 1:
        return
    dp = int(vllm_config.parallel_config.data_parallel_size)
    if release.prefill_interval_applies(interval, dp, bool(vllm_config.model_config.is_moe)):
        raise PpasError(
            f"ppas.vllm: {Knob.PREFILL_SCHEDULE_INTERVAL.flag} {interval} makes vLLM {version} "
            f"hold all prefill on {interval - 1} of every {interval} steps, so the policy's "
            f"prefill budget would go unused there; drop it (allowed: 1, the policy decides each "
            f"step's prefill)"
        )
    logger.warning(
        "ppas.vllm: prefill_schedule_interval=%d has no effect on vLLM %s without "
        "data-parallel MoE (vLLM ignores it); the policy decides each step's prefill",
        interval, version,
    )


@dataclass(frozen=True)
class PluginConfig:
    """The validated ``--additional-config '{"ppas": {...}}'`` section (keys: its fields)."""

    policy: str
    step_log: str | None = None
    step_log_flush: int = 1
    cost_model: str | None = None  # a ppas.cost spec such as fitted:FILE

    def __post_init__(self) -> None:
        require(bool(self.policy.strip()), "must be a config string such as 'ppas:b_cap=2048'; "
                f"policies: {', '.join(policy_names())}", key="policy")
        require(self.step_log is None or bool(self.step_log), "must be a file path",
                key="step_log")
        require(self.step_log_flush >= 1, f"must be >= 1, got {self.step_log_flush}",
                key="step_log_flush")

    @staticmethod
    def from_additional_config(additional: Mapping[str, Any] | None) -> PluginConfig:
        section = (additional or {}).get("ppas")
        example = '--additional-config \'{"ppas": {"policy": "ppas:n_th=2,b_cap=2048"}}\''
        if section is None:
            raise PpasError(
                f"ppas.vllm: missing config; pass {example} "
                f"(policies: {', '.join(policy_names())})"
            )
        if not isinstance(section, Mapping):
            raise PpasError(
                f"ppas.vllm: \"ppas\" must be a JSON object with a \"policy\" key, got "
                f"{json.dumps(section)[:60]}; e.g. {example}"
            )
        try:
            cfg = from_table(PluginConfig, section, "ppas")
        except PpasError as e:
            raise PpasError(f"ppas.vllm: {e}") from None
        return replace(cfg, policy=cfg.policy.strip())


_MISSING = object()
_ref_cnt = attrgetter("ref_cnt")  # a vLLM KVCacheBlock's reference count


class _CacheReads:
    """What a view reads of vLLM's prefix cache (caching on): a waiting request's hit,
    a running request's shared blocks, the running requests' joint blocks. Reads only:
    no stats, no events, nothing moved. Counted in the first KV cache group, the only
    one of a model with one kind of attention; 0 (no credit) for the shared counts with
    several groups (``ppas.policies.kv_room``, "Shared blocks")."""

    __slots__ = ("_m", "_group", "_hits", "_hit", "_shared_chain")

    #: What the reads use of vLLM's KV cache manager (``check``, at startup).
    NEEDS = ("prefix_cache_lookup_enabled", "coordinator.find_longest_cache_hit",
             "coordinator.single_type_managers", "coordinator.block_pool.get_cached_block",
             "coordinator.block_pool.cached_block_hash_to_block.pop",
             "coordinator.block_pool.cached_block_hash_to_block.insert")
    #: ... and of its one KV cache group's manager.
    GROUP_NEEDS = ("req_to_blocks", "block_size", "block_pool.num_gpu_blocks",
                   "block_pool.get_num_free_blocks")

    def __init__(self, manager: Any, hits: PrefixHits) -> None:
        self._m = manager
        managers = manager.coordinator.single_type_managers
        self._group = managers[0] if len(managers) == 1 else None
        self._hits = hits  # the scheduler's, kept between steps
        # For this view's step (the cache and its reference counts move only in vLLM's
        # schedule(), after the policy's decide() has read the view): lookups by request
        # id, and shared_hit by hit, named by its length and last block (a block is cached
        # under one hash, and a hash names its whole prefix, so two hits that end at the
        # same block at the same place are the same blocks: prompts of one prefix).
        self._hit: dict[str, tuple[Sequence[Any], int]] = {}
        self._shared_chain: dict[tuple[int, int], int] = {}

    @classmethod
    def check(cls, manager: Any, version: str) -> None:
        """Raise PpasError, naming what is missing, unless ``manager`` (vLLM's
        ``KVCacheManager``) has everything the reads use: a vLLM line whose cache manager
        moved them fails at startup, not in the middle of a step."""
        def missing(obj: Any, paths: Sequence[str]) -> list[str]:
            out = []
            for path in paths:
                o = obj
                for name in path.split("."):
                    o = getattr(o, name, _MISSING)
                    if o is _MISSING:
                        out.append(path)
                        break
            return out

        gone = missing(manager, cls.NEEDS)
        if not gone:
            groups = manager.coordinator.single_type_managers
            gone = [f"single_type_managers[0].{p}" for p in missing(groups[0], cls.GROUP_NEEDS)
                    ] if len(groups) == 1 else []
        if gone:
            raise PpasError(f"ppas.vllm: vLLM {version}'s KV cache manager has no "
                            f"{', '.join(gone)}, which the policy's view reads with prefix "
                            f"caching on; start vLLM with --no-enable-prefix-caching")

    def _lookup(self, request: Request) -> tuple[Sequence[Any], int]:
        """vLLM's ``get_computed_blocks`` lookup: (the first group's hit blocks, the hit's
        tokens), kept between steps (``PrefixHits``) and read once per request and step."""
        rid = request.request_id
        h = self._hit.get(rid)
        if h is None:
            h = self._hit[rid] = self._hits.lookup(request)
        return h

    def hit(self, request: Request) -> int:
        """The prompt tokens a waiting request would take from the cache now."""
        return self._lookup(request)[1]

    def shared_hit(self, request: Request) -> int:
        """A waiting request's hit tokens in blocks two holders reference (O(hit blocks),
        once per distinct hit and step)."""
        if self._group is None:
            return 0
        blocks = self._lookup(request)[0]
        if not blocks:
            return 0
        key = (len(blocks), blocks[-1].block_id)
        n = self._shared_chain.get(key)
        if n is None:
            n = self._shared_chain[key] = self._shared_tokens(blocks)
        return n

    def shared(self, request: Request) -> int:
        """``RequestView.num_shared_tokens``: tokens of its blocks with ``ref_cnt > 1``."""
        g = self._group
        if g is None:
            return 0
        return self._shared_tokens(g.req_to_blocks.get(request.request_id, ()))

    def _shared_tokens(self, blocks: Sequence[Any]) -> int:
        """The tokens of ``blocks`` that two holders reference (``ref_cnt > 1``)."""
        assert self._group is not None
        refs = list(map(_ref_cnt, blocks))  # (counted in C: a hit is hundreds of blocks)
        return (len(refs) - refs.count(0) - refs.count(1)) * int(self._group.block_size)

    def joint(self, running: Sequence[Request]) -> int:
        """``SchedulerView.kv_shared_tokens``: the running requests' blocks, each counted
        once per holder, less the blocks in use (O(running)). Blocks held by others (a
        request waiting with KV, one whose blocks a connector still reads) make it
        smaller, never larger."""
        g = self._group
        if g is None:
            return 0
        held = g.req_to_blocks
        pool = g.block_pool
        total = sum(len(held[r.request_id]) for r in running if r.request_id in held)
        used = pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()  # (less the null block)
        return max(0, total - used) * int(g.block_size)


class _RequestAdapter:
    """A vLLM ``Request`` seen as a ``RequestView`` for one step's view: what is fixed for
    the request's life (its id, arrival, prompt and ``max_tokens``) copied as it is
    wrapped, the rest read through. A policy reads the copied fields most, several times
    a step."""

    __slots__ = ("_r", "is_running", "_last", "_cache", "request_id", "arrival_time",
                 "prompt_tokens", "max_output_tokens")

    def __init__(self, request: Request, is_running: bool,
                 last_token: Mapping[str, float] | None = None,
                 cache: _CacheReads | None = None) -> None:
        self._r = request
        self.is_running = is_running
        self._last = last_token
        self._cache = cache  # vLLM's prefix cache (None: caching off)
        self.request_id = str(request.request_id)
        self.arrival_time = float(request.arrival_time)
        self.prompt_tokens = int(request.num_prompt_tokens)
        self.max_output_tokens = int(request.max_tokens)

    @property
    def num_computed_tokens(self) -> int:
        return int(self._r.num_computed_tokens)

    @property
    def num_output_tokens(self) -> int:
        return int(self._r.num_output_tokens)

    @property
    def last_token_time(self) -> float | None:
        # vLLM's Request does not record it; the scheduler does (wall clock, like
        # arrival_time and SchedulerView.now).
        return self._last.get(self._r.request_id) if self._last is not None else None

    def _slo(self, key: str) -> float | None:
        sp = self._r.sampling_params
        extra = getattr(sp, "extra_args", None) if sp is not None else None
        v = extra.get(key) if extra else None
        return float(v) if isinstance(v, int | float) else None

    @property
    def ttft_slo(self) -> float | None:
        return self._slo("ttft_slo")

    @property
    def tpot_slo(self) -> float | None:
        return self._slo("tpot_slo")

    @property
    def block_hashes(self) -> Sequence[Hashable]:
        # vLLM's own chained block hashes (empty with prefix caching off).
        return self._r.block_hashes

    @property
    def num_cached_tokens(self) -> int:
        # A waiting request's hit, as vLLM's schedule() would look it up now (only one
        # that has computed nothing: one holding KV is not looked up); 0 when running.
        r = self._r
        if self.is_running or self._cache is None or r.num_computed_tokens:
            return 0
        return self._cache.hit(r)

    @property
    def num_shared_tokens(self) -> int:
        # Running: its blocks another holder references too (vLLM's ref_cnt > 1);
        # waiting: its hit's blocks two holders reference (as num_cached_tokens, only
        # one that has computed nothing is looked up); 0 when caching is off.
        r = self._r
        if self._cache is None or not self.is_running and r.num_computed_tokens:
            return 0
        return self._cache.shared(r) if self.is_running else self._cache.shared_hit(r)


class _LazyRequests(Sequence[RequestView]):
    """Running requests in engine order, then waiting ones (KV holders first, then the queue),
    wrapped on access: building a view costs O(1) until a policy reads the list, and each
    request is wrapped once per view however often the policy reads the list (the queues
    do not change while the policy decides)."""

    def __init__(self, running: list[Request], waiting: Sequence[Sequence[Request]],
                 last_token: Mapping[str, float] | None = None,
                 cache: _CacheReads | None = None) -> None:
        self._running = running
        self._waiting = waiting
        self._last = last_token
        self._cache = cache
        self._wrapped: list[RequestView] = []  # the first requests, wrapped so far
        self._rest: Iterator[RequestView] | None = None  # the others, wrapped as read
        self._n = len(running) + sum(len(q) for q in waiting)

    def __len__(self) -> int:
        return self._n

    def _wrap(self) -> Iterator[RequestView]:
        last, cache = self._last, self._cache
        for r in self._running:
            yield _RequestAdapter(r, True, last, cache)
        for q in self._waiting:
            for r in q:
                yield _RequestAdapter(r, False, last, cache)

    def _more(self) -> RequestView | None:
        """The next request wrapped (None: every one is)."""
        if self._rest is None:
            if len(self._wrapped) == self._n:
                return None
            self._rest = self._wrap()
        r = next(self._rest, None)
        if r is None:
            self._n = len(self._wrapped)
            return None
        self._wrapped.append(r)
        return r

    def __iter__(self) -> Iterator[RequestView]:
        if len(self._wrapped) == self._n:
            return iter(self._wrapped)  # (in C)
        return self._read()

    def _read(self) -> Iterator[RequestView]:
        wrapped = self._wrapped
        i = 0
        while True:
            n = len(wrapped)  # (another pass may have wrapped more meanwhile)
            while i < n:
                yield wrapped[i]
                i += 1
            if self._rest is None:
                self._rest = self._wrap()
            r = next(self._rest, None)
            if r is None:
                self._n = len(wrapped)
                return
            wrapped.append(r)
            yield r
            i += 1

    @overload
    def __getitem__(self, i: int) -> RequestView: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[RequestView]: ...
    def __getitem__(self, i: int | slice) -> RequestView | Sequence[RequestView]:
        if isinstance(i, slice):
            return list(self)[i]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        while len(self._wrapped) <= i:
            if self._more() is None:
                raise IndexError(i)  # pragma: no cover
        return self._wrapped[i]


@dataclass(slots=True)
class _Launched:
    """A scheduled, not yet completed step (keyed by its SchedulerOutput)."""

    output: SchedulerOutput
    launch: float
    interval: float
    num_pending_prefills: int
    num_running_decodes: int
    prefill_budget: int
    tally: step_rules.StepTally
    sampled: list[str]  # requests that sample a token at the end of the step


#: Finishes that say nothing of where a request would have stopped (``OutputLengths``).
_SAYS_NOTHING = frozenset((RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_IGNORED,
                           RequestStatus.FINISHED_ERROR))


class PolicyScheduler(Scheduler):
    """vLLM's V1 scheduler with a ppas policy choosing each step's prefill budget.

    Instantiating it under async scheduling (vLLM's default) yields ``AsyncPolicyScheduler``
    (same behaviour on top of ``AsyncScheduler``), so the plugin keeps vLLM's overlap.
    """

    def __new__(cls, vllm_config: Any, *args: Any, **kwargs: Any) -> PolicyScheduler:
        if cls is PolicyScheduler and getattr(
            vllm_config.scheduler_config, "async_scheduling", False
        ):
            cls = AsyncPolicyScheduler
        return super().__new__(cls)

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        import vllm

        release = check_vllm_version(vllm.__version__)
        check_prefill_interval(vllm_config, release, vllm.__version__)
        cfg = PluginConfig.from_additional_config(vllm_config.additional_config)
        policy: Policy = make_policy(cfg.policy)
        cost = None
        if cfg.cost_model is not None:
            from ppas.cost import make_cost_model

            cost = make_cost_model(cfg.cost_model)
        policy.bind_cost_model(cost)
        sc = vllm_config.scheduler_config
        if policy.max_num_batched_tokens != sc.max_num_batched_tokens:
            raise PpasError(
                f"ppas.vllm: policy {cfg.policy!r} runs with max_num_batched_tokens="
                f"{policy.max_num_batched_tokens} but vLLM has {sc.max_num_batched_tokens}; "
                f"start vLLM with {Knob.MAX_NUM_BATCHED_TOKENS.flag} "
                f"{policy.max_num_batched_tokens}"
            )
        knobs = policy.engine_knobs  # vllm: baselines: vLLM applies the knobs itself
        if knobs.long_prefill_token_threshold and (
            knobs.long_prefill_token_threshold != sc.long_prefill_token_threshold
            or knobs.long_prefill_token_threshold_adaptive
            != sc.long_prefill_token_threshold_adaptive
        ):
            raise PpasError(
                f"ppas.vllm: policy {cfg.policy!r} needs vLLM's own flags: start vLLM with "
                f"{Knob.LONG_PREFILL_TOKEN_THRESHOLD.flag} {knobs.long_prefill_token_threshold}"
                + (f" {Knob.LONG_PREFILL_TOKEN_THRESHOLD_ADAPTIVE.flag}"
                   if knobs.long_prefill_token_threshold_adaptive else "")
            )
        for flag, want, have in (
                (Knob.MAX_NUM_SEQS.flag, knobs.max_num_seqs, sc.max_num_seqs),
                (Knob.MAX_NUM_ACTIVE_SEQS.flag, knobs.max_num_active_seqs,
                 getattr(sc, "max_num_active_seqs", None))):
            if want is not None and want != have:
                raise PpasError(f"ppas.vllm: policy {cfg.policy!r} needs vLLM's own flag: "
                                f"start vLLM with {flag} {want}")
        super().__init__(vllm_config, *args, **kwargs)
        # The policy sees this engine's KV cache (its footprint rules admit into it), as
        # in the simulator: the cost model's capacity is an estimate for the GPU. (vLLM's
        # block pool keeps one block back, its null block.)
        blocks = getattr(getattr(self, "kv_cache_config", None), "num_blocks", 0) - 1
        if cost is not None and blocks > 0:
            tokens = blocks * self.block_size
            if tokens != cost.kv_capacity_tokens:
                policy.bind_cost_model(cost.with_kv_capacity(tokens))
        if self.max_num_encoder_input_tokens > 0 or self.is_encoder_decoder:
            raise PpasError("ppas.vllm: multimodal/encoder-decoder models are not supported")
        if self.need_mamba_block_aligned_split:
            raise PpasError("ppas.vllm: mamba_cache_mode='align' is not supported")
        # --scheduling-policy priority: a deque that order_waiting keeps in priority order
        # (rule 3), in place of vLLM's heap (empty here; nothing else holds it).
        self.ppas_by_priority = self.policy == SchedulingPolicy.PRIORITY
        if self.ppas_by_priority:
            assert not self.waiting
            self.waiting = FCFSRequestQueue()
        self.ppas_config = cfg
        # vLLM's own clamp, bound once (the hook runs for every request of every step).
        self._vllm_reserve = super()._reserve_prefill_lookahead
        self.ppas_policy = policy
        self._prefix_caching = bool(self.cache_config.enable_prefix_caching)
        self._prefix_hits: PrefixHits | None = None  # kept between steps (caching on)
        if self._prefix_caching:
            _CacheReads.check(self.kv_cache_manager, vllm.__version__)
            self._prefix_hits = PrefixHits(self.kv_cache_manager)
        self.ppas_decision: Decision | None = None  # the latest step's decision
        self._cap: step_rules.PrefillCap | None = None  # the step's cap; None outside schedule()
        # The request the hook saw last and the prefill tokens charged for it: the request
        # being allocated (vLLM calls the hook for each right before allocating).
        self._charged: tuple[Request, int] | None = None
        # vLLM 0.33: stop the waiting loop once the cap is spent (see _stop_admission).
        self._stops_admission = release.stops_admission_via_limit
        self._admission_limit: int | None = None  # the saved max_num_active_reqs
        self._history: deque[StepRecord] = deque(maxlen=step_rules.recent_steps_kept(policy))
        self.wall_clock: Callable[[], float] = time.time
        self.step_clock: Callable[[], float] = time.monotonic
        self._recent: tuple[StepRecord, ...] = ()
        self._launched: dict[int, _Launched] = {}
        self._last_token: dict[str, float] = {}  # request id -> wall time of its last step
        # Where finished requests stopped against their max_tokens (SchedulerView).
        self._output_lengths = OutputLengths()
        self._last_schedule: float | None = None
        self._last_done = 0.0
        self._step = 0
        self.ppas_dp_rank, self.ppas_dp_size = data_parallel_rank(vllm_config.parallel_config)
        self.step_log_path = (rank_path(cfg.step_log, self.ppas_dp_rank, self.ppas_dp_size)
                              if cfg.step_log else None)
        self.step_log = (
            StepLogWriter(self.step_log_path, step_log_header(vllm_config, cfg, policy, self),
                          cfg.step_log_flush)
            if self.step_log_path else None
        )
        if self.step_log is not None:  # close even if the engine never calls shutdown()
            weakref.finalize(self, self.step_log.close)
        logger.info(
            "ppas.vllm: %s with policy %s, MBT %d, DP rank %d of %d, step log %s",
            type(self).__name__, policy.spec, sc.max_num_batched_tokens, self.ppas_dp_rank,
            self.ppas_dp_size, self.step_log_path,
        )

    # -- the view the policy reads ------------------------------------------------------
    def ppas_view(self, now: float) -> SchedulerView:
        """The policy's view: counts in one pass over ``running``; requests wrapped lazily."""
        running = self.running
        waiting = (self.kv_holding_waiting, self.waiting)
        np_, nd = step_rules.counts(running, len(self.kv_holding_waiting) + len(self.waiting))
        hits = self._prefix_hits
        cache = None
        if hits is not None:
            hits.begin_step()
            cache = _CacheReads(self.kv_cache_manager, hits)
        return SchedulerView(
            now=now,
            requests=_LazyRequests(running, waiting, self._last_token,  # type: ignore[arg-type]
                                   cache),
            num_pending_prefills=np_,
            num_running_decodes=nd,
            max_num_batched_tokens=self.max_num_scheduled_tokens,
            max_num_seqs=self.max_num_running_reqs,
            recent_steps=self._recent,
            prefix_caching=cache is not None,
            output_lengths=self._output_lengths,
            kv_shared_tokens=0 if cache is None else cache.joint(running),
        )

    # -- vLLM hooks ---------------------------------------------------------------------
    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        now = self.step_clock()
        # The view's clock is vLLM's request clock (arrival_time is time.time()), so
        # policies can compare now, arrivals and last-token times.
        view = self.ppas_view(self.wall_clock())
        decision = self.ppas_decision = self.ppas_policy.decide(view)
        budget = step_rules.enforced_budget(decision, view)
        step_rules.order_running(self.running, decision, self.ppas_by_priority)
        if isinstance(self.waiting, deque):  # always (FCFS, or ours under priority)
            step_rules.order_waiting(self.waiting, decision, self.ppas_by_priority)
        self._cap = step_rules.PrefillCap(budget, decision.chunk_limit)
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            self._cap = None
            self._charged = None
            if self._admission_limit is not None:
                self.max_num_active_reqs = self._admission_limit
                self._admission_limit = None
        launch = self.step_clock()
        if out.total_num_scheduled_tokens > 0:  # (an empty call only relays finished ids)
            interval = step_rules.step_interval(now, self._last_schedule)
            self._last_schedule = now
            self._on_launch(out, launch, interval, view, budget)
        return out

    def _reserve_prefill_lookahead(
        self, request: Request, num_computed_tokens: int, num_new_tokens: int
    ) -> int:
        """vLLM's last per-request clamp before ``num_new_tokens == 0`` skips a running
        request or stops admission: the step's ``PrefillCap`` clamps and charges the chunk."""
        n: int = self._vllm_reserve(request, num_computed_tokens, num_new_tokens)
        cap = self._cap
        if cap is None or n <= 0:
            return n  # outside schedule(), or nothing to cap
        prompt = request.num_prompt_tokens
        m = cap.clamp(num_computed_tokens, prompt, n)
        if m < n:  # re-apply vLLM's clamp: the shorter chunk must respect it too
            m = self._vllm_reserve(request, num_computed_tokens, m)
        cap.charge(num_computed_tokens, prompt, m)
        self._charged = (request, m if num_computed_tokens < prompt else 0)
        if m == 0 and self._stops_admission and request.status != RequestStatus.RUNNING:
            self._stop_admission()  # the cap cut a waiting prompt to 0 tokens (0.33)
        return m

    def _stop_admission(self) -> None:
        """The cap cut a waiting prompt to 0 tokens, on a vLLM whose waiting loop skips it
        and scans on (0.33): make the loop's admission limit (checked before each waiting
        request) stop it, as 0.32's ``break`` does. Restored when ``schedule()`` returns;
        the skipped prompt is re-queued at the head, so FCFS order is kept."""
        if self._admission_limit is None:
            self._admission_limit = self.max_num_active_reqs
            self.max_num_active_reqs = 0

    def _preempt_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        """A request that preempts itself (its blocks would not fit, no one else to take
        them from) is not scheduled: the cap gets its chunk back, as the simulator charges
        only scheduled chunks. That matters where vLLM's running loop goes on past it
        (0.33 under ``--scheduling-policy priority``); a victim scheduled earlier in the
        step keeps its charge, in both engines (vLLM returns only its token budget)."""
        charged = self._charged
        if self._cap is not None and charged is not None and charged[0] is request:
            self._cap.left += charged[1]
            self._charged = None
        return super()._preempt_request(request, *args, **kwargs)

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        """vLLM frees every finished request here: note where it stopped against its
        ``max_tokens`` (an EOS, a stop string or token, a repetition, the cap or the
        context's end; an aborted, refused or failed one says nothing of its length)."""
        lengths = self._output_lengths
        if request.status not in _SAYS_NOTHING:
            first = lengths.caps_are_lengths
            lengths.record(request.num_output_tokens, request.max_tokens)
            if first and not lengths.caps_are_lengths:
                logger.info("ppas.vllm: request %s stopped after %d of its max_tokens=%d "
                            "outputs: max_tokens are caps, not lengths, from now on",
                            request.request_id, request.num_output_tokens, request.max_tokens)
        return super()._free_request(request, *args, **kwargs)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> Any:
        done = self.step_clock()
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        launched = self._launched.pop(id(scheduler_output), None)
        if launched is not None and launched.output is scheduler_output:
            wall, last = self.wall_clock(), self._last_token
            for rid in launched.sampled:
                last[rid] = wall  # its token was sampled now
            if len(last) > 2 * len(self.requests) + 64:  # drop finished requests, amortised
                self._last_token = {k: v for k, v in last.items() if k in self.requests}
            self._on_complete(launched, done)
        if self.step_log is not None and not self.has_requests():
            self.step_log.flush()  # idle: make the log readable now
        return outputs

    def shutdown(self) -> None:
        if self.step_log is not None:
            self.step_log.close()
        super().shutdown()

    # -- step accounting ------------------------------------------------------------------
    def _on_launch(
        self, out: SchedulerOutput, launch: float, interval: float, view: SchedulerView,
        budget: int,
    ) -> None:
        # One pass over the scheduled requests (after schedule(): computed tokens include
        # the step's chunk): step_rules classify each chunk and tell who samples a token.
        reqs = self.requests
        tally = step_rules.StepTally(keep=self.step_log is not None)
        sampled: list[str] = []
        for rid, n in out.num_scheduled_tokens.items():
            r = reqs[rid]
            c = r.num_computed_tokens
            tally.add(c - n, r.num_prompt_tokens, n)
            if step_rules.samples_token(c, r.num_tokens):
                sampled.append(rid)
        if len(self._launched) > 8:  # outputs the engine dropped (aborts, resets)
            self._launched.pop(next(iter(self._launched)))
        self._launched[id(out)] = _Launched(
            output=out, launch=launch, interval=interval,
            num_pending_prefills=view.num_pending_prefills,
            num_running_decodes=view.num_running_decodes, prefill_budget=budget,
            tally=tally, sampled=sampled,
        )

    def _on_complete(self, s: _Launched, done: float) -> None:
        # Completion-timed: with async scheduling a step launches while the previous one
        # still runs, so it starts executing when that one's output arrives.
        duration = done - max(s.launch, self._last_done)
        self._last_done = done
        t = s.tally
        rec = t.record(s.launch, duration, s.interval, s.prefill_budget)
        self._history.append(rec)
        self._recent = tuple(self._history)
        if self.step_log is not None:
            self._step += 1
            row: StepLogRecord = {
                "step": self._step,
                "time": s.launch,
                "duration_s": duration,
                "interval_s": s.interval,
                "pending_prefills": s.num_pending_prefills,
                "running_decodes": s.num_running_decodes,
                "prefill_budget": s.prefill_budget,
                "num_prefill_tokens": rec.num_prefill_tokens,
                "num_decode_tokens": rec.num_decode_tokens,
                "num_prefill_reqs": rec.num_prefill_reqs,
                "num_decode_reqs": rec.num_decode_reqs,
                "prefill_chunks": t.chunks or [],
                "decode_contexts": t.contexts or [],
            }
            self.step_log.write(row)


def step_log_header(vllm_config: Any, cfg: PluginConfig, policy: Policy,
                    sched: Scheduler) -> StepLogHeader:
    """The step log's run header: format version, start time, pid, policy, server config."""
    import datetime

    import vllm

    now = time.time()
    mc, sc = vllm_config.model_config, vllm_config.scheduler_config
    kv = getattr(sched, "kv_cache_config", None)
    dp_rank, dp_size = data_parallel_rank(vllm_config.parallel_config)
    return {
        "ppas_step_log": FORMAT_VERSION,
        "started": datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat(),
        "started_unix": now,
        "pid": os.getpid(),
        "policy": policy.spec,
        "cost_model": cfg.cost_model,
        "server": {
            "vllm_version": vllm.__version__,
            "scheduler": type(sched).__name__,
            "model": str(getattr(mc, "model", "")),
            "served_model_name": str(getattr(mc, "served_model_name", "")),
            "max_model_len": getattr(mc, "max_model_len", None),
            "max_num_batched_tokens": sc.max_num_batched_tokens,
            "max_num_seqs": sc.max_num_seqs,
            "block_size": getattr(vllm_config.cache_config, "block_size", None),
            "num_kv_blocks": getattr(kv, "num_blocks", None),
            "async_scheduling": bool(getattr(sc, "async_scheduling", False)),
            "tensor_parallel_size": vllm_config.parallel_config.tensor_parallel_size,
        },
        "data_parallel_rank": dp_rank,
        "data_parallel_size": dp_size,
    }


class AsyncPolicyScheduler(PolicyScheduler, AsyncScheduler):
    """``PolicyScheduler`` on top of vLLM's ``AsyncScheduler`` (chosen automatically)."""
