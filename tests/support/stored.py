"""How many points of one key a run's store holds: the wait of the tests' training scripts ("train until the store
holds N GPU samples"). Read with SQLAlchemy Core through radt's copy of MLflow's tables (radt.mlflowdb), because
importing MLflow's client cost each such script ~2 s of CPU (~60 s in the suite); an `mlflow server` store
(http://...) is read through MLflow's client, as there is no table to read."""

from __future__ import annotations

import os
from functools import cache

import sqlalchemy as sa

from radt import mlflowdb


@cache
def _engine(uri: str) -> sa.Engine:
    return sa.create_engine(uri)


def points(run_id: str, key: str, uri: str | None = None) -> int:
    """The points of KEY in RUN_ID's history (what len(MlflowClient().get_metric_history(...)) says), in the store
    at URI (default: MLFLOW_TRACKING_URI, the store radt gave the script)."""
    uri = uri or os.environ["MLFLOW_TRACKING_URI"]
    if not uri.startswith(("sqlite:", "postgresql")):
        from mlflow import MlflowClient

        return len(MlflowClient(uri).get_metric_history(run_id, key))
    table = mlflowdb.metrics
    query = sa.select(sa.func.count()).select_from(table).where(table.c.run_uuid == run_id, table.c.key == key)
    with _engine(uri).connect() as conn:
        return conn.execute(query).scalar_one()


def per_key_and_step(uri: str, run_id: str, prefix: str = "") -> dict[str, dict[int, int]]:
    """{key: {step: rows}} of the run's metrics whose key starts with PREFIX, read straight from the store's database (a
    point stored twice shows as 2). SQLite busy with a writer raises sqlalchemy's OperationalError."""
    engine = sa.create_engine(uri)
    try:
        with engine.connect() as conn:
            query = "select key, step, count(*) from metrics where run_uuid = :r and key like :p group by key, step"
            rows = conn.execute(sa.text(query), {"r": run_id, "p": prefix + "%"}).all()
    finally:
        engine.dispose()
    counts: dict[str, dict[int, int]] = {}
    for key, step, n in rows:
        counts.setdefault(key, {})[step] = n
    return counts
