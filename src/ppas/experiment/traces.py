"""An experiment's ``[workload]``: the traces, one per (load, seed), the same for every arm
(``ppas.experiment.spec``, the file)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from ppas.core import limits as lim
from ppas.core.config import (
    FieldError,
    check_at_most,
    check_fields,
    config_error,
    from_table,
    require,
)
from ppas.core.errors import PpasError
from ppas.workload import (
    TRACE_FORMATS,
    Trace,
    TraceTransform,
    gamma_trace,
    load_trace,
    parse_phases,
    parse_window,
    phase_trace,
)

WORKLOAD_KINDS = ("phases", "gamma", "trace")
#: The keys of one workload kind only.
_KIND_KEYS = {"phases": ("phases", "burst_rates"),
              "gamma": ("request_rates", "burstiness", "num_prompts"),
              "trace": ("file", "format", "block_size", "window", "windows", "time_scale",
                        "rate", "length_scale", "drop_longer_than", "loads",
                        "capacity_loads", "probe_prompt_tokens", "probe_requests")}
#: The capacity probe's defaults (``capacity_loads``; ``ppas.experiment.probe``).
PROBE_PROMPT_TOKENS = 1024
PROBE_REQUESTS = 4


def load_text(load: float) -> str:
    """A load as text (file names, tables): the shortest that ``float`` reads back as
    ``load`` (``4`` for 4.0, ``0.1234561``), so distinct loads never share one."""
    short = f"{load:g}"
    return short if float(short) == load else repr(load)


@dataclass(frozen=True)
class WorkloadTable:
    """``[workload]`` as written (None: not given); ``WorkloadSpec.parse`` resolves it."""

    kind: str = "phases"
    phases: str | None = None
    burst_rates: tuple[float, ...] | None = None
    request_rates: tuple[float, ...] | None = None
    burstiness: float | None = None
    num_prompts: Any = None  # an integer, or a list of them (one per request rate)
    file: str | None = None
    format: str | None = None  # the file's format and transformations (ppas.workload)
    block_size: int | None = None
    window: str | None = None
    windows: tuple[str, ...] | None = None  # one trace per window (they replace seeds)
    time_scale: float | None = None
    rate: float | None = None
    length_scale: float | None = None
    drop_longer_than: int | None = None
    loads: tuple[float, ...] | None = None  # rate multipliers of the trace file
    capacity_loads: tuple[float, ...] | None = None  # fractions of the probed capacity
    probe_prompt_tokens: int | None = None
    probe_requests: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    seeds: tuple[int, ...] | None = None  # None: (0,)
    warmup_requests: int = 1
    request_timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        check_fields(self, "kind", one_of=WORKLOAD_KINDS)
        for kind, keys in _KIND_KEYS.items():
            for key in keys:
                require(kind == self.kind or getattr(self, key) is None,
                        f"applies to kind = \"{kind}\" only (this workload is kind = "
                        f"\"{self.kind}\"); kinds: {', '.join(WORKLOAD_KINDS)}", key=key)
        seeds = self.seeds if self.seeds is not None else (0,)
        require(bool(seeds) and min(seeds) >= 0 and len(set(seeds)) == len(seeds),
                f"must be distinct integers >= 0, got {list(seeds)!r}", key="seeds")
        require(max(seeds) <= lim.MAX_SEED and len(seeds) <= lim.MAX_LIST_ITEMS,
                f"must be at most {lim.MAX_LIST_ITEMS} integers <= {lim.MAX_SEED}, got "
                f"{len(seeds)} up to {max(seeds)}", key="seeds")
        check_fields(self, "prompt_tokens", "output_tokens", at_least=1)
        check_at_most(self, lim.MAX_PROMPT_TOKENS, "prompt_tokens")
        check_at_most(self, lim.MAX_OUTPUT_TOKENS, "output_tokens")
        check_fields(self, "warmup_requests", at_least=0)
        check_at_most(self, lim.MAX_WARMUPS, "warmup_requests")
        check_fields(self, "request_timeout_s", "burstiness", above=0)
        check_at_most(self, lim.MAX_TIMEOUT_S, "request_timeout_s")
        b = self.burstiness
        require(b is None or lim.MIN_BURSTINESS <= b <= lim.MAX_BURSTINESS, f"must be in "
                f"[{lim.MIN_BURSTINESS:g}, {lim.MAX_BURSTINESS:g}], got {b}", key="burstiness")
        if self.kind == "trace":
            require(self.file is not None, "required with kind = \"trace\": a CSV/JSONL trace "
                    "file (ppas.workload)", key="file")
            for key in ("prompt_tokens", "output_tokens"):
                require(getattr(self, key) is None, "does not apply to kind = \"trace\" (the "
                        "file gives each request's lengths)", key=key)
            check_fields(self, "format", one_of=TRACE_FORMATS)
            check_fields(self, "block_size", at_least=1)
            loads = self.loads
            require(loads is None or (bool(loads) and min(loads) > 0
                                      and len(set(loads)) == len(loads)),
                    f"must be distinct rate multipliers > 0, got {loads!r}", key="loads")
            if self.window is not None:
                try:
                    parse_window(self.window)
                except PpasError as e:
                    raise FieldError("window", str(e)) from None
            self._check_windows()
            self._check_capacity()
            _ = self.transform
            return
        key = self.rates_key
        rates = getattr(self, key)
        require(bool(rates), f"must be a non-empty list of numbers > 0, got {rates!r}", key=key)
        require(min(rates) > 0 and len(set(rates)) == len(rates),
                f"must be distinct finite numbers > 0, got {list(rates)!r}", key=key)
        require(max(rates) <= lim.MAX_RATE and len(rates) <= lim.MAX_LIST_ITEMS,
                f"must be at most {lim.MAX_LIST_ITEMS} numbers <= {lim.MAX_RATE:g}, got "
                f"{len(rates)} up to {max(rates):g}", key=key)
        if self.kind == "phases":
            require(self.phases is not None and "{burst}" in self.phases,
                    "required: DURATION_S:RATE,... with {burst} where burst_rates go, e.g. "
                    "\"10:0.1,20:{burst},10:0.1\"", key="phases")
            assert self.phases is not None
            try:
                parse_phases(self.phases, rates[0])
            except PpasError as e:
                raise FieldError("phases", str(e)) from None
        v = self.num_prompts if self.num_prompts is not None else 100
        vals = v if isinstance(v, list) else [v]
        require(all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in vals)
                and bool(vals) and (not isinstance(v, list) or len(vals) == len(rates)),
                f"must be an integer >= 1 or a list of {len(rates)} of them (one per request "
                f"rate), got {v!r}", key="num_prompts")
        require(max(vals) <= lim.MAX_REQUESTS, f"must be <= {lim.MAX_REQUESTS} prompts per "
                f"trace, got {max(vals)}", key="num_prompts")

    def _check_windows(self) -> None:
        """``windows``: distinct START:DURATION slices, instead of ``window`` and ``seeds``
        (trace i replays window i, as seed i)."""
        ws = self.windows
        if ws is None:
            return
        require(self.window is None and self.seeds is None, "replaces window and seeds (run "
                "i replays window i, recorded as seed i); give windows alone", key="windows")
        require(bool(ws) and len(ws) <= lim.MAX_LIST_ITEMS and len(set(ws)) == len(ws),
                f"must be 1 to {lim.MAX_LIST_ITEMS} distinct \"START:DURATION\" strings "
                f"(seconds), got {list(ws)!r}", key="windows")
        for w in ws:
            try:
                parse_window(w)
            except PpasError as e:
                raise FieldError("windows", str(e)) from None

    def _check_capacity(self) -> None:
        """``capacity_loads``: fractions of the prefill capacity that a probe measures before
        the first run; exclusive with the other ways to set the arrival rate."""
        cl = self.capacity_loads
        if cl is None:
            for key in ("probe_prompt_tokens", "probe_requests"):
                require(getattr(self, key) is None, "applies with capacity_loads only (the "
                        "probe measures the capacity they are fractions of)", key=key)
            return
        for key in ("loads", "time_scale", "rate"):
            require(getattr(self, key) is None, "cannot be given with capacity_loads (both "
                    "set the arrival rate)", key=key)
        require(bool(cl) and min(cl) > 0 and max(cl) <= lim.MAX_CAPACITY_LOAD
                and len(set(cl)) == len(cl) and len(cl) <= lim.MAX_LIST_ITEMS
                and all(math.isfinite(x) for x in cl),
                f"must be 1 to {lim.MAX_LIST_ITEMS} distinct fractions of the probed prefill "
                f"capacity in (0, {lim.MAX_CAPACITY_LOAD:g}], e.g. [0.4, 0.9], got {cl!r}",
                key="capacity_loads")
        check_fields(self, "probe_prompt_tokens", "probe_requests", at_least=1)
        check_at_most(self, lim.MAX_PROMPT_TOKENS, "probe_prompt_tokens")
        check_at_most(self, lim.MAX_PROBE_REQUESTS, "probe_requests")

    @property
    def transform(self) -> TraceTransform:
        """The trace file's transformations (checked when built)."""
        return TraceTransform(None if self.window is None else parse_window(self.window),
                              self.time_scale, self.rate, self.length_scale,
                              self.drop_longer_than)

    @property
    def rates_key(self) -> str:
        return "burst_rates" if self.kind == "phases" else "request_rates"


