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
                     | "trace"  (file = "trace.jsonl")
                prompt_tokens, output_tokens, seeds = [...], warmup_requests (sent before
                the first run on each server start), request_timeout_s
    [[arms]]    name, and one of: policy = "ppas:..." (the ppas plugin) or
                [arms.stock] max_num_batched_tokens = N, long_prefill_token_threshold = N
                (stock vLLM, no plugin); optional cost_model = "fitted:auto" | "fitted:FILE"
                | "roofline", max_num_batched_tokens (plugin arms), baseline = true
    [run]       devices = ["0", "1"] (arms in parallel, one per GPU), server_startup_s,
                estimate_cost_model = "fitted:FILE" | "roofline", hardware, catalog_model
    [report]    level, n_boot, bootstrap_seed

Every rule about what a valid file is lives here; every error is one line naming the key
and what is allowed (``PpasError``, exit 2). Relative paths are relative to the current
directory. ``fitted:auto`` arms are fitted from the step logs of the plugin arms without
it ("calibration arms"), which therefore run first (``Experiment.arm_order``).
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ppas.core.errors import PpasError
from ppas.workload import Trace, gamma_trace, load_trace, parse_phases, phase_trace

FITTED_AUTO = "fitted:auto"
DTYPES = ("auto", "float32", "float16", "bfloat16")
WORKLOAD_KINDS = ("phases", "gamma", "trace")
#: Stock vLLM scheduler arguments an arm may set (no plugin); each becomes --kebab-case N.
STOCK_ARGS = ("max_num_batched_tokens", "long_prefill_token_threshold",
              "max_num_partial_prefills", "max_long_partial_prefills")
#: The stock arguments the simulator models, as parameters of the ``vllm:`` policy (stock
#: vLLM's own knobs, ``ppas.policies.vllm_stock``); an arm setting any other STOCK_ARGS
#: key gets no prediction.
STOCK_POLICY_PARAMS = {"max_num_batched_tokens": "mbt",
                       "long_prefill_token_threshold": "long_prefill_token_threshold"}
SECTIONS = ("name", "description", "out_dir", "model", "engine", "workload", "arms", "run",
            "report")
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_ARM_NAME = re.compile(r"^[\w.:,=+-]+$")


def _err(where: str, msg: str) -> PpasError:
    return PpasError(f"{where}: {msg}")


