"""The dashboard answers junk with a message, never an HTTP 500, and shows names as text.

A link is typed, pasted and edited by hand, and anyone who can reach the dashboard can send its
callbacks any JSON. Against a real `python app.py` on SQLite and on PostgreSQL (which refuses NUL
bytes in a query): junk links (the explore page's layout callback, as the browser asks for it) and
junk inputs to the draw callback answer 200 with a message. In real Chromium: a run named
`<a href="http://x">evil</a>` is that text in the legend, the tooltip and the run tree, with no
link anywhere; an export at 3000 DPI answers with a message, not a file. A zoomed window is cached
for a minute, not an hour (Redis grew to 117 MB after 680 zooms).
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request

import pytest
from mlflow import MlflowClient

from radt.collectors.store import tracking
from radt.collectors.store.stores import SqlMetricStore
from radt.points import Point
from tests.support.browser import TRACES_JS, dashboard, new_page, screenshot
from tests.support.paths import REDIS
from tests.support.postgres import pg_url
from tests.support.radtproc import radt_env
from tests.support.runs import radt_run

START = 1_760_000_000_000
EVIL = '<a href="http://x">evil</a>'
WORKLOAD = "<b>w</b> & %{y}"
EXTRA_KEYS = 40  # the evil run's own metrics: enough for 27 charts and for the cap of 30
DRAW_OUTPUTS = [("charts", "figure"), ("view", "data"), ("view-note", "children"), ("chart-legend", "children")]


def _fill(uri: str) -> dict:
    """An experiment with a run whose names are HTML and a plain one, each with a minute of SMACT; the evil run has 40 more metrics."""
    client = MlflowClient(uri)
    experiment = tracking.resolve_experiment(client, uri, "junk <i>exp</i>")
    evil = radt_run(client, experiment, EVIL, start_time=START, workload=WORKLOAD, script_args=["--note", "<script>alert(1)</script>"])
    other = radt_run(client, experiment, "plain run", start_time=START)
    smact = [Point("system/gpu_0_sm_active", 0.5 + 0.004 * i, START + i * 1000, i) for i in range(60)]
    lower = [Point("system/gpu_0_sm_active", 0.2, START + i * 1000, i) for i in range(60)]
    extra = [Point(f"custom/m{k:02d}", float(k + i), START + i * 1000, i) for k in range(EXTRA_KEYS) for i in range(5)]
    store = SqlMetricStore(uri)
    store.write(evil, smact + extra)
    store.write(other, lower)
    store.close()
    for run_id in (evil, other):
        client.set_terminated(run_id, "FINISHED", end_time=START + 60_000)
    return {"experiment": experiment, "evil": evil, "other": other}


# what a request carries reaches each dialect's SQL (PostgreSQL refuses a NUL byte in a query): SQLite and PostgreSQL
BOTH = pytest.mark.parametrize("junk", ["sqlite", "postgresql"], indirect=True)
SQLITE = pytest.mark.parametrize("junk", ["sqlite"], indirect=True)  # the page and the cache, the same on both


@pytest.fixture(scope="module")
def junk(request, tmp_path_factory, sqlite_template):
    """A store holding the junk experiment, and `python app.py` serving it: SQLite (BOTH: and the real PostgreSQL)."""
    home = tmp_path_factory.mktemp(f"junk-{request.param}")
    database, pool = None, None
    if request.param == "sqlite":
        shutil.copy(sqlite_template, home / "store.db")
        uri = f"sqlite:///{home / 'store.db'}"
    else:
        pool = request.getfixturevalue("pg_pool")
        database = pool.take()
        uri = pg_url(database)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RADT_HOME", str(home))
        ids = _fill(uri)
    try:
        with dashboard(uri, radt_env(home)) as base:
            yield {"base": base, "uri": uri, "kind": request.param, **ids}
    finally:
        if database:
            pool.give_back(database)


def _post(base: str, outputs: list[tuple[str, str]], inputs: list, state: list, changed: str) -> tuple[int, dict | None]:
    """One Dash callback request, as the browser sends it; (HTTP status, the JSON answer)."""
    body = {
        "output": ".." + "...".join(f"{i}.{p}" for i, p in outputs) + "..",
        "outputs": [{"id": i, "property": p} for i, p in outputs],
        "inputs": inputs,
        "state": state,
        "changedPropIds": [changed],
    }
    request = urllib.request.Request(f"{base}_dash-update-component", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read().decode()[:500]}


def _page(base: str, search: str) -> tuple[int, str]:
    """The explore page's layout for a link's query string (what Dash's pages callback returns to the browser)."""
    status, answer = _post(
        base,
        [("_pages_content", "children"), ("_pages_store", "data")],
        [{"id": "_pages_location", "property": "pathname", "value": "/"}, {"id": "_pages_location", "property": "search", "value": search}],
        [],
        "_pages_location.search",
    )
    return status, json.dumps(answer)


def _draw(
    base: str, runs, metrics, x="relative", mode="runs", smooth=0, log=(), zoom=None, gpus=(), gpu_mode="each", experiments=("1",), cols=1, tick=0, query=None,
    shown=None,
):  # fmt: skip
    """The draw callback with these control values (anything a request can carry)."""
    controls = [("metrics", "value", metrics), ("x-mode", "value", x), ("group-mode", "value", mode), ("smoothing", "value", smooth)]
    controls += [("log-y", "value", list(log) if isinstance(log, tuple) else log), ("zoom", "data", zoom)]
    controls += [("gpu-filter", "value", list(gpus) if isinstance(gpus, tuple) else gpus), ("gpu-mode", "value", gpu_mode)]
    controls += [("chart-columns", "value", cols), ("explore-tick", "n_intervals", tick)]
    inputs = [[{"id": {"type": "wl-runs", "wl": "w"}, "property": "value", "value": runs}]]
    inputs += [{"id": i, "property": p, "value": v} for i, p, v in controls]
    state = [{"id": "experiments", "property": "value", "value": list(experiments) if isinstance(experiments, tuple) else experiments}]
    state += [{"id": "run-filter", "property": "value", "value": query}, {"id": "view", "property": "data", "value": shown}]
    return _post(base, DRAW_OUTPUTS, inputs, state, "metrics.value")


def _links(ids: dict) -> list[tuple[str, str]]:
    """(query string, what the page must say) for links a user could paste."""
    both = f"exp={ids['experiment']}&runs={ids['evil']},{ids['other']}"
    many = ",".join(f"key:custom/m{k:02d}" for k in range(EXTRA_KEYS))
    return [
        ("?exp=1%00&runs=%00abc&metrics=cat:sm_active%00", "Ignored in this view: ignored 1 experiment id(s) that are not ids"),
        (f"?exp={ids['experiment']}%00&runs={ids['evil']}%00", "ignored 1 run id(s) that are not ids"),
        (f"?{both}&metrics=cat:nope&metrics=cat:sm_active&metrics=cat:sm_active", "ignored 1 metric(s) that are not metrics: 'cat:nope'"),
        (f"?{both}&xr=inf,nan", "ignored the zoom 'inf,nan': not two numbers on the relative axis; showing the whole runs"),
        (f"?{both}&xr=-1e308,1e308", "ignored the zoom '-1e308,1e308'"),
        (f"?{both}&x=wall&xr=0001-01-01,9999-12-31", "ignored the zoom '0001-01-01,9999-12-31': not two times on the wall axis"),
        (f"?{both}&x=step&xr=0,1e300", "ignored the zoom '0,1e300'"),
        (f"?{both}&metrics={many}", "showing the first 30 of 40 metrics; pick fewer to see the others"),
        (f"?{both}&gpu=x,%00,99999999999999&gpuagg=%3Cb%3E", "ignored 3 GPU filter entries that are not a GPU index; GPU mode '<b>' is not one of each, mean"),
        (f"?{both}&smooth=nan&x=junk&mode=junk&mode=runs", "x axis 'junk' is not one of relative, wall, step; showing relative; grouping 'junk' is not one of"),
        (f"?{both}&smooth=1e999&log=%00", "smoothing '1e999' is not a number from 0 to 0.99; showing none"),
    ]


@BOTH
def test_junk_links_answer_with_a_message(junk):
    for search, message in _links(junk):
        status, page = _page(junk["base"], search)
        assert status == 200, (search, page)
        assert json.dumps(message)[1:-1] in page, (search, message)


@BOTH
def test_the_draw_callback_answers_junk_inputs(junk):
    base, evil, other = junk["base"], junk["evil"], junk["other"]
    experiment = [junk["experiment"]]
    cases = [
        dict(runs=["\x00", 5, None, {"a": 1}], metrics=[None, {"a": 1}, "cat:nope", "key:\x00"], x="junk", mode=["x"], smooth="abc", log={"a": 1}),
        dict(runs=[evil], metrics=["cat:sm_active"], zoom={"axis": "relative-runs", "range": "inf,nan"}, gpus=["x", "\x00", 1e308], gpu_mode=None),
        dict(runs=[evil], metrics=["cat:sm_active"], zoom={"axis": "relative-runs", "range": "-1e308,1e308"}, experiments=["\x00", {}]),
        dict(runs=[evil], metrics=["cat:sm_active"], x="wall", zoom={"axis": "wall-runs", "range": "0001-01-01,9999-12-31"}),
        dict(runs=[evil, other], metrics=["cat:sm_active"], zoom="junk", smooth=1e308, log="yes"),
        dict(runs=[evil], metrics=["cat:sm_active", "cat:sm_active", "smact"], mode="grouped", gpu_mode="mean"),
        dict(runs=evil, metrics="cat:sm_active", experiments=None),
        dict(runs=[evil], metrics=["cat:sm_active"], cols="9", tick={"a": 1}, query="params.x = 'unterminated"),
        dict(runs=[evil], metrics=["cat:sm_active"], cols=None, tick=None, query={"a": ["\x00"]}),
        dict(runs=[evil, other], metrics=["cat:sm_active"], shown={"runs": [{"a": 1}, None, "\x00"]}),  # the view drawn before: its runs' order
        dict(runs=[evil, other], metrics=["cat:sm_active"], shown=["junk"]),
    ]
    for case in cases:
        status, answer = _draw(base, experiments=experiment, **case) if "experiments" not in case else _draw(base, **case)
        assert status in (200, 204), (case, answer)

    status, answer = _draw(base, [evil], [f"key:custom/m{k:02d}" for k in range(27)], experiments=experiment)
    assert status == 200, answer
    figure = answer["response"]["charts"]["figure"]
    assert len(figure["data"]) == 27 and len({t["yaxis"] for t in figure["data"]}) == 27, "27 charts, one above the other"


def _open(page, url: str, names: list[str]) -> list[dict]:
    page.goto(url)
    page.wait_for_function(
        "(names) => { const t = (" + TRACES_JS + ")('y'); return t && names.every(n => t.some(x => x.name === n)); }",
        arg=names,
    )
    return page.evaluate(TRACES_JS, "y")


@pytest.fixture
def page(browser, junk):
    failed: list[str] = []
    with new_page(browser, accept_downloads=True) as page:
        page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 500 else None)
        yield page
    assert not failed, failed


