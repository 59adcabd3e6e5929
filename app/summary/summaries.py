"""One row of numbers per run for the comparison table: the script's duration, GPU activity and power over the GPUs the run
used, peak GPU memory, energy per physical GPU, CPU, and the run's own steps.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import sqlalchemy as sa

from radt import catalogue
from radt.app.db.keys import cumulative_legacy, gpu_devices, matching, own_devices, whole_gpus
from radt.app.db.runs import durations, key_values, keys_by_run, run_rows
from radt.app.db.series import raw_by_pair
from radt.app.db.store import LATEST, METRICS, RUNS, TAGS, Series, chunks, not_nan, plain_rows, unique
from radt.catalogue import MetricName
from radt.runmodel import GPUS_TAG, HOST_TAG, NODE_TAG, SCRIPT_END_TAG, SCRIPT_START_TAG, gpu_entries, script_span
from radt.throughput import own_steps

SUMMARY_COLUMNS = [
    "run_id",
    "duration_s",
    "smact_mean",
    "smact_p95",
    "smact_busiest",  # the mean SMACT of the used GPU with the highest mean
    "smocc_mean",
    "smocc_p95",
    "gract_mean",
    "power_mean_w",
    "gpus_used",  # how many GPUs (MIG slices) the GPU figures are over
    "gpus_watched",  # how many GPUs (MIG slices) radt recorded for the run
    "gpu_basis",  # PROCESSES or WATCHED: how the used GPUs were told ("" without a GPU)
    "gpus_text",  # "1 of 5 used", "5 watched", "2 of 4 used · node-a"
    "gpu_memory_peak_mb",  # a used GPU's (its MIG slice's) with every process on it, the run's and any other's
    "run_memory_peak_mb",  # the run's own processes' on one GPU (NVML's per-process lists); NaN where radt could not see them
    "run_sm_share",  # the run's own SM share of its GPUs (% of a GPU, NVML's per-process smUtil); NaN where NVML gave none
    "energy_j",
    "run_energy_j",  # the run's own share of its GPUs' energy: its power estimate (run_power_watts) over time; NaN without one
    "cpu_mean",
    "process_cpu_mean",
    "own_steps",  # the steps the run's own metrics count (its loss per epoch...): the work it did (_own_steps)
    "gpu_energy_j",  # {physical GPU (gpu_identity): joules}: the energy of each GPU the run recorded
]
TEXT_COLUMNS = ("run_id", "gpu_basis", "gpus_text")
COUNT_COLUMNS = ("gpus_used", "gpus_watched")
SUMMARY_VERSION = 6  # part of the summaries' cache key (data.summary): a shared cache never serves rows of an older definition
ADDED_IN = {
    3: ("run_memory_peak_mb",),
    5: ("run_sm_share",),
    6: ("run_energy_j",),
}  # columns a version only added: an older stored row's figures still hold (summarystore)
# columns a version defined anew, the others as before: an older stored row holds but for them (summarystore shows them empty).
# 4: gpu_memory_peak_mb over the used GPUs, a MIG slice's own memory (it was every watched GPU's, the whole GPU's for a slice)
# 4: own_steps no longer + 1 where a script logs its steps from 1 (10 epochs logged 1..10 were 11 steps)
CHANGED_IN = {4: ("gpu_memory_peak_mb", "own_steps")}
SUMMARY_TAGS = (SCRIPT_START_TAG, SCRIPT_END_TAG, GPUS_TAG, HOST_TAG)  # the tags run_summary reads (and NODE_TAG's per-node ones)
PROCESSES = "processes"  # NVML's per-process lists showed which GPUs the run's processes used
WATCHED = "watched"  # radt could not tell: every GPU it watched counts
ACTIVITY = {MetricName.SM_ACTIVE: "smact", MetricName.SM_OCCUPANCY: "smocc"}  # summarised from their raw points: mean and p95

# The run tags read here (the script's own start and exit, the GPUs' identities, the host) are spelled in radt/runmodel.py.


# --- which GPUs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuUse:
    """The GPUs (MIG slices) radt watched for a run and the ones it used, which its GPU figures are over."""

    watched: tuple[catalogue.Device, ...]
    used: tuple[catalogue.Device, ...]
    basis: str  # PROCESSES, WATCHED, or "" for a run without a GPU
    unseen: tuple[str, ...] = ()  # nodes whose every watched GPU counts although another node's processes were seen

    def counts(self, device: catalogue.Device) -> bool:
        """Whether a series of this device (a whole GPU or one of its slices) is one the summaries are over."""
        return any(d.node == device.node and d.gpu == device.gpu for d in self.used)

    @property
    def text(self) -> str:
        """What the table says beside the figures: '1 of 5 used', '5 watched', '2 of 4 used · node-a'."""
        if not self.watched:
            return ""
        parts = [f"{len(self.used)} of {len(self.watched)} used" if self.basis == PROCESSES or self.unseen else f"{len(self.watched)} watched"]
        nodes = sorted({d.node or "" for d in self.watched})
        if any(nodes):
            parts.append(nodes[0] if len(nodes) == 1 else f"{len(nodes)} nodes")
        parts += [f"{node}: all watched" for node in self.unseen]
        return " · ".join(parts)


def gpu_use(watched: Sequence[catalogue.Device], held: Iterable[catalogue.Device]) -> GpuUse:
    """Per node, the GPUs on which the run's processes ever held memory (``held``: NVML's per-process lists,
    process_memory_megabytes > 0); a node where they never did on any GPU (no such series: radT, imported logs, DCGM alone,
    plain MLflow; or lists radt could not match to the run's processes) counts every GPU it watched."""
    told = {(d.node, d.gpu) for d in held}
    told_nodes = {node for node, _gpu in told}
    nodes = {d.node for d in watched}
    used = tuple(d for d in watched if d.node not in told_nodes or (d.node, d.gpu) in told)
    basis = "" if not watched else PROCESSES if nodes <= told_nodes else WATCHED
    unseen = tuple(sorted(n or "host" for n in nodes - told_nodes)) if told_nodes else ()
    return GpuUse(tuple(watched), used, basis, unseen)


# --- summary --------------------------------------------------------------------------------------


def run_summary(engine: sa.Engine, run_ids: list[str], *, now_ms: int | None = None) -> pd.DataFrame:
    """Per run, NaN where absent:

    - duration_s: the script's own time (``script_span``: radt's script start/exit tags, else the run's start and end);
    - the GPU figures are over the GPUs (MIG slices) the run used: those on which NVML's per-process lists showed its
      processes holding memory at some point (``gpu_use``); where radt could not tell, every GPU it watched, and
      gpu_basis says so ("watched" against "processes"); gpus_used, gpus_watched and gpus_text count them;
    - smact_mean / smact_p95, smocc_mean / smocc_p95 (0-1): mean and 95th percentile of every point of the used GPUs,
      pooled (a GPU's MIG slices stand for it where the run recorded them); smact_busiest: the highest of the used
      GPUs' own SMACT means; gract_mean (0-1) and power_mean_w (W, per GPU) the mean of every point of the used GPUs;
    - gpu_memory_peak_mb: the highest peak of a single used GPU (one GPU's, never a sum; a MIG slice's own memory where
      the run recorded its slice), of every process on it: beside another run on the same GPU it holds both runs' memory;
    - run_memory_peak_mb: the highest peak of the run's own processes on a single GPU (process_memory_megabytes, from
      NVML's per-process lists), the figure to quote for the run; NaN where those lists never showed its processes;
    - run_sm_share: the run's own SM share (% of a GPU, run_sm_utilization_percentage) over every point of its GPUs;
    - energy_j: the sum over the run's GPUs of each GPU's energy (``gpu_energy_j``);
    - run_energy_j: the run's own share of it, an estimate: its run_power_watts integrated over time, summed over its GPUs;
    - gpu_energy_j: {physical GPU (``gpu_identity``): joules} per whole GPU: energy_joules' last value, else radT's
      counter (last minus first), else power integrated over time;
    - cpu_mean: the host's CPU in % of all cores; process_cpu_mean: the run's processes in % of one core (radT's TOP key);
    - own_steps: the steps the script's own metrics count: their highest step, + 1 where the first logged step is 0.
    """
    run_ids = unique(run_ids)
    if not run_ids:
        return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in SUMMARY_COLUMNS})
    keys = keys_by_run(engine, run_ids)
    rows = {r: dict.fromkeys(SUMMARY_COLUMNS, math.nan) | {"run_id": r, "gpu_energy_j": {}} for r in run_ids}
    with engine.connect() as conn:
        tags = _script_durations(conn, run_ids, rows, now_ms)
        use = _memory_cpu_and_gpu_use(conn, keys, rows)
    power = {r: whole_gpus(keys.get(r, ()), MetricName.POWER_USAGE_WATTS) for r in run_ids}
    power_series = _energy(engine, keys, power, tags, rows)
    _activity(engine, {r: [kr for m in ACTIVITY for d, kr in own_devices(keys.get(r, ()), m).items() if use[r].counts(d)] for r in run_ids}, rows)
    gract = {r: {d: kr for d, kr in own_devices(keys.get(r, ()), MetricName.GR_ENGINE_ACTIVE).items() if use[r].counts(d)} for r in run_ids}
    watts = {r: {d: kr for d, kr in power[r].items() if use[r].counts(d)} for r in run_ids}
    share = {r: whole_gpus(keys.get(r, ()), MetricName.RUN_SM_UTILIZATION_PERCENTAGE) for r in run_ids}  # where its processes ran
    _means(engine, {"gract_mean": gract, "power_mean_w": watts, "run_sm_share": share}, power_series, rows)
    _own_energy(engine, {r: whole_gpus(keys.get(r, ()), MetricName.RUN_POWER_WATTS) for r in run_ids}, rows)
    _own_steps(engine, run_ids, rows)
    frame = pd.DataFrame([rows[r] for r in run_ids], columns=SUMMARY_COLUMNS)
    return frame.astype({c: _dtype(c) for c in SUMMARY_COLUMNS if _dtype(c) != "object"})  # text keeps the dtype pandas gives it


