"""Many users on one dashboard (#14 point 10): `gunicorn -w 4` with a Redis cache, 50 users asking for the same
cached 4-run × 8-chart view at once; baseline (no kept response, no compression) and radt side by side.

    .venv/bin/python bench/dashboard_load.py [--store URI] [--users 50] [--requests 10]
    .venv/bin/python bench/dashboard_load.py --many-runs 500 [--store URI]    # the 500-run experiment (radt_bench_many)

The store (default: a PostgreSQL database radt_bench_load on 127.0.0.1, filled once by `radt demo`) is reused.
The draw callback's request is captured from headless Chromium opening the view's link, so it is exactly
what a browser sends; each simulated user then posts it again and again (closed loop, gzip accepted as a
browser does). Redis db 3 at 127.0.0.1:6379 is the benchmark's own (emptied at the start).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.drawrequest import DRAW_OUTPUT, draw_request  # noqa: E402  (the draw request the tests post too)

PG = "postgresql://postgres@127.0.0.1:5432/"
REDIS = "redis://127.0.0.1:6379/3"
RESNET = "demo: resnet50 collocation"


def ensure_database(uri: str) -> None:
    """An empty PostgreSQL database at `uri` (created when absent)."""
    if not uri.startswith("postgresql://"):
        return
    base, name = uri.rsplit("/", 1)
    admin = sa.create_engine(base + "/postgres", isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        if conn.execute(sa.text("select 1 from pg_database where datname = :n"), {"n": name}).first() is None:
            conn.execute(sa.text(f'create database "{name}"'))
    admin.dispose()


def demo_view(uri: str) -> str:
    """The link of a 4-run × 8-chart view of `radt demo` (written into the store first when missing)."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(RESNET)
    if experiment is None:
        subprocess.run([sys.executable, "-m", "radt.cli", "demo", "--store", uri], check=True, cwd=REPO)
        experiment = client.get_experiment_by_name(RESNET)
    runs = client.search_runs([experiment.experiment_id], "tags.`radt.role` != 'workload'", max_results=100)
    picked = sorted((r for r in runs if r.data.tags.get("radt.collocation") in ("-", "mps")), key=lambda r: r.info.run_name)[:4]
    if len(picked) < 4:
        picked = sorted(runs, key=lambda r: r.info.run_name)[:4]
    return f"?exp={experiment.experiment_id}&runs={','.join(r.info.run_id for r in picked)}"


def start_gunicorn(uri: str, port: int, workers: int, extra: dict[str, str], log) -> subprocess.Popen:
    """`gunicorn -w N 'radt.app:server'` as PERFORMANCE.md documents it, with the Redis cache."""
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, RADT_CACHE=REDIS, PYTHONPATH=str(REPO), **extra)  # this tree's radt (a copy of the checkout too)
    command = [sys.executable, "-m", "gunicorn", "-w", str(workers), "-b", f"127.0.0.1:{port}", "--timeout", "120", "radt.app:server"]
    return subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def wait_up(base: str, process: subprocess.Popen, seconds: float = 120) -> None:
    import requests

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"gunicorn exited with {process.returncode}")
        try:
            if requests.get(base, timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise SystemExit(f"no dashboard at {base} after {seconds:.0f} s")


def capture_draw(base: str, link: str) -> bytes:
    """The body Chromium posts for the draw callback when it opens the view's link."""
    from playwright.sync_api import sync_playwright

    from tests.support.browser import CHROMIUM_ARGS, chromium_path

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            with page.expect_request(lambda r: "_dash-update-component" in r.url and DRAW_OUTPUT in (r.post_data or ""), timeout=120_000) as request:
                page.goto(base + link)
            body = request.value.post_data_buffer
            answer = request.value.response()
            if answer is None or answer.status != 200:
                raise SystemExit(f"the draw callback answered {answer.status if answer else 'nothing'}: {(answer.text() if answer else '')[:300]}")
        finally:
            browser.close()
    return body


async def _user(session, url: str, body: bytes, count: int, out: list[float], sizes: list[int], hits: list[str]) -> None:
    for _ in range(count):
        began = time.perf_counter()
        async with session.post(url, data=body, headers={"Content-Type": "application/json", "Accept-Encoding": "gzip, deflate"}) as response:
            payload = await response.read()  # decompressed by aiohttp, as a browser would
            if response.status != 200:
                raise SystemExit(f"draw answered {response.status}: {payload[:200]!r}")
            sizes.append(int(response.headers.get("Content-Length") or len(payload)))
            hits.append(response.headers.get("X-Radt-Cache", "-"))
        out.append(time.perf_counter() - began)


async def _load(url: str, body: bytes, users: int, count: int) -> tuple[list[float], list[int], list[str], float]:
    import aiohttp

    latencies: list[float] = []
    sizes: list[int] = []
    hits: list[str] = []
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=users), timeout=timeout) as session:
        began = time.perf_counter()
        await asyncio.gather(*(_user(session, url, body, count, latencies, sizes, hits) for _ in range(users)))
        wall = time.perf_counter() - began
    return latencies, sizes, hits, wall


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def contender(name: str, uri: str, link: str, extra: dict[str, str], args, body: bytes | None) -> tuple[dict, bytes]:
    """One server set-up under the load: its latencies (after one warm-up request that fills the caches)."""
    import aiohttp  # noqa: F401  (fail before starting servers when missing)
    import redis
    import requests

    from tests.support.ports import free_port

    redis.Redis.from_url(REDIS).flushdb()
    port = free_port()
    base = f"http://127.0.0.1:{port}/"
    with tempfile.TemporaryFile("w+") as log:
        process = start_gunicorn(uri, port, args.workers, extra, log)
        try:
            wait_up(base, process)
            body = body or capture_draw(base, link)
            url = base + "_dash-update-component"
            for _ in range(args.workers):  # every worker has loaded its pages; the series (and the response) are in Redis
                requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=300).raise_for_status()
            latencies, sizes, hits, wall = asyncio.run(_load(url, body, args.users, args.requests))
        finally:
            process.terminate()
            process.wait(timeout=30)
    result = {
        "name": name,
        "n": len(latencies),
        "p50": percentile(latencies, 0.5),
        "p95": percentile(latencies, 0.95),
        "max": max(latencies),
        "mean": statistics.fmean(latencies),
        "rps": len(latencies) / wall,
        "bytes": statistics.median(sizes),
        "hits": sum(h == "hit" for h in hits),
    }
    return result, body


