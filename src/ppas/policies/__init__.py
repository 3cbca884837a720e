"""Prefill-budget policies behind one interface (``Policy.decide(view) -> Decision``)."""

from ppas.core.decision import Decision
from ppas.policies.base import Policy
from ppas.policies.registry import make_policy, policy_names

__all__ = ["Decision", "Policy", "make_policy", "policy_names"]