def _script_durations(conn: sa.Connection, run_ids: list[str], rows: dict[str, dict], now_ms: int | None) -> dict[str, dict[str, str]]:
    """Each run's duration_s (the script's own span); the runs' summary tags, which energy's GPU identities read too."""
    runs = run_rows(conn, run_ids=run_ids)
    durations(conn, runs, now_ms)
    tags = key_values(conn, TAGS, run_ids, keys=list(SUMMARY_TAGS), prefix=NODE_TAG)
    for r in runs:
        start, end = script_span(r["start_time"], r["duration_s"], tags.get(r["run_id"], {}))
        rows[r["run_id"]]["duration_s"] = max(0.0, (end - start) / 1000.0) if math.isfinite(start) and math.isfinite(end) else math.nan
    return tags


def _memory_cpu_and_gpu_use(conn: sa.Connection, keys: Mapping[str, Sequence[str]], rows: dict[str, dict]) -> dict[str, GpuUse]:
    """gpu_memory_peak_mb, run_memory_peak_mb, cpu_mean, process_cpu_mean and the GPUs each run used (gpu_use), which the
    GPU figures are over."""
    run_ids = list(rows)
    memory = {r: own_devices(keys.get(r, ()), MetricName.MEMORY_USAGE_MEGABYTES) for r in run_ids}  # a MIG slice's own, not its GPU's
    cpu = {r: matching(keys.get(r, ()), MetricName.CPU_UTILIZATION_PERCENTAGE) for r in run_ids}
    process_cpu = {r: matching(keys.get(r, ()), MetricName.PROCESS_CPU_UTILIZATION_PERCENTAGE) for r in run_ids}
    process_memory = {r: whole_gpus(keys.get(r, ()), MetricName.PROCESS_MEMORY_MEGABYTES) for r in run_ids}
    aggregates = _aggregates(conn, {r: [k for k, _ in [*memory[r].values(), *cpu[r], *process_cpu[r], *process_memory[r].values()]] for r in run_ids})
    held = _ever_positive(conn, {r: [k for k, _ in process_memory[r].values()] for r in run_ids})
    use = {}
    for run_id in run_ids:
        row = rows[run_id]
        use[run_id] = gpu_use(gpu_devices(keys.get(run_id, ())), [d for d, (k, _res) in process_memory[run_id].items() if (run_id, k) in held])
        counted = [(k, res) for d, (k, res) in memory[run_id].items() if use[run_id].counts(d) and (run_id, k) in aggregates]
        peaks = [aggregates[(run_id, k)][1] * res.scale for k, res in counted]  # the used GPUs' (another job's GPU beside is not the run's)
        row["gpu_memory_peak_mb"] = max(peaks) if peaks else math.nan
        mine = [aggregates[(run_id, k)][1] * res.scale for k, res in process_memory[run_id].values() if (run_id, k) in held and (run_id, k) in aggregates]
        row["run_memory_peak_mb"] = max(mine) if mine else math.nan
        for column, found in (("cpu_mean", cpu), ("process_cpu_mean", process_cpu)):
            means = [aggregates[(run_id, k)][0] * res.scale for k, res in found[run_id] if (run_id, k) in aggregates]
            row[column] = means[0] if means else math.nan
        row.update(gpus_used=len(use[run_id].used), gpus_watched=len(use[run_id].watched), gpu_basis=use[run_id].basis, gpus_text=use[run_id].text)
    return use


