"""What every benchmark shares: its common arguments, the command echo, tables, a results file.

A benchmark builds its parser with ``parser(__doc__, ...)`` (``--hardware``/``--model``,
``--seeds``/``--seed`` and ``--json OUT`` where it takes them), calls ``start(args)``
first (checks ``--json``'s path before any work, prints the exact command line), prints
its tables with ``Table`` and ends with ``finish(args, results)`` (the results JSON,
written atomically by ``ppas.core.outputs``). Bad arguments are one line on stderr and
exit code 2, as for ``ppas``.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from ppas.core.errors import PpasError
from ppas.core.outputs import check_output_file, write_json_atomic


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse's own errors: one line, exit 2 (the project's bad-input contract).
        self.exit(2, f"{self.prog}: error: {message}\n")


def parser(doc: str | None, *, hardware: str | None = None, model: str | None = None,
           seeds: int | None = None, seed: int | None = None,
           json: bool = True) -> Parser:
    """A benchmark's parser: its description is the docstring's first line; each common
    argument is declared when its default is given (``--seeds N`` runs seeds 0..N-1)."""
    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "benchmark"
    p = Parser(prog=prog, description=(doc or "").strip().split("\n")[0])
    if hardware is not None:
        p.add_argument("--hardware", default=hardware, help=f"catalog GPU (default {hardware})")
    if model is not None:
        p.add_argument("--model", default=model, help=f"catalog model (default {model})")
    if seeds is not None:
        p.add_argument("--seeds", type=int, default=seeds,
                       help=f"seeds 0..N-1 (default {seeds})")
    if seed is not None:
        p.add_argument("--seed", type=int, default=seed, help=f"trace seed (default {seed})")
    if json:
        p.add_argument("--json", metavar="OUT", help="also write the results to OUT (JSON)")
    return p


def fail(prog: str, message: str) -> NoReturn:
    """Bad input: one line on stderr, exit 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def command(argv: Sequence[str] | None = None) -> str:
    """The command line that runs this benchmark with ``argv`` (default: this process's)."""
    args = list(sys.argv[1:] if argv is None else argv)
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("benchmark")
    try:
        script = script.resolve().relative_to(Path.cwd())
    except ValueError:
        pass
    return shlex.join([sys.executable, str(script), *args])


def start(args: argparse.Namespace, argv: Sequence[str] | None = None) -> None:
    """Before any work: check ``--json``'s destination and echo the command line."""
    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "benchmark"
    if getattr(args, "seeds", 1) < 1:
        fail(prog, f"--seeds must be >= 1, got {args.seeds}")
    if getattr(args, "json", None):
        try:
            check_output_file(args.json, "--json")
        except PpasError as e:
            fail(prog, str(e))
    print("$ " + command(argv), flush=True)


def finish(args: argparse.Namespace, results: Any, argv: Sequence[str] | None = None) -> None:
    """Write ``results`` (plain JSON values) to ``--json``, with the command that made them."""
    if getattr(args, "json", None):
        write_json_atomic(args.json, {"command": command(argv), "results": results},
                          allow_nan=True)
        print(f"results written to {args.json}")


_SPEC = re.compile(r"(?:.?[<>^=])?[+\- ]?z?#?0?(\d*)")


class Table:
    """A table of columns ``(title, spec)``: each cell is ``format(value, spec)``, each
    title padded to the spec's width and aligned as its spec aligns (default right);
    columns joined by ``sep``, every line after ``indent``, trailing blanks dropped (an
    empty last cell leaves no padding)."""

    def __init__(self, *columns: tuple[str, str], sep: str = " ", indent: str = "") -> None:
        self.columns, self.sep, self.indent = columns, sep, indent

    def header(self) -> str:
        cells = []
        for title, spec in self.columns:
            m = _SPEC.match(spec)
            width = m.group(1) if m and m.group(1) else ""
            align = "<" if spec[1:2] == "<" or spec[:1] == "<" else ">"
            cells.append(format(title, f"{align}{width}"))
        return (self.indent + self.sep.join(cells)).rstrip()

    def row(self, *values: object) -> str:
        assert len(values) == len(self.columns), (values, self.columns)
        return (self.indent + self.sep.join(
            format(v, spec) for v, (_, spec) in zip(values, self.columns, strict=True))).rstrip()

    def print_header(self) -> None:
        print(self.header())

    def print_row(self, *values: object) -> None:
        print(self.row(*values), flush=True)


def timed(fn: Callable[..., Any], acc: dict[str, float], key: str,
          clock: Callable[[], float] = time.perf_counter) -> Callable[..., Any]:
    """``fn`` adding its seconds on ``clock`` to ``acc[key]`` and its calls to
    ``acc[key + '_n']`` (a policy's ``decide`` timed from outside)."""

    calls = key + "_n"  # (made once: the wrapper's own cost is counted in the run)

    def wrapper(*a: Any) -> Any:
        t0 = clock()
        out = fn(*a)
        acc[key] += clock() - t0
        acc[calls] += 1
        return out
    return wrapper
