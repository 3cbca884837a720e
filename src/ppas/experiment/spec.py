"""The experiment file (TOML): frozen, validated dataclasses, checked whole before any run.

    name = "demo-cpu"                      # optional; default the file's stem
    out_dir = "out/demo-cpu"               # optional; default out/NAME
    [model]     path = "ORG/NAME" or a local folder; vocab_size (prompt ids < it)
    [engine]    dtype, max_model_len, max_num_seqs, tensor_parallel_size,
                gpu_memory_utilization, enable_prefix_caching, enforce_eager,
                startup_timeout_s, extra_args = [...], [engine.env] NAME = "value"
    [workload]  kind = "phases" (phases = "10:0.1,20:{burst}", burst_rates = [...])
                     | "gamma"  (request_rates = [...], burstiness, num_prompts = N or
                                 [N per request rate])
                     | "trace"  (file = "trace.jsonl", format, block_size, window,
                                 time_scale or rate, length_scale, drop_longer_than,
                                 loads = [rate multipliers, e.g. 1, 1.5, 2];
                                 or windows = ["START:DURATION", ...] instead of window and
                                 seeds: trace i replays window i; or capacity_loads =
                                 [fractions of the prefill capacity probed before the
                                 first run], probe_prompt_tokens, probe_requests)
                prompt_tokens, output_tokens, seeds = [...], warmup_requests (sent before
                the first run on each server start), request_timeout_s
    [[arms]]    name, and one of: policy = "ppas:..." (the ppas plugin) or
                [arms.stock] max_num_batched_tokens = N and any of ``arms.STOCK_ARGS``
                (stock vLLM, no plugin); optional cost_model = "fitted:auto" | "fitted:FILE"
                | "roofline", max_num_batched_tokens (plugin arms), baseline = true
    [run]       devices = ["0", "1"] (arms in parallel, one per GPU), server_startup_s,
                estimate_cost_model = "fitted:FILE" | "roofline", hardware, catalog_model,
                rounds = R (the seeds in R rounds, arms in ABBA order: ``Experiment.rounds``)
    [report]    level, n_boot, bootstrap_seed, slo = "ttft=2s,tpot=100ms" (optional: SLO
                attainment and goodput per arm and load; ``ppas.core.slo``; relative bounds
                such as ttft=5x need run.estimate_cost_model or an arm's fitted:FILE)

Every rule about what a valid file is lives here and in the modules of its sections
(``server_spec``: model and engine; ``traces``: workload; ``arms``): each table is a frozen
dataclass read by ``ppas.core.config.from_table`` and checked in its ``__post_init__``, so
every error is one line naming the key and what is allowed (``WHERE.KEY: PROBLEM``,
``PpasError``, exit 2). Every number has the bound ``ppas.core.limits`` gives it (as the
flags do); a ``fitted:FILE`` must load as a cost model; ``extra_args`` may not move the
server off 127.0.0.1 (``server_spec.OWN_FLAGS``); the name is one path component; the file
itself must be a regular file. Where the file's keys are not the spec's fields (``[model]``,
``[workload]``), a table class holds what was written and the spec's ``parse`` resolves it.
Relative paths are relative to the current directory. ``fitted:auto`` arms are fitted from
the step logs of the plugin arms without it ("calibration arms"), which therefore run first
(``Experiment.arm_order``).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ppas.core.config import (
    FieldError,
    check_at_most,
    check_fields,
    check_keys,
    config_error,
    from_table,
    require,
)
from ppas.core.errors import PpasError
from ppas.core.limits import (
    MAX_BOOTSTRAP,
    MAX_LEVEL,
    MAX_LIST_ITEMS,
    MAX_SEED,
    MAX_TIMEOUT_S,
    MIN_LEVEL,
)
from ppas.core.slo import SloSpec, parse_slo
from ppas.cost import make_cost_model
from ppas.cost.catalog import HARDWARE, MODELS
from ppas.experiment.arms import FITTED_AUTO, ArmSpec
from ppas.experiment.server_spec import EngineSpec, ModelSpec
from ppas.experiment.traces import WorkloadSpec

__all__ = ["FITTED_AUTO", "ArmSpec", "EngineSpec", "Experiment", "ModelSpec", "WorkloadSpec",
           "load_experiment", "parse_experiment"]


MAX_FILE_BYTES = 1 << 20  # an experiment file is a page of TOML


@dataclass(frozen=True)
class RunSettings:
    """How runs are scheduled and estimated (``[run]``'s keys)."""

    devices: tuple[str, ...] = ()  # non-empty: arms in parallel, one per device
    server_startup_s: float = 60.0  # for the time estimate
    estimate_cost_model: str | None = None  # fitted:FILE | roofline
    hardware: str | None = None
    catalog_model: str | None = None
    rounds: int = 1  # the seeds in this many rounds, arms in ABBA order (Experiment.rounds)

    def __post_init__(self) -> None:
        check_fields(self, "rounds", at_least=1)
        check_at_most(self, MAX_LIST_ITEMS, "rounds")
        require(self.rounds == 1 or not self.devices, "must be 1 with devices (arms run in "
                f"parallel there, so their order cannot drift), got {self.rounds}",
                key="rounds")
        require(len(set(self.devices)) == len(self.devices), "must be a list of distinct GPU "
                "ids (CUDA_VISIBLE_DEVICES values, e.g. [\"0\", \"1\"]), got "
                f"{list(self.devices)!r}", key="devices")
        check_fields(self, "server_startup_s", at_least=0)
        check_at_most(self, MAX_TIMEOUT_S, "server_startup_s")
        check_fields(self, "hardware", one_of=tuple(HARDWARE.names()))
        check_fields(self, "catalog_model", one_of=tuple(MODELS.names()))
        est = self.estimate_cost_model
        if est == "roofline":
            require(self.hardware is not None and self.catalog_model is not None,
                    f"roofline needs run.hardware ({', '.join(HARDWARE.names())}) and "
                    f"run.catalog_model ({', '.join(MODELS.names())})",
                    key="estimate_cost_model")
        elif est is not None:
            require(est.startswith("fitted:") and Path(est[7:]).is_file(),
                    f"must be roofline or fitted:FILE with an existing FILE, got {est!r}",
                    key="estimate_cost_model")
            try:
                make_cost_model(est)  # the file must be a fitted cost model
            except PpasError as e:
                raise FieldError("estimate_cost_model", str(e)) from None

    @staticmethod
    def parse(obj: object) -> RunSettings:
        t = check_keys(obj if obj is not None else {}, "run", RunSettings)
        dev = t.get("devices", [])
        if isinstance(dev, list):  # GPU ids may be written as integers
            t["devices"] = [str(d) if isinstance(d, int) and not isinstance(d, bool) else d
                            for d in dev]
        return from_table(RunSettings, t, "run")


@dataclass(frozen=True)
class ReportSettings:
    """``[report]``: the confidence level, the bootstrap's resamples and seed, and the SLOs
    attainment and goodput are measured against (``ppas.core.slo``'s text; None: none)."""

    level: float = 0.95
    n_boot: int = 10_000
    bootstrap_seed: int = 0
    slo: str | None = None

    @property
    def slo_spec(self) -> SloSpec | None:
        return parse_slo(self.slo)

    def __post_init__(self) -> None:
        try:
            parse_slo(self.slo)
        except PpasError as e:
            raise FieldError("slo", str(e)) from None
        require(0 < self.level < 1, f"must be in (0, 1), got {self.level}", key="level")
        require(MIN_LEVEL <= self.level <= MAX_LEVEL, f"must be in [{MIN_LEVEL:g}, "
                f"{MAX_LEVEL:g}], got {self.level}", key="level")
        check_fields(self, "n_boot", at_least=100)
        check_at_most(self, MAX_BOOTSTRAP, "n_boot")
        check_fields(self, "bootstrap_seed", at_least=0)
        check_at_most(self, MAX_SEED, "bootstrap_seed")


# ---------------------------------------------------------------- the whole file


@dataclass(frozen=True, kw_only=True)
class ExperimentFile:
    """The file's top level as written; each section is read by its spec's ``parse``."""

    name: str | None = None  # None: the file's stem
    description: str = ""
    out_dir: str | None = None  # None: out/NAME
    model: object
    engine: object = None
    workload: object
    arms: tuple[object, ...]
    run: object = None
    report: object = None

    def __post_init__(self) -> None:
        for key in ("name", "out_dir"):
            require(getattr(self, key) != "", "must be a non-empty string", key=key)
            require("\0" not in (getattr(self, key) or ""), "must not hold a NUL character",
                    key=key)
        name = self.name
        require(name is None or (name not in (".", "..") and "/" not in name), "must be a "
                f"name without / (out_dir defaults to out/NAME), not . or .., got {name!r}",
                key="name")
        require(bool(self.arms), "need at least one [[arms]] table", key="arms")


@dataclass(frozen=True)
class Experiment:
    name: str
    out_dir: str
    model: ModelSpec
    engine: EngineSpec
    workload: WorkloadSpec
    arms: tuple[ArmSpec, ...]
    run: RunSettings
    report: ReportSettings
    description: str = ""
    source: str = ""  # the TOML text, kept with the results

    def arm(self, name: str) -> ArmSpec:
        return next(a for a in self.arms if a.name == name)

    def arm_order(self) -> tuple[ArmSpec, ...]:
        """Run order: arms that ``fitted:auto`` does not need first (file order), then the
        ``fitted:auto`` arms (they are fitted from the calibration arms' step logs)."""
        return tuple([a for a in self.arms if not a.auto_fitted]
                     + [a for a in self.arms if a.auto_fitted])

    def cells(self) -> list[tuple[float, int]]:
        return [(load, seed) for load in self.workload.loads for seed in self.workload.seeds]

    def rounds(self) -> list[tuple[tuple[ArmSpec, ...], list[tuple[float, int]]]]:
        """The run order: ``run.rounds`` rounds, each (its arms in order, its cells). The
        seeds split into that many contiguous groups (a seed's loads in one round), and
        every arm runs a round's cells on one server start, in ``arm_order`` in even rounds
        and reversed in odd ones (ABBA), so that a host whose speed drifts over the
        experiment weighs on every arm alike: over two rounds a linear drift adds the same
        time to each arm's mean. Invariant: every cell is in exactly one round, each arm
        runs once per round; with one round it is ``arm_order`` on every cell. (A file
        with more rounds than seeds, or with rounds and a ``fitted:auto`` arm, is refused:
        ``parse_experiment``.)"""
        seeds = list(self.workload.seeds)
        n = min(self.run.rounds, len(seeds))
        order = self.arm_order()
        out = []
        for r in range(n):
            group = set(seeds[r * len(seeds) // n:(r + 1) * len(seeds) // n])
            cells = [(load, s) for load, s in self.cells() if s in group]
            out.append((order if r % 2 == 0 else tuple(reversed(order)), cells))
        return out

    def num_runs(self) -> int:
        return len(self.arms) * len(self.cells())

    def fingerprint(self) -> dict[str, Any]:
        """What must not change between a run and its ``--resume``: everything a run's
        measurement depends on. Which arms are baselines only shapes the report, so it may
        change (then ``--report`` compares against the new ones)."""
        return {"model": self.model.path,
                "engine": repr(self.engine), "workload": self.workload.settings_text,
                "arms": [repr(replace(a, baseline=False)) for a in self.arms]}

    def slo_cost_model(self) -> str | None:
        """The cost model relative SLOs (``ttft=5x``) are against: ``run.estimate_cost_model``,
        else the first arm's ``fitted:FILE``; None when there is neither."""
        if self.run.estimate_cost_model is not None:
            return self.run.estimate_cost_model
        return next((a.cost_model for a in self.arms
                     if a.cost_model is not None and not a.auto_fitted), None)

    def settings_hash(self) -> str:
        """The fingerprint's hash, recorded in every run file (``RunFile.settings``)."""
        text = json.dumps(self.fingerprint(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def parse_experiment(text: str, name: str, out_dir: str | None = None) -> Experiment:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PpasError(f"not valid TOML: {e}") from None
    f = from_table(ExperimentFile, doc)
    exp_name = f.name or name
    model = ModelSpec.parse(f.model)
    engine = EngineSpec.parse(f.engine)
    workload = WorkloadSpec.parse(f.workload)
    arms = tuple(ArmSpec.parse(a, i) for i, a in enumerate(f.arms))
    names = [a.name for a in arms]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise config_error("arms", "", f"arm name {dup!r} is used twice; names must be "
                           "distinct")
    if any(a.auto_fitted for a in arms) and not any(a.calibrates for a in arms):
        raise config_error("arms", "", f"cost_model = \"{FITTED_AUTO}\" needs at least one "
                           "plugin arm without it (its step log is what the model is fitted to)")
    for i, a in enumerate(arms):
        if a.max_num_batched_tokens is not None and engine.max_num_seqs > a.max_num_batched_tokens:
            raise config_error("arms", f"[{i}]", f"max_num_batched_tokens "
                               f"{a.max_num_batched_tokens} < engine.max_num_seqs "
                               f"{engine.max_num_seqs} (vLLM needs max_num_seqs <= "
                               "max_num_batched_tokens); lower engine.max_num_seqs")
    if workload.kind == "trace":
        need = max(r.prompt_tokens + r.output_tokens for s in workload.seeds
                   for r in workload.base_trace(s).requests)
    else:
        need = workload.prompt_tokens + workload.output_tokens
    for key, lim in (("engine.max_model_len", engine.max_model_len),
                     ("the model's max_position_embeddings", model.max_position_embeddings)):
        if lim is not None and need > lim:
            raise config_error("workload", "file" if workload.kind == "trace"
                               else "prompt_tokens", f"prompt + output tokens ({need}) "
                               f"exceed {key} ({lim})")
    run = RunSettings.parse(f.run)
    if workload.probe is not None and run.estimate_cost_model is None:
        raise config_error("run", "estimate_cost_model", "required with "
                           "workload.capacity_loads: the plan predicts the probe's capacity "
                           "with it")
    if workload.probe is not None and run.devices:
        raise config_error("run", "devices", "not with workload.capacity_loads: its probe "
                           "runs on the first arm's server before every other arm")
    if run.rounds > len(workload.seeds):
        raise config_error("run", "rounds", f"must be at most the number of seeds "
                           f"({len(workload.seeds)}): each round runs some seeds, got "
                           f"{run.rounds}")
    if run.rounds > 1 and any(a.auto_fitted for a in arms):
        raise config_error("run", "rounds", f"must be 1 with a cost_model = '{FITTED_AUTO}' "
                           "arm (it is fitted from every calibration arm's step log, so it "
                           f"runs after all of them), got {run.rounds}")
    report = from_table(ReportSettings, f.report if f.report is not None else {}, "report")
    out = out_dir or f.out_dir or f"out/{exp_name}"
    exp = Experiment(exp_name, out, model, engine, workload, arms, run, report,
                     f.description, text)
    slo = report.slo_spec
    if slo is not None and slo.relative and exp.slo_cost_model() is None:
        raise config_error("report", "slo", f"relative SLOs ({slo}) need a cost model for "
                           "each request's solo latency: set run.estimate_cost_model "
                           "(fitted:FILE, or roofline with run.hardware and run.catalog_model) "
                           "or an arm's cost_model = \"fitted:FILE\"; or give absolute bounds "
                           "(s, ms)")
    return exp


def load_experiment(path: str | Path, out_dir: str | None = None) -> Experiment:
    """Read and validate an experiment file; every problem is one PpasError line prefixed
    with the file name."""
    p = Path(path)
    try:
        if not stat.S_ISREG(os.stat(p).st_mode):
            raise PpasError(f"experiment file {str(p)!r} is not a regular file (a TOML file "
                            "is)")
        if os.stat(p).st_size > MAX_FILE_BYTES:
            raise PpasError(f"experiment file {str(p)!r} is larger than "
                            f"{MAX_FILE_BYTES >> 20} MiB; an experiment file is a short TOML "
                            "file")
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise PpasError(f"cannot read experiment file {str(p)!r}: "
                        f"{getattr(e, 'strerror', None) or e}") from None
    try:
        return parse_experiment(text, p.stem, out_dir)
    except PpasError as e:
        raise PpasError(f"{p}: {e}") from None
