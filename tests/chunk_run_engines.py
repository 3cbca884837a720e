"""Engines for the chunk-run tests (``test_chunk_runs.py``, ``test_ladder_chunk_runs.py``):
every step's record kept, chunk runs on or off, the steps taken in them counted; and an
engine's whole state, for comparing runs taken in one go with single steps."""

from __future__ import annotations

from collections import deque

from ppas.cost.base import CostModel
from ppas.engine.simulator import EngineConfig, EngineSim
from ppas.policies import make_policy


class Counter:
    """The steps taken in chunk runs."""

    def __init__(self) -> None:
        self.steps = 0


def engine(policy: str, cost_model: CostModel, kv: int | None, runs: bool,
           mbt: int | None = None) -> tuple[EngineSim, Counter]:
    """An engine for ``policy`` with every step's record kept, chunk runs on or off
    (decode runs in both), and the counter of the steps its chunk runs take."""
    sim = EngineSim(make_policy(policy), cost_model,
                    EngineConfig(num_kv_blocks=kv, max_num_batched_tokens=mbt))
    sim.recent = deque(maxlen=None)  # every step's record
    sim._chunk_runs = runs and sim._chunk_runs
    counter = Counter()
    take = sim._chunk_run

    def counted(limit: float) -> bool:
        n = sim.num_steps
        ok = take(limit)
        counter.steps += sim.num_steps - n
        return ok

    sim._chunk_run = counted  # type: ignore[method-assign]
    return sim, counter


def state(sim: EngineSim) -> tuple[object, ...]:
    """Everything a run computed: each request's times, tokens and blocks, every step's
    record, the gaps, the counts, the KV pool, the clock and the finishing order."""
    reqs = [(r.first_scheduled_time, r.first_token_time, r.last_token_time, r.finish_time,
             r.num_preemptions, r.failed, r.num_output_tokens, r.num_computed_tokens,
             r.blocks) for r in sim.requests]
    return (reqs, list(sim.recent), sim.gaps.one.tobytes(), sim.gaps.values, sim.gaps.counts,
            sim.num_steps, sim.num_preemptions, sim.pool.num_free, sim.now,
            [r.request_id for r in sim.finished])
