"""The cluster simulator: N engine simulators under one event clock.

Each instance is a ``ppas.engine.simulator.EngineSim`` (vLLM V1 step semantics, its own policy,
cost model and paged KV cache); this module only moves requests between them. Events, in
time order (at equal times: transfers land, then arrivals, then steps start, so a step
starting at ``t`` sees every request that arrived at or before ``t``, as in ``simulate``):

* arrival -> colocated: the router picks an instance. Disaggregated: the deflection rule
  may send the prompt to a decode node; otherwise it joins the prefill pool's queue and
  free prefill instances take batches from it (``ppas.cluster.queue``).
* step of instance i at t -> first the requests its previous step finished (at t) are
  handed on, then the engine advances (``EngineSim.advance``: one step, or a run of
  decode-only steps) and its next step is booked at the end. A prefill instance with
  nothing left takes the next batch first.
* running ahead: a run of decode-only steps changes nothing any other instance or rule
  sees (it stops before any request finishes), so instances whose state no rule reads
  (least-outstanding-tokens and round-robin read only the cluster's own counters) run
  as far as the run goes, and are cut back to the step boundary at ``t``
  (``EngineSim.rewind``) when a request joins them at ``t``; instances read by
  ``earliest-completion`` or the deflection rule run only up to the next arrival. Both
  give the results of one step per event (tests).
* a prefill finished on a prefill instance (the prompt computed, one token sampled) -> the
  router picks a decode instance; the KV of the prompt crosses that instance's link
  (FIFO, ``ppas.cluster.transfer.Link``), never starting before the prefill's end.
* transfer landed -> the prefill instance frees the prompt's KV (it held it until now, and
  stalls, taking no new prompt, while held KV leaves no room for one); the request joins
  the decode instance with ``prompt - 1`` tokens
  computed (as vLLM's KV connectors do: the last prompt token is recomputed there and
  samples the first output token, which is the client's first token).

Invariants (tests): every request finishes (or fails) exactly once; no instance's KV
blocks exceed its capacity; no transfer starts before its prefill ended. One mixed
instance behind ``pass-through`` reproduces ``simulate`` exactly.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ppas.cluster.config import ClusterConfig, PoolConfig
from ppas.cluster.deflection import make_deflection
from ppas.cluster.queue import make_queue
from ppas.cluster.router import make_router
from ppas.cluster.transfer import Link, kv_bytes_per_token
from ppas.core.metrics import RequestMetrics, tpot_of
from ppas.cost import CostModel, make_cost_model
from ppas.cost.base import StepShape
from ppas.cost.steps import StepCosts
from ppas.engine.simulator import EngineConfig, EngineSim, SimRequest
from ppas.policies import make_policy
from ppas.workload import RequestSpec, Trace

# Event kinds; the order breaks ties at equal times.
_XFER, _ARRIVE, _STEP = 0, 1, 2


class Instance:
    """One engine of the cluster, with what routers and the deflection rule read."""

    def __init__(self, index: int, pool: PoolConfig, cost_model: CostModel,
                 engine: EngineSim, link: Link | None) -> None:
        self.index = index
        self.pool = pool
        self.role = pool.role
        self.cost_model = cost_model
        self.engine = engine
        self.link = link
        self.busy = False  # a step event is booked
        self.version = 0  # of the booked step event (older ones are stale)
        self.owners: list[ClusterRequest] = []  # by the engine's request index
        self.outstanding_tokens = 0  # tokens still to compute for requests placed here
        self.max_kv_blocks_used = 0
        self._costs: StepCosts | None = None

    # -- loads (O(requests on the instance); computed when a rule asks) --------------
    def load(self) -> tuple[int, int, int]:
        """(prompt tokens not yet computed, running decodes, their context tokens)."""
        backlog = n_dec = ctx = 0
        for r in self.engine.running:
            c = r.num_computed_tokens
            if c < r.prompt_tokens:
                backlog += r.prompt_tokens - c
            else:
                n_dec += 1
                ctx += c
        for r in self.engine.waiting:
            backlog += r.prompt_tokens - r.num_computed_tokens
        return backlog, n_dec, ctx

    @property
    def kv_free_tokens(self) -> int:
        e = self.engine
        return e.free_blocks * e.block_size if e.total_blocks is not None else 1 << 62

    def costs(self) -> StepCosts:
        if self._costs is None:
            self._costs = StepCosts(self.cost_model, (self.engine.mbt,))
        return self._costs

    def predicted_finish(self, prompt_tokens: int, output_tokens: int, now: float) -> float:
        """Ours [I]: after the step in flight (the engine's clock), the prompts queued here
        drain at the instance's MBT chunk, then this prompt, each prefill step carrying the
        running decodes; then ``output - 1`` decode steps beside them. Linearised with
        ``StepCosts`` (tables built once)."""
        backlog, n_dec, ctx = self.load()
        k = self.costs()
        c = self.engine.mbt
        steps = -(-(backlog + prompt_tokens) // c)
        t = (k.prefill_time(c, 0, min(backlog, c)) * (backlog / c if backlog > c else 1.0)
             if backlog else 0.0)
        t += k.prefill_time(c, 0, prompt_tokens) + steps * n_dec * k.dec_ride
        t += (output_tokens - 1) * (k.dec_base + (n_dec + 1) * k.dec_alone
                                    + k.dec_kv * (ctx + prompt_tokens))
        return max(now, self.engine.now) + t


class ClusterRequest:
    """A request's life across instances (``prefill`` = its first engine-side copy:
    the whole request when colocated or deflected)."""

    __slots__ = ("index", "spec", "prefill", "decode", "instance", "decode_instance",
                 "transfer_start", "transfer_end", "deflected", "finishes", "failed")

    def __init__(self, index: int, spec: RequestSpec) -> None:
        self.index = index
        self.spec = spec
        self.prefill: SimRequest | None = None
        self.decode: SimRequest | None = None
        self.instance = -1
        self.decode_instance = -1
        self.transfer_start: float | None = None
        self.transfer_end: float | None = None
        self.deflected = False
        self.finishes = 0  # times the request completed (invariant: exactly 1)
        self.failed: str | None = None

    @property
    def last(self) -> SimRequest | None:
        """The engine-side copy that emits the client's tokens."""
        return self.decode if self.decode is not None else self.prefill

    def metrics(self) -> RequestMetrics | None:
        r = self.last
        if self.failed or r is None or r.finish_time is None or r.first_token_time is None:
            return None
        s = self.spec
        return RequestMetrics(
            arrival_s=s.arrival_s, ttft=r.first_token_time - s.arrival_s,
            e2e=r.finish_time - s.arrival_s,
            tpot=tpot_of(r.first_token_time, r.finish_time, s.output_tokens),
            output_tokens=s.output_tokens, ttft_slo=s.ttft_slo, tpot_slo=s.tpot_slo,
            slo_class=s.slo_class)


