"""The walk from a candidate's case to its gate passes through each file at most twice: one candidate x
shard case of the fixture project (the capture cached, as in every run after the first) is run in this
process under ``sys.setprofile``, from ``FidelitySession.score`` to ``Gate.failure``, and every call from
one harness file into another is recorded.

What counts as entering a file: a call from a function of another harness file into a function of this
file that goes on to call into a third harness file (the walk passes through the file; a leaf call, such as
a property of a capture store or a hash of some bytes, is a step, not a pass). One caller file calling one
function counts once however often it does (a loop, or the same step applied to the reference and to the
candidate); module execution (a first import) is not part of the walk."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from types import FrameType

import pytest

from harness.gate.gate import Gate
from harness.inputs.config import load_config
from harness.run.session import FidelitySession

ROOT = Path(__file__).resolve().parents[1]

#: The most times the walk may pass through one file.
MAX_PASSES = 2


class Walk:
    """The passes of a profiled call into each harness file: ``{file: {(caller file, function), ...}}``."""

    def __init__(self, root: Path = ROOT / "harness") -> None:
        self._root = str(root) + "/"
        self.passes: dict[str, set[tuple[str, str]]] = defaultdict(set)
        self._open: list[tuple[str, str, str] | None] = []  # per harness frame: the entry it began, if any
        self._frames: set[int] = set()

    def _file(self, frame: FrameType) -> str | None:
        name = frame.f_code.co_filename
        return name[len(self._root):] if name.startswith(self._root) else None

    def profile(self, frame: FrameType, event: str, _arg: object) -> None:
        here = self._file(frame)
        if here is None or frame.f_code.co_name == "<module>":
            return
        if event == "call":
            back = frame.f_back
            while back is not None and self._file(back) is None:
                back = back.f_back
            caller = None if back is None else self._file(back)
            entry = (here, caller, frame.f_code.co_name) if caller is not None and caller != here else None
            if entry is not None:  # the nearest open entry now passes through its file
                for opened in reversed(self._open):
                    if opened is not None:
                        self.passes[opened[0]].add((opened[1], opened[2]))
                        break
            self._open.append(entry)
            self._frames.add(id(frame))
        elif event == "return" and id(frame) in self._frames:
            self._frames.discard(id(frame))
            self._open.pop()


def test_the_walk_counter_counts_passes_once_per_caller_and_skips_leaves(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The counter itself, on three small modules: ``a`` calls ``b.f`` in a loop and ``c.g`` directly;
    ``b.f`` calls ``c.g``. The walk passes through ``b`` once (the loop counts once); ``c`` is a leaf."""
    (tmp_path / "c.py").write_text("def g():\n    return 1\n")
    (tmp_path / "b.py").write_text("import c\ndef f():\n    return c.g()\n")
    (tmp_path / "a.py").write_text("import b, c\ndef run():\n    return sum(b.f() for _ in range(3)) + c.g()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import a  # type: ignore[import-not-found]

    walk = Walk(tmp_path)
    sys.setprofile(walk.profile)
    try:
        assert a.run() == 4
    finally:
        sys.setprofile(None)
    assert dict(walk.passes) == {"b.py": {("a.py", "f")}}


@pytest.mark.slow
def test_the_walk_from_a_case_to_its_gate_passes_each_file_at_most_twice(tmp_path: Path) -> None:
    fx = ROOT / "fixtures"
    (tmp_path / "fidelity.toml").write_text(
        f'[suite]\npath = "{fx / "suite"}"\n\n'
        f'[reference]\nname = "bf16"\nmodel = "{fx / "model"}"\nstore = "{fx / "reference"}"\n'
        f'head = "{fx / "lm_head.safetensors"}"\n\n'
        f'[settings]\ncache_dir = "{tmp_path / "cache"}"\nbaselines = "{ROOT / "fidelity_tests" / "baselines"}"\n'
        f'n_boot = 200\n\n[[candidates]]\nname = "int8"\nmodel = "{fx / "candidates" / "int8"}"\n'
    )
    first = FidelitySession(load_config(tmp_path / "fidelity.toml"))
    first.candidate_store(first.config.candidate("int8"), 0)  # the capture, cached for the case below

    session = FidelitySession(load_config(tmp_path / "fidelity.toml"))
    gate = Gate(baselines=session.config.baselines, update=False, config_path=tmp_path / "fidelity.toml")
    walk = Walk()
    sys.setprofile(walk.profile)
    try:
        scored = session.score(session.config.candidate("int8"), 0)
        failure = gate.failure(scored)
    finally:
        sys.setprofile(None)
    assert failure is None, failure
    # the walk reached the pipeline's stages (so an empty record cannot pass)
    assert {"run/shard.py", "capture/store.py", "scoring/scorer.py", "gate/baselines.py"} <= set(walk.passes)
    over = {f: sorted(p) for f, p in walk.passes.items() if len(p) > MAX_PASSES}
    assert not over, "files the walk passes through more than twice:\n" + "\n".join(
        f"{f}: " + ", ".join(f"{c} -> {fn}" for c, fn in p) for f, p in sorted(over.items()))
