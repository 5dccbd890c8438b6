"""The statistics block of ``llama-perplexity --kl-divergence``, with llama.cpp's own formulas.

Reasoning: docs/llamacpp.md §"The formulas".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.llamacpp.kld_file import LOGIT_RANGE, decode_rows, expf

KLD_PERCENTILES = (("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950), ("90.0%", 0.900))
KLD_LOW_PERCENTILES = (("10.0%", 0.100), (" 5.0%", 0.050), (" 1.0%", 0.010), (" 0.1%", 0.001))
DP_HIGH = (("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950), ("90.0%", 0.900), ("75.0%", 0.750))
DP_LOW = (("25.0%", 0.250), ("10.0%", 0.100), (" 5.0%", 0.050), (" 1.0%", 0.010), (" 0.1%", 0.001))
MIN_COUNT = 100


@dataclass
class LlamaPositions:
    """Per-position values llama.cpp accumulates (all length N)."""

    nll: np.ndarray  # float32, candidate (Q)
    nll_base: np.ndarray  # float32, base
    kld: np.ndarray  # float64 (the double sum); llama.cpp keeps float32 copies for percentiles
    p_diff: np.ndarray  # float32
    same_top: np.ndarray  # bool

    def __len__(self) -> int:
        return int(self.nll.shape[0])

    @classmethod
    def concat(cls, parts: list[LlamaPositions]) -> LlamaPositions:
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("nll", "nll_base", "kld", "p_diff", "same_top")))


def positions_from_kld(base_rows: np.ndarray, cand_logits: np.ndarray, targets: np.ndarray, n_vocab: int) -> LlamaPositions:
    """llama.cpp's per-position values for stored base rows ``[R, nv]`` and candidate logits ``[R, n_vocab]``."""
    x = np.ascontiguousarray(cand_logits, dtype=np.float32)
    r = x.shape[0]
    tok = np.asarray(targets, dtype=np.int64)
    if x.shape != (r, n_vocab) or tok.shape != (r,) or base_rows.shape[0] != r:
        raise ValueError(f"shapes: rows {base_rows.shape}, logits {x.shape}, targets {tok.shape}, n_vocab {n_vocab}")
    ar = np.arange(r)
    imax = x.argmax(axis=1)  # first maximum, like the strict '>' scan
    mx = x[ar, imax]
    sum_exp = expf(x - mx[:, None]).astype(np.float64).sum(axis=1)
    lse = np.log(sum_exp).astype(np.float32)
    top = (mx + lse).astype(np.float32)
    nll = (top - x[ar, tok]).astype(np.float32)
    plb = decode_rows(base_rows, n_vocab)
    nll_base = (-plb[ar, tok]).astype(np.float32)
    imax_base = plb.argmax(axis=1)
    keep = plb > np.float32(-LOGIT_RANGE)
    inner = ((plb - x).astype(np.float32) + top[:, None]).astype(np.float32)
    terms = (expf(plb) * inner).astype(np.float32)
    kld = np.where(keep, terms, np.float32(0)).astype(np.float64).sum(axis=1)
    p_diff = (expf(-nll) - expf(-nll_base)).astype(np.float32)
    return LlamaPositions(nll, nll_base, kld, p_diff, imax == imax_base)


def positions_from_scores(scores: Any) -> LlamaPositions:
    """The harness's exact per-position scores (:class:`harness.scoring.scorer.PositionScores`) as llama.cpp
    would accumulate them (values rounded to float32 where llama.cpp holds float32)."""
    nll = np.asarray(scores.nll_cand, dtype=np.float64).astype(np.float32)
    nll_base = np.asarray(scores.nll_ref, dtype=np.float64).astype(np.float32)
    p_diff = (np.exp(-np.asarray(scores.nll_cand, dtype=np.float64)) - np.exp(-np.asarray(scores.nll_ref, dtype=np.float64))).astype(np.float32)
    return LlamaPositions(nll, nll_base, np.asarray(scores.kld, dtype=np.float64), p_diff, np.asarray(scores.top1, dtype=bool))


def _mean_unc(s: float, s2: float, n: int) -> tuple[float, float]:
    if n < 1:
        return 0.0, 0.0
    f = s / n
    df = s2 / n - f * f
    df = math.sqrt(df / (n - 1)) if df > 0 and n > 10 else 0.0
    return f, df


