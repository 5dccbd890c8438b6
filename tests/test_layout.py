"""The package's shape: every module imports, no import cycle, no private name crosses a module,
statistics load without torch (all checked on the source, independently of the code under test)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "harness"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()
MODULES.pop("harness.__main__")  # runs the CLI when imported (python -m harness)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """Every ``harness`` import in a file, at any depth (function-level imports count too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "harness":
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((a.name, []) for a in node.names if a.name.split(".")[0] == "harness")
    return found


def _edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for mod, path in MODULES.items():
        for target, names in _imports(path):
            for name in names:  # `from harness.cli import bench` imports the submodule
                if f"{target}.{name}" in MODULES:
                    graph[mod].add(f"{target}.{name}")
            if target in MODULES and not (names and all(f"{target}.{n}" in MODULES for n in names)):
                graph[mod].add(target)
    for mod in graph:  # a package's __init__ is not an edge of its own children
        graph[mod].discard(mod)
    return graph


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_imports(module: str) -> None:
    if module == "harness.scoring.fused_kl":
        pytest.importorskip("triton")
    importlib.import_module(module)


def test_no_import_cycle() -> None:
    graph = _edges()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycle = stack[stack.index(n):] + [n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_no_private_name_crosses_a_module() -> None:
    offenders = [
        f"{mod}: from {target} import {name}"
        for mod, path in MODULES.items()
        for target, names in _imports(path)
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert not offenders, offenders


def test_statistics_import_without_torch() -> None:
    code = ("import sys; import harness.metrics, harness.metrics.bootstrap, harness.reports.tails, "
            "harness.reports.aggregate, harness.gate.baselines; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_no_text_points_outside_the_repository() -> None:
    repo = ROOT.parent
    tracked = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    bad = []
    for name in tracked.stdout.split():
        p = repo / name
        if p.suffix not in (".py", ".md", ".toml", ".ini", ".sh", ".txt") and name != ".ci/run":
            continue
        text = p.read_text(errors="replace")
        for needle in (".." + "/shared", "DESIGN" + ".md", "STYLE" + ".md"):
            if needle in text:
                bad.append(f"{name}: {needle}")
    assert not bad, bad