@dataclass(frozen=True)
class Probe:
    """The capacity probe of ``capacity_loads``: ``requests`` prompts of ``prompt_tokens``
    tokens (1 output token), one at a time, on the first arm's server before its first run
    (``ppas.experiment.probe``)."""

    prompt_tokens: int = PROBE_PROMPT_TOKENS
    requests: int = PROBE_REQUESTS


@dataclass(frozen=True)
class WorkloadSpec:
    """The traces: one per (load, seed). ``loads`` are burst rates (phases), mean request
    rates (gamma), or for a trace file its rate multipliers (``loads = [1, 2]``: as
    transformed, and twice as fast; ``TraceTransform.at_load``), ``(0.0,)`` when not
    given (replayed as transformed), or with ``probe`` set (``capacity_loads``) fractions
    of the prefill capacity the probe measured (``capacity_tok_s``; ``time_scale_at``).
    With ``windows``, seed i replays window i of the file."""

    kind: str
    loads: tuple[float, ...]
    seeds: tuple[int, ...]
    prompt_tokens: int = 2000
    output_tokens: int = 16
    phases: str | None = None
    burstiness: float = 1.0
    #: Prompts per trace (gamma): one for every rate, or one per rate (``request_rates`` order).
    num_prompts: tuple[int, ...] = (100,)
    file: str | None = None
    file_format: str = "auto"
    block_size: int = 512
    transform: TraceTransform = TraceTransform()
    warmup_requests: int = 1
    request_timeout_s: float = 1800.0
    # Not in the repr, so a workload without them keeps the settings hash it had before
    # they existed (``settings_text``: a folder made then still resumes).
    windows: tuple[tuple[float, float], ...] = field(default=(), repr=False)
    probe: Probe | None = field(default=None, repr=False)
    #: The probed prefill capacity (prompt tokens/s); None until the probe ran.
    capacity_tok_s: float | None = field(default=None, repr=False)

    @staticmethod
    def parse(obj: object) -> WorkloadSpec:
        t = from_table(WorkloadTable, obj, "workload")
        windows = tuple(parse_window(w) for w in t.windows or ())
        seeds = tuple(range(len(windows))) if windows else t.seeds or (0,)
        common: dict[str, Any] = dict(
            seeds=seeds, prompt_tokens=t.prompt_tokens or 2000,
            output_tokens=t.output_tokens or 16, warmup_requests=t.warmup_requests,
            request_timeout_s=t.request_timeout_s)
        if t.kind == "trace":
            probe = None if t.capacity_loads is None else Probe(
                t.probe_prompt_tokens or PROBE_PROMPT_TOKENS,
                t.probe_requests or PROBE_REQUESTS)
            spec = WorkloadSpec("trace", t.capacity_loads or t.loads or (0.0,), file=t.file,
                                file_format=t.format or "auto", block_size=t.block_size or 512,
                                transform=t.transform, windows=windows, probe=probe, **common)
            for s in spec.seeds:
                _ = spec.base_trace(s)  # readable, non-empty
                if probe is None:
                    for load in spec.loads:
                        _ = spec.trace(load, s)
            return spec
        loads = getattr(t, t.rates_key)
        if t.kind == "phases":
            spec = WorkloadSpec("phases", loads, phases=t.phases, **common)
        else:
            n = t.num_prompts if t.num_prompts is not None else 100
            spec = WorkloadSpec("gamma", loads, burstiness=t.burstiness or 1.0,
                                num_prompts=tuple(n) if isinstance(n, list) else (n,),
                                **common)
        for load in spec.loads:
            for s in spec.seeds:
                if len(spec.trace(load, s)) == 0:
                    raise config_error("workload", t.rates_key, f"load {load:g} with seed {s} "
                                       "gives no requests; raise the rates or lengthen the "
                                       "phases")
        return spec

    def with_capacity(self, capacity_tok_s: float) -> WorkloadSpec:
        """This workload with the probed capacity: its traces can be built."""
        require(self.probe is not None, "only capacity_loads workloads take a capacity")
        require(math.isfinite(capacity_tok_s) and capacity_tok_s > 0,
                f"the capacity must be a number > 0 (tokens/s), got {capacity_tok_s!r}")
        return replace(self, capacity_tok_s=float(capacity_tok_s))

    @property
    def settings_text(self) -> str:
        """What was asked for, as the experiment's fingerprint holds it: the probe's
        measurement left out; ``windows`` and ``probe`` only when given."""
        extra = "" if not (self.windows or self.probe) else \
            f"; windows={self.windows!r}; probe={self.probe!r}"
        return repr(self) + extra

    def base_trace(self, seed: int) -> Trace:
        """Seed ``seed``'s requests with their lengths, before any rescaling of the arrivals
        by a load: its window (``windows``), length scale and filter; for a trace file."""
        return self._apply(self._windowed(seed), "")

    def time_scale_at(self, load: float, seed: int) -> float:
        """``capacity_loads``: the arrival-time factor that makes seed ``seed``'s trace offer
        ``load`` times the probed capacity on average (its prompt tokens over its duration)."""
        if self.capacity_tok_s is None:
            raise PpasError("capacity_loads: the traces need the probed capacity; it is "
                            "measured before the first run (probe.json in the results folder)")
        base = self.base_trace(seed)
        tokens = sum(r.prompt_tokens for r in base.requests)
        if base.duration_s <= 0:
            raise config_error("workload", "windows", f"seed {seed}: every request arrives at "
                               "the same instant (duration 0); a load cannot be set")
        return tokens / (base.duration_s * load * self.capacity_tok_s)

    def trace(self, load: float, seed: int) -> Trace:
        """The arrivals of one (load, seed): the same for every arm."""
        if self.kind == "phases":
            assert self.phases is not None
            return phase_trace(self.phases, seed, self.prompt_tokens, self.output_tokens,
                               burst=load)
        if self.kind == "gamma":
            return gamma_trace(load, self.prompts_at(load), seed, self.burstiness,
                               self.prompt_tokens, self.output_tokens)
        tf = self._windowed(seed)
        if self.probe is None:
            return self._apply(tf.at_load(load) if load else tf, "")
        return self._apply(replace(tf, time_scale=self.time_scale_at(load, seed)),
                           f"load {load_text(load)} of the probed prefill capacity "
                           f"{self.capacity_tok_s:.0f} tokens/s")

    def _windowed(self, seed: int) -> TraceTransform:
        """The file's transformations, with seed ``seed``'s window (``windows``)."""
        if not self.windows:
            return self.transform
        return replace(self.transform, window=self.windows[self.seeds.index(seed)])

    def _apply(self, tf: TraceTransform, note: str) -> Trace:
        assert self.file is not None
        try:
            tr = load_trace(self.file, self.file_format, self.block_size,
                            tf.window)  # the window while reading
        except PpasError as e:
            raise config_error("workload", "file", str(e)) from None
        tf = tf.without_window()
        try:
            tr = tf.apply(tr) if tf else tr
        except PpasError as e:
            raise config_error("workload", "", str(e)) from None
        if len(tr) == 0:
            raise config_error("workload", "file", f"{self.file!r} has no requests")
        return replace(tr, description=f"{tr.description}; {note}") if note else tr

    def prompts_at(self, load: float) -> int:
        """The number of prompts in a trace at request rate ``load`` (gamma)."""
        if len(self.num_prompts) == 1:
            return self.num_prompts[0]
        return self.num_prompts[self.loads.index(load)]

    def load_label(self, load: float) -> str:
        """The load in file names and tables (``load_text``: distinct loads never share one);
        a trace replayed as published is ``trace``, at a rate multiplier ``xM``, at a fraction
        F of the probed capacity ``capF``."""
        if self.kind == "trace":
            if self.probe is not None:
                return f"cap{load_text(load)}"
            return f"x{load_text(load)}" if load else "trace"
        return load_text(load)

    @property
    def load_name(self) -> str:
        """What a load is called in tables: ``load`` for fractions of the probed capacity."""
        if self.probe is not None:
            return "load"
        return {"phases": "burst", "gamma": "rate", "trace": "trace"}[self.kind]