def _k(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _table(obj: Any, where: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise _err(where, f"must be a table with keys {', '.join(allowed)}")
    bad = [k for k in obj if k not in allowed]
    if bad:
        raise _err(_k(where, bad[0]),
                   f"unknown key; allowed: {', '.join(allowed)}")
    return obj


def _int(t: Mapping[str, Any], key: str, where: str, default: int | None, lo: int = 0,
         hi: int | None = None) -> int | None:
    v = t.get(key, default)
    rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
        raise _err(_k(where, key), f"must be an integer {rng}, got {v!r}")
    return v


def _req_int(t: Mapping[str, Any], key: str, where: str, default: int, lo: int = 0) -> int:
    v = _int(t, key, where, default, lo)
    assert v is not None
    return v


def _float(t: Mapping[str, Any], key: str, where: str, default: float | None,
           lo: float = 0.0, strict: bool = True) -> float | None:
    v = t.get(key, default)
    if v is None:
        return None
    ok = (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
          and (v > lo if strict else v >= lo))
    if not ok:
        raise _err(_k(where, key), f"must be a number {'>' if strict else '>='} {lo:g}, "
                   f"got {v!r}")
    return float(v)


def _str(t: Mapping[str, Any], key: str, where: str, default: str | None,
         choices: tuple[str, ...] | None = None) -> str | None:
    v = t.get(key, default)
    if v is None:
        return None
    if not isinstance(v, str) or not v.strip() or (choices is not None and v not in choices):
        allowed = f"one of {', '.join(choices)}" if choices else "a non-empty string"
        raise _err(_k(where, key), f"must be {allowed}, got {v!r}")
    return v.strip()


def _bool(t: Mapping[str, Any], key: str, where: str, default: bool | None) -> bool | None:
    v = t.get(key, default)
    if v is not None and not isinstance(v, bool):
        raise _err(_k(where, key), f"must be true or false, got {v!r}")
    return v


def _list(t: Mapping[str, Any], key: str, where: str, kind: str) -> list[Any]:
    v = t.get(key)
    if not isinstance(v, list) or not v:
        raise _err(_k(where, key), f"must be a non-empty list of {kind}, got {v!r}")
    return v


def _num_prompts(t: Mapping[str, Any], num_rates: int) -> tuple[int, ...]:
    """``num_prompts``: one integer >= 1, or a list of them, one per request rate."""
    v = t.get("num_prompts", 100)
    vals = v if isinstance(v, list) else [v]
    ok = all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in vals)
    if not ok or not vals or (isinstance(v, list) and len(vals) != num_rates):
        raise _err("workload.num_prompts", "must be an integer >= 1 or a list of "
                   f"{num_rates} of them (one per request rate), got {v!r}")
    return tuple(vals)


# ---------------------------------------------------------------- sections


@dataclass(frozen=True)
class ModelSpec:
    """``path``: a local folder (with config.json) or a Hugging Face id ``ORG/NAME``
    (downloaded by vLLM on the machine that runs the experiment)."""

    path: str
    vocab_size: int
    local: bool
    max_position_embeddings: int | None = None

    @staticmethod
    def parse(obj: Any) -> ModelSpec:
        t = _table(obj, "model", ("path", "vocab_size"))
        path = _str(t, "path", "model", None)
        if path is None:
            raise _err("model.path", "required: a local model folder or a Hugging Face id "
                       "ORG/NAME")
        vocab = _int(t, "vocab_size", "model", None, lo=2)
        p = Path(path).expanduser()
        if p.is_dir():
            cfg_path = p / "config.json"
            try:
                cfg = json.loads(cfg_path.read_text())
                file_vocab = int(cfg["vocab_size"])
                ctx = cfg.get("max_position_embeddings")
            except (OSError, ValueError, KeyError, TypeError):
                raise _err("model.path", f"{path!r} has no readable config.json with "
                           "vocab_size (a Hugging Face model folder)") from None
            if vocab is not None and vocab > file_vocab:
                raise _err("model.vocab_size", f"must be <= the model's vocab_size "
                           f"{file_vocab}, got {vocab}")
            return ModelSpec(str(p), vocab or file_vocab, True,
                             int(ctx) if isinstance(ctx, int) else None)
        if path.startswith((".", "/", "~")) or not _HF_ID.match(path):
            raise _err("model.path", f"no model folder {path!r} (and not a Hugging Face id "
                       "ORG/NAME); for the demo run `make demo` or `ppas make-tiny-model`")
        return ModelSpec(path, vocab or 32000, False)


@dataclass(frozen=True)
class EngineSpec:
    """Engine arguments shared by every arm (``vllm serve`` flags)."""

    dtype: str | None = None  # None: ppas.live.server's default (float32 on CPU)
    max_model_len: int | None = None
    max_num_seqs: int = 256
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool | None = None
    enforce_eager: bool | None = None
    startup_timeout_s: float = 900.0
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    KEYS = ("dtype", "max_model_len", "max_num_seqs", "tensor_parallel_size",
            "gpu_memory_utilization", "enable_prefix_caching", "enforce_eager",
            "startup_timeout_s", "extra_args", "env")

    @staticmethod
    def parse(obj: Any) -> EngineSpec:
        w = "engine"
        t = _table(obj if obj is not None else {}, w, EngineSpec.KEYS)
        gmu = _float(t, "gpu_memory_utilization", w, None)
        if gmu is not None and gmu > 1:
            raise _err("engine.gpu_memory_utilization", f"must be in (0, 1], got {gmu}")
        extra = t.get("extra_args", [])
        if not isinstance(extra, list) or not all(isinstance(a, str) and a for a in extra):
            raise _err("engine.extra_args", f"must be a list of strings (vllm serve flags), "
                       f"got {extra!r}")
        env = t.get("env", {})
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k)
                and isinstance(v, str | int | float) and not isinstance(v, bool)
                for k, v in env.items()):
            raise _err("engine.env", "must be a table NAME = \"value\" of environment "
                       f"variables, got {env!r}")
        return EngineSpec(
            dtype=_str(t, "dtype", w, None, DTYPES),
            max_model_len=_int(t, "max_model_len", w, None, lo=1),
            max_num_seqs=_req_int(t, "max_num_seqs", w, 256, lo=1),
            tensor_parallel_size=_req_int(t, "tensor_parallel_size", w, 1, lo=1),
            gpu_memory_utilization=gmu,
            enable_prefix_caching=_bool(t, "enable_prefix_caching", w, None),
            enforce_eager=_bool(t, "enforce_eager", w, None),
            startup_timeout_s=_float(t, "startup_timeout_s", w, 900.0) or 900.0,
            extra_args=tuple(extra),
            env=tuple((k, str(v)) for k, v in env.items()),
        )

    def args(self) -> list[str]:
        """The shared ``vllm serve`` flags (after ``ppas.live.server``'s CPU defaults: later
        flags win in vLLM's argument parser)."""
        a = ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.dtype is not None:
            a += ["--dtype", self.dtype]
        if self.max_model_len is not None:
            a += ["--max-model-len", str(self.max_model_len)]
        if self.gpu_memory_utilization is not None:
            a += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.enable_prefix_caching is not None:
            a.append("--enable-prefix-caching" if self.enable_prefix_caching
                     else "--no-enable-prefix-caching")
        if self.enforce_eager:
            a.append("--enforce-eager")
        return a + list(self.extra_args)


