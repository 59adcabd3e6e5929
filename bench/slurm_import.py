"""What `radt import --slurm-since` costs per 1,000 jobs, beside the least any importer pays.

Side by side in one process, on a fresh store each (SQLite file, and a scratch PostgreSQL database):
  radt import       parse 1,000 `sacct --parsable2` lines (the format Slurm 22.05 printed for the tests' cluster) and
                    import each job's facts (find its run by job id, create it at the job's start with its tags, end
                    it with its state), no Prometheus; then the same 1,000 again (what a cron run every hour finds)
  mlflow floor      MlflowClient: create_run with the same tags and set_terminated, 1,000 times (no lookup, no parse)

With --prometheus, the same jobs' GPU series too, from a real Prometheus (Debian's) scraping, every second, a dcgm-exporter
stand-in that serves the recorded `dcgmi dmon` log for 16 nodes × 4 GPUs; the jobs' times lie in what it scraped. Each
job then costs: which GPUs the exporter labelled with it (none here: their AdminComment says), the backfill of its GPUs'
series, its GPUs' memory and its verdict. The queries sent to Prometheus are counted, and the CPU of Prometheus'
process measured, per 1,000 jobs.

sacct itself is not in these figures: it answered 1,000 jobs in ~0.1 s on the tests' slurmdbd.

With --prometheus the jobs are imported batched (collectors/imports/batchfill.py: a node's window of jobs read in one
query, split by GPU and each job's span), then the same day again (every run unchanged: nothing written, no query),
and beside them the per-job backfill of the same jobs into another store (the old path; --no-old leaves it out).

Run:  .venv/bin/python bench/slurm_import.py [--jobs 1000] [--stores sqlite,postgresql] [--prometheus [--no-old]] [--no-floor]
"""

from __future__ import annotations

import argparse
import contextlib
import io
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

from radt.collectors.cluster import slurmimport  # noqa: E402
from radt.collectors.slurm import slurmacct  # noqa: E402
from radt.collectors.store.tracking import connect  # noqa: E402

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
    importer.index(jobs)
    made = sum(importer.job(job).created for job in jobs)
    first = time.perf_counter() - began
    began = time.perf_counter()
    importer = slurmimport.JobImporter(client, uri)  # the next import (cron's next hour): a new one
    jobs = slurmacct.parse_sacct(text)
    importer.index(jobs)
    again = sum(importer.job(job).created for job in jobs)
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


def prometheus_part(uri: str, jobs: int, history_s: int, old_uri: str | None) -> None:
    """`jobs` jobs of 20 s on 16 nodes inside what a real Prometheus scraped, imported with their series: batched (a node's
    window at a time), then the same day again (unchanged), and with `old_uri` the per-job backfill beside it; time,
    queries, CPU."""
    from radt.collectors.imports import importer
    from tests.support import prometheus as prom
    from tests.support.dcgm_exporter import Device

    log = REPO / "tests" / "fixtures" / "real-tool-logs" / "mnist_dcgmi_dmon_18fields.txt"
    nodes = [f"gpu{n:02d}" for n in range(16)]
    devices = [Device(node, gpu, gpu % 5, memory_mib=81_559) for node in nodes for gpu in range(4)]
    until = 'DCGM_FI_PROF_SM_ACTIVE{Hostname="gpu00",gpu="0"}[1h]'
    with prom.serving(log, devices, until, history_s, timeout=history_s * 2 + 60) as (_e, server):
        end = int(time.time()) - 2
        scraped = server.api("/api/v1/query", query="DCGM_FI_PROF_SM_ACTIVE[1h]")["result"]
        first = int(max(float(r["values"][0][0]) for r in scraped)) + 2  # every node's GPUs scraped from here on
        lines = []
        for i in range(jobs):  # 20 s each, spread over what every node's exporter was scraped for, GPUs as radt's prolog wrote them
            start = first + (i * 7) % max(1, end - 22 - first)
            node, gpus = nodes[i % 16], 1 + i % 4
            stamp = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))  # noqa: E731  (sacct prints local time)
            idx = f"(IDX:0-{gpus - 1})" if gpus > 1 else "(IDX:0)"
            lines.append(
                f"{30000 + i}|{30000 + i}|train-{i % 23}|user{i % 9}|proj{i % 3}|gpu|{stamp(start - 5)}|{stamp(start)}|{stamp(start + 20)}|"
                f"COMPLETED|0:0|{node}|billing=1,cpu=8,gres/gpu={gpus},node=1|radt-gres={node}>gpu:{gpus}{idx}"
            )
        text = "\n".join(lines) + "\n"
        ways = [("batched", uri, importer.batch_fill), ("again", uri, importer.batch_fill)] + ([("per job (old)", old_uri, None)] if old_uri else [])
        figures = {}
        for way, store, batch in ways:
            figures[way] = _import_once(server, store, text, batch, importer.prometheus_main)
            took, sent, cpu, filled = figures[way]
            per = 1000 / jobs
            print(
                f"  {way:<14} {took:7.2f} s for {jobs} jobs ({took / jobs * 1000:.1f} ms a job), {filled} filled with series; "
                f"{sent} queries ({sent / jobs:.2f} a job); Prometheus CPU {cpu:.2f} s; per 1,000 jobs: {took * per:.1f} s, {sent * per:.0f} queries"
            )
        if old_uri:
            (b, bq, _c, _f), (o, oq, _c2, _f2) = figures["batched"], figures["per job (old)"]
            print(f"  RATIO batched/old: time {b / o:.2f}x, queries {bq / max(1, oq):.3f}x; again/old time {figures['again'][0] / o:.3f}x")


