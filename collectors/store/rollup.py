"""`radt rollup`: build (or rebuild) the rollups of a store's runs from MLflow's raw `metrics` table.

For stores radt did not write (plain MLflow runs, stores older than rollups). Each run is rebuilt in its
own transaction, its points read in chunks (radt/rollups.py), so running it twice changes nothing and a
store of any size fits in memory.
"""

from __future__ import annotations

import sys
import time

import sqlalchemy as sa

from radt import mlflowdb, rollups
from radt.collectors.store.sqltracking import make_engine
from radt.errors import UserError
from radt.options import store_parent
from radt.settings import display_uri, is_database_uri, tracking_uri

PROGRESS_EVERY = 100  # runs per progress line


class RollupError(UserError):
    """A store or run `radt rollup` cannot use; one line naming the fix."""


def _engine(uri: str) -> sa.Engine:
    """The store's engine, checked to answer and to hold MLflow's runs table."""
    if not is_database_uri(uri) or uri.split(":", 1)[0].split("+")[0] not in ("sqlite", "postgresql"):
        raise RollupError(f"{display_uri(uri)} is not a SQLite or PostgreSQL store; give the database URI (--store) of the mlflow server's backend store")
    return mlflowdb.check_store(make_engine(uri), display_uri(uri), RollupError)


def _check_runs(conn: sa.Connection, wanted: list[str], uri: str) -> None:
    """Every run asked for exists in the store."""
    runs = mlflowdb.runs
    found = set(conn.execute(sa.select(runs.c.run_uuid).where(runs.c.run_uuid.in_(wanted))).scalars())
    missing = [r for r in wanted if r not in found]
    if missing:
        raise RollupError(f"run '{missing[0]}' not found in {display_uri(uri)}; give a run id of that store (or --store)")


def build(uri: str, wanted: list[str] | None = None, out=sys.stderr) -> tuple[int, int, int]:
    """Rebuild the rollups of the given runs (every run without any); (runs, series, rows)."""
    engine = _engine(uri)
    try:
        rollups.ensure_table(engine)
        with engine.connect() as conn:
            if wanted:
                _check_runs(conn, wanted, uri)
            ids = list(dict.fromkeys(wanted)) if wanted else rollups.run_ids(conn)
        series = rows = 0
        for done, run_id in enumerate(ids, 1):
            with engine.begin() as conn:  # a run's rows are replaced at once: a reader never sees half of them
                n_series, n_rows = rollups.rebuild_run(conn, run_id)
            series, rows = series + n_series, rows + n_rows
            if done % PROGRESS_EVERY == 0:
                print(f"radt rollup: {done}/{len(ids)} runs, {series} series, {rows} rows", file=out)
        return len(ids), series, rows
    finally:
        engine.dispose()


def main(argv: list[str]) -> int:
    from radt.cli import OneLineParser  # mistakes in one line, like the rest of radt

    parser = OneLineParser(
        parents=[store_parent()], prog="radt rollup", description="Build the rollups (min/max/mean/last per 10 s, 1 min, 5 min, 20 min) of a store's runs."
    )
    parser.add_argument("--run", action="append", metavar="RUN_ID", help="only this run (repeatable; default: every run)")
    args = parser.parse_args(argv)
    uri = tracking_uri(args.store)
    started = time.perf_counter()
    runs, series, rows = build(uri, args.run)
    seconds = time.perf_counter() - started
    print(f"radt rollup: {runs} runs, {series} series, {rows} rows in {seconds:.1f} s", file=sys.stderr)
    return 0
