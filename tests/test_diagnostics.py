"""Diagnostics (reverse KL, entropy, top-k overlap, same top, KLD by confidence and entropy decile):
the scorer's per-position values summarized into shard reports and aggregates, each checked against
an independent float64 numpy computation from the same logits, and additive across shards."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import log_softmax

from harness.metrics import ContextLabel, summarize
from harness.metrics.diagnostics import CONFIDENCE_EDGES, ENTROPY_SPEC
from harness.metrics.summary import merge_totals
from harness.reports.aggregate import aggregate, ladder_rows
from harness.reports.shard import ShardReport, make_comparability, render_markdown
from harness.scoring.scorer import score_logits

N_CTX, PER, V = 24, 20, 400


@pytest.fixture(scope="module")
def case() -> dict:
    """Logits of 24 contexts x 20 positions whose peakedness varies by row (every confidence bucket
    gets positions), a candidate with noise, scored by the real scorer."""
    g = torch.Generator().manual_seed(11)
    n = N_CTX * PER
    temp = torch.exp(torch.linspace(-1.0, 3.2, n))[torch.randperm(n, generator=g)]
    a = torch.randn(n, V, generator=g) * temp[:, None]
    b = a + 0.4 * torch.randn(n, V, generator=g)
    y = torch.randint(0, V, (n,), generator=g)
    s = score_logits(a, b, y)
    lp = log_softmax(a.double().numpy(), axis=1)
    lq = log_softmax(b.double().numpy(), axis=1)
    p, q = np.exp(lp), np.exp(lq)
    ia = np.argsort(-a.double().numpy(), axis=1, kind="stable")
    ib = np.argsort(-b.double().numpy(), axis=1, kind="stable")
    rows = np.arange(n)
    want = {
        "kld": (p * (lp - lq)).sum(1),
        "kld_rev": (q * (lq - lp)).sum(1),
        "entropy": -(p * lp).sum(1),
        "p_top": p.max(1),
        "q_top": q[rows, p.argmax(1)],
        "top1": (p.argmax(1) == q.argmax(1)),
        **{f"top{k}": np.array([len(set(ia[i, :k]) & set(ib[i, :k])) for i in rows]) for k in (5, 10)},
    }
    labels = [ContextLabel(100 + i, f"doc{i // 2}", "code" if i % 3 == 0 else "prose") for i in range(N_CTX)]
    ci = np.repeat(np.arange(100, 100 + N_CTX), PER)
    row = np.tile(np.arange(PER), N_CTX)
    return {"scores": s, "want": want, "labels": labels, "ci": ci, "row": row}


def _report(case: dict, shard: int, ctxs: slice) -> ShardReport:
    labels = case["labels"][ctxs]
    keep = np.isin(case["ci"], [c.index for c in labels])
    m = summarize(case["scores"].select(keep), case["ci"][keep], case["row"][keep], labels, n_boot=400, n_boot_tails=50)
    comp = make_comparability(suite_token_sha256="a" * 64, shard_index=shard, shard_sha256=f"{shard}" * 64, score_from=0,
                              reference={"name": "bf16"}, candidate={"name": "q4"}, head_sha256="e" * 64,
                              engine={"name": "transformers"}, scorer={"method": "single-pass-tiled"})
    return ShardReport("q4", comp, m, timing={})


def _deciles64(h: np.ndarray, kld: np.ndarray) -> list[tuple[int, int, float]]:
    """Independent decile grouping over the fixed fine bins: (decile, positions, mean KLD)."""
    lo, hi, per = ENTROPY_SPEC["lo"], ENTROPY_SPEC["hi"], ENTROPY_SPEC["bins_per_decade"]
    edges = lo * 10.0 ** (np.arange(round(math.log10(hi / lo)) * per + 1) / per)
    b = np.digitize(h, edges)  # 0: [0, lo), i: [edges[i-1], edges[i]), last: >= hi
    nb = len(edges) + 1
    counts = np.bincount(b, minlength=nb)
    n = len(h)
    mid = np.cumsum(counts) - counts / 2.0
    group = np.minimum(9, np.floor(10 * mid / n)).astype(int)
    out = []
    for g in range(10):
        sel = np.isin(b, np.flatnonzero((group == g) & (counts > 0)))
        if sel.any():
            out.append((g + 1, int(sel.sum()), float(kld[sel].mean())))
    return out


def test_shard_diagnostics_match_float64(case: dict) -> None:
    w = case["want"]
    d = _report(case, 0, slice(0, N_CTX)).metrics["diagnostics"]
    n = len(w["kld"])
    assert d["kld_rev"]["mean"] == pytest.approx(w["kld_rev"].mean(), rel=1e-5)
    assert d["entropy_ref_mean"] == pytest.approx(w["entropy"].mean(), rel=1e-5)
    assert d["p_ref_top_mean"] == pytest.approx(w["p_top"].mean(), rel=1e-5)
    assert d["q_ref_top_mean"] == pytest.approx(w["q_top"].mean(), rel=1e-5)
    assert d["top5_overlap"]["mean"] == w["top5"].sum() / (5 * n)
    assert d["top10_overlap"]["mean"] == w["top10"].sum() / (10 * n)
    st = w["top1"].mean()
    assert d["same_top"]["fraction"] == pytest.approx(st, abs=1e-12)
    assert d["same_top"]["se_iid"] == pytest.approx(math.sqrt(st * (1 - st) / (n - 1)), rel=1e-12)
    for key in ("kld_rev", "top5_overlap", "top10_overlap"):
        lo, hi = d[key]["ci95"]
        assert lo < d[key]["mean"] < hi
    # confidence buckets, from float64 top probabilities
    b = np.clip(np.searchsorted(CONFIDENCE_EDGES, w["p_top"], side="right") - 1, 0, len(CONFIDENCE_EDGES) - 2)
    rows = {(r["lo"], r["hi"]): r for r in d["by_confidence"]}
    assert len(rows) >= 8, "the case should fill most buckets"
    for i in np.unique(b):
        r = rows[(CONFIDENCE_EDGES[i], CONFIDENCE_EDGES[i + 1])]
        assert r["positions"] == int((b == i).sum())
        assert r["mean_kld"] == pytest.approx(w["kld"][b == i].mean(), rel=1e-4)
        assert r["top1"] == pytest.approx(w["top1"][b == i].mean(), abs=1e-12)
    assert sum(r["positions"] for r in d["by_confidence"]) == n
    # entropy deciles over the fixed bins
    got = [(r["decile"], r["positions"], r["mean_kld"]) for r in d["by_entropy_decile"]]
    want = _deciles64(w["entropy"], w["kld"])
    assert [g[:2] for g in got] == [x[:2] for x in want]
    for g, x in zip(got, want):
        assert g[2] == pytest.approx(x[2], rel=1e-4)
    assert len(got) >= 8 and sum(r[1] for r in got) == n


def test_diagnostics_add_across_shards(case: dict) -> None:
    """Two shards aggregate to what one report of all positions says (buckets and deciles add exactly)."""
    whole = _report(case, 0, slice(0, N_CTX)).metrics
    parts = [_report(case, 0, slice(0, 10)), _report(case, 1, slice(10, N_CTX))]
    merged = merge_totals([p.metrics["totals"] for p in parts])
    assert merged["diagnostics"]["by_confidence"]["counts"] == whole["totals"]["diagnostics"]["by_confidence"]["counts"]
    assert merged["diagnostics"]["by_entropy"]["counts"] == whole["totals"]["diagnostics"]["by_entropy"]["counts"]
    agg = aggregate(parts)
    d, wd = agg["diagnostics"], whole["diagnostics"]
    assert d["kld_rev"]["mean"] == pytest.approx(wd["kld_rev"]["mean"], rel=1e-12)
    assert d["top10_overlap"]["mean"] == wd["top10_overlap"]["mean"]
    assert [(r["decile"], r["positions"]) for r in d["by_entropy_decile"]] == \
        [(r["decile"], r["positions"]) for r in wd["by_entropy_decile"]]
    for a, b in zip(d["by_confidence"], wd["by_confidence"]):
        assert a["positions"] == b["positions"] and a["mean_kld"] == pytest.approx(b["mean_kld"], rel=1e-12)
    assert d["kld_rev"]["ci95"] is not None and d["top5_overlap"]["ci95"] is not None
    row = ladder_rows(parts)[0]
    assert row["kld_rev_mean"] == d["kld_rev"]["mean"] and row["top5_overlap"] == d["top5_overlap"]["mean"]
    assert row["same_top"] == agg["top1"]["agreement"]


def test_markdown_shows_diagnostics(case: dict) -> None:
    text = render_markdown(_report(case, 0, slice(0, N_CTX)))
    assert "## Diagnostics" in text and "reverse KL" in text and "top-10 overlap" in text
    assert "### KLD by reference confidence" in text and "### KLD by reference-entropy decile" in text


def test_identical_sides_have_full_overlap_and_zero_reverse_kl() -> None:
    g = torch.Generator().manual_seed(3)
    a = torch.randn(40, 300, generator=g) * 3
    s = score_logits(a, a.clone(), torch.randint(0, 300, (40,), generator=g))
    labels = [ContextLabel(i, f"d{i}", "prose") for i in range(4)]
    d = summarize(s, np.repeat(np.arange(4), 10), np.tile(np.arange(10), 4), labels, n_boot=50)["diagnostics"]
    assert d["kld_rev"]["mean"] == 0.0 and d["top5_overlap"]["mean"] == 1.0 and d["top10_overlap"]["mean"] == 1.0
    assert d["q_ref_top_mean"] == d["p_ref_top_mean"] and d["same_top"]["fraction"] == 1.0
