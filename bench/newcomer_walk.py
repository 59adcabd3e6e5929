"""The newcomer's walk, measured: what a researcher sees of 10+ runs and a 5-GPU run, and how long the first chart takes.

One store (SQLite in a temporary folder): `radt demo` (10 runs), the real microbench logs (4 runs of 5 GPUs, one busy GPU
each) and ten long runs (2-4 h at 1 Hz, SMACT/SMOCC/GRACT/CPU). For each contender (this checkout; with --before, another
checkout's `python app.py`, e.g. a `git worktree` of the last commit with its own venv) the dashboard is started and
headless Chromium opens, at 1440x900 and 1920x1080:

- the demo's 10 runs (8 default charts): legend entries and runs named in them, the hover box's count and screen share;
- the 5-GPU run: legend entries;
- the 10 long runs: time from the link to the first chart, cold (a fresh dashboard and a fresh browser per try,
  --tries of them, the median reported).

Then `radt export --size single-column` of the microbench experiment's SMACT (PNG), with the image's size in inches.

    .venv/bin/python bench/newcomer_walk.py
    .venv/bin/python bench/newcomer_walk.py --before /tmp/before/.venv/bin/python /tmp/before/app.py
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "real-tool-logs"
LONG_RUNS = 10
LONG_KEYS = ("system/gpu_0_sm_active", "system/gpu_0_sm_occupancy", "system/gpu_0_gr_engine_active", "system/cpu_utilization_percentage")
HOVER_JS = """() => {
  const els = [...document.querySelectorAll('#charts .hoverlayer .hovertext, .radt-tip')].filter(e => getComputedStyle(e).display !== 'none');
  let area = 0;
  for (const e of els) { const r = e.getBoundingClientRect(); area += Math.max(0, Math.min(r.right, innerWidth) - Math.max(r.left, 0)) * Math.max(0, Math.min(r.bottom, innerHeight) - Math.max(r.top, 0)); }
  return {boxes: els.length, share: area / (innerWidth * innerHeight)};
}"""
LEGEND_JS = """() => { const rows = [...document.querySelectorAll('.chart-legend [data-id]')].filter(e => !e.dataset.device);
  return {entries: rows.length, runs: new Set(rows.map(e => e.dataset.id)).size}; }"""


def build_store(uri: str) -> None:
    """The demo, the microbench imports and ten long runs, written through radt's own paths."""
    from mlflow import MlflowClient

    from radt.collectors import demo
    from radt.collectors.imports import importer
    from radt.collectors.store import tracking
    from radt.collectors.store.stores import SqlMetricStore
    from radt.points import Point

    demo.write_demo(uri, minutes=6, report=lambda _line: None)
    for name in ("1.1", "128.32", "1024.1024", "131072.1024"):
        files = [str(FIXTURES / f"microbench_{name}_dcgmi_dmon.txt"), str(FIXTURES / f"microbench_{name}_nvidia_smi.csv")]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert importer.main([*files, "-e", "microbench", "-n", f"microbench {name}", "--store", uri, "--start", "2023-02-20T10:00:00"]) == 0
    client = MlflowClient(uri)
    experiment = tracking.resolve_experiment(client, uri, "long runs")
    writer = SqlMetricStore(uri)
    rng = np.random.default_rng(7)
    start = int(time.time() * 1000) - 5 * 3600 * 1000
    for i in range(LONG_RUNS):
        seconds = int(7200 + 7200 * i / (LONG_RUNS - 1))
        run_id = client.create_run(experiment, run_name=f"long {i}", start_time=start).info.run_id
        t = start + np.arange(seconds) * 1000
        for key in LONG_KEYS:
            scale = 100.0 if "cpu" in key else 1.0
            values = np.clip(0.5 + 0.3 * np.sin(np.arange(seconds) / (60 + 7 * i)) + rng.normal(0, 0.05, seconds), 0, 1) * scale
            writer.write(run_id, [Point(key, float(v), int(ts), s) for s, (ts, v) in enumerate(zip(t, values, strict=True))])
        client.set_terminated(run_id, "FINISHED", end_time=int(t[-1]))


