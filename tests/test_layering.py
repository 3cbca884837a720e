"""The layering rule of ARCHITECTURE.md, checked on the source: a module imports only from
its own stage or lower ones (function-level imports included), and no two modules import
each other at module level, directly or through others."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
#: Stages, lowest first (ARCHITECTURE.md, "The layering rule"); ``vllm`` is the plugin's
#: published name, an alias above everything.
ORDER = ("core", "workload", "cost", "policies", "engine", "cluster", "live", "calibrate",
         "analysis", "experiment", "commands", "cli", "vllm")


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__"): p
            for p in SRC.rglob("*.py")}


MODULES = _modules()


def _imports(path: Path, top_level_only: bool) -> list[tuple[str, int]]:
    """(imported ppas module, line) of every ``from ppas... import`` in ``path``."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ppas"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.append((sub if sub in MODULES else node.module or "", node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("ppas")]
    return out


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_stage_is_known() -> None:
    assert {_stage(m) for m in MODULES} - {None} <= set(ORDER)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_from_a_higher_stage(module: str) -> None:
    here = _stage(module)
    if here is None:
        return
    upward = [f"{m} (line {line})" for m, line in _imports(MODULES[module], False)
              if (there := _stage(m)) is not None and ORDER.index(there) > ORDER.index(here)]
    assert not upward, f"{module} imports from a higher stage: {', '.join(upward)}"


def test_no_import_cycles() -> None:
    graph = {m: {d for d, _ in _imports(p, True) if d in MODULES and d != m}
             for m, p in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycle = path[path.index(d):] + [d]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_the_checks_see_a_violation(tmp_path: Path) -> None:
    """The walk finds function-level imports (so the rule above can fail)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from ppas.commands.simulate import run\n")
    assert _imports(f, False) == [("ppas.commands.simulate", 2)]
    assert _imports(f, True) == []
