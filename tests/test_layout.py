"""The package's shape: every module imports, imports flow one way (each folder has a rank and imports
only its own folder and lower ranks), no import cycle, no private name crosses a module, statistics
load without torch (all checked on the source, independently of the code under test)."""

from __future__ import annotations

import ast
import importlib
import re
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


#: The rank of each folder of ``harness/`` (and of the package's top-level modules, by name): a module
#: imports only from its own folder and from folders of a lower rank (docs/design.md, section 5).
RANKS: dict[str, int] = {
    "": 0,  # harness/__init__.py: the version numbers
    "errors": 0,
    "io": 1,
    "metrics": 2,
    "engines": 3,
    "planning": 3,  # predicts the intervals metrics/ computes (their levels)
    "inputs": 4,
    "capture": 5,
    "scoring": 6,
    "attribution": 7,
    "gate": 7,
    "llamacpp": 7,
    "reports": 8,
    "interchange": 9,
    "allocation": 9,
    "dataset": 10,
    "run": 11,
    "cli": 12,
    "api": 12,
    "plugin": 12,
    "__main__": 13,
}

#: A string naming a module (``import_module("harness.x.y")``, ``"harness.x.y:NAME"`` entry points).
_MODULE_STRING = re.compile(r"^harness(\.\w+)+(:\w+)?$")


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """Every ``harness`` import in a file, at any depth (function-level imports count too), and
    every string constant that is a harness module's name (what ``importlib`` would import)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "harness":
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((a.name, []) for a in node.names if a.name.split(".")[0] == "harness")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_STRING.match(node.value):
            found.append((node.value.split(":")[0], []))
    return found


def _folder(module: str) -> str:
    """The folder (or top-level module) of ``harness`` a module belongs to: its rank's key."""
    return module.split(".")[1] if "." in module else ""


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


def test_every_folder_has_a_rank() -> None:
    folders = {_folder(m) for m in MODULES} | {"__main__"}
    assert folders == set(RANKS), f"unranked: {sorted(folders - set(RANKS))}, gone: {sorted(set(RANKS) - folders)}"


def test_imports_flow_one_way() -> None:
    """No module imports a folder of the same or a higher rank than its own (other than its own folder)."""
    upward = []
    for mod, path in {**MODULES, "harness.__main__": ROOT / "__main__.py"}.items():
        here = _folder(mod)
        for target, _names in _imports(path):
            there = _folder(target)
            if there != here and RANKS[there] >= RANKS[here]:
                upward.append(f"{mod} (rank {RANKS[here]}) imports {target} (rank {RANKS[there]})")
    assert not upward, "\n".join(upward)


def test_the_rank_check_sees_string_imports(tmp_path: Path) -> None:
    """The scanner itself: a function-level import and an import_module string are both found."""
    src = tmp_path / "m.py"
    src.write_text("import importlib\ndef f():\n    from harness.run import shard\n"
                   "    return importlib.import_module('harness.plugin.run')\n")
    assert sorted(_imports(src)) == [("harness.plugin.run", []), ("harness.run", ["shard"])]


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


#: The most function-level imports of harness modules the package may hold. Those that remain each load an
#: optional heavy dependency that the importing module does not load at import time (torch, triton, scipy,
#: safetensors): the scorer's kernels, the GPU kernel, the statistics of the design and of a shard's gate, so
#: that ``fidelity --help``, the pytest plugin's start and the torch-free statistics stay light.
MAX_FUNCTION_LEVEL_IMPORTS = 36


def _function_level_imports(path: Path) -> list[str]:
    """``file:line module`` of each import of a harness module inside a function body."""
    found = []
    where = path.relative_to(ROOT.parent) if path.is_relative_to(ROOT.parent) else path

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.ImportFrom) and (child.module or "").split(".")[0] == "harness":
                found.append(f"{where}:{child.lineno} {child.module}")
            elif in_function and isinstance(child, ast.Import):
                found.extend(f"{where}:{child.lineno} {a.name}"
                             for a in child.names if a.name.split(".")[0] == "harness")
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def test_harness_imports_are_at_the_top_of_their_files() -> None:
    """A module's header says what it depends on: at most a few dozen imports of harness modules happen
    inside functions (each to keep an optional heavy dependency out of a light module)."""
    inside = [hit for path in MODULES.values() for hit in _function_level_imports(path)]
    assert len(inside) <= MAX_FUNCTION_LEVEL_IMPORTS, (
        f"{len(inside)} function-level imports of harness modules (at most {MAX_FUNCTION_LEVEL_IMPORTS}):\n"
        + "\n".join(inside))


def test_the_function_level_import_count_sees_nested_imports(tmp_path: Path) -> None:
    src = tmp_path / "harness" / "m.py"
    src.parent.mkdir()
    src.write_text("from harness.io import atomic\ndef f():\n    import harness.errors\n"
                   "    def g():\n        from harness.io.jsonio import read_json\n    return g\n")
    assert [h.split(" ")[1] for h in _function_level_imports(src)] == ["harness.errors", "harness.io.jsonio"]


#: The folders of the scoring pipeline and of the layout search, whose function signatures name precise types.
PIPELINE = ("run", "scoring", "capture", "engines", "allocation")
#: The most ``Any`` the pipeline's function signatures may hold (parameters and return types).
MAX_PIPELINE_ANY = 0


def _any_in_signatures(path: Path) -> list[str]:
    """``file:line name`` for each ``Any`` in a function's parameter or return annotations."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            annotations = [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x]
            for ann in [*annotations, node.returns]:
                for sub in ast.walk(ann) if ann is not None else ():
                    if (isinstance(sub, ast.Name) and sub.id == "Any") or (isinstance(sub, ast.Attribute) and sub.attr == "Any"):
                        found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name}")
    return found


def test_the_pipeline_signatures_name_their_types() -> None:
    """Rows, stores, heads, options and records are typed in the pipeline's signatures (protocols, tensors,
    arrays, JSON objects, ``object`` checked at a boundary), not ``Any``."""
    hits = [h for mod, path in MODULES.items() if _folder(mod) in PIPELINE for h in _any_in_signatures(path)]
    assert len(hits) <= MAX_PIPELINE_ANY, (
        f"{len(hits)} Any in the signatures of {', '.join(PIPELINE)} (at most {MAX_PIPELINE_ANY}):\n" + "\n".join(hits))
