"""The dataset folder's ``README.md`` as a Hugging Face dataset card (``fidelity dataset build``).

Reasoning: docs/reports.md §"Cards the Hugging Face Hub reads".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from harness.io.md_table import md_table

TAGS = ("fidelity", "kl-divergence", "quantization")
UNKNOWN = "unknown"
#: The Hub's size buckets (upper bounds, exclusive) and their names.
_SIZES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
          (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"), (1_000_000_000, "100M<n<1B"))


def size_category(n: int) -> str:
    """The Hub's ``size_categories`` bucket of ``n`` rows (here: contexts)."""
    return next((name for bound, name in _SIZES if n < bound), "n>1B")


def licences(documents: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The documents' licences (lower-cased), sorted; ``unknown`` for a document without one."""
    return sorted({str(r.get("licence")).lower() if r.get("licence") else UNKNOWN for r in documents.values()})


def provenance_lines(documents: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A Markdown table: documents per (licence, source), ``unknown`` where none was recorded."""
    counts = Counter((str(r.get("licence") or UNKNOWN), _source(r.get("source"))) for r in documents.values())
    return md_table(["licence", "source", "documents"], [[lic, src, n] for (lic, src), n in sorted(counts.items())])


def _source(source: Any) -> str:
    """A source as the table shows it: a per-document path after ``: `` is dropped, so one corpus is one row."""
    if not source:
        return UNKNOWN
    return str(source).split(": ", 1)[0].replace("|", "\\|")


def render_dataset_card(doc: Mapping[str, Any], n_contexts: int, documents: Mapping[str, Mapping[str, Any]],
                        body: Sequence[str]) -> str:
    """The whole ``README.md``: the metadata block written by huggingface_hub, then ``body`` and the
    provenance table."""
    from huggingface_hub import DatasetCard, DatasetCardData

    lic = licences(documents)
    data = DatasetCardData(
        license=lic[0] if len(lic) == 1 else lic, tags=list(TAGS), task_categories=["text-generation"],
        size_categories=[size_category(n_contexts)],
        pretty_name=f"fidelity reference dataset {str(doc['suite_token_sha256'])[:12]}")
    missing = sum(1 for r in documents.values() if not r.get("licence"))
    note = ([f"{missing} of {len(documents)} documents have no recorded licence (shown as `{UNKNOWN}`): "
             "check their terms before redistributing this dataset.", ""] if missing else [])
    text = "\n".join([*body, "## Sources and licences", "", *note, *provenance_lines(documents), ""])
    return str(DatasetCard(f"---\n{data.to_yaml()}\n---\n\n{text}"))
