"""Bounds on every number a user can give (flags, trace files, phases), in one place.

Each bound keeps a run finite and meaningful: token counts far above any model's context,
rates or durations whose traces would not fit in memory, or times so large that float
seconds lose the step resolution (an ``arrival_s`` of 1e308 would freeze the simulated
clock) are refused up front with a one-line error that states the bound.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

MAX_PROMPT_TOKENS = 10_000_000  # above every served context (10M: Llama 4 Scout)
MAX_OUTPUT_TOKENS = 1_000_000
MAX_CONTEXT_TOKENS = MAX_PROMPT_TOKENS + MAX_OUTPUT_TOKENS  # one request's whole sequence
MAX_REQUESTS = 1_000_000  # per trace (generated or read)
MAX_RATE = 10_000.0  # requests/s, per phase or gamma mean
MAX_TIME_S = 10_000_000.0  # trace length / arrival time (~116 days; float ulp < 2 ns)
MAX_TIME_SCALE = 1e6  # a replayed trace's arrival-time factor (--time-scale)
MIN_RATE_SCALE = 1 / MAX_TIME_SCALE  # ppas capacity's rate scales (1 / the time scale)
MAX_RATE_SCALE = 1e6
MAX_BISECT_STEPS = 30  # ppas capacity: each halves the bracket (in log scale)
MAX_LENGTH_SCALE = 100.0  # a replayed trace's length factor (--length-scale)
MIN_TIME_S = 1e-6  # an SLO, a step-time target, a latency: 1 us, below any engine step
MIN_BURSTINESS, MAX_BURSTINESS = 1e-3, 1e3  # gamma shape (vllm bench serve --burstiness)
MAX_SEED = 2**32 - 1
MAX_PRIORITY = 2**31 - 1  # |vLLM's per-request priority| (a trace's priority column)
MAX_TP = 1024
MAX_DP_SIZE = 65_536  # data-parallel ranks of one server (a step log header's size)
MAX_NUM_SEQS = 1 << 20
MAX_PREFILL_INTERVAL = 1_000_000  # vLLM's prefill_schedule_interval, in steps
MAX_KV_BLOCKS = 1 << 40
MAX_KV_TOKENS = 1 << 44
MAX_SKIP_STEPS = 1 << 40
MAX_VOCAB = 10_000_000
MAX_TIMEOUT_S = 1e6
MAX_CONCURRENCY = 1_000_000
MAX_WARMUPS = 1000
MAX_PROBE_REQUESTS = 1000  # an experiment's capacity probe: requests, one at a time
MAX_CAPACITY_LOAD = 100.0  # an experiment's load as a fraction of the probed capacity
MAX_LIST_ITEMS = 1000  # values in one comma-separated flag (burst rates, seeds)
MAX_INSTANCES = 4096  # engines in one simulated cluster
MAX_BANDWIDTH_GBS = 1e6  # a KV link, GB/s (1 PB/s: far above any interconnect)
MAX_PROBE_REPEATS = 1000  # ppas profile: repeats of each probe shape
MAX_MODEL_DIM = 1 << 20  # make-tiny-model sizes (the parameter cap binds long before)
MAX_BOOTSTRAP = 100_000  # bootstrap resamples (each holds every paired trace)
MIN_LEVEL, MAX_LEVEL = 0.5, 0.9999  # confidence levels (t quantiles stay finite and useful)


def _num(text: str, cast: Callable[[str], float]) -> float:
    try:
        return cast(text)
    except (ValueError, OverflowError):
        return math.nan


def int_arg(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse ``type=``: an integer in ``[lo, hi]`` (``1e3`` accepted), else an
    argparse error that names the bound (one line, exit 2)."""

    def parse(text: str) -> int:
        v = _num(text.strip(), float)
        if not (math.isfinite(v) and v.is_integer() and lo <= v <= hi):
            raise argparse.ArgumentTypeError(f"must be an integer in [{lo}, {hi}], got {text!r}")
        return int(v) if abs(v) < 2**53 else int(text.strip())

    parse.__name__ = "int"
    return parse


def float_arg(lo: float, hi: float, *, lo_open: bool = False,
              allow_inf: bool = False) -> Callable[[str], float]:
    """An argparse ``type=``: a number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``;
    ``inf`` also when ``allow_inf``)."""

    def parse(text: str) -> float:
        v = _num(text.strip(), float)
        if allow_inf and v == math.inf:
            return v
        ok = math.isfinite(v) and (lo < v if lo_open else lo <= v) and v <= hi
        if not ok:
            left = "(" if lo_open else "["
            extra = " or inf" if allow_inf else ""
            raise argparse.ArgumentTypeError(
                f"must be a number in {left}{lo:g}, {hi:g}]{extra}, got {text!r}")
        return v

    parse.__name__ = "float"
    return parse