def _import_once(server, uri: str, text: str, batch, fill) -> tuple[float, int, float, int]:
    """One `radt import --slurm-since` of `text`'s jobs as main does it (sacct's lines parsed, runs indexed, each job, the
    diagnosis): (seconds, queries, Prometheus CPU seconds, jobs with series)."""
    from radt.collectors.sources import promql

    sent = [0]
    original = promql._get

    def counted(*args, **kwargs):
        sent[0] += 1
        return original(*args, **kwargs)

    promql._get = counted
    client = connect(uri)
    cpu_before = _proc_cpu(server.proc.pid)
    began = time.perf_counter()
    try:
        parsed = slurmacct.parse_sacct(text)
        job_importer = slurmimport.JobImporter(client, uri, url=server.url, fill=fill, batch=batch)
        with contextlib.redirect_stderr(io.StringIO()):  # the backfill's line per run
            job_importer.index(parsed)
            done = [job_importer.job(job) for job in parsed]
            job_importer.close()
            job_importer.diagnose()
    finally:
        promql._get = original
    took = time.perf_counter() - began
    return took, sent[0], _proc_cpu(server.proc.pid) - cpu_before, sum(d.filled and d.reason is None for d in done)


def _proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--stores", default="sqlite,postgresql")
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--prometheus", action="store_true", help="also import the jobs' GPU series from a real Prometheus")
    parser.add_argument("--history", type=int, default=120, help="seconds Prometheus scrapes before the jobs are imported (default 120)")
    parser.add_argument("--no-old", action="store_true", help="with --prometheus: leave out the per-job backfill (~60-90 ms a job)")
    parser.add_argument("--no-floor", action="store_true", help="leave out the facts-only import and MLflow's floor")
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
            if not args.no_floor:
                first, again, made = radt_import(uris[0], text)
                floor = mlflow_floor(uris[1], text)
                print(
                    f"{store:<10} radt import {first:6.2f} s ({made} runs; {first / args.jobs * 1000:.1f} ms a job), again {again:6.2f} s; "
                    f"mlflow floor {floor:6.2f} s; RATIO radt/floor {first / floor:.2f}x"
                )
            if args.prometheus:
                print(f"{store:<10} with the jobs' GPU series from a real Prometheus:")
                if store == "sqlite":
                    prometheus_part(f"sqlite:///{tmp}/prom.db", args.jobs, args.history, None if args.no_old else f"sqlite:///{tmp}/old.db")
                else:  # the two databases of the facts: fresh ones where those were left out
                    prometheus_part(uris[1], args.jobs, args.history, None if args.no_old else uris[0])
            if admin is not None:
                for uri in uris:
                    with admin.connect() as conn:
                        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{uri.rsplit("/", 1)[1]}" WITH (FORCE)'))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
