"""The plugin's published name: ``--scheduler-cls ppas.vllm.PolicyScheduler``.

The code lives in ``ppas.live.plugin``; this module keeps the name users pass to vLLM
stable across the project's layout.
"""

from ppas.live.plugin import PolicyScheduler

__all__ = ["PolicyScheduler"]
