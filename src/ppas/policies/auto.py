"""ppas-auto: P-PAS whose N_th, B_cap and B_max come from the served model's cost model.

Ours. The P-PAS paper hand-picks N_th = 2, B_max = 16384, B_cap = 2048 for Qwen2.5-3B on
an RTX 5090 and lists choosing them per model and hardware as future work (spec, "What
the paper leaves open"). The decision rule is P-PAS's, unchanged (spec, "The P-PAS
policy"); only the three numbers are derived, once, in ``bind_cost_model``, from
``F(c)`` = predicted time to prefill a reference prompt of ``ref_prompt`` tokens alone
in chunks of ``c`` (candidates: powers of two in [256, ``c_limit``]):

* ``B_max`` = smallest candidate with ``F(c) <= (1 + max_loss) * min_c F(c)``: the knee
  of prefill efficiency, past which bigger chunks only lengthen steps (P-PAS §2: big
  chunks win by amortising GEMM and attention re-reads; 2k -> 16k saves 11.6% on 3B,
  0.6% on 7B, so the knee moves with the model);
* ``B_cap`` = smallest candidate with ``F(c) <= (1 + cap_loss) * F(B_max)``: under
  pressure, the shortest steps (decodes progress as often as possible) that still drain
  the prefill queue at no less than ``1 / (1 + cap_loss)`` of the best rate;
* ``N_th`` = ``1 + ceil(D / F(B_max))`` with ``D`` = ``ref_outputs`` decode-only steps of
  one request at ``ref_prompt`` context: the number of pending prompts beyond which the
  backlog's prefill (at B_max) outlasts one decode phase, i.e. big chunks would stall the
  running decodes for longer than those decodes take on their own.

``ref_prompt = 0`` (default) adapts the reference to the load: the three numbers are
tabulated for reference prompts of 2^9 .. 2^17 tokens at bind time, and each step uses
the row nearest (in log scale) to the mean prompt length of the pending prefills. On the
roofline RTX 5090 / Qwen2.5-3B model with 25k prompts this reproduces the paper's
(2, 2048, 16384). The global budget (MBT) is the largest B_max in the table. Without a
cost model the paper's values are used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ppas.core.config import check_fields, require
from ppas.core.decision import Decision, budget_decision
from ppas.core.limits import MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS
from ppas.core.view import SchedulerView
from ppas.cost.base import CostModel, StepShape
from ppas.policies.base import Policy
from ppas.policies.candidates import candidate_chunks
from ppas.policies.registry import register


@dataclass(frozen=True)
class PpasAutoConfig:
    """Reference workload and tolerances of the derivation (module docstring)."""

    ref_prompt: int = 0  # 0: mean prompt length of the pending prefills, per step
    ref_outputs: int = 32
    max_loss: float = 0.03
    cap_loss: float = 0.25
    c_limit: int = 32768

    def __post_init__(self) -> None:
        require(self.ref_prompt >= 0, f"ref_prompt must be >= 0, got {self.ref_prompt}")
        require(self.ref_outputs >= 1,
                f"ref_outputs must be >= 1, got {self.ref_outputs}")
        require(0 <= self.max_loss < 1,
                f"max_loss must be in [0, 1), got {self.max_loss}")
        require(self.cap_loss >= 0, f"cap_loss must be >= 0, got {self.cap_loss}")
        require(self.c_limit >= 256, f"c_limit must be >= 256, got {self.c_limit}")
        # Bounded like any prompt: F(c) of a 1e10-token reference ran for minutes.
        check_fields(self, "ref_prompt", "c_limit", at_most=MAX_PROMPT_TOKENS)
        check_fields(self, "ref_outputs", at_most=MAX_OUTPUT_TOKENS)


_REF_LOG2 = range(9, 18)  # reference prompts 512 .. 131072 tokens when ref_prompt = 0


def derive(cost_model: CostModel, cfg: PpasAutoConfig, ref_prompt: int) -> tuple[int, int, int]:
    """(n_th, b_cap, b_max) for ``cost_model`` and a reference prompt (module docstring)."""
    chunks = candidate_chunks(256, cfg.c_limit)
    f = {c: cost_model.prefill_time(ref_prompt, c) for c in chunks}
    best = min(f.values())
    b_max = next(c for c in chunks if f[c] <= (1 + cfg.max_loss) * best)
    b_cap = next(c for c in chunks if c <= b_max and f[c] <= (1 + cfg.cap_loss) * f[b_max])
    dec_step = cost_model.step_time(StepShape(0, 0, 0.0, 0, 1, ref_prompt))
    n_th = 1 + math.ceil(cfg.ref_outputs * dec_step / f[b_max])
    return n_th, b_cap, b_max


@register("ppas-auto")
class PpasAuto(Policy):
    """P-PAS's rule with derived parameters: if N_p >= N_th and N_d > 0 the prefill budget
    is B_cap, else B_max; the global budget is B_max."""

    Config = PpasAutoConfig

    def __init__(self, config: PpasAutoConfig, spec: str | None = None) -> None:
        super().__init__(config, spec)
        # One row (n_th, b_cap, b_max) per reference prompt; paper values until bound.
        self.table: tuple[tuple[int, int, int], ...] = ((2, 2048, 16384),)
        self._mbt = 16384

    def bind_cost_model(self, cost_model: CostModel | None) -> None:
        if cost_model is None:
            return
        cfg = self.config
        refs = [cfg.ref_prompt] if cfg.ref_prompt else [1 << k for k in _REF_LOG2]
        self.table = tuple(derive(cost_model, cfg, r) for r in refs)
        self._mbt = max(b_max for _, _, b_max in self.table)

    @property
    def max_num_batched_tokens(self) -> int:
        return self._mbt

    def params_for(self, view: SchedulerView) -> tuple[int, int, int]:
        """The (n_th, b_cap, b_max) row for this step's pending prompts."""
        table = self.table
        if len(table) == 1:
            return table[0]
        total = n = 0
        waiting = view.waiting_prompt_tokens
        for r in view.requests:
            running = r.is_running
            if waiting is not None and not running:
                break  # the waiting ones' total is the engine's (the view lists them last)
            p = r.prompt_tokens
            if not running or r.num_computed_tokens < p:  # is_pending_prefill, inlined
                total += p
                n += 1
        if waiting is not None:  # O(running), whatever waits
            total += waiting
            n = view.num_pending_prefills
        if n == 0:
            return table[-1]
        i = round(math.log2(max(1.0, total / n))) - _REF_LOG2.start
        return table[min(len(table) - 1, max(0, i))]

    def decide(self, view: SchedulerView) -> Decision:
        n_th, b_cap, b_max = self.params_for(view)
        if view.num_pending_prefills >= n_th and view.num_running_decodes > 0:
            return budget_decision(b_cap)
        return budget_decision(b_max)
