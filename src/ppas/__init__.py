"""ppas: adaptive prefill scheduling for LLM serving (P-PAS and related policies).

The core (``ppas.policies``, ``ppas.workload``, ``ppas.engine.simulator``, ``ppas.cost``,
``ppas.core.metrics``) imports numpy at most; the vLLM adapter (``ppas.vllm``), the HTTP
benchmark (``ppas.live.client``) and plotting are thin edges imported only when used.
"""

__version__ = "0.1.0"
