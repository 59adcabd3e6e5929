"""The explore page in real headless Chromium against a real `python app.py`, on SQLite and PostgreSQL.

A user picks experiment → workload → runs, sees one SMACT trace per run, switches to grouped,
reloads and finds the same view from the URL; zooming asks the store again for the visible window
at full detail. Screenshots are kept in test-artifacts/.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from app import queries
from collectors import demo, tracking
from collectors.points import Point
from collectors.stores import SqlMetricStore
from tests.browser import TRACES_JS, dashboard, screenshot
from tests.conftest import SHARED_PG_PREFIX, _new_pg_database, _pg_url, radt_env
from tests.runs import radt_run

RESNET = "demo: resnet50 collocation"
LONG_POINTS = 10_800  # three hours at 1 Hz: downsampled on screen, raw when zoomed in
START = 1_760_000_000_000
REDIS = os.environ.get("RADT_TEST_REDIS", "redis://127.0.0.1:6379/0")


def _write_long_run(uri: str) -> str:
    """A three-hour radt run with a spike at minute 100, written through radt's own bulk path."""
    client = MlflowClient(uri)
    experiment = tracking.resolve_experiment(client, uri, "long runs")
    run_id = radt_run(client, experiment, "three hours", start_time=START)
    values = 0.5 + 0.3 * np.sin(np.arange(LONG_POINTS) / 30.0)
    values[6000] = 0.99  # one second of peak: must survive downsampling
    SqlMetricStore(uri).write(run_id, [Point("system/gpu_0_sm_active", float(v), START + i * 1000, i) for i, v in enumerate(values)])
    client.set_terminated(run_id, "FINISHED", end_time=START + LONG_POINTS * 1000)
    return run_id


