"""``fidelity init``: a project for your own model: the suite, the shared head and a commented fidelity.toml.

From a BF16 reference (a model folder or ``hf://org/name[@revision]``), candidate folders or GGUF files, and a
corpus (text files or folders, or a ``datasets`` source), :func:`init_project` checks every input (a refusal
names it), builds the suite with the reference's tokenizer (:func:`harness.inputs.suite.build_suite`), exports
the head (:func:`harness.inputs.head.export_head`) and writes ``fidelity.toml`` so that ``pytest fidelity.toml``
runs as it is; its first run captures the reference and prints the ladder with one "no baselines yet" line
(docs/commands.md, "fidelity init").
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.engines.hub import PREFIX, resolve_hub_model
from harness.errors import FidelityError, UsageError
from harness.inputs import corpus_sources
from harness.inputs.config import name_problem
from harness.inputs.head import export_head
from harness.inputs.suite import Suite, build_suite
from harness.io.atomic import atomic_write_text


@dataclass(frozen=True)
class Candidate:
    """One candidate as ``fidelity init`` writes it: its name, where it is, and the engine that runs it."""

    name: str
    path: Path
    #: ``transformers`` for a model folder, ``llamacpp`` for a ``.gguf`` file.
    engine: str


@dataclass(frozen=True)
class InitPlan:
    """What :func:`init_project` builds, from its checked inputs."""

    #: The reference as the configuration names it: a path, or the ``hf://`` id.
    reference: str
    #: The reference's local folder (the ``hf://`` snapshot).
    reference_dir: Path
    candidates: tuple[Candidate, ...]
    out: Path


def _refuse(what: str, expected: str, found: str) -> FidelityError:
    return UsageError(f"init {what}: expected {expected}, found {found}")


def check_reference(spec: str) -> Path:
    """The reference's local folder; refused unless it holds config.json, safetensors weights and tokenizer.json
    and is not itself a quantized checkpoint."""
    folder = resolve_hub_model(spec) if spec.startswith(PREFIX) else Path(spec)
    if not folder.is_dir():
        raise _refuse(f"--reference {spec}", "a model folder (config.json + *.safetensors) or hf://org/name",
                      "no such folder" if not folder.exists() else "a file")
    if not (folder / "config.json").is_file():
        raise _refuse(f"--reference {spec}", "config.json (the model's configuration)", f"none in {folder}")
    try:
        cfg = json.loads((folder / "config.json").read_text("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _refuse(f"--reference {spec}", "config.json as JSON", f"{type(e).__name__}: {e}") from None
    if isinstance(cfg, dict) and cfg.get("quantization_config"):
        method = cfg["quantization_config"].get("quant_method", "?") if isinstance(cfg["quantization_config"], dict) else "?"
        raise _refuse(f"--reference {spec}", "the unquantized BF16 original",
                      f"a quantized checkpoint (config.json quantization_config, quant_method {method}): "
                      "give it as a --candidate")
    if not (folder / "tokenizer.json").is_file():
        raise _refuse(f"--reference {spec}", "tokenizer.json (the suite is tokenized with it)", f"none in {folder}")
    if not any(folder.glob("*.safetensors")):
        raise _refuse(f"--reference {spec}", "safetensors weights (*.safetensors)", f"none in {folder}")
    return folder


def check_candidates(specs: list[str], reference_dir: Path) -> tuple[Candidate, ...]:
    """Each ``[NAME=]PATH``: a model folder (config.json) or a ``.gguf`` file; names unique and usable as file names."""
    if not specs:
        raise _refuse("--candidate", "at least one candidate (a model folder or a .gguf file)", "none")
    out: list[Candidate] = []
    for spec in specs:
        name, sep, where = spec.partition("=")
        path = Path(where if sep else spec)
        name = name if sep else (path.stem if path.suffix == ".gguf" else path.name)
        if path.is_file() and path.suffix == ".gguf":
            engine = "llamacpp"
        elif path.is_dir() and (path / "config.json").is_file():
            engine = "transformers"
        elif path.is_dir():
            raise _refuse(f"--candidate {spec}", "a model folder with config.json, or a .gguf file", f"no config.json in {path}")
        else:
            raise _refuse(f"--candidate {spec}", "a model folder with config.json, or a .gguf file",
                          "no such file or folder" if not path.exists() else f"a {path.suffix or 'extension-less'} file")
        if path.resolve() == reference_dir.resolve():
            raise _refuse(f"--candidate {spec}", "a model other than the reference", "the reference itself")
        problem = name_problem(name)
        if problem:  # the configuration's own rule (load_config)
            raise _refuse(f"--candidate {spec}", "a name of letters, digits, '.', '_', '+' that is a portable file name "
                          "(give NAME=PATH)", f"{name!r} ({problem})")
        if any(c.name == name for c in out):
            raise _refuse(f"--candidate {spec}", "unique candidate names (give NAME=PATH)", f"{name!r} twice")
        out.append(Candidate(name, path, engine))
    return tuple(out)


def gather_corpus(paths: list[Path], into: Path) -> Path:
    """A corpus folder: ``paths`` if it is one folder, else the text files (and folders' files) copied into ``into``;
    a file that is not UTF-8 text is refused, naming it."""
    if not paths:
        raise _refuse("--corpus", "text files or folders (or --from-dataset SOURCE)", "none")
    for p in paths:
        if not p.exists():
            raise _refuse(f"--corpus {p}", "a text file or a folder of them", "no such file or folder")
    if len(paths) == 1 and paths[0].is_dir():
        return paths[0]
    into.mkdir(parents=True)
    for p in paths:
        for f in sorted(p.rglob("*") if p.is_dir() else [p]):
            if not f.is_file():
                continue
            try:
                f.read_bytes().decode("utf-8")
            except UnicodeDecodeError as e:
                raise _refuse(f"--corpus {f}", "UTF-8 text", f"undecodable bytes at offset {e.start}") from None
            target = into / (p.name / f.relative_to(p) if p.is_dir() else Path(f.name))  # a folder keeps its name
            if target.exists():
                raise _refuse(f"--corpus {f}", "documents with distinct names", f"a second {target.name}")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, target)
    return into


def _rel(path: Path, base: Path) -> str:
    """``path`` as the configuration names it: relative to the configuration's folder."""
    return Path(os.path.relpath(path.resolve(), base.resolve())).as_posix()


def render_config(plan: InitPlan, suite: Suite) -> str:
    """The commented fidelity.toml of a new project (paths relative to the file)."""
    out = plan.out
    ref = plan.reference if plan.reference.startswith(PREFIX) else _rel(plan.reference_dir, out)
    lines = [
        "# Written by `fidelity init`. Run it:     pytest fidelity.toml",
        "# The first run captures the reference once, scores every candidate x shard and prints the ladder;",
        "# record what it measured as the baselines (then commit baselines/):",
        "#                                        pytest fidelity.toml --fidelity-update-baselines",
        "# Keys: docs/commands.md (\"fidelity init\") and the configuration reference in docs/.",
        "",
        "[suite]",
        f'path = "suite"                 # {suite.n_contexts} contexts x {suite.n_ctx} tokens, {suite.n_shards} shards '
        "(fidelity suite show suite)",
        "",
        "[reference]",
        'name = "bf16"',
        f'model = "{ref}"',
        'store = "reference"             # the reference\'s hidden states: captured by the first run',
        'head = "lm_head.safetensors"    # the shared BF16 LM head every candidate is scored through',
        "",
        "[settings]",
        'cache_dir = ".fidelity-cache"   # live candidates\' captures, keyed by their identity',
        'baselines = "baselines"         # one <candidate>.json per candidate: pytest ... --fidelity-update-baselines',
        "n_boot = 10000                  # bootstrap replicates per interval",
    ]
    for c in plan.candidates:
        lines += ["", "[[candidates]]", f'name = "{c.name}"', f'model = "{_rel(c.path, out)}"']
        if c.engine != "transformers":
            lines.append(f'engine = "{c.engine}"            # needs: pip install \'fidelity-harness[llamacpp]\'')
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class SuiteShape:
    """The suite ``fidelity init`` builds: tokens per context, contexts, shards, the selection seed."""

    n_ctx: int = 512
    contexts: int = 64
    shards: int = 4
    seed: int = 0


def init_project(reference: str, candidates: list[str], out: Path, *, corpus: list[Path] | None = None,
                 from_dataset: Path | None = None, text_column: str = "text", license: str | None = None,
                 shape: SuiteShape = SuiteShape(), progress: Callable[[str], None] | None = None) -> Path:
    """Check the inputs, then build ``out``/suite, ``out``/lm_head.safetensors and ``out``/fidelity.toml; returns
    the configuration's path. ``out`` must be new or empty; ``progress`` receives one line per step."""
    say = progress or (lambda _line: None)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise _refuse(f"--out {out}", "a new or empty folder", "a file" if not out.is_dir() else "a folder with files in it")
    if (corpus is None) == (from_dataset is None):
        raise _refuse("--corpus/--from-dataset", "exactly one of them", "both" if corpus else "neither")
    ref_dir = check_reference(reference)
    cands = check_candidates(candidates, ref_dir)
    plan = InitPlan(reference, ref_dir, cands, out)
    out.mkdir(parents=True, exist_ok=True)
    if from_dataset is not None:
        made = corpus_sources.from_datasets(from_dataset, out / "corpus", text_column=text_column, licence=license)
        folder, record = made.folder, made.record
    else:
        folder, record = gather_corpus(list(corpus or []), out / "corpus"), None
    say(f"suite: {shape.contexts} contexts x {shape.n_ctx} tokens in {shape.shards} shards from {folder}")
    suite = build_suite(folder, ref_dir / "tokenizer.json", shape.n_ctx, shape.contexts, shape.shards, shape.seed,
                        out / "suite", licence=license, corpus_source=record)
    say(f"head: {out / 'lm_head.safetensors'} from {ref_dir}")
    export_head(ref_dir, out / "lm_head.safetensors")
    config = out / "fidelity.toml"
    atomic_write_text(config, render_config(plan, suite))
    return config
