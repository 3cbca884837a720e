"""The simulator's engine loop as it was before its per-step work was cut: commit
494bb11's ``ppas.engine.simulator.EngineSim``, unchanged but for this docstring, kept as
the reference ``tests/test_engine_reference.py`` holds the engine to (the same steps,
floats, inter-token gaps and step traces on random runs). What the cut left as it was
(``EngineConfig``, the waiting queue, the priority rank) is imported from the engine, not
copied. Not for use outside the tests."""

from __future__ import annotations

import copy
import math
from collections import deque

from ppas.core.decision import admission_limit
from ppas.core.metrics import Gaps
from ppas.core.view import SchedulerView, StepRecord
from ppas.cost.base import CostModel
from ppas.engine import step_rules
from ppas.engine.kv import KvPool
from ppas.engine.request import SimRequest, rejection
from ppas.engine.result import SimResult, StepTrace

# The parts the cut left as they were are the engine's own (not copied):
from ppas.engine.simulator import (
    EngineConfig,
    WaitingQueue,
    _Chain,
    _num_tokens,
    _priority_rank,
)
from ppas.policies.base import Policy
from ppas.workload import RequestSpec


class EngineSim:
    """One simulated vLLM V1 engine under ``policy``, on its own clock ``now``."""

    def __init__(self, policy: Policy, cost_model: CostModel, engine: EngineConfig | None = None,
                 record_steps: bool = False) -> None:
        engine = engine or EngineConfig()
        # The policy sees the engine's KV cache, as in the engine under test (the policy's
        # input, not the loop this reference pins).
        kv = (engine.num_kv_blocks * engine.block_size if engine.num_kv_blocks is not None
              else None)
        policy.bind_cost_model(cost_model if kv is None or kv == cost_model.kv_capacity_tokens
                               else cost_model.with_kv_capacity(kv))
        self.policy = policy
        self.step_time = cost_model.step_time
        self.mbt = engine.max_num_batched_tokens or policy.max_num_batched_tokens
        self.block_size = engine.block_size
        self.max_model_len = engine.max_model_len
        self.by_priority = engine.scheduling_policy == "priority"
        self.skip_self_preempted = self.by_priority and engine.priority_skips_self_preempted
        # vLLM's admission limit (step_rules.admission_limit: a vllm: baseline's
        # max_num_seqs / max_num_active_seqs, else the engine's max_num_seqs).
        self.max_num_seqs = admission_limit(policy.engine_knobs, engine.max_num_seqs)
        if engine.num_kv_blocks is not None:
            self.total_blocks: int | None = engine.num_kv_blocks
        elif cost_model.kv_capacity_tokens is not None:
            self.total_blocks = max(1, cost_model.kv_capacity_tokens // engine.block_size)
        else:
            self.total_blocks = None
        self.pool = KvPool(self.total_blocks, engine.block_size, engine.prefix_caching)
        self.hold_kv = engine.hold_finished_kv
        self.num_held = 0  # finished requests whose KV is held (hold_finished_kv)
        self.stalled = False  # the last advance found nothing to run for the held KV
        self.record_steps = record_steps
        self.now = 0.0
        self.requests: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.waiting = WaitingQueue()
        self.recent: deque[StepRecord] = deque(maxlen=step_rules.recent_steps_kept(policy))
        self.steps: list[StepTrace] = []
        self.num_steps = self.num_preemptions = 0
        self._last_launch: float | None = None
        #: Requests finished by the steps so far, in finishing order (drivers may clear it).
        self.finished: list[SimRequest] = []
        #: Inter-token latencies of every token after a request's first (ITL), as sampled.
        self.gaps = Gaps()
        self.cost_model = cost_model
        self.decode_steps = cost_model.decode_steps
        # The last decode run (start, durations, cap, n, last launch before it, the step
        # records before it, the requests' last token times before it, the decodes'
        # context at its start) while it can still be rewound, and how many of its steps
        # are applied.
        self._run: tuple[float, list[float], int, int, float | None, list[StepRecord],
                         list[float | None], int] | None = None
        self._run_steps = -1
        self._run_gaps = (0, 0)  # self.gaps.mark() before the last decode run
        self._chain = _Chain(self.running, self.waiting)
        self._log_views = not self.by_priority
        # Stock vLLM's own prefill knobs (step_rules rule 4b; defaults for every policy but
        # the vllm: baseline): the chunk limit and vLLM 0.33's prefill cadence.
        self.knobs = policy.engine_knobs
        self.cadence = step_rules.prefill_cadence(self.knobs)
        self._carried = False  # the last _schedule carried prefill (the cadence's test)

    @property
    def free_blocks(self) -> int:
        """Free KV blocks (as vLLM counts them: cached blocks nobody holds are free)."""
        return self.pool.free

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, spec: RequestSpec) -> SimRequest:
        """A request arrives (its ``arrival_s`` is its arrival time; the engine's clock moves
        to it when idle). One vLLM would refuse (``rejection``: longer than max_model_len,
        or never fitting in the KV cache) fails at once with the reason."""
        r = SimRequest(len(self.requests), spec)
        self.requests.append(r)
        why = rejection(r, self.total_blocks, self.block_size, self.max_model_len)
        if why is not None:
            r.failed = why
            return r
        self.pool.register(r, spec)
        if not self.has_work() and self.now < r.arrival_time:
            self.now = r.arrival_time
        self.waiting.append(r)
        return r

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def release_kv(self, r: SimRequest, now: float) -> None:
        """Free a finished request's held KV (``hold_finished_kv``) at ``now``; a stalled
        engine resumes then."""
        assert self.hold_kv and r.finish_time is not None and self.num_held > 0
        self.pool.release(r)
        self.num_held -= 1
        if self.stalled and now > self.now:
            self.now = now

    def idle_until(self, t: float) -> None:
        """Move an idle engine's clock to ``t`` (the next arrival)."""
        if not self.has_work() and t > self.now:
            self.now = t

    def fork(self, policy: Policy) -> EngineSim:
        """A copy of this engine that steps on independently under ``policy`` (a search
        trying other decisions from here: ``ppas.analysis.headroom``). Cheaper than
        ``deepcopy``: finished requests, step records, the cost model and the trace are
        shared, being no longer mutated; unfinished requests, the queues, the KV pool's
        count and the cadence are copied; the fork's inter-token gaps start empty. Prefix
        caching and step recording off."""
        assert self.pool.cache is None and not self.record_steps and not self.steps
        new = copy.copy(self)
        fresh: dict[int, SimRequest] = {}
        reqs = []
        for r in self.requests:
            if r.finish_time is None and not r.failed:
                c = SimRequest.__new__(SimRequest)
                for f in SimRequest.__slots__:
                    setattr(c, f, getattr(r, f))
                fresh[id(r)] = c
                r = c
            reqs.append(r)
        new.requests = reqs
        new.running = [fresh[id(r)] for r in self.running]
        new.waiting = WaitingQueue(fresh[id(r)] for r in self.waiting)
        new.finished = list(self.finished)
        new.recent = deque(self.recent, maxlen=self.recent.maxlen)
        new.pool = copy.copy(self.pool)
        new.gaps = Gaps()
        new.cadence = copy.copy(self.cadence)
        new._chain = _Chain(new.running, new.waiting)
        new._run, new._run_steps = None, -1  # the last decode run: only rewind() reads it
        new.policy = policy
        return new

    # -- one step ----------------------------------------------------------------------------
    def step(self) -> None:
        """One engine step: view, decide, shape, advance (module doc)."""
        self._run = None
        self._run_steps = -1
        view = self._view()
        decision = self.policy.decide(view)
        cap = step_rules.enforced_budget(decision, view)
        step_rules.order_running(self.running, decision, self.by_priority)
        step_rules.order_waiting(self.waiting, decision, self.by_priority)
        cadence = self.cadence
        held = cadence is not None and cadence.holds(self.running, _num_tokens)
        sched, preempted, tally = self._schedule(cap, held, decision.chunk_limit)
        if cadence is not None:
            cadence.after_step(held, bool(sched), self._carried, not preempted,
                               len(self.waiting))
        if not sched and not preempted and self.num_held:
            self.stalled = True  # waits for release_kv: held KV leaves no room to admit
            return
        if not sched and preempted:
            # Only under priority (vLLM 0.32, or every running chunk capped away): the
            # request that preempted itself ended the loop before anything was scheduled.
            # vLLM runs no model step for an output without tokens (nor does the plugin
            # log one); the next schedule() follows at once.
            self.num_preemptions += len(preempted)
            return
        if not sched:
            # step_rules.enforced_budget and the arrival check make this unreachable: a
            # step with work always schedules or preempts something.
            raise RuntimeError(f"simulator stalled at t={self.now}: policy {self.policy.spec}")
        self._advance(view, cap, sched, preempted, tally)

    def run_until(self, limit: float, arrivals: bool = False) -> None:
        """Step while there is work and the next step would start before ``limit`` (the
        next arrival): the same steps as calling ``step()`` that often (``arrivals``, the
        caller's promise that only arrivals join after ``limit``, changes none of them:
        ``replay`` passes it)."""
        while self.now < limit and (self.running or self.waiting):
            self.advance(limit)

    def advance(self, limit: float = math.inf) -> None:
        """One ``step()``, or a run of decode-only steps taken in one go
        (``_decode_run``, when it applies and steps are not recorded)."""
        self.stalled = False
        self._run = None
        self._run_steps = -1
        if (self.waiting or self.record_steps or self.cadence is not None
                or not self._decode_run(limit)):
            self.step()

    def _decode_run(self, limit: float) -> bool:
        """Up to ``limit``, the decode-only steps ``step()`` would run, in one go.

        Applies when nothing waits, every running request is a decode (one token past its
        prompt) and the global budget covers them all. Then every step schedules one token
        per running request whatever the policy decides (the decision only caps prefill
        chunks, and there are none), so the run asks the policy once, for the cap its
        step records carry. The run stops before the step at which a request finishes
        (``step()`` takes that one), before the KV cache could run short (in k steps a
        request needs at most ceil(k / block_size) new blocks, so nobody is preempted
        inside the run) and before ``limit``. Cost: one cost-model evaluation per step
        (``CostModel.decode_steps``) and two passes over the running requests per run.
        The run can be cut back afterwards (``rewind``). False when no step ran."""
        running = self.running
        n = len(running)
        if n == 0 or n > self.mbt or self.pool.cache is not None:
            return False  # (with prefix caching every block goes through the pool)
        ctx = 0
        k_max = 1 << 62
        for r in running:
            c = r.num_computed_tokens
            p = r.prompt_tokens
            if p + r.num_output_tokens - c != 1 or step_rules.priced_as_prefill(c, p, 1):
                return False  # a prefill chunk or a recompute tail, not a decode
            ctx += c
            left = r.max_output_tokens - r.num_output_tokens
            if left < k_max:
                k_max = left
        k_max -= 1  # the finishing step goes through step()
        if self.total_blocks is not None:
            k_kv = self.pool.free // n * self.block_size
            if k_kv < k_max:
                k_max = k_kv
        if k_max < 1 or self.now >= limit:
            return False
        view = self._view()
        cap = step_rules.enforced_budget(self.policy.decide(view), view)
        start = self.now
        dts = self.decode_steps(n, ctx, k_max, start, limit)
        self._run = (start, dts, cap, n, self._last_launch, list(self.recent),
                     [r.last_token_time for r in running], ctx)
        self._run_steps = 0
        self._run_gaps = self.gaps.mark()
        self._apply_run(len(dts))
        return True

    def _apply_run(self, k: int) -> None:
        """Move the requests, the clock and the step records ``k`` steps into the current
        run (from its start; ``k`` may be less than the run's length: ``rewind``). Its
        inter-token gaps: each request's first (from its last token before the run), then
        the durations of the run's later steps, each counted once per request."""
        assert self._run is not None
        start, dts, cap, n, last_launch, recent0, ltt0, ctx = self._run
        recent = self.recent
        keep = recent.maxlen if recent.maxlen is not None else k
        first = k - keep if k > keep else 0  # the first step whose record is kept
        now, prev = start, last_launch
        for i in range(first):
            prev = now
            now += dts[i]
        recent.clear()
        recent.extend(recent0)
        for i in range(first, k):
            recent.append(StepRecord(
                launch_time=now, duration_s=dts[i],
                interval_s=step_rules.step_interval(now, prev), prefill_budget=cap,
                num_prefill_tokens=0, num_decode_tokens=n, num_prefill_reqs=0,
                num_decode_reqs=n, decode_ctx_tokens=ctx + i * n))
            prev = now
            now += dts[i]
        moved = k - self._run_steps
        self._run_steps = k
        self._last_launch = prev if k else last_launch
        self.now = now
        self.num_steps += moved
        bs = self.block_size
        used = 0
        gaps = self.gaps
        gaps.truncate(self._run_gaps)
        if k:
            t1 = start + dts[0]
            one = gaps.one
            for ltt in ltt0:
                one.append(t1 - ltt)  # type: ignore[operator]  # a decode has a last token
            if k > 1:
                gaps.extend(dts[1:k], n)
        for r, ltt in zip(self.running, ltt0, strict=True):
            c = r.num_computed_tokens + moved
            r.num_computed_tokens = c
            r.num_output_tokens += moved
            r.last_token_time = now if k else ltt
            b = -(-c // bs)
            used += b - r.blocks
            r.blocks = b
        self.pool.take(used)

    def rewind(self, t: float) -> None:
        """Undo the steps of the last decode run that start at or after ``t``, so that
        the engine is as if stepped only up to ``t`` (a request arriving at ``t`` joins
        the next step, as in ``simulate``). A no-op unless a run went past ``t``."""
        run = self._run
        if run is None or self.now <= t or self._last_launch is None or self._last_launch < t:
            return
        start, dts = run[0], run[1]
        k, now = 0, start
        while k < self._run_steps and now < t:
            now += dts[k]
            k += 1
        self._apply_run(k)

    def _view(self) -> SchedulerView:
        waiting = self.waiting
        np_, nd = step_rules.counts(self.running, len(waiting))
        log = waiting.log
        log.trim(len(waiting))
        return SchedulerView(now=self.now, requests=self._chain, num_pending_prefills=np_,
                             num_running_decodes=nd, max_num_batched_tokens=self.mbt,
                             max_num_seqs=self.max_num_seqs, recent_steps=self.recent,
                             # (SchedulerView.waiting_log: FCFS)
                             waiting_log=log if self._log_views else None,
                             prefix_caching=self.pool.cache is not None,
                             kv_shared_tokens=0 if self.pool.cache is None else
                             self.pool.cache.num_shared * self.pool.cache.block_size)

    def _schedule(self, prefill_budget: int, held: bool = False, chunk_limit: int = 0,
                  ) -> tuple[list[tuple[SimRequest, int]], list[SimRequest],
                             step_rules.StepTally]:
        """One vLLM V1 ``schedule()``: (scheduled (request, tokens), preempted requests,
        the scheduled chunks' tally). ``held``: a step the prefill cadence holds
        (step_rules rule 4b). Under FCFS a scheduled request is never preempted later in
        the step (victims come from the end of ``running``, past it); under priority a victim
        scheduled earlier has its chunk taken back, and the tally is then made again from
        ``sched`` (whose requests' counters this step has not moved)."""
        running, waiting, pool = self.running, self.waiting, self.pool
        cap = step_rules.PrefillCap(prefill_budget, chunk_limit)
        # vLLM's long_prefill_token_threshold (rule 4b), applied to every chunk before the
        # global budget and the hook, as vLLM orders them (0: none).
        lim = step_rules.long_prefill_limit(self.knobs, len(running) + len(waiting), self.mbt)
        carried = False
        clamp, charge = cap.clamp, cap.charge
        budget = self.mbt
        sched: list[tuple[SimRequest, int]] = []
        preempted: list[SimRequest] = []
        tally = step_rules.StepTally()
        add = tally.add
        counts_only = pool.cache is None  # KvPool.needed/grow inlined for decodes
        bs = pool.bs
        decode_ctx = others = 0  # the decodes' tally (StepTally.add_decodes); other chunks
        taken_back = False  # a priority victim's chunk left ``sched``: tally it again
        i = 0
        n_run = len(running)  # (changes only where a request is preempted, below)
        while i < n_run and budget > 0:
            r = running[i]
            c, p = r.num_computed_tokens, r.prompt_tokens
            need = p + r.num_output_tokens - c
            if need == 1 and c >= p and counts_only:
                # A decode (most of a busy step): one token, never held, limited or capped
                # (rules 3-4: not mid_chunk, past the prompt); scheduled when its block fits.
                # (its next block is needed once in block_size steps)
                extra = -(-(c + 1) // bs) - r.blocks
                if extra == 0 or extra <= pool.num_free:
                    if extra:
                        r.blocks += extra
                        pool.num_free -= extra
                    sched.append((r, 1))
                    decode_ctx += c
                    budget -= 1
                    i += 1
                    continue
            mid = step_rules.mid_chunk(c, p, p + r.num_output_tokens)
            if held and mid:
                i += 1
                continue
            if 0 < lim < need:
                need = lim
            n = clamp(c, p, need if need < budget else budget)
            if n <= 0:
                i += 1
                continue
            while pool.needed(r, n) > pool.free:
                if self.by_priority:  # vLLM: max by (priority, arrival_time), first if tied
                    victim = max(running, key=_priority_rank)
                    v = running.index(victim)
                    del running[v]
                    if v < i:
                        i -= 1
                    for k, (q, m) in enumerate(sched):
                        if q is victim:  # its chunk this step is taken back
                            del sched[k]
                            budget += m
                            taken_back = True
                            break
                else:
                    victim = running.pop()  # lowest priority: the last running request
                pool.release(victim)
                victim.num_computed_tokens = 0
                victim.is_running = False
                victim.num_preemptions += 1
                waiting.appendleft(victim)
                preempted.append(victim)
                n_run = len(running)
                if victim is r:
                    break
            if not r.is_running:
                if self.skip_self_preempted:
                    continue  # vLLM 0.33: ``i`` already points at the next request
                break
            pool.grow(r, n)
            sched.append((r, n))
            others += 1
            add(c, p, n)
            budget -= n
            charge(c, p, n)
            carried |= mid
            i += 1
        tally.add_decodes(len(sched) - others, decode_ctx)  # (re-tallied if taken back)
        if taken_back:  # rare (priority preemption): the tally of what stayed in ``sched``
            tally = step_rules.StepTally()
            add = tally.add
            for q, m in sched:
                add(q.num_computed_tokens, q.prompt_tokens, m)
        self._carried = carried
        if preempted:
            return sched, preempted, tally
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            r = waiting[0]
            # A prefix-cache hit (vLLM's get_computed_blocks) skips the cached blocks: they
            # cost neither token budget nor prefill cap.
            hit = pool.lookup(r)
            c, p = r.num_computed_tokens + len(hit) * pool.bs, r.prompt_tokens
            total = p + r.num_output_tokens
            need = total - c
            if held and need > 1:
                break  # the cadence holds admissions with prompt left to compute
            m = lim if 0 < lim < need else need
            n = clamp(c, p, m if m < budget else budget)
            if n <= 0 or pool.needed(r, need, hit) > pool.free:
                break  # capped to nothing, or the whole sequence does not fit (admission)
            waiting.popleft()
            r.is_running = True
            pool.grow(r, n, hit)
            if r.first_scheduled_time is None:
                r.first_scheduled_time = self.now
            running.append(r)
            sched.append((r, n))
            add(c, p, n)
            budget -= n
            charge(c, p, n)
            carried |= need > 1
        self._carried = carried
        return sched, preempted, tally

    def _advance(self, view: SchedulerView, cap: int, sched: list[tuple[SimRequest, int]],
                 preempted: list[SimRequest], tally: step_rules.StepTally) -> None:
        """Price the step (``tally``: its chunks), move the clock, sample tokens, finish
        requests."""
        dt = self.step_time(tally.shape())
        launch = self.now
        interval = step_rules.step_interval(launch, self._last_launch)
        self._last_launch = launch
        self.now = now = launch + dt
        self.num_steps += 1
        self.num_preemptions += len(preempted)
        self.recent.append(tally.record(launch, dt, interval, cap))

        any_finished = False
        gap = self.gaps.one.append
        for r, n in sched:
            c = r.num_computed_tokens + n
            r.num_computed_tokens = c
            o = r.num_output_tokens
            if c >= r.prompt_tokens + o:  # step_rules.samples_token, inlined (hot loop)
                r.num_output_tokens = o = o + 1
                if r.first_token_time is None:
                    r.first_token_time = now
                else:
                    gap(now - r.last_token_time)  # type: ignore[operator]
                r.last_token_time = now
                if o >= r.max_output_tokens:
                    r.finish_time = now
                    self.finished.append(r)
                    r.is_running = False
                    if self.hold_kv:
                        self.num_held += 1
                    else:
                        self.pool.release(r)
                    any_finished = True
        if any_finished:
            self.running[:] = [r for r in self.running if r.is_running]
        if self.record_steps:
            used = (self.total_blocks - self.pool.free) if self.total_blocks is not None else 0
            self.steps.append(StepTrace(
                time=launch, duration_s=dt, prefill_budget=cap,
                num_prefill_tokens=tally.prompt_tokens,
                num_recompute_tokens=tally.recompute_tokens,
                num_decode_tokens=tally.decode_reqs,
                num_decode_reqs=tally.decode_reqs + tally.tail_reqs,
                pending_prefills=view.num_pending_prefills,
                running_decodes=view.num_running_decodes, kv_blocks_used=used,
                scheduled=tuple((r.request_id, n) for r, n in sched),
                preempted=tuple(r.request_id for r in preempted)))

    def result(self) -> SimResult:
        return SimResult(self.requests, self.num_steps, self.num_preemptions,
                         self.total_blocks, self.steps, self.gaps)
