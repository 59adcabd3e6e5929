"""The Cluster view's rows: every run `radt import --slurm` made, with its job's facts and diagnosis, the most idle
GPU-hours first.

Idle GPU-hours and GPU-hours are the job's footprint (radt.footprint.idle_gpu_hours and gpu_hours: each GPU's share of the
job with its engine idle × the job's hours, radt/diagnosis.py's idle_numbers); the order is radt/footprint.py's rank_key,
the one ranking of jobs and of totals. Jobs without idle GPU-hours (never diagnosed, no activity series) come last, the
newest first. A job's findings are its radt.diagnosis codes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import sqlalchemy as sa

from radt.app.db.store import ACTIVE, EXPERIMENTS, RUNS, TAGS, chunks, plain_rows
from radt.diagnosis import CODES, codes_of
from radt.footprint import figures_of, rank_key
from radt.runmodel import (
    DIAGNOSIS_TAG,
    FOOTPRINT_PREFIX,
    NO_SERIES_TAG,
    SLURM_EXPERIMENT_PREFIX,
    SLURM_JOB_TAG,
    SLURM_PARTITION_TAG,
    SLURM_PREFIX,
    diagnosis_tag,
    gpus_in_tag,
)

TAG_KEYS = {
    SLURM_JOB_TAG: "job",
    f"{SLURM_PREFIX}user": "user",
    f"{SLURM_PREFIX}account": "account",
    SLURM_PARTITION_TAG: "partition",
    f"{SLURM_PREFIX}state": "state",
    f"{SLURM_PREFIX}gpus_requested": "gpus_requested",
    f"{SLURM_PREFIX}gpus_used": "gpus_used",
    NO_SERIES_TAG: "no_series",
}
FIGURE_TAGS = (f"{FOOTPRINT_PREFIX}gpu_hours", f"{FOOTPRINT_PREFIX}idle_gpu_hours")  # what the ranking reads (rank_key)
SUMMED = ("energy_kwh", "co2_kg", "cost")  # footprint figures the totals add up (each job's as its diagnosis figured it)
BASIS_TAG = f"{FOOTPRINT_PREFIX}basis"
READ_TAGS = (*TAG_KEYS, DIAGNOSIS_TAG, *FIGURE_TAGS, *(f"{FOOTPRINT_PREFIX}{name}" for name in SUMMED), BASIS_TAG)
GROUPS = ("user", "account", "partition")  # what the Cluster view totals and narrows by
FINDING = "finding"  # the query key that narrows the view to the jobs with one finding (a radt.diagnosis code)


def _gpus(row: dict) -> int | None:
    """The job's GPUs: those it used, else those it requested; None where the import could not count them."""
    count = gpus_in_tag(row.get("gpus_used") or "")
    requested = row.get("gpus_requested") or ""
    return count or (int(requested) if requested.isdigit() else None)


def _figures(row: dict, tags: Mapping[str, str]) -> dict[str, float]:
    """The job's footprint figures; GPU-hours held from Slurm's facts (GPUs × hours) where no footprint gives them."""
    figures = figures_of(tags)
    if "gpu_hours" not in figures and row["gpus"] is not None:
        figures["gpu_hours"] = row["gpus"] * row["hours"]
    return figures


def job_rows(engine: sa.Engine, now_ms: int | None = None) -> list[dict]:
    """One dict per imported job (its run id and experiment id beside its facts, codes and figures), worst first."""
    e, r, t = EXPERIMENTS, RUNS, TAGS
    stmt = (
        sa.select(r.c.run_uuid, r.c.experiment_id, r.c.start_time, r.c.end_time, t.c.key, t.c.value)
        .select_from(r.join(e, e.c.experiment_id == r.c.experiment_id).join(t, t.c.run_uuid == r.c.run_uuid))
        .where(
            e.c.name.startswith(SLURM_EXPERIMENT_PREFIX, autoescape=True),
            e.c.lifecycle_stage == ACTIVE,
            r.c.lifecycle_stage == ACTIVE,
            t.c.key.in_(list(READ_TAGS)),
        )
    )
    runs: dict[str, dict] = {}
    tags: dict[str, dict[str, str]] = {}
    with engine.connect() as conn:
        for run_id, experiment_id, start, end, key, value in conn.execute(stmt):
            runs.setdefault(run_id, {"run_id": run_id, "experiment_id": str(experiment_id), "start_ms": start, "end_ms": end})
            tags.setdefault(run_id, {})[key] = value or ""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    out = []
    for run_id, row in runs.items():
        held = tags[run_id]
        row.update((name, held[key]) for key, name in TAG_KEYS.items() if key in held)
        if "job" not in row:
            continue  # a workload parent, or a run made otherwise
        row["gpus"] = _gpus(row)
        row["hours"] = max(0.0, ((row["end_ms"] or now_ms) - (row["start_ms"] or now_ms)) / 3_600_000)
        row["diagnosed"] = DIAGNOSIS_TAG in held
        row["codes"] = codes_of(held)
        row["figures"] = _figures(row, held)
        row["gpu_hours"] = row["figures"].get("gpu_hours")
        row["idle_gpu_hours"] = row["figures"].get("idle_gpu_hours")
        row["basis"] = held.get(BASIS_TAG, "")
        out.append(row)
    # the worst first (rank_key); the unranked after them, the newest first (job ids sort as text: 10 < 9)
    out.sort(key=lambda x: (rank_key(x["figures"]), -(x["start_ms"] or 0), x["job"]))
    return out


