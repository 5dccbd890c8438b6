"""The project configuration file, ``fidelity.toml``: :func:`load_config` -> :class:`FidelityConfig`.

It names the suite (``[suite]``), the reference (``[reference]``: capture store, shared head, and the model
that captures a missing store), the settings (``[settings]``), the candidates to score (``[[candidates]]``,
each with its engine and ``[candidates.options]``), paired comparisons (``[[pairs]]``) and the published
card's inputs (``[card]``). Instead of ``[suite]`` and ``[reference]``, ``[dataset] path`` takes all three
inputs from a reference dataset, or from a folder in the published fidelity-suite layout (docs/interchange.md).
Every key is validated on load; an error names the file and the key. The file, annotated key by key:
docs/configuration.md.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.engines.hub import resolve_hub_model
from harness.engines.option_specs import validate_options
from harness.engines.registry import engine_names, get_engine
from harness.errors import FidelityError
from harness.inputs.dataset_layout import dataset_inputs
from harness.inputs.interchange_layout import CAPTURE_MANIFEST, LAYOUT, looks_like, scan_layout

#: A candidate name: letters, digits, ``_ . +`` (no ``-``: pairs are named ``<a>-vs-<b>``).
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+]*$")
#: A candidate tag: a word ``pytest -k`` can select (letters, digits, ``_ . + -``; not ``and``, ``or``, ``not``).
TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_K_OPERATORS = {"and", "or", "not"}


class ConfigError(FidelityError):
    """``fidelity.toml`` is malformed: the message names the file and the key."""


@dataclass(frozen=True)
class CandidateConfig:
    """One candidate: a live model (``model``) or a stored capture (``store``, replay)."""

    name: str
    engine: str
    model: Path | None
    store: Path | None
    head: Path | None
    size_bytes: int | None
    tags: tuple[str, ...]
    #: Engine options (``[candidates.options]``), validated against the engine's option table; passed to its
    #: ``load`` and recorded in the capture's engine identity. Empty: the engine's defaults.
    options: dict[str, Any] = field(default_factory=dict, hash=False)
    #: What a live candidate's run keeps: ``"store"`` (the default: its hidden states are written to a capture
    #: store in the cache, then scored) or ``"scores"`` (scored while captured, tile by tile in memory: only the
    #: per-position scores are kept; :mod:`harness.run.live_scores`).
    keep: str = "store"


@dataclass(frozen=True)
class PairConfig:
    """A declared paired comparison ``a`` versus ``b`` with an equivalence margin on mean KLD (nats)."""

    a: str
    b: str
    #: The margin as written: nats (``margin_kind`` ``absolute``), a fraction of the better candidate's mean KLD
    #: (``relative``, from ``"20%"``) or a multiple of the reference's precision floor (``floor``, from ``"2x floor"``).
    margin: float
    #: Optional expected verdict (``equivalent``, ``A better``, ``B better``): the pair's case fails when it differs.
    expect: str | None = None
    #: ``absolute``, ``relative`` or ``floor`` (see ``margin``)
    margin_kind: str = "absolute"


@dataclass(frozen=True)
class ReferenceConfig:
    """The BF16 reference: its capture store, the shared head, and optionally the model."""

    name: str
    store: Path
    head: Path
    model: Path | None


#: A Hugging Face Hub repository id (``org/name``).
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")
#: A licence identifier as the Hub writes them (``apache-2.0``, ``mit``, ``cc-by-4.0``, ``other``).
LICENSE_RE = re.compile(r"^[a-z0-9][a-z0-9.+-]*$")


@dataclass(frozen=True)
class CardConfig:
    """``[card]``: metadata of the published set's model card (``fidelity publish``), both optional.

    base_model: the Hub id of the BF16 original the candidates were made from; the card then says
    ``base_model: <id>`` and ``base_model_relation: quantized``.
    license: the candidates' licence id (the Hub's spelling); absent: ``unknown``.
    """

    base_model: str | None = None
    license: str | None = None


@dataclass(frozen=True)
class FidelityConfig:
    """A validated ``fidelity.toml``. Relative paths are resolved against the file's folder."""

    path: Path
    suite: Path
    reference: ReferenceConfig
    candidates: tuple[CandidateConfig, ...]
    pairs: tuple[PairConfig, ...] = ()
    cache_dir: Path = field(default=Path(".fidelity-cache"))
    baselines: Path = field(default=Path("fidelity_tests/baselines"))
    n_boot: int = 10_000
    #: ``[settings] score_cache``: keep each candidate x shard's scored positions and summary across runs
    #: (``<cache_dir>/scores/``, ``<cache_dir>/summaries/``) and read them on a rerun of unchanged inputs;
    #: False (or ``--fidelity-no-score-cache`` / ``fidelity ladder --no-score-cache``): score and summarize
    #: every case, reading and writing neither folder (docs/performance.md, "Reruns").
    score_cache: bool = True
    #: The reference dataset folder (``[dataset] path``) that supplied suite, reference and head, or None.
    dataset: Path | None = None
    #: Shards the reference holds (a dataset's ``reference.shards``); None: every shard of the suite.
    reference_shards: tuple[int, ...] | None = None
    #: The layout of ``dataset``: ``fidelity.dataset/1`` (``fidelity dataset build``) or the published
    #: fidelity-suite layout (:data:`harness.inputs.interchange_layout.LAYOUT`), read in place; None without a dataset.
    dataset_layout: str | None = None
    #: ``[card]``: the published model card's base model and licence.
    card: CardConfig = field(default_factory=CardConfig)

    def candidate(self, name: str) -> CandidateConfig:
        """The candidate called ``name``; an unknown name suggests near matches."""
        for c in self.candidates:
            if c.name == name:
                return c
        names = [c.name for c in self.candidates]
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(names)}"
        raise ConfigError(f"{self.path}: unknown candidate {name!r}{hint}")


