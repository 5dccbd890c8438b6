"""The capture store (docs/design.md, sections 3-4): one safetensors file per context plus a manifest.

Reasoning: docs/design.md §"The capture store".
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict, cast

from filelock import FileLock

from harness.capture.cache_sign import sign, unsigned_reason
from harness.errors import FidelityError, OutputError, VerificationError
from harness.io.atomic import atomic_write_bytes, atomic_write_json
from harness.io.hashing import sha256_bytes, sha256_file
from harness.io.jsonio import JSON, JSONObject, read_json
from harness.io.safetensors_header import Header, corrupt, parse_header, read_header

if TYPE_CHECKING:
    import torch

    from harness.inputs.suite import Suite

SCHEMA = "fidelity.capture/1"
MANIFEST = "capture.json"


class StoreFile(TypedDict):
    """One context file of a store: its context index and sha256."""

    index: int
    sha256: str


class StoreManifest(TypedDict):
    """``capture.json``: what the store holds and what it was captured from (checked by :meth:`CaptureStore.open`)."""

    schema: str
    kind: str
    suite_token_sha256: str
    n_ctx: int
    #: the row width: ``hidden_size`` in a hidden-state store, ``vocab_size`` in a logits store
    hidden_size: NotRequired[int]
    vocab_size: NotRequired[int]
    dtype: str
    #: the captured model's identity (by content)
    model: JSONObject
    #: the engine's and the runtime's identities, and the device (recorded, compared, not interpreted)
    engine: JSON
    runtime: JSON
    device: JSON
    #: the context files by name (a store assembled from published files lists them elsewhere)
    files: NotRequired[dict[str, StoreFile]]
LOCK = ".lock"
KINDS = ("hidden_states", "logits")
DTYPES = {"hidden_states": ("bfloat16",), "logits": ("float32", "bfloat16")}
_NAME_RE = re.compile(r"^ctx-(\d{6,})\.safetensors$", re.ASCII)
#: A temporary of an interrupted atomic write (harness.io.atomic): a context file or the manifest, staged.
_TMP_RE = re.compile(r"^\.(ctx-\d{6,}\.safetensors|capture\.json)\.[A-Za-z0-9_]+\.tmp$", re.ASCII)


def context_filename(index: int) -> str:
    """File name of context ``index``: ``ctx-{index:06d}.safetensors``."""
    return f"ctx-{index:06d}.safetensors"


def width_field(kind: str) -> str:
    """Manifest field holding the row width: ``hidden_size`` or ``vocab_size``."""
    return "hidden_size" if kind == "hidden_states" else "vocab_size"


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def _check_tensor(path: Path, tensors: dict[str, torch.Tensor], kind: str, dtype: str, shape: tuple[int, int]) -> torch.Tensor:
    import torch

    if sorted(tensors) != [kind]:
        raise VerificationError(path, "tensor names", [kind], sorted(tensors))
    t = tensors[kind]
    if t.dtype != _torch_dtype(dtype):
        raise VerificationError(path, f"{kind} dtype", f"torch.{dtype}", t.dtype)
    if tuple(t.shape) != shape:
        raise VerificationError(path, f"{kind} shape", list(shape), list(t.shape))
    finite = torch.isfinite(t)
    if not bool(finite.all()):
        raise VerificationError(path, f"{kind} values", "all finite", f"{int((~finite).sum())} NaN/Inf")
    return t


def _read_manifest(path: Path) -> JSONObject:
    mf = path / MANIFEST
    if not mf.is_file():
        raise VerificationError(mf, "capture manifest missing", hint="capture with `fidelity capture`")
    doc: JSONObject = read_json(mf)
    if doc.get("schema") != SCHEMA:
        raise VerificationError(mf, "schema", SCHEMA, doc.get("schema"))
    kind = doc.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise VerificationError(mf, "kind", " or ".join(KINDS), kind)
    if doc.get("dtype") not in DTYPES[kind]:
        raise VerificationError(mf, f"dtype of a {kind} store", " or ".join(DTYPES[kind]), doc.get("dtype"))
    if not isinstance(doc.get("files"), dict):
        raise VerificationError(mf, "files", "an object {name: {index, sha256}}", type(doc.get("files")).__name__)
    if not isinstance(doc.get("model"), dict):
        raise VerificationError(mf, "model", "an object (the captured model's identity)", type(doc.get("model")).__name__)
    return doc


def _files(doc: JSONObject) -> dict[str, JSON]:
    """The ``files`` object of a manifest :func:`_read_manifest` checked."""
    files = doc["files"]
    assert isinstance(files, dict)
    return files


def _check_embedded(path: Path, header: Header, index: int, suite_sha: str) -> None:
    """The identity a context file carries in its safetensors metadata must match the manifest:
    a file renamed or copied from another index or suite is refused even when its sha256 is listed."""
    try:
        embedded = json.loads(header.metadata["fidelity"])
        found = (embedded.get("index"), embedded.get("suite_token_sha256"))
    except (ValueError, KeyError, TypeError, AttributeError):  # a header without the identity
        found = None
    if found != (index, suite_sha):
        raise VerificationError(path, "embedded identity (metadata 'fidelity': index, suite_token_sha256)", (index, suite_sha), found,
                                "the file belongs to another context or suite")


def _check_name(root: Path, name: str, entry: object, mf: Path) -> tuple[int, str]:
    """Validate one manifest entry's name and index; return its index and sha256."""
    if os.path.isabs(name) or "/" in name or "\\" in name or ".." in name:
        raise VerificationError(mf, f"file name {name!r} leaves the store folder", "a plain ctx-NNNNNN.safetensors name", name)
    m = _NAME_RE.match(name)
    if not m:
        raise VerificationError(mf, "file name", "ctx-NNNNNN.safetensors", name)
    if not isinstance(entry, dict) or type(entry.get("index")) is not int or not isinstance(entry.get("sha256"), str):
        raise VerificationError(mf, f"files[{name!r}]", "{index: int, sha256: str}", entry)
    if int(m.group(1)) != entry["index"]:
        raise VerificationError(mf, f"files[{name!r}].index", int(m.group(1)), entry["index"])
    p = root / name
    if p.is_symlink():
        target = p.resolve()
        if not target.is_relative_to(root.resolve()):
            raise VerificationError(p, "symlink leaves the store folder", f"a file inside {root}", str(target))
    return int(entry["index"]), str(entry["sha256"])


