"""The explore page in real headless Chromium against a real `python app.py`, on SQLite (the Redis-cached view on PostgreSQL).

A user picks experiment → workload → runs, sees one SMACT trace per run, switches to grouped,
reloads and finds the same view from the URL; zooming asks the store again for the visible window
at full detail. Screenshots are kept in test-artifacts/. The store (`radt demo`, a three-hour run, real 5-GPU
logs) and the dashboard are conftest.py's filled_store and served, shared with tests/test_export_browser.py.
"""

from __future__ import annotations

import csv
import io
import os
import re

import numpy as np
import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from radt.app.db import store
from tests.support.browser import TRACES_JS, chart_titles, dashboard, drawn_traces, relayout_chart, screenshot, wait_for_traces
from tests.support.paths import REDIS
from tests.support.radtproc import radt_env
from tests.support.stores import LONG_START, RESNET


def test_pick_runs_group_and_reload(page, served, filled_store):
    page.goto(served)
    page.locator("#experiments label", has_text=RESNET).locator("input").check()
    page.locator(".workload summary", has_text="2 same GPU").locator("input").check()
    traces = wait_for_traces(page, {"resnet50 2A · GPU 0", "resnet50 2B · GPU 0"})
    assert all(t["n"] > 100 for t in traces), traces
    assert chart_titles(page)[:4] == ["SMACT", "SMOCC", "GRACT", "DRAMA"]
    page.wait_for_function(  # the table is filled in its own request after the charts: wait for both runs' rows
        "() => Array.from(document.querySelectorAll('#summary tbody tr')).filter(r => r.innerText.includes('resnet50 2')).length >= 2"
    )
    rows = page.locator("#summary tbody tr").all_inner_texts()
    assert sum("resnet50 2" in r for r in rows) == 2, rows

    # one more run from another workload, ticked on its own
    page.locator(".workload", has_text="3 MPS").locator(".wl-runs label", has_text="resnet50 3A").locator("input").check()
    wait_for_traces(page, {"resnet50 2A · GPU 0", "resnet50 2B · GPU 0", "resnet50 3A · GPU 0"})

    # grouped: one mean per workload (with its band), named with the number of runs
    page.locator("#group-mode label", has_text="grouped").locator("input").check()
    grouped = {"workload 2 same GPU (mean of 2)", "workload 3 MPS (mean of 1)"}
    page.wait_for_function(
        "(names) => { const t = (" + TRACES_JS + ")('y'); return t && names.every(n => t.some(x => x.name === n)); }",
        arg=sorted(grouped),
    )
    page.wait_for_function("location.search.includes('mode=grouped')")
    url = page.url
    assert re.search(r"[?&]exp=\d", url) and "runs=" in url, url
    screenshot(page, f"explore-grouped-{filled_store['kind']}")

    # reload: the same view comes back from the URL alone
    page.reload()
    page.wait_for_function(
        "(names) => { const t = (" + TRACES_JS + ")('y'); return t && names.every(n => t.some(x => x.name === n)); }",
        arg=sorted(grouped),
    )
    assert page.locator("#group-mode input[value=grouped]").is_checked()
    assert page.locator(".wl-runs label", has_text="resnet50 3A").locator("input").is_checked()
    assert not page.locator(".wl-runs label", has_text="resnet50 3B").locator("input").is_checked()
    assert page.url == url


