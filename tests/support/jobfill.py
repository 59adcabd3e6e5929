"""Stores of many imported Slurm jobs, written straight into MLflow's tables in bulk: each job's run and tags as
`radt import --slurm` leaves them (slurmimport.job_tags, an array task's workload parent, the reason a job has no GPU
series, or the diagnosis and footprint tags `radt diagnose` writes). The Cluster page's tests (tests/test_jobtable.py)
and bench/cluster_page.py (100,000 jobs)."""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from typing import NamedTuple

import sqlalchemy as sa

from radt import mlflowdb
from radt.collectors.cluster import slurmimport
from radt.collectors.slurm.slurmacct import Job
from radt.collectors.store import tracking
from radt.diagnosis import CODES
from radt.runmodel import (
    DIAGNOSIS_LACKING_TAG,
    DIAGNOSIS_TAG,
    DIAGNOSIS_VERSION_TAG,
    FOOTPRINT_PREFIX,
    NO_SERIES_TAG,
    PARENT_TAG,
    ROLE_TAG,
    RUN_NAME_TAG,
    SLURM_EXPERIMENT_PREFIX,
    USER_TAG,
    WORKLOAD_ROLE,
    WORKLOAD_TAG,
    diagnosis_tag,
)

BATCH = 5000  # rows per bulk insert
START = 1_790_000_000_000
BASIS = "400 gCO2eq/kWh, PUE 1.2, 2 USD per GPU-hour"


class Imported(NamedTuple):
    """A job and the tags its run holds besides job_tags': no-series reason, or diagnosis and footprint."""

    job: Job
    tags: dict[str, str]


def diagnosis_tags(codes: Sequence[str], figures: dict[str, float | None]) -> dict[str, str]:
    """radt.diagnosis* and radt.footprint.* as radt diagnose writes them (figures in 4 significant digits)."""
    tags = {DIAGNOSIS_TAG: ",".join(codes), DIAGNOSIS_VERSION_TAG: "3", DIAGNOSIS_LACKING_TAG: ""}
    tags |= {diagnosis_tag(code): f"{code.replace('_', ' ')}: what was seen, and what to do" for code in codes}
    tags |= {f"{FOOTPRINT_PREFIX}{name}": f"{value:.4g}" for name, value in figures.items() if value is not None}
    return tags | {f"{FOOTPRINT_PREFIX}basis": BASIS}


def cluster_jobs(count: int, seed: int = 1, users: int = 300, accounts: int = 40, partitions: int = 8) -> list[Imported]:
    """`count` ended jobs of many users, accounts and partitions, as a cluster's day of imports leaves them: a tenth
    without GPU (no series), a tenth whose GPUs are unknown, one in 20 an array's task, the rest diagnosed with a mix of
    findings (a third clean) and their footprint."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        user = f"user{rng.randrange(users):03d}"
        gpus = rng.choice((1, 1, 2, 4, 8))
        start = START + i * 20_000
        end = start + rng.randrange(60, 48 * 3600) * 1000
        job_id = f"{700000 + i // 20}_{i % 20}" if i % 20 == 0 else str(800000 + i)
        kind = i % 10
        node = f"gpu{rng.randrange(400):03d}"
        job = Job(
            job_id=job_id,
            raw_id=job_id,
            name=f"train-{i % 97}",
            user=user,
            account=f"proj{int(user[4:]) % accounts:02d}",
            partition=f"part{rng.randrange(partitions)}",
            submit_ms=start - 60_000,
            start_ms=start,
            end_ms=end,
            state=rng.choice(("COMPLETED", "COMPLETED", "FAILED", "TIMEOUT")),
            exit_code=0,
            signal=0,
            nodes=(node,),
            gpus_requested=0 if kind == 0 else (None if kind == 1 else gpus),
            gpus=None if kind < 2 else {node: tuple(range(gpus))},
            gpus_from="AdminComment" if kind >= 2 else "",
        )
        if kind == 0:
            tags = {NO_SERIES_TAG: "the job had no GPU"}
        elif kind == 1:
            tags = {NO_SERIES_TAG: "no exporter series is labelled with the job; install examples/slurm/radt-gres-prolog.sh as PrologSlurmctld"}
        else:
            hours = (end - start) / 3_600_000
            idle_gpus = rng.choice((0, 0, 0, 1, gpus // 2, gpus - 1))
            codes = sorted(set(rng.sample(CODES, rng.choice((0, 0, 1, 1, 2, 3)))) | ({"idle_gpus"} if idle_gpus else set()), key=CODES.index)
            energy = gpus * hours * rng.uniform(0.1, 0.6)
            tags = diagnosis_tags(
                codes, {"gpu_hours": gpus * hours, "idle_gpu_hours": idle_gpus * hours, "energy_kwh": energy, "co2_kg": energy * 0.48, "cost": gpus * hours * 2}
            )
        out.append(Imported(job, tags))
    return out


def fill(uri: str, imported: Sequence[Imported]) -> list[str]:
    """The jobs' runs in their slurm-<user> experiments (an array's tasks under its workload parent, as the importer
    makes them), in a few bulk inserts; their run ids in order."""
    client = tracking.connect(uri)
    experiments = {}
    for user in sorted({i.job.user for i in imported}):
        experiments[user] = int(tracking.resolve_experiment(client, uri, f"{SLURM_EXPERIMENT_PREFIX}{user}"))
    runs, tags, ids, parents = [], [], [], {}
    for job, extra in imported:
        run_tags = slurmimport.job_tags(job) | extra
        experiment = experiments[job.user]
        if job.array_job:
            workload = f"{job.name} (array {job.array_job})"
            if (experiment, workload) not in parents:
                parent = uuid.uuid4().hex
                parents[(experiment, workload)] = parent
                runs.append(_run(parent, experiment, workload, "RUNNING", job.start_ms, None))
                tags += _tags(parent, {WORKLOAD_TAG: workload, ROLE_TAG: WORKLOAD_ROLE, USER_TAG: job.user, RUN_NAME_TAG: workload})
            run_tags |= {WORKLOAD_TAG: workload, PARENT_TAG: parents[(experiment, workload)]}
        run_id = uuid.uuid4().hex
        ids.append(run_id)
        runs.append(_run(run_id, experiment, job.name, job.status, job.start_ms, job.end_ms))
        tags += _tags(run_id, run_tags | {RUN_NAME_TAG: job.name})
    engine = client.engine if hasattr(client, "engine") else sa.create_engine(uri)
    with engine.begin() as conn:
        for start in range(0, len(runs), BATCH):
            conn.execute(sa.insert(mlflowdb.runs), runs[start : start + BATCH])
        for start in range(0, len(tags), BATCH):
            conn.execute(sa.insert(mlflowdb.tags), tags[start : start + BATCH])
    return ids


def _run(run_id: str, experiment: int, name: str, status: str, start: int | None, end: int | None) -> dict:
    return {
        "run_uuid": run_id,
        "name": name[:250],
        "source_type": "UNKNOWN",
        "source_name": "",
        "entry_point_name": "",
        "user_id": "radt",
        "status": status,
        "start_time": start,
        "end_time": end,
        "deleted_time": None,
        "source_version": "",
        "lifecycle_stage": mlflowdb.ACTIVE,
        "artifact_uri": "",
        "experiment_id": experiment,
    }


def _tags(run_id: str, tags: dict[str, str]) -> list[dict]:
    return [{"run_uuid": run_id, "key": k, "value": v} for k, v in tags.items()]
