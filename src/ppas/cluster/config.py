"""Cluster configuration: instances in pools, a router, the KV link, SLOs (TOML).

A cluster is either *colocated* (one or more ``mixed`` pools: every instance prefills and
decodes its own requests, the router places each arrival) or *disaggregated* (exactly one
``prefill`` pool and one ``decode`` pool: prompts run on prefill instances, their KV cache
crosses the link, decodes run on decode instances). Example::

    [router]
    name = "least-outstanding-tokens"   # or round-robin, earliest-completion, pass-through

    [link]                     # per decode instance, inbound; transfers to one node queue
    bandwidth_gbs = 25.0       # GB/s (10^9 bytes)
    latency_s = 0.0002

    [slo]                      # given to requests whose trace has none
    ttft_s = 2.0
    tpot_s = 0.1

    [[pools]]
    name = "prefill"
    role = "prefill"
    instances = 4
    hardware = "h200"
    model = "llama3.2-3b"
    policy = "mbt:8192"
    queue = "laps:short_tokens=256"    # the pool queue: fcfs or laps

    [[pools]]
    name = "decode"
    role = "decode"
    instances = 12
    hardware = "h200"
    model = "llama3.2-3b"
    policy = "tbt-ladder:tbt_slo=0.05"
    deflection = "ladder:tbt_slo=0.05"  # or "off"

Every table is a frozen dataclass validated in ``__post_init__``; config strings
(policy, router, queue, deflection) are parsed by their registries, so a bad name fails
while the file is read, with one line naming the allowed values.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ppas.cluster.deflection import make_deflection
from ppas.cluster.queue import make_queue
from ppas.cluster.router import make_router
from ppas.core.config import (
    FieldError,
    at,
    check_fields,
    check_keys,
    check_times,
    from_table,
    require,
)
from ppas.core.errors import PpasError
from ppas.core.limits import (
    MAX_BANDWIDTH_GBS,
    MAX_INSTANCES,
    MAX_KV_BLOCKS,
    MAX_NUM_SEQS,
    MAX_TIME_S,
    MAX_TP,
)
from ppas.policies import make_policy

ROLES = ("mixed", "prefill", "decode")
DEFAULT_ROUTER = "least-outstanding-tokens"


@dataclass(frozen=True)
class LinkConfig:
    """The KV-transfer link into each decode instance: bandwidth in GB/s (10^9 B/s) and a
    fixed per-transfer latency. Transfers into one instance are served FIFO."""

    bandwidth_gbs: float = 25.0
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        require(0 < self.bandwidth_gbs <= MAX_BANDWIDTH_GBS,
                f"must be > 0 and <= {MAX_BANDWIDTH_GBS:g} GB/s, got {self.bandwidth_gbs}",
                key="bandwidth_gbs")
        require(0 <= self.latency_s <= MAX_TIME_S,
                f"must be in [0, {MAX_TIME_S:g}] s, got {self.latency_s}", key="latency_s")


@dataclass(frozen=True)
class SloConfig:
    """Default per-request SLOs (seconds), applied where a trace gives none."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def __post_init__(self) -> None:
        check_times(self, "ttft_s", "tpot_s")


@dataclass(frozen=True)
class PoolConfig:
    """``instances`` identical engines: one policy, cost model and KV capacity each."""

    name: str
    role: str = "mixed"
    instances: int = 1
    policy: str = "mbt:2048"
    hardware: str | None = None
    model: str | None = None
    cost_model: str = "roofline"
    tp: int = 1
    max_num_seqs: int = 256
    num_kv_blocks: int | None = None
    queue: str = "fcfs"  # prefill pools only: the pool queue's discipline
    deflection: str = "off"  # decode pools only: prefill deflection rule

    def __post_init__(self) -> None:
        require(bool(self.name), "must not be empty", key="name")
        check_fields(self, "role", one_of=ROLES)
        check_fields(self, "instances", "tp", "max_num_seqs", "num_kv_blocks", at_least=1)
        # The bounds of the same flags (ppas.core.limits): a TOML number is not trusted more.
        for key, hi in (("instances", MAX_INSTANCES), ("tp", MAX_TP),
                        ("max_num_seqs", MAX_NUM_SEQS), ("num_kv_blocks", MAX_KV_BLOCKS)):
            check_fields(self, key, at_most=hi)
        require(self.queue == "fcfs" or self.role == "prefill",
                "applies to prefill pools only", key="queue")
        require(self.deflection == "off" or self.role == "decode",
                "applies to decode pools only", key="deflection")
        if self.cost_model == "roofline":
            require(bool(self.hardware and self.model),
                    "the roofline cost model needs hardware and model", key="cost_model")
        # Config strings are checked now, each by its registry (one line, allowed values).
        for key, make in (("policy", make_policy), ("queue", make_queue),
                          ("deflection", make_deflection)):
            try:
                make(getattr(self, key))
            except PpasError as e:
                raise FieldError(key, str(e)) from None


