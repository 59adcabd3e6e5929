"""What the diagnosis reads of stored runs: each needed series as its 10-second rollup buckets, the GPUs' models and sizes.

Read in batches (one query per 250 runs for the run rows, the tags and the buckets), from the rollups radt keeps beside
MLflow's tables, so diagnosing a thousand runs reads no raw point; a series another writer left stale is rebuilt once
(rollups.ensure_fresh) before it is read. Both sides use it: `radt diagnose` and a run's end, and the dashboard's Live page.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence

import sqlalchemy as sa

from radt import catalogue, mlflowdb, rollups
from radt.catalogue import Device, MetricName
from radt.diagnosis import Evidence, GpuEvidence, Window
from radt.runmodel import (
    COLLOCATION_TAG,
    COMMAND_TAG,
    GPU_MEMORY_TAG,
    GPU_MODEL_TAG,
    NODE_TAG,
    SCRIPT_END_TAG,
    SCRIPT_START_TAG,
    SLURM_PREFIX,
    USER_TAG,
    gpu_entries,
    node_statuses,
)

RESOLUTION = min(rollups.RESOLUTIONS)  # 10 s: the finest rollup
GPU_METRICS = (
    MetricName.GR_ENGINE_ACTIVE,
    MetricName.SM_ACTIVE,
    MetricName.SM_OCCUPANCY,
    MetricName.DRAM_ACTIVE,
    MetricName.TENSOR_ACTIVE,
    MetricName.UTILIZATION_PERCENTAGE,
    MetricName.MEMORY_USAGE_MEGABYTES,
    MetricName.MEMORY_USAGE_PERCENTAGE,
    MetricName.PROCESS_MEMORY_MEGABYTES,
    MetricName.POWER_USAGE_WATTS,
    MetricName.CLOCKS_POWER_CAPPED,
    MetricName.CLOCKS_THERMAL_SLOWDOWN,
    MetricName.CLOCKS_HARDWARE_SLOWDOWN,
    MetricName.XID_ERROR,
    MetricName.ECC_ERRORS_UNCORRECTED,
)
HOST_METRICS = (MetricName.CPU_UTILIZATION_PERCENTAGE, MetricName.PROCESS_CPU_UTILIZATION_PERCENTAGE)
WANTED = frozenset(GPU_METRICS + HOST_METRICS)
TAGS = (SCRIPT_START_TAG, SCRIPT_END_TAG, COLLOCATION_TAG, COMMAND_TAG, GPU_MODEL_TAG, GPU_MEMORY_TAG, USER_TAG, f"{SLURM_PREFIX}user")
CHUNK = 250  # runs per query


def wanted_keys(keys: Iterable[str]) -> dict[str, catalogue.Resolved]:
    """The stored keys the diagnosis reads, with what they mean."""
    out = {}
    for key in keys:
        resolved = catalogue.resolve(key)
        if resolved is not None and resolved.metric.name in WANTED:
            out[key] = resolved
    return out


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), CHUNK):
        yield items[i : i + CHUNK]


def gather(engine: sa.Engine, run_ids: Sequence[str], *, since_ms: int | None = None, now_ms: int | None = None) -> dict[str, Evidence]:
    """run id -> its evidence, for every run of `run_ids` that exists; `since_ms` keeps only the buckets from then (Live)."""
    run_ids = list(dict.fromkeys(run_ids))
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    rollups.ensure_table(engine)
    out: dict[str, Evidence] = {}
    for part in _chunks(run_ids):
        with engine.connect() as conn:
            runs = _run_rows(conn, part)
            tags = _tags(conn, part)
            keys = _keys(conn, part)
        for key in sorted({k for found in keys.values() for k in found}):
            rollups.ensure_fresh(engine, [r for r in part if key in keys.get(r, {})], key)
        with engine.connect() as conn:
            buckets = _buckets(conn, part, {k for found in keys.values() for k in found}, since_ms)
        for run_id, row in runs.items():
            out[run_id] = _evidence(run_id, row, tags.get(run_id, {}), keys.get(run_id, {}), buckets.get(run_id, {}), now_ms)
    return out


def _run_rows(conn: sa.Connection, run_ids: Sequence[str]) -> dict[str, dict]:
    r = mlflowdb.runs.c
    query = sa.select(r.run_uuid, r.name, r.user_id, r.start_time, r.end_time).where(r.run_uuid.in_(run_ids))
    return {row.run_uuid: row._asdict() for row in conn.execute(query)}


def _tags(conn: sa.Connection, run_ids: Sequence[str]) -> dict[str, dict[str, str]]:
    t = mlflowdb.tags.c
    wanted = sa.or_(t.key.in_(TAGS), t.key.like("radt.gpus"), t.key.startswith(NODE_TAG, autoescape=True))
    out: dict[str, dict[str, str]] = {}
    for run_id, key, value in conn.execute(sa.select(t.run_uuid, t.key, t.value).where(t.run_uuid.in_(run_ids), wanted)):
        out.setdefault(run_id, {})[key] = value or ""
    return out


def _keys(conn: sa.Connection, run_ids: Sequence[str]) -> dict[str, dict[str, catalogue.Resolved]]:
    m = mlflowdb.latest_metrics.c
    found: dict[str, list[str]] = {}
    for run_id, key in conn.execute(sa.select(m.run_uuid, m.key).where(m.run_uuid.in_(run_ids))):
        found.setdefault(run_id, []).append(key)
    return {run_id: wanted_keys(keys) for run_id, keys in found.items()}


def _buckets(conn: sa.Connection, run_ids: Sequence[str], keys: set[str], since_ms: int | None) -> dict[str, dict[str, list[tuple]]]:
    """run id -> key -> [(bucket ms, min, max, sum, count)] at 10 s, in time order."""
    if not keys:
        return {}
    r = rollups.rollups.c
    where = [r.run_uuid.in_(run_ids), r.key.in_(sorted(keys)), r.resolution_s == RESOLUTION]
    if since_ms is not None:
        where.append(r.bucket_ms >= since_ms - since_ms % (RESOLUTION * 1000))
    query = sa.select(r.run_uuid, r.key, r.bucket_ms, r.min, r.max, r.sum, r["count"]).where(*where).order_by(r.run_uuid, r.key, r.bucket_ms)
    out: dict[str, dict[str, list[tuple]]] = {}
    for run_id, key, *row in conn.execute(query):
        out.setdefault(run_id, {}).setdefault(key, []).append(tuple(row))
    return out


def window(rows: Sequence[tuple], scale: float = 1.0) -> Window:
    """A Window of (bucket ms, min, max, sum, count) rows, scaled to the catalogue's unit; NaN where a bucket held no reading."""
    ms = [int(r[0]) for r in rows]
    low = [r[1] * scale if r[4] and r[1] is not None else math.nan for r in rows]
    high = [r[2] * scale if r[4] and r[2] is not None else math.nan for r in rows]
    mean = [r[3] / r[4] * scale if r[4] and r[3] is not None else math.nan for r in rows]
    return Window(ms, low, high, mean, [int(r[4] or 0) for r in rows])