def load_benchmark(args) -> None:
    uri = args.store or PG + "radt_bench_load"
    ensure_database(uri)
    link = demo_view(uri)
    print(
        f"store {uri}; view {link} (default 8 metrics); {args.users} users x {args.requests} requests; gunicorn -w {args.workers}; load {os.getloadavg()[0]:.1f}"
    )
    baseline, body = contender("baseline (no kept response, no gzip)", uri, link, {"RADT_RESPONSE_CACHE": "0", "RADT_COMPRESS": "0"}, args, None)
    radt, _ = contender("radt (kept response, gzip)", uri, link, {}, args, body)
    print(f"draw request body: {len(body)} bytes")
    print(f"{'contender':40} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'req/s':>7} {'bytes':>9} {'hits':>5}")
    for r in (baseline, radt):
        print(f"{r['name']:40} {r['p50'] * 1000:8.0f} {r['p95'] * 1000:8.0f} {r['max'] * 1000:8.0f} {r['rps']:7.1f} {r['bytes']:9.0f} {r['hits']:5d}")
    print(
        f"ratio baseline / radt: p50 {baseline['p50'] / radt['p50']:.1f}x, p95 {baseline['p95'] / radt['p95']:.1f}x; target p95 < 1000 ms: {'met' if radt['p95'] < 1 else 'NOT met'}"
    )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


# --- an experiment of many runs ------------------------------------------------------------------


