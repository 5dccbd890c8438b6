"""The published fidelity-suite layout: file names, schema strings, and what a folder of it supplies.

Reasoning: docs/interchange.md §"The layout".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import FidelityError
from harness.io.jsonio import read_json

#: Name of this layout in session headers and custody records.
LAYOUT = "qwen38-fidelity-suite"
SUITE_SCHEMA = "qwen38-distribution-fidelity/1"
#: Every suite manifest version the published tools wrote (``/1`` by ``build-suite``; ``/3`` the v4 suite, ``/6`` the v5
#: suite with partitions, sentinels, model identity and cluster partition): the rows this project reads are common to all.
SUITE_SCHEMAS = tuple(f"qwen38-distribution-fidelity/{v}" for v in range(1, 7))
CAPTURE_SCHEMA = "qwen38-fidelity-capture/2"
REPORT_FULL = "qwen38-fidelity-report/2"
REPORT_WINDOWED = "qwen38-fidelity-report/3"
REPORT_LEGACY = "qwen38-fidelity-report/1"
TAIL_SCHEMA = "qwen38-kld-tail-histogram/1"
WINDOW_SCHEMA = "qwen38-scored-position-window/1"

SUITE_DIR = "suite"
SUITE_MANIFEST = "suite-manifest.json"
LADDER_PIN = "ladder-pin.json"
CAPTURE_MANIFEST = "capture-manifest.json"
REFERENCE_DIR = "reference"
CAPTURES_DIR = "captures"
REPORTS_DIR = "reports"
HEAD_FILE = "lm-head/weight.safetensors"
#: The tensor name inside every hidden-state file.
HIDDEN_TENSOR = "hidden_states"

SHARD_VIEW_RE = re.compile(r"^shard-(\d{4})$", re.ASCII)
HIDDEN_RE = re.compile(r"^hidden_(\d{4,})\.safetensors$", re.ASCII)
HEX64_RE = re.compile(r"^[0-9a-f]{64}$", re.ASCII)


def hidden_filename(index: int) -> str:
    """File name of context ``index`` in a capture folder: ``hidden_{index:04d}.safetensors``."""
    return f"hidden_{index:04d}.safetensors"


def shard_view_name(shard: int) -> str:
    """Folder name of shard ``shard``'s view: ``shard-{shard:04d}``."""
    return f"shard-{shard:04d}"


def looks_like(root: Path) -> bool:
    """True when the folder has this layout's parent suite manifest (a cheap test, nothing verified)."""
    return (root / SUITE_DIR / SUITE_MANIFEST).is_file()


@dataclass(frozen=True)
class LayoutScan:
    """What a published dataset folder supplies to a run, from its manifests alone (nothing verified yet).

    suite: the parent suite folder; reference: the folder holding the reference capture folders;
    head: the shared head file; reference_name: the name reports give the reference;
    shards: the shards whose every context the reference folders list (the only ones it can score).
    gaps: for every other shard, why it cannot be scored: the capture manifest(s) that list some of its
    contexts and the contexts they lack, or that no manifest lists any of them.
    """

    root: Path
    suite: Path
    reference: Path
    head: Path
    reference_name: str
    shards: tuple[int, ...]
    gaps: Mapping[int, str] = field(default_factory=dict)


def reference_folders(root: Path) -> list[Path]:
    """Folders below ``reference/`` (any depth) that hold a capture manifest, sorted."""
    return sorted(p.parent for p in (root / REFERENCE_DIR).rglob(CAPTURE_MANIFEST))


def _view_slices(suite: Path, n_contexts: int) -> list[tuple[int, int]]:
    views = sorted(p for p in suite.iterdir() if p.is_dir() and SHARD_VIEW_RE.match(p.name))
    out, start = [], 0
    for v in views:
        n = read_json(v / SUITE_MANIFEST).get("contexts")
        if not isinstance(n, int) or n <= 0:
            raise FidelityError(f"{v / SUITE_MANIFEST}: contexts: expected a positive integer, found {n!r}")
        out.append((start, start + n))
        start += n
    return out or [(0, n_contexts)]


def scan_layout(root: Path, head: Path | None = None) -> LayoutScan:
    """The inputs of the published dataset at ``root`` (``head`` overrides ``lm-head/weight.safetensors``).

    Raises :class:`FidelityError` naming the file when a part is missing or holds no whole shard; the
    contents are verified when a run first needs them (:mod:`harness.interchange.dataset`).
    """
    mf = root / SUITE_DIR / SUITE_MANIFEST
    if not mf.is_file():
        raise FidelityError(f"{mf}: expected the suite manifest of a {LAYOUT} dataset, found no such file")
    parent = read_json(mf)
    n = parent.get("contexts")
    if not isinstance(n, int) or n <= 0:
        raise FidelityError(f"{mf}: contexts: expected a positive integer, found {n!r}")
    folders = reference_folders(root)
    if not folders:
        raise FidelityError(f"{root / REFERENCE_DIR}: expected reference capture folders ({CAPTURE_MANIFEST}), found none")
    listed: dict[Path, set[int]] = {}
    for f in folders:
        caps = read_json(f / CAPTURE_MANIFEST).get("captures")
        listed[f / CAPTURE_MANIFEST] = ({int(c["index"]) for c in caps if isinstance(c, dict) and isinstance(c.get("index"), int)}
                                        if isinstance(caps, list) else set())
    held = set().union(*listed.values())
    slices = _view_slices(root / SUITE_DIR, n)
    shards = tuple(k for k, (a, b) in enumerate(slices) if set(range(a, b)) <= held)
    gaps = {k: _gap(k, a, b, listed) for k, (a, b) in enumerate(slices) if k not in shards}
    if not shards:
        raise FidelityError(f"{root / REFERENCE_DIR}: expected a reference for every context of at least one shard, "
                            f"found {len(held)} context(s) covering no whole shard")
    head_path = head if head is not None else root / HEAD_FILE
    if not head_path.is_file():
        raise FidelityError(f"{head_path}: expected the shared head (a single-tensor safetensors file; "
                            f"give it as [dataset] head = ...), found no such file")
    name = folders[0].name.removeprefix("hidden-") if len(folders) == 1 else "bf16"
    return LayoutScan(root=root, suite=root / SUITE_DIR, reference=root / REFERENCE_DIR, head=head_path,
                      reference_name=name or "reference", shards=shards, gaps=gaps)


def _gap(shard: int, first: int, end: int, listed: Mapping[Path, set[int]]) -> str:
    """Why shard ``shard`` (contexts ``first``..``end - 1``) has no whole reference (:class:`LayoutScan`)."""
    need = set(range(first, end))
    lists = [str(m) for m, idx in listed.items() if idx & need]
    lost = sorted(need - set().union(*listed.values()))
    if not lists:
        return f"shard {shard}: no {CAPTURE_MANIFEST} lists any of its contexts {first}..{end - 1}"
    shown = ", ".join(map(str, lost[:8])) + (f", ... ({len(lost)} in all)" if len(lost) > 8 else "")
    return (f"shard {shard}: {' and '.join(lists)} {'lists' if len(lists) == 1 else 'list'} no record for context(s) {shown} "
            f"(the shard holds contexts {first}..{end - 1})")
