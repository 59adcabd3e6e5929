"""Stores whose runs radt has diagnosed, for the dashboard's diagnosis tests (issue #54): series written by radt's own
writer (its rollups kept), Slurm jobs imported as `radt import --slurm` makes them, the tags from `radt diagnose`'s path."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from radt.catalogue import MetricName, key
from radt.collectors.diagnose.stored import diagnose_and_store
from radt.collectors.store import tracking
from radt.collectors.store.stores import SqlMetricStore
from radt.points import Point
from tests.support.runs import radt_run

MINUTE = 60_000
STEP_MS = 10_000  # one point per 10-second rollup bucket


def write_series(writer: SqlMetricStore, run_id: str, name: str, gpu: int | None, start: int, minutes: float, value: Callable[[float], float]) -> None:
    """One point per 10 s over `minutes` from `start`; `value(minute)` gives each point's value."""
    count = int(minutes * MINUTE / STEP_MS)
    writer.write(run_id, [Point(key(name, gpu), float(value(i * STEP_MS / MINUTE)), start + i * STEP_MS, i) for i in range(count)])


def views_store(uri: str, start: int) -> dict[str, str]:
    """Three finished runs in experiment 'diagnosis': 'pair' (2 GPUs 30 min, GPU 1 idle, GPU 0 held by the power cap in
    minutes 10-20), 'busy' (1 GPU, 10 min, nothing wrong) and 'plain' (never diagnosed); the first two diagnosed as
    `radt diagnose` does. Returns the experiment's id and the runs' ids by name."""
    client = tracking.connect(uri)
    experiment = tracking.resolve_experiment(client, uri, "diagnosis")
    writer = SqlMetricStore(uri)
    runs = {name: radt_run(client, experiment, name, start_time=start, workload=None) for name in ("pair", "busy", "plain")}
    write_series(writer, runs["pair"], MetricName.SM_ACTIVE, 0, start, 30, lambda m: 0.8)
    write_series(writer, runs["pair"], MetricName.SM_ACTIVE, 1, start, 30, lambda m: 0.0)
    write_series(writer, runs["pair"], MetricName.POWER_USAGE_WATTS, 0, start, 30, lambda m: 300.0)
    write_series(writer, runs["pair"], MetricName.POWER_USAGE_WATTS, 1, start, 30, lambda m: 60.0)
    write_series(writer, runs["pair"], MetricName.CLOCKS_POWER_CAPPED, 0, start, 30, lambda m: 1.0 if 10 <= m < 20 else 0.0)
    write_series(writer, runs["busy"], MetricName.SM_ACTIVE, 0, start, 10, lambda m: 0.7)
    write_series(writer, runs["plain"], MetricName.SM_ACTIVE, 0, start, 10, lambda m: 0.7)
    writer.close()
    for name, minutes in (("pair", 30), ("busy", 10), ("plain", 10)):
        client.set_terminated(runs[name], "FINISHED", end_time=start + minutes * MINUTE)
    diagnose_and_store(client, [runs["pair"], runs["busy"]])
    return {"experiment": experiment, **runs}


def import_jobs(uri: str, sacct: str, gpus: Mapping[str, Sequence[int]], busy: Mapping[str, Sequence[int]]) -> dict[str, str]:
    """sacct's lines imported as radt import --slurm makes them (facts), each job's GPUs' SMACT written over its span (0.9
    on its `busy` GPUs, 0 on the others), then the jobs with GPUs diagnosed as the import does; job id -> run id."""
    from radt.collectors.cluster import slurmimport
    from radt.collectors.slurm import slurmacct

    client = tracking.connect(uri)
    importer = slurmimport.JobImporter(client, uri)
    writer = SqlMetricStore(uri)
    runs = {}
    for job in slurmacct.parse_sacct(sacct):
        runs[job.job_id] = importer.job(job).run_id
        minutes = (job.end_ms - job.start_ms) / MINUTE
        for gpu in gpus.get(job.job_id, []):
            level = 0.9 if gpu in busy.get(job.job_id, []) else 0.0
            write_series(writer, runs[job.job_id], MetricName.SM_ACTIVE, gpu, job.start_ms, minutes, lambda m, v=level: v)
    writer.close()
    diagnose_and_store(client, [runs[j] for j in gpus])
    return runs
