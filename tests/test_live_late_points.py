"""The Live tab's incremental read with a series written a tick late: a Prometheus scrape is stored at its own
timestamp, after the host's newer point of the same tick. A cursor per series reads it; one per run skipped it."""

from __future__ import annotations

import numpy as np
import pytest
from mlflow import MlflowClient

from radt.app.db import live
from radt.app.db.store import make_read_engine
from radt.collectors.store import tracking
from radt.collectors.store.stores import SqlMetricStore
from radt.points import Point
from tests.support.runs import radt_run

pytestmark = pytest.mark.dialects  # the SQL radt issues differs per dialect: SQLite and the real PostgreSQL

NOW = 1_760_000_000_000
SMACT = "system/gpu_0_sm_active"  # from the exporter: scraped at t - 300 ms, written with the tick after
CPU = "system/cpu_utilization_percentage"  # from the host, at each tick's time


def test_a_scrape_written_after_newer_host_points_reaches_the_live_chart(store_uri):
    client = MlflowClient(store_uri)
    run = radt_run(client, tracking.resolve_experiment(client, store_uri, "live"), "late", start_time=NOW - 60_000)
    writer = SqlMetricStore(store_uri)
    engine = make_read_engine(store_uri)
    ticks = [NOW - 10_000 + i * 1000 for i in range(5)]
    # tick 0 wrote the host's point only: the scrape at ticks[0] - 300 was not stored in Prometheus yet
    writer.write(run, [Point(CPU, 10.0, ticks[0], 0)])
    first = live.new_points(engine, {run: {SMACT: NOW - 60_000, CPU: NOW - 60_000}}, {run: [SMACT, CPU]})
    assert list(first[run]) == [CPU]
    cursors = {SMACT: NOW - 60_000, CPU: int(first[run][CPU][0][-1])}  # as pages/live.py keeps them
    # tick 1: that scrape (older than the host's point the chart has) and the host's next point
    writer.write(run, [Point(SMACT, 0.42, ticks[0] - 300, 0), Point(CPU, 11.0, ticks[1], 1)])
    second = live.new_points(engine, {run: cursors}, {run: [SMACT, CPU]})
    assert list(second[run][SMACT][0]) == [ticks[0] - 300] and np.allclose(second[run][SMACT][1], [0.42])
    assert list(second[run][CPU][0]) == [ticks[1]]
    # the run's newest point as the only cursor (how it was): the scrape is lost to the chart
    assert SMACT not in live.new_points(engine, {run: ticks[0]}, {run: [SMACT, CPU]}).get(run, {})
    engine.dispose()
