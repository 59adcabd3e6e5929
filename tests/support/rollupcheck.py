"""Rollups checked against a direct computation from raw points: what any path that writes points must leave."""

from __future__ import annotations

import math

import pytest
import sqlalchemy as sa

from radt import catalogue, mlflowdb, rollups
from radt.collectors.store.sqltracking import make_engine
from radt.points import Point

MAX_FLOAT = mlflowdb.MAX_FLOAT


def direct(run_id: str, points: list[Point]) -> dict[tuple, dict]:
    """The rollups computed the plain way: every bucket's points gathered in Python; NaNs and infinities counted
    as no reading, min and max at their earliest times."""
    found: dict[tuple, list] = {}
    gone: dict[tuple, int] = {}
    for p in points:
        for resolution in rollups.RESOLUTIONS:
            pk = (run_id, p.key, resolution, p.timestamp - p.timestamp % (resolution * 1000))
            if not math.isfinite(p.value) or abs(p.value) == MAX_FLOAT or p.value in catalogue.missing_values(p.key):
                gone[pk] = gone.get(pk, 0) + 1
            else:
                found.setdefault(pk, []).append((p.timestamp, p.step, p.value))
    rows = {}
    for pk in found.keys() | gone.keys():
        items = found.get(pk, [])
        row = dict.fromkeys(rollups.VALUE_COLUMNS) | {"count": len(items), "nans": gone.get(pk, 0)}
        if items:
            values = [v for _, _, v in items]
            last = max(items)
            row |= {
                "min": min(values),
                "max": max(values),
                "sum": math.fsum(values),
                "min_ms": min(t for t, _, v in items if v == min(values)),
                "max_ms": min(t for t, _, v in items if v == max(values)),
                "last_value": last[2],
                "last_ms": last[0],
                "last_step": last[1],
            }
        rows[pk] = row
    return rows


def stored(uri: str, run_id: str | None = None) -> dict[tuple, dict]:
    engine = make_engine(uri)
    query = sa.select(rollups.rollups)
    if run_id:
        query = query.where(rollups.rollups.c.run_uuid == run_id)
    with engine.connect() as conn:
        result = {(r.run_uuid, r.key, r.resolution_s, r.bucket_ms): {c: getattr(r, c) for c in rollups.VALUE_COLUMNS} for r in conn.execute(query)}
    engine.dispose()
    return result


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for pk, row in want.items():
        for column, value in row.items():
            if column == "sum" and value is not None:  # merged sums are added in another order: equal up to float rounding
                assert got[pk][column] == pytest.approx(value, rel=1e-12, abs=1e-9), (pk, column)
            else:
                assert got[pk][column] == value, (pk, column)


def raw_points(uri: str, run_id: str) -> list[Point]:
    """The run's points as MLflow's metrics table holds them (NaN where is_nan)."""
    m = mlflowdb.metrics
    engine = make_engine(uri)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(m.c.key, m.c.value, m.c.timestamp, m.c.step, m.c.is_nan).where(m.c.run_uuid == run_id)).all()
    finally:
        engine.dispose()
    return [Point(key, math.nan if is_nan else value, ts, step) for key, value, ts, step, is_nan in rows]


def assert_rollups_cover_raw(uri: str, run_id: str) -> int:
    """The run's rollups equal a direct computation over its raw points, and every series is marked fresh; the points checked."""
    points = raw_points(uri, run_id)
    assert points, "the run has points"
    engine = make_engine(uri)
    try:
        with engine.connect() as conn:
            for key in {p.key for p in points}:
                assert rollups.stale(conn, [run_id], key) == [], f"{key} is marked fresh"
    finally:
        engine.dispose()
    assert_same(stored(uri, run_id), direct(run_id, points))
    return len(points)