def _energy(engine: sa.Engine, keys: Mapping[str, Sequence[str]], power: Mapping[str, dict], tags: Mapping[str, dict], rows: dict[str, dict]) -> dict:
    """energy_j and gpu_energy_j per run: each GPU's energy counter, else radT's legacy counter, else its power integrated
    over time; the power series read for that, which the power mean reuses."""
    run_ids = list(rows)
    energy = {r: whole_gpus(keys.get(r, ()), MetricName.ENERGY_JOULES) for r in run_ids}
    with engine.connect() as conn:
        latest = _latest(conn, {r: [k for k, _ in energy[r].values() if not cumulative_legacy(k)] for r in run_ids})
    joules: dict[str, dict[catalogue.Device, float]] = {r: {} for r in run_ids}
    for run_id in run_ids:
        for device, (key, res) in energy[run_id].items():
            value = latest.get((run_id, key), math.nan)
            if not math.isnan(value):
                joules[run_id][device] = value * res.scale
    _legacy_energy(engine, {(r, d): kr for r in run_ids for d, kr in energy[r].items() if d not in joules[r] and cumulative_legacy(kr[0])}, joules)
    integrated = {(r, d): kr for r in run_ids for d, kr in power[r].items() if d not in joules[r]}
    power_series = _power_energy(engine, integrated, joules)
    for run_id, per_device in joules.items():
        if per_device:
            rows[run_id]["energy_j"] = float(sum(per_device.values()))
            rows[run_id]["gpu_energy_j"] = {gpu_identity(d, tags.get(run_id, {})): j for d, j in per_device.items()}
    return power_series