_TOP_KEYS = {"suite", "reference", "dataset", "settings", "candidates", "pairs", "card"}
_CARD_KEYS = {"base_model", "license"}
_DATASET_KEYS = {"path", "head"}
_SUITE_KEYS = {"path"}
_REF_KEYS = {"name", "model", "store", "head"}
_SETTINGS_KEYS = {"cache_dir", "baselines", "n_boot", "score_cache"}
_CAND_KEYS = {"name", "engine", "model", "store", "head", "size_bytes", "tags", "options", "keep"}
#: ``keep`` values: what a live candidate's run keeps (:attr:`CandidateConfig.keep`).
KEEP = ("store", "scores")
_PAIR_KEYS = {"a", "b", "margin", "expect"}


class _Reader:
    """Typed access to one TOML table, with errors that name the file and the dotted key."""

    def __init__(self, path: Path, table: Any, where: str, allowed: set[str]) -> None:
        self.path = path
        self.where = where
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [{where}] must be a table, found {type(table).__name__}")
        self.table: dict[str, Any] = table
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, sorted(allowed), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f" (allowed: {', '.join(sorted(allowed))})"
                raise ConfigError(f"{path}: unknown key {where}.{key}{hint}")

    def _key(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def string(self, key: str, *, required: bool = True) -> str | None:
        value = self.table.get(key)
        if value is None:
            if required:
                raise ConfigError(f"{self.path}: missing required key {self._key(key)}")
            return None
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{self.path}: {self._key(key)} must be a non-empty string, found {value!r}")
        return value

    def path_(self, key: str, *, required: bool = True) -> Path | None:
        value = self.string(key, required=required)
        if value is None:
            return None
        p = Path(value)
        return p if p.is_absolute() else (self.path.parent / p)

    def model(self, key: str) -> Path | None:
        """A model: a path (relative to the file), or ``hf://org/repo@revision`` resolved to its snapshot in the
        local Hugging Face cache (:mod:`harness.engines.hub`; downloaded unless cached or ``HF_HUB_OFFLINE``)."""
        value = self.string(key, required=False)
        if value is None or not value.startswith("hf://"):
            return self.path_(key, required=False)

        try:
            return resolve_hub_model(value)
        except FidelityError as exc:
            raise ConfigError(f"{self.path}: {self._key(key)}: {exc}") from None

    def integer(self, key: str, default: int | None, *, minimum: int = 0) -> int | None:
        value = self.table.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{self.path}: {self._key(key)} must be an integer >= {minimum}, found {value!r}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.table.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{self.path}: {self._key(key)} must be true or false, found {value!r}")
        return value

    def number(self, key: str, default: float) -> float:
        value = self.table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ConfigError(f"{self.path}: {self._key(key)} must be a number >= 0, found {value!r}")
        return float(value)


#: Engines whose model is one file (the others take a Hugging Face folder).
_FILE_ENGINES = {"llamacpp": "a GGUF file"}


def _check_model_path(path: Path, where: str, engine: str, model: Path) -> None:
    """The model is the kind of path its engine loads: a GGUF file for ``llamacpp``, else a folder with
    ``config.json`` (a Hugging Face checkpoint); anything else is named here, before any capture."""
    if engine in _FILE_ENGINES:
        if not model.is_file():
            raise ConfigError(f"{path}: {where}: engine {engine!r} expects {_FILE_ENGINES[engine]}, found a folder: {model}")
        return
    if not model.is_dir():
        hint = '; a GGUF file needs engine = "llamacpp"' if model.suffix.lower() == ".gguf" else ""
        raise ConfigError(f"{path}: {where}: engine {engine!r} expects a model folder (config.json + *.safetensors), "
                          f"found a file: {model}{hint}")
    if not (model / "config.json").is_file():
        raise ConfigError(f"{path}: {where}: expected a Hugging Face model folder holding config.json, "
                          f"found none in {model}")


#: The longest candidate name: it becomes ``<report dir>/<name>/``, ``paired/<a>-vs-<b>.json`` and staged
#: ``.<a>-vs-<b>.json.<random>.tmp`` files, which must stay under the usual 255-byte limit of a file name.
MAX_NAME = 100
#: What the harness writes beside the candidates' folders in a report folder (a candidate of one of these
#: names would collide with it).
REPORT_FOLDER_NAMES = frozenset({
    "ladder.json", "ladder.md", "tails.json", "tails.md", "tails.png", "window.json", "window.md",
    "adaptive.json", "adaptive.md", "cross_engine.json", "cross_engine.md", "paired", "attribution",
    "fidelity-run.json", "precision_floor.json", "precision_floor.md",
})
#: Names Windows reserves for devices, with or without an extension (``con``, ``nul.txt``).
_DEVICE_NAMES = frozenset({"con", "prn", "aux", "nul", *(f"com{i}" for i in range(1, 10)), *(f"lpt{i}" for i in range(1, 10))})


def portable_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a folder name on every system the reports travel to, or None."""
    if len(name.encode("utf-8")) > MAX_NAME:
        return f"{len(name.encode('utf-8'))} bytes, at most {MAX_NAME}"
    if name.lower() in REPORT_FOLDER_NAMES:
        return f"the report folder's own {name.lower()!r}"
    if name.split(".")[0].lower() in _DEVICE_NAMES:
        return "a name Windows reserves for a device"
    if name.endswith("."):
        return "a name ending in '.' (Windows drops it)"
    return None


def name_problem(name: str, *, reference: bool = False) -> str | None:
    """Why ``name`` breaks the rule of :func:`check_name` (``-`` allowed for a reference only), or None."""
    if not (TAG_RE if reference else NAME_RE).match(name):
        return "not letters, digits, '.', '_', '+'" + (", '-'" if reference else "") + " starting with a letter or digit"
    return portable_name_problem(name)


def check_name(path: Path, where: str, name: str, *, reference: bool = False) -> str:
    """The one rule for candidate and reference names (they become pytest ids, folder names and text in
    every report): letters, digits, ``_ . +``, starting with a letter or digit, and a portable file name.
    The reference may also hold ``-`` (``Qwen3-8B``, the published layout's ``hidden-Qwen3-8B``): it never
    takes part in the ``<a>-vs-<b>`` names of paired comparisons, where a candidate's ``-`` would be ambiguous."""
    if not (TAG_RE if reference else NAME_RE).match(name):
        allowed = "'_', '.', '+', '-'" if reference else "'_', '.', '+'"
        raise ConfigError(f"{path}: {where}: expected letters, digits, {allowed} starting with a letter or digit "
                          f"(it becomes a pytest id, a folder name and text in the reports), found {name!r}")
    problem = portable_name_problem(name)
    if problem:
        raise ConfigError(f"{path}: {where}: expected a portable file name, found {name!r} ({problem})")
    return name


def _candidate(path: Path, raw: Any, i: int) -> CandidateConfig:
    r = _Reader(path, raw, f"candidates[{i}]", _CAND_KEYS)
    name = r.string("name")
    assert name is not None
    check_name(path, f"candidates[{i}].name", name)
    engine = r.string("engine", required=False) or "transformers"

    try:
        get_engine(engine)
    except FidelityError:
        close = difflib.get_close_matches(engine, engine_names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"{path}: candidates[{i}].engine: expected one of {', '.join(engine_names())}, found {engine!r}{hint}"
        ) from None
    model = r.model("model")
    store = r.path_("store", required=False)
    if (model is None) == (store is None):
        raise ConfigError(f"{path}: candidate {name!r} needs exactly one of 'model' (live) or 'store' (replay)")
    if model is not None and not model.exists():  # caught here, before any capture or the ladder
        raise ConfigError(f"{path}: candidates[{i}].model of {name!r}: expected an existing model folder or file, "
                          f"found no such path: {model}")
    if model is not None:
        _check_model_path(path, f"candidates[{i}].model of {name!r}", engine, model)

    # a published capture folder (capture-manifest.json) is read in place when the dataset is in the published layout
    if store is not None and not (store / "capture.json").is_file() and not (store / CAPTURE_MANIFEST).is_file():
        raise ConfigError(f"{path}: candidates[{i}].store of {name!r}: expected a capture store folder holding "
                          f"capture.json, found {'no such path' if not store.exists() else 'no capture.json'}: {store}")
    tags = r.table.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ConfigError(f"{path}: candidates[{i}].tags must be a list of strings, found {tags!r}")
    for t in tags:  # every tag is a keyword of the candidate's cases (harness/plugin/keywords.py)
        if not TAG_RE.match(t) or t in _K_OPERATORS:
            raise ConfigError(f"{path}: candidates[{i}].tags of {name!r}: expected words pytest -k can select "
                              f"(letters, digits, _ . + -; not and/or/not), found {t!r}")
    raw_options = r.table.get("options")
    if raw_options is not None and store is not None:
        raise ConfigError(f"{path}: candidates[{i}].options of {name!r}: options configure an engine running a live model; "
                          "a stored capture was taken with the options recorded in its header")

    try:
        options = validate_options(engine, getattr(get_engine(engine), "options", {}), raw_options)
    except FidelityError as e:
        raise ConfigError(f"{path}: candidates[{i}].options of {name!r}: {e}") from None
    return CandidateConfig(
        name=name,
        engine=engine,
        model=model,
        store=store,
        head=r.path_("head", required=False),
        size_bytes=r.integer("size_bytes", None, minimum=1),
        tags=tuple(tags),
        options=options,
        keep=_keep(path, r, i, name, engine, store),
    )


def _keep(path: Path, r: _Reader, i: int, name: str, engine: str, store: Path | None) -> str:
    """``candidates[i].keep``: ``store`` or ``scores``; ``scores`` only for a live model whose engine captures
    hidden states (the scorer forms its logits through the shared head as the capture runs)."""
    keep = r.string("keep", required=False) or "store"
    where = f"{path}: candidates[{i}].keep of {name!r}"
    if keep not in KEEP:
        raise ConfigError(f"{where}: expected one of {', '.join(repr(k) for k in KEEP)}, found {keep!r}")
    if keep == "scores" and store is not None:
        raise ConfigError(f"{where}: expected 'store' for a stored capture (it is read, not captured), found 'scores'")
    kinds = getattr(get_engine(engine), "kinds", ("hidden_states",))
    if keep == "scores" and kinds[0] != "hidden_states":
        raise ConfigError(f"{where}: expected an engine that captures hidden states for 'scores', found engine "
                          f"{engine!r}, which captures {kinds[0]}")
    return keep


def _card(path: Path, raw: Any) -> CardConfig:
    r = _Reader(path, raw, "card", _CARD_KEYS)
    base, lic = r.string("base_model", required=False), r.string("license", required=False)
    if base is not None and not HUB_ID_RE.match(base):
        raise ConfigError(f"{path}: card.base_model: expected a Hugging Face Hub id like 'Qwen/Qwen3-8B', found {base!r}")
    if lic is not None and not LICENSE_RE.match(lic):
        raise ConfigError(f"{path}: card.license: expected a licence id as the Hub spells it (lower case, like "
                          f"'apache-2.0' or 'mit'), found {lic!r}")
    return CardConfig(base_model=base, license=lic)


_MARGIN_WANT = ('a finite number > 0 (nats), a percentage of the better candidate\'s mean KLD ("20%") or a multiple '
                'of the precision floor ("2x floor")')
_FLOOR_MARGIN = re.compile(r"^\s*([0-9.eE+-]+)\s*[x×]\s*floor\s*$")
_PERCENT_MARGIN = re.compile(r"^\s*([0-9.eE+-]+)\s*%\s*$")


def _margin(raw: object, where: str) -> tuple[str, float]:
    """``(kind, value)`` of a pair's ``margin`` (:class:`PairConfig`); a ConfigError naming it otherwise."""
    kind, value = "absolute", None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        value = float(raw)
    elif isinstance(raw, str) and (m := _PERCENT_MARGIN.match(raw) or _FLOOR_MARGIN.match(raw)):
        kind = "relative" if raw.strip().endswith("%") else "floor"
        try:
            value = float(m.group(1)) / (100.0 if kind == "relative" else 1.0)
        except ValueError:
            value = None
    if value is None or not 0.0 < value < math.inf:
        raise ConfigError(f"{where}: expected {_MARGIN_WANT}, found {'nothing' if raw is None else repr(raw)}")
    return kind, value


def load_config(path: str | Path) -> FidelityConfig:
    """Read and validate ``fidelity.toml``; raises :class:`ConfigError` naming the file and key."""
    path = Path(path)
    raw = _read_toml(path)
    top = _Reader(path, raw, "", _TOP_KEYS)
    source = _from_dataset(path, raw) if "dataset" in raw else _from_suite(path, raw)
    settings = _Reader(path, raw.get("settings", {}), "settings", _SETTINGS_KEYS)
    candidates = _candidates(path, top)
    seen = {c.name for c in candidates}
    _check_reference_name(path, source, candidates)
    pairs = _pairs(path, top, seen)
    cfg = FidelityConfig(
        path=path,
        suite=source.suite,  # type: ignore[arg-type]  # _Reader.path_ raises when a required path is missing
        reference=source.reference,
        candidates=candidates,
        pairs=pairs,
        cache_dir=settings.path_("cache_dir", required=False) or path.parent / ".fidelity-cache",
        baselines=settings.path_("baselines", required=False) or path.parent / "fidelity_tests" / "baselines",
        n_boot=settings.integer("n_boot", 10_000, minimum=100) or 10_000,
        score_cache=settings.boolean("score_cache", True),
        dataset=source.dataset,
        reference_shards=source.held,
        dataset_layout=source.layout,
        card=_card(path, raw.get("card", {})),
    )
    return cfg


def _read_toml(path: Path) -> dict[str, Any]:
    """The file's TOML document; a missing file or invalid TOML is a :class:`ConfigError`."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file not found (pass --fidelity-config PATH)") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


@dataclass(frozen=True)
class _Source:
    """Where a configuration's suite and reference come from: ``[suite]`` + ``[reference]``, or a dataset
    (``dataset``: its folder; ``held``: the shards it holds a reference for; ``layout``: which layout it is)."""

    dataset: Path | None
    suite: Path | None
    reference: ReferenceConfig
    held: tuple[int, ...] | None = None
    layout: str | None = None


def _from_dataset(path: Path, raw: dict[str, Any]) -> _Source:
    """``[dataset]``: the suite, the reference and the head of a fidelity dataset or of the published layout."""
    given = [f"[{k}]" for k in ("suite", "reference") if k in raw]
    if given:
        raise ConfigError(f"{path}: [dataset] supplies the suite, the reference and the head: expected no "
                          f"{' or '.join(given)} beside it, found {' and '.join(given)}")
    ds_reader = _Reader(path, raw["dataset"], "dataset", _DATASET_KEYS)
    dataset = ds_reader.path_("path")
    ds_head = ds_reader.path_("head", required=False)
    assert dataset is not None

    if not (dataset / "dataset.json").is_file() and looks_like(dataset):  # the published layout, read in place
        try:
            scan = scan_layout(dataset, ds_head)
        except FidelityError as exc:
            raise ConfigError(f"{path}: dataset.path: {exc}") from None
        reference = ReferenceConfig(name=scan.reference_name, store=scan.reference, head=scan.head, model=None)
        return _Source(dataset, scan.suite, reference, scan.shards, LAYOUT)
    if ds_head is not None:
        raise ConfigError(f"{path}: dataset.head: expected no head beside a fidelity dataset (it holds its own), "
                          f"found {ds_head}")
    try:
        inputs = dataset_inputs(dataset)
    except FidelityError as exc:
        raise ConfigError(f"{path}: dataset.path: {exc}") from None
    reference = ReferenceConfig(name=inputs.reference_name, store=inputs.reference, head=inputs.head, model=None)
    return _Source(dataset, inputs.suite, reference, inputs.shards, "fidelity.dataset/1")


def _from_suite(path: Path, raw: dict[str, Any]) -> _Source:
    """``[suite]`` and ``[reference]``: the suite folder and the reference."""
    suite = _Reader(path, raw.get("suite", {}), "suite", _SUITE_KEYS).path_("path")
    ref = _Reader(path, raw.get("reference", {}), "reference", _REF_KEYS)
    reference = ReferenceConfig(
        name=ref.string("name", required=False) or "reference",
        store=ref.path_("store"),  # type: ignore[arg-type]
        head=ref.path_("head"),  # type: ignore[arg-type]
        model=ref.model("model"),
    )
    return _Source(None, suite, reference)


def _candidates(path: Path, top: _Reader) -> tuple[CandidateConfig, ...]:
    """``[[candidates]]``: at least one, names unique (also when letter case is ignored)."""
    raw_cands = top.table.get("candidates", [])
    if not isinstance(raw_cands, list) or not raw_cands:
        raise ConfigError(f"{path}: expected at least one [[candidates]] table, found none")
    candidates = tuple(_candidate(path, c, i) for i, c in enumerate(raw_cands))
    seen: set[str] = set()
    folded: dict[str, str] = {}
    for c in candidates:
        if c.name in seen:
            raise ConfigError(f"{path}: candidate name {c.name!r} appears twice")
        if c.name.lower() in folded:  # one folder on a case-insensitive file system (macOS, Windows)
            raise ConfigError(f"{path}: candidate names: expected names that differ in more than letter case, "
                              f"found {folded[c.name.lower()]!r} and {c.name!r}")
        seen.add(c.name)
        folded[c.name.lower()] = c.name
    return candidates


def _check_reference_name(path: Path, source: _Source, candidates: tuple[CandidateConfig, ...]) -> None:
    """The reference's name follows the name rule and is no candidate's name or tag (``-k`` selects by both)."""
    reference, dataset = source.reference, source.dataset
    seen = {c.name for c in candidates}
    check_name(path, "reference.name" if dataset is None else f"reference name (from the dataset {dataset})", reference.name,
               reference=True)
    if reference.name in seen:
        raise ConfigError(f"{path}: reference.name {reference.name!r} is also a candidate name")
    for c in candidates:  # a tag selects with -k as a name does: one word may not mean two things
        for t in c.tags:
            if (t in seen and t != c.name) or t == reference.name:  # its own name selects only itself
                whose = "the reference's name" if t == reference.name else f"the name of candidate {t!r}"
                raise ConfigError(f"{path}: candidates tags of {c.name!r}: expected tags that are no other candidate's or the "
                                  f"reference's name (-k {t} would select both), found {t!r}, {whose}")


def _pairs(path: Path, top: _Reader, seen: set[str]) -> tuple[PairConfig, ...]:
    """``[[pairs]]``: two different declared candidates each, an ``expect`` among the verdicts, a margin."""
    raw_pairs = top.table.get("pairs", [])
    if not isinstance(raw_pairs, list):
        raise ConfigError(f"{path}: pairs must be an array of tables, found {type(raw_pairs).__name__}")
    pairs = []
    for i, p in enumerate(raw_pairs):
        pr = _Reader(path, p, f"pairs[{i}]", _PAIR_KEYS)
        a, b = pr.string("a"), pr.string("b")
        assert a is not None and b is not None
        for side in (a, b):
            if side not in seen:
                raise ConfigError(f"{path}: pairs[{i}] names unknown candidate {side!r}")
        expect = pr.string("expect", required=False)
        if expect is not None and expect not in ("equivalent", "A better", "B better", "inconclusive"):
            raise ConfigError(
                f"{path}: pairs[{i}].expect: expected one of 'equivalent', 'A better', 'B better', 'inconclusive', "
                f"found {expect!r}"
            )
        if a == b:
            raise ConfigError(f"{path}: pairs[{i}]: expected two different candidates, found a = b = {a!r}")
        kind, margin = _margin(pr.table.get("margin"), f"{path}: pairs[{i}].margin")
        pairs.append(PairConfig(a=a, b=b, margin=margin, expect=expect, margin_kind=kind))
    return tuple(pairs)
