"""Traces whose prompts share prefixes (``RequestSpec.prefix``): prefix groups (system
prompt, tool schema, retrieved document) and multi-turn sessions."""

from __future__ import annotations

import random

from ppas.core.config import require
from ppas.workload.arrivals import LengthDist, gamma_arrivals, parse_lengths
from ppas.workload.requests import RequestSpec, Trace


def prefix_group_trace(rate: float, num_requests: int, seed: int, num_groups: int,
                       prefix_tokens: int, suffix_tokens: str | int | LengthDist,
                       output_tokens: str | int | LengthDist, burstiness: float = 1.0,
                       zipf: float = 0.0) -> Trace:
    """Requests in ``num_groups`` prefix groups (system prompt, tool schema, retrieved
    document): each request draws a group (weight ``1 / (k + 1) ** zipf``; 0 = uniform),
    shares the group's ``prefix_tokens`` and adds a unique suffix. ``rate = inf`` is an
    offline backlog (everything at t = 0)."""
    require(num_groups >= 1, f"num_groups must be >= 1, got {num_groups}")
    require(prefix_tokens >= 0, f"prefix_tokens must be >= 0, got {prefix_tokens}")
    require(zipf >= 0, f"zipf must be >= 0, got {zipf}")
    sd, od = parse_lengths(suffix_tokens), parse_lengths(output_tokens)
    arr = gamma_arrivals(rate, num_requests, seed, burstiness)
    rng = random.Random(seed ^ 0x9F1C)
    weights = [1.0 / (k + 1) ** zipf for k in range(num_groups)]
    reqs = []
    for a in arr:
        g = rng.choices(range(num_groups), weights)[0]
        prefix = ((f"group{g}", prefix_tokens),) if prefix_tokens else ()
        reqs.append(RequestSpec(a, prefix_tokens + sd.sample(rng), od.sample(rng),
                                prefix=prefix))
    return Trace(tuple(reqs), arr[-1],
                 f"prefix groups {num_groups}x{prefix_tokens} rate {rate:g} seed {seed}")


def session_trace(num_sessions: int, turns: int, seed: int, session_rate: float,
                  system_tokens: int, first_tokens: int, turn_tokens: str | int | LengthDist,
                  output_tokens: str | int | LengthDist, think_s: float) -> Trace:
    """Multi-turn / agent sessions: sessions start as a Poisson process at
    ``session_rate``; every session's prompts share a ``system_tokens`` system prompt, and
    each turn's prompt extends the previous one by ``turn_tokens`` (the next user or tool
    message; the previous answer is counted in it, as new tokens, since its text is the
    engine's). Turn ``k + 1`` arrives ``think_s`` (exponential, that mean) after turn
    ``k``'s arrival (open loop, so the same trace replays live)."""
    require(num_sessions >= 1, f"num_sessions must be >= 1, got {num_sessions}")
    require(turns >= 1, f"turns must be >= 1, got {turns}")
    require(system_tokens >= 0 and first_tokens >= 1,
            "system_tokens must be >= 0 and first_tokens >= 1")
    require(think_s > 0, f"think_s must be > 0, got {think_s}")
    td, od = parse_lengths(turn_tokens), parse_lengths(output_tokens)
    starts = gamma_arrivals(session_rate, num_sessions, seed, 1.0)
    rng = random.Random(seed ^ 0x5E55)
    reqs = []
    for s, t in enumerate(starts):
        own = first_tokens
        for _ in range(turns):
            prefix = ((("system", system_tokens),) if system_tokens else ()) + ((f"s{s}", own),)
            reqs.append(RequestSpec(t, system_tokens + own, od.sample(rng), prefix=prefix))
            own += td.sample(rng)
            t += rng.expovariate(1.0 / think_s)
    reqs.sort(key=lambda r: r.arrival_s)
    return Trace(tuple(reqs), reqs[-1].arrival_s,
                 f"sessions {num_sessions}x{turns} rate {session_rate:g} seed {seed}")
