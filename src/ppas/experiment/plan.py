"""The plan of an experiment and its time estimate, from the simulator.

A run lasts about the simulated makespan of its trace (first arrival to last completion)
under the arm's policy, the first run on a server also its warm-up; each arm adds one
server start (``run.server_startup_s``). The simulator needs a cost model for that
(``run.estimate_cost_model``); without one a run is estimated by its arrival span only
(a lower bound). The progress bar scales the estimate by how finished work compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from ppas.core.decision import Knob
from ppas.cost import CostModel, make_cost_model
from ppas.engine.setup import engine_for
from ppas.engine.simulator import EngineConfig, simulate
from ppas.experiment.folder import RunKey
from ppas.experiment.probe import predicted_capacity, read_probe, resolved
from ppas.experiment.spec import ArmSpec, Experiment
from ppas.experiment.traces import load_text
from ppas.live.versions import installed_vllm_version
from ppas.policies import make_policy


@dataclass(frozen=True)
class Estimate:
    """The plan's time estimate, in seconds."""

    startup_s: float  # one server start
    runs: Mapping[RunKey, float]  # each run, its warm-up included
    model: str  # what the runs were estimated with
    #: ``capacity_loads``: the capacity the traces were built with, and where it came from
    capacity_tok_s: float | None = None
    capacity_source: str = ""

    def pending_servers(self, exp: Experiment, done: set[RunKey]) -> int:
        """Server starts left: one per arm and round with a run left in that round."""
        return sum(1 for order, cells in exp.rounds() for a in order
                   if any((a.name, load, s) not in done for load, s in cells))

    def remaining_s(self, exp: Experiment, done: set[RunKey]) -> float:
        """The runs left and their server starts."""
        return (sum(v for k, v in self.runs.items() if k not in done)
                + self.pending_servers(exp, done) * self.startup_s)


def estimate_cost_model(exp: Experiment) -> CostModel | None:
    """The cost model for estimates, or None."""
    spec = exp.run.estimate_cost_model
    if spec is None:
        return None
    return make_cost_model(spec, exp.run.hardware, exp.run.catalog_model,
                           exp.engine.tensor_parallel_size)


def _sim_policy(arm: ArmSpec, vllm_version: str | None) -> str:
    """The arm's policy; a stock arm's own knobs as far as the simulator models them
    (``ArmSpec.sim_policy``), else its ``max_num_batched_tokens`` alone."""
    spec, _ = arm.sim_policy(vllm_version)
    return spec if spec is not None else f"mbt:{arm.stock_dict()[Knob.MAX_NUM_BATCHED_TOKENS]}"


def planned(exp: Experiment) -> tuple[Experiment, str]:
    """``exp`` with the capacity its traces are built with (``capacity_loads``): the folder's
    probe, else the simulator's prediction of it (``run.estimate_cost_model``); and where it
    came from ("" when the workload needs none)."""
    exp = resolved(exp)
    w = exp.workload
    if w.probe is None:
        return exp, ""
    res = read_probe(exp)
    if res is not None:
        return exp, f"probed ({res.describe()})"
    cm = estimate_cost_model(exp)
    assert cm is not None  # parse_experiment requires one with capacity_loads
    cap = predicted_capacity(exp, cm)
    return (replace(exp, workload=w.with_capacity(cap)),
            f"predicted by the simulator with {exp.run.estimate_cost_model}; measured by the "
            "probe before the first run")


def estimate(exp: Experiment) -> Estimate:
    """Every run's estimate, and the server start's."""
    exp, source = planned(exp)
    cm = estimate_cost_model(exp)
    version = installed_vllm_version()  # the vLLM the runs will use
    w = exp.workload
    runs: dict[RunKey, float] = {}
    for load, seed in exp.cells():
        trace = w.trace(load, seed)
        span = trace.requests[-1].arrival_s - trace.requests[0].arrival_s
        for arm in exp.arms:
            est = span
            if cm is not None:
                spec = _sim_policy(arm, version)
                eng = engine_for(spec, exp.run.hardware, exp.run.catalog_model,
                                 cost_model=exp.run.estimate_cost_model,
                                 tp=exp.engine.tensor_parallel_size, config=EngineConfig(
                                     max_num_seqs=exp.engine.max_num_seqs,
                                     max_num_batched_tokens=arm.max_num_batched_tokens))
                res = simulate(trace, eng.policy, eng.cost_model, eng.config).summary()
                first = trace.requests[0]
                warm = simulate([type(first)(0.0, first.prompt_tokens, first.output_tokens)],
                                make_policy(spec), eng.cost_model, eng.config).summary()
                mk = float(res["makespan"]) if res.get("makespan") == res.get("makespan") \
                    else span
                first_run = (load, seed) == exp.cells()[0]
                est = first_run * w.warmup_requests * float(warm["avg_latency"]) + max(span, mk)
            runs[(arm.name, load, seed)] = est
    return Estimate(exp.run.server_startup_s, runs,
                    exp.run.estimate_cost_model or "none (arrival spans only: a lower bound)",
                    exp.workload.capacity_tok_s, source)