def test_every_gpu_of_a_run_is_drawn_averaged_filtered_and_exported(page, served, filled_store):
    """The 5-GPU MNIST run imported from real logs: one SMACT trace per GPU, each with every stored
    point; the per-run mean with its min-max band; the GPU filter; the CSV with each GPU's points."""
    run_id = filled_store["five_gpus"]
    experiment = MlflowClient(filled_store["uri"]).get_run(run_id).info.experiment_id
    engine = store.make_read_engine(filled_store["uri"])
    with engine.connect() as conn:
        stored = dict(
            conn.execute(
                sa.select(store.METRICS.c.key, sa.func.count())
                .where(store.METRICS.c.run_uuid == run_id, store.METRICS.c.key.like("system/gpu_%_sm_active"))
                .group_by(store.METRICS.c.key)
            ).all()
        )
    engine.dispose()
    assert len(stored) == 5, stored

    page.goto(f"{served}?exp={experiment}&runs={run_id}&metrics=cat:sm_active,cat:power_usage_watts")
    names = {f"mnist (PMDLT) · GPU {g}" for g in range(5)}
    traces = wait_for_traces(page, names)
    assert {t["name"]: t["n"] for t in traces} == {f"mnist (PMDLT) · GPU {g}": stored[f"system/gpu_{g}_sm_active"] for g in range(5)}
    hover = page.evaluate("() => document.querySelector('#charts .js-plotly-plot')._fullData.filter(t => t.meta && t.meta.device === 'GPU 3')[0].meta.where")
    assert "DGX Display" in hover, "the tooltip names the physical GPU the series is"
    screenshot(page, f"explore-five-gpus-{filled_store['kind']}")

    # per run, the mean across its GPUs with a min-max band
    page.locator("#gpu-mode label", has_text="mean per run").locator("input").check()
    page.wait_for_function(
        "() => { const g = document.querySelector('#charts .js-plotly-plot'); if (!g || !g._fullData) return false;"
        " const y = g._fullData.filter(t => (t.yaxis || 'y') === 'y');"
        " return y.some(t => t.meta && t.meta.device === 'mean of 5 GPUs') && y.some(t => t.fill === 'tonexty') && !y.some(t => t.meta && t.meta.device === 'GPU 0'); }"
    )
    page.wait_for_function("location.search.includes('gpuagg=mean')")

    # the GPU filter: GPU 2 alone
    page.locator("#gpu-mode label", has_text="each GPU").locator("input").check()
    page.locator("#gpu-filter label", has_text="GPU 2").locator("input").check()
    wait_for_traces(page, {"mnist (PMDLT) · GPU 2"})
    page.wait_for_function("location.search.includes('gpu=2')")
    page.reload()
    wait_for_traces(page, {"mnist (PMDLT) · GPU 2"})

    # the data behind the chart: every GPU's points, each under its GPU
    from radt.app.export.tables import data_csv
    from radt.app.exportcli import _open_store
    from radt.app.view.views import View

    _open_store(filled_store["uri"])
    text, _missing = data_csv(View([experiment], [run_id], ["cat:sm_active"]))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert {g: sum(r["gpu"] == str(g) for r in rows) for g in range(5)} == {g: stored[f"system/gpu_{g}_sm_active"] for g in range(5)}


def test_zoom_asks_for_the_window_at_full_detail(page, served, filled_store):
    run_id = filled_store["long_run"]
    experiment = MlflowClient(filled_store["uri"]).get_run(run_id).info.experiment_id
    page.goto(f"{served}?exp={experiment}&runs={run_id}&metrics=cat:sm_active")
    page.wait_for_function("() => { const t = (" + TRACES_JS + ")('y'); return t && t.length === 2 && t.every(x => x.name === 'three hours · GPU 0'); }")
    traces = drawn_traces(page)
    assert 1000 < max(t["n"] for t in traces) <= 2000, "the whole run is downsampled to the point budget (a mean line in its min-max envelope)"
    assert max(page.evaluate("() => Array.from(document.querySelector('#charts .js-plotly-plot')._fullData[0].y)")) == pytest.approx(0.99)

    # zoom to minutes 60-70 as a drag on the chart would: the store is asked again for that window
    relayout_chart(page, {"xaxis.range[0]": 60, "xaxis.range[1]": 70})
    page.wait_for_function("location.search.includes('xr=60')")
    page.wait_for_function("() => { const t = (" + TRACES_JS + ")('y'); return t && t.length === 1 && t[0].n <= 700; }")
    zoomed = drawn_traces(page)[0]
    engine = store.make_read_engine(filled_store["uri"])
    with engine.connect() as conn:
        raw = conn.execute(
            sa.select(sa.func.count())
            .select_from(store.METRICS)
            .where(
                store.METRICS.c.run_uuid == run_id,
                store.METRICS.c.key == "system/gpu_0_sm_active",
                store.METRICS.c.timestamp.between(LONG_START + 3_600_000, LONG_START + 4_200_000),
            )
        ).scalar_one()
    engine.dispose()
    inside = [x for x in zoomed["x"] if 60 <= x <= 70]
    assert len(inside) == raw == 601, (len(inside), raw)
    assert np.allclose(np.diff(inside), 1 / 60, atol=1e-5), "every sample of the window, one per second (float32 minutes)"
    screenshot(page, f"explore-zoomed-{filled_store['kind']}")

    # the zoom is part of the view: a reload shows the same window; a double-click zooms out again
    page.reload()
    page.wait_for_function("() => { const t = (" + TRACES_JS + ")('y'); return t && t.length === 1 && t[0].n <= 700; }")
    assert page.evaluate("() => document.querySelector('#charts .js-plotly-plot').layout.xaxis.range") == [60, 70]
    relayout_chart(page, {"xaxis.autorange": True})  # a double-click
    page.wait_for_function("!location.search.includes('xr=')")
    page.wait_for_function("() => { const t = (" + TRACES_JS + ")('y'); return t && t.length === 2 && Math.max(...t.map(x => x.n)) > 1000; }")

    # grouped on the wall-clock axis draws time since start: a zoom there is in minutes too
    page.locator("#x-mode label", has_text="wall clock").locator("input").check()
    page.locator("#group-mode label", has_text="grouped").locator("input").check()
    mean = "() => { const t = (" + TRACES_JS + ")('y'); return t && t.find(x => (x.name || '').includes('mean of 1')); }"
    page.wait_for_function(mean)
    relayout_chart(page, {"xaxis.range[0]": 60, "xaxis.range[1]": 70})
    page.wait_for_function("location.search.includes('xr=60')")
    page.wait_for_function("() => { const m = (" + mean + ")(); return m && Math.min(...m.x) >= 59.9 && Math.max(...m.x) <= 70.1; }")


