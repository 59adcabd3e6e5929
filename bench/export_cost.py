"""What a paper figure costs: radt export against Plotly's own write_image of the same raw data.

Side by side in one script, on one store: N runs × H hours at 1 Hz of SMACT. The baseline reads
every point with plain SQL and hands Plotly one Scatter per run (`fig.write_image`, the same
kaleido and Chromium); radt goes through its view → render (20,000-point budget) → restyle →
kaleido path, and the CSV through data.series with no budget.

    python bench/export_cost.py [--runs 8] [--hours 1] [--store URI]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import sqlalchemy as sa
from mlflow import MlflowClient

from radt.collectors.store import tracking
from radt.collectors.store.stores import SqlMetricStore
from radt.points import Point
from tests.support.runs import radt_run

START = 1_760_000_000_000


def fill(uri: str, runs: int, hours: float) -> tuple[str, list[str]]:
    client = MlflowClient(uri)
    experiment = tracking.resolve_experiment(client, uri, "export bench")
    n = int(hours * 3600)
    writer = SqlMetricStore(uri)
    ids = []
    rng = np.random.default_rng(0)
    for i in range(runs):
        run_id = radt_run(client, experiment, f"run {i}", start_time=START)
        values = np.clip(0.5 + 0.2 * np.sin(np.arange(n) / 60 + i) + 0.05 * rng.standard_normal(n), 0, 1)
        writer.write(run_id, [Point("system/gpu_0_sm_active", float(v), START + k * 1000, k) for k, v in enumerate(values)])
        client.set_terminated(run_id, "FINISHED", end_time=START + n * 1000)
        ids.append(run_id)
    writer.close()
    return experiment, ids


def timed(label: str, action) -> float:
    began = time.perf_counter()
    action()
    took = time.perf_counter() - began
    print(f"  {label:<52} {took:7.2f} s")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--store", help="an empty store to fill (default: a fresh SQLite file)")
    opts = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="radt-bench-export-"))
    os.environ.setdefault("RADT_HOME", str(folder / "home"))
    uri = opts.store or f"sqlite:///{folder / 'store.db'}"
    experiment, run_ids = fill(uri, opts.runs, opts.hours)
    print(f"{opts.runs} runs × {opts.hours:g} h at 1 Hz ({opts.runs * int(opts.hours * 3600):,} points), {uri.split(':')[0]}")

    from radt.app.export.exportoptions import ExportStyle
    from radt.app.export.image import image_bytes
    from radt.app.export.paper import figure_for
    from radt.app.export.tables import data_csv
    from radt.app.exportcli import _open_store
    from radt.app.view.views import View

    _open_store(uri)
    view = View([experiment], run_ids, ["cat:sm_active"])
    style = ExportStyle(size="double-column")
    image_bytes(figure_for(view, style)[0], "png", 96)  # warm: kaleido starts its browser once per process

    def baseline(fmt: str) -> None:
        engine = sa.create_engine(uri)
        fig = go.Figure()
        with engine.connect() as conn:
            for run_id in run_ids:
                rows = conn.execute(
                    sa.text("select timestamp, value from metrics where run_uuid = :r and key = 'system/gpu_0_sm_active' order by timestamp"), {"r": run_id}
                ).all()
                fig.add_trace(go.Scatter(x=[(t - START) / 60000 for t, _ in rows], y=[v for _, v in rows], mode="lines", name=run_id[:8]))
        engine.dispose()
        fig.update_layout(width=672, height=270)
        (folder / f"baseline.{fmt}").write_bytes(fig.to_image(format=fmt, scale=300 / 96 if fmt == "png" else 1))

    def radt(fmt: str) -> None:
        (folder / f"radt.{fmt}").write_bytes(image_bytes(figure_for(view, style)[0], fmt, 300))

    results = {}
    for fmt in ("pdf", "png"):
        print(f"{fmt.upper()} (double column, 300 dpi for PNG):")
        base = timed("baseline: SQL + go.Scatter per run + write_image", lambda fmt=fmt: baseline(fmt))
        mine = timed("radt export (view → render → restyle → kaleido)", lambda fmt=fmt: radt(fmt))
        results[fmt] = (base, mine)
        print(
            f"  ratio radt/baseline {mine / base:.2f}; files {os.path.getsize(folder / f'radt.{fmt}') / 1e3:.0f} kB vs {os.path.getsize(folder / f'baseline.{fmt}') / 1e3:.0f} kB"
        )
    print("CSV (every point):")
    timed("radt export --format csv", lambda: (folder / "data.csv").write_text(data_csv(view)[0]))
    print(f"  {os.path.getsize(folder / 'data.csv') / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
