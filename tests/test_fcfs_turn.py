"""The FCFS turn (``ppas.policies.fcfs_turn``): its clock and thresholds against their
definition, from the queue's states and from the engine's waiting log alike."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ppas.core.view import RequestSnapshot, SchedulerView, WaitingLog
from ppas.policies.fcfs_turn import FcfsTurns


def queue_view(waiting: list[RequestSnapshot], log: WaitingLog | None = None) -> SchedulerView:
    return SchedulerView(0.0, waiting, len(waiting), 0, 4096, 256, waiting_log=log)


def snap(rid: str, prompt: int, arrival: float = 0.0) -> RequestSnapshot:
    return RequestSnapshot(rid, arrival, prompt)


def test_a_request_reaches_its_turn_when_fcfs_would_admit_it() -> None:
    t = FcfsTurns(1.0)
    a, b, c = snap("a", 1000, 0.0), snap("b", 200, 1.0), snap("c", 10, 2.0)
    t.note(queue_view([a]))
    assert t.turned("a")  # nothing ahead of it
    t.note(queue_view([a, b]))
    assert t.threshold("b") == 1000 and not t.turned("b")
    t.note(queue_view([a, b, c]))
    assert t.threshold("c") == 1200
    t.note(queue_view([a, b]))  # c admitted first (passing both): 10 tokens
    assert t.admitted == 10 and not t.turned("b")
    t.note(queue_view([b]))  # then a: by now FCFS would have admitted b
    assert t.admitted == 1010 and t.turned("b")
    half = FcfsTurns(0.5)
    half.note(queue_view([a]))
    half.note(queue_view([a, b]))
    assert half.threshold("b") == 500
    late = FcfsTurns(1.0)  # a first look: the queue's order aside, the earlier arrival first
    late.note(queue_view([b, a]))
    assert late.threshold("a") == 0 and late.threshold("b") == 1000


#: Steps of a queue: (how many of the waiting leave, from which place, new prompts).
steps = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5),
                           st.lists(st.integers(1, 5000), max_size=3)),
                 min_size=1, max_size=25)


@settings(max_examples=200, deadline=None)
@given(steps, st.sampled_from([0.25, 1.0, 2.0]), st.booleans())
def test_clock_and_thresholds_by_their_definition(
        seq: list[tuple[int, int, list[int]]], k: float, requeue: bool) -> None:
    """``U`` is the sum of the prompts that left the queue, ``theta_i`` is ``U`` plus ``K``
    times the prompts waiting when ``i`` entered; ``U`` never falls, a threshold never
    changes (a request that re-enters keeps its own), noting a view twice changes
    nothing, and following the engine's log gives the same state as reading the queue."""
    by_log, by_queue = FcfsTurns(k), FcfsTurns(k)
    log = WaitingLog()
    queue: list[RequestSnapshot] = []
    gone: list[RequestSnapshot] = []
    admitted, theta = 0, {}
    n = 0

    def look() -> None:  # the policy's look at the queue: a step (each view noted twice)
        before = by_log.admitted
        for _ in range(2):
            by_log.note(queue_view(list(queue), log))
            by_queue.note(queue_view(list(queue)))
        assert by_log.admitted == admitted >= before
        for r in queue:
            assert by_log.threshold(r.request_id) == theta[r.request_id]
        assert (by_queue.admitted, by_queue.theta, by_queue.queued) == (
            by_log.admitted, by_log.theta, by_log.queued)

    for leave, at, prompts in seq:
        if requeue and gone:  # a request admitted at an earlier step is preempted: it comes
            back = gone.pop(0)  # back first, as vLLM puts it, with its own threshold
            queue.insert(0, back)
            log.events.append((True, back))
            look()
        for _ in range(min(leave, len(queue))):
            r = queue.pop(min(at, len(queue) - 1))
            admitted += r.prompt_tokens
            log.events.append((False, r))
            gone.append(r)
        for j, p in enumerate(prompts):
            r = snap(f"r{n + j}", p, float(n + j))
            theta[r.request_id] = admitted + k * sum(q.prompt_tokens for q in queue)
            queue.append(r)
            log.events.append((True, r))
        n += len(prompts)
        look()


def test_a_request_never_seen_waiting_has_its_turn() -> None:
    t = FcfsTurns(1.0)
    assert t.turned("x") and t.threshold("x") == float("-inf")