@dataclass
class ClusterResult:
    requests: list[ClusterRequest]
    instances: list[Instance]
    num_events: int

    def request_metrics(self) -> list[RequestMetrics]:
        return [m for m in (r.metrics() for r in self.requests) if m is not None]

    @property
    def num_failed(self) -> int:
        return sum(1 for r in self.requests if r.failed)

    @property
    def num_deflected(self) -> int:
        return sum(1 for r in self.requests if r.deflected)


def build_instances(config: ClusterConfig,
                    cost_model_for: Callable[[PoolConfig, int], CostModel] | None = None,
                    record_steps: bool = False) -> list[Instance]:
    """Every pool's engines, in pool order. ``cost_model_for(pool, mbt)`` overrides the
    cost model (tests); by default ``make_cost_model`` from the pool's settings."""
    out: list[Instance] = []
    for pool in config.pools:
        for _ in range(pool.instances):
            policy = make_policy(pool.policy)
            mbt = policy.max_num_batched_tokens
            cm = (cost_model_for(pool, mbt) if cost_model_for is not None else
                  make_cost_model(pool.cost_model, pool.hardware, pool.model, pool.tp, mbt))
            # A prefill instance holds a prompt's KV until its transfer ends.
            eng = EngineSim(policy, cm, EngineConfig(max_num_seqs=pool.max_num_seqs,
                                                     num_kv_blocks=pool.num_kv_blocks,
                                                     hold_finished_kv=pool.role == "prefill"),
                            record_steps=record_steps)
            link = None
            if pool.role == "decode":
                link = Link(config.link, kv_bytes_per_token(cm, pool.model), pool.tp)
            out.append(Instance(len(out), pool, cm, eng, link))
    return out


