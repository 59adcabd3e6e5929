"""`radt diagnose`: diagnose stored runs on demand, and fill the runs recorded before radt diagnosed them.

`radt diagnose RUN_ID...`, `--experiment NAME`, `--since 7d`; with none of these, every run without a diagnosis of the
current rules. Prints each run's findings, and keeps them on the run (tags) as a run's end or an import does.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import sqlalchemy as sa

from radt import mlflowdb
from radt.diagnosis import VERSION, Diagnosis
from radt.errors import UserError
from radt.options import span_ms, store_parent
from radt.runmodel import DIAGNOSIS_VERSION_TAG, ROLE_TAG, SLURM_PREFIX, WORKLOAD_ROLE
from radt.settings import display_uri, tracking_uri


class DiagnoseError(UserError):
    """A store or selection `radt diagnose` cannot use; one line naming the fix."""


def _client_and_engine(uri: str):
    from radt.collectors.store.tracking import connect

    client = connect(uri)
    engine = getattr(client, "engine", None)
    if engine is None:
        raise DiagnoseError(
            f"{display_uri(uri)} is an MLflow server; radt diagnose reads the rollups in its database: give the backend store's URI (--store postgresql://...)"
        )
    return client, engine


def select_runs(engine: sa.Engine, run_ids: Sequence[str], experiment: str | None, since: str | None, user: str | None = None) -> list[str]:
    """The runs asked for (workload parents left out), oldest first; with no selection, those without a current diagnosis.
    `user`: MLflow's user_id, or an imported Slurm job's radt.slurm.user."""
    r, e, t = mlflowdb.runs.c, mlflowdb.experiments.c, mlflowdb.tags.c
    users = sa.or_(r.user_id == user, r.run_uuid.in_(sa.select(t.run_uuid).where(t.key == f"{SLURM_PREFIX}user", t.value == user)))
    query = sa.select(r.run_uuid).select_from(mlflowdb.runs.join(mlflowdb.experiments, e.experiment_id == r.experiment_id))
    query = query.where(r.lifecycle_stage == "active", e.lifecycle_stage == "active")
    parents = sa.select(t.run_uuid).where(t.key == ROLE_TAG, t.value == WORKLOAD_ROLE)
    query = query.where(r.run_uuid.not_in(parents))
    if run_ids:
        query = query.where(r.run_uuid.in_(list(run_ids)))
    if experiment is not None:
        query = query.where(e.name == experiment)
    if since is not None:
        query = query.where(r.start_time >= int(time.time() * 1000) - span_ms(since, "--since"))
    if user is not None:
        query = query.where(users)
    if not (run_ids or experiment or since or user):
        current = sa.select(t.run_uuid).where(t.key == DIAGNOSIS_VERSION_TAG, t.value == str(VERSION))
        query = query.where(r.run_uuid.not_in(current))
    with engine.connect() as conn:
        found = list(conn.execute(query.order_by(r.start_time, r.run_uuid)).scalars())
        if experiment is not None and not conn.execute(sa.select(e.experiment_id).where(e.name == experiment)).first():
            raise DiagnoseError(f"no experiment named '{experiment}' in the store; give one the dashboard lists (or --store)")
        if user is not None and not found and not conn.execute(sa.select(r.run_uuid).where(users).limit(1)).first():
            raise DiagnoseError(f"no runs of user '{user}' in the store; give a user whose runs (or Slurm jobs) it holds (or --store)")
    missing = [run_id for run_id in run_ids if run_id not in found]
    if missing:
        raise DiagnoseError(f"run '{missing[0]}' not found in the store (or it is a workload's parent run); give a run id of that store (or --store)")
    return found


def describe(run_id: str, diagnosis: Diagnosis) -> list[str]:
    """The lines `radt diagnose` prints for one run: its codes, then each finding's sentence."""
    head = f"{run_id}: {', '.join(diagnosis.codes) or 'nothing found'}"
    if diagnosis.lacking:
        head += f" (not judged: {'; '.join(diagnosis.lacking)})"
    return [head, *(f"  {finding.code}: {finding.sentence}" for finding in diagnosis.findings)]


def main(argv: list[str]) -> int:
    from radt.cli import OneLineParser
    from radt.collectors.diagnose.stored import diagnose_and_store

    parser = OneLineParser(
        parents=[store_parent()],
        prog="radt diagnose",
        description="Diagnose stored runs (why a run is slow: idle GPUs, input starvation, small kernels, ...) and keep the findings on them.",
    )
    parser.add_argument("runs", nargs="*", metavar="RUN_ID", help="these runs (default: every run without a current diagnosis)")
    parser.add_argument("--experiment", help="every run of this experiment")
    parser.add_argument("--since", metavar="SPAN", help="every run started within this span, e.g. 7d, 12h")
    args = parser.parse_args(argv)
    uri = tracking_uri(args.store)
    started = time.perf_counter()
    client, engine = _client_and_engine(uri)
    run_ids = select_runs(engine, args.runs, args.experiment, args.since)
    if not run_ids:
        chosen = args.runs or args.experiment or args.since
        said = "no run matches that selection" if chosen else "every run already has a current diagnosis"
        print(f"radt diagnose: {said}; name runs, --experiment or --since to diagnose them (again)", file=sys.stderr)
        return 0
    found = diagnose_and_store(client, run_ids)
    for run_id, diagnosis in found.items():
        print("\n".join(describe(run_id, diagnosis)))
    with_findings = sum(bool(d.findings) for d in found.values())
    seconds = time.perf_counter() - started
    print(f"radt diagnose: {len(run_ids)} runs, {with_findings} with findings, in {seconds:.1f} s", file=sys.stderr)
    return 0