def many_runs_store(uri: str, count: int, minutes: int) -> tuple[str, list[str]]:
    """An experiment of `count` ended runs, each `minutes` of the 8 default metrics at 1 Hz (written once, then reused)."""
    from mlflow import MlflowClient

    from radt.app.view.data import DEFAULT_METRICS
    from radt.catalogue import METRICS, key
    from radt.collectors.store import tracking
    from radt.collectors.store.stores import SqlMetricStore
    from radt.points import Point
    from tests.support.runs import radt_run

    client = MlflowClient(uri)
    name = f"bench: {count} runs"
    found = client.get_experiment_by_name(name)
    if found is not None:
        runs = client.search_runs([found.experiment_id], max_results=count + 10, order_by=["attributes.start_time ASC"])
        if len(runs) >= count:
            return found.experiment_id, [r.info.run_id for r in runs[:count]]
    experiment = tracking.resolve_experiment(client, uri, name)
    keys = [key(spec[4:], 0) if METRICS[spec[4:]].per_gpu else key(spec[4:]) for spec in DEFAULT_METRICS]
    writer = SqlMetricStore(uri)
    rng = np.random.default_rng(0)
    began = time.monotonic()
    run_ids = []
    n = minutes * 60
    for i in range(count):
        start = 1_760_000_000_000 + i * n * 1000
        run_id = radt_run(client, experiment, f"run {i:03d}", start_time=start, letter="AB"[i % 2], script_args=["--batch-size", str(2 ** (5 + i % 4))])
        points = []
        for k, metric_key in enumerate(keys):
            values = np.clip(0.5 + 0.3 * np.sin(np.arange(n) / (20 + k)) + rng.normal(0, 0.05, n), 0, 1) * (100 if k >= 4 else 1)
            points += [Point(metric_key, float(v), start + j * 1000, j) for j, v in enumerate(values)]
        writer.write(run_id, points)
        client.set_terminated(run_id, "FINISHED", end_time=start + n * 1000)
        run_ids.append(run_id)
        if i % 50 == 49:
            print(f"  {i + 1} runs written ({time.monotonic() - began:.0f} s)", flush=True)
    writer.close()
    return experiment, run_ids


def many_runs_benchmark(args) -> None:
    """The run listing of an experiment of N runs, and the server time of the first chart of 20 ticked runs (cold cache)."""
    from radt.app.db.runs import list_runs
    from radt.app.db.state import STATE
    from radt.app.view.cache import CACHE
    from radt.app.view.data import DEFAULT_METRICS
    from radt.app.web.dashboard import create_app

    uri = args.store or PG + "radt_bench_many"
    ensure_database(uri)
    experiment, run_ids = many_runs_store(uri, args.many_runs, args.minutes)
    os.environ["RADT_RESPONSE_CACHE"] = "0"  # every round draws
    app = create_app(uri, "simple")
    listing = []
    for _ in range(5):
        began = time.perf_counter()
        frame = list_runs(STATE.engine, [str(experiment)])
        listing.append(time.perf_counter() - began)
    client = app.server.test_client()
    client.get("/")  # the page's first load (Dash's own set-up), not part of a draw
    picked = run_ids[:: max(1, len(run_ids) // 20)][:20]
    body = draw_request(app, experiment, picked, DEFAULT_METRICS)
    draws, sizes = [], []
    for _ in range(args.rounds):
        CACHE.clear()  # cold: no listing, series or summary cached
        began = time.perf_counter()
        response = client.post("/_dash-update-component", data=body, headers={"Content-Type": "application/json", "Accept-Encoding": "gzip"})
        draws.append(time.perf_counter() - began)
        assert response.status_code == 200, response.data[:300]
        sizes.append(len(response.data))
    from radt.app.view.views import View, render

    charts = []
    for _ in range(args.rounds):  # the chart alone (the callback's figure; its summary table is the rest)
        CACHE.clear()
        with app.server.test_request_context():
            began = time.perf_counter()
            render(View.from_dict({"exp": str(experiment), "runs": ",".join(picked)}))
            charts.append(time.perf_counter() - began)
    print(f"store {uri}; experiment {experiment}: {len(frame)} runs x {args.minutes} min x 8 metrics at 1 Hz; load {os.getloadavg()[0]:.1f}")
    print(f"run listing (list_runs, uncached): median {statistics.median(listing) * 1000:.0f} ms, max {max(listing) * 1000:.0f} ms")
    print(f"first chart of 20 ticked runs x 8 metrics (draw callback, cold cache, server time): median {statistics.median(draws) * 1000:.0f} ms, "
          f"max {max(draws) * 1000:.0f} ms, {statistics.median(sizes) / 1e3:.0f} kB gzip; target < 2000 ms: {'met' if statistics.median(draws) < 2 else 'NOT met'}")  # fmt: skip
    print(f"  of which the chart alone (views.render: listing, series, figure; cold): median {statistics.median(charts) * 1000:.0f} ms")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="tracking URI (default: postgresql://postgres@127.0.0.1:5432/radt_bench_load, filled by radt demo once)")
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--requests", type=int, default=10, help="requests per user")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--many-runs", type=int, default=0, help="instead: an experiment of this many runs; time the run listing and the first chart of 20")
    parser.add_argument("--minutes", type=int, default=10, help="--many-runs: length of each run at 1 Hz (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="--many-runs: cold draws timed (default 3)")
    args = parser.parse_args(argv)
    if args.many_runs:
        many_runs_benchmark(args)
    else:
        load_benchmark(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
