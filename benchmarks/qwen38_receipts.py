"""Re-derive the published Qwen3.8-27B v5 ladder from its receipts: the five headline rows and the paired table.

Usage::

    python benchmarks/qwen38_receipts.py --out /tmp/qwen38            # the receipts of fixtures/qwen38-receipts
    python benchmarks/qwen38_receipts.py --receipts DIR --out /tmp/q  # a folder of fetched receipts/ files

It decompresses the fixtures (checking each against the published sha256 in ``SHA256SUMS``) into ``<out>/receipts``
unless ``--receipts`` names a folder of the published files, then runs ``fidelity aggregate`` on the five
``kld5-10M-*.json`` receipts against ``kld5-suite-manifest.json`` (sizes from ``cross-candidate-byte-accounting.json``,
``rows.<row>.file_bytes``) and ``fidelity paired`` on ``kld5-10M-paired.json``. Its output is in
docs/qwen38-receipts.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import sys
from pathlib import Path

from harness.cli.main import main as fidelity

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "qwen38-receipts"
FIVE = ("k4", "k5k6", "hyd", "ctx", "fp8")
#: The byte-accounting receipt's row of each candidate (its ``source`` names the candidate's quantization manifest);
#: fp8 (Qwen's own FP8 checkpoint) has no row there, so it is not plotted.
BYTE_ROWS = {"hyd": "hydrated K5/K6", "ctx": "context edition", "k5k6": "online K5/K6", "k4": "K4"}


def unpack(out: Path) -> Path:
    """The fixtures decompressed into ``out``, each checked against the published sha256."""
    out.mkdir(parents=True, exist_ok=True)
    for line in (FIX / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        data = lzma.decompress((FIX / f"{name}.xz").read_bytes())
        if hashlib.sha256(data).hexdigest() != digest:
            raise SystemExit(f"{FIX / name}.xz: sha256 of the decompressed file: expected {digest}, found another")
        (out / name).write_bytes(data)
    return out


def sizes(receipts: Path) -> list[str]:
    """``--size name=bytes`` for each candidate with a row in the byte-accounting receipt."""
    doc = json.loads((receipts / "cross-candidate-byte-accounting.json").read_text())
    return [f"--size={name}={doc['rows'][row]['file_bytes']}" for name, row in BYTE_ROWS.items()]


def run() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--receipts", type=Path, default=None, help="folder of the published receipts (default: the fixtures)")
    ap.add_argument("--out", type=Path, required=True, help="output folder (receipts/ is unpacked into it by default)")
    ap.add_argument("--margin", default="0.0001", help="equivalence margin of the paired verdicts, nats (default 0.0001)")
    a = ap.parse_args()
    rdir = a.receipts if a.receipts is not None else unpack(a.out / "receipts")
    suite = str(rdir / "kld5-suite-manifest.json")
    print("$ fidelity aggregate kld5-10M-{k4,k5k6,hyd,ctx,fp8}.json --suite kld5-suite-manifest.json --size ...", flush=True)
    rc = fidelity(["aggregate", *(str(rdir / f"kld5-10M-{n}.json") for n in FIVE), "--suite", suite, *sizes(rdir),
                   "--out", str(a.out / "ladder")])
    if rc:
        return rc
    print(f"\n$ fidelity paired kld5-10M-paired.json --suite kld5-suite-manifest.json --margin {a.margin}", flush=True)
    return fidelity(["paired", str(rdir / "kld5-10M-paired.json"), "--suite", suite, "--margin", a.margin,
                     "--out", str(a.out / "ladder")])


if __name__ == "__main__":
    sys.exit(run())