def ids(db: Path) -> dict:
    """Experiment ids by name and each experiment's runs (workload parents left out)."""
    conn = sqlite3.connect(db)
    experiments = dict(conn.execute("select name, experiment_id from experiments where lifecycle_stage = 'active'").fetchall())
    runs = {}
    for name, eid in experiments.items():
        runs[name] = conn.execute(
            "select run_uuid, name from runs r where experiment_id = ? and lifecycle_stage = 'active' and not exists "
            "(select 1 from tags t where t.run_uuid = r.run_uuid and t.key = 'radt.role' and t.value = 'workload') order by start_time",
            (eid,),
        ).fetchall()
    conn.close()
    return {"experiments": experiments, "runs": runs}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def dashboard(python: str, app: str, uri: str, home: Path):
    port = free_port()
    log = open(home / f"dashboard-{port}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([python, app, "--store", uri, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, cwd=str(Path(app).parent),
                            env=dict(os.environ, RADT_HOME=str(home)))  # fmt: skip
    base = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(base, timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def link(found: dict, experiments: list[str], runs: list[str], metrics: str | None = None) -> str:
    query = f"?exp={','.join(str(found['experiments'][e]) for e in experiments)}&runs={','.join(runs)}"
    return query + (f"&metrics={metrics}" if metrics else "")


DRAWN = "() => { const g = document.querySelector('#charts .js-plotly-plot'); return g && g._fullData && g._fullData.length > 2; }"


def first_chart(python: str, app: str, uri: str, found: dict, home: Path) -> tuple[float, float]:
    """Seconds from the link to the first chart of the 10 long runs, cold: a fresh dashboard (no cached series or
    response) and a fresh browser (no cached script); and the slowest Dash callback before it (ms)."""
    from playwright.sync_api import sync_playwright

    long = [r for r, _n in found["runs"]["long runs"]]
    with dashboard(python, app, uri, home) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        calls: list[float] = []  # each Dash callback request: its time from request to response end (ms)
        page.on("requestfinished", lambda r: calls.append(r.timing["responseEnd"]) if "_dash-update-component" in r.url else None)
        began = time.perf_counter()
        page.goto(base + link(found, ["long runs"], long, "cat:sm_active,cat:sm_occupancy,cat:gr_engine_active,cat:cpu_utilization_percentage"))
        page.wait_for_function(DRAWN, timeout=120_000)
        seconds = time.perf_counter() - began
        browser.close()
    return seconds, max(calls, default=0.0)


def walk(name: str, python: str, app: str, uri: str, found: dict, home: Path, firsts: list[tuple[float, float]]) -> dict:
    from playwright.sync_api import sync_playwright

    demo = ("demo: resnet50 collocation", "demo: bert fine-tuning")
    ten = [r for e in demo for r, _n in found["runs"][e]]
    five = [r for r, n in found["runs"]["microbench"] if n.endswith("131072.1024")]
    out = {"first_chart_10_long_runs_s": [round(s, 2) for s, _ms in firsts], "slowest_callback_before_first_chart_ms": [round(ms) for _s, ms in firsts]}
    out["first_chart_median_s"] = round(sorted(s for s, _ms in firsts)[len(firsts) // 2], 2)
    with dashboard(python, app, uri, home) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        for width, height in ((1440, 900), (1920, 1080)):
            page.set_viewport_size({"width": width, "height": height})
            page.goto(base + link(found, list(demo), ten))
            page.wait_for_function(DRAWN, timeout=120_000)
            page.wait_for_timeout(1000)
            legend = page.evaluate(LEGEND_JS)
            box = page.locator("#charts .nsewdrag").first.bounding_box()
            page.mouse.move(box["x"] + box["width"] * 0.1, box["y"] + box["height"] * 0.5)
            page.wait_for_timeout(800)
            hover = page.evaluate(HOVER_JS)
            page.goto(base + link(found, ["microbench"], five))
            page.wait_for_function(DRAWN, timeout=120_000)
            page.wait_for_timeout(1000)
            out[f"{width}"] = {"ten_runs_legend": legend, "ten_runs_hover": {"boxes": hover["boxes"], "share": round(hover["share"], 3)},
                               "five_gpu_legend": page.evaluate(LEGEND_JS)}  # fmt: skip
        browser.close()
    png = home / f"{name}-single-column.png"
    radt = str(Path(python).with_name("radt"))
    done = subprocess.run([radt, "export", "--store", uri, "--experiment", "microbench", "--metric", "smact", "--size", "single-column", "-o", str(png)],
                          capture_output=True, text=True, env=dict(os.environ, RADT_HOME=str(home)))  # fmt: skip
    if done.returncode == 0:
        width_px, height_px = struct.unpack(">II", png.read_bytes()[16:24])
        out["export_single_column_in"] = [round(width_px / 300, 2), round(height_px / 300, 2)]
    else:
        out["export_single_column_in"] = done.stderr.strip()[-200:]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=3, help="cold first charts per contender, each on a fresh dashboard and browser (default 3)")
    parser.add_argument("--before", nargs=2, metavar=("PYTHON", "APP"), help="another checkout's interpreter and app.py, measured the same way")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="radt-walk-") as tmp:
        home = Path(tmp)
        db = home / "store.db"
        uri = f"sqlite:///{db}"
        began = time.perf_counter()
        build_store(uri)
        print(f"store built in {time.perf_counter() - began:.0f} s", flush=True)
        found = ids(db)
        contenders = [("before", *args.before)] if args.before else []
        contenders.append(("radt", sys.executable, str(REPO / "app.py")))
        firsts: dict[str, list] = {name: [] for name, _python, _app in contenders}
        for _ in range(args.tries):  # the contenders' tries interleaved: load drift on a shared machine falls on both
            for name, python, app in contenders:
                firsts[name].append(first_chart(python, app, uri, found, home))
        results = {name: walk(name, python, app, uri, found, home, firsts[name]) for name, python, app in contenders}
    print(json.dumps(results, indent=1))
    if args.before:
        ratio = results["radt"]["first_chart_median_s"] / results["before"]["first_chart_median_s"]
        print(f"RATIO first chart of the 10 long runs, median of {args.tries} cold tries: radt / before = {ratio:.2f}")
    print(f"first chart of the 10 long runs (target < 2 s cold): median {results['radt']['first_chart_median_s']} s")
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
