"""One row of numbers per run for the comparison table: the script's duration, SMACT and SMOCC, peak
GPU memory, energy per physical GPU, CPU, and the run's own steps.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd
import sqlalchemy as sa

from radt import catalogue
from radt.app.keys import cumulative_legacy, matching, own_devices, whole_gpus
from radt.app.runs import durations, key_values, keys_by_run, run_rows
from radt.app.series import raw_by_pair
from radt.app.store import LATEST, METRICS, TAGS, chunks, not_nan, plain_rows, unique
from radt.runmodel import GPUS_TAG, HOST_TAG, NODE_TAG, SCRIPT_END_TAG, SCRIPT_START_TAG, gpu_entries, script_span

SUMMARY_COLUMNS = [
    "run_id",
    "duration_s",
    "smact_mean",
    "smact_p95",
    "smocc_mean",
    "smocc_p95",
    "gpu_memory_peak_mb",
    "energy_j",
    "cpu_mean",
    "process_cpu_mean",
    "own_steps",  # the highest step of the run's own metrics (its loss per epoch...) + 1: the work it did
    "gpu_energy_j",  # {physical GPU (gpu_identity): joules}: the energy of each GPU the run recorded
]

# The run tags read here (the script's own start and exit, the GPUs' identities, the host) are spelled in radt/runmodel.py.


# --- summary --------------------------------------------------------------------------------------


def run_summary(engine: sa.Engine, run_ids: list[str], *, now_ms: int | None = None) -> pd.DataFrame:
    """Per run, NaN where absent:

    - duration_s: the script's own time (``script_span``: radt's script start/exit tags, else the run's start and end);
    - smact_mean / smact_p95, smocc_mean / smocc_p95 (0-1): mean and 95th percentile of every point of every GPU
      the run recorded, pooled (a GPU's MIG slices stand for it where the run recorded them);
    - gpu_memory_peak_mb: the highest peak of a single GPU (one GPU's, never a sum);
    - energy_j: the sum over the run's GPUs of each GPU's energy (``gpu_energy_j``);
    - gpu_energy_j: {physical GPU (``gpu_identity``): joules} per whole GPU: energy_joules' last value, else radT's
      counter (last minus first), else power integrated over time;
    - cpu_mean (system CPU %), process_cpu_mean (the run's processes, 100 = one core; radT's TOP key);
    - own_steps: the highest step of the script's own metrics + 1.
    """
    run_ids = unique(run_ids)
    if not run_ids:
        return pd.DataFrame({c: pd.Series(dtype="object" if c in ("run_id", "gpu_energy_j") else "float64") for c in SUMMARY_COLUMNS})
    keys = keys_by_run(engine, run_ids)
    rows = {r: dict.fromkeys(SUMMARY_COLUMNS, math.nan) | {"run_id": r, "gpu_energy_j": {}} for r in run_ids}
    with engine.connect() as conn:
        runs = run_rows(conn, run_ids=run_ids)
        durations(conn, runs, now_ms)
        tags = key_values(conn, TAGS, run_ids, keys=[SCRIPT_START_TAG, SCRIPT_END_TAG, GPUS_TAG, HOST_TAG], prefix=NODE_TAG)
        for r in runs:
            start, end = script_span(r["start_time"], r["duration_s"], tags.get(r["run_id"], {}))
            rows[r["run_id"]]["duration_s"] = max(0.0, (end - start) / 1000.0) if math.isfinite(start) and math.isfinite(end) else math.nan

        memory = {r: matching(keys.get(r, ()), "memory_usage_megabytes") for r in run_ids}
        cpu = {r: matching(keys.get(r, ()), "cpu_utilization_percentage") for r in run_ids}
        process_cpu = {r: matching(keys.get(r, ()), "process_cpu_utilization_percentage") for r in run_ids}
        energy = {r: whole_gpus(keys.get(r, ()), "energy_joules") for r in run_ids}
        aggregate_pairs = {r: [k for k, _ in memory[r] + cpu[r] + process_cpu[r]] for r in run_ids}
        aggregates = _aggregates(conn, aggregate_pairs)
        latest = _latest(conn, {r: [k for k, _ in energy[r].values() if not cumulative_legacy(k)] for r in run_ids})

        for run_id in run_ids:
            row = rows[run_id]
            peaks = [aggregates[(run_id, k)][1] * res.scale for k, res in memory[run_id] if (run_id, k) in aggregates]
            row["gpu_memory_peak_mb"] = max(peaks) if peaks else math.nan
            for column, found in (("cpu_mean", cpu), ("process_cpu_mean", process_cpu)):
                means = [aggregates[(run_id, k)][0] * res.scale for k, res in found[run_id] if (run_id, k) in aggregates]
                row[column] = means[0] if means else math.nan

    joules: dict[str, dict[catalogue.Device, float]] = {r: {} for r in run_ids}
    for run_id in run_ids:
        for device, (key, res) in energy[run_id].items():
            value = latest.get((run_id, key), math.nan)
            if not math.isnan(value):
                joules[run_id][device] = value * res.scale
    _legacy_energy(engine, {(r, d): kr for r in run_ids for d, kr in energy[r].items() if d not in joules[r] and cumulative_legacy(kr[0])}, joules)
    power = {(r, d): kr for r in run_ids for d, kr in whole_gpus(keys.get(r, ()), "power_usage_watts").items() if d not in joules[r]}
    _power_energy(engine, power, joules)
    for run_id, per_device in joules.items():
        if per_device:
            rows[run_id]["energy_j"] = float(sum(per_device.values()))
            rows[run_id]["gpu_energy_j"] = {gpu_identity(d, tags.get(run_id, {})): j for d, j in per_device.items()}

    for name, prefix in (("sm_active", "smact"), ("sm_occupancy", "smocc")):
        _series_stats(engine, {r: own_devices(keys.get(r, ()), name) for r in run_ids}, rows, prefix)
    _own_steps(engine, run_ids, rows)
    frame = pd.DataFrame([rows[r] for r in run_ids], columns=SUMMARY_COLUMNS)
    for column in SUMMARY_COLUMNS[1:]:
        if column != "gpu_energy_j":
            frame[column] = frame[column].astype("float64")
    return frame


def gpu_identity(device: catalogue.Device, tags: Mapping[str, str]) -> str:
    """The physical GPU a series of a run measured, the same text for every run that used that GPU.

    ``uuid:<UUID>`` where the run's ``radt.gpus`` tag (a JSON list of ``{"series": "gpu_0", "uuid": ...}``)
    names the series' GPU; else ``host:<host>:gpu:<index>``, the host being the key's node (MLflow's
    multi-node keys), else the run's ``radt.host`` tag, else empty (radT's and plain MLflow runs: one
    workload ran on one machine), and the index the NVML one of the key (radT's keys count as GPU 0).
    """
    series = f"gpu_{device.gpu}"
    listed = gpu_entries(tags, device.node) or [  # radt before per-node tags: "<node>/gpu_0" in the run's own list
        {**entry, "series": entry["series"].split("/", 1)[1]} for entry in gpu_entries(tags) if str(entry.get("series", "")).startswith(f"{device.node}/")
    ]
    for entry in listed:
        if entry.get("series") == series and entry.get("uuid"):
            return f"uuid:{entry['uuid']}"
    return f"host:{device.node or tags.get(HOST_TAG) or ''}:gpu:{device.gpu}"


def _trapezoid(xs_ms: np.ndarray, values: np.ndarray) -> float:
    """The integral over seconds of a series (NaN points left out); NaN with fewer than two points."""
    keep = ~np.isnan(values)
    xs, values = xs_ms[keep] / 1000.0, values[keep]
    if len(xs) < 2:
        return math.nan
    return float(np.sum((xs[1:] - xs[:-1]) * (values[1:] + values[:-1]) / 2.0))


# --- aggregates -----------------------------------------------------------------------------------


def _aggregates(conn: sa.Connection, pairs: Mapping[str, Iterable[str]]) -> dict[tuple[str, str], tuple[float, float, int]]:
    """(run_id, key) -> (mean, max, count) over non-NaN points."""
    by_key: dict[str, list[str]] = defaultdict(list)
    for run_id, keys in pairs.items():
        for key in keys:
            by_key[key].append(run_id)
    out = {}
    m = METRICS
    for key, runs in by_key.items():
        for chunk in chunks(runs):
            stmt = (
                sa.select(m.c.run_uuid, sa.func.avg(m.c.value), sa.func.max(m.c.value), sa.func.count())
                .where(m.c.key == key, m.c.run_uuid.in_(chunk), not_nan())
                .group_by(m.c.run_uuid)
            )
            for run_id, mean, peak, count in plain_rows(conn, stmt):
                if count:
                    out[(run_id, key)] = (float(mean), float(peak), int(count))
    return out


def _latest(conn: sa.Connection, pairs: Mapping[str, Iterable[str]]) -> dict[tuple[str, str], float]:
    """(run_id, key) -> latest_metrics value (NaN where it is a NaN)."""
    keys = sorted({k for ks in pairs.values() for k in ks})
    out = {}
    if not keys:
        return out
    for chunk in chunks(list(pairs)):
        stmt = sa.select(LATEST.c.run_uuid, LATEST.c.key, LATEST.c.value, LATEST.c.is_nan).where(LATEST.c.run_uuid.in_(chunk), LATEST.c.key.in_(keys))
        for run_id, key, value, is_nan in plain_rows(conn, stmt):
            if key in pairs.get(run_id, ()):
                out[(run_id, key)] = math.nan if is_nan else float(value)
    return out


def _series_stats(engine: sa.Engine, found: Mapping[str, list[tuple[str, float]]], rows: dict[str, dict], prefix: str) -> None:
    """Mean and p95 of every point of every listed series of a run, pooled (NaN left out)."""
    series = raw_by_pair(engine, [(r, key) for r, keys in found.items() for key, _scale in keys])
    for run_id, keys in found.items():
        parts = [series[(run_id, key)][1] * scale for key, scale in keys if (run_id, key) in series]
        values = np.concatenate(parts) if parts else np.empty(0)
        values = values[~np.isnan(values)]
        if len(values):
            rows[run_id][f"{prefix}_mean"] = float(np.mean(values))
            rows[run_id][f"{prefix}_p95"] = float(np.percentile(values, 95))


def _own_steps(engine: sa.Engine, run_ids: list[str], rows: dict[str, dict]) -> None:
    """The run's progress in its own units: the highest step of a metric the script logged (not system/...)."""
    with engine.connect() as conn:
        for chunk in chunks(run_ids):
            stmt = sa.select(LATEST.c.run_uuid, LATEST.c.key, LATEST.c.step).where(
                LATEST.c.run_uuid.in_(chunk), sa.not_(LATEST.c.key.startswith("system/", autoescape=True))
            )
            for run_id, key, step in plain_rows(conn, stmt):
                if catalogue.resolve(key) is None and step is not None:  # radT's hardware keys are not progress
                    rows[run_id]["own_steps"] = max(float(step) + 1, 0.0 if math.isnan(rows[run_id]["own_steps"]) else rows[run_id]["own_steps"])


# --- energy ---------------------------------------------------------------------------------------


DeviceKeys = Mapping[tuple[str, catalogue.Device], tuple[str, catalogue.Resolved]]


def _legacy_energy(engine: sa.Engine, found: DeviceKeys, joules: dict[str, dict[catalogue.Device, float]]) -> None:
    """radT's energy counter (since the driver loaded): last minus first reading of the run."""
    series = raw_by_pair(engine, [(r, key) for (r, _d), (key, _res) in found.items()])
    for (run_id, device), (key, res) in found.items():
        if (run_id, key) in series:
            values = series[(run_id, key)][1]
            values = values[~np.isnan(values)]
            if len(values):
                joules[run_id][device] = float((values[-1] - values[0]) * res.scale)


def _power_energy(engine: sa.Engine, found: DeviceKeys, joules: dict[str, dict[catalogue.Device, float]]) -> None:
    """A GPU's energy as the integral of its power over time."""
    series = raw_by_pair(engine, [(r, key) for (r, _d), (key, _res) in found.items()])
    for (run_id, device), (key, res) in found.items():
        if (run_id, key) in series:
            xs, values = series[(run_id, key)]
            value = _trapezoid(xs, values * res.scale)
            if not math.isnan(value):
                joules[run_id][device] = value