def narrow(rows: list[dict], chosen: Mapping[str, str]) -> list[dict]:
    """The rows whose user / account / partition equal the chosen ones (compared as text) and that hold the chosen
    finding (a radt.diagnosis code); the order kept."""
    wanted = {k: v for k, v in chosen.items() if k in GROUPS and v}
    finding = chosen.get(FINDING) or ""
    return [row for row in rows if all(row.get(k, "") == v for k, v in wanted.items()) and (not finding or finding in row["codes"])]


def finding_counts(rows: Sequence[dict]) -> list[tuple[str, int]]:
    """(code, jobs with that finding) for every code some job has, the most frequent first (then the catalogue's order)."""
    counts = {code: sum(code in row["codes"] for row in rows) for code in CODES}
    return sorted(((c, n) for c, n in counts.items() if n), key=lambda item: (-item[1], CODES.index(item[0])))


def totals(rows: list[dict], by: str) -> list[dict]:
    """Per user / account / partition: jobs, GPU-hours held, idle GPU-hours and the idle share of the GPU-hours of the
    jobs that have idle GPU-hours (`ranked`); worst first by the same rank_key as the jobs. `gpus_unknown`: the jobs whose
    GPU-hours are not known, which the total lacks."""
    groups: dict[str, dict] = {}
    for row in rows:
        name = row.get(by, "") or ""
        group = groups.setdefault(
            name, {"name": name, "jobs": 0, "ranked": 0, "gpus_unknown": 0, "gpu_hours": 0.0, "idle_gpu_hours": None, "_held": 0.0} | dict.fromkeys(SUMMED)
        )
        group["jobs"] += 1
        held, idle = row["gpu_hours"], row["idle_gpu_hours"]
        if held is None:
            group["gpus_unknown"] += 1
        else:
            group["gpu_hours"] += held
        if idle is not None:
            group["ranked"] += 1
            group["idle_gpu_hours"] = (group["idle_gpu_hours"] or 0.0) + idle
            group["_held"] += held or 0.0
        for name in SUMMED:
            if name in row["figures"]:
                group[name] = (group[name] or 0.0) + row["figures"][name]
    out = []
    for group in groups.values():
        held = group.pop("_held")
        group["idle_share"] = group["idle_gpu_hours"] / held if group["idle_gpu_hours"] is not None and held > 0 else None
        out.append(group)
    out.sort(key=lambda g: (rank_key({"idle_gpu_hours": g["idle_gpu_hours"], "gpu_hours": g["gpu_hours"]}), g["name"]))
    return out


def finding_sentences(engine: sa.Engine, run_ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """run id -> code -> the finding's sentence (radt.diagnosis.<code>), for the jobs shown only."""
    keys = [diagnosis_tag(code) for code in CODES]
    out: dict[str, dict[str, str]] = {}
    with engine.connect() as conn:
        for chunk in chunks(list(run_ids)):
            stmt = sa.select(TAGS.c.run_uuid, TAGS.c.key, TAGS.c.value).where(TAGS.c.run_uuid.in_(chunk), TAGS.c.key.in_(keys))
            for run_id, key, value in plain_rows(conn, stmt):
                out.setdefault(run_id, {})[key[len(diagnosis_tag("")) :]] = value or ""
    return out
