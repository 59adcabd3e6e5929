"""The run picker with 500 runs (issue #14 point 10): its own work in this process, the page's first tree, a filter's
round trip in headless Chromium and on the server, and the tree's size, on the experiment of tests/support/many_runs.py
(50 workloads of 10) behind a real `python app.py`. Moved out of the test suite, where its timing bounds could only
pass or flake; tests/test_filter_browser.py keeps what the user sees (the folded workloads, the counts, the tree's size).

    .venv/bin/python bench/filter_picker.py [--store URI]    # default: a fresh SQLite file; e.g. postgresql://postgres@127.0.0.1/radt_bench_picker
    .venv/bin/python bench/filter_picker.py --runs 5000 --cache redis://127.0.0.1:6379/5 --no-browser   # issue #52 item 13

Prints the figures as JSON; --out writes them to a file too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.browser import chromium, dashboard, new_page  # noqa: E402
from tests.support.many_runs import EXAMPLE, PER_WORKLOAD, fill_runs  # noqa: E402
from tests.support.radtproc import radt_env  # noqa: E402

FILTERS = (("words", "resnet50 A"), ("mlflow", EXAMPLE), ("metric", "metrics.loss < 0.2"), ("summary", "smact.mean < 0.3"))


def picker_ms(uri: str, experiment: str, cache: str) -> dict:
    """pages/parts/run_picker.picker() in this process: the refresh callback's own work (ms), cold and the best of 3 cached."""
    import pytest
    from flask import Flask

    from radt.app.view import data
    from radt.app.view.cache import CACHE, cache_config
    from radt.pages.parts import run_picker
    from tests.support.state import dashboard_reads

    out = {}
    with pytest.MonkeyPatch.context() as mp, dashboard_reads(uri, mp):
        CACHE.init_app(Flask(__name__), config=cache_config(cache))  # simple (as dashboard_reads), or the deployment's Redis
        CACHE.clear()
        began = time.perf_counter()
        runs = data.runs([experiment])
        out["run_list_cold"] = round((time.perf_counter() - began) * 1000, 1)
        for name, text in FILTERS:
            for when, tries in (("cold", 1), ("cached", 3)):
                took = []
                for _ in range(tries):
                    began = time.perf_counter()
                    run_picker.picker(runs, set(), text)
                    took.append(time.perf_counter() - began)
                out[f"{name}_{when}"] = round(min(took) * 1000, 1)
    return out


def page_figures(base: str, experiment: str, count: int) -> dict:
    """The first tree, each filter's round trip (typed, counted, cleared) and the tree callback's server time, in Chromium."""
    served: list[float] = []
    with chromium() as browser, new_page(browser) as page:

        def finished(request) -> None:
            if "_dash-update-component" in request.url and "run-tree.children" in (request.post_data or ""):
                served.append(round(request.timing["responseEnd"] - request.timing["requestStart"], 1))

        page.on("requestfinished", finished)
        began = time.perf_counter()
        page.goto(base + "?" + urllib.parse.urlencode({"exp": experiment}))
        page.locator("#run-filter-count").filter(has_text=f"{count} runs").wait_for()
        first_tree_s = time.perf_counter() - began
        nodes = page.evaluate("() => document.querySelectorAll('#run-tree *').length")
        page.wait_for_load_state("networkidle")
        round_trips = {}
        for name, text in FILTERS:
            began = time.perf_counter()
            page.locator("#run-filter").fill(text)
            page.locator("#run-filter").press("Enter")
            page.locator("#run-filter-count").filter(has_text=f"of {count} runs match").wait_for()
            round_trips[name] = round(time.perf_counter() - began, 3)
            page.locator("#run-filter").fill("")
            page.locator("#run-filter").press("Enter")
            page.wait_for_function("() => document.querySelector('#run-filter-count').textContent === '" + f"{count} runs" + "'")
            page.wait_for_load_state("networkidle")
    return {"first_tree_s": round(first_tree_s, 3), f"tree_nodes_{count}": nodes, "filter_round_trip_s": round_trips, "tree_callback_served_ms": served}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="an empty store to fill (default: a fresh SQLite file)")
    parser.add_argument("--out", type=Path, help="also write the figures here")
    parser.add_argument("--runs", type=int, default=500, help="runs in the experiment, in workloads of 10 (default 500)")
    parser.add_argument("--cache", default="simple", help="the picker's cache: simple (default) or a redis:// URL")
    parser.add_argument("--no-browser", action="store_true", help="only the picker's own work, no dashboard and Chromium")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        home = Path(folder)
        os.environ["RADT_HOME"] = str(home)
        uri = args.store or f"sqlite:///{home / 'store.db'}"
        began = time.perf_counter()
        experiment = fill_runs(uri, args.runs // PER_WORKLOAD)  # a SQLite file or database without MLflow's tables gets them from MLflow's client first
        figures = {"store": uri.split(":", 1)[0], "runs": args.runs, "cache": args.cache.split(":", 1)[0], "fill_s": round(time.perf_counter() - began, 2)}
        figures["picker_ms"] = picker_ms(uri, experiment, args.cache)
        if not args.no_browser:
            with dashboard(uri, radt_env(home)) as base:
                figures |= page_figures(base, experiment, args.runs)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
