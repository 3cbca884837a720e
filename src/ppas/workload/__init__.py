"""Request traces: what a run replays, the same in the simulator and the live benchmark
(``ppas.live.client``), so a simulated run and a measured run compare request by request.

* ``requests``: ``RequestSpec``, ``Trace`` and SLO classes, the records every stage reads.
* ``phases``: the P-PAS paper's phase traces (piecewise Poisson, bit-identical).
* ``arrivals``: gamma, constant-rate and mixed arrivals; token-length distributions.
* ``prefixes``: traces whose prompts share prefixes (prefix groups, sessions).
* ``files``: trace files (ours, Azure, Mooncake, BurstGPT), one reader per format.
* ``transforms``: a replayed trace's window, rescaling, length scaling and filter.

Every name below is importable from ``ppas.workload``.
"""

from ppas.workload.arrivals import (
    LengthDist,
    constant_trace,
    gamma_trace,
    mixed_trace,
    parse_lengths,
)
from ppas.workload.files import TRACE_FORMATS, load_trace, read_trace, save_trace
from ppas.workload.phases import (
    PAPER_PHASES,
    Phase,
    parse_phases,
    phase_arrivals,
    phase_trace,
)
from ppas.workload.prefixes import prefix_group_trace, session_trace
from ppas.workload.requests import RequestSpec, Segments, SloClass, Trace, assign_slo_classes
from ppas.workload.transforms import TraceTransform, parse_window

__all__ = [
    "PAPER_PHASES", "TRACE_FORMATS", "TraceTransform", "parse_window",
    "LengthDist", "Phase", "RequestSpec", "Segments", "SloClass", "Trace",
    "assign_slo_classes", "constant_trace", "gamma_trace", "load_trace", "mixed_trace",
    "parse_lengths", "parse_phases", "phase_arrivals", "phase_trace", "prefix_group_trace",
    "read_trace", "save_trace", "session_trace",
]