def _own_energy(engine: sa.Engine, power: Mapping[str, dict], rows: dict[str, dict]) -> None:
    """run_energy_j: the run's power estimate (run_power_watts, its share of each GPU it shared) integrated over time."""
    joules: dict[str, dict[catalogue.Device, float]] = {r: {} for r in power}
    _power_energy(engine, {(r, d): kr for r, found in power.items() for d, kr in found.items()}, joules)
    for run_id, per_device in joules.items():
        if per_device:
            rows[run_id]["run_energy_j"] = float(sum(per_device.values()))


def _dtype(column: str) -> str:
    """A summary column's pandas dtype: text, a count, the per-GPU energies (a dict), else a float."""
    if column in TEXT_COLUMNS or column == "gpu_energy_j":
        return "object"
    return "int64" if column in COUNT_COLUMNS else "float64"


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
    """(run_id, key) -> (mean, max, count) over the points that hold a reading (NaN and radT's "no reading" values left out)."""
    out = {}
    m = METRICS
    for key, runs in _by_key(pairs).items():
        missing = catalogue.missing_values(key)
        readings = [not_nan(), m.c.value.not_in(missing)] if missing else [not_nan()]
        for chunk in chunks(runs):
            stmt = (
                sa.select(m.c.run_uuid, sa.func.avg(m.c.value), sa.func.max(m.c.value), sa.func.count())
                .where(m.c.key == key, m.c.run_uuid.in_(chunk), *readings)
                .group_by(m.c.run_uuid)
            )
            for run_id, mean, peak, count in plain_rows(conn, stmt):
                if count:
                    out[(run_id, key)] = (float(mean), float(peak), int(count))
    return out


