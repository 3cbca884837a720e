"""The cluster simulator: N engine simulators under one event clock.

Each instance (``ppas.cluster.instance``) is an ``EngineSim`` with its own policy, cost
model and paged KV cache; this module only moves requests between them. The loop
(``simulate_cluster``) is Vidur's: pop the first event, hand it to the handler of its
kind, book the events the handler returns. Events (``ppas.cluster.events``), in time
order (at equal times: transfers land, then arrivals, then steps start):

* ``Arrival`` -> colocated: the router picks an instance. Disaggregated: the deflection
  rule may send the prompt to a decode node; otherwise it joins the prefill pool's queue
  and free prefill instances take batches from it (``ppas.cluster.queue``).
* ``StepStart`` of instance i at t -> first the requests its previous step finished (at
  t) are handed on, then the engine advances (``EngineSim.advance``: one step, or a run
  of decode-only steps) and its next step is booked at the end. A prefill instance with
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
* ``TransferLanded`` -> the prefill instance frees the prompt's KV (it held it until now,
  and stalls, taking no new prompt, while held KV leaves no room for one); the request
  joins the decode instance with ``prompt - 1`` tokens computed (as vLLM's KV connectors
  do: the last prompt token is recomputed there and samples the first output token,
  which is the client's first token).

Invariants (tests): every request finishes (or fails) exactly once; no instance's KV
blocks exceed its capacity; no transfer starts before its prefill ended. One mixed
instance behind ``pass-through`` reproduces ``simulate`` exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from heapq import heappop, heappush

from ppas.cluster.config import ClusterConfig, PoolConfig
from ppas.cluster.deflection import make_deflection
from ppas.cluster.events import Arrival, Event, StepStart, TransferLanded
from ppas.cluster.instance import ClusterRequest, Instance, build_instances
from ppas.cluster.queue import make_queue
from ppas.cluster.router import make_router
from ppas.core.metrics import Gaps, RequestMetrics
from ppas.cost import CostModel
from ppas.cost.base import StepShape
from ppas.engine.request import SimRequest
from ppas.workload import RequestSpec, Trace

_INF = float("inf")


@dataclass
class ClusterResult:
    requests: list[ClusterRequest]
    instances: list[Instance]
    num_events: int

    def request_metrics(self) -> list[RequestMetrics]:
        return [m for m in (r.metrics() for r in self.requests) if m is not None]

    def gaps(self) -> Gaps:
        """Every instance's inter-token latencies (ITL). A disaggregated request's client
        tokens all come from its decode instance (the prefill instance's one sampled token
        is not sent), so these are the client's gaps."""
        out = Gaps()
        for x in self.instances:
            out.merge(x.engine.gaps)
        return out

    @property
    def num_failed(self) -> int:
        return sum(1 for r in self.requests if r.failed)

    @property
    def num_deflected(self) -> int:
        return sum(1 for r in self.requests if r.deflected)


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
    cluster = Cluster(specs, config, cost_model_for, record_steps, run_ahead)
    heap: list[tuple[float, int, int, Event]] = []  # (time, kind's order, seq, event)
    seq = num_events = 0
    while cluster.num_done < len(specs):
        event = cluster.arrival_before(heap) or heappop(heap)[3]
        num_events += 1
        for booked in cluster.handle(event):
            seq += 1
            heappush(heap, (booked.time, booked.order, seq, booked))
    return ClusterResult(cluster.requests, cluster.instances, num_events)


