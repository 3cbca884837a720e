"""One engine of a cluster (``Instance``), one request's life across engines
(``ClusterRequest``), and the engines a cluster config describes (``build_instances``).

An instance is a ``ppas.engine.simulator.EngineSim`` (vLLM V1 step semantics, its own
policy, cost model and paged KV cache) plus what the cluster's rules read about it: the
router's counters, its load and predicted finish time, and, on a decode instance, the
inbound KV link.
"""

from __future__ import annotations

from collections.abc import Callable

from ppas.cluster.config import ClusterConfig, PoolConfig
from ppas.cluster.transfer import Link, kv_bytes_per_token
from ppas.core.metrics import RequestMetrics, tpot_of
from ppas.core.view import is_prefill_chunk
from ppas.cost import CostModel, make_cost_model
from ppas.cost.steps import StepCosts
from ppas.engine.request import SimRequest
from ppas.engine.simulator import EngineConfig, EngineSim
from ppas.policies import make_policy
from ppas.workload import RequestSpec


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
            if is_prefill_chunk(c, r.prompt_tokens):
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
            tpot=tpot_of(r.first_token_time, r.finish_time, r.output_len),
            output_tokens=r.output_len, ttft_slo=s.ttft_slo, tpot_slo=s.tpot_slo,
            slo_class=s.slo_class)


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
