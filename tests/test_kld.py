"""llama.cpp's .kld format and statistics block, checked against independent numpy float64 code."""

from __future__ import annotations

import io
import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

from harness.errors import VerificationError
from harness.llamacpp.kld_file import (
    MAGIC,
    decode_rows,
    file_size,
    first_scored,
    nearest_int,
    quantize_rows,
    read_kld,
    row_width,
    rows_per_chunk,
    write_kld,
)
from harness.llamacpp.stats import (
    LlamaPositions,
    compute_stats,
    parse_block,
    positions_from_kld,
    positions_from_scores,
    print_block,
)


def _logits(rng: np.random.Generator, r: int, v: int, spread: float = 4.0) -> np.ndarray:
    return (rng.standard_normal((r, v)) * spread).astype(np.float32)


def _log_softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(1, keepdims=True))


def test_geometry() -> None:
    assert row_width(4096) == 4100 and row_width(5) == 10 and row_width(1) == 6
    assert rows_per_chunk(256) == 127 and rows_per_chunk(8) == 3 and rows_per_chunk(9) == 4
    assert file_size(8, 5, 2) == 20 + 4 * 16 + 2 * 2 * 3 * 10


def test_nearest_int_rounds_half_to_even() -> None:
    v = np.array([0.0, 0.49, 0.5, 1.5, 2.5, 3.5, 65534.5, 65535.0, 7.2], dtype=np.float32)
    assert nearest_int(v).tolist() == [0, 0, 0, 2, 2, 4, 65534, 65535, 7]


def _kld_bytes(tokens: np.ndarray, n_vocab: int, chunks: Iterable[np.ndarray]) -> bytes:
    """The bytes :func:`write_kld` should write, assembled in memory in one piece."""
    buf = io.BytesIO()
    toks = np.asarray(tokens)
    buf.write(MAGIC + np.array([toks.shape[1], n_vocab, toks.shape[0]], dtype="<i4").tobytes())
    buf.write(np.ascontiguousarray(toks, dtype="<i4").tobytes())
    first = first_scored(toks.shape[1])
    for lg in chunks:
        lg = np.asarray(lg, dtype=np.float32)
        if lg.shape[0] == toks.shape[1] - 1:
            lg = lg[first:]
        buf.write(quantize_rows(lg).astype("<u2").tobytes())
    return buf.getvalue()


