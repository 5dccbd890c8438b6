"""What a run took from its caches instead of computing it, so a rerun can say what it reused.

One :class:`ReuseLog` per session; a cache notes, per candidate, which units it served and which were computed
(``captures``: context indices of a live candidate's capture cache; a unit noted twice counts once). Another cache (e.g. one of scored
positions) notes under its own name and unit, and :meth:`ReuseLog.lines` says it with no change here. The log
travels as JSON (:meth:`ReuseLog.to_json`, :meth:`ReuseLog.merge`) from pytest-xdist workers to the controller.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

#: A cache's unit, as the summary names it.
UNITS = {"captures": "contexts", "scores": "shards", "summary": "shards", "results": "results"}


@dataclass
class ReuseLog:
    """``units[cache][candidate] = (reused, computed)`` unit sets; ``where[cache][candidate]``: the cache folder."""

    units: dict[str, dict[str, tuple[set[int], set[int]]]] = field(default_factory=dict)
    where: dict[str, dict[str, str]] = field(default_factory=dict)

    def note(self, cache: str, candidate: str, *, reused: Iterable[int], computed: Iterable[int], where: str = "") -> None:
        """Record the units ``cache`` served for ``candidate`` (``reused``) and those it had to compute."""
        r, c = self.units.setdefault(cache, {}).setdefault(candidate, (set(), set()))
        r.update(reused)
        c.update(computed)
        r.difference_update(c)  # computed in this run: never also counted as reused
        if where:
            self.where.setdefault(cache, {})[candidate] = where

    def served(self, cache: str, candidate: str) -> set[int]:
        """The units ``cache`` served for ``candidate`` in this run (not computed)."""
        return set(self.units.get(cache, {}).get(candidate, (set(), set()))[0])

    def to_json(self) -> dict[str, object]:
        units = {cache: {cand: [sorted(r), sorted(c)] for cand, (r, c) in per.items()} for cache, per in self.units.items()}
        return {"units": units, "where": self.where}

    def merge(self, doc: dict[str, object]) -> None:
        """Add another process's log (its :meth:`to_json`)."""
        units = doc.get("units") or {}
        where = doc.get("where") or {}
        assert isinstance(units, dict) and isinstance(where, dict)
        for cache, per in units.items():
            for cand, (reused, computed) in per.items():
                self.note(cache, cand, reused=map(int, reused), computed=map(int, computed),
                          where=str(where.get(cache, {}).get(cand, "")))

    def lines(self) -> list[str]:
        """One line per cache, e.g. ``capture cache: reused 16 of 16 contexts (good 8 of 8, bad 8 of 8)``."""
        out = []
        for cache in sorted(self.units):
            per = {name: (len(r), len(c)) for name, (r, c) in self.units[cache].items()}
            reused, total = sum(r for r, _ in per.values()), sum(r + c for r, c in per.values())
            unit = UNITS.get(cache, "items")
            each = ", ".join(f"{name} {r} of {r + c}" for name, (r, c) in sorted(per.items()))
            out.append(f"{cache.removesuffix('s')} cache: reused {reused} of {total} {unit} ({each})")
        return out
