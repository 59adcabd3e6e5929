"""One thread that reads every open source at a fixed interval and hands the points on.

The sink must not block (the writer queues); a source that fails mid-run is reported once
and dropped, the others carry on. A series two sources read (nvml's and dcgm's power) is kept
from one of them, the first named in -l (collectors/run/owners.py), so no series mixes two instruments.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from radt.collectors.run.owners import SeriesOwners
from radt.collectors.sources.base import MetricSource, SamplingContext, SourceUnavailable
from radt.points import Point

log = logging.getLogger("radt")


def open_sources(sources: list[MetricSource], ctx: SamplingContext, report: Callable[[str], None]) -> list[MetricSource]:
    """Open each source; report the missing ones once and return those that work."""
    opened = []
    for source in sources:
        try:
            source.open(ctx)
            opened.append(source)
        except SourceUnavailable as exc:
            report(f"radt: listener '{source.name}' skipped: {exc}")
        except Exception as exc:  # a broken driver must not stop the training
            report(f"radt: listener '{source.name}' skipped: {type(exc).__name__}: {exc}")
    return opened


class Sampler(threading.Thread):
    """Samples at `interval` seconds on the wall clock, without drift; steps count ticks."""

    def __init__(
        self,
        sources: list[MetricSource],
        interval: float,
        sink: Callable[[list[Point]], None],
        report: Callable[[str], None] = print,
        start_gate: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(name="radt-sampler", daemon=True)
        self.sources = list(sources)
        self.interval = interval
        self.sink = sink
        self.report = report
        self.start_gate = start_gate  # --manual: sample only once this returns True
        self.step = 0
        self._halt = threading.Event()
        self.owners = SeriesOwners(self.sources, report)

    def run(self) -> None:
        if self.start_gate is not None:
            while not self.start_gate():
                if self._halt.wait(0.1):
                    return
        deadline = time.monotonic()
        while not self._halt.is_set():
            self.tick()
            deadline += self.interval
            delay = deadline - time.monotonic()
            if delay < 0:  # fell behind (suspended host, slow driver): skip, do not burst
                deadline = time.monotonic()
                delay = 0
            if self._halt.wait(delay):
                break

    def tick(self) -> None:
        timestamp = int(time.time() * 1000)
        offered: list[tuple[MetricSource, Point]] = []
        for source in list(self.sources):
            try:
                readings = source.readings(timestamp)
            except Exception as exc:
                self.report(f"radt: listener '{source.name}' stopped after an error: {type(exc).__name__}: {exc}")
                self.sources.remove(source)
                self.owners.drop(source)
                try:
                    source.close()
                except Exception:
                    pass
                continue
            for where, value, stamp in readings:
                step = self.step if stamp == timestamp else self._step_at(stamp, timestamp)
                offered.append((source, Point(where, float(value), stamp, step)))
        points = self.owners.sort(self.step, offered)
        if points:
            self.sink(points)
        self.step += 1

    def _step_at(self, stamp: int, now: int) -> int:
        """The step of a value measured before this tick (a scrape): this tick's step less the intervals since."""
        return max(0, self.step - round((now - stamp) / (self.interval * 1000)))

    def describe(self) -> dict[str, dict]:
        """Each source's facts for radt-sources.json, with the series another source gave instead."""
        out = {}
        for source in self.sources:
            facts = dict(source.describe())
            if source.name in self.owners.shadowed:
                facts["series_kept_from"] = {name: sorted(keys) for name, keys in self.owners.shadowed[source.name].items()}
            out[source.name] = facts
        return out

    def stop(self, timeout: float = 10.0) -> None:
        """Stop sampling, take no further sample, and close every source."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout)
        waiting = self.owners.flush()  # series still undecided at the end: their points are written, not lost
        if waiting:
            self.sink(waiting)
        for source in self.sources:
            try:
                source.close()
            except Exception as exc:
                log.debug("closing %s: %s", source.name, exc)
