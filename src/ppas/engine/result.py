"""What a simulated run returns: per-step records (``StepTrace``, with ``record_steps``) and
the run's requests and inter-token gaps (``SimResult``), summarised by
``ppas.core.metrics.RunSummary``, against SLOs if given (``ppas.core.slo``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ppas.core.metrics import Gaps, RequestMetrics, RunSummary, tpot_of
from ppas.core.slo import SloSpec
from ppas.engine.request import SimRequest
from ppas.engine.solo import SoloTable


@dataclass(frozen=True, slots=True)
class StepTrace:
    """Per-step record kept with ``record_steps=True`` (tests, plots).

    Token classes follow ``ppas.engine.step_rules`` (rule 5): ``num_prefill_tokens`` are the
    tokens of prefill chunks (inside a prompt: what the policy's cap limits),
    ``num_recompute_tokens`` those of recompute tails after a preemption (priced as
    prefill, not capped), ``num_decode_tokens`` the single-token decodes;
    ``num_decode_reqs`` counts the requests past their prompt that got tokens (decodes and
    recompute tails: the N_d side). ``scheduled`` lists (request id, tokens) in schedule order,
    ``preempted`` the ids preempted this step, in order.
    """

    time: float
    duration_s: float
    prefill_budget: int
    num_prefill_tokens: int
    num_recompute_tokens: int
    num_decode_tokens: int
    num_decode_reqs: int
    pending_prefills: int
    running_decodes: int
    kv_blocks_used: int
    scheduled: tuple[tuple[str, int], ...]
    preempted: tuple[str, ...]

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_recompute_tokens + self.num_decode_tokens

    @property
    def num_preempted(self) -> int:
        return len(self.preempted)


@dataclass
class SimResult:
    requests: list[SimRequest]
    num_steps: int
    num_preemptions: int
    kv_blocks_total: int | None
    steps: list[StepTrace] = field(default_factory=list)
    gaps: Gaps = field(default_factory=Gaps)  # inter-token latencies (ITL)

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens served from the prefix cache at first admission over all prompt
        tokens of the requests admitted (0 with prefix caching off)."""
        done = [r for r in self.requests if r.first_scheduled_time is not None]
        total = sum(r.prompt_tokens for r in done)
        return sum(r.num_hit_tokens for r in done) / total if total else 0.0

    def request_metrics(self, slo: SloSpec | None = None,
                        solo: SoloTable | None = None) -> list[RequestMetrics]:
        """The completed requests' metrics, with the trace's SLOs, or ``slo``'s in their
        place (``solo``: each request's latency alone, for relative SLOs)."""
        out = []
        for r in self.requests:
            if r.failed or r.finish_time is None or r.first_token_time is None:
                continue
            m = RequestMetrics(
                arrival_s=r.arrival_time, ttft=r.first_token_time - r.arrival_time,
                e2e=r.finish_time - r.arrival_time,
                tpot=tpot_of(r.first_token_time, r.finish_time, r.output_len),
                output_tokens=r.output_len, ttft_slo=r.ttft_slo, tpot_slo=r.tpot_slo,
                slo_class=r.slo_class)
            if slo is not None:
                alone = solo(r.prompt_tokens, r.output_len) if solo else None
                m = slo.apply(m, alone)
            out.append(m)
        return out

    def run_summary(self, slo: SloSpec | None = None,
                    solo: SoloTable | None = None) -> RunSummary:
        """``RunSummary`` of the run: figures, tails with ITL, attainment and goodput."""
        failed = sum(1 for r in self.requests if r.failed)
        return RunSummary.of(self.request_metrics(slo, solo), failed, self.gaps)

    def summary(self, slo: SloSpec | None = None,
                solo: SoloTable | None = None) -> dict[str, float | int]:
        """The run record: ``RUN_KEYS``, attainment and goodput under SLOs, and the tails
        (P50/P90/P99 of TTFT, TPOT, E2E and ITL)."""
        return self.run_summary(slo, solo).record(tails=True)

    def failure_reasons(self) -> dict[str, int]:
        """Failed requests per reason (empty when all finished)."""
        out: dict[str, int] = {}
        for r in self.requests:
            if r.failed:
                out[r.failed] = out.get(r.failed, 0) + 1
        return out
