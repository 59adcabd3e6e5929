"""The Cluster view's rows: every run `radt import --slurm` made, with its job's facts and verdict, worst waste first.

Waste is the GPU-hours the job held but did not use: GPUs × hours × (1 − SMACT mean), SMACT being the share of time
the SMs were active (dcgm-exporter's DCGM_FI_PROF_SM_ACTIVE). Jobs without a verdict come last, the newest first.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

import sqlalchemy as sa

from radt.app.db.store import ACTIVE, EXPERIMENTS, RUNS, TAGS
from radt.runmodel import NO_SERIES_TAG, SLURM_EXPERIMENT_PREFIX, SLURM_JOB_TAG, SLURM_PARTITION_TAG, SLURM_PREFIX, VERDICT_PREFIX, gpus_in_tag

TAG_KEYS = {
    SLURM_JOB_TAG: "job",
    f"{SLURM_PREFIX}user": "user",
    f"{SLURM_PREFIX}account": "account",
    SLURM_PARTITION_TAG: "partition",
    f"{SLURM_PREFIX}state": "state",
    f"{SLURM_PREFIX}gpus_requested": "gpus_requested",
    f"{SLURM_PREFIX}gpus_used": "gpus_used",
    f"{VERDICT_PREFIX}smact_mean": "smact_mean",
    f"{VERDICT_PREFIX}flags": "flags",
    NO_SERIES_TAG: "no_series",
}


def _gpus(row: dict) -> int | None:
    """The job's GPUs: those it used, else those it requested; None where the import could not count them."""
    count = gpus_in_tag(row.get("gpus_used") or "")
    requested = row.get("gpus_requested") or ""
    return count or (int(requested) if requested.isdigit() else None)


def _float(text: str | None) -> float | None:
    try:
        value = float(text) if text else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def job_rows(engine: sa.Engine, now_ms: int | None = None) -> list[dict]:
    """One dict per imported job (its run id and experiment id beside its facts), worst waste first."""
    e, r, t = EXPERIMENTS, RUNS, TAGS
    stmt = (
        sa.select(r.c.run_uuid, r.c.experiment_id, r.c.start_time, r.c.end_time, t.c.key, t.c.value)
        .select_from(r.join(e, e.c.experiment_id == r.c.experiment_id).join(t, t.c.run_uuid == r.c.run_uuid))
        .where(
            e.c.name.startswith(SLURM_EXPERIMENT_PREFIX, autoescape=True),
            e.c.lifecycle_stage == ACTIVE,
            r.c.lifecycle_stage == ACTIVE,
            t.c.key.in_(list(TAG_KEYS)),
        )
    )
    runs: dict[str, dict] = {}
    with engine.connect() as conn:
        for run_id, experiment_id, start, end, key, value in conn.execute(stmt):
            row = runs.setdefault(run_id, {"run_id": run_id, "experiment_id": str(experiment_id), "start_ms": start, "end_ms": end})
            row[TAG_KEYS[key]] = value
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    out = []
    for row in runs.values():
        if "job" not in row:
            continue  # a workload parent, or a run made otherwise
        row["gpus"] = _gpus(row)
        row["hours"] = max(0.0, ((row["end_ms"] or now_ms) - (row["start_ms"] or now_ms)) / 3_600_000)
        row["smact_mean"] = _float(row.get("smact_mean"))
        smact = row["smact_mean"]
        row["wasted_gpu_hours"] = None if smact is None or row["gpus"] is None else row["gpus"] * row["hours"] * (1 - min(1.0, max(0.0, smact)))
        out.append(row)
    # the most wasted GPU-hours first; jobs without a verdict after them, the newest first (job ids sort as text: 10 < 9)
    out.sort(key=lambda x: (x["wasted_gpu_hours"] is None, -(x["wasted_gpu_hours"] or 0), -(x["start_ms"] or 0), x["job"]))
    return out


GROUPS = ("user", "account", "partition")  # what the Cluster view totals and narrows by


def narrow(rows: list[dict], chosen: Mapping[str, str]) -> list[dict]:
    """The rows whose user / account / partition equal the chosen ones (compared as text; the order kept)."""
    wanted = {k: v for k, v in chosen.items() if k in GROUPS and v}
    return [row for row in rows if all(row.get(k, "") == v for k, v in wanted.items())]


def totals(rows: list[dict], by: str) -> list[dict]:
    """Per user / account / partition: jobs, GPU-hours held, wasted GPU-hours and the SMACT mean weighted by GPU-hours,
    the last two over the jobs that have a verdict (`judged`); the most wasted first. `gpus_unknown`: the jobs whose GPUs
    are not known, whose GPU-hours the total lacks."""
    groups: dict[str, dict] = {}
    for row in rows:
        name = row.get(by, "") or ""
        group = groups.setdefault(
            name, {"name": name, "jobs": 0, "judged": 0, "gpus_unknown": 0, "gpu_hours": 0.0, "wasted_gpu_hours": 0.0, "_busy": 0.0, "_held": 0.0}
        )
        group["jobs"] += 1
        if row["gpus"] is None:
            group["gpus_unknown"] += 1
            continue
        held = row["gpus"] * row["hours"]
        group["gpu_hours"] += held
        if row["wasted_gpu_hours"] is not None:
            group["judged"] += 1
            group["wasted_gpu_hours"] += row["wasted_gpu_hours"]
            group["_held"] += held
            group["_busy"] += held - row["wasted_gpu_hours"]
    out = []
    for group in groups.values():
        held, busy = group.pop("_held"), group.pop("_busy")
        group["smact_mean"] = busy / held if held > 0 else None
        out.append(group)
    out.sort(key=lambda g: (-g["wasted_gpu_hours"], -g["gpu_hours"], g["name"]))
    return out
