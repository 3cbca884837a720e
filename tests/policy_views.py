"""Hand-made scheduler views for policy tests: a running decode, a running prefill, a
waiting request, a guarded step record, and the view over them (counts by
``ppas.engine.step_rules``, as engines compute them); a request list that counts its reads
and a run's steps and request times, for the tests that hold a policy's index to its
whole-queue rule."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ppas.core.view import RequestSnapshot, RequestView, SchedulerView, StepRecord, view_counts


def view(reqs: list[RequestSnapshot], now: float = 10.0, mbt: int = 16384,
         steps: tuple[StepRecord, ...] = ()) -> SchedulerView:
    np_, nd = view_counts(reqs)
    return SchedulerView(now, reqs, np_, nd, mbt, 256, steps)


def dec(i: int, ctx: int = 25000, out: int = 3, last: float | None = 9.99,
        tpot: float | None = None) -> RequestSnapshot:
    """A running request past its ``ctx``-token prompt, ``out`` tokens sampled."""
    return RequestSnapshot(f"d{i}", 0.0, ctx, ctx, out, 32, True, last, None, tpot)


def pre(i: int, done: int = 4096, prompt: int = 25000, arrival: float = 5.0,
        ttft: float | None = None) -> RequestSnapshot:
    """A running request ``done`` tokens into its prompt."""
    return RequestSnapshot(f"p{i}", arrival, prompt, done, 0, 32, True, None, ttft)


def wait(i: int, prompt: int = 25000, arrival: float = 6.0,
         ttft: float | None = None) -> RequestSnapshot:
    """A waiting request."""
    return RequestSnapshot(f"w{i}", arrival, prompt, ttft_slo=ttft)


def guarded(budget: int, duration: float, interval: float) -> StepRecord:
    """A step whose prefill (``budget`` tokens) ran beside two decodes."""
    return StepRecord(9.0, duration, interval, budget, budget, 2, 1, 2)


class Counting(Sequence[RequestView]):
    """A request list that counts the requests read (a slice: its length)."""

    def __init__(self, reqs: list[RequestView]) -> None:
        self.reqs, self.read = reqs, 0

    def __len__(self) -> int:
        return len(self.reqs)

    def __getitem__(self, i):  # type: ignore[no-untyped-def,override]
        out = self.reqs[i]
        self.read += len(out) if isinstance(i, slice) else 1
        return out

    def __iter__(self) -> Iterator[RequestView]:
        for r in self.reqs:
            self.read += 1
            yield r


def run_of(res: object) -> list[tuple[object, ...]]:
    steps = [(s.time, s.prefill_budget, s.scheduled, s.preempted)
             for s in res.steps]  # type: ignore[attr-defined]
    reqs = [(r.request_id, r.first_scheduled_time, r.first_token_time, r.finish_time,
             r.num_preemptions) for r in res.requests]  # type: ignore[attr-defined]
    return steps + reqs
