"""One thread that reads every open source at a fixed interval and hands the points on.

The sink must not block (the writer queues); a source that fails mid-run is reported once
and dropped, the others carry on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

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
        points: list[Point] = []
        for source in list(self.sources):
            try:
                values = source.sample()
            except Exception as exc:
                self.report(f"radt: listener '{source.name}' stopped after an error: {type(exc).__name__}: {exc}")
                self.sources.remove(source)
                try:
                    source.close()
                except Exception:
                    pass
                continue
            points.extend(Point(k, float(v), timestamp, self.step) for k, v in values.items())
        if points:
            self.sink(points)
        self.step += 1

    def stop(self, timeout: float = 10.0) -> None:
        """Stop sampling, take no further sample, and close every source."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout)
        for source in self.sources:
            try:
                source.close()
            except Exception as exc:
                log.debug("closing %s: %s", source.name, exc)
