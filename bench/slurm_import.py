"""What `radt import --slurm-since` costs per 1,000 jobs, beside the least any importer pays.

Side by side in one process, on a fresh store each (SQLite file, and a scratch PostgreSQL database):
  radt import       parse 1,000 `sacct --parsable2` lines (the format Slurm 22.05 printed for the tests' cluster) and
                    import each job's facts (find its run by job id, create it at the job's start with its tags, end
                    it with its state), no Prometheus; then the same 1,000 again (what a cron run every hour finds)
  mlflow floor      MlflowClient: create_run with the same tags and set_terminated, 1,000 times (no lookup, no parse)

sacct itself and Prometheus are not in these figures: sacct answered 1,000 jobs in ~0.1 s on the tests' slurmdbd,
and a job's series cost one backfill (bench/prometheus_import is the place for that).

Run:  .venv/bin/python bench/slurm_import.py [--jobs 1000] [--stores sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import sqlalchemy as sa  # noqa: E402
from mlflow import MlflowClient  # noqa: E402

from radt.collectors import slurmacct, slurmimport  # noqa: E402
from radt.collectors.tracking import connect  # noqa: E402

T0 = 1_795_700_000


def sacct_text(jobs: int) -> str:
    """`jobs` lines as sacct printed them on the tests' cluster: plain jobs, array tasks, failures, 0–4 GPUs on 16 nodes."""
    lines = []
    for i in range(jobs):
        start = T0 + i * 37
        stamp = lambda s: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(s))  # noqa: E731
        gpus = i % 5
        node = f"gpu{i % 16:02d}"
        job_id = f"{5000 + i // 4}_{i % 4}" if i % 7 == 0 else str(9000 + i)
        state, code = ("FAILED", "1:0") if i % 11 == 0 else ("COMPLETED", "0:0")
        idx = f"(IDX:0-{gpus - 1})" if gpus > 1 else ("(IDX:0)" if gpus else "")
        lines.append(
            f"{job_id}|{20000 + i}|train-{i % 23}|user{i % 9}|proj{i % 3}|gpu|{stamp(start - 60)}|{stamp(start)}|{stamp(start + 3600)}|{state}|{code}|{node}|"
            f"billing=1,cpu=8{f',gres/gpu={gpus}' if gpus else ''},node=1|radt-gres={node}>gpu:{gpus}{idx}"
        )
    return "\n".join(lines) + "\n"


def radt_import(uri: str, text: str) -> tuple[float, float, int]:
    """(parse + first import s, second import s, new runs in the first)."""
    client = connect(uri)
    began = time.perf_counter()
    jobs = slurmacct.parse_sacct(text)
    importer = slurmimport.JobImporter(client, uri)  # one per import, as `radt import --slurm` makes it
    made = sum(importer.job(job).created for job in jobs)
    first = time.perf_counter() - began
    began = time.perf_counter()
    importer = slurmimport.JobImporter(client, uri)  # the next import (cron's next hour): a new one
    again = sum(importer.job(job).created for job in slurmacct.parse_sacct(text))
    assert again == 0, f"a second import made {again} runs"
    return first, time.perf_counter() - began, made


def mlflow_floor(uri: str, text: str) -> float:
    client = MlflowClient(uri)
    experiment = client.create_experiment("floor")
    jobs = slurmacct.parse_sacct(text)
    began = time.perf_counter()
    for job in jobs:
        run = client.create_run(experiment, start_time=job.start_ms, run_name=job.name, tags=slurmimport.job_tags(job))
        client.set_terminated(run.info.run_id, status=job.status, end_time=job.end_ms)
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--stores", default="sqlite,postgresql")
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    logging.getLogger("alembic").setLevel(logging.ERROR)
    text = sacct_text(args.jobs)
    began = time.perf_counter()
    parsed = slurmacct.parse_sacct(text)
    print(f"parse {len(parsed)} sacct lines: {time.perf_counter() - began:.3f} s")
    print(f"{args.jobs} jobs; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    for store in args.stores.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            uris = []
            admin = None
            for name in ("radt", "floor"):
                if store == "sqlite":
                    uris.append(f"sqlite:///{tmp}/{name}.db")
                else:
                    admin = admin or sa.create_engine(args.pg, isolation_level="AUTOCOMMIT")
                    db = f"radt_bench_slurm_{name}_{os.getpid()}"
                    with admin.connect() as conn:
                        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{db}"'))
                        conn.execute(sa.text(f'CREATE DATABASE "{db}"'))
                    uris.append(args.pg.rsplit("/", 1)[0] + "/" + db)
            MlflowClient(uris[0]).search_experiments()  # both stores get MLflow's schema before the clock starts
            MlflowClient(uris[1]).search_experiments()
            first, again, made = radt_import(uris[0], text)
            floor = mlflow_floor(uris[1], text)
            print(
                f"{store:<10} radt import {first:6.2f} s ({made} runs; {first / args.jobs * 1000:.1f} ms a job), again {again:6.2f} s; "
                f"mlflow floor {floor:6.2f} s; RATIO radt/floor {first / floor:.2f}x"
            )
            if admin is not None:
                for uri in uris:
                    with admin.connect() as conn:
                        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{uri.rsplit("/", 1)[1]}" WITH (FORCE)'))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
