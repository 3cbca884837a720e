"""What a live replay records (``ppas.live.client``): one ``RequestOutcome`` per trace request
and the run's ``BenchResult``.

Invariants: every trace request yields exactly one outcome, in trace order, whether it
succeeded, failed, timed out or was cut off; a failure carries a one-line reason. Latencies
count from the request's *scheduled* submission (run start + its arrival offset), so client
lateness counts against the server as in the paper.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ppas.core.metrics import RequestMetrics, tpot_of


@dataclass(slots=True)
class RequestOutcome:
    """What one request did. Times are seconds; ``scheduled_s``/``end_s`` count from the run
    start, ``ttft``/``e2e``/``itl`` from the scheduled submission."""

    index: int
    arrival_s: float  # the trace's arrival time
    scheduled_s: float  # submission time from the run start (= arrival - first arrival)
    prompt_tokens: int  # as sent; replaced by the server's usage.prompt_tokens when given
    requested_tokens: int
    output_tokens: int = 0  # tokens received (also for failures: what arrived before)
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2e: float | None = None  # last token - scheduled submission; successes only
    end_s: float | None = None  # when the request finished or failed, from the run start
    error: str = ""  # "" on success, else "<category>: detail" on one line

    @property
    def success(self) -> bool:
        return not self.error and self.e2e is not None

    @property
    def tpot(self) -> float | None:
        """``metrics.tpot_of``; None for a failed request (it has no TPOT)."""
        if not self.success or self.ttft is None or self.e2e is None:
            return None
        return tpot_of(self.ttft, self.e2e, self.output_tokens)

    def metrics(self) -> RequestMetrics | None:
        """The request as ``ppas.core.metrics`` counts it: on the run's clock, done at
        ``end_s`` (its stream closed); None if it failed."""
        tpot = self.tpot
        if self.ttft is None or self.e2e is None or tpot is None:
            return None
        return RequestMetrics(self.scheduled_s, self.ttft, self.e2e, tpot, self.output_tokens,
                              end_s=self.end_s)


@dataclass
class BenchResult:
    """All outcomes of one run, in trace order (one per trace request)."""

    outcomes: list[RequestOutcome]
    duration_s: float  # first submission -> last request ended (success or failure)
    description: str = ""
    interrupted: bool = False  # Ctrl-C: unfinished requests are failed as "cancelled"
    interrupted_by: str = ""  # "SIGINT" / "SIGTERM" when a signal stopped the run

    def per_request(self) -> dict[str, list[Any]]:
        """Per-request arrays in trace order (``vllm bench serve`` names; None where a
        failed request has no value)."""
        o = self.outcomes
        return {
            "arrival_s": [r.arrival_s for r in o],
            "scheduled_s": [r.scheduled_s for r in o],
            "end_s": [r.end_s for r in o],
            "input_lens": [r.prompt_tokens for r in o],
            "output_lens": [r.output_tokens for r in o],
            "ttfts": [r.ttft for r in o],
            "tpots": [r.tpot for r in o],
            "itls": [list(r.itl) for r in o],
            "e2els": [r.e2e for r in o],
            "errors": [r.error for r in o],
        }