def _span(row: Mapping, tags: Mapping[str, str], now_ms: int) -> tuple[int, int]:
    """The script's own span where the run has it, else the run's."""
    start = row.get("start_time") or now_ms
    end = row.get("end_time") or now_ms
    script_start, script_end = tags.get(SCRIPT_START_TAG, ""), tags.get(SCRIPT_END_TAG, "")
    if script_start.isdigit():
        start = int(script_start)
    if script_end.isdigit():
        end = int(script_end)
    return int(start), max(int(start), int(end))


def _identity(tags: Mapping[str, str]) -> dict[Device, dict]:
    """Device -> its radt.gpus entry (name, memory), the run's own and each node's."""
    out: dict[Device, dict] = {}
    nodes: list[str | None] = [None, *sorted(node_statuses(tags))]
    for node in nodes:
        for entry in gpu_entries(tags, node):
            resolved = catalogue.resolve(f"system/{entry.get('series', '')}_{MetricName.SM_ACTIVE}")
            if resolved is not None:
                out[Device(node, resolved.gpu, resolved.mig)] = entry
    return out


def _evidence(run_id: str, row: Mapping, tags: Mapping[str, str], keys: Mapping[str, catalogue.Resolved], buckets: Mapping, now_ms: int) -> Evidence:
    start, end = _span(row, tags, now_ms)
    evidence = Evidence(
        run_id,
        start,
        end,
        bucket_s=RESOLUTION,
        name=row.get("name") or "",
        user=tags.get(f"{SLURM_PREFIX}user") or tags.get(USER_TAG) or row.get("user_id") or "",
        command=tags.get(COMMAND_TAG, ""),
        collocation=tags.get(COLLOCATION_TAG, ""),
    )
    identity = _identity(tags)
    gpus: dict[Device, GpuEvidence] = {}
    for key, resolved in sorted(keys.items()):
        rows = buckets.get(key)
        if not rows:
            continue
        name = resolved.metric.name
        if not resolved.metric.per_gpu:
            if resolved.node is None:  # the run's own host: a node's part is not the run's CPU
                evidence.host.setdefault(name, window(rows, resolved.scale))
            continue
        device = resolved.device
        gpu = gpus.get(device)
        if gpu is None:
            entry = identity.get(device, {})
            gpu = gpus[device] = GpuEvidence(device, model=entry.get("name") or tags.get(GPU_MODEL_TAG, ""), memory_total_mb=_memory(entry, tags))
        gpu.series.setdefault(name, window(rows, resolved.scale))
    for gpu in gpus.values():
        gpu.used = _used(gpu)
        if gpu.memory_total_mb is None:
            gpu.memory_total_mb = memory_from_share(gpu)
    evidence.gpus = [gpus[d] for d in sorted(gpus, key=Device.sort_key)]
    return evidence


