"""The run filter and the run picker in real headless Chromium against a real `python app.py`, on an experiment of 500 runs
(50 workloads of 10, written straight into MLflow's tables) on SQLite and PostgreSQL.

A user types the issue's filter and the tree narrows to the runs it names, with a count; the filter lands in the URL
(`q`) and comes back on reload; "tick all matching" ticks them; a filter that cannot be read says why in one line.
The picker's speed and size with 500 runs are measured and kept in test-artifacts/filter-500-<store>.json.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.parse
import uuid

import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from radt import mlflowdb
from tests.support import postgres, state
from tests.support.browser import dashboard, screenshot
from tests.support.paths import ARTIFACTS
from tests.support.radtproc import radt_env

WORKLOADS, PER_WORKLOAD = 50, 10
BASE = 1_760_000_000_000
BATCHES = ("64", "128", "256", "512")
COLLOCATIONS = ("-", "mps", "3g.40gb")
EXAMPLE = "params.batch_size = '128' and tags.radt.collocation = 'mps' and attributes.status = 'FINISHED'"  # the issue's, with radt's stored 'mps'


def _run(w: int, i: int) -> dict:
    """The 500 runs' fields, from their workload and index alone (the tests count their matches from here)."""
    letter = chr(ord("A") + i)
    return {
        "name": f"{'resnet50' if w % 2 else 'bert'} {w:02d}{letter}",
        "letter": letter,
        "batch_size": BATCHES[i % 4],
        "collocation": COLLOCATIONS[w % 3],
        "status": "FAILED" if (w * PER_WORKLOAD + i) % 17 == 0 else "FINISHED",
        "start": BASE + w * 3_600_000,
        "minutes": 5 + (w * PER_WORKLOAD + i) % 40,
        "smact": 0.05 + 0.1 * (i % 10),
    }


def expected(predicate) -> int:
    return sum(1 for w in range(WORKLOADS) for i in range(PER_WORKLOAD) if predicate(_run(w, i)))