def _by_key(pairs: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """run_id -> keys turned into key -> run_ids: one statement per key."""
    by_key: dict[str, list[str]] = defaultdict(list)
    for run_id, keys in pairs.items():
        for key in keys:
            by_key[key].append(run_id)
    return by_key


def _ever_positive(conn: sa.Connection, pairs: Mapping[str, Iterable[str]]) -> set[tuple[str, str]]:
    """(run_id, key) of the series that were ever above 0: an index probe per series that stops at the first such point."""
    out = set()
    m = METRICS
    for key, runs in _by_key(pairs).items():
        positive = sa.exists().where(m.c.run_uuid == RUNS.c.run_uuid, m.c.key == key, m.c.value > 0, not_nan())
        for chunk in chunks(runs):
            out.update((run_id, key) for (run_id,) in plain_rows(conn, sa.select(RUNS.c.run_uuid).where(RUNS.c.run_uuid.in_(chunk), positive)))
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


def _readings(key: str, values: np.ndarray, scale: float) -> np.ndarray:
    """A raw series' readings in the catalogue unit: NaN and radT's "no reading" values left out."""
    kept = ~np.isnan(values) & ~np.isin(values, catalogue.missing_values(key))
    return values[kept] * scale


def _activity(engine: sa.Engine, found: Mapping[str, list[tuple[str, catalogue.Resolved]]], rows: dict[str, dict]) -> None:
    """ACTIVITY's mean and p95 over every point of the listed series (one per device), pooled, and SMACT's busiest device; one read of each."""
    series = raw_by_pair(engine, [(r, key) for r, listed in found.items() for key, _res in listed])
    for run_id, listed in found.items():
        parts: dict[str, list[np.ndarray]] = defaultdict(list)
        for key, res in listed:
            if (run_id, key) in series:
                parts[res.metric.name].append(_readings(key, series[(run_id, key)][1], res.scale))
        for metric, prefix in ACTIVITY.items():
            values = np.concatenate(parts[metric]) if parts[metric] else np.empty(0)
            if len(values):
                rows[run_id][f"{prefix}_mean"] = float(np.mean(values))
                rows[run_id][f"{prefix}_p95"] = float(np.percentile(values, 95))
        means = [float(np.mean(v)) for v in parts[MetricName.SM_ACTIVE] if len(v)]
        rows[run_id]["smact_busiest"] = max(means) if means else math.nan


def _means(
    engine: sa.Engine, columns: Mapping[str, Mapping[str, Mapping[catalogue.Device, tuple[str, catalogue.Resolved]]]], read: Mapping, rows: dict[str, dict]
) -> None:
    """column -> the mean of every point of its listed devices, pooled: from series already read (``read``) where they
    were, else from one SQL aggregate per key (no second scan of a series)."""
    asked = {r: [key for found in columns.values() for key, _res in found.get(r, {}).values() if (r, key) not in read] for r in rows}
    with engine.connect() as conn:
        aggregates = _aggregates(conn, asked)
    for column, found in columns.items():
        for run_id, devices in found.items():
            total, count = 0.0, 0
            for key, res in devices.values():
                if (run_id, key) in read:
                    values = _readings(key, read[(run_id, key)][1], res.scale)
                    total, count = total + float(np.sum(values)), count + len(values)
                elif (run_id, key) in aggregates:
                    mean, _peak, n = aggregates[(run_id, key)]
                    total, count = total + mean * res.scale * n, count + n
            rows[run_id][column] = total / count if count else math.nan


def _own_steps(engine: sa.Engine, run_ids: list[str], rows: dict[str, dict]) -> None:
    """The run's progress in its own units (throughput.own_steps: the rule the comparison and could_share share)."""
    with engine.connect() as conn:
        for run_id, steps in own_steps(conn, run_ids).items():
            rows[run_id]["own_steps"] = steps


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


def _power_energy(engine: sa.Engine, found: DeviceKeys, joules: dict[str, dict[catalogue.Device, float]]) -> dict[tuple[str, str], Series]:
    """A GPU's energy as the integral of its power over time; the series read, for the power means."""
    series = raw_by_pair(engine, [(r, key) for (r, _d), (key, _res) in found.items()])
    for (run_id, device), (key, res) in found.items():
        if (run_id, key) in series:
            xs, values = series[(run_id, key)]
            value = _trapezoid(xs, np.where(np.isin(values, catalogue.missing_values(key)), np.nan, values) * res.scale)
            if not math.isnan(value):
                joules[run_id][device] = value
    return series