@dataclass(frozen=True)
class ClusterConfig:
    pools: tuple[PoolConfig, ...]
    router: str = DEFAULT_ROUTER
    link: LinkConfig = field(default_factory=LinkConfig)
    slo: SloConfig = field(default_factory=SloConfig)

    def __post_init__(self) -> None:
        require(len(self.pools) >= 1, "a cluster needs at least one pool")
        names = [p.name for p in self.pools]
        require(len(set(names)) == len(names), f"pool names must be unique, got {names}")
        require(self.num_instances <= MAX_INSTANCES, f"the pools hold {self.num_instances} "
                f"instances; the limit is {MAX_INSTANCES}")
        roles = sorted(p.role for p in self.pools)
        require(all(r == "mixed" for r in roles) or roles == ["decode", "prefill"],
                "pools must be all 'mixed' (colocated) or exactly one 'prefill' and one "
                f"'decode' pool (disaggregated), got roles {roles}")
        try:
            make_router(self.router)
        except PpasError as e:
            raise FieldError("router", str(e)) from None

    @property
    def disaggregated(self) -> bool:
        return self.pools[0].role != "mixed"

    @property
    def num_instances(self) -> int:
        return sum(p.instances for p in self.pools)

    def pool(self, role: str) -> PoolConfig:
        for p in self.pools:
            if p.role == role:
                return p
        raise PpasError(f"cluster has no {role!r} pool")

    def with_instances(self, total: int, prefill_share: float | None = None) -> ClusterConfig:
        """The same cluster resized to ``total`` instances: a colocated cluster keeps its
        pools' proportions; a disaggregated one gets ``round(total * prefill_share)``
        prefill instances (at least 1 of each role); ``prefill_share`` None keeps the
        current P:D ratio."""
        require(total >= 1, f"instance count must be >= 1, got {total}")
        if not self.disaggregated:
            require(total >= len(self.pools),
                    f"{len(self.pools)} pools need at least {len(self.pools)} instances")
            old = self.num_instances
            sizes = [max(1, round(p.instances * total / old)) for p in self.pools]
            sizes[0] += total - sum(sizes)
            require(sizes[0] >= 1, f"cannot split {total} instances over the pools")
            return dataclasses.replace(self, pools=tuple(
                dataclasses.replace(p, instances=n) for p, n in zip(self.pools, sizes,
                                                                    strict=True)))
        require(total >= 2, "a disaggregated cluster needs at least 2 instances")
        share = (self.pool("prefill").instances / self.num_instances
                 if prefill_share is None else prefill_share)
        require(0 < share < 1, f"prefill share must be in (0, 1), got {share}")
        n_p = min(total - 1, max(1, round(total * share)))
        return dataclasses.replace(self, pools=tuple(
            dataclasses.replace(p, instances=n_p if p.role == "prefill" else total - n_p)
            for p in self.pools))


@dataclass(frozen=True)
class RouterTable:
    """``[router]``: the router's config string (or ``router = "NAME"`` at the top)."""

    name: str = DEFAULT_ROUTER


def cluster_from_dict(obj: object, where: str = "") -> ClusterConfig:
    """A cluster from its parsed TOML (``ppas.core.config.from_table``: one-line errors)."""
    t = check_keys(obj, where, ClusterConfig)
    if isinstance(t.get("router"), Mapping):
        t["router"] = from_table(RouterTable, t["router"], at(where, "router")).name
    return from_table(ClusterConfig, t, where)


def load_cluster(path: str | Path) -> ClusterConfig:
    """Read a cluster TOML file; any problem is a one-line PpasError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise PpasError(f"cluster file {str(p)!r} does not exist")
    try:
        obj = tomllib.loads(p.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise PpasError(f"{p}: cannot read cluster file: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise PpasError(f"{p}: invalid TOML: {e}") from None
    try:
        return cluster_from_dict(obj)
    except PpasError as e:
        raise PpasError(f"{p}: {e}") from None