def fill_500(uri: str) -> str:
    """An experiment of 50 radt workloads of 10 runs each: parents, tags, params, 30 SMACT points and a loss per run, in a few bulk inserts."""
    experiment = MlflowClient(uri).create_experiment("500 runs")
    runs, tags, params, points, latest = [], [], [], [], []

    def run_row(run_id: str, name: str, status: str, start: int, end: int) -> dict:
        return {
            "run_uuid": run_id,
            "name": name,
            "source_type": "LOCAL",
            "source_name": "",
            "entry_point_name": "",
            "user_id": "radt",
            "status": status,
            "start_time": start,
            "end_time": end,
            "source_version": "",
            "lifecycle_stage": "active",
            "artifact_uri": f"/tmp/artifacts/{run_id}",
            "experiment_id": int(experiment),
        }

    for w in range(WORKLOADS):
        parent = uuid.uuid4().hex
        first = _run(w, 0)
        runs.append(run_row(parent, f"workload w{w:02d}", "FINISHED", first["start"], first["start"] + 50 * 60_000))
        tags += [
            {"run_uuid": parent, "key": k, "value": v}
            for k, v in {"radt.role": "workload", "radt.workload": f"w{w:02d}", "mlflow.runName": f"workload w{w:02d}"}.items()
        ]
        for i in range(PER_WORKLOAD):
            r, run_id = _run(w, i), uuid.uuid4().hex
            runs.append(run_row(run_id, r["name"], r["status"], r["start"], r["start"] + r["minutes"] * 60_000))
            run_tags = {"mlflow.runName": r["name"], "mlflow.parentRunId": parent, "radt.role": "run", "radt.letter": r["letter"]}
            tags += [{"run_uuid": run_id, "key": k, "value": v} for k, v in (run_tags | {"radt.collocation": r["collocation"]}).items()]
            params += [
                {"run_uuid": run_id, "key": k, "value": v} for k, v in {"batch_size": r["batch_size"], "lr": "0.1", "model": r["name"].split()[0]}.items()
            ]
            for s in range(30):
                points.append(
                    {"run_uuid": run_id, "key": "system/gpu_0_sm_active", "value": r["smact"], "timestamp": r["start"] + s * 1000, "step": s, "is_nan": False}
                )
            latest.append(
                {"run_uuid": run_id, "key": "system/gpu_0_sm_active", "value": r["smact"], "timestamp": r["start"] + 29_000, "step": 29, "is_nan": False}
            )
            latest.append({"run_uuid": run_id, "key": "loss", "value": 1.0 / (1 + i), "timestamp": r["start"] + 29_000, "step": 9, "is_nan": False})
    engine = sa.create_engine(uri)
    with engine.begin() as conn:
        for table, rows in (
            (mlflowdb.runs, runs),
            (mlflowdb.tags, tags),
            (mlflowdb.params, params),
            (mlflowdb.metrics, points),
            (mlflowdb.latest_metrics, latest),
        ):
            conn.execute(table.insert(), rows)
    engine.dispose()
    return str(experiment)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def many(request, tmp_path_factory, sqlite_template):
    """The 500-run store and a dashboard on it, for this module's tests."""
    home = tmp_path_factory.mktemp(f"many-{request.param}")
    with state.kept_environ(), pytest.MonkeyPatch.context() as mp:
        mp.setenv("RADT_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        if request.param == "sqlite":
            shutil.copy(sqlite_template, home / "store.db")
            uri, database = f"sqlite:///{home / 'store.db'}", None
        else:
            database = postgres.new_database(request.getfixturevalue("pg_template"))
            uri = postgres.pg_url(database)
        began = time.perf_counter()
        experiment = fill_500(uri)
        filled = time.perf_counter() - began
    try:
        with dashboard(uri, radt_env(home)) as base:
            yield {"uri": uri, "base": base, "experiment": experiment, "kind": request.param, "fill_s": filled}
    finally:
        if database:
            postgres.drop_databases([database])


def _open(page, many: dict, query: dict | None = None) -> None:
    page.goto(many["base"] + "?" + urllib.parse.urlencode({"exp": many["experiment"]} | (query or {})))
    page.locator("#run-filter-count").filter(has_text="500 runs").wait_for()


def _type(page, text: str) -> None:
    box = page.locator("#run-filter")
    box.fill(text)
    box.press("Enter")


def _shown(page) -> list[str]:
    """The labels of the runs in the tree (folded workloads too)."""
    return page.eval_on_selector_all(".wl-runs label", "labels => labels.map(l => l.textContent)")


def test_the_issues_filter_narrows_500_runs_and_stays_in_the_url(page, many):
    _open(page, many)
    assert page.locator("#run-filter-count").inner_text() == "500 runs"
    matching = expected(lambda r: r["batch_size"] == "128" and r["collocation"] == "mps" and r["status"] == "FINISHED")
    assert 0 < matching < 100

    _type(page, EXAMPLE)
    page.locator("#run-filter-count").filter(has_text=f"{matching} of 500 runs match").wait_for()
    shown = _shown(page)
    assert len(shown) == matching and all(label.startswith("✓") for label in shown), shown[:5]
    assert page.locator("#run-tree details:not([open])").count() == 0, "what the filter leaves is unfolded"
    assert page.locator("#run-filter-error").inner_text() == ""
    page.wait_for_function("(q) => new URLSearchParams(location.search).get('q') === q", arg=EXAMPLE)

    # tick all matching: every run the filter left, and nothing else
    page.locator("#run-tick-matching").click()
    page.wait_for_function("(n) => document.querySelectorAll('.wl-runs input:checked').length === n", arg=matching)
    page.wait_for_function(
        "([q, n]) => { const s = new URLSearchParams(location.search); return s.get('q') === q && (s.get('runs') || '').split(',').filter(Boolean).length === n; }",
        arg=[EXAMPLE, matching],
    )
    screenshot(page, f"filter-500-{many['kind']}")

    # reload: the filter, the tree it narrows and the ticks come back from the URL
    page.reload()
    page.locator("#run-filter-count").filter(has_text=f"{matching} of 500 runs match").wait_for()
    assert page.locator("#run-filter").input_value() == EXAMPLE
    assert len(_shown(page)) == matching
    assert page.locator(".wl-runs input:checked").count() == matching

    # radt's summaries narrow further: SMACT below 0.3 leaves the runs with index 0-2 (0.05, 0.15, 0.25)
    _type(page, EXAMPLE + " and smact.mean < 0.3")
    narrower = expected(lambda r: r["batch_size"] == "128" and r["collocation"] == "mps" and r["status"] == "FINISHED" and r["smact"] < 0.3)
    page.locator("#run-filter-count").filter(has_text=f"{narrower} of 500 runs match").wait_for()
    assert len(_shown(page)) == narrower


def test_a_filter_that_cannot_be_read_says_why_in_one_line(page, many):
    _open(page, many, {"q": "resnet50 w01"})
    words = expected(lambda r: r["name"].startswith("resnet50 01"))  # the old word list (name, workload...), from the link
    page.locator("#run-filter-count").filter(has_text=f"{words} of 500 runs match").wait_for()

    _type(page, "params.batch_size = '128' and foo.bar < 3")
    error = page.locator("#run-filter-error")
    error.filter(has_text="unknown field").wait_for()
    assert error.inner_text().startswith("unknown field 'foo.bar': use params., tags., attributes., metrics. or one of smact.mean")
    assert "\n" not in error.inner_text().strip()
    assert page.locator("#run-filter-count").inner_text() == "500 runs", "a filter that cannot be read hides nothing"
    screenshot(page, f"filter-error-{many['kind']}")

    _type(page, "tags.radt.collocation = 'MPS'")  # the issue's spelling; radt stores 'mps'
    page.locator("#run-tree").filter(has_text="would with the case ignored").wait_for()
    assert page.locator("#run-filter-count").inner_text() == "0 of 500 runs match"


def _picker_ms(many: dict, monkeypatch) -> dict:
    """pages/run_picker.picker() in this process on the 500 runs: the refresh callback's own work (ms), cold (summaries computed) and cached."""
    from radt.app import data
    from radt.pages import run_picker

    out = {}
    with state.dashboard_reads(many["uri"], monkeypatch):
        began = time.perf_counter()
        runs = data.runs([many["experiment"]])
        out["run_list_cold"] = round((time.perf_counter() - began) * 1000, 1)
        for name, text in (("none", ""), ("words", "resnet50 A"), ("mlflow", EXAMPLE), ("metric", "metrics.loss < 0.2"), ("summary", "smact.mean < 0.3")):
            for when, tries in (("cold", 1), ("cached", 3)):  # cached: the best of 3, one load spike on a shared machine is not the picker (1 s seen once)
                took = []
                for _ in range(tries):
                    began = time.perf_counter()
                    _tree, count, error = run_picker.picker(runs, set(), text)
                    took.append(time.perf_counter() - began)
                    assert not error and ("of 500" in count or not text), (text, count, error)
                out[f"{name}_{when}"] = round(min(took) * 1000, 1)
    return out


def test_the_picker_of_500_runs_stays_quick_and_small(page, many, monkeypatch):
    """The numbers for issue #14 point 10 (kept in test-artifacts): the picker's own work, the page's first tree, a filter's
    round trip in the browser and on the server, the DOM size."""
    picker_ms = _picker_ms(many, monkeypatch)
    served_ms: list[float] = []

    def finished(request) -> None:
        if "_dash-update-component" in request.url and "run-tree.children" in (request.post_data or ""):
            served_ms.append(round(request.timing["responseEnd"] - request.timing["requestStart"], 1))

    page.on("requestfinished", finished)
    began = time.perf_counter()
    _open(page, many)
    first_tree_s = time.perf_counter() - began
    nodes_all = page.evaluate("() => document.querySelectorAll('#run-tree *').length")
    folded = page.evaluate("() => [...document.querySelectorAll('#run-tree details')].filter(d => !d.open).length")
    assert folded == WORKLOADS, "500 runs: every workload folded until the filter leaves few"
    page.wait_for_load_state("networkidle")  # the page's own first callbacks (charts, tables) done: time the filter alone

    timings = {}
    for name, text in (("words", "resnet50 A"), ("mlflow", EXAMPLE), ("summary", "smact.mean < 0.3")):
        began = time.perf_counter()
        _type(page, text)
        page.locator("#run-filter-count").filter(has_text="of 500 runs match").wait_for()
        timings[name] = round(time.perf_counter() - began, 3)
        _type(page, "")
        page.wait_for_function("() => document.querySelector('#run-filter-count').textContent === '500 runs'")
        page.wait_for_load_state("networkidle")
    figures = {
        "store": many["kind"],
        "fill_s": round(many["fill_s"], 2),
        "picker_ms": picker_ms,
        "first_tree_s": round(first_tree_s, 3),
        "tree_nodes_500": nodes_all,
        "filter_round_trip_s": timings,
        "tree_callback_served_ms": served_ms,
    }
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"filter-500-{many['kind']}.json").write_text(json.dumps(figures, indent=2))
    print(figures)
    assert nodes_all < 6000, figures
    assert max(v for k, v in picker_ms.items() if k.endswith("cached")) < 500, figures
    assert first_tree_s < 10 and max(timings.values()) < 10, figures  # a shared 2-core machine: generous bounds; the JSON keeps the real figures
