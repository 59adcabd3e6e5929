"""Live tab: sample-to-pixel latency at 1 Hz, and the database cost of one poll against the runs' age.

    .venv/bin/python bench/live_latency.py [--seconds 40] [--runs 20] [--pg postgresql://postgres@127.0.0.1:5432/postgres]

1. Latency: a real `radt` run (a CPU loop, --interval 1) writes into a fresh PostgreSQL database;
   `python app.py` serves it; headless Chromium keeps the Live tab open and, every 20 ms, reads
   the newest x of the run's chart: each time it changes, Date.now() minus that sample's own
   timestamp is one latency (sampler → writer → PostgreSQL → poll → extendData → pixel).
   The baseline, MLflow's UI, shows new points only on a manual refresh.
2. Poll cost: 20 RUNNING runs with 2 keys at 1 Hz and 1 h of history, then the same with 8 h;
   one poll is what the tab's two callbacks ask the store (live runs, latest values, new points
   after a cursor 1 s back, the idle check), uncached, median of 20. It must not grow with age.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mlflow import MlflowClient  # noqa: E402
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # noqa: E402

from radt.app.db import live  # noqa: E402
from radt.app.db.store import make_read_engine  # noqa: E402
from radt.collectors.store import tracking  # noqa: E402
from radt.collectors.store.stores import SqlMetricStore  # noqa: E402
from radt.points import Point  # noqa: E402
from tests.support.browser import chromium, dashboard  # noqa: E402
from tests.support.runs import radt_run  # noqa: E402

TRAIN = textwrap.dedent(
    """
    import sys, time
    end = time.time() + float(sys.argv[1])
    while time.time() < end:
        busy = time.time() + 0.2
        while time.time() < busy:
            pass
        time.sleep(0.2)
    """
)
WATCH_JS = """() => {
  window.radtLatencies = [];
  let last = null;
  setInterval(() => {
    const g = document.querySelector('.live-chart .js-plotly-plot');
    if (!g || !g._fullData || !g._fullData.length) { return; }
    const xs = g._fullData[0].x;
    if (!xs || !xs.length) { return; }
    const x = xs[xs.length - 1];
    const text = typeof x === 'string' ? x : new Date(x).toISOString();
    if (text !== last) {
      if (last !== null) { window.radtLatencies.push(Date.now() - Date.parse(text.replace(' ', 'T').slice(0, 23) + 'Z')); }
      last = text;
    }
  }, 20);
}"""


class Database:
    def __init__(self, admin: str, name: str) -> None:
        self.admin = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
        self.name = name
        self.uri = admin.rsplit("/", 1)[0] + "/" + name

    def __enter__(self) -> str:
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{self.name}"'))
        with tempfile.TemporaryDirectory() as tmp:
            SqlAlchemyStore(self.uri, Path(tmp).as_uri()).engine.dispose()
        return self.uri

    def __exit__(self, *exc) -> None:
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self.admin.dispose()


def latency(pg: str, seconds: float) -> list[float]:
    with Database(pg, f"radt_bench_live_{int(time.time())}") as uri, tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        script = home / "train.py"
        script.write_text(TRAIN)
        env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("MLFLOW_", "RADT_"))}
        env.update({"RADT_HOME": str(home), "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT)})
        with dashboard(uri, env) as base, chromium() as browser:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            page.goto(base + "live")
            page.wait_for_selector("text=No run is training now", timeout=60_000)
            run = subprocess.Popen(
                [sys.executable, "-m", "radt", "-e", "latency", "-n", "latency", "--interval", "1", str(script), str(seconds)],
                env=env,
                cwd=home,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            page.wait_for_function(
                "() => { const g = document.querySelector('.live-chart .js-plotly-plot'); return g && g._fullData && g._fullData.length > 0; }", timeout=60_000
            )
            page.evaluate(WATCH_JS)
            run.wait(timeout=seconds + 120)
            return list(page.evaluate("() => window.radtLatencies"))


def poll_cost(pg: str, runs: int, hours: float, rounds: int = 20) -> tuple[float, int]:
    with Database(pg, f"radt_bench_poll_{int(time.time())}") as uri:
        client = MlflowClient(uri)
        experiment = tracking.resolve_experiment(client, uri, "poll")
        writer = SqlMetricStore(uri)
        now = int(time.time() * 1000)
        points = int(hours * 3600)
        run_ids = []
        for i in range(runs):
            start = now - points * 1000
            run_id = radt_run(client, experiment, f"run {i}", start_time=start, workload=f"w{i // 2}", letter="AB"[i % 2])
            for key, value in (("system/gpu_0_sm_active", 0.4), ("system/cpu_utilization_percentage", 40.0)):
                batch = [Point(key, value, start + s * 1000, s) for s in range(points)]
                for part in range(0, len(batch), 50_000):
                    writer.write(run_id, batch[part : part + 50_000])
            run_ids.append(run_id)
        with sa.create_engine(uri).connect() as conn:
            conn.execute(sa.text("ANALYZE"))
            conn.commit()
        engine = make_read_engine(uri)
        keys = {r: ["system/gpu_0_sm_active", "system/cpu_utilization_percentage"] for r in run_ids}

        def one_poll():
            t = int(time.time() * 1000)
            frame = live.live_runs(engine, t)
            latest = live.latest_values(engine, list(frame["run_id"]))
            newest = {r: max(ts for _v, ts in latest[r].values()) - 1000 for r in run_ids}
            live.new_points(engine, newest, keys)
            live.idle_gpus(engine, keys, dict(zip(frame["run_id"], frame["start_time"], strict=False)), t)
            return len(frame)

        one_poll()
        samples = []
        for _ in range(rounds):
            began = time.perf_counter()
            count = one_poll()
            samples.append(time.perf_counter() - began)
        engine.dispose()
        return statistics.median(samples), count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()
    if not args.skip_latency:
        found = latency(args.pg, args.seconds)
        found.sort()
        print(
            f"sample-to-pixel at 1 Hz over {len(found)} samples: median {statistics.median(found):.0f} ms, p95 {found[int(0.95 * (len(found) - 1))]:.0f} ms, max {found[-1]:.0f} ms (target < 2000 ms)"
        )
    for hours in (1, 8):
        cost, count = poll_cost(args.pg, args.runs, hours)
        print(f"one live poll, {count} running runs with {hours} h of history each: {cost * 1000:.1f} ms (database, uncached)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
