"""The ``ppas`` command: it only dispatches. Each subcommand's parser lives in
``ppas.commands.<name>`` (``add_arguments(parser)``, ``run(args) -> int``) and calls typed
functions of the module named after its concept; heavy imports (aiohttp, torch, vllm,
matplotlib) happen inside ``run`` so ``ppas --help`` stays instant.

Bad input raises ``PpasError`` anywhere below; it is printed as one line, exit code 2.
Exit codes: 0 success; 1 (``errors.NO_SUCCESS``) a run that completed no request; 2 bad
input or an output that cannot be written; 130/143 an interrupted ``ppas bench``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ppas.core.errors import PpasError

# subcommand -> (module, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("ppas.commands.simulate", "simulate one trace under one or more policies"),
    "sweep": ("ppas.commands.sweep", "simulate a grid of burst rates x seeds x policies"),
    "capacity": ("ppas.commands.capacity",
                 "the largest rate of a trace each policy serves within SLOs"),
    "tune": ("ppas.commands.tune",
             "search stock vLLM's knobs for a trace; compare our policies with the best"),
    "bench": ("ppas.commands.bench", "replay a trace against an OpenAI-compatible server"),
    "calibrate": ("ppas.commands.calibrate", "fit a cost model from the vLLM plugin's step log"),
    "experiment": ("ppas.commands.experiment",
                   "run a live comparison of arms from a TOML file, with statistics"),
    "profile": ("ppas.commands.profile", "probe a live server and fit a cost model to its steps"),
    "make-tiny-model": ("ppas.commands.make_tiny_model",
                        "generate a random-weight Qwen2 model offline"),
}


# Optional packages -> the extra that provides them (the core needs numpy only).
OPTIONAL = {"aiohttp": "cli", "tqdm": "cli", "matplotlib": "cli", "scipy": "dev",
            "torch": "vllm", "transformers": "vllm", "tokenizers": "vllm", "vllm": "vllm"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse's own errors: one line, exit 2 (same contract as PpasError).
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ppas", description="Adaptive prefill scheduling for LLM serving.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (module, help_) in COMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("ppas"):
                continue  # subcommand not built yet in this checkout
            raise
        sp = sub.add_parser(name, help=help_, description=help_)
        mod.add_arguments(sp)
        sp.set_defaults(_run=mod.run)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except PpasError as e:
        print(f"ppas {args.command}: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0]
        extra = OPTIONAL.get(top)
        if extra is None:
            raise
        print(f"ppas {args.command}: error: needs the optional package {top!r}; install it "
              f"with: pip install 'ppas[{extra}]'", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C, or bench.Interrupted (SIGINT/SIGTERM)
        signum = int(getattr(e, "signum", 2))
        print(f"ppas {args.command}: interrupted", file=sys.stderr)
        return 128 + signum
    except BrokenPipeError:
        return 0
    except OSError as e:  # e.g. a disk that fills up while writing (paths are checked first)
        where = f" {e.filename!r}" if e.filename else ""
        print(f"ppas {args.command}: error:{where} {e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
