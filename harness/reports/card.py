"""The published set's ``README.md`` as a Hugging Face model card (``fidelity publish``).

Reasoning: docs/reports.md §"Cards the Hugging Face Hub reads".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict

from harness.engines.hub import hub_origin
from harness.io.escape import md, md_code
from harness.reports.aggregate import Aggregate
from harness.reports.suite_shape import SuiteJSON

if TYPE_CHECKING:
    from huggingface_hub import EvalResult, ModelCardData

    from harness.inputs.config import FidelityConfig

#: The metric every candidate's evaluation result reports.
METRIC_TYPE = "kl_divergence"
METRIC_NAME = "mean KL divergence vs BF16"
TASK_TYPE = "text-generation"
TASK_NAME = "fidelity to the BF16 original (exact full-vocabulary KL divergence)"
#: The model-index dataset type of a fidelity suite (its revision is the suite's sha256).
DATASET_TYPE = "fidelity-suite"
BASE_TAGS = ("fidelity", "kl-divergence", "quantized")
INTERVAL = "95% studentized source-cluster bootstrap"


class CardInfo(TypedDict):
    """What the card takes from the configuration (``results.json``'s ``card``): the BF16 original's Hub id,
    the license and the reference's name (each None when not given)."""

    base_model: str | None
    license: str | None
    reference: str | None


class CardSuite(SuiteJSON):
    """The suite as the card's ``model-index`` names it: its recorded block and its number of contexts."""

    n_contexts: int


def card_info(config: FidelityConfig | None) -> CardInfo:
    """What the card needs from the configuration (recorded in ``results.json`` as ``card``, so ``fidelity
    verify`` re-renders the card without it): ``base_model``, ``license`` and the reference's name."""
    card = getattr(config, "card", None)
    base = getattr(card, "base_model", None)
    ref_model = None if config is None else config.reference.model
    if base is None and ref_model is not None:  # a reference given as hf://org/repo@revision names its repository
        origin = hub_origin(ref_model)
        base = None if origin is None else origin["repo_id"]
    return {"base_model": base, "license": getattr(card, "license", None),
            "reference": None if config is None else config.reference.name}


def _tags(aggs: Mapping[str, Aggregate]) -> list[str]:
    recorded = [a["comparability"]["candidate"].get("tags") for a in aggs.values()]
    own = sorted({str(t) for tags in recorded if isinstance(tags, list) for t in tags} - set(BASE_TAGS))
    return [*BASE_TAGS, *own]


def eval_results(aggs: Mapping[str, Aggregate], suite: CardSuite) -> list[EvalResult]:
    """One :class:`~huggingface_hub.EvalResult` per candidate, in ladder order (by mean KLD)."""
    from huggingface_hub import EvalResult

    sha = str(suite["suite_token_sha256"])
    out = []
    for name, a in sorted(aggs.items(), key=lambda t: (t[1]["kld"]["mean"], t[0])):
        ci = a["kld"]["ci95"]
        args: dict[str, object] = {"unit": "nats", "interval": INTERVAL if ci else
                                f"not estimable ({a['n_clusters']} source clusters; at least 8 needed)"}
        if ci:
            args.update(ci95_low=float(ci[0]), ci95_high=float(ci[1]))
        args.update(n_positions=int(a["n_positions"]), shards=[int(s["index"]) for s in a["shards"]],
                    score_from=int(a["score_from"]))
        out.append(EvalResult(
            task_type=TASK_TYPE, task_name=TASK_NAME,
            dataset_type=DATASET_TYPE, dataset_name=f"fidelity suite {sha[:12]}", dataset_revision=sha,
            dataset_args={"suite_token_sha256": sha, "n_ctx": int(suite["n_ctx"]), "n_contexts": int(suite["n_contexts"])},
            metric_type=METRIC_TYPE, metric_name=f"{METRIC_NAME} ({name})", metric_value=float(a["kld"]["mean"]),
            metric_config=name, metric_args=args))
    return out


def card_data(info: CardInfo | None, aggs: Mapping[str, Aggregate], suite: CardSuite) -> ModelCardData:
    """The card's :class:`~huggingface_hub.ModelCardData`."""
    from huggingface_hub import ModelCardData

    base = info["base_model"] if info else None
    return ModelCardData(
        license=(info["license"] if info else None) or "unknown", tags=_tags(aggs), pipeline_tag=TASK_TYPE,
        base_model=base, model_name=model_name(info), eval_results=eval_results(aggs, suite),
        base_model_relation="quantized" if base else None)  # None: not written


def model_name(info: CardInfo | None) -> str:
    """The model-index name: the base model's Hub id, else the reference's name, as a ladder."""
    named = (info["base_model"] or info["reference"]) if info else None
    return f"{named or 'reference'} quantization ladder"


def render_body(info: CardInfo | None, ladder_lines: Sequence[str], has_tails: bool, details: str) -> str:
    """The card's Markdown: title, what is measured, the ladder, the plots (relative links), then ``details``."""
    base = info["base_model"] if info else None
    ref = md_code((info["reference"] if info else None) or "reference")
    origin = (f"the BF16 original {ref} ([{md(base)}](https://huggingface.co/{base}))" if base else f"the BF16 original {ref}")
    lines = [f"# {md(model_name(info))}", "",
             f"Exact full-vocabulary KL divergence of each candidate's next-token distribution from {origin}, in "
             f"nats, with its {INTERVAL} interval (the same numbers are in this card's `model-index`).", "",
             "## Ladder", "", *ladder_lines, "",
             "![Mean KLD versus on-disk size, with 95% intervals and the Pareto frontier](kld-vs-size.png)", ""]
    if has_tails:
        lines += ["![KLD tail: fraction of positions with KLD at least x, per candidate](tails.png)", ""]
    return "\n".join(lines) + "\n" + details


def render_card(info: CardInfo | None, aggs: Mapping[str, Aggregate], suite: CardSuite,
                ladder_lines: Sequence[str], has_tails: bool, details: str) -> str:
    """The whole ``README.md``: the metadata block written by huggingface_hub, then the body."""
    from huggingface_hub import ModelCard

    data = card_data(info, aggs, suite)
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n{render_body(info, ladder_lines, has_tails, details)}")
    return str(card)


def split_card(text: str) -> tuple[dict[str, object], str]:
    """``(metadata, body)`` of a card as huggingface_hub parses it (metadata ``{}`` when there is no block)."""
    from huggingface_hub import ModelCard

    card = ModelCard(text, ignore_metadata_errors=True)
    return card.data.to_dict(), card.text  # type: ignore[no-untyped-call]