@dataclass(frozen=True)
class WorkloadSpec:
    """The traces: one per (load, seed). ``loads`` are burst rates (phases), mean request
    rates (gamma) or ``(0.0,)`` for a trace file (replayed as recorded)."""

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
    warmup_requests: int = 1
    request_timeout_s: float = 1800.0

    KEYS = ("kind", "phases", "burst_rates", "request_rates", "burstiness", "num_prompts",
            "file", "prompt_tokens", "output_tokens", "seeds", "warmup_requests",
            "request_timeout_s")

    @staticmethod
    def parse(obj: Any) -> WorkloadSpec:
        w = "workload"
        t = _table(obj, w, WorkloadSpec.KEYS)
        kind = _str(t, "kind", w, "phases", WORKLOAD_KINDS) or "phases"
        own = {"phases": ("phases", "burst_rates"),
               "gamma": ("request_rates", "burstiness", "num_prompts"),
               "trace": ("file",)}
        for k, keys in own.items():
            for key in keys:
                if k != kind and key in t:
                    raise _err(f"workload.{key}", f"applies to kind = \"{k}\" only (this "
                               f"workload is kind = \"{kind}\"); kinds: "
                               + ", ".join(WORKLOAD_KINDS))
        seeds = _list(t, "seeds", w, "integers >= 0") if "seeds" in t else [0]
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds) \
                or len(set(seeds)) != len(seeds):
            raise _err("workload.seeds", f"must be distinct integers >= 0, got {seeds!r}")
        pt = _req_int(t, "prompt_tokens", w, 2000, lo=1)
        ot = _req_int(t, "output_tokens", w, 16, lo=1)
        common: dict[str, Any] = dict(
            seeds=tuple(seeds), prompt_tokens=pt, output_tokens=ot,
            warmup_requests=_req_int(t, "warmup_requests", w, 1, lo=0),
            request_timeout_s=_float(t, "request_timeout_s", w, 1800.0) or 1800.0)
        if kind == "trace":
            f = _str(t, "file", w, None)
            if f is None:
                raise _err("workload.file", "required with kind = \"trace\": a CSV/JSONL "
                           "trace file (ppas.workload)")
            for key in ("prompt_tokens", "output_tokens"):
                if key in t:
                    raise _err(f"workload.{key}", "does not apply to kind = \"trace\" (the "
                               "file gives each request's lengths)")
            spec = WorkloadSpec("trace", (0.0,), file=f, **common)
            _ = spec.trace(0.0, seeds[0])  # readable, non-empty
            return spec
        key = "burst_rates" if kind == "phases" else "request_rates"
        loads = _list(t, key, w, "numbers > 0")
        if not all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
                   and x > 0 for x in loads) or len(set(loads)) != len(loads):
            raise _err(f"workload.{key}", f"must be distinct finite numbers > 0, got {loads!r}")
        if kind == "phases":
            phases = _str(t, "phases", w, None)
            if phases is None or "{burst}" not in phases:
                raise _err("workload.phases", "required: DURATION_S:RATE,... with {burst} "
                           "where burst_rates go, e.g. \"10:0.1,20:{burst},10:0.1\"")
            try:
                parse_phases(phases, float(loads[0]))
            except PpasError as e:
                raise _err("workload.phases", str(e)) from None
            spec = WorkloadSpec("phases", tuple(float(x) for x in loads), phases=phases,
                                **common)
        else:
            spec = WorkloadSpec(
                "gamma", tuple(float(x) for x in loads),
                burstiness=_float(t, "burstiness", w, 1.0) or 1.0,
                num_prompts=_num_prompts(t, len(loads)), **common)
        for load in spec.loads:
            for s in spec.seeds:
                if len(spec.trace(load, s)) == 0:
                    raise _err(f"workload.{key}", f"load {load:g} with seed {s} gives no "
                               "requests; raise the rates or lengthen the phases")
        return spec

    def trace(self, load: float, seed: int) -> Trace:
        """The arrivals of one (load, seed): the same for every arm."""
        if self.kind == "phases":
            assert self.phases is not None
            return phase_trace(self.phases, seed, self.prompt_tokens, self.output_tokens,
                               burst=load)
        if self.kind == "gamma":
            return gamma_trace(load, self.prompts_at(load), seed, self.burstiness,
                               self.prompt_tokens, self.output_tokens)
        assert self.file is not None
        try:
            tr = load_trace(self.file)
        except PpasError as e:
            raise _err("workload.file", str(e)) from None
        if len(tr) == 0:
            raise _err("workload.file", f"{self.file!r} has no requests")
        return tr

    def prompts_at(self, load: float) -> int:
        """The number of prompts in a trace at request rate ``load`` (gamma)."""
        if len(self.num_prompts) == 1:
            return self.num_prompts[0]
        return self.num_prompts[self.loads.index(load)]

    def load_label(self, load: float) -> str:
        return "trace" if self.kind == "trace" else f"{load:g}"

    @property
    def load_name(self) -> str:
        return {"phases": "burst", "gamma": "rate", "trace": "trace"}[self.kind]


