"""A candidate's ``tags`` as keywords of its cases, so ``pytest -k TAG`` selects them.

pytest's ``-k`` matches an expression against each item's keywords (case-insensitive substrings of its
name, its markers and its extra keywords). A candidate's tags from ``fidelity.toml`` are added to the extra
keywords of every case that measures that candidate: its *candidate x shard* cases, its tail case, and
each declared pair that involves it (the pair gets the tags of both sides). Window cases cover every
candidate and get none. ``pytest fidelity.toml -k rtn`` then runs every candidate tagged ``rtn`` whatever
its name; ``-k "rtn and not int3"``, ``-k "hqq or gptq"`` combine tags and names as usual.

Tags are checked when the configuration loads (:data:`harness.inputs.config.TAG_RE`) so that every tag can be
written in a ``-k`` expression.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from harness.inputs.config import PairConfig

if TYPE_CHECKING:
    import pytest

    from harness.inputs.config import FidelityConfig


def case_candidates(params: Mapping[str, object]) -> tuple[str, ...]:
    """The candidates a case measures, from its parametrization (pytest's ``callspec.params``): a candidate x shard
    case (``fidelity_case = (name, shard)``), a tail case (``fidelity_tail_candidate = name``) or a declared
    pair (``fidelity_pair``, both sides). Any other case (a window, a test of one's own): none."""
    case = params.get("fidelity_case")
    if isinstance(case, (tuple, list)):
        return (str(case[0]),)
    if "fidelity_tail_candidate" in params:
        return (str(params["fidelity_tail_candidate"]),)
    pair = params.get("fidelity_pair")
    if isinstance(pair, PairConfig):
        return (str(pair.a), str(pair.b))
    return ()


def tag_keywords(config: FidelityConfig, params: Mapping[str, object]) -> set[str]:
    """The tags of every candidate the case with these parameters measures (names unknown to the file: none)."""
    tags = {c.name: c.tags for c in config.candidates}
    return {t for name in case_candidates(params) for t in tags.get(name, ())}


def add_tag_keywords(item: pytest.Item, config: FidelityConfig) -> None:
    """Add the tags of the candidates ``item`` measures to its extra keywords (what ``-k`` matches)."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        item.extra_keyword_matches.update(tag_keywords(config, callspec.params))