def test_byte_layout_odd_vocab(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n_ctx, v, n_chunk = 8, 5, 2
    tokens = rng.integers(0, v, size=(n_chunk, n_ctx))
    chunks = [_logits(rng, n_ctx - 1, v) for _ in range(n_chunk)]
    path = write_kld(tmp_path / "a.kld", tokens, v, chunks)
    data = path.read_bytes()
    assert data == _kld_bytes(tokens, v, chunks)
    assert len(data) == file_size(n_ctx, v, n_chunk)
    assert data[:8] == b"_logits_"
    assert struct.unpack("<3i", data[8:20]) == (n_ctx, v, n_chunk)
    assert list(struct.unpack(f"<{n_chunk * n_ctx}i", data[20 : 20 + 4 * n_chunk * n_ctx])) == tokens.reshape(-1).tolist()
    off = 20 + 4 * n_chunk * n_ctx
    nv = row_width(v)
    for c in range(n_chunk):
        for j in range(rows_per_chunk(n_ctx)):
            row = data[off : off + 2 * nv]
            off += 2 * nv
            scale, mlp = struct.unpack("<2f", row[:8])
            q = struct.unpack(f"<{nv - 4}H", row[8:])
            assert q[-1] == 0  # padding of the odd vocabulary
            x = chunks[c][n_ctx // 2 + j].astype(np.float64)  # row j is position n_ctx/2 + j
            mx, mn = x.max(), max(x.min(), x.max() - 16)
            lse = np.log(np.exp(x - mx).sum())
            assert scale == pytest.approx((mx - mn) / 65535, rel=1e-6)
            assert mlp == pytest.approx(mn - mx - lse, abs=1e-5)
            want = [0 if xi <= mn else int(np.rint((xi - mn) / ((mx - mn) / 65535))) for xi in x]
            assert max(abs(a - b) for a, b in zip(q[:v], want)) <= 1
    assert off == len(data)


def test_round_trip_and_decoded_within_step(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    n_ctx, v, n_chunk = 16, 64, 3
    tokens = rng.integers(0, v, size=(n_chunk, n_ctx))
    chunks = [_logits(rng, n_ctx - 1, v, spread=6.0) for _ in range(n_chunk)]
    kf = read_kld(write_kld(tmp_path / "b.kld", tokens, v, chunks))
    assert (kf.n_ctx, kf.n_vocab, kf.n_chunk, kf.first, kf.n_rows) == (n_ctx, v, n_chunk, 8, 7)
    assert np.array_equal(kf.tokens, tokens)
    for c in range(n_chunk):
        exact = _log_softmax64(chunks[c][kf.first :])
        dec = kf.log_probs(c).astype(np.float64)
        scale = np.asarray(kf.rows[c][:, :4]).copy().view(np.float32)[:, 0].astype(np.float64)
        clamp = exact.max(1, keepdims=True) - 16.0
        above = exact > clamp
        err = np.abs(dec - exact)
        # within half a quantization step (+ float32 rounding of the stored min log-prob)
        assert (err[above] <= (scale[:, None] / 2 + 1e-5).repeat(v, 1)[above]).all()
        # entries at or below the clamp decode to the clamp level
        assert np.allclose(dec[~above], np.broadcast_to(clamp, exact.shape)[~above], atol=1e-5)
        assert np.array_equal(kf.targets(c), tokens[c, kf.first + 1 :])


def test_quantization_matches_float64_rounding() -> None:
    rng = np.random.default_rng(2)
    x = _logits(rng, 50, 4096, spread=3.0)
    rows = quantize_rows(x)
    q = rows[:, 4:].astype(np.int64)
    x64 = x.astype(np.float64)
    mx = x64.max(1, keepdims=True)
    mn = np.maximum(x64.min(1, keepdims=True), mx - 16)
    want = np.where(x64 > mn, np.rint((x64 - mn) / ((mx - mn) / 65535)), 0)
    diff = np.abs(q - want)
    assert diff.max() <= 1 and (diff == 0).mean() > 0.999
    assert q.max() == 65535  # the maximum maps to the top code


def test_constant_row_and_wide_spread() -> None:
    x = np.zeros((2, 7), dtype=np.float32)
    x[1] = np.array([100, -100, 0, 50, 99.5, -1e4, 84], dtype=np.float32)  # spread > 16: clamped
    rows = quantize_rows(x)
    assert rows[0, :4].view(np.float32)[0] == 0 and (rows[0, 4:] == 0).all()
    dec = decode_rows(rows, 7)
    assert np.allclose(dec[0], -np.log(7), atol=1e-6)
    scale = rows[1, :4].view(np.float32)[0]
    assert scale == pytest.approx(16 / 65535, rel=1e-6)
    assert rows[1, 4 + 1] == 0 and rows[1, 4 + 5] == 0 and rows[1, 4 + 6] == 0  # below max-16 -> 0
    assert rows[1, 4] == 65535


def test_reader_fails_closed(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 6, size=(1, 8))
    p = write_kld(tmp_path / "c.kld", tokens, 6, [_logits(rng, 7, 6)])
    data = p.read_bytes()
    (tmp_path / "trunc.kld").write_bytes(data[:-2])
    (tmp_path / "trail.kld").write_bytes(data + b"\0\0")
    (tmp_path / "magic.kld").write_bytes(b"_logitz_" + data[8:])
    bad_tok = bytearray(data)
    bad_tok[20:24] = struct.pack("<i", 6)
    (tmp_path / "tok.kld").write_bytes(bytes(bad_tok))
    for name, what in (("trunc", "file size"), ("trail", "file size"), ("magic", "magic"), ("tok", "token ids")):
        with pytest.raises(VerificationError, match=what):
            read_kld(tmp_path / f"{name}.kld")


# ----------------------------------------------------------------------------- statistics


def _independent_kld(rows: np.ndarray, x: np.ndarray, v: int) -> np.ndarray:
    """llama.cpp's KLD in float64: decoded base log-probs > -16 only."""
    head = rows[:, :4].copy().view(np.float32).astype(np.float64)
    plb = head[:, :1] * rows[:, 4 : 4 + v].astype(np.float64) + head[:, 1:2]
    lq = _log_softmax64(x)
    keep = plb > -16
    return np.where(keep, np.exp(plb) * (plb - lq), 0).sum(1)


def test_positions_from_kld_against_float64() -> None:
    rng = np.random.default_rng(4)
    v, r = 512, 300
    base = _logits(rng, r, v, spread=3.0)
    cand = (base + 0.05 * rng.standard_normal((r, v))).astype(np.float32)
    rows = quantize_rows(base)
    tok = rng.integers(0, v, size=r)
    pos = positions_from_kld(rows, cand, tok, v)
    # llama.cpp forms every term in float32 ((log p - log q) of O(10) numbers): ~1e-6 absolute per position
    assert np.allclose(pos.kld, _independent_kld(rows, cand, v), rtol=1e-3, atol=2e-6)
    assert abs(pos.kld.mean() - _independent_kld(rows, cand, v).mean()) < 1e-3 * pos.kld.mean()
    lq = _log_softmax64(cand)
    assert np.allclose(pos.nll, -lq[np.arange(r), tok], atol=1e-4)
    lp = _log_softmax64(base)
    lpt = lp[np.arange(r), tok]
    clamp = lp.max(1) - 16  # tokens below the clamp decode to it: llama.cpp's NLL(base) is capped
    assert np.allclose(pos.nll_base, -np.maximum(lpt, clamp), atol=1e-3)
    assert (lpt < clamp).any()
    assert np.allclose(pos.p_diff, np.exp(lq[np.arange(r), tok]) - np.exp(np.maximum(lpt, clamp)), atol=1e-4)
    exact_kld = (np.exp(lp) * (lp - lq)).sum(1)
    assert abs(pos.kld.mean() - exact_kld.mean()) < 0.02 * exact_kld.mean()
    # llama.cpp's "same top": the first maximum of the *decoded* base row (float64 decode here, independent of the
    # harness's float32 one) against the first maximum of the candidate's logits, position by position
    head = rows[:, :4].copy().view(np.float32).astype(np.float64)
    plb64 = head[:, :1] * rows[:, 4 : 4 + v].astype(np.float64) + head[:, 1:2]
    expected_same = plb64.argmax(1) == cand.argmax(1)
    assert np.array_equal(pos.same_top, expected_same)
    assert 0 < expected_same.sum() < r  # both outcomes occur: a comparison that can fail either way


def test_identical_candidate_is_near_zero() -> None:
    rng = np.random.default_rng(5)
    x = _logits(rng, 200, 256)
    pos = positions_from_kld(quantize_rows(x), x, rng.integers(0, 256, 200), 256)
    assert pos.same_top.all()
    # not 0: the decoded base probabilities are off by up to half a step (1.2e-4 in log) each and do
    # not sum to 1, so llama.cpp's KLD has a first-order, signed error of ~1e-5 per position
    assert np.abs(pos.kld).max() < 1e-4
    assert abs(pos.kld.mean()) < 1e-5
    assert np.abs(pos.p_diff).max() < 1e-4


def test_compute_stats_formulas() -> None:
    rng = np.random.default_rng(6)
    n = 1000
    nll_b = rng.gamma(2.0, 1.5, n).astype(np.float32)
    nll = (nll_b + rng.normal(0.02, 0.1, n)).astype(np.float32)
    kld = rng.gamma(0.5, 0.01, n)
    pdiff = rng.normal(0, 0.02, n).astype(np.float32)
    top = rng.random(n) < 0.93
    s = compute_stats(LlamaPositions(nll, nll_b, kld, pdiff, top))
    a, b = nll.astype(np.float64), nll_b.astype(np.float64)
    se = lambda z: np.sqrt(z.var() / (n - 1))  # noqa: E731  (population variance / (n-1), as llama.cpp)
    assert s["ppl_q"][0] == pytest.approx(np.exp(a.mean()), rel=1e-9)
    assert s["ppl_q"][1] == pytest.approx(np.exp(a.mean()) * se(a), rel=1e-5)
    assert s["ppl_base"][0] == pytest.approx(np.exp(b.mean()), rel=1e-9)
    cov = ((a * b).mean() - a.mean() * b.mean()) / (n - 1)
    assert s["cor_ln_ppl"] == pytest.approx(cov / (se(a) * se(b)), rel=1e-4)
    assert s["cor_ln_ppl"] == pytest.approx(np.corrcoef(a, b)[0, 1], rel=1e-4)
    assert s["ln_ppl_ratio"][0] == pytest.approx(a.mean() - b.mean(), abs=1e-9)
    assert s["ln_ppl_ratio"][1] == pytest.approx(se(a - b), rel=1e-3)
    assert s["kld_mean"][0] == pytest.approx(kld.mean(), rel=1e-12)
    assert s["kld_mean"][1] == pytest.approx(se(kld), rel=1e-9)
    for lab, f in (("99.9%", 99.9), ("99.0%", 99), ("95.0%", 95), ("10.0%", 10), (" 0.1%", 0.1)):
        assert s["kld_percentiles"][lab] == pytest.approx(np.percentile(kld.astype(np.float32), f), rel=1e-5)
    assert s["kld_median"] == pytest.approx(np.median(kld.astype(np.float32)), rel=1e-6)
    assert s["kld_max"] == pytest.approx(kld.max(), rel=1e-7)
    p = pdiff.astype(np.float64)
    assert s["dp_mean"][0] == pytest.approx(p.mean(), rel=1e-6, abs=1e-9)
    assert s["dp_rms"][0] == pytest.approx(np.sqrt((p**2).mean()), rel=1e-6)
    assert s["same_top"][0] == pytest.approx(top.mean())
    assert s["same_top"][1] == pytest.approx(np.sqrt(top.mean() * (1 - top.mean()) / (n - 1)))
    text = print_block(s)
    assert text.splitlines()[0] == "====== Perplexity statistics ======"
    assert len(text.splitlines()) == 39
    parsed = parse_block(text)
    assert parsed["Mean    KLD"] == pytest.approx(kld.mean(), abs=1e-6)
    assert parsed["Same top p"] == pytest.approx(100 * top.mean(), abs=1e-3)
    assert parsed["Mean PPL(Q)"] == pytest.approx(np.exp(a.mean()), abs=1e-6)
    assert "Mean    KLD: " in text and " ± " in text and "RMS Δp    : " in text


def test_block_needs_100_positions() -> None:
    z = np.zeros(99, dtype=np.float32)
    s = compute_stats(LlamaPositions(z + 1, z + 1, z.astype(np.float64), z, np.ones(99, bool)))
    assert print_block(s) == ""


def test_positions_from_scores() -> None:
    from harness.metrics.scores import PositionScores

    s = PositionScores.empty(3)
    s.kld[:] = [0.1, 0.2, 0.3]
    s.nll_ref[:] = [1.0, 2.0, 3.0]
    s.nll_cand[:] = [1.5, 2.0, 2.5]
    s.argmax_cand[:] = [0, 1, 0]
    pos = positions_from_scores(s)
    assert pos.same_top.tolist() == [True, False, True]
    assert np.allclose(pos.p_diff, np.exp(-s.nll_cand) - np.exp(-s.nll_ref), atol=1e-7)


# ----------------------------------------------------------------------------- export / import


def test_export_import_round_trip(fidelity_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.capture.store import CaptureStore
    from harness.cli.main import main
    from harness.inputs.head import load_head
    from harness.inputs.suite import Suite
    from harness.llamacpp.kld_file import first_scored
    from harness.llamacpp.kld_tools import llamacpp_positions, store_logits

    root = fidelity_project
    out = tmp_path / "ref.kld"
    assert main(["kld", "export", "--suite", str(root / "suite"), "--reference", str(root / "reference"),
                 "--head", str(root / "lm_head.safetensors"), "--out", str(out)]) == 0
    # the printed llama-perplexity command must match the engine's settings (no flash attention, no repacking)
    assert " -fa off -nr" in capsys.readouterr().out
    suite = Suite.load(root / "suite")
    head = load_head(root / "lm_head.safetensors")
    ref = CaptureStore.open(root / "reference", suite)
    kf = read_kld(out)
    assert (kf.n_chunk, kf.n_ctx, kf.n_vocab) == (suite.n_contexts, suite.n_ctx, int(head.weight.shape[0]))
    first = first_scored(suite.n_ctx)
    # decoded log-probs within one quantization step of the exact log-softmax of the fp32 logits
    x = store_logits(ref, 3, head)[first:]
    exact = _log_softmax64(x)
    dec = kf.log_probs(3).astype(np.float64)
    above = exact > exact.max(1, keepdims=True) - 16
    assert np.abs(dec - exact)[above].max() < 16 / 65535
    # the reference against itself: llama.cpp's KLD ~ 0, all tops agree
    pos = llamacpp_positions(kf, suite, ref, head)
    assert len(pos) == suite.n_contexts * rows_per_chunk(suite.n_ctx)
    assert pos.same_top.all() and np.abs(pos.kld).max() < 1e-4 and abs(pos.kld.mean()) < 1e-5
    # import: suite with the same tokens, logits store with the decoded rows
    assert main(["kld", "import", str(out), "--out", str(tmp_path / "imp"), "--shards", "2"]) == 0
    s2 = Suite.load(tmp_path / "imp" / "suite")
    assert np.array_equal(s2.tokens, suite.tokens) and s2.n_shards == 2
    st = CaptureStore.open(tmp_path / "imp" / "reference", s2)
    assert st.kind == "logits" and st.identity["scored_from_row"] == first
    t = st.load(3).numpy()
    assert np.array_equal(t[first:], kf.log_probs(3)) and not t[:first].any()
    # re-export of the imported store reproduces the file byte for byte (decoded rows re-quantize stably)
    assert main(["kld", "export", "--suite", str(tmp_path / "imp" / "suite"), "--reference", str(tmp_path / "imp" / "reference"),
                 "--out", str(tmp_path / "again.kld")]) == 0
    again = read_kld(tmp_path / "again.kld")
    q1 = np.asarray(kf.rows)[..., 4:].astype(np.int64)
    q2 = np.asarray(again.rows)[..., 4:].astype(np.int64)
    assert np.abs(q1 - q2).max() <= 1


def test_stats_cli(fidelity_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from harness.capture.loop import capture
    from harness.cli.main import main

    root = fidelity_project
    out = tmp_path / "ref.kld"
    assert main(["kld", "export", "--suite", str(root / "suite"), "--reference", str(root / "reference"),
                 "--head", str(root / "lm_head.safetensors"), "--out", str(out)]) == 0
    cand = capture("transformers", root / "models" / "bad", root / "suite", tmp_path / "bad", progress=False)
    capsys.readouterr()
    assert main(["kld", "stats", "--kld", str(out), "--suite", str(root / "suite"), "--candidate", str(cand.root),
                 "--reference", str(root / "reference"), "--head", str(root / "lm_head.safetensors"),
                 "--n-boot", "200", "--out", str(tmp_path / "s.json")]) == 0
    text = capsys.readouterr().out
    assert text.count("====== KL divergence statistics ======") == 2
    doc = json.loads((tmp_path / "s.json").read_text())
    approx, exact = doc["llamacpp"]["kld_mean"][0], doc["exact"]["kld_mean"][0]
    assert doc["harness"]["kld_mean"] == pytest.approx(exact, rel=1e-9)
    assert approx == pytest.approx(exact, rel=0.05)
