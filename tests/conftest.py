"""Shared test helpers: a tiny byte-level BPE tokenizer, a small generated corpus, a tiny random
Qwen3 checkpoint and a suite cut from them. Generic on purpose; other test modules reuse them.

Everything is built once per session in a temporary folder, with fixed seeds.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# pytester's in-process runs (runpytest) snapshot sys.modules and drop what a run imported; torch (and the
# native libraries it loads) cannot be imported a second time in one process (SystemError / segfault). Imported
# here, before any in-process run, it is part of every snapshot whatever the test order.
import torch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


class NoFixtureNamespaces:
    """A meta path finder that keeps a folder of ``fixtures/`` from being imported as a namespace package.

    Some tests put ``fixtures/`` on ``sys.path`` to import its builders (``make_*.py``); its data folders
    (``gguf/``, ``model/``, ...) hold no ``__init__.py``, so without this ``import gguf`` with the ``gguf``
    package absent would resolve to the folder ``fixtures/gguf`` and fail later with ``AttributeError``
    instead of skipping. A top-level name found nowhere but as such a folder is a ModuleNotFoundError."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        import importlib.machinery

        if path is not None or "." in fullname or not (FIXTURES / fullname).is_dir() or (FIXTURES / fullname / "__init__.py").exists():
            return None
        others = [p for p in sys.path if Path(p or ".").resolve() != FIXTURES]
        spec = importlib.machinery.PathFinder.find_spec(fullname, others)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {fullname!r} (the folder fixtures/{fullname} is data, not a package)",
                                      name=fullname)
        return spec


if not any(isinstance(f, NoFixtureNamespaces) for f in sys.meta_path):
    sys.meta_path.insert(0, NoFixtureNamespaces())

TINY_VOCAB = 300
TINY_HIDDEN = 32
_WORDS = (
    "alpha beta gamma delta model token weight layer head norm value key query softmax "
    "divergence quantize scale group block tensor matrix vector entropy signal noise"
).split()
_CODE = ["def f(x):", "    return x + 1", "for i in range(10):", "    print(i)", "class A:", "    pass", "import os"]


def make_corpus(root: Path, n_docs_per_stratum: int = 4, words_per_doc: int = 300, seed: int = 0) -> Path:
    """Write a small corpus with strata ``prose/``, ``code/`` and one root document, plus a
    LICENSE and a hidden file that the suite builder must skip. Returns ``root``."""
    rng = random.Random(seed)
    (root / "prose").mkdir(parents=True, exist_ok=True)
    (root / "code").mkdir(parents=True, exist_ok=True)
    for i in range(n_docs_per_stratum):
        words = [rng.choice(_WORDS) for _ in range(words_per_doc)]
        (root / "prose" / f"doc{i}.txt").write_text(" ".join(words) + "\n", "utf-8")
        lines = [rng.choice(_CODE) for _ in range(words_per_doc // 3)]
        (root / "code" / f"file{i}.md").write_text("\n".join(lines) + "\n", "utf-8")
    (root / "readme.rst").write_text(" ".join(rng.choice(_WORDS) for _ in range(words_per_doc)), "utf-8")
    (root / "LICENSE").write_text("do not use me " * 100, "utf-8")
    (root / ".hidden.txt").write_text("hidden " * 100, "utf-8")
    return root


def make_tokenizer(path: Path, corpus: Path, vocab_size: int = TINY_VOCAB) -> Path:
    """Train a byte-level BPE tokenizer of exactly ``vocab_size`` ids on ``corpus``; write tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    files = sorted(str(p) for p in corpus.rglob("*") if p.is_file() and not p.name.startswith("."))
    tok.train(files, trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def make_tiny_model(path: Path, vocab_size: int = TINY_VOCAB, hidden: int = TINY_HIDDEN, seed: int = 0, **overrides: Any) -> Path:
    """Save a tiny random ``Qwen3ForCausalLM`` (2 layers, tied embeddings, bf16 safetensors) at ``path``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**cfg)).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="session")
def tiny_model_factory() -> Any:
    """``make_tiny_model`` as a fixture, so test modules need not import conftest by name."""
    return make_tiny_model


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small generated corpus (strata prose, code, root)."""
    return make_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory, tiny_corpus: Path) -> Path:
    """Path of a tokenizer.json with ``TINY_VOCAB`` ids trained on ``tiny_corpus``."""
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json", tiny_corpus)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder of a tiny random Qwen3 checkpoint (hidden 32, vocab 300, tied, bf16 safetensors)."""
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen3")