def plan_text(exp: Experiment, est: Estimate, done: set[RunKey]) -> str:
    """What ``--dry-run`` prints: the arms in run order, the traces, runs and time."""
    if est.capacity_tok_s is not None and exp.workload.capacity_tok_s is None:
        exp = replace(exp, workload=exp.workload.with_capacity(est.capacity_tok_s))
    w = exp.workload
    where = "local folder" if exp.model.local else "Hugging Face id"
    lines = [f"experiment {exp.name}: {exp.description}".rstrip(": "),
             f"  model {exp.model.path} ({where}), engine: {' '.join(exp.engine.args())}",
             f"  results in {exp.out_dir}/"]
    if w.kind == "phases":
        lines.append(f"  workload: phases {w.phases}, burst rates "
                     f"{', '.join(map(load_text, w.loads))}")
    elif w.kind == "gamma":
        n = "/".join(map(str, w.num_prompts))
        lines.append(f"  workload: gamma arrivals, {n} prompts, burstiness "
                     f"{w.burstiness:g}, request rates {', '.join(map(load_text, w.loads))}")
    elif w.probe is not None:
        lines.append(f"  workload: trace file {w.file}, loads {', '.join(map(load_text, w.loads))}"
                     f" of the prefill capacity {w.capacity_tok_s:.0f} prompt tokens/s "
                     f"({est.capacity_source}); a probe of {w.probe.requests} prompts of "
                     f"{w.probe.prompt_tokens} tokens")
    else:
        lines.append(f"  workload: trace file {w.file}" + (
            f", rate multipliers {', '.join(f'{x:g}' for x in w.loads)}" if w.loads[0] else ""))
    if w.windows:
        lines.append("  windows (seed i replays window i): "
                     + ", ".join(f"{a:g}:{d:g}" for a, d in w.windows))
    if w.kind != "trace":
        lines.append(f"  prompts {w.prompt_tokens} tokens, outputs {w.output_tokens} tokens")
    lines.append(f"  seeds {', '.join(map(str, w.seeds))}; {w.warmup_requests} warm-up "
                 "request(s) per server start")
    nreq = sum(len(w.trace(load, s)) for load, s in exp.cells())
    lines.append(f"  {len(exp.cells())} traces ({nreq} requests) x {len(exp.arms)} arms")
    lines.append("  arms, in run order:")
    for a in exp.arm_order():
        if a.plugin:
            what = f"ppas plugin, policy {a.policy}"
            if a.cost_model:
                what += f", cost model {a.cost_model}"
        else:
            what = "stock vLLM " + ", ".join(f"{k}={v}" for k, v in a.stock)
        mbt = a.max_num_batched_tokens
        tags = [t for t, on in (("baseline", a.baseline), ("calibration", a.calibrates)) if on]
        arm_runs = sum(est.runs[(a.name, load, s)] for load, s in exp.cells())
        lines.append(f"    {a.name}: {what}; MBT "
                     f"{mbt if mbt is not None else 'from the fitted model'}"
                     + (f" [{', '.join(tags)}]" if tags else "")
                     + f"; ~{_min(arm_runs + est.startup_s)}")
    if exp.run.devices:
        lines.append(f"  arms run in parallel on devices {', '.join(exp.run.devices)} "
                     "(one arm per device, CUDA_VISIBLE_DEVICES)")
    rounds = exp.rounds()
    if len(rounds) > 1:
        lines.append(f"  {len(rounds)} rounds, arms in ABBA order, a server start per arm "
                     "and round: " + "; ".join(
                         f"seeds {', '.join(str(s) for s in sorted({s for _, s in cells}))}: "
                         + ", ".join(a.name for a in order) for order, cells in rounds))
    total = exp.num_runs()
    left = [k for k in est.runs if k not in done]
    servers = est.pending_servers(exp, done)
    seconds = est.remaining_s(exp, done)
    if exp.run.devices:
        seconds /= min(len(exp.run.devices), max(1, servers))
    lines.append(f"{total} runs ({len(done)} already complete, {len(left)} to run), "
                 f"{servers} server start(s); estimated time {_min(seconds)} "
                 f"(simulator with cost model {est.model}; server start "
                 f"{est.startup_s:g} s each)")
    return "\n".join(lines)


def _min(s: float) -> str:
    return f"{s / 60:.1f} min" if s < 5400 else f"{s / 3600:.1f} h"
