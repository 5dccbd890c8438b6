"""The README's measured figures, produced by one script: the ladder block, the plot, pass counts and times.

    python docs/figures.py              # run the main job and the quick tier, rewrite README.md's figure blocks,
                                        # docs/kld-vs-size.png and docs/figures.json (a few minutes on 2 cores)
    python docs/figures.py --no-quick   # the main job only (the quick tier's line is left as it is)

Each figure block of README.md sits between ``<!-- figures:NAME -->`` and ``<!-- /figures:NAME -->`` and is
rewritten whole; nothing else in the README is touched. Every time is printed beside the machine it was measured
on (CPU model, cores, torch, the scorer's GEMM path). ``tests/test_readme_figures.py`` checks the README against
the current code's output: what does not depend on the CPU's arithmetic exactly (candidates, sizes, shards,
verdicts, case counts), the numbers within :data:`REL_TOL` (bf16 forward passes differ between CPUs in the last
digits: Intel AMX, AMD AVX-512, AVX2 each sum in their own order).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FIGURES_JSON = ROOT / "docs" / "figures.json"
PLOT = ROOT / "docs" / "kld-vs-size.png"

#: Relative tolerance of a number in the ladder between two CPUs (or thread counts, or package builds) for the
#: same code: the candidates' forward passes round differently per GEMM kernel. Measured (2026-12-02): the mean
#: KLDs of this README's previous ladder (an earlier machine and package set) and of a run on an AMD EPYC
#: (AVX-512, bf16 through MKL) differ by at most 0.14 % for the transformers rows -- the tolerance is 2 % --
#: and by up to 8.4 % for the vLLM rows (its CPU kernels differ more between builds and ISAs): 15 % there.
REL_TOL = 0.02
VLLM_REL_TOL = 0.15
#: Top-1 agreement is a fraction of ~24k positions: a few flipped argmaxes between CPUs.
TOP1_ABS_TOL = 0.002


def machine() -> dict[str, Any]:
    """What the figures were measured on: CPU model, its bf16-relevant flags, cores, torch, the GEMM path."""
    import torch

    from harness.scoring.torch_path import gemm_path

    model, flags = platform.processor() or platform.machine(), set()
    try:
        info = Path("/proc/cpuinfo").read_text()
        model = re.search(r"^model name\s*:\s*(.+)$", info, re.M).group(1).strip()  # type: ignore[union-attr]
        flags = set(re.search(r"^flags\s*:\s*(.+)$", info, re.M).group(1).split())  # type: ignore[union-attr]
    except (OSError, AttributeError):
        pass
    bf16 = torch.zeros(2, 2, dtype=torch.bfloat16)
    return {
        "cpu": model,
        "bf16_features": sorted(f for f in flags if f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2")),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "gemm": gemm_path(torch.device("cpu"), bf16, bf16),
        "date": _dt.date.today().isoformat(),
        "load_average": round(os.getloadavg()[0], 1),
    }


def machine_words(m: dict[str, Any]) -> str:
    load = f", load average {m['load_average']} at the start" if "load_average" in m else ""
    return f"{m['cpu']}, {m['cores']} cores{load}, torch {m['torch']}, GEMM {m['gemm']}; {m['date']}"


def _run(cmd: list[str]) -> tuple[str, float, int]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    return out.stdout + out.stderr, time.perf_counter() - t0, out.returncode


def summary_line(output: str) -> str:
    """pytest's last line (``96 passed, 2 skipped in 60.44s``) without its ``=`` padding."""
    lines = [ln.strip("= ").strip() for ln in output.splitlines() if re.search(r"\d+ (passed|failed|skipped)", ln)]
    if not lines:
        raise SystemExit(f"no pytest summary line in:\n{output[-3000:]}")
    return lines[-1]


def counts(line: str) -> dict[str, int]:
    """``{"passed": 96, "skipped": 2}`` from a pytest summary line."""
    return {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", line)}


def ladder_block(output: str) -> str:
    """The ladder and the reports' lines as the main job prints them, up to pytest's summary line."""
    lines = output.splitlines()
    start = next(i for i, ln in enumerate(lines) if re.match(r"=+ fidelity ladder =+", ln))
    end = next(i for i in range(start, len(lines)) if re.search(r"\d+ (passed|failed)", lines[i]))
    return "\n".join(lines[start : end + 1])


def table_rows(block: str) -> list[list[str]]:
    """The Markdown table rows of a ladder block (header first), each a list of stripped cells."""
    rows = [ln for ln in block.splitlines() if ln.startswith("|") and not re.match(r"^\|[-| :]+\|$", ln)]
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in rows]


