"""Every shell block in README.md and docs/ is run by a test, or says in the page why it is not.

A shell block is a fenced ``bash``/``sh``/``shell``/``console`` block, or a plain one that is a console
transcript (its first line a ``$ `` prompt). Within the four lines above its fence it
carries one visible note:

* ``*Run by `tests/test_docs_commands.py`.*`` -- this file runs it as written (bash -euo pipefail), in document
  order, in one workspace per page that holds a copy of the repository's fixtures and configurations, so a block
  may use what an earlier block of its page wrote;
* ``*Run by `PATH`...*`` -- another test or CI script runs it: ``PATH`` must exist and name the page (or, for
  ``.ci/run``, hold each of the block's commands);
* ``*Not run here: ...*`` -- why not: what it needs that a test machine has not (a GPU, the network, a cluster,
  your own data), or what it costs and which test runs the same thing smaller.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(bash|sh|shell|console)?\s*$")
NOTE = re.compile(r"\*(?:Run by `(?P<by>[^`]+)`[^*]*|Not run here(?: as [a-z ]+)?: (?P<needs>[^*]+))\*")
HERE = "tests/test_docs_commands.py"


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # the opening fence, 1-based
    text: str
    by: str | None  # "Run by" target
    needs: str | None  # "Not run here: needs" reason

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks() -> list[Block]:
    found = []
    for page in pages():
        lines = page.read_text("utf-8").splitlines()
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if m or lines[i].startswith("```"):
                j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
                if not m or (m.group(1) is None and not (lines[i + 1] if i + 1 < j else "").startswith("$ ")):
                    i = j + 1  # another language, or a plain block that is not a console transcript
                    continue
                above = "\n".join(lines[max(0, i - 4) : i])
                notes = list(NOTE.finditer(above))
                note = notes[-1] if notes else None
                found.append(Block(str(page.relative_to(ROOT)), i + 1, "\n".join(lines[i + 1 : j]),
                                   note.group("by") if note else None, note.group("needs") if note else None))
                i = j
            i += 1
    return found


def test_every_shell_block_is_run_or_says_why_not() -> None:
    found = blocks()
    assert len(found) >= 10, [b.id for b in found]  # the parser sees the pages' blocks
    unmarked = [b.id for b in found if b.by is None and b.needs is None]
    assert not unmarked, f"shell blocks with neither 'Run by' nor 'Not run here: needs' above them: {unmarked}"
    for b in found:
        if b.by is None or b.by == HERE:
            continue
        target = ROOT / b.by
        assert target.is_file(), f"{b.id}: 'Run by {b.by}': no such file"
        text = target.read_text("utf-8")
        if b.by == ".ci/run":  # CI runs each command of the block (as `python -m pytest -q ...`)
            for cmd in (c.strip() for c in re.split(r"&&|\n", b.text)):
                if cmd and not cmd.startswith("#"):
                    base = re.sub(r"\s+#.*$", "", cmd).strip()
                    assert base.replace("pytest", "python -m pytest -q", 1) in text or base in text, f"{b.id}: .ci/run lacks {base!r}"
        else:
            assert b.page in text or Path(b.page).name in text, f"{b.id}: {b.by} does not name {b.page}"


def commands(text: str) -> str:
    """The commands of a block: all of it, or in a console transcript (``$ `` prompts) the prompted lines and
    their ``\\`` continuations, without the printed output."""
    if not text.lstrip().startswith("$ "):
        return text
    out: list[str] = []
    going = False
    for ln in text.splitlines():
        if ln.startswith("$ ") or going:
            out.append(ln[2:] if ln.startswith("$ ") else ln)
            going = ln.rstrip().endswith("\\")
    return "\n".join(out)


def test_console_transcripts_keep_only_the_commands() -> None:
    text = "$ fidelity a \\\n      --b c\nprinted \\\n  more printed\n$ fidelity d"
    assert commands(text) == "fidelity a \\\n      --b c\nfidelity d"
    assert commands("fidelity x\n# y") == "fidelity x\n# y"


def _runnable() -> list[Block]:
    return [b for b in blocks() if b.by == HERE]


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One folder per page: a copy of the fixtures (commands may rebuild them), the configurations and the
    committed baselines, so the blocks of a page run where the repository root would be and share outputs."""
    return {}


def _workspace(workspaces: dict[str, Path], page: str, factory: pytest.TempPathFactory) -> Path:
    if page not in workspaces:
        ws = factory.mktemp(Path(page).stem)
        shutil.copytree(ROOT / "fixtures", ws / "fixtures", symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(ROOT / "fidelity_tests", ws / "fidelity_tests", ignore=shutil.ignore_patterns("__pycache__"))
        for f in ROOT.glob("fidelity*.toml"):
            shutil.copyfile(f, ws / f.name)
        # The capture cache is keyed by the models' content, not their folders: shared with the main job's.
        (ROOT / ".fidelity-cache").mkdir(exist_ok=True)
        (ws / ".fidelity-cache").symlink_to(ROOT / ".fidelity-cache", target_is_directory=True)
        workspaces[page] = ws
    return workspaces[page]


@pytest.mark.slow  # the docs' commands on the embedded default; shared outputs per page
# one page's blocks stay on one pytest-xdist worker, in document order (`-n 2 --dist loadgroup`)
@pytest.mark.parametrize("block", [pytest.param(b, marks=pytest.mark.xdist_group(f"docs:{b.page}")) for b in _runnable()],
                         ids=lambda b: b.id)
def test_docs_block_runs_as_written(block: Block, workspaces: dict[str, Path],
                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    ws = _workspace(workspaces, block.page, tmp_path_factory)
    env = dict(os.environ, REPO=str(ROOT), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("PYTEST_ADDOPTS", None)
    script = commands(block.text)
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ws, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, f"{block.id}\n{script}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"


def test_no_paragraph_exists_twice() -> None:
    """The README is a front door and docs/ the guide: a paragraph (or table) of some length lives on one page."""
    seen: dict[str, str] = {}
    twice = []
    for page in pages():
        text = re.sub(r"```.*?```", "", page.read_text("utf-8"), flags=re.S)
        for para in re.split(r"\n\s*\n", text):
            norm = re.sub(r"\s+", " ", para).strip()
            if len(norm) >= 160:
                where = str(page.relative_to(ROOT))
                if norm in seen and seen[norm] != where:
                    twice.append(f"{seen[norm]} and {where}: {norm[:80]}...")
                seen.setdefault(norm, where)
    assert not twice, twice


def test_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text("utf-8").splitlines()
    assert len(lines) <= 250, len(lines)
    index = (ROOT / "docs" / "README.md").read_text("utf-8")
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "README.md":
            assert f"({page.name})" in index, f"docs/README.md does not link {page.name}"