@dataclass
class CaptureStore:
    """An opened capture store. Use ``CaptureStore.open``; then ``load(index)`` / ``load_rows``.

    Every context is content-verified (sha256, tensor name, dtype, shape, finite values) the first
    time it is loaded; later loads memory-map the file and re-check only the tensor.
    """

    root: Path
    suite: Suite
    manifest: StoreManifest
    files: dict[int, str]
    hashes: dict[int, str]
    verify: bool = True
    _verified: set[int] = field(default_factory=set, repr=False)

    @property
    def kind(self) -> str:
        return str(self.manifest["kind"])

    @property
    def dtype(self) -> str:
        return str(self.manifest["dtype"])

    @property
    def width(self) -> int:
        """Row width: hidden size for hidden-state stores, vocab size for logits stores."""
        width = self.manifest.get(width_field(self.kind))
        assert isinstance(width, int)  # checked by open
        return width

    @property
    def indices(self) -> list[int]:
        """Context indices present in the store, sorted."""
        return sorted(self.files)

    @property
    def identity(self) -> JSONObject:
        """The captured model's identity (by content)."""
        return dict(self.manifest["model"])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.suite.n_ctx - 1, self.width)

    @classmethod
    def open(cls, path: str | Path, suite: Suite, verify: bool = True) -> CaptureStore:
        """Open a store for ``suite``; structural checks always, content checks on load if ``verify``."""
        root = Path(path)
        with _between_writes(root):
            return cls._open(root, suite, verify)

    @classmethod
    def _open(cls, root: Path, suite: Suite, verify: bool) -> CaptureStore:
        mf = root / MANIFEST
        doc = _read_manifest(root)
        if doc.get("suite_token_sha256") != suite.suite_token_sha256:
            raise VerificationError(mf, "suite_token_sha256", suite.suite_token_sha256, doc.get("suite_token_sha256"), hint="this store was captured for another suite")
        if doc.get("n_ctx") != suite.n_ctx:
            raise VerificationError(mf, "n_ctx", suite.n_ctx, doc.get("n_ctx"))
        wf = width_field(str(doc["kind"]))
        width = doc.get(wf)
        if not isinstance(width, int) or isinstance(width, bool) or width <= 0:
            raise VerificationError(mf, wf, "a positive integer", width)
        files: dict[int, str] = {}
        hashes: dict[int, str] = {}
        for name, entry in _files(doc).items():
            idx, sha = _check_name(root, name, entry, mf)
            if idx in files:
                raise VerificationError(mf, f"duplicate context index {idx}", files[idx], name)
            if not 0 <= idx < suite.n_contexts:
                raise VerificationError(mf, f"context index of {name}", f"0..{suite.n_contexts - 1}", idx)
            if not (root / name).is_file():
                raise VerificationError(root / name, "listed context file missing", hint="re-run `fidelity capture` to resume")
            files[idx] = name
            hashes[idx] = sha
        listed = set(_files(doc))
        extra = sorted(p.name for p in root.glob("ctx-*.safetensors") if p.name not in listed)
        if extra:
            raise VerificationError(root / extra[0], "context file not listed in capture.json", "no unlisted ctx files", extra)
        return cls(root, suite, cast(StoreManifest, doc), files, hashes, verify)  # every field checked above

    def _path(self, index: int) -> Path:
        if index not in self.files:
            raise VerificationError(self.root / context_filename(index), f"context {index} not in store", hint="capture it with `fidelity capture --shards ...`")
        return self.root / self.files[index]

    def load(self, index: int) -> torch.Tensor:
        """The verified tensor of context ``index`` (``[n_ctx-1, width]``)."""
        from safetensors import SafetensorError, safe_open
        from safetensors.torch import load as st_load

        path = self._path(index)
        try:
            if self.verify and index not in self._verified:
                data = path.read_bytes()
                digest = sha256_bytes(data)
                if digest != self.hashes[index]:
                    raise VerificationError(path, "sha256", self.hashes[index], digest)
                tensors = st_load(data)
            else:
                with safe_open(str(path), framework="pt") as fh:
                    tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        except SafetensorError as e:
            raise corrupt(path, e) from None
        t = _check_tensor(path, tensors, self.kind, self.dtype, self.shape)
        if self.verify and index not in self._verified:
            _check_embedded(path, parse_header(data, path), index, self.suite.suite_token_sha256)
        self._verified.add(index)
        return t

    def load_rows(self, indices: Sequence[int]) -> torch.Tensor:
        """Contexts ``indices`` concatenated along rows: ``[len(indices) * (n_ctx-1), width]``.

        The result is allocated once and each context is copied into its rows as it is read
        (peak memory: the result plus one context, not twice the result as with a concatenation)."""
        import torch

        if len(indices) == 0:
            return torch.cat([], dim=0)  # the same error as before for an empty list
        first = self.load(indices[0])
        r = first.shape[0]
        out = torch.empty((len(indices) * r, *first.shape[1:]), dtype=first.dtype)
        out[:r] = first
        del first
        for k, i in enumerate(indices[1:], 1):
            out[k * r : (k + 1) * r] = self.load(i)
        return out

    def missing(self, indices: Sequence[int]) -> list[int]:
        """Those of ``indices`` not captured yet."""
        return [i for i in indices if i not in self.files]

    def verify_all(self) -> int:
        """Content-verify every file now; returns the number verified."""
        for i in self.indices:
            self.load(i)
        return len(self.files)