def replace_block(text: str, name: str, body: str) -> str:
    """``text`` with the figure block ``name`` replaced by ``body`` (the markers stay)."""
    pat = re.compile(rf"(<!-- figures:{name} -->\n)(.*?)(<!-- /figures:{name} -->)", re.S)
    if not pat.search(text):
        raise SystemExit(f"README.md: no block <!-- figures:{name} --> ... <!-- /figures:{name} -->")
    return pat.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(3), text, count=1)


def read_block(text: str, name: str) -> str:
    m = re.search(rf"<!-- figures:{name} -->\n(.*?)<!-- /figures:{name} -->", text, re.S)
    if not m:
        raise AssertionError(f"README.md: no figure block {name!r}")
    return m.group(1)


def main_job(report_dir: str) -> dict[str, Any]:
    """``pytest fidelity.toml`` as the README shows it (reports into ``report_dir``, relative to the root)."""
    out, wall, rc = _run([sys.executable, "-m", "pytest", "fidelity.toml", "-q", "--fidelity-report-dir", report_dir])
    if rc != 0:
        raise SystemExit(f"the main job failed (exit {rc}):\n{out[-4000:]}")
    line = summary_line(out)
    reused = re.search(r"capture cache: reused (\d+) of (\d+) contexts", out)
    if reused is None or reused.group(1) == "0":
        captures = "candidate captures included"
    elif reused.group(1) == reused.group(2):
        captures = "every capture cached from an earlier run"
    else:
        captures = f"{reused.group(1)} of {reused.group(2)} contexts' captures cached"
    return {"block": ladder_block(out), "summary": line, "counts": counts(line), "wall_s": round(wall, 1),
            "captures": captures}


def quick_tier() -> dict[str, Any]:
    out, wall, rc = _run([sys.executable, "-m", "pytest", "-m", "not slow", "-q"])
    line = summary_line(out)
    if rc != 0:  # written as it is (the line then says what failed), and said here
        failed = "\n".join(ln for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR")))
        print(f"the quick tier did not pass (exit {rc}): {line}\n{failed}", file=sys.stderr)
    return {"summary": line, "counts": counts(line), "wall_s": round(wall, 1)}


def plot(report_dir: Path, work: Path) -> None:
    """The published set's kld-vs-size plot of this run, copied to docs/kld-vs-size.png."""
    out, _, rc = _run([sys.executable, "-m", "harness", "publish", "--reports", str(report_dir), "--config",
                       "fidelity.toml", "--out", str(work / "published")])
    if rc != 0:
        raise SystemExit(f"fidelity publish failed (exit {rc}):\n{out[-3000:]}")
    shutil.copyfile(work / "published" / "kld-vs-size.png", PLOT)


def _counts_words(c: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in c.items() if k != "deselected")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-quick", action="store_true", help="skip the quick tier (its README line is kept)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    m = machine()
    old = json.loads(FIGURES_JSON.read_text()) if FIGURES_JSON.is_file() else {}
    with tempfile.TemporaryDirectory() as tmp:
        job = main_job("fidelity-reports")  # the main job's own folder, so the block reads as a user's run
        plot(ROOT / "fidelity-reports", Path(tmp))
    text = README.read_text("utf-8")
    text = replace_block(text, "ladder", "```\n" + job["block"] + "\n```\n")
    text = replace_block(text, "main-job", f"`pytest fidelity.toml`: {_counts_words(job['counts'])} in {job['wall_s']:.0f} s "
                                           f"of wall time, {job['captures']} "
                                           f"(measured on {machine_words(m)}).\n")
    figures: dict[str, Any] = {"machine": m, "main_job": {k: job[k] for k in ("summary", "counts", "wall_s", "captures")}}
    if "cross_cpu_max_rel" in old:
        figures["cross_cpu_max_rel"] = old["cross_cpu_max_rel"]
    if args.no_quick and "quick_tier" in old:
        figures["quick_tier"] = old["quick_tier"]
    # Written before the quick tier runs, which checks these very blocks (tests/test_readme_figures.py).
    README.write_text(text, "utf-8")
    FIGURES_JSON.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    if not args.no_quick:
        q = quick_tier()
        text = replace_block(text, "quick-tier", f"`pytest -m \"not slow\"`: {_counts_words(q['counts'])} in "
                                                 f"{q['wall_s']:.0f} s of wall time (measured on {machine_words(m)}).\n")
        figures["quick_tier"] = q
        README.write_text(text, "utf-8")
        FIGURES_JSON.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    print(f"README.md, {PLOT.relative_to(ROOT)} and {FIGURES_JSON.relative_to(ROOT)} written ({machine_words(m)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