@pytest.fixture(scope="session")
def tiny_suite(tmp_path_factory: pytest.TempPathFactory, tiny_corpus: Path, tiny_tokenizer: Path) -> Path:
    """Folder of a suite: n_ctx 32, 6 contexts, 3 shards, seed 0."""
    from harness.inputs.suite import build_suite

    out = tmp_path_factory.mktemp("suites") / "suite"
    build_suite(tiny_corpus, tiny_tokenizer, n_ctx=32, n_contexts=6, n_shards=3, seed=0, out=out)
    return out


def perturb_model(src: Path, dst: Path, noise: float, seed: int) -> Path:
    """Copy a checkpoint with Gaussian noise (relative ``noise``) added to every 2-D linear weight:
    a stand-in candidate whose drift grows with ``noise``."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(str(src / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, w in weights.items():
        if w.ndim == 2 and "embed" not in name:
            w32 = w.float()
            w32 = w32 + noise * w32.abs().mean() * torch.randn(w32.shape, generator=g)
            w = w32.to(w.dtype)
        out[name] = w.contiguous()
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


FIDELITY_TOML = """\
[suite]
path = "suite"

[reference]
name = "bf16"
model = "models/reference"
store = "reference"
head = "lm_head.safetensors"

[settings]
cache_dir = ".fidelity-cache"
baselines = "baselines"
n_boot = 500

[[candidates]]
name = "good"
model = "models/good"
tags = ["noise-0.02"]

[[candidates]]
name = "bad"
model = "models/bad"
tags = ["noise-0.5"]