@SQLITE
def test_names_are_text_in_the_legend_the_tooltip_and_the_run_tree(page, junk):
    url = f"{junk['base']}?exp={junk['experiment']}&runs={junk['evil']},{junk['other']}&metrics=cat:sm_active"
    _open(page, url, [f"{EVIL} · GPU 0", "plain run · GPU 0"])
    page.wait_for_function("() => document.querySelectorAll('#chart-legend .legend-entry').length >= 2")
    legend = page.locator("#chart-legend .legend-entry .legend-label").all_text_contents()  # the sticky legend (Plotly's is hidden on screen)
    assert EVIL in legend, legend
    assert page.locator("#chart-legend a, #chart-legend script").count() == 0, "the names are text in the legend, not markup"
    box = page.locator("#charts .nsewdrag").first.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.5)
    page.wait_for_function("() => { const t = document.querySelector('.radt-tip'); return t && getComputedStyle(t).display !== 'none'; }")
    tooltip = page.locator(".radt-tip").inner_text()  # one line per run at that time
    assert EVIL in tooltip and page.locator(".radt-tip a, .radt-tip script, .radt-tip b").count() == 0, tooltip
    page.mouse.click(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.5)  # the details: its workload, as text
    page.locator(".radt-details").wait_for()
    details = page.locator(".radt-details").inner_text()
    assert (WORKLOAD in details or "plain run" in details) and page.locator(".radt-details a, .radt-details script").count() == 0, details
    assert page.locator("#charts a").count() == 0, "no link in the chart: not in the legend, the tooltip or a title"
    tree = page.locator("#run-tree").inner_text()
    assert EVIL in tree and page.locator("#run-tree a").count() == 0
    # the comparison bars by workload: the workload's name under its bar was Plotly's markup (bold "w")
    page.wait_for_function("() => document.querySelectorAll('#compare-figure .xtick text').length >= 2")
    ticks = page.locator("#compare-figure .xtick text").all_text_contents()
    assert any(WORKLOAD in t for t in ticks), ticks
    assert page.locator("#compare-figure .xtick tspan[style*='bold'], #compare-figure .xtick a").count() == 0, "a name under a bar is text"
    screenshot(page, "dashboard-names-are-text")