def _memory(entry: Mapping, tags: Mapping[str, str]) -> float | None:
    for text in (entry.get("memory_total_mb"), tags.get(GPU_MEMORY_TAG)):
        try:
            value = float(text) if text not in (None, "") else None
        except (TypeError, ValueError):
            continue
        if value and math.isfinite(value) and value > 0:
            return value
    return None


def memory_from_share(gpu: GpuEvidence) -> float | None:
    """A GPU's memory size (MB) from its used MB and used % (runs recorded before radt.gpus held the size): radt records the
    % as used ÷ size, so a bucket's peak of each gives the size; the largest over the buckets where the GPU held any."""
    used, share = gpu.series.get(MetricName.MEMORY_USAGE_MEGABYTES), gpu.series.get(MetricName.MEMORY_USAGE_PERCENTAGE)
    if used is None or share is None:
        return None
    by_ms = dict(zip(share.bucket_ms, share.high))
    sizes = [mb * 100 / by_ms[ms] for ms, mb in zip(used.bucket_ms, used.high) if math.isfinite(mb) and by_ms.get(ms, math.nan) > 0]
    return max(sizes) if sizes else None


def _used(gpu: GpuEvidence) -> bool | None:
    """Whether the run's processes held memory on the GPU: NVML's per-process lists (process_memory_megabytes)."""
    own = gpu.series.get(MetricName.PROCESS_MEMORY_MEGABYTES)
    if own is None:
        return None
    return any(math.isfinite(h) and h > 0 for h in own.high)


def gather_from_client(client, run_ids: Sequence[str], *, now_ms: int | None = None) -> dict[str, Evidence]:
    """gather() through an MLflow client (a store behind `mlflow server`): each wanted series' history, bucketed as the
    rollups would bucket it (rollups.rows_of_points), so a run gets the same findings whatever store it is in."""
    from radt.points import Point

    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    out: dict[str, Evidence] = {}
    for run_id in dict.fromkeys(run_ids):
        run = client.get_run(run_id)
        keys = wanted_keys(run.data.metrics)
        points = [Point(key, m.value, m.timestamp, m.step) for key in keys for m in client.get_metric_history(run_id, key)]
        buckets: dict[str, list[tuple]] = {}
        for row in rollups.rows_of_points(run_id, points, (RESOLUTION,)):
            buckets.setdefault(row["key"], []).append((row["bucket_ms"], row["min"], row["max"], row["sum"], row["count"]))
        for rows in buckets.values():
            rows.sort()
        info = {"name": run.info.run_name, "user_id": run.info.user_id, "start_time": run.info.start_time, "end_time": run.info.end_time}
        out[run_id] = _evidence(run_id, info, dict(run.data.tags), keys, buckets, now_ms)
    return out
