"""Compare llama-perplexity's printed KL-divergence block with the harness's (see llamacpp_agreement.sh).

    python benchmarks/llamacpp_agreement.py LLAMA_LOG OURS_TXT [--tolerance-digits 2]

Both texts are cut to their first block (``====== Perplexity statistics ======`` .. ``Same top p``)
and parsed with ``harness.llamacpp.stats.parse_block``. A value agrees when it differs by at most
``tolerance-digits`` units of the last printed digit (both sides print the same format). Exit 1 on
any disagreement or a missing line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.llamacpp.stats import parse_block

MARK = "====== Perplexity statistics ======"


def first_block(text: str) -> str:
    i = text.find(MARK)
    if i < 0:
        raise SystemExit(f"no '{MARK}' block found")
    lines = []
    for line in text[i:].splitlines():
        lines.append(line)
        if line.startswith("Same top p"):
            break
    return "\n".join(lines)


def unit(text: str, label: str, unc: bool) -> float:
    """Size of the last printed digit of a value in the block."""
    for line in text.splitlines():
        if line.rpartition(":")[0].strip() == label:
            rest = line.rpartition(":")[2].replace("%", "")
            tok = rest.split("±")[1 if unc else 0].strip()
            dec = tok.split(".")[1] if "." in tok else ""
            return 10.0 ** -len(dec)
    return 1.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("llama_log", type=Path)
    ap.add_argument("ours", type=Path)
    ap.add_argument("--tolerance-digits", type=float, default=2.0)
    a = ap.parse_args()
    tl, to = first_block(a.llama_log.read_text(errors="replace")), first_block(a.ours.read_text())
    L, O = parse_block(tl), parse_block(to)
    if "Same top p" not in L:
        print(f"{a.llama_log}: llama.cpp's block is incomplete (its asynchronous logger dropped lines)")
        return 2
    bad = 0
    print(f"{'line':40s} {'llama.cpp':>14s} {'harness':>14s} {'diff':>10s}")
    for k in L:
        if k not in O:
            print(f"{k:40s} {L[k]:14.6f} {'missing':>14s}")
            bad += 1
            continue
        u = unit(tl, k.removesuffix(" ±"), k.endswith(" ±"))
        d = O[k] - L[k]
        flag = "" if abs(d) <= a.tolerance_digits * u + 1e-12 else "  <-- differs"
        bad += bool(flag)
        print(f"{k:40s} {L[k]:14.6f} {O[k]:14.6f} {d:+10.2e}{flag}")
    print(f"{len(L)} values, {bad} outside {a.tolerance_digits:g} units of the last printed digit")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