@SQLITE
def test_an_export_past_the_limits_answers_with_a_message(page, junk):
    downloads: list = []
    page.on("download", lambda download: downloads.append(download))
    url = f"{junk['base']}?exp={junk['experiment']}&runs={junk['evil']}&metrics=cat:sm_active"
    _open(page, url, [f"{EVIL} · GPU 0"])
    page.get_by_text("Export", exact=True).click()
    page.fill("#export-dpi", "3000")
    page.get_by_role("button", name="PNG").click()
    page.wait_for_function("() => document.querySelector('#export-status').textContent.includes('DPI')")
    assert page.locator("#export-status").text_content() == "DPI 3000 is out of range; use 30 to 2400 (300 for print)"
    assert downloads == [], "a message, not a file"


def test_a_png_is_capped_in_pixels_before_it_is_drawn():
    """2400 DPI on a tall figure would take the server gigabytes: refused before kaleido starts, with the DPI that fits."""
    import plotly.graph_objects as go

    from radt.app.export.exportoptions import ExportError, ExportStyle, check_style
    from radt.app.export.image import image_bytes

    figure = go.Figure(layout={"width": 672, "height": 1747})  # 7 in wide, 8 charts of 2.2 in
    with pytest.raises(ExportError, match=r"^a PNG of 16800 × 43675 pixels \(734 MP\) at 2400 DPI is over the 50 MP limit; use 626 DPI or less"):
        image_bytes(figure, "png", 2400)
    for style, message in [
        (ExportStyle(dpi=None), "no DPI given; use 30 to 2400"),
        (ExportStyle(dpi="x"), "DPI x is out of range"),
        (ExportStyle(dpi=float("nan")), "DPI nan is out of range"),
        (ExportStyle(font_size=float("inf")), "font size inf is out of range"),
        (ExportStyle(size="poster"), "size 'poster' is not one of"),
        (ExportStyle(legend="<b>"), "legend '<b>' is not one of"),
    ]:
        with pytest.raises(ExportError, match=message.replace("(", r"\(")):
            check_style(style)
    assert check_style(ExportStyle(dpi=3000), "svg").dpi == 3000, "the DPI is a PNG's only"


