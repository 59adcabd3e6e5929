"""A run's energy, carbon and cost, and the share of each spent idle: what a cluster team bills and a paper reports.

kWh from the GPUs' recorded power (each 10-second bucket's mean power × its time), CO2eq from RADT_GRID_INTENSITY and
RADT_PUE, cost from RADT_GPU_HOUR_PRICE per GPU-hour held; the idle share is the diagnosis' (idle GPU-hours over GPU-hours).
Each figure says which intensity, PUE and price it used (`basis`), since a number without its factors is no number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from radt import settings
from radt.catalogue import MetricName
from radt.diagnosis import Evidence, idle_numbers
from radt.runmodel import FOOTPRINT_PREFIX


@dataclass(frozen=True)
class Footprint:
    """One run's figures; None where what they need was not recorded (no power series: no energy, no carbon)."""

    gpu_hours: float
    idle_gpu_hours: float | None
    energy_kwh: float | None
    co2_kg: float | None
    cost: float
    basis: str

    def tags(self) -> dict[str, str]:
        """radt.footprint.<figure> tags, in 4 significant digits."""
        figures = {"gpu_hours": self.gpu_hours, "idle_gpu_hours": self.idle_gpu_hours, "energy_kwh": self.energy_kwh, "co2_kg": self.co2_kg, "cost": self.cost}
        tags = {f"{FOOTPRINT_PREFIX}{name}": f"{value:.4g}" for name, value in figures.items() if value is not None}
        return tags | {f"{FOOTPRINT_PREFIX}basis": self.basis}


def basis() -> str:
    """The factors a footprint used, as it says them: '400 gCO2eq/kWh, PUE 1.2, 2 USD per GPU-hour'."""
    return f"{settings.GRID_INTENSITY.get():g} gCO2eq/kWh, PUE {settings.PUE.get():g}, {settings.GPU_HOUR_PRICE.get():g} {settings.CURRENCY.get()} per GPU-hour"


def gpu_energy_kwh(evidence: Evidence) -> float | None:
    """The run's GPUs' energy: each bucket's mean power × the part of the bucket inside the run's span (a run starts and
    ends mid-bucket; its last sample stands for one interval after it), summed over the GPUs; None without power."""
    joules, seen = 0.0, False
    width = evidence.bucket_s * 1000
    for gpu in evidence.gpus:
        window = gpu.series.get(MetricName.POWER_USAGE_WATTS)
        if window is None:
            continue
        end = evidence.end_ms + window.interval_ms(width)
        for start, mean in zip(window.bucket_ms, window.mean):
            inside = min(start + width, end) - max(start, evidence.start_ms)
            if math.isfinite(mean) and inside > 0:
                joules += mean * inside / 1000
                seen = True
    return joules / 3.6e6 if seen else None


def footprint(evidence: Evidence) -> Footprint:
    """The run's energy, carbon, cost and idle GPU-hours with the factors they used."""
    idle = idle_numbers(evidence)
    gpu_hours = len(evidence.gpus) * evidence.hours
    kwh = gpu_energy_kwh(evidence)
    co2 = None if kwh is None else kwh * settings.PUE.get() * settings.GRID_INTENSITY.get() / 1000
    return Footprint(gpu_hours, idle.get("idle_gpu_hours"), kwh, co2, gpu_hours * settings.GPU_HOUR_PRICE.get(), basis())


def figures_of(tags: Mapping[str, str]) -> dict[str, float]:
    """The radt.footprint.* numbers of a run's tags ({'energy_kwh': 1.2, ...}); a figure that is no number is left out."""
    out = {}
    for key, value in tags.items():
        if key.startswith(FOOTPRINT_PREFIX) and key != f"{FOOTPRINT_PREFIX}basis":
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            if math.isfinite(number):
                out[key[len(FOOTPRINT_PREFIX) :]] = number
    return out


def rank_key(figures: Mapping[str, float]) -> tuple[int, float, float]:
    """Worst first (sort ascending): the most idle GPU-hours, then the most GPU-hours held; figures without idle GPU-hours
    (no activity series, never diagnosed) after every ranked one, all equal, so the caller's next key orders them.
    The one ranking of jobs and of their totals per user, account or partition (the Cluster page)."""
    idle = figures.get("idle_gpu_hours")
    if idle is None or not math.isfinite(idle):
        return (1, 0.0, 0.0)
    held = figures.get("gpu_hours")
    return (0, -idle, -(held if held is not None and math.isfinite(held) else 0.0))
