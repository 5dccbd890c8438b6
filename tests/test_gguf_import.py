"""``import gguf`` in the test session never resolves to the data folder ``fixtures/gguf``.

Tests put ``fixtures/`` on ``sys.path`` to import its builders; the folder ``fixtures/gguf`` has no
``__init__.py``, so Python's own path finder returns it as a namespace package when the ``gguf`` package
is absent (shown below). The session's finder (tests/conftest.py) turns that into ModuleNotFoundError,
so ``pytest.importorskip("gguf")`` skips instead of a later ``AttributeError``."""

from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_python_alone_would_import_the_fixtures_folder() -> None:
    spec = importlib.machinery.PathFinder.find_spec("gguf", [str(FIXTURES)])
    assert spec is not None and list(spec.submodule_search_locations or []) == [str(FIXTURES / "gguf")]


def test_without_the_package_import_gguf_is_module_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", [str(FIXTURES)])  # the gguf package out of reach; the fixtures folder in it
    monkeypatch.delitem(sys.modules, "gguf", raising=False)
    with pytest.raises(ModuleNotFoundError, match="fixtures/gguf is data, not a package"):
        __import__("gguf")


def test_with_the_package_import_gguf_is_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gguf")
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.delitem(sys.modules, "gguf", raising=False)
    mod = __import__("gguf")
    assert mod.__file__ is not None and Path(mod.__file__).parent != FIXTURES / "gguf" and hasattr(mod, "GGUFReader")
