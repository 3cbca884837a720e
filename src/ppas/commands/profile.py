"""``ppas profile --base-url URL --model M --step-log PATH -o COST.json``: send the designed
probe workload (``ppas.calibrate.profile``) to a live server running the ppas plugin with
that step log, then fit a cost model to the steps it logged (use it as
``--cost-model fitted:COST.json``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ppas.commands.common import ints
from ppas.core.errors import PpasError
from ppas.core.limits import (
    MAX_KV_TOKENS,
    MAX_OUTPUT_TOKENS,
    MAX_PROBE_REPEATS,
    MAX_SEED,
    MAX_TIMEOUT_S,
    MAX_VOCAB,
    float_arg,
    int_arg,
)
from ppas.core.outputs import check_output_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="model name as served (see /v1/models)")
    p.add_argument("--step-log", required=True, metavar="PATH",
                   help="the step_log the server's ppas plugin writes (same host)")
    p.add_argument("-o", "--output", required=True, metavar="COST.json",
                   help="where to write the fitted model")
    g = p.add_argument_group("probe design (comma-separated token counts)")
    g.add_argument("--chunk-sizes", default="128,512,2048,8192",
                   help="prefill chunk sizes (default 128,512,2048,8192)")
    g.add_argument("--contexts", default="0,4096,16384",
                   help="cached context under each chunk; multiples of the KV block size "
                   "(default 0,4096,16384)")
    g.add_argument("--decode-batches", default="1,8,32,128",
                   help="decodes per step (default 1,8,32,128)")
    g.add_argument("--decode-contexts", default="1024,16384",
                   help="context of the decoding requests (default 1024,16384)")
    g.add_argument("--decode-tokens", type=int_arg(2, MAX_OUTPUT_TOKENS), default=16,
                   help="output tokens per decode probe request (default 16)")
    g.add_argument("--repeats", type=int_arg(1, MAX_PROBE_REPEATS), default=1,
                   help=f"run the whole grid N times (at most {MAX_PROBE_REPEATS})")
    g = p.add_argument_group("requests")
    g.add_argument("--vocab-size", type=int_arg(1, MAX_VOCAB), default=32000,
                   help="prompt ids are drawn from [0, N) (default 32000; must not exceed the "
                   "model's vocabulary)")
    g.add_argument("--filler-token", type=int_arg(0, MAX_VOCAB - 1), default=1000,
                   help="the id repeated after each prompt's random prefix (default 1000)")
    g.add_argument("--seed", type=int_arg(0, MAX_SEED), default=0,
                   help="prompt seed; change it to profile the same server again without "
                   "prefix-cache hits from the previous profile (default 0)")
    g.add_argument("--request-timeout", type=float_arg(0, MAX_TIMEOUT_S, lo_open=True),
                   default=600.0,
                   help="seconds a probe request may take (default 600)")
    p.add_argument("--kv-capacity-tokens", type=int_arg(1, MAX_KV_TOKENS), metavar="N",
                   help="the server's KV cache size in tokens, stored with the model")
    p.add_argument("--json", action="store_true", help="print the written model as JSON")


def run(args: argparse.Namespace) -> int:
    from ppas.calibrate.profile import Probe, ProbeDesign, probes, profile
    from ppas.live.http import normalize_base_url

    normalize_base_url(args.base_url)  # fail fast on a malformed URL
    log = args.step_log
    if os.path.lexists(log) and not os.path.isfile(log):  # read after the probe: check now
        raise PpasError(f"--step-log {log!r} is not a regular file; give the step_log file "
                        "the server's ppas plugin writes")
    # The step log is the input: refuse it (or an unwritable place) as -o before probing.
    out = check_output_file(args.output, "-o/--output", inputs=[args.step_log])
    design = ProbeDesign(
        chunk_sizes=tuple(ints(args.chunk_sizes, "--chunk-sizes")),
        contexts=tuple(ints(args.contexts, "--contexts")),
        decode_batches=tuple(ints(args.decode_batches, "--decode-batches")),
        decode_contexts=tuple(ints(args.decode_contexts, "--decode-contexts")),
        decode_tokens=args.decode_tokens, repeats=args.repeats)
    plan = probes(design, args.seed)
    t0 = time.monotonic()

    def progress(i: int, probe: Probe) -> None:
        if not args.json:
            print(f"[{i + 1}/{len(plan)}] {probe.label}", file=sys.stderr, flush=True)

    model = profile(args.base_url, args.model, args.step_log, design, out,
                    vocab_size=args.vocab_size, filler_id=args.filler_token, seed=args.seed,
                    request_timeout_s=args.request_timeout,
                    kv_capacity_tokens=args.kv_capacity_tokens, on_probe=progress)
    if args.json:
        print(json.dumps(model.to_dict(), allow_nan=False))
        return 0
    assert model.stats is not None
    print(f"wrote {out} ({len(plan)} probes in {time.monotonic() - t0:.0f} s)")
    print(f"fit on {model.stats.line()}")
    print(model.coefficients_line())
    return 0