def test_an_unreachable_store_is_a_page_not_a_traceback(page, tmp_path, radt_home):
    from tests.support.ports import free_port

    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/mlflow"  # nothing listens there
    with dashboard(dead, radt_env(radt_home)) as base:
        page.goto(base)
        page.wait_for_selector(".store-error")
        reason = page.locator("#store-error-reason").inner_text()
        assert "cannot read the tracking store" in reason and "127.0.0.1" in reason, reason
        assert "Traceback" not in page.content()


def test_a_missing_sqlite_store_says_how_to_make_one(tmp_path):
    from radt.app.db.state import STATE, connect_store, store_error

    missing = tmp_path / "nothing-here" / "mlflow.db"
    connect_store(f"sqlite:///{missing}")
    assert STATE.engine is None and "radt demo" in store_error() and str(missing) in store_error()
    assert not missing.exists(), "the dashboard never creates a store"


@pytest.mark.parametrize("filled_store", ["postgresql"], indirect=True)  # the production set-up: explore's PostgreSQL end to end
def test_several_workers_under_gunicorn_share_a_redis_cache(page, filled_store):
    """The documented multi-user set-up: `gunicorn -w 2 'radt.app:server'` with RADT_CACHE=redis://..."""
    import subprocess
    import sys

    import redis

    from tests.support.paths import REPO
    from tests.support.polling import wait_http
    from tests.support.ports import free_port

    try:
        redis.Redis.from_url(REDIS, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis at {REDIS} is unreachable under CI: {exc}")
        pytest.skip(f"Redis unreachable ({exc})")
    port = free_port()
    env = radt_env(filled_store["home"], filled_store["uri"], extra={"RADT_CACHE": REDIS})
    gunicorn = [sys.executable, "-m", "gunicorn", "-w", "2", "-b", f"127.0.0.1:{port}", "radt.app:server"]
    process = subprocess.Popen(gunicorn, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/", process)
        run_id = filled_store["long_run"]
        experiment = MlflowClient(filled_store["uri"]).get_run(run_id).info.experiment_id
        page.goto(f"http://127.0.0.1:{port}/?exp={experiment}&runs={run_id}&metrics=cat:sm_active")
        page.wait_for_function("() => { const t = (" + TRACES_JS + ")('y'); return t && t.length && t.every(x => x.name === 'three hours · GPU 0'); }")
        from radt.app.view.data import _key

        entry = "radt:" + _key(filled_store["uri"], "devices", "cat:sm_active", run_id, None, 2000, "timestamp", "envelope")
        assert redis.Redis.from_url(REDIS).exists(entry), "the series went through the shared Redis cache"
    finally:
        process.terminate()
        process.wait(timeout=20)
        process.stdout.close()
