"""``vllm:``: stock vLLM's own prefill knobs as a baseline (no plugin), with the semantics
of the chosen release line's ``Scheduler.schedule`` (rules in ``ppas.engine.step_rules``, 4b).

    vllm:mbt=2048,long_prefill_token_threshold=256,adaptive=true,
         prefill_schedule_interval=4,max_num_seqs=256,max_num_active_seqs=8,version=0.33

``mbt`` is ``--max-num-batched-tokens`` (the global budget, vLLM's default 2048);
``long_prefill_token_threshold`` (default 0: off) limits every request's chunk per step
when more than one request is running or waiting; ``adaptive``
(``--long-prefill-token-threshold-adaptive``, default false) raises that limit to
MBT // requests; ``prefill_schedule_interval`` (default 1) holds prefill on the steps in
between (vLLM 0.33 applies it locally; 0.32 only under data-parallel MoE, so there it does
nothing); ``max_num_seqs`` (default: the engine's, ``EngineConfig.max_num_seqs``) and
``max_num_active_seqs`` (default none: ``max_num_seqs``; at most ``max_num_seqs``) set the
waiting loop's admission limit, ``Scheduler.max_num_active_reqs``, the same in both lines
(``step_rules.admission_limit``); vLLM refuses ``max_num_seqs`` above ``mbt``.
``version`` 0.32 or 0.33 (default 0.33, what ``pip install vllm`` gives).
"""

from __future__ import annotations

from dataclasses import dataclass

from ppas.core.config import init_fields, require
from ppas.core.decision import Decision, EngineKnobs, Knob
from ppas.core.view import SchedulerView
from ppas.policies.base import Policy
from ppas.policies.registry import register

VERSIONS = ("0.32", "0.33")


@dataclass(frozen=True)
class VllmStockConfig:
    mbt: int = 2048
    long_prefill_token_threshold: int = 0
    adaptive: bool = False
    prefill_schedule_interval: int = 1
    max_num_seqs: int | None = None
    max_num_active_seqs: int | None = None
    version: str = "0.33"

    def __post_init__(self) -> None:
        require(self.mbt >= 1, f"vllm: mbt must be >= 1, got {self.mbt}")
        require(self.long_prefill_token_threshold >= 0,
                "vllm: long_prefill_token_threshold must be >= 0 (0: off), got "
                f"{self.long_prefill_token_threshold}")
        require(self.prefill_schedule_interval >= 1,
                f"vllm: prefill_schedule_interval must be >= 1, got "
                f"{self.prefill_schedule_interval}")
        require(self.max_num_seqs is None or 1 <= self.max_num_seqs <= self.mbt,
                f"vllm: max_num_seqs must be in [1, mbt={self.mbt}] (vLLM's check), got "
                f"{self.max_num_seqs}")
        require(self.max_num_active_seqs is None or 1 <= self.max_num_active_seqs <= (
            self.max_num_seqs if self.max_num_seqs is not None else self.mbt),
                "vllm: max_num_active_seqs must be in [1, max_num_seqs] (vLLM's check), got "
                f"{self.max_num_active_seqs}")
        require(self.version in VERSIONS,
                f"vllm: version must be one of {', '.join(VERSIONS)}, got {self.version!r}")


#: The parameters named otherwise than their knob; every other one but ``version`` is its
#: knob's name (``Knob``, checked on import).
ALIASES = {"mbt": Knob.MAX_NUM_BATCHED_TOKENS,
           "adaptive": Knob.LONG_PREFILL_TOKEN_THRESHOLD_ADAPTIVE}
#: Each knob the simulator models -> its ``vllm:`` parameter.
KNOB_PARAMS: dict[Knob, str] = {ALIASES.get(p) or Knob(p): p
                                for p in init_fields(VllmStockConfig) if p != "version"}


@register("vllm")
class VllmStock(Policy):
    """Stock vLLM: the global budget is the only per-step budget (as ``mbt:``); the engine
    applies the knobs (``engine_knobs``), not the decision."""

    Config = VllmStockConfig

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.config.mbt)

    @property
    def engine_knobs(self) -> EngineKnobs:
        c = self.config
        return EngineKnobs(long_prefill_token_threshold=c.long_prefill_token_threshold,
                           long_prefill_token_threshold_adaptive=c.adaptive,
                           prefill_schedule_interval=c.prefill_schedule_interval,
                           local_prefill_interval=c.version != "0.32",
                           max_num_seqs=c.max_num_seqs,
                           max_num_active_seqs=c.max_num_active_seqs)

    def decide(self, view: SchedulerView) -> Decision:
        return Decision(self.config.mbt)