def _cov(a: float, b: float, ab: float, n: int) -> float:
    if n < 10:
        return 0.0
    return (ab / n - (a / n) * (b / n)) / (n - 1)


def _percentile(values: np.ndarray, fraction: float) -> float:
    """llama.cpp's float32 linear-interpolation percentile of sorted float32 ``values``."""
    fr = np.float32(fraction)
    if fr <= 0:
        return float(values[0])
    if fr >= 1:
        return float(values[-1])
    p = np.float32(fr * np.float32(values.size - 1))
    ip = int(p)
    p = np.float32(p - np.float32(ip))
    a = np.float32(np.float32(1) - p) * values[ip]
    b = p * values[min(ip + 1, values.size - 1)]
    return float(np.float32(np.float32(a) + np.float32(b)))


def _median(values: np.ndarray) -> float:
    n = values.size
    if n % 2 == 0:
        return float(np.float32(0.5) * np.float32(values[n // 2] + values[n // 2 - 1]))
    return float(values[n // 2])


def _dsum(x: np.ndarray) -> float:
    return math.fsum(np.asarray(x, dtype=np.float64).tolist())


def compute_stats(pos: LlamaPositions) -> dict[str, Any]:
    """Every number of the llama.cpp block (fractions, not percent), plus the raw sums and count."""
    n = len(pos)
    nll, nb = pos.nll.astype(np.float32), pos.nll_base.astype(np.float32)
    pd = pos.p_diff.astype(np.float32)
    pd2 = (pd * pd).astype(np.float32).astype(np.float64)
    sums = {
        "sum_nll": _dsum(nll), "sum_nll2": _dsum((nll * nll).astype(np.float32)),
        "sum_nll_base": _dsum(nb), "sum_nll_base2": _dsum((nb * nb).astype(np.float32)),
        "sum_nll_nll_base": _dsum((nll * nb).astype(np.float32)),
        "sum_kld": _dsum(pos.kld), "sum_kld2": _dsum(pos.kld * pos.kld),
        "sum_p_diff": _dsum(pd), "sum_p_diff2": _dsum(pd2), "sum_p_diff4": _dsum(pd2 * pd2),
        "n_same_top": int(np.count_nonzero(pos.same_top)), "count": n,
    }
    out: dict[str, Any] = {"count": n, "sums": sums}
    lp = _mean_unc(sums["sum_nll"], sums["sum_nll2"], n)
    lb = _mean_unc(sums["sum_nll_base"], sums["sum_nll_base2"], n)
    ppl, ppl_b = math.exp(lp[0]), math.exp(lb[0])
    cov = _cov(sums["sum_nll"], sums["sum_nll_base"], sums["sum_nll_nll_base"], n)
    denom = lp[1] * lb[1]
    out["ppl_q"] = (ppl, ppl * lp[1])
    out["ppl_base"] = (ppl_b, ppl_b * lb[1])
    out["cor_ln_ppl"] = cov / denom if denom else float("nan")
    ratio_unc = math.sqrt(max(0.0, lp[1] ** 2 + lb[1] ** 2 - 2.0 * cov))
    out["ln_ppl_ratio"] = (lp[0] - lb[0], ratio_unc)
    r = math.exp(lp[0] - lb[0])
    out["ppl_ratio"] = (r, r * ratio_unc)
    ppl_cov = ppl * ppl_b * cov
    out["ppl_diff"] = (ppl - ppl_b, math.sqrt(max(0.0, (ppl * lp[1]) ** 2 + (ppl_b * lb[1]) ** 2 - 2.0 * ppl_cov)))
    out["kld_mean"] = _mean_unc(sums["sum_kld"], sums["sum_kld2"], n)
    kv = np.sort(pos.kld.astype(np.float32))
    dv = np.sort(pd)
    if n:
        out["kld_max"], out["kld_min"], out["kld_median"] = float(kv[-1]), float(kv[0]), _median(kv)
        out["kld_percentiles"] = {lab: _percentile(kv, f) for lab, f in KLD_PERCENTILES + KLD_LOW_PERCENTILES}
        out["dp_max"], out["dp_min"], out["dp_median"] = float(dv[-1]), float(dv[0]), _median(dv)
        out["dp_percentiles"] = {lab: _percentile(dv, f) for lab, f in DP_HIGH + DP_LOW}
    out["dp_mean"] = _mean_unc(sums["sum_p_diff"], sums["sum_p_diff2"], n)
    mse = _mean_unc(sums["sum_p_diff2"], sums["sum_p_diff4"], n)
    rms = math.sqrt(mse[0])
    out["dp_rms"] = (rms, 0.5 / rms * mse[1] if rms else float("nan"))
    st = sums["n_same_top"] / n if n else float("nan")
    out["same_top"] = (st, math.sqrt(st * (1.0 - st) / (n - 1)) if n > 1 else float("nan"))
    return out


def print_block(stats: dict[str, Any]) -> str:
    """llama.cpp's final text block (from ``====== Perplexity statistics ======`` on), character for
    character (``%10.6lf`` etc.); empty when fewer than 100 positions (llama.cpp prints nothing then)."""
    if stats["count"] < MIN_COUNT:
        return ""
    L: list[str] = []
    a = L.append
    a("====== Perplexity statistics ======")
    a("Mean PPL(Q)                   : %10.6f ± %10.6f" % stats["ppl_q"])
    a("Mean PPL(base)                : %10.6f ± %10.6f" % stats["ppl_base"])
    a("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%" % (100.0 * stats["cor_ln_ppl"]))
    a("Mean ln(PPL(Q)/PPL(base))     : %10.6f ± %10.6f" % stats["ln_ppl_ratio"])
    a("Mean PPL(Q)/PPL(base)         : %10.6f ± %10.6f" % stats["ppl_ratio"])
    a("Mean PPL(Q)-PPL(base)         : %10.6f ± %10.6f" % stats["ppl_diff"])
    a("")
    a("====== KL divergence statistics ======")
    a("Mean    KLD: %10.6f ± %10.6f" % stats["kld_mean"])
    a("Maximum KLD: %10.6f" % stats["kld_max"])
    kp = stats["kld_percentiles"]
    for lab, _ in KLD_PERCENTILES:
        a(f"{lab}   KLD: {kp[lab]:10.6f}")
    a("Median  KLD: %10.6f" % stats["kld_median"])
    for lab, _ in KLD_LOW_PERCENTILES:
        a(f"{lab}   KLD: {kp[lab]:10.6f}")
    a("Minimum KLD: %10.6f" % stats["kld_min"])
    a("")
    a("====== Token probability statistics ======")
    m, u = stats["dp_mean"]
    a("Mean    Δp: %6.3f ± %5.3f %%" % (100.0 * m, 100.0 * u))
    dp = stats["dp_percentiles"]
    a("Maximum Δp: %6.3f%%" % (100.0 * stats["dp_max"]))
    for lab, _ in DP_HIGH:
        a(f"{lab}   Δp: {100.0 * dp[lab]:6.3f}%")
    a("Median  Δp: %6.3f%%" % (100.0 * stats["dp_median"]))
    for lab, _ in DP_LOW:
        a(f"{lab}   Δp: {100.0 * dp[lab]:6.3f}%")
    a("Minimum Δp: %6.3f%%" % (100.0 * stats["dp_min"]))
    r, ru = stats["dp_rms"]
    a("RMS Δp    : %6.3f ± %5.3f %%" % (100.0 * r, 100.0 * ru))
    s, su = stats["same_top"]
    a("Same top p: %6.3f ± %5.3f %%" % (100.0 * s, 100.0 * su))
    return "\n".join(L) + "\n"


def parse_block(text: str) -> dict[str, float]:
    """Numbers of a printed block (ours or llama-perplexity's log), keyed by line label, for comparison.
    ``"Mean    KLD"`` -> value, ``"Mean    KLD ±"`` -> its uncertainty; percent signs dropped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if ":" not in line or line.startswith("="):
            continue
        label, _, rest = line.rpartition(":")
        label = label.strip()
        rest = rest.replace("%", "").strip()
        parts = [p.strip() for p in rest.split("±")]
        try:
            out[label] = float(parts[0])
            if len(parts) > 1:
                out[label + " ±"] = float(parts[1])
        except ValueError:
            continue
    return out
