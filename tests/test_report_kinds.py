"""Report kinds are one class each behind ``harness.plugin.kinds.ReportKind``, listed once in
``harness.plugin.registry.REPORT_KINDS``, and the plugin's markers, fixtures and collected case functions
come from that list (checked on the plugin's modules, and on the source: no kind is chosen by its name)."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

from harness.plugin import builtin, pytest_plugin
from harness.plugin.kinds import ReportKind
from harness.plugin.registry import REPORT_KINDS

PLUGIN = Path(__file__).resolve().parents[1] / "harness" / "plugin"
#: The members of the protocol (properties and methods), read from its class body.
MEMBERS = sorted(n for n in vars(ReportKind) if not n.startswith("_"))


def test_each_kind_module_is_one_registered_kind() -> None:
    modules = sorted(p.stem for p in PLUGIN.glob("kind_*.py"))
    kinds = [importlib.import_module(f"harness.plugin.{m}").KIND for m in modules]
    assert sorted(map(id, kinds)) == sorted(map(id, REPORT_KINDS)) and len(REPORT_KINDS) == len(modules) == 8
    assert {"name", "marker", "fixture", "test", "params", "case", "write"} <= set(MEMBERS)
    for kind in REPORT_KINDS:
        missing = [m for m in MEMBERS if not hasattr(kind, m)]
        assert not missing, f"{type(kind).__name__} lacks {missing}"
    for member in ("name", "marker", "fixture", "test"):
        values = [getattr(k, member) for k in REPORT_KINDS if getattr(k, member) is not None]
        assert len(values) == len(set(values)), f"two kinds share a {member}: {values}"


def test_markers_fixtures_and_cases_come_from_the_registry() -> None:
    for kind in REPORT_KINDS:
        if kind.marker is not None:
            assert pytest_plugin.MARKERS[kind.marker] == kind.marker_doc
        for fixture in (kind.fixture, kind.param_fixture):
            if fixture is not None:
                assert callable(getattr(pytest_plugin, fixture)), fixture
        if kind.test is not None:
            case = getattr(builtin, kind.test)
            assert case.__doc__ == kind.test_doc
            assert [m.name for m in case.pytestmark] == [kind.marker]
            assert list(inspect.signature(case).parameters) == [kind.fixture]


def _defined(module: object, decorator: str) -> set[str]:
    """The functions written out in ``module``'s source (``def NAME``) whose decorators mention ``decorator``."""
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)
            and any(decorator in ast.unparse(d) for d in node.decorator_list)}


def test_each_kind_fixture_and_case_is_written_out() -> None:
    """Every kind's fixtures and case function are plain ``def``s of the plugin's modules (found by searching
    for ``def fidelity_tails``), exactly the names the registry declares: none generated, none left over."""
    declared = {f for k in REPORT_KINDS for f in (k.fixture, k.param_fixture) if f is not None}
    core = {"fidelity_session", "fidelity_case", "fidelity_scored", "fidelity_gate"}
    assert _defined(pytest_plugin, "pytest.fixture") == declared | core
    tests = {k.test for k in REPORT_KINDS if k.test is not None}
    assert _defined(builtin, "pytest.mark") == tests | {"test_fidelity"}


def test_no_plugin_module_chooses_a_kind_by_name() -> None:
    """Outside its own module a kind is never named by a string: compared with one (an if-chain over kind
    names) or passed as one (a payload sent under a spelled-out kind)."""
    names = {k.name for k in REPORT_KINDS}
    found = []
    for path in sorted(PLUGIN.glob("*.py")):
        if path.stem.startswith("kind_"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            operands = ([node.left, *node.comparators] if isinstance(node, ast.Compare) else
                        [*node.args, *(k.value for k in node.keywords)] if isinstance(node, ast.Call) else [])
            found += [f"{path.name}:{node.lineno} {x.value!r}" for x in operands
                      if isinstance(x, ast.Constant) and x.value in names]
    assert not found, found


def test_a_worker_payload_is_checked_against_its_kinds_record(tmp_path: Path) -> None:
    """A payload that does not match its kind's record (``ReportKind[P].payload``) is refused, naming the kind and
    the key, before the kind's writer runs: nothing is written."""
    import pytest

    from harness.errors import VerificationError
    from harness.plugin import kind_tails
    from harness.plugin.registry import write_kind

    with pytest.raises(VerificationError) as e:
        write_kind(kind_tails.KIND, tmp_path, [{"schema": "fidelity.tails/1", "candidate": "q4"}], None)
    assert "<tails payload 0 of this run>" in str(e.value) and (e.value.what, e.value.expected) == ("score_from", "present")
    assert not any(tmp_path.iterdir())