def _import_five_gpus(uri: str) -> str:
    """`radt import` of the real 5-GPU MNIST logs (DGX Station A100: four A100s and the display GPU)."""
    import contextlib
    import io

    from collectors import importer
    from tests.conftest import FIXTURES

    files = [str(FIXTURES / name) for name in ("mnist_dcgmi_dmon_18fields.txt", "mnist_nvidia_smi.csv", "mnist_top_batch.txt")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert importer.main([*files, "-e", "imported 5 GPUs", "-n", "mnist (PMDLT)", "--store", uri]) == 0
    return out.getvalue().split()[-1]


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def filled_store(request, tmp_path_factory, sqlite_template):
    """A store holding `radt demo` and one long run, written once per store kind for all xdist
    workers (they only read it); conftest.py drops the PostgreSQL one when the whole run ends."""
    kind = request.param
    base = tmp_path_factory.getbasetemp()
    # the same folder for every xdist worker of this run (their basetemps share a parent); without xdist this run's own
    # basetemp: the parent then is /tmp/pytest-of-<user>, kept across runs, whose store a finished run has dropped
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with open(shared / f"browser-{kind}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        described = shared / f"browser-{kind}.json"
        if not described.exists():
            home = shared / f"browser-home-{kind}"
            home.mkdir(exist_ok=True)
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("RADT_HOME", str(home))
                mp.delenv("MLFLOW_TRACKING_URI", raising=False)
                if kind == "sqlite":
                    shutil.copy(sqlite_template, home / "store.db")
                    uri = f"sqlite:///{home / 'store.db'}"
                else:
                    uri = _pg_url(_new_pg_database(request.getfixturevalue("pg_template"), prefix=SHARED_PG_PREFIX))
                demo.write_demo(uri, minutes=4, report=lambda _line: None)
                long_run = _write_long_run(uri)
                five_gpus = _import_five_gpus(uri)
            described.write_text(json.dumps({"uri": uri, "home": str(home), "long_run": long_run, "five_gpus": five_gpus, "kind": kind}))
        info = json.loads(described.read_text())
    info["home"] = Path(info["home"])
    return info


@pytest.fixture(scope="session")
def served(filled_store):
    with dashboard(filled_store["uri"], radt_env(filled_store["home"])) as base:
        yield base


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    yield page
    context.close()


def _traces(page, axis: str = "y") -> list[dict]:
    return page.evaluate(TRACES_JS, axis) or []


def _wait_traces(page, names: set[str], axis: str = "y") -> list[dict]:
    """Until the chart on `axis` (y = the first chart, SMACT) shows exactly these legend names."""
    page.wait_for_function(
        "([axis, names]) => { const t = (" + TRACES_JS + ")(axis); return t && JSON.stringify(t.map(x => x.name).sort()) === JSON.stringify(names); }",
        arg=[axis, sorted(names)],
    )
    return _traces(page, axis)


def _relayout(page, update: dict) -> None:
    """What a drag or a double-click on the chart sends, once the chart listens for it (dcc.Graph
    binds its Plotly listeners again after a redraw that replaced the plot element)."""
    page.wait_for_function(
        "() => { const g = document.querySelector('#charts .js-plotly-plot');"
        " return g && g._ev && g._ev.listeners('plotly_relayout').length > 0 && !document.querySelector('#charts .dash-spinner, .dash-loading'); }"
    )
    page.evaluate("(update) => Plotly.relayout(document.querySelector('#charts .js-plotly-plot'), update)", update)


def _chart_titles(page) -> list[str]:
    return page.locator("#charts .annotation-text").all_text_contents()


def test_pick_runs_group_and_reload(page, served, filled_store):
    page.goto(served)
    page.locator("#experiments label", has_text=RESNET).locator("input").check()
    page.locator(".workload summary", has_text="2 same GPU").locator("input").check()
    traces = _wait_traces(page, {"resnet50 2A · GPU 0", "resnet50 2B · GPU 0"})
    assert all(t["n"] > 100 for t in traces), traces
    assert _chart_titles(page)[:4] == ["SMACT", "SMOCC", "GRACT", "DRAMA"]
    page.wait_for_function("document.querySelectorAll('#summary tbody tr').length >= 3")  # header + 2 runs
    rows = page.locator("#summary tbody tr").all_inner_texts()
    assert sum("resnet50 2" in r for r in rows) == 2, rows

    # one more run from another workload, ticked on its own
    page.locator(".workload", has_text="3 MPS").locator(".wl-runs label", has_text="resnet50 3A").locator("input").check()
    _wait_traces(page, {"resnet50 2A · GPU 0", "resnet50 2B · GPU 0", "resnet50 3A · GPU 0"})

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
    engine = queries.make_read_engine(filled_store["uri"])
    with engine.connect() as conn:
        stored = dict(
            conn.execute(
                sa.select(queries.METRICS.c.key, sa.func.count())
                .where(queries.METRICS.c.run_uuid == run_id, queries.METRICS.c.key.like("system/gpu_%_sm_active"))
                .group_by(queries.METRICS.c.key)
            ).all()
        )
    engine.dispose()
    assert len(stored) == 5, stored

    page.goto(f"{served}?exp={experiment}&runs={run_id}&metrics=cat:sm_active,cat:power_usage_watts")
    names = {f"mnist (PMDLT) · GPU {g}" for g in range(5)}
    traces = _wait_traces(page, names)
    assert {t["name"]: t["n"] for t in traces} == {f"mnist (PMDLT) · GPU {g}": stored[f"system/gpu_{g}_sm_active"] for g in range(5)}
    hover = page.evaluate("() => document.querySelector('#charts .js-plotly-plot')._fullData.filter(t => t.name === 'mnist (PMDLT) · GPU 3')[0].hovertemplate")
    assert "GPU 3" in hover and "DGX Display" in hover, "the tooltip names the physical GPU the series is"
    screenshot(page, f"explore-five-gpus-{filled_store['kind']}")

    # per run, the mean across its GPUs with a min-max band
    page.locator("#gpu-mode label", has_text="mean per run").locator("input").check()
    page.wait_for_function(
        "() => { const g = document.querySelector('#charts .js-plotly-plot'); if (!g || !g._fullData) return false;"
        " const y = g._fullData.filter(t => (t.yaxis || 'y') === 'y');"
        " return y.some(t => t.name === 'mnist (PMDLT) · mean of 5 GPUs') && y.some(t => t.fill === 'tonexty') && !y.some(t => (t.name || '').endsWith('GPU 0')); }"
    )
    page.wait_for_function("location.search.includes('gpuagg=mean')")

    # the GPU filter: GPU 2 alone
    page.locator("#gpu-mode label", has_text="each GPU").locator("input").check()
    page.locator("#gpu-filter label", has_text="GPU 2").locator("input").check()
    _wait_traces(page, {"mnist (PMDLT) · GPU 2"})
    page.wait_for_function("location.search.includes('gpu=2')")
    page.reload()
    _wait_traces(page, {"mnist (PMDLT) · GPU 2"})

    # the data behind the chart: every GPU's points, each under its GPU
    from app.export import data_csv
    from app.views import View
    from collectors.export import _open_store

    _open_store(filled_store["uri"])
    text, _missing = data_csv(View([experiment], [run_id], ["cat:sm_active"]))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert {g: sum(r["gpu"] == str(g) for r in rows) for g in range(5)} == {g: stored[f"system/gpu_{g}_sm_active"] for g in range(5)}


def test_zoom_asks_for_the_window_at_full_detail(page, served, filled_store):
    run_id = filled_store["long_run"]
    experiment = MlflowClient(filled_store["uri"]).get_run(run_id).info.experiment_id
    page.goto(f"{served}?exp={experiment}&runs={run_id}&metrics=cat:sm_active")
    traces = _wait_traces(page, {"three hours · GPU 0"})
    assert 1000 < traces[0]["n"] <= 2000, "the whole run is downsampled to the point budget"
    assert max(page.evaluate("() => Array.from(document.querySelector('#charts .js-plotly-plot')._fullData[0].y)")) == pytest.approx(0.99)

    # zoom to minutes 60-70 as a drag on the chart would: the store is asked again for that window
    _relayout(page, {"xaxis.range[0]": 60, "xaxis.range[1]": 70})
    page.wait_for_function("location.search.includes('xr=60')")
    page.wait_for_function("() => { const t = (" + TRACES_JS + ")('y'); return t && t.length === 1 && t[0].n <= 700; }")
    zoomed = _traces(page)[0]
    engine = queries.make_read_engine(filled_store["uri"])
    with engine.connect() as conn:
        raw = conn.execute(
            sa.select(sa.func.count())
            .select_from(queries.METRICS)
            .where(
                queries.METRICS.c.run_uuid == run_id,
                queries.METRICS.c.key == "system/gpu_0_sm_active",
                queries.METRICS.c.timestamp.between(START + 3_600_000, START + 4_200_000),
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
    _relayout(page, {"xaxis.autorange": True})  # a double-click
    page.wait_for_function("!location.search.includes('xr=')")
    page.wait_for_function("() => { const t = (" + TRACES_JS + ")('y'); return t && t.length === 1 && t[0].n > 1000; }")

    # grouped on the wall-clock axis draws time since start: a zoom there is in minutes too
    page.locator("#x-mode label", has_text="wall clock").locator("input").check()
    page.locator("#group-mode label", has_text="grouped").locator("input").check()
    mean = "() => { const t = (" + TRACES_JS + ")('y'); return t && t.find(x => (x.name || '').includes('mean of 1')); }"
    page.wait_for_function(mean)
    _relayout(page, {"xaxis.range[0]": 60, "xaxis.range[1]": 70})
    page.wait_for_function("location.search.includes('xr=60')")
    page.wait_for_function("(js) => { const m = eval(js)(); return m && Math.min(...m.x) >= 59.9 && Math.max(...m.x) <= 70.1; }", arg=mean)


def test_an_unreachable_store_is_a_page_not_a_traceback(page, tmp_path, radt_home):
    from tests.browser import free_port

    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/mlflow"  # nothing listens there
    with dashboard(dead, radt_env(radt_home)) as base:
        page.goto(base)
        page.wait_for_selector(".store-error")
        reason = page.locator("#store-error-reason").inner_text()
        assert "cannot read the tracking store" in reason and "127.0.0.1" in reason, reason
        assert "Traceback" not in page.content()


def test_a_missing_sqlite_store_says_how_to_make_one(tmp_path):
    from app.state import STATE, connect_store, store_error

    missing = tmp_path / "nothing-here" / "mlflow.db"
    connect_store(f"sqlite:///{missing}")
    assert STATE.engine is None and "radt demo" in store_error() and str(missing) in store_error()
    assert not missing.exists(), "the dashboard never creates a store"


@pytest.mark.parametrize("filled_store", ["postgresql"], indirect=True)  # the production set-up; store kinds are covered above
def test_several_workers_under_gunicorn_share_a_redis_cache(page, filled_store):
    """The documented multi-user set-up: `gunicorn -w 2 'app:server'` with RADT_CACHE=redis://..."""
    import subprocess
    import sys

    import redis

    from tests.browser import REPO, free_port, wait_http

    try:
        redis.Redis.from_url(REDIS, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis at {REDIS} is unreachable under CI: {exc}")
        pytest.skip(f"Redis unreachable ({exc})")
    port = free_port()
    env = radt_env(filled_store["home"], filled_store["uri"], extra={"RADT_CACHE": REDIS})
    gunicorn = [sys.executable, "-m", "gunicorn", "-w", "2", "-b", f"127.0.0.1:{port}", "app:server"]
    process = subprocess.Popen(gunicorn, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/", process)
        run_id = filled_store["long_run"]
        experiment = MlflowClient(filled_store["uri"]).get_run(run_id).info.experiment_id
        page.goto(f"http://127.0.0.1:{port}/?exp={experiment}&runs={run_id}&metrics=cat:sm_active")
        _wait_traces(page, {"three hours · GPU 0"})
        from app.data import _key

        entry = "radt:" + _key(filled_store["uri"], "devices", "cat:sm_active", run_id, None, 2000, "timestamp")
        assert redis.Redis.from_url(REDIS).exists(entry), "the series went through the shared Redis cache"
    finally:
        process.terminate()
        process.wait(timeout=20)
        process.stdout.close()
