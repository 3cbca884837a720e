"""Multi-instance serving: N engine simulators behind a router, colocated or with
prefill/decode pools and KV transfer (``simulate_cluster``)."""

from ppas.cluster.config import ClusterConfig, LinkConfig, PoolConfig, SloConfig, load_cluster

__all__ = ["ClusterConfig", "LinkConfig", "PoolConfig", "SloConfig", "load_cluster"]