[[pairs]]
a = "good"
b = "bad"
margin = 0.001
"""

@pytest.fixture(scope="session")
def fidelity_project(tmp_path_factory: pytest.TempPathFactory, tiny_corpus: Path, tiny_tokenizer: Path) -> Path:
    """A complete tiny fidelity project: suite (8 contexts x 32 tokens, 4 shards), the reference
    model, its capture store and head, two perturbed candidates (``good``, ``bad``),
    and ``fidelity.toml`` (no baselines yet; the plugin collects the cases from the file). Copy it before changing it."""
    from harness.capture.loop import capture
    from harness.inputs.head import export_head
    from harness.inputs.suite import build_suite

    root = tmp_path_factory.mktemp("project")
    ref = make_tiny_model(root / "models" / "reference", seed=1)
    perturb_model(ref, root / "models" / "good", noise=0.02, seed=2)
    perturb_model(ref, root / "models" / "bad", noise=0.5, seed=3)
    suite = build_suite(tiny_corpus, tiny_tokenizer, n_ctx=32, n_contexts=8, n_shards=4, seed=0, out=root / "suite")
    export_head(ref, root / "lm_head.safetensors")
    capture("transformers", ref, suite, root / "reference", progress=False)
    (root / "fidelity.toml").write_text(FIDELITY_TOML, "utf-8")
    return root


def _reference_studentized_interval(values: Any, cluster: Any, weights: Any, level: float = 0.95,
                                    right_skewed: bool = False) -> list[float]:
    """Independent float64 implementation of the harness's 95 % studentized cluster interval of a
    token mean, from raw positions: every replicate is expanded into its resampled positions and
    its mean and cluster-robust standard error are computed directly, with plain loops (no matrix
    products, no residual expansion). Bootstrap-t, each side's quantile read at the documented level
    (docs/statistics.md) with ``C' = (sum n_c)^2 / sum n_c^2``, ``g`` the cluster residuals' skew
    (``sum e^3 / (sum e^2)^1.5``), ``x`` their excess kurtosis over C: a right-skewed statistic's upper side at
    ``0.9 a / ((1 + (se / (0.1 r))^4) (1 + 10 / C') (1 + g+ + 16 x)^2)``, its lower side at ``0.7 a min(2.4, 1 + 8 (se / r -
    0.15)+)``; any other statistic's side at ``0.8 a min(2.4, 1 + 5 g-) / ((1 + 8 / C') (1 + 3 (1 + 60 / C') g+ + 10 x)^2)``
    (``g+`` / ``g-`` the skew toward / away from that side); never below ``a / 100``;
    where one cluster holds more than half of ``sum |s_c|`` (dominance) a right-skewed statistic's upper side and any
    other statistic's both sides at ``a / 100``. Each side's quantile from
    the given draws, or when fewer than 20 / level, from the draws doubled until they hold as many: the given draws
    followed by the documented extension (uniform cluster ids from numpy's default_rng seeded by the first 8 bytes,
    little-endian, of the sha256 of the given draws, counted per replicate)."""
    import hashlib
    import math

    import numpy as np

    vals = [float(v) for v in values]
    cl = [int(c) for c in cluster]
    C = max(cl) + 1
    members: list[list[float]] = [[] for _ in range(C)]
    for v, c in zip(vals, cl):
        members[c].append(v)
    s = [math.fsum(m) for m in members]
    n = [float(len(m)) for m in members]

    def mean_se(mult: list[int]) -> tuple[float, float]:
        tot = math.fsum(w * n[c] for c, w in enumerate(mult))
        r = math.fsum(w * s[c] for c, w in enumerate(mult)) / tot
        q = math.fsum(w * (s[c] - r * n[c]) ** 2 for c, w in enumerate(mult))  # drawn cluster c, w times
        return r, math.sqrt(C / (C - 1) * q) / tot

    r, se = mean_se([1] * C)
    a = (1.0 - level) / 2.0
    c_eff = math.fsum(n) ** 2 / math.fsum(x * x for x in n)  # Kish's effective number of clusters
    e = [s[c] - r * n[c] for c in range(C)]
    m2, m3, m4 = (math.fsum(x**p for x in e) for p in (2, 3, 4))
    g = m3 / m2**1.5
    x = max(C * m4 / m2**2 - 3.0, 0.0) / C
    v = se * math.sqrt(c_eff) / abs(r)

    dominant = max(abs(x) for x in s) > 0.5 * math.fsum(abs(x) for x in s)

    def side(toward: int) -> float:
        if right_skewed and toward < 0:
            return 0.7 * a * min(2.4, 1.0 + 8.0 * max(se / abs(r) - 0.15, 0.0))
        if dominant:
            return a / 100.0
        if right_skewed:  # the upper end: relative standard error, few clusters, skewness and kurtosis
            rel = v / math.sqrt(c_eff)
            return max(0.9 * a / ((1.0 + (rel / 0.1) ** 4) * (1.0 + 10.0 / c_eff) * (1.0 + max(g, 0.0) + 16.0 * x) ** 2), a / 100.0)
        # unknown heavy side: few clusters, the skew toward this side (more weight with few clusters) and kurtosis,
        # the skew away from it raising the level (at most 2.4 a)
        light = min(2.4, 1.0 + 5.0 * max(-toward * g, 0.0))
        heavy = (1.0 + 3.0 * (1.0 + 60.0 / c_eff) * max(toward * g, 0.0) + 10.0 * x) ** 2
        return max(0.8 * a * light / ((1.0 + 8.0 / c_eff) * heavy), a / 100.0)

    a_lo, a_hi = side(-1), side(+1)
    rows = [list(map(int, row)) for row in np.asarray(weights)]
    given = len(rows)

    def rows_for(level_: float) -> int:
        k = given
        while k < 20.0 / level_ - 1e-9:
            k *= 2
        return k

    need = max(rows_for(a_lo), rows_for(a_hi))
    if given < need:
        seed = int.from_bytes(hashlib.sha256(np.ascontiguousarray(weights).tobytes()).digest()[:8], "little")
        ids = np.random.default_rng(seed).integers(0, C, size=(need - given, C), dtype=np.int64)
        for drawn in ids:
            mult = [0] * C
            for c in drawn:
                mult[int(c)] += 1
            rows.append(mult)
    ts = []
    for row in rows:
        rb, seb = mean_se([int(w) for w in row])
        ts.append((rb - r) / seb)
    lo = r - float(np.quantile(ts[: rows_for(a_lo)], 1.0 - a_lo)) * se
    hi = r - float(np.quantile(ts[: rows_for(a_hi)], a_hi)) * se
    return [max(lo, 0.0) if right_skewed else lo, hi]


def _store_kl64(p_store: Any, q_store: Any, suite: Any, head: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-position KL(P || Q) and argmax agreement over shard 0 in float64, computed here from the two
    stores' tensors (a hidden-state side through the head) with numpy's own log-softmax."""
    w = head.weight.double().numpy()
    kl, agree = [], []
    for i in suite.shard_indices(0):
        sides = []
        for st in (p_store, q_store):
            x = st.load(i).double().numpy()
            x = x if st.kind == "logits" else x @ w.T
            x = x - x.max(axis=1, keepdims=True)
            sides.append(x - np.log(np.exp(x).sum(axis=1, keepdims=True)))
        lp, lq = sides
        kl.append((np.exp(lp) * (lp - lq)).sum(axis=1))
        agree.append(lp.argmax(axis=1) == lq.argmax(axis=1))
    return np.concatenate(kl), np.concatenate(agree)


@pytest.fixture
def store_kl64() -> Any:
    """:func:`_store_kl64` (an independent float64 check of the scorer, from two capture stores)."""
    return _store_kl64


@pytest.fixture
def same_scores() -> Any:
    """``tests/fp32_bound.py``'s ``assert_same_scores``: two fp32 summation orders of the scorer agree
    within tolerances derived from the fp32 accumulation bound (not a fixed rtol that depends on the CPU)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fp32_bound", Path(__file__).with_name("fp32_bound.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.assert_same_scores


@pytest.fixture
def session_captures(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every capture a :class:`FidelitySession` starts in this test (the output folder of each), in order."""
    import harness.run.session as session_mod

    captured: list[Path] = []
    real = session_mod.capture

    def counting(*a: Any, **k: Any) -> Any:
        captured.append(Path(a[3]))
        return real(*a, **k)

    monkeypatch.setattr(session_mod, "capture", counting)
    return captured


@pytest.fixture(scope="session")
def once_per_session(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Callable[[], Any]], Any]:
    """``once(name, build)``: ``build()`` computed once per pytest session. Under pytest-xdist the first worker that
    needs it builds it and pickles it in the workers' shared base folder (written whole, then renamed), the other
    waits on the lock and reads it; alone, the session's own folder. ``name`` names the value across the suite."""
    import os
    import pickle

    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base

    def once(name: str, build: Callable[[], Any]) -> Any:
        done = shared / f"once-{name}.pickle"
        with FileLock(f"{done}.lock"):
            if not done.is_file():
                done.with_suffix(".tmp").write_bytes(pickle.dumps(build()))
                done.with_suffix(".tmp").replace(done)
        return pickle.loads(done.read_bytes())

    return once


@pytest.fixture
def reference_interval() -> Any:
    """:func:`_reference_studentized_interval` (an independent check of the bootstrap module)."""
    return _reference_studentized_interval


@pytest.fixture(scope="session")
def fidelity_run(tmp_path_factory: pytest.TempPathFactory, fidelity_project: Path,
                 once_per_session: Callable[[str, Callable[[], Any]], Any]) -> Path:
    """The tiny project after one run of its shard and tail cases with ``--fidelity-update-baselines``: baselines,
    ``reports/`` (shard reports, ladder, tails) and the candidates' captures in ``.fidelity-cache``. Copy it
    (``shutil.copytree``) before changing it. Run once per session: under pytest-xdist the workers share one folder
    (every user copies it; the tiny project is built alike on each worker, fixed seeds)."""
    import subprocess
    import sys

    def build() -> Path:
        root = tmp_path_factory.mktemp("run") / "p"
        shutil_copytree(fidelity_project, root)
        out = subprocess.run([sys.executable, "-m", "pytest", "fidelity.toml", "-q", "-p", "no:cacheprovider", "-m",
                              "fidelity or fidelity_tails", "--fidelity-update-baselines", "--fidelity-report-dir",
                              "reports"], cwd=root, capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return root

    root: Path = once_per_session("fidelity_run", build)
    return root


def manifest(store: Path) -> dict[str, Any]:
    """A capture store's ``capture.json``, parsed (tamper tests edit it)."""
    return json.loads((store / "capture.json").read_text())


def save_manifest(store: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` as a capture store's ``capture.json``."""
    (store / "capture.json").write_text(json.dumps(doc, indent=2))


def ctx(i: int) -> str:
    """The file name of a capture store's context ``i``."""
    return f"ctx-{i:06d}.safetensors"


@pytest.fixture()
def fresh_project(tmp_path: Path, fidelity_project: Path) -> Path:
    """A copy of the tiny project (its reference store included, so a test may change it) with no cache yet."""
    root = shutil_copytree(fidelity_project, tmp_path / "p")
    shutil.rmtree(root / ".fidelity-cache", ignore_errors=True)
    return root


def project_with_candidate(project: Path, root: Path, folders: tuple[str, ...], files: tuple[str, ...]) -> Path:
    """``root`` holding ``folders`` and ``files`` copied from the tiny ``project`` and ``cand/``: its ``good`` model
    captured over the suite (the store's writer lock removed, so copies of ``root`` start unlocked)."""
    import shutil

    from harness.capture.loop import capture

    for name in folders:
        shutil.copytree(project / name, root / name)
    for name in files:
        shutil.copy(project / name, root / name)
    capture("transformers", project / "models" / "good", root / "suite", root / "cand", progress=False)
    for p in root.rglob(".lock"):
        p.unlink()
    return root


def shutil_copytree(src: Path, dst: Path) -> Path:
    """``shutil.copytree`` keeping symbolic links as links."""
    import shutil

    shutil.copytree(src, dst, symlinks=True)
    return dst


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face cache folder, with huggingface_hub offline and reading it (as ``HF_HUB_OFFLINE=1`` and
    ``HF_HUB_CACHE`` set it when the package loads)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


@pytest.fixture
def project_with_model(fidelity_project: Path) -> Callable[[Path, str], Path]:
    """``(dst, model) -> fidelity.toml``: a copy of the fidelity project at ``dst`` whose candidate ``good`` is
    ``model`` (a path or an ``hf://`` id)."""
    def make(dst: Path, model: str) -> Path:
        shutil.copytree(fidelity_project, dst, symlinks=True)
        toml = dst / "fidelity.toml"
        toml.write_text(toml.read_text().replace('model = "models/good"', f'model = "{model}"'))
        return toml
    return make
