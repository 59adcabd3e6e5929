"""A run's energy, carbon and cost (radt/footprint.py): energy is the recorded power over the run's own time, a run
that starts and ends mid-bucket included (the report found 20 % too much where each bucket counted 10 whole seconds)."""

from __future__ import annotations

import pytest

from radt.catalogue import Device, MetricName
from radt.diagnosis import Evidence, GpuEvidence
from radt.evidence import window
from radt.footprint import footprint, gpu_energy_kwh

T0 = 1_700_000_003_000  # 3 s into a 10-second bucket


def _power_run(watts: list[float], start_ms: int = T0) -> Evidence:
    """One GPU sampled once a second at `watts`, bucketed as the rollups bucket it; the run ends at its last sample."""
    rows: dict[int, list[float]] = {}
    for i, w in enumerate(watts):
        ms = start_ms + 1000 * i
        rows.setdefault(ms - ms % 10_000, []).append(w)
    buckets = [(b, min(v), max(v), sum(v), len(v)) for b, v in sorted(rows.items())]
    gpu = GpuEvidence(Device(gpu=0), series={MetricName.POWER_USAGE_WATTS: window(buckets)})
    return Evidence("r", start_ms, start_ms + 1000 * (len(watts) - 1), [gpu])


def test_energy_is_each_samples_power_for_one_interval_whatever_the_buckets():
    watts = [100.0 + (i % 7) * 10 for i in range(45)]  # 45 s from 3 s into a bucket: 5 buckets, partial at both ends
    assert gpu_energy_kwh(_power_run(watts)) == pytest.approx(sum(watts) / 3.6e6, rel=0.02)


def test_carbon_and_cost_use_the_settings_and_say_them(monkeypatch):
    monkeypatch.setenv("RADT_GRID_INTENSITY", "250")
    monkeypatch.setenv("RADT_PUE", "1.5")
    monkeypatch.setenv("RADT_GPU_HOUR_PRICE", "3")
    monkeypatch.setenv("RADT_CURRENCY", "EUR")
    run = _power_run([200.0] * 3601, start_ms=1_700_000_000_000)  # one GPU-hour at 200 W
    figures = footprint(run)
    assert figures.energy_kwh == pytest.approx(0.2, rel=1e-3)
    assert figures.co2_kg == pytest.approx(0.2 * 1.5 * 250 / 1000, rel=1e-3)
    assert figures.cost == pytest.approx(3.0, rel=1e-3) and figures.basis == "250 gCO2eq/kWh, PUE 1.5, 3 EUR per GPU-hour"
    assert figures.tags()["radt.footprint.basis"] == figures.basis
