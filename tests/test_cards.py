"""The cards the Hub reads: ``fidelity publish``'s README.md (a model card with model-index results) and
``fidelity dataset build``'s README.md (a dataset card), parsed back with huggingface_hub's own parser."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.cli.main import main

CARD = '\n[card]\nbase_model = "Qwen/Qwen3-0.6B"\nlicense = "apache-2.0"\n'


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory, fidelity_run: Path) -> Path:
    """The tiny project after a run of its shard and tail cases (baselines and reports), with a ``[card]``."""
    root = tmp_path_factory.mktemp("cards") / "p"
    shutil.copytree(fidelity_run, root, symlinks=True)
    with (root / "fidelity.toml").open("a", encoding="utf-8") as fh:
        fh.write(CARD)
    return root


def _publish(root: Path, out: Path) -> Path:
    assert main(["publish", "--reports", str(root / "reports"), "--out", str(out), "--config", str(root / "fidelity.toml")]) == 0
    return out


@pytest.mark.slow  # one run of the tiny project (captures and scoring), then publish
def test_published_card_parses_with_model_index_per_candidate(reports: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from huggingface_hub import ModelCard
    from huggingface_hub.repocard_data import model_index_to_eval_results

    out = _publish(reports, tmp_path / "pub")
    card = ModelCard.load(out / "README.md")  # huggingface_hub's own loader and parser
    meta: dict[str, Any] = card.data.to_dict()
    assert meta["license"] == "apache-2.0" and meta["pipeline_tag"] == "text-generation"
    assert meta["base_model"] == "Qwen/Qwen3-0.6B" and meta["base_model_relation"] == "quantized"
    assert {"fidelity", "kl-divergence", "quantized", "noise-0.02", "noise-0.5"} <= set(meta["tags"])
    name, results = model_index_to_eval_results(meta["model-index"])
    assert name == "Qwen/Qwen3-0.6B quantization ladder"
    published = json.loads((out / "results.json").read_text())
    suite_sha = published["suite"]["suite_token_sha256"]
    assert sorted(r.metric_config for r in results) == ["bad", "good"]
    for r in results:  # each candidate's mean KLD, its interval, the suite as the dataset with its sha256
        agg = published["candidates"][r.metric_config]["aggregate"]
        shards = published["candidates"][r.metric_config]["shards"]
        # the mean recomputed independently: every per-context KLD sum over every position of every shard
        kld_sum = sum(row["sum_kld"] for s in shards for row in s["metrics"]["contexts"])
        n = sum(row["positions"] for s in shards for row in s["metrics"]["contexts"])
        assert r.metric_value == pytest.approx(kld_sum / n, rel=1e-9)
        assert r.metric_type == "kl_divergence" and r.metric_name == f"mean KL divergence vs BF16 ({r.metric_config})"
        assert r.task_type == "text-generation"
        assert r.dataset_type == "fidelity-suite" and r.dataset_revision == suite_sha
        assert r.dataset_args is not None and r.dataset_args["suite_token_sha256"] == suite_sha
        assert r.metric_args is not None and r.metric_args["unit"] == "nats"
        assert r.metric_args["shards"] == [0, 1, 2, 3] and r.metric_args["n_positions"] == n
        ci = agg["kld"]["ci95"]
        if ci is None:  # the tiny suite has too few source clusters for an interval: said so, not invented
            assert r.metric_args["interval"].startswith("not estimable") and "ci95_low" not in r.metric_args
        else:
            assert [r.metric_args["ci95_low"], r.metric_args["ci95_high"]] == ci
    # the body: the ladder table and both plots by relative links to files of the set
    body = card.text
    assert "| candidate" in body and "| good " in body and "| bad " in body
    for png in ("kld-vs-size.png", "tails.png"):
        assert f"]({png})" in body and (out / png).is_file()
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0  # every file (both plots included) listed and re-derived
    assert "OK (8 files" in capsys.readouterr().out
    listed = {line.split("  ", 1)[1] for line in (out / "checksums.txt").read_text().splitlines()}
    assert {"README.md", "kld-vs-size.png", "tails.png"} <= listed


@pytest.mark.slow  # one run of the tiny project (captures and scoring), then publish
def test_verify_refuses_a_resealed_card_with_another_number(reports: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from huggingface_hub import ModelCard

    from harness.reports.report_set import write_checksums

    out = _publish(reports, tmp_path / "pub")
    card = ModelCard.load(out / "README.md")
    meta = card.data.to_dict()
    metric = meta["model-index"][0]["results"][0]["metrics"][0]
    metric["value"] = metric["value"] / 2  # a better number than measured, resealed
    import yaml

    (out / "README.md").write_text("---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n" + card.text)
    write_checksums(out)
    capsys.readouterr()
    assert main(["verify", str(out)]) == 1
    err = capsys.readouterr().err
    assert "README.md: metadata.model-index" in err and "value: expected" in err


@pytest.mark.slow  # one run of the tiny project (captures and scoring), then publish
def test_card_without_base_model_says_unknown_licence(reports: Path, tmp_path: Path) -> None:
    from huggingface_hub import ModelCard

    toml = reports / "fidelity.toml"
    plain = tmp_path / "plain.toml"
    plain.write_text(toml.read_text().replace(CARD, "\n"))
    for d in ("suite", "baselines", "models", "reference"):
        (tmp_path / d).symlink_to(reports / d)
    (tmp_path / "lm_head.safetensors").symlink_to(reports / "lm_head.safetensors")
    (tmp_path / "lm_head.json").symlink_to(reports / "lm_head.json")
    assert main(["publish", "--reports", str(reports / "reports"), "--out", str(tmp_path / "pub"), "--config", str(plain)]) == 0
    meta = ModelCard.load(tmp_path / "pub" / "README.md").data.to_dict()
    assert meta["license"] == "unknown" and "base_model" not in meta and "base_model_relation" not in meta
    assert meta["model-index"][0]["name"] == "bf16 quantization ladder"


ROOT = Path(__file__).resolve().parents[1]


def _dataset_card(out: Path) -> tuple[dict[str, Any], str]:
    from huggingface_hub import DatasetCard

    card = DatasetCard.load(out / "README.md")  # huggingface_hub's own loader and parser
    return card.data.to_dict(), card.text


def test_dataset_card_of_the_embedded_default_parses(tmp_path: Path) -> None:
    fix = ROOT / "fixtures"
    assert main(["dataset", "build", "--config", str(ROOT / "fidelity.toml"), "--corpus", str(fix / "corpus"),
                 "--tokenizer", str(fix / "model" / "tokenizer.json"), "--reference-shards", "0", "--out",
                 str(tmp_path / "ds")]) == 0
    meta, body = _dataset_card(tmp_path / "ds")
    suite = json.loads((fix / "suite" / "suite.json").read_text())
    assert {r["licence"] for r in suite["documents"].values()} == {"PSF-2.0"}
    assert meta["license"] == "psf-2.0"  # every document's recorded licence, as the Hub spells ids
    assert meta["task_categories"] == ["text-generation"] and meta["size_categories"] == ["n<1K"]  # 96 contexts
    assert {"fidelity", "kl-divergence"} <= set(meta["tags"])
    assert meta["pretty_name"] == f"fidelity reference dataset {suite['suite_token_sha256'][:12]}"
    assert f"| PSF-2.0 | Python 3.11 documentation, Debian python3.11-doc | {len(suite['documents'])} |" in body
    assert "unknown" not in body
    assert main(["verify", str(tmp_path / "ds")]) == 0


def test_dataset_card_says_unknown_for_documents_without_licence(tmp_path: Path, fidelity_project: Path,
                                                                  tiny_corpus: Path, tiny_tokenizer: Path) -> None:
    assert main(["dataset", "build", "--config", str(fidelity_project / "fidelity.toml"), "--corpus", str(tiny_corpus),
                 "--tokenizer", str(tiny_tokenizer), "--reference-shards", "0", "--out", str(tmp_path / "ds")]) == 0
    meta, body = _dataset_card(tmp_path / "ds")
    n_docs = len(json.loads((fidelity_project / "suite" / "suite.json").read_text())["documents"])
    assert meta["license"] == "unknown" and meta["size_categories"] == ["n<1K"]
    assert f"{n_docs} of {n_docs} documents have no recorded licence" in body
    assert f"| unknown | unknown | {n_docs} |" in body


@pytest.mark.parametrize(("n", "bucket"), [(0, "n<1K"), (999, "n<1K"), (1000, "1K<n<10K"), (99_999, "10K<n<100K"),
                                           (10**6, "1M<n<10M"), (10**9, "n>1B")])
def test_size_category_buckets(n: int, bucket: str) -> None:
    from harness.dataset.card import size_category

    assert size_category(n) == bucket
