"""The interface every metric source implements, in the manner of MLflow's system-metrics monitors."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from radt import settings

GPU_SERIES = "system/gpu_"  # what every per-GPU key starts with before a node id goes in (radt.catalogue.key)


class SourceUnavailable(Exception):
    """Raised by `open()` when a source cannot run on this machine; the message says why and what to do."""


@dataclass
class SamplingContext:
    """What a source needs to know about the run it samples."""

    interval: float = settings.INTERVAL.default
    devices: list[int] | None = None  # NVML indices to watch; None: every GPU
    slices: list[tuple[int, int]] = field(default_factory=list)  # MIG slices to watch as their own series: (NVML GPU index, GPU instance id)
    pids: Callable[[], list] = field(default=lambda: [])  # psutil.Process objects of the run's tree
    given: tuple[str, ...] = ()  # GPU-/MIG- UUIDs the run was given that NVML could not map: only an exporter's labels place them


class Reading(NamedTuple):
    """One value a source read, at the moment it was measured (epoch ms)."""

    key: str
    value: float
    timestamp: int


class MetricSource(ABC):
    """One source of hardware metrics; `sample()` returns {metric key: value} for one tick."""

    name: str = ""
    gives: str = "any"  # "gpu": only per-GPU series (system/gpu_...), "host": only the others; see covers()

    @abstractmethod
    def open(self, ctx: SamplingContext) -> None:
        """Prepare to sample; raise SourceUnavailable if this machine lacks the source."""

    @abstractmethod
    def sample(self) -> dict[str, float]:
        """Read the current values; skip (do not zero) what cannot be read."""

    def covers(self, key: str) -> bool:
        """Whether this source may give `key`: a series another listener gives waits only for earlier-named ones that may."""
        if self.gives == "any":
            return True
        return key.startswith(GPU_SERIES) == (self.gives == "gpu")

    def readings(self, now_ms: int) -> list[Reading]:
        """One tick's values at the tick's time; a source whose values carry their own time (a Prometheus scrape) overrides it."""
        return [Reading(k, v, now_ms) for k, v in self.sample().items()]

    def close(self) -> None:
        """Release handles and child processes."""

    def describe(self) -> dict:
        """Facts worth attaching to the run (driver, devices); empty by default."""
        return {}