@SQLITE
def test_zoomed_windows_are_cached_for_a_minute_not_an_hour(junk):
    """Each zoom is a new window of a run: cached briefly, so a user zooming around cannot fill Redis."""
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(REDIS)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis at {REDIS} is unreachable under CI: {exc}")
        pytest.skip(f"Redis unreachable ({exc})")
    from flask import Flask

    from radt.app.db.state import STATE, connect_store
    from radt.app.view import data
    from radt.app.view.cache import CACHE, FINISHED_TIMEOUT, ZOOM_TIMEOUT, cache_config

    CACHE.init_app(Flask("radt-zoom-cache"), config=cache_config(REDIS))
    connect_store(junk["uri"])
    try:
        runs = data.runs([junk["experiment"]])
        runs = runs[runs["run_id"] == junk["evil"]]
        data.series("cat:sm_active", runs)
        for zoom in range(20):  # a user dragging across the chart
            data.series("cat:sm_active", runs, {junk["evil"]: (START + zoom * 1000, START + zoom * 1000 + 20_000)})
        keys = {
            "whole": data._key(STATE.store_uri, "devices", "cat:sm_active", junk["evil"], None, 2000, "timestamp", "points"),
            **{
                f"zoom {z}": data._key(
                    STATE.store_uri, "devices", "cat:sm_active", junk["evil"], (START + z * 1000, START + z * 1000 + 20_000), 2000, "timestamp", "points"
                )
                for z in range(20)
            },
        }
        ttls = {name: client.ttl("radt:" + key) for name, key in keys.items()}
        client.delete(*[f"radt:{key}" for key in keys.values()])
        assert FINISHED_TIMEOUT - 60 < ttls.pop("whole") <= FINISHED_TIMEOUT
        assert all(0 < ttl <= ZOOM_TIMEOUT for ttl in ttls.values()), ttls
    finally:
        STATE.engine.dispose()