def with_default_slos(specs: Sequence[RequestSpec], config: ClusterConfig) -> list[RequestSpec]:
    slo = config.slo
    if slo.ttft_s is None and slo.tpot_s is None:
        return list(specs)
    return [s if (s.ttft_slo is not None or slo.ttft_s is None)
            and (s.tpot_slo is not None or slo.tpot_s is None)
            else dataclasses.replace(s, ttft_slo=s.ttft_slo or slo.ttft_s,
                                     tpot_slo=s.tpot_slo or slo.tpot_s) for s in specs]


def simulate_cluster(
    trace: Trace | Sequence[RequestSpec],
    config: ClusterConfig,
    cost_model_for: Callable[[PoolConfig, int], CostModel] | None = None,
    record_steps: bool = False,
    run_ahead: bool = True,
) -> ClusterResult:
    """Replay ``trace`` through the cluster (see the module docstring). ``run_ahead``
    False keeps every instance at the next arrival (slower; the same results: tests)."""
    given = trace.requests if isinstance(trace, Trace) else tuple(trace)
    specs = sorted(with_default_slos(given, config), key=lambda s: s.arrival_s)
    reqs = [ClusterRequest(i, s) for i, s in enumerate(specs)]
    insts = build_instances(config, cost_model_for, record_steps)
    router = make_router(config.router)
    disagg = config.disaggregated
    if disagg:
        pre = [x for x in insts if x.role == "prefill"]
        dec = [x for x in insts if x.role == "decode"]
        dpool = config.pool("decode")
        deflection = make_deflection(dpool.deflection)
        queue = make_queue(config.pool("prefill").queue)
    else:
        pre, dec, deflection, queue = [], [], None, make_queue("fcfs")
    heap: list[tuple[float, int, int, int, int]] = []  # (time, kind, seq, a, b)
    seq = 0
    n, n_done, nxt, events = len(reqs), 0, 0, 0
    inf = float("inf")
    # Instances whose state a rule reads at arrivals run no further than the next arrival;
    # the others run ahead freely (decode runs) and are rewound when a request joins them.
    bounded = {x.index for x in insts if not run_ahead
               or (router.reads_state and x.role != "prefill")
               or (x.role == "decode" and deflection is not None)}

    def push(t: float, kind: int, a: int, b: int = 0) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, kind, seq, a, b))

    def sync(inst: Instance, now: float) -> None:
        """Bring ``inst`` back to ``now`` if a decode run took it past (``rewind``); its
        booked step event moves with it."""
        eng = inst.engine
        t = eng.now
        if t > now:
            eng.rewind(now)
            if eng.now != t:
                inst.version += 1
                push(eng.now, _STEP, inst.index, inst.version)

    def place(cr: ClusterRequest, inst: Instance, spec: RequestSpec, now: float,
              computed: int = 0) -> SimRequest:
        """Hand a request copy to ``inst`` (``computed`` tokens already in its KV)."""
        nonlocal n_done
        sync(inst, now)
        r = inst.engine.add_request(spec)
        inst.owners.append(cr)  # engine-local index r.index -> cluster request
        if r.failed:
            cr.failed = r.failed
            cr.finishes += 1
            n_done += 1
            return r
        r.num_computed_tokens = computed
        inst.outstanding_tokens += spec.prompt_tokens + spec.output_tokens - computed
        if not inst.busy:
            inst.busy = True
            inst.version += 1
            push(inst.engine.now, _STEP, inst.index, inst.version)
        return r

    def dispatch(inst: Instance, now: float) -> None:
        """A free prefill instance takes the next batch from the pool queue: the prompt
        alone, one token sampled (the KV connector's prefill request)."""
        for i in queue.pop_batch(inst.engine.mbt):
            cr = reqs[i]
            cr.instance = inst.index
            cr.prefill = place(cr, inst, dataclasses.replace(cr.spec, arrival_s=now,
                                                             output_tokens=1), now)

    def pool_ttft(prompt: int) -> float:
        """The prefill pool's predicted TTFT: queue + execution (+ transfer, first step)."""
        k = pre[0].costs()
        c = pre[0].engine.mbt
        per_tok = k.prefill_time(c, 0, c) / c
        backlog = queue.queued_tokens + sum(x.load()[0] for x in pre)
        link = dec[0].link
        t_first = dec[0].cost_model.step_time(StepShape(1, 1, prompt, prompt, 0, 0))
        return (backlog * per_tok / len(pre) + k.prefill_time(c, 0, prompt)
                + (link.duration(prompt) if link is not None else 0.0) + t_first)

    def route(cands: list[Instance], s: RequestSpec, now: float) -> int:
        if router.reads_state:
            for x in cands:
                sync(x, now)
        return router.route(s.prompt_tokens, s.output_tokens, cands, now)

    def finish(inst: Instance, r: SimRequest) -> int:
        """A request copy finished on ``inst`` at ``r.finish_time``; 1 when the request
        is done (its decode copy, or a copy that also decodes)."""
        cr = inst.owners[r.index]
        s = cr.spec
        inst.outstanding_tokens -= (r.max_output_tokens + r.prompt_tokens
                                    - (r.prompt_tokens - 1 if r is cr.decode else 0))
        if inst.role == "prefill" and s.output_tokens == 1:
            inst.engine.release_kv(r, r.finish_time or 0.0)  # nothing to transfer
        if inst.role == "prefill" and s.output_tokens > 1:
            t = r.finish_time
            assert t is not None
            j = route(dec, s, t)
            d = dec[j]
            assert d.link is not None
            cr.transfer_start, cr.transfer_end = d.link.schedule(t, s.prompt_tokens)
            cr.decode_instance = d.index
            push(cr.transfer_end, _XFER, cr.index, j)
            return 0
        cr.finishes += 1
        return 1

    while n_done < n:
        if heap and (nxt >= n or heap[0][0] < reqs[nxt].spec.arrival_s
                     or (heap[0][0] == reqs[nxt].spec.arrival_s and heap[0][1] < _ARRIVE)):
            now, kind, _, a, b = heapq.heappop(heap)
        else:
            now, kind, a, b = reqs[nxt].spec.arrival_s, _ARRIVE, nxt, 0
            nxt += 1
        events += 1
        if kind == _STEP:
            inst = insts[a]
            if b != inst.version:
                continue  # superseded by a rewind
            eng = inst.engine
            if eng.finished:
                for r in eng.finished:
                    n_done += finish(inst, r)
                eng.finished.clear()
            if disagg and inst.role == "prefill" and len(queue) and not eng.has_work():
                dispatch(inst, now)
            if eng.has_work():
                eng.advance(reqs[nxt].spec.arrival_s if a in bounded and nxt < n else inf)
                if eng.stalled:  # held KV (transfers in flight): resumes at a release
                    inst.busy = False
                    continue
                push(eng.now, _STEP, a, b)
                used = eng.total_blocks - eng.free_blocks if eng.total_blocks else 0
                if used > inst.max_kv_blocks_used:
                    inst.max_kv_blocks_used = used
            else:
                inst.busy = False
        elif kind == _ARRIVE:
            cr = reqs[a]
            s = cr.spec
            if not disagg:
                j = route(insts, s, now)
                cr.instance = j
                cr.prefill = place(cr, insts[j], s, now)
                continue
            k = None
            if deflection is not None:
                for x in dec:
                    sync(x, now)
                k = deflection.choose(s.prompt_tokens, s.output_tokens, dec,
                                      pool_ttft(s.prompt_tokens))
            if k is not None:
                cr.instance, cr.deflected = dec[k].index, True
                cr.prefill = place(cr, dec[k], s, now)
                continue
            queue.push(a, s.prompt_tokens)
            for x in pre:
                if not x.busy and not x.engine.has_work():
                    dispatch(x, now)
                    if not len(queue):
                        break
        else:  # _XFER: the KV landed on decode instance dec[b]
            cr = reqs[a]
            s = cr.spec
            src = insts[cr.instance]  # the prefill instance frees the prompt's KV now
            assert cr.prefill is not None
            src.engine.release_kv(cr.prefill, now)
            if not src.busy and src.engine.has_work():
                src.busy = True
                src.version += 1
                push(src.engine.now, _STEP, src.index, src.version)
            cr.decode = place(cr, dec[b], dataclasses.replace(s, arrival_s=now), now,
                              computed=s.prompt_tokens - 1)
    return ClusterResult(reqs, insts, events)