class Cluster:
    """The cluster between two events: instances, requests, the prefill pool's queue.
    Each ``on_*`` handler applies one event and returns the events it books, in booking
    order; the helpers it calls append theirs to the same list (``out``)."""

    def __init__(self, specs: Sequence[RequestSpec], config: ClusterConfig,
                 cost_model_for: Callable[[PoolConfig, int], CostModel] | None,
                 record_steps: bool, run_ahead: bool) -> None:
        self.requests = [ClusterRequest(i, s) for i, s in enumerate(specs)]
        self.instances = insts = build_instances(config, cost_model_for, record_steps)
        self.router = make_router(config.router)
        self.disaggregated = config.disaggregated
        self.prefill_pool = [x for x in insts if x.role == "prefill"]
        self.decode_pool = [x for x in insts if x.role == "decode"]
        self.deflection = (make_deflection(config.pool("decode").deflection)
                           if self.disaggregated else None)
        self.queue = make_queue(config.pool("prefill").queue if self.disaggregated else "fcfs")
        self.next_arrival = 0  # position in ``requests`` of the next one to arrive
        self.num_done = 0  # requests finished or failed
        # Instances whose state a rule reads at arrivals run no further than the next
        # arrival; the others run ahead freely (decode runs) and are rewound when a
        # request joins them.
        self.bounded = {x.index for x in insts if not run_ahead
                        or (self.router.reads_state and x.role != "prefill")
                        or (x.role == "decode" and self.deflection is not None)}

    # -- the clock ---------------------------------------------------------------------
    def arrival_before(self, heap: list[tuple[float, int, int, Event]]) -> Arrival | None:
        """The next arrival when it comes before every booked event (arrivals are read
        off the sorted trace, never booked), taking it; else None."""
        i = self.next_arrival
        if i >= len(self.requests):
            return None
        t = self.requests[i].spec.arrival_s
        if heap and (heap[0][0] < t or (heap[0][0] == t and heap[0][1] < Arrival.order)):
            return None
        self.next_arrival = i + 1
        return Arrival(t, i)

    def next_arrival_time(self) -> float:
        i = self.next_arrival
        return self.requests[i].spec.arrival_s if i < len(self.requests) else _INF

    def handle(self, event: Event) -> list[Event]:
        match event:
            case StepStart():
                return self.on_step(event)
            case Arrival():
                return self.on_arrival(event)
            case TransferLanded():
                return self.on_transfer(event)

    # -- handlers, one per kind of event -----------------------------------------------
    def on_step(self, ev: StepStart) -> list[Event]:
        """Hand on what the previous step finished, then advance the engine."""
        inst = self.instances[ev.instance]
        if ev.version != inst.version:
            return []  # superseded by a rewind
        out: list[Event] = []
        eng = inst.engine
        if eng.finished:
            for r in eng.finished:
                self.finish(inst, r, out)
            eng.finished.clear()
        if inst.role == "prefill" and len(self.queue) and not eng.has_work():
            self.dispatch(inst, ev.time, out)
        if not eng.has_work():
            inst.busy = False
            return out
        eng.advance(self.next_arrival_time() if inst.index in self.bounded else _INF)
        if eng.stalled:  # held KV (transfers in flight): resumes at a release
            inst.busy = False
            return out
        out.append(StepStart(eng.now, inst.index, ev.version))
        used = eng.total_blocks - eng.free_blocks if eng.total_blocks else 0
        if used > inst.max_kv_blocks_used:
            inst.max_kv_blocks_used = used
        return out

    def on_arrival(self, ev: Arrival) -> list[Event]:
        """Route the request (colocated), deflect it to a decode node, or queue it for
        the prefill pool."""
        cr = self.requests[ev.request]
        s, now = cr.spec, ev.time
        out: list[Event] = []
        if not self.disaggregated:
            j = self.route(self.instances, s, now, out)
            cr.instance = j
            cr.prefill = self.place(cr, self.instances[j], s, now, out)
            return out
        k = None
        if self.deflection is not None:
            for x in self.decode_pool:
                self.sync(x, now, out)
            k = self.deflection.choose(s.prompt_tokens, s.output_tokens, self.decode_pool,
                                       self.pool_ttft(s.prompt_tokens))
        if k is not None:
            cr.instance, cr.deflected = self.decode_pool[k].index, True
            cr.prefill = self.place(cr, self.decode_pool[k], s, now, out)
            return out
        self.queue.push(ev.request, s.prompt_tokens)
        for x in self.prefill_pool:
            if not x.busy and not x.engine.has_work():
                self.dispatch(x, now, out)
                if not len(self.queue):
                    break
        return out

    def on_transfer(self, ev: TransferLanded) -> list[Event]:
        """The prefill instance frees the prompt's KV; the request joins the decode
        instance with all but the last prompt token computed."""
        cr = self.requests[ev.request]
        s, now = cr.spec, ev.time
        out: list[Event] = []
        src = self.instances[cr.instance]
        assert cr.prefill is not None
        src.engine.release_kv(cr.prefill, now)
        if not src.busy and src.engine.has_work():
            self.wake(src, out)
        cr.decode = self.place(cr, self.decode_pool[ev.decode],
                               dataclasses.replace(s, arrival_s=now), now, out,
                               computed=s.prompt_tokens - 1)
        return out

    # -- what the handlers share -------------------------------------------------------
    def wake(self, inst: Instance, out: list[Event]) -> None:
        """Book the next step of an idle instance (at its engine's clock)."""
        inst.busy = True
        inst.version += 1
        out.append(StepStart(inst.engine.now, inst.index, inst.version))

    def sync(self, inst: Instance, now: float, out: list[Event]) -> None:
        """Bring ``inst`` back to ``now`` if a decode run took it past (``rewind``); its
        booked step event moves with it."""
        eng = inst.engine
        t = eng.now
        if t > now:
            eng.rewind(now)
            if eng.now != t:
                inst.version += 1
                out.append(StepStart(eng.now, inst.index, inst.version))

    def place(self, cr: ClusterRequest, inst: Instance, spec: RequestSpec, now: float,
              out: list[Event], computed: int = 0) -> SimRequest:
        """Hand a request copy to ``inst`` (``computed`` tokens already in its KV)."""
        self.sync(inst, now, out)
        r = inst.engine.add_request(spec)
        inst.owners.append(cr)  # engine-local index r.index -> cluster request
        if r.failed:
            cr.failed = r.failed
            cr.finishes += 1
            self.num_done += 1
            return r
        r.num_computed_tokens = computed
        inst.outstanding_tokens += spec.prompt_tokens + r.output_len - computed
        if not inst.busy:
            self.wake(inst, out)
        return r

    def dispatch(self, inst: Instance, now: float, out: list[Event]) -> None:
        """A free prefill instance takes the next batch from the pool queue: the prompt
        alone, one token sampled (the KV connector's prefill request)."""
        for i in self.queue.pop_batch(inst.engine.mbt):
            cr = self.requests[i]
            cr.instance = inst.index
            cr.prefill = self.place(cr, inst, dataclasses.replace(
                cr.spec, arrival_s=now, output_tokens=1, max_tokens=None), now, out)

    def route(self, cands: list[Instance], s: RequestSpec, now: float,
              out: list[Event]) -> int:
        if self.router.reads_state:
            for x in cands:
                self.sync(x, now, out)
        return self.router.route(s.prompt_tokens, s.output_tokens, cands, now)

    def finish(self, inst: Instance, r: SimRequest, out: list[Event]) -> None:
        """A request copy finished on ``inst`` at ``r.finish_time``: the request is done
        (its decode copy, or a copy that also decodes), or its KV starts crossing to the
        decode instance the router picks."""
        cr = inst.owners[r.index]
        s = cr.spec
        inst.outstanding_tokens -= (r.output_len + r.prompt_tokens
                                    - (r.prompt_tokens - 1 if r is cr.decode else 0))
        if inst.role == "prefill" and s.output_tokens == 1:
            inst.engine.release_kv(r, r.finish_time or 0.0)  # nothing to transfer
        if inst.role == "prefill" and s.output_tokens > 1:
            t = r.finish_time
            assert t is not None
            j = self.route(self.decode_pool, s, t, out)
            d = self.decode_pool[j]
            assert d.link is not None
            cr.transfer_start, cr.transfer_end = d.link.schedule(t, s.prompt_tokens)
            cr.decode_instance = d.index
            out.append(TransferLanded(cr.transfer_end, cr.index, j))
            return
        cr.finishes += 1
        self.num_done += 1

    def pool_ttft(self, prompt: int) -> float:
        """The prefill pool's predicted TTFT: queue + execution (+ transfer, first step)."""
        pre, dec = self.prefill_pool, self.decode_pool
        k = pre[0].costs()
        c = pre[0].engine.mbt
        per_tok = k.prefill_time(c, 0, c) / c
        backlog = self.queue.queued_tokens + sum(x.load()[0] for x in pre)
        link = dec[0].link
        t_first = dec[0].cost_model.step_time(StepShape.one_chunk(1, prompt - 1))
        return (backlog * per_tok / len(pre) + k.prefill_time(c, 0, prompt)
                + (link.duration(prompt) if link is not None else 0.0) + t_first)