@dataclass(frozen=True)
class ArmSpec:
    """One server configuration: the ppas plugin with ``policy``, or stock vLLM with
    ``stock`` scheduler arguments. ``baseline`` arms are what improvements are relative to."""

    name: str
    policy: str | None = None
    stock: tuple[tuple[str, int], ...] = ()
    cost_model: str | None = None
    max_num_batched_tokens: int | None = None  # None: the policy's own (after binding)
    baseline: bool = False

    KEYS = ("name", "policy", "stock", "cost_model", "max_num_batched_tokens", "baseline")

    @property
    def plugin(self) -> bool:
        return self.policy is not None

    @property
    def auto_fitted(self) -> bool:
        return self.cost_model == FITTED_AUTO

    @property
    def calibrates(self) -> bool:
        """Its step log feeds ``fitted:auto``: a plugin arm that does not need the fit."""
        return self.plugin and not self.auto_fitted

    def stock_dict(self) -> dict[str, int]:
        return dict(self.stock)

    def sim_policy(self, vllm_version: str | None = None) -> tuple[str | None, str]:
        """(policy string the simulator runs for this arm, or None; why not). A stock arm
        runs as the ``vllm:`` policy of the release line of ``vllm_version`` (the vLLM
        the runs used; ``ppas.live.versions.simulated_line``)."""
        from ppas.live.versions import simulated_line

        if self.policy is not None:
            return self.policy, ""
        s = self.stock_dict()
        other = [k for k in s if k not in STOCK_POLICY_PARAMS]
        if other:
            return None, (f"stock vLLM {', '.join(other)} is not modelled by the simulator, "
                          f"which models {', '.join(STOCK_POLICY_PARAMS)}")
        args = [f"{STOCK_POLICY_PARAMS[k]}={v}" for k, v in s.items()]
        return f"vllm:{','.join(args)},version={simulated_line(vllm_version)}", ""

    @staticmethod
    def parse(obj: Any, i: int) -> ArmSpec:
        from ppas.policies import make_policy

        w = f"arms[{i}]"
        t = _table(obj, w, ArmSpec.KEYS)
        name = _str(t, "name", w, None)
        if name is None or not _ARM_NAME.match(name):
            raise _err(f"{w}.name", f"required: letters, digits and _.:,=+- only, got "
                       f"{t.get('name')!r}")
        policy = _str(t, "policy", w, None)
        stock = t.get("stock")
        if (policy is None) == (stock is None):
            raise _err(w, "give exactly one of policy = \"NAME:...\" (the ppas plugin) or "
                       "[arms.stock] (stock vLLM scheduler arguments)")
        cost = _str(t, "cost_model", w, None)
        mbt = _int(t, "max_num_batched_tokens", w, None, lo=1)
        base = bool(_bool(t, "baseline", w, False))
        if policy is not None:
            try:
                pol = make_policy(policy)
            except PpasError as e:
                raise _err(f"{w}.policy", str(e)) from None
            if cost is not None:
                if cost != FITTED_AUTO and cost != "roofline" and not (
                        cost.startswith("fitted:") and len(cost) > 7):
                    raise _err(f"{w}.cost_model", f"must be {FITTED_AUTO}, fitted:FILE or "
                               f"roofline, got {cost!r}")
                if cost.startswith("fitted:") and cost != FITTED_AUTO \
                        and not Path(cost[7:]).is_file():
                    raise _err(f"{w}.cost_model", f"no file {cost[7:]!r}")
                if cost == "roofline":
                    raise _err(f"{w}.cost_model", "roofline needs a catalog model and GPU; "
                               f"use {FITTED_AUTO} or fitted:FILE on a live engine")
            if mbt is None and cost is None:
                mbt = pol.max_num_batched_tokens
            return ArmSpec(name, policy, (), cost, mbt, base)
        st = _table(stock, f"{w}.stock", STOCK_ARGS)
        vals: list[tuple[str, int]] = []
        for k in STOCK_ARGS:
            v = _int(st, k, f"{w}.stock", None, lo=1)
            if v is not None:
                vals.append((k, v))
        if "max_num_batched_tokens" not in st:
            raise _err(f"{w}.stock.max_num_batched_tokens", "required for a stock arm")
        for k in ("cost_model", "max_num_batched_tokens"):
            if k in t:
                raise _err(f"{w}.{k}", "applies to plugin arms (policy = ...) only; a stock "
                           "arm sets [arms.stock] max_num_batched_tokens")
        return ArmSpec(name, None, tuple(vals), None, dict(vals)["max_num_batched_tokens"],
                       base)


