"""Which listener a series comes from when two read it (nvml's and dcgm's power, GPM's and the exporter's SMACT).

The earliest-named listener in -l that gives a series within CLAIM_TICKS ticks of its first point keeps it for
the run; a later-named listener's points of a series wait that long for the earlier ones (only for those that may
give it, see MetricSource.covers), so no series mixes two instruments' readings. Nothing waits longer, and what
waits at the end is decided then (`flush`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from radt.collectors.sources.base import MetricSource
from radt.points import Point

CLAIM_TICKS = 3  # NVML's GPM gives its first SMACT at the second tick; a later-named source's series wait three


@dataclass
class Claim:
    """A series not yet decided: the tick it is decided at the latest, and each source's points of it so far."""

    deadline: int
    points: dict[MetricSource, list[Point]] = field(default_factory=dict)


class SeriesOwners:
    """Sorts each tick's points: a decided series' owner's are written, another source's dropped (and listed)."""

    def __init__(self, sources: list[MetricSource], report: Callable[[str], None]) -> None:
        self.sources = list(sources)
        self.rank = {source: rank for rank, source in enumerate(sources)}
        self.report = report
        self.owner: dict[str, MetricSource] = {}
        self.claims: dict[str, Claim] = {}
        self.shadowed: dict[str, dict[str, set[str]]] = {}  # source name -> {the owner's name: keys}

    def sort(self, step: int, offered: list[tuple[MetricSource, Point]]) -> list[Point]:
        """This tick's points to write: those of series owned by their source, and of the series decided now."""
        out: list[Point] = []
        for source, point in offered:
            owner = self.owner.get(point.key)
            if owner is source:
                out.append(point)
            elif owner is not None:
                self._shadow(source, owner, point.key)
            else:
                self.claims.setdefault(point.key, Claim(step + CLAIM_TICKS)).points.setdefault(source, []).append(point)
        for where in list(self.claims):
            claim = self.claims[where]
            best = min(claim.points, key=self.rank.__getitem__)
            waiting = any(self.rank[s] < self.rank[best] and s.covers(where) for s in self.sources)
            if step >= claim.deadline or not waiting:
                out += self._decide(where, best)
        return out

    def flush(self) -> list[Point]:
        """The points of every series still undecided (the run ends): each goes to its best source so far."""
        out: list[Point] = []
        for where in list(self.claims):
            out += self._decide(where, min(self.claims[where].points, key=self.rank.__getitem__))
        return out

    def late(self, source: MetricSource, points: list[Point]) -> list[Point]:
        """Points a source adds after the last tick (the scrapes Prometheus stored late): only of series it owns or nobody gave."""
        out = []
        for point in points:
            owner = self.owner.setdefault(point.key, source)
            if owner is source:
                out.append(point)
            else:
                self._shadow(source, owner, point.key)
        return out

    def drop(self, source: MetricSource) -> None:
        """A source that stopped: its series go to the next source that gives them (from then on)."""
        if source in self.sources:
            self.sources.remove(source)
        self.owner = {k: o for k, o in self.owner.items() if o is not source}
        for claim in self.claims.values():
            claim.points.pop(source, None)
        self.claims = {k: c for k, c in self.claims.items() if c.points}

    def _decide(self, where: str, best: MetricSource) -> list[Point]:
        claim = self.claims.pop(where)
        self.owner[where] = best
        for source in claim.points:
            if source is not best:
                self._shadow(source, best, where)
        return claim.points[best]

    def _shadow(self, source: MetricSource, owner: MetricSource, where: str) -> None:
        kept = self.shadowed.setdefault(source.name, {}).setdefault(owner.name, set())
        if not kept:
            self.report(
                f"radt: listeners '{owner.name}' and '{source.name}' both read {where}; each such series is kept from one "
                f"listener for the whole run, this one from '{owner.name}' (radt-sources.json lists them)"
            )
        kept.add(where)
