"""Report kind ``allocation``: a test marked ``@pytest.mark.fidelity_allocate(base=..., budget=..., ...)`` that asks
for the ``fidelity_allocation`` fixture gets a layout searched for the budget (:func:`harness.allocation.plan.allocate`),
built, scored as ordinary candidates of the configuration's suite and reference, and compared on the same positions
with the uniform layout whose bytes set the budget (:func:`harness.run.allocation_check.check_allocation`).

The fixture **fails the test** when a proposal is worse than that comparator: the paired interval of
``KLD(proposal) − KLD(comparator)`` lies above zero. With ``expect="better"`` it also fails unless the interval lies
below zero. Marker arguments (all optional but ``base`` and ``budget``): ``family`` (``project``), ``choices``,
``by`` (``block``), ``shards`` (``"0"``: where the effects are measured), ``check_shards`` (every shard),
``uniforms`` (default: the budget's choice alone), ``gguf_bf16`` (GGUF family), ``n_boot``, ``expect``.

Artifacts: ``allocation/<test name>/`` (:func:`harness.allocation.render.write_allocation`), written by the fixture.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.allocation.choices import DEFAULT_CHOICES, parse_choices, parse_subset
from harness.allocation.family import Family, GgufFamily, ProjectFamily
from harness.allocation.records import AllocationCheck, AllocationDoc
from harness.allocation.render import write_allocation
from harness.plugin.kinds import CaseRun, JSONDoc, Uncollected, Written
from harness.run.allocation_check import check_allocation

if TYPE_CHECKING:
    import pytest

_KEYS = {"base", "budget", "family", "choices", "by", "shards", "check_shards", "uniforms", "gguf_bf16", "n_boot", "expect"}


def verdict_problems(check: AllocationCheck, expect: str | None) -> list[str]:
    """Why the proposals fail the marker's paired test (empty: they pass)."""
    out = []
    for p in check["proposals"]:
        c = p.get("comparator")
        if c is None:
            out.append(f"{p['candidate']}: no uniform layout of the budget's size to compare with")
            continue
        lo, hi = c["paired"]["ci95"] or (float("nan"), float("nan"))
        text = (f"{p['candidate']} ({p['on_disk_bytes']} bytes) vs {c['candidate']} ({c['on_disk_bytes']} bytes): "
                f"KLD {p['measured_kld']['value']:.4g} vs {c['measured_kld']['value']:.4g}, paired difference "
                f"{c['paired']['diff']:.4g} [{lo:.4g}, {hi:.4g}]")
        if not lo <= 0:
            out.append(text + ": the proposal is worse")
        elif expect == "better" and not hi < 0:
            out.append(text + ": not shown better (expect='better')")
    return out


class Allocation(Uncollected):
    """A layout searched for a budget, built, and held to be no worse than the uniform layout of its size."""

    name = "allocation"
    #: never sent: the fixture writes its own files
    payload: type[JSONDoc] = dict
    marker = "fidelity_allocate"
    marker_doc = ("fidelity_allocate(base, budget, family='project', choices=None, by='block', shards='0', "
                  "check_shards=None, uniforms=None, expect=None): search a layout for the budget, build and score it, "
                  "and fail when it is worse than the uniform layout of that size (fixture fidelity_allocation)")
    fixture = "fidelity_allocation"

    def case(self, run: CaseRun, request: pytest.FixtureRequest, param: object) -> AllocationDoc:
        """The marker's search, built and checked; written to ``<report dir>/allocation/<test name>/``."""
        import pytest

        from harness.allocation.plan import allocate, request_from_args  # torch: loaded when a search runs

        mark = request.node.get_closest_marker(self.marker)
        kw = dict(mark.kwargs) if mark is not None else {}
        if mark is None or "base" not in kw or "budget" not in kw or set(kw) - _KEYS:
            pytest.fail(f"{self.fixture} needs @pytest.mark.{self.marker}(base=..., budget=..., ...) with keys among "
                        f"{', '.join(sorted(_KEYS))}" + (f"; unknown: {sorted(set(kw) - _KEYS)}" if set(kw) - _KEYS else ""),
                        pytrace=False)
        cfg = run.plan.config
        if cfg.reference.model is None:
            pytest.fail("fidelity_allocate needs reference.model in the configuration", pytrace=False)
        fam_name = str(kw.get("family", "project"))
        choices = parse_choices(fam_name, kw.get("choices") or DEFAULT_CHOICES.get(fam_name, ""))
        out = Path(request.config.getoption("fidelity_report_dir")) / "allocation" / request.node.name
        with tempfile.TemporaryDirectory(prefix="fidelity-allocate-") as tmp:
            family: Family
            if fam_name == "gguf":
                family = GgufFamily(cfg.reference.model, Path(kw["gguf_bf16"]), choices, Path(tmp))
            else:
                family = ProjectFamily(cfg.reference.model, choices)
            req = request_from_args(cfg.reference.model, cfg.suite, family, str(kw["base"]), str(kw["budget"]),
                                    grouping=str(kw.get("by", "block")), shards=kw.get("shards", "0"),
                                    n_boot=int(kw.get("n_boot", cfg.n_boot)), progress=False)
            result = allocate(req)
            budgets = [p["budget_spec"] for p in result["proposals"] if p["budget_spec"] in family.choices]
            uniforms = parse_subset(fam_name, kw["uniforms"], family.choices) if kw.get("uniforms") else budgets
            base = Path(str(kw["base"]))
            check = check_allocation(cfg, result, family, out / "check", uniforms=uniforms, shards=kw.get("check_shards"),
                                     engine="transformers" if fam_name == "project" else "llamacpp",
                                     base_model=base if base.exists() else None, command=f"pytest {request.node.nodeid}")
            write_allocation(result, out, check)
        problems = verdict_problems(check, kw.get("expect"))
        if problems:
            pytest.fail("\n".join(problems), pytrace=False)
        return {**result, "check": check}

    def write(self, out: Path, payloads: Sequence[JSONDoc], palette_names: Sequence[str] | None) -> Written:
        return Written()


KIND = Allocation()
