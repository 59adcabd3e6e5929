"""A run's diagnosis as the dashboard shows it, read from its tags (radt/diagnosis.py and radt/footprint.py write them):
its findings with their sentences and spans, the metrics it lacked (said once), and its footprint with its factors.

The comparison table and `radt export --table` carry the codes (`diagnosis`: "idle_gpus,input_starved", "none" when the
run was diagnosed and nothing held it back, blank when it was never diagnosed) and the footprint figures; the screen
writes the codes as words (LABELS).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from radt.diagnosis import LABELS, codes_of, parse_spans
from radt.footprint import figures_of
from radt.runmodel import DIAGNOSIS_LACKING_TAG, DIAGNOSIS_SPANS_TAG, DIAGNOSIS_TAG, FOOTPRINT_PREFIX, diagnosis_tag

NOTHING_FOUND = "none"  # the codes of a run diagnosed with no finding (the tag is '')
BASIS_TAG = f"{FOOTPRINT_PREFIX}basis"
# the footprint figures the comparison table carries, as radt/footprint.py names them (radt.footprint.<figure>)
FOOTPRINT_COLUMNS = ("idle_gpu_hours", "energy_kwh", "co2_kg", "cost")


@dataclass(frozen=True)
class ShownFinding:
    """One finding of a run as stored: its code, its words, its sentence (numbers and action) and the span it covers."""

    code: str
    label: str
    sentence: str
    span: tuple[int, int] | None = None  # epoch ms


@dataclass(frozen=True)
class RunDiagnosis:
    """What a run's tags say of it: whether it was diagnosed, its findings, what it lacked, its footprint and its factors."""

    diagnosed: bool
    findings: list[ShownFinding] = field(default_factory=list)
    lacking: str = ""
    figures: dict[str, float] = field(default_factory=dict)
    basis: str = ""


def run_diagnosis(tags: Mapping[str, str] | None) -> RunDiagnosis:
    """The run's diagnosis from its tags; `diagnosed` False where `radt diagnose` (or the run's end) never wrote one."""
    tags = tags or {}
    spans = parse_spans(tags.get(DIAGNOSIS_SPANS_TAG, ""))
    findings = [ShownFinding(code, LABELS[code], tags.get(diagnosis_tag(code)) or LABELS[code], spans.get(code)) for code in codes_of(tags)]
    return RunDiagnosis(DIAGNOSIS_TAG in tags, findings, tags.get(DIAGNOSIS_LACKING_TAG, ""), figures_of(tags), tags.get(BASIS_TAG, ""))


def codes_text(tags: Mapping[str, str] | None) -> str:
    """The table's `diagnosis` cell: the codes, comma-separated; NOTHING_FOUND for a clean run, '' for one never diagnosed."""
    tags = tags or {}
    if DIAGNOSIS_TAG not in tags:
        return ""
    return ",".join(codes_of(tags)) or NOTHING_FOUND


def readable(codes: str | None) -> str:
    """A `diagnosis` cell in words: 'idle_gpus,input_starved' -> 'idle gpus, input starved'."""
    return ", ".join(LABELS.get(code, code) for code in (codes or "").split(",") if code)


def footprint_cells(tags: Mapping[str, str] | None) -> dict[str, float | str]:
    """The table's footprint cells: each figure (NaN where the run has none) and the factors they used."""
    figures = figures_of(tags or {})
    return {name: figures.get(name, math.nan) for name in FOOTPRINT_COLUMNS} | {"footprint_basis": (tags or {}).get(BASIS_TAG, "")}


def footprint_text(figures: Mapping[str, float]) -> str:
    """The footprint in one line: '1.20 kWh · 0.576 kg CO2eq · cost 8.00 · 1.50 of 4.00 GPU-hours idle'; '' for none."""
    parts = []
    if "energy_kwh" in figures:
        parts.append(f"{figures['energy_kwh']:.3g} kWh")
    if "co2_kg" in figures:
        parts.append(f"{figures['co2_kg']:.3g} kg CO2eq")
    if "cost" in figures:
        parts.append(f"cost {figures['cost']:.2f}")
    if "idle_gpu_hours" in figures and "gpu_hours" in figures:
        parts.append(f"{figures['idle_gpu_hours']:.2f} of {figures['gpu_hours']:.2f} GPU-hours idle")
    elif "gpu_hours" in figures:
        parts.append(f"{figures['gpu_hours']:.2f} GPU-hours")
    return " · ".join(parts)