@dataclass(frozen=True)
class RunSettings:
    """How runs are scheduled and estimated."""

    devices: tuple[str, ...] = ()  # non-empty: arms in parallel, one per device
    server_startup_s: float = 60.0  # for the time estimate
    estimate_cost_model: str | None = None  # fitted:FILE | roofline
    hardware: str | None = None
    catalog_model: str | None = None

    KEYS = ("devices", "server_startup_s", "estimate_cost_model", "hardware", "catalog_model")

    @staticmethod
    def parse(obj: Any) -> RunSettings:
        from ppas.cost.catalog import HARDWARE, MODELS

        w = "run"
        t = _table(obj if obj is not None else {}, w, RunSettings.KEYS)
        dev = t.get("devices", [])
        if not isinstance(dev, list) or not all(isinstance(d, str | int) and
                                                not isinstance(d, bool) for d in dev) \
                or len(set(map(str, dev))) != len(dev):
            raise _err("run.devices", f"must be a list of distinct GPU ids (CUDA_VISIBLE_"
                       f"DEVICES values, e.g. [\"0\", \"1\"]), got {dev!r}")
        est = _str(t, "estimate_cost_model", w, None)
        hw = _str(t, "hardware", w, None, tuple(HARDWARE.names()))
        cm = _str(t, "catalog_model", w, None, tuple(MODELS.names()))
        if est is not None:
            if est == "roofline":
                if hw is None or cm is None:
                    raise _err("run.estimate_cost_model", "roofline needs run.hardware ("
                               f"{', '.join(HARDWARE.names())}) and run.catalog_model ("
                               f"{', '.join(MODELS.names())})")
            elif not (est.startswith("fitted:") and Path(est[7:]).is_file()):
                raise _err("run.estimate_cost_model", f"must be roofline or fitted:FILE with "
                           f"an existing FILE, got {est!r}")
        return RunSettings(tuple(str(d) for d in dev),
                           _float(t, "server_startup_s", w, 60.0, strict=False) or 0.0,
                           est, hw, cm)


