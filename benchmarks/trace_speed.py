"""Simulator speed on real traces: CPU seconds per policy against the 10 s/policy/hour bar.

    .venv/bin/python benchmarks/trace_speed.py --azure ../shared/data/traces/azure-2023-code.csv
        --mooncake ../shared/data/traces/mooncake-synthetic.jsonl
        [--configs mbt:2048,mbt:8192,ppas,predictive,ordered] [--overload 3]
        [--mooncake-window START:DUR] [--hour-configs mbt:2048,mbt:8192,ppas,ordered]
        [--tile-s 3600] [--before DIR] [--run-limit CPU_S] [--split]
        [--enable-prefix-caching] [--json OUT]

Replays, on one simulated engine (``--hardware``/``--model``, default H100 / Qwen3-8B, the
model's context as max_model_len, as ``ppas simulate`` does), the first hour of the Azure
code trace (``--window 0:3600``) and the whole Mooncake trace (or ``--mooncake-window``
of it), each as published and ``--overload`` times faster (``--time-scale 1/3`` by
default: three times the rate), under each policy, one after another in this process.
Mooncake spans 17 minutes (a third of that at x3), so its per-hour figure is an
extrapolation; the row ``mooncake xN 1h tiled`` measures a real hour instead: the
overloaded trace repeated back to back (copy k shifted by k spans) and cut at 3600 s of
arrivals (``--tile-s``), under ``--hour-configs`` (``predictive`` is left out by default:
its every step projects the whole queue, which grows all hour; "" to skip the row).

``predictive`` on the Azure hour and the whole Mooncake file, as published and at x3:
``--configs predictive --hour-configs=`` (with ``--before DIR`` for a change of it;
docs/results/trace-speed.md).

Per run it prints the trace span (seconds of arrivals as replayed), the requests, the wall
and CPU seconds of ``simulate`` alone (the trace is read once, outside the timing), the
simulated trace-seconds per wall second, the wall seconds per hour of replayed trace beside
the issue's bar of 10 s, the same for CPU seconds, the mean E2E and a digest of the run
(every request's times and preemptions, the steps, the summary), so a fast run that
computes something else would show. A run that passes ``--run-limit`` CPU seconds
(default 900) is stopped and shown as such. Wall time depends on what else shares the
cores: the load average is printed with the table, and the bar ("on one core") is judged
on the CPU seconds, the time the one core spent on the run.

``--split``: also time each ``decide()`` call of the policy (CPU clock, from outside),
and each call of its chunk rules where it has them (``Policy.chunk_rule``: the budgets of
the steps the engine takes in chunk runs, ``decide`` not called): the column ``policy
s/h`` is the policy's share of ``cpu s/h`` (both kinds of call), the rest the engine's
(the timing adds about a microsecond a step to both).

``--before DIR``: also run the same cases, at the same time in a second process, on the
``ppas`` sources in ``DIR/src`` (e.g. ``git archive main src | tar -x -C /tmp/before``),
and print both side by side, with whether the two runs' digests are the same.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness import Table, fail, finish, parser, start, timed

from ppas.core.errors import PpasError
from ppas.cost.catalog import MAX_MODEL_LEN
from ppas.engine.setup import engine_for
from ppas.engine.simulator import EngineConfig, simulate
from ppas.policies.base import Policy
from ppas.workload import Trace, TraceTransform, load_trace

TARGET_S_PER_HOUR = 10.0
HOUR_S = 3600.0


def tiled_hour(trace: Trace, length_s: float = HOUR_S) -> Trace:
    """``trace`` repeated back to back (copy k arrives k spans later) and cut at one hour
    (``length_s``) of arrivals."""
    span = trace.duration_s
    copies = max(1, math.ceil(length_s / span))
    reqs = tuple(replace(r, arrival_s=r.arrival_s + k * span)
                 for k in range(copies) for r in trace.requests
                 if r.arrival_s + k * span < length_s)
    return Trace(reqs, min(length_s, copies * span),
                 f"{trace.description}; repeated {copies} times back to back, cut at "
                 f"{length_s:g} s")


def window(text: str) -> tuple[float, float]:
    """``START:DUR`` seconds."""
    try:
        start, dur = (float(x) for x in text.split(":"))
    except ValueError:
        fail("trace_speed.py", f"--mooncake-window must be START:DUR seconds, got {text!r}")
    if start < 0 or dur <= 0:
        fail("trace_speed.py", f"--mooncake-window needs START >= 0 and DUR > 0, got {text!r}")
    return start, dur


def cases(args: argparse.Namespace) -> list[tuple[str, Trace, list[str]]]:
    """(name, trace, configs) for each trace as published and overloaded, and the tiled
    hour of overloaded Mooncake."""
    out = []
    configs = [c for c in args.configs.split(",") if c]
    hour = [c for c in args.hour_configs.split(",") if c]
    mc_window = window(args.mooncake_window) if args.mooncake_window else None
    mc_name = "mooncake" if mc_window is None else (
        f"mooncake {mc_window[0]:g}:{mc_window[1]:g}")
    for name, path, win in (("azure-code 1h", args.azure, (0.0, 3600.0)),
                            (mc_name, args.mooncake, mc_window)):
        if not path:
            continue
        if not Path(path).is_file():
            fail("trace_speed.py", f"trace file {path!r} not found")
        base = load_trace(path, "auto", 512, win)  # the window while reading
        out.append((name, base, configs))
        fast = base
        if args.overload != 1:
            fast = TraceTransform(time_scale=1 / args.overload).apply(base)
            out.append((f"{name} x{args.overload:g}", fast, configs))
        if path == args.mooncake and hour:
            label = "1h" if args.tile_s == HOUR_S else f"{args.tile_s:g}s"
            out.append((f"{name} x{args.overload:g} {label} tiled",
                        tiled_hour(fast, args.tile_s), hour))
    return out


def time_rules(policy: Policy, acc: dict[str, float]) -> None:
    """``policy.chunk_rule`` (where the policy has its own) and the rules it returns
    timed on the CPU clock into ``acc["rule"]``, their calls counted in ``acc["rule_n"]``
    (the engine tests the policy's class for a rule, not the instance: it still sees
    one)."""
    if getattr(type(policy), "chunk_rule", None) is getattr(Policy, "chunk_rule", None):
        return  # (none, or sources from before chunk rules)
    make = policy.chunk_rule

    def chunk_rule(view: Any) -> Any:
        t0 = time.process_time()
        rule = make(view)
        acc["rule"] += time.process_time() - t0
        return None if rule is None else timed(rule, acc, "rule", time.process_time)

    policy.chunk_rule = chunk_rule  # type: ignore[method-assign]


class _Stopped(Exception):
    """A run passed ``--run-limit`` CPU seconds."""


def _stop(signum: int, frame: object) -> None:
    raise _Stopped


def digest(res: Any) -> str:
    """A digest of what a run computed: every request's times and preemptions, the steps,
    the preemptions and the summary."""
    h = hashlib.sha256()
    for r in res.requests:
        h.update(repr((r.request_id, r.arrival_time, r.first_scheduled_time,
                       r.first_token_time, r.last_token_time, r.finish_time,
                       r.num_preemptions, r.failed, r.num_output_tokens)).encode())
    h.update(repr((res.num_steps, res.num_preemptions,
                   sorted(res.summary().items()))).encode())
    return h.hexdigest()[:16]


def side_by_side(rows: list[dict[str, Any]], before: list[dict[str, Any]]) -> None:
    """The runs of this process (after) beside those on ``--before``'s sources."""
    old = {(b["trace"], b["config"]): b for b in before}
    t = Table(("trace", "<28"), ("config", "<11"), ("span s", ">7.0f"), ("requests", ">8d"),
              ("cpu s before", ">12"), ("cpu s after", ">11.2f"), ("cpu s/h before", ">14"),
              ("cpu s/h after", ">13.2f"), ("bar", ">4.0f"), ("", "<5"),
              ("wall s/h before", ">15"), ("wall s/h after", ">14.1f"), ("steps", ">7d"),
              ("mean E2E", ">9.3f"), ("same", "<4"))
    print("\nbefore (--before) and after (this tree), side by side:")
    t.print_header()
    for r in rows:
        b = old.get((r["trace"], r["config"]))

        def fig(key: str, spec: str, b: dict[str, Any] | None = b) -> str:
            if b is None:
                return "-"
            return (">" if b["stopped"] else "") + format(b[key], spec)

        same = ("-" if b is None or b["stopped"] or r["stopped"] else
                "yes" if b["digest"] == r["digest"] else "NO")
        t.print_row(r["trace"], r["config"], r["span_s"], r["requests"], fig("cpu_s", ".2f"),
                    r["cpu_s"], fig("cpu_s_per_hour", ".2f"), r["cpu_s_per_hour"],
                    TARGET_S_PER_HOUR,
                    "ok" if r["cpu_s_per_hour"] <= TARGET_S_PER_HOUR else "MISS",
                    fig("wall_s_per_hour", ".1f"), r["wall_s_per_hour"], r["steps"],
                    r["avg_latency"], same)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, hardware="h100-sxm-80gb", model="qwen3-8b")
    ap.add_argument("--azure", help="the Azure LLM inference code trace (CSV)")
    ap.add_argument("--mooncake", help="the Mooncake trace (JSONL)")
    ap.add_argument("--configs", default="mbt:2048,mbt:8192,ppas,predictive,ordered")
    ap.add_argument("--overload", type=float, default=3.0,
                    help="also replay each trace this many times faster (1: not)")
    ap.add_argument("--mooncake-window", metavar="START:DUR",
                    help="replay only these seconds of the Mooncake trace")
    ap.add_argument("--hour-configs", default="mbt:2048,mbt:8192,ppas,ordered",
                    help="configs for the tiled hour of overloaded Mooncake (\"\": none)")
    ap.add_argument("--tile-s", type=float, default=HOUR_S, metavar="SECONDS",
                    help="cut the tiled trace at this many seconds of arrivals (default 3600)")
    ap.add_argument("--before", metavar="DIR",
                    help="also run on the ppas sources in DIR/src, side by side")
    ap.add_argument("--run-limit", type=float, default=900.0, metavar="CPU_S",
                    help="stop a run past this many CPU seconds (default 900)")
    ap.add_argument("--enable-prefix-caching", action="store_true",
                    help="vLLM's automatic prefix caching on (the block pool with hashes; "
                         "vLLM V1's default), as ppas simulate's flag")
    ap.add_argument("--split", action="store_true",
                    help="also time the policy's decide() calls: its CPU s/h beside the run's")
    args = ap.parse_args(argv)
    if not (args.azure or args.mooncake):
        fail("trace_speed.py", "give --azure FILE and/or --mooncake FILE")
    if not 0 < args.overload <= 100:
        fail("trace_speed.py", f"--overload must be in (0, 100], got {args.overload:g}")
    if args.before and not (Path(args.before) / "src" / "ppas").is_dir():
        fail("trace_speed.py", f"--before {args.before!r}: no src/ppas in it")
    if not 0 < args.tile_s <= 86400:
        fail("trace_speed.py", f"--tile-s must be in (0, 86400], got {args.tile_s:g}")
    if not 0 < args.run_limit <= 86400:
        fail("trace_speed.py", f"--run-limit must be in (0, 86400], got {args.run_limit:g}")
    start(args, argv)
    child = None
    if args.before:  # the same cases on the other sources, in a second process, now
        rest = list(sys.argv[1:] if argv is None else argv)
        k = rest.index("--before") if "--before" in rest else None
        if k is not None:
            del rest[k:k + 2]
        rest = [a for a in rest if not a.startswith("--before=")]
        if "--json" in rest:
            k = rest.index("--json")
            del rest[k:k + 2]
        rest = [a for a in rest if not a.startswith("--json=")]
        out = tempfile.NamedTemporaryFile("w+", suffix=".json", delete=False)
        log = tempfile.NamedTemporaryFile("w+", suffix=".txt", delete=False)
        env = dict(os.environ, PYTHONPATH=str(Path(args.before).resolve() / "src"))
        child = (subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *rest,
                                   "--json", out.name], env=env, stdout=log,
                                  stderr=subprocess.STDOUT), out.name, log.name)
    try:
        traces = cases(args)
        setups = {c: engine_for(c, args.hardware, args.model)
                  for _, _, configs in traces for c in configs}
    except PpasError as e:
        fail("trace_speed.py", str(e))
    engine = EngineConfig(max_model_len=MAX_MODEL_LEN.get(args.model),
                          prefix_caching=args.enable_prefix_caching)
    print(f"{args.hardware} / {args.model}"
          f"{', prefix caching on' if args.enable_prefix_caching else ''}; bar: "
          f"{TARGET_S_PER_HOUR:g} s per policy per hour of trace on one core (CPU s/h)")
    t = Table(("trace", "<28"), ("config", "<11"), ("span s", ">7.0f"), ("requests", ">8d"),
              ("wall s", ">7.2f"), ("cpu s", ">7.2f"), ("sim s/wall s", ">12.0f"),
              ("wall s/h", ">8.2f"), ("cpu s/h", ">7.2f"),
              *((("policy s/h", ">10.2f"),) if args.split else ()),
              ("bar", ">4.0f"), ("", "<5"), ("mean E2E", ">9.3f"), ("digest", "<16"))
    t.print_header()
    rows = []
    for name, trace, configs in traces:
        for c in configs:
            s = setups[c]
            policy = engine_for(c, args.hardware, args.model).policy  # fresh state
            in_policy = {"decide": 0.0, "decide_n": 0.0, "rule": 0.0, "rule_n": 0.0}
            if args.split:  # decide() and chunk rules timed from outside, on the CPU clock
                policy.decide = timed(  # type: ignore[method-assign]
                    policy.decide, in_policy, "decide", time.process_time)
                time_rules(policy, in_policy)
            old = signal.signal(signal.SIGPROF, _stop)
            signal.setitimer(signal.ITIMER_PROF, args.run_limit)  # CPU seconds
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                res = simulate(trace, policy, s.cost_model, engine)
                stopped = False
            except _Stopped:
                res, stopped = None, True
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
                signal.signal(signal.SIGPROF, old)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            span = trace.duration_s
            per_hour = wall * HOUR_S / span
            cpu_per_hour = cpu * HOUR_S / span
            e2e = math.nan if res is None else float(res.summary()["avg_latency"])
            rows.append({"trace": name, "description": trace.description, "config": c,
                         "span_s": span, "requests": len(trace), "wall_s": wall, "cpu_s": cpu,
                         "sim_s_per_wall_s": span / wall, "wall_s_per_hour": per_hour,
                         "cpu_s_per_hour": cpu_per_hour,
                         "target_s_per_hour": TARGET_S_PER_HOUR, "stopped": stopped,
                         "steps": -1 if res is None else res.num_steps,
                         "preemptions": -1 if res is None else res.num_preemptions,
                         "failed": -1 if res is None else sum(1 for r in res.requests
                                                              if r.failed),
                         "avg_latency": e2e, "digest": "" if res is None else digest(res)})
            in_pol = in_policy["decide"] + in_policy["rule"]
            if args.split:
                rows[-1]["policy_cpu_s"] = in_pol
                rows[-1]["policy_calls"] = int(in_policy["decide_n"] + in_policy["rule_n"])
                rows[-1]["policy_cpu_s_per_hour"] = in_pol * HOUR_S / span
                rows[-1]["rule_cpu_s"] = in_policy["rule"]
                rows[-1]["rule_calls"] = int(in_policy["rule_n"])
            t.print_row(name, c, span, len(trace), wall, cpu, span / wall, per_hour,
                        cpu_per_hour,
                        *((in_pol * HOUR_S / span,) if args.split else ()),
                        TARGET_S_PER_HOUR,
                        "STOP" if stopped else
                        "ok" if cpu_per_hour <= TARGET_S_PER_HOUR else "MISS", e2e,
                        "" if res is None else rows[-1]["digest"])
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (wall > cpu when "
          "other processes share them; the bar is judged on CPU s/h: one core's time)")
    if child is None:
        finish(args, rows, argv)
        return 0
    proc, out_name, log_name = child
    rc = proc.wait()
    print(f"\n--before {args.before} (a second process, at the same time; exit {rc}):")
    print(Path(log_name).read_text(), end="")
    before = json.loads(Path(out_name).read_text())["results"] if rc == 0 else []
    side_by_side(rows, before)
    finish(args, {"after": rows, "before": before, "before_src": args.before}, argv)
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