# ----------------------------------------------------------------------------- writing


@contextmanager
def _between_writes(root: Path) -> Iterator[None]:
    """Hold the store's writer lock (``.lock``, where a :class:`StoreWriter` made one) while it is read: a writer
    renames a context file into place and then rewrites the manifest, both under that lock, so a reader in
    between would see a context file the manifest does not list yet (another process capturing the same cache
    folder, e.g. a pytest-xdist worker). A store without a lock file, or one this user cannot lock, is read as it is."""
    lock = FileLock(root / LOCK, mode=0o666)
    try:
        if not (root / LOCK).is_file():
            raise FileNotFoundError(root / LOCK)
        lock.acquire()
    except OSError:
        yield
        return
    try:
        yield
    finally:
        lock.release()


class StoreWriter:
    """Writes a store, resumably and safely under concurrency.

    * The header (everything but ``files``) is fixed when the store is created; an existing store
      whose header differs (another model, suite, engine, device, runtime, kind, width or dtype)
      is refused: captures are never mixed.
    * Each context file is written to a temporary name and renamed; the manifest is rewritten
      atomically after every file. Both happen under an exclusive lock on ``.lock`` (filelock), and the
      manifest is re-read under that lock, so two processes capturing into one store merge their
      work instead of overwriting it. Temporaries left by a killed writer are removed on open.
    * A writer given ``cache_key`` (a capture into the cache folder) signs every manifest it writes and
      refuses an existing manifest without a valid signature (:mod:`harness.capture.cache_sign`; the
      session moves such a folder aside before it captures again).
    * ``done(index)`` is true when the context is listed and its file's sha256 matches: a re-run
      after a crash (even ``kill -9``) skips those and recaptures the rest. Unlisted leftovers of
      an interrupted write are removed when the writer opens.

    Use as a context manager.
    """

    def __init__(
        self,
        path: str | Path,
        suite: Suite,
        kind: str,
        width: int,
        dtype: str,
        model: Mapping[str, object],
        engine: dict[str, str],
        runtime: dict[str, str],
        device: str,
        cache_key: bytes | None = None,
    ) -> None:
        if kind not in KINDS:
            raise FidelityError(f"unknown store kind {kind!r}: choose one of {', '.join(KINDS)}")
        if dtype not in DTYPES[kind]:
            raise FidelityError(f"dtype {dtype!r} not allowed for a {kind} store: choose one of {', '.join(DTYPES[kind])}")
        self.root = Path(path)
        self.suite = suite
        self.kind = kind
        self.dtype = dtype
        self.shape = (suite.n_ctx - 1, width)
        self.header: dict[str, object] = {
            "schema": SCHEMA,
            "kind": kind,
            "suite_token_sha256": suite.suite_token_sha256,
            "n_ctx": suite.n_ctx,
            width_field(kind): width,
            "dtype": dtype,
            "model": model,
            "engine": engine,
            "runtime": runtime,
            "device": device,
        }
        #: this user's cache key when the store is a cache folder (:mod:`harness.capture.cache_sign`): every
        #: manifest written is signed, and an existing manifest without a valid signature is not believed --
        #: its listing is dropped and every context captured again
        self.cache_key = cache_key
        self._lock: FileLock | None = None

    def __enter__(self) -> StoreWriter:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            os.close(os.open(self.root / LOCK, os.O_RDWR | os.O_CREAT, 0o666))  # a folder it cannot write: named here
            self._lock = FileLock(self.root / LOCK, mode=0o666)
        except OSError as e:
            raise OutputError(self.root, "cannot create the capture store", f"{type(e).__name__}: {e.strerror or e}") from None
        with self._locked():
            mf = self.root / MANIFEST
            doc = _read_manifest(self.root) if mf.exists() else None
            if doc is not None and self.cache_key is not None:
                reason = unsigned_reason(doc, self.cache_key)
                if reason is not None:  # a cache folder's manifest this user's harness did not sign: never believed
                    raise VerificationError(mf, "cache signature", "a manifest signed with this user's cache key",
                                            f"{reason} (nothing was deleted)")
            if doc is not None:
                for key, want in self.header.items():
                    if doc.get(key) != want:
                        raise VerificationError(
                            mf, f"existing store's {key} differs", want, doc.get(key),
                            hint="a store never mixes captures: use a new --out folder",
                        )
                listed = set(_files(doc))
            else:
                self._save({**self.header, "files": {}})
                listed = set()
            for p in sorted(self.root.glob("ctx-*.safetensors")):
                if p.name not in listed:
                    self._remove_leftover(p)
            # temporaries of an interrupted atomic write (writes happen under this lock, so none is live)
            for pattern in (".ctx-*.safetensors.*.tmp", f".{MANIFEST}.*.tmp"):
                for p in self.root.glob(pattern):
                    if _TMP_RE.match(p.name) and p.is_file() and not p.is_symlink():
                        p.unlink()
        return self

    def _remove_leftover(self, p: Path) -> None:
        """Remove an unlisted context file when it is provably an interrupted write of this store: a regular
        file (not a link) whose name is a context's and whose embedded identity names that context of this
        suite. Anything else there is refused, named, and kept."""
        m = _NAME_RE.match(p.name)
        if p.is_symlink() or not p.is_file() or m is None:
            raise VerificationError(p, "unlisted entry in the capture store", "a context file this store wrote",
                                    "a symbolic link or not a regular file (nothing was deleted)")
        try:
            _check_embedded(p, read_header(p), int(m.group(1)), self.suite.suite_token_sha256)
        except VerificationError as e:
            raise VerificationError(p, "unlisted file in the capture store", "a context file this store wrote",
                                    f"{e.found} (nothing was deleted; remove it or use another folder)") from None
        p.unlink()

    def __exit__(self, *exc: object) -> None:
        self._lock = None

    @contextmanager
    def _locked(self) -> Iterator[None]:
        assert self._lock is not None, "use StoreWriter as a context manager"
        with self._lock:
            yield

    def _manifest(self) -> StoreManifest:
        """The manifest as this writer keeps it (read under the lock; it wrote or checked it on entering). In a
        cache folder it must still carry this user's signature (else it was replaced by someone else)."""
        doc = read_json(self.root / MANIFEST)
        if self.cache_key is not None:
            reason = unsigned_reason(doc, self.cache_key)
            if reason is not None:
                raise VerificationError(self.root / MANIFEST, "cache signature", "the manifest this writer signed", reason)
        return cast(StoreManifest, doc)

    def _save(self, doc: Mapping[str, object]) -> None:
        """Write the manifest atomically, signed when the store is a cache folder."""
        atomic_write_json(self.root / MANIFEST, sign(doc, self.cache_key) if self.cache_key is not None else doc)

    def done(self, index: int) -> bool:
        """True if context ``index`` is listed and its file's sha256 matches; a listed but missing
        or corrupt file is dropped from the manifest so it gets recaptured."""
        name = context_filename(index)
        with self._locked():
            doc = self._manifest()
            entry = doc["files"].get(name)
            if entry is None:
                return False
            p = self.root / name
            if p.is_file() and not p.is_symlink() and sha256_file(p) == entry.get("sha256"):
                return True
            del doc["files"][name]
            self._save(doc)
            if p.is_symlink() or p.is_file():  # a link is removed, never what it points to
                p.unlink()
            elif p.exists():
                raise VerificationError(p, "listed context file", "a regular file", "not a regular file (nothing was deleted)")
            return False

    def write(self, index: int, tensor: torch.Tensor) -> str:
        """Verify and store context ``index``; returns the file's sha256."""
        from safetensors.torch import save

        name = context_filename(index)
        t = _check_tensor(self.root / name, {self.kind: tensor}, self.kind, self.dtype, self.shape)
        data = save(
            {self.kind: t.contiguous()},
            # one metadata key: safetensors orders metadata keys arbitrarily, and files must be byte-stable
            metadata={"fidelity": json.dumps({"index": index, "suite_token_sha256": self.suite.suite_token_sha256}, sort_keys=True)},
        )
        digest = sha256_bytes(data)
        with self._locked():
            atomic_write_bytes(self.root / name, data)
            doc = self._manifest()
            doc["files"][name] = {"index": index, "sha256": digest}
            doc["files"] = dict(sorted(doc["files"].items()))
            self._save(doc)
        return digest