@dataclass(frozen=True)
class ReportSettings:
    level: float = 0.95
    n_boot: int = 10_000
    bootstrap_seed: int = 0

    @staticmethod
    def parse(obj: Any) -> ReportSettings:
        w = "report"
        t = _table(obj if obj is not None else {}, w, ("level", "n_boot", "bootstrap_seed"))
        level = _float(t, "level", w, 0.95) or 0.95
        if not level < 1:
            raise _err("report.level", f"must be in (0, 1), got {level}")
        return ReportSettings(level, _req_int(t, "n_boot", w, 10_000, lo=100),
                              _req_int(t, "bootstrap_seed", w, 0, lo=0))


# ---------------------------------------------------------------- the whole file


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

    def num_runs(self) -> int:
        return len(self.arms) * len(self.cells())

    def fingerprint(self) -> dict[str, Any]:
        """What must not change between a run and its ``--resume``: everything a run's
        measurement depends on. Which arms are baselines only shapes the report, so it may
        change (then ``--report`` compares against the new ones)."""
        return {"model": self.model.path,
                "engine": repr(self.engine), "workload": repr(self.workload),
                "arms": [repr(replace(a, baseline=False)) for a in self.arms]}


def parse_experiment(text: str, name: str, out_dir: str | None = None) -> Experiment:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PpasError(f"not valid TOML: {e}") from None
    _table(doc, "", SECTIONS)
    for sec in ("model", "workload", "arms"):
        if sec not in doc:
            raise _err(sec, "required section missing; sections: " + ", ".join(SECTIONS[3:]))
    exp_name = _str(doc, "name", "", name) or name
    model = ModelSpec.parse(doc["model"])
    engine = EngineSpec.parse(doc.get("engine"))
    workload = WorkloadSpec.parse(doc["workload"])
    arms_raw = doc["arms"]
    if not isinstance(arms_raw, list) or not arms_raw:
        raise _err("arms", "need at least one [[arms]] table")
    arms = tuple(ArmSpec.parse(a, i) for i, a in enumerate(arms_raw))
    names = [a.name for a in arms]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise _err("arms", f"arm name {dup!r} is used twice; names must be distinct")
    if any(a.auto_fitted for a in arms) and not any(a.calibrates for a in arms):
        raise _err("arms", f"cost_model = \"{FITTED_AUTO}\" needs at least one plugin arm "
                   "without it (its step log is what the model is fitted to)")
    for i, a in enumerate(arms):
        if a.max_num_batched_tokens is not None and engine.max_num_seqs > a.max_num_batched_tokens:
            raise _err(f"arms[{i}]", f"max_num_batched_tokens {a.max_num_batched_tokens} < "
                       f"engine.max_num_seqs {engine.max_num_seqs} (vLLM needs "
                       "max_num_seqs <= max_num_batched_tokens); lower engine.max_num_seqs")
    if workload.kind != "trace":
        need = workload.prompt_tokens + workload.output_tokens
        for key, lim in (("engine.max_model_len", engine.max_model_len),
                         ("the model's max_position_embeddings", model.max_position_embeddings)):
            if lim is not None and need > lim:
                raise _err("workload.prompt_tokens", f"prompt + output tokens ({need}) exceed "
                           f"{key} ({lim})")
    run = RunSettings.parse(doc.get("run"))
    report = ReportSettings.parse(doc.get("report"))
    out = out_dir or _str(doc, "out_dir", "", None) or f"out/{exp_name}"
    desc = _str(doc, "description", "", None) or ""
    return Experiment(exp_name, out, model, engine, workload, arms, run, report, desc, text)


def load_experiment(path: str | Path, out_dir: str | None = None) -> Experiment:
    """Read and validate an experiment file; every problem is one PpasError line prefixed
    with the file name."""
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise PpasError(f"cannot read experiment file {str(p)!r}: "
                        f"{getattr(e, 'strerror', None) or e}") from None
    try:
        return parse_experiment(text, p.stem, out_dir)
    except PpasError as e:
        raise PpasError(f"{p}: {e}") from None
