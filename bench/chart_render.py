"""What a browser spends before and while it paints radt's overlay figure: plotly.js's evaluation (Dash's full bundle
against assets/plotly-radt.min.js) and the figure's first paint as SVG lines against WebGL, side by side in one
headless Chromium (/usr/bin/chromium, --disable-gpu: software GL, as in a VM's or a remote desktop's browser).

The figure is app/figures/figures.overlay_figure of 10 runs x 4 charts, each series an envelope (a mean line in its min-max
band, 3 points a bucket) of `--points` buckets, then the same figure's traces repeated x2, x4, x8. figures.SVG_POINTS
(the switch from SVG to WebGL) comes from these figures.

    .venv/bin/python bench/chart_render.py
"""

from __future__ import annotations

import argparse
import base64
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import plotly

from radt.app.db.downsample import envelope
from radt.app.figures.figures import ChartChoices, Panel, overlay_figure
from radt.catalogue import METRICS, Device

REPO = Path(__file__).resolve().parent.parent
FULL = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
RADT = REPO / "assets" / "plotly-radt.min.js"
EVAL = "(src) => { const t0 = performance.now(); const s = document.createElement('script'); s.textContent = src; document.head.appendChild(s); return performance.now() - t0; }"
PAINT = """async (f) => { const d = document.createElement('div'); d.style.width = '1100px'; document.body.appendChild(d);
  const t0 = performance.now(); await Plotly.newPlot(d, f.data, f.layout);
  await new Promise(r => requestAnimationFrame(() => setTimeout(r, 0))); const ms = performance.now() - t0; Plotly.purge(d); d.remove(); return ms; }"""


def figure(runs: int, points: int) -> dict:
    """The overlay figure of `runs` runs x 4 charts, each series an envelope of `points` // 3 buckets."""
    start = 1_700_000_000_000
    x = start + np.arange(points * 4, dtype=np.int64) * 1000
    rng = np.random.default_rng(3)
    panels = []
    for name in ("sm_active", "sm_occupancy", "gr_engine_active", "cpu_utilization_percentage"):
        series = {f"run{i}": {Device(gpu=0) if "cpu" not in name else Device(): envelope(x, rng.random(len(x)), budget=points)} for i in range(runs)}
        panels.append(Panel(METRICS[name], series))
    table = pd.DataFrame({"run_id": [f"run{i}" for i in range(runs)], "run_name": [f"run {i}" for i in range(runs)], "start_time": start, "duration_s": len(x)})
    table["workload_id"], table["workload_label"], table["status"], table["tags"], table["params"] = "w", "w", "FINISHED", [{}] * runs, [{}] * runs
    return json.loads(overlay_figure(panels, table, ChartChoices(columns=2)).to_json())


def _length(values) -> int:
    """Points in a trace's array as the figure's JSON holds it: a list, or Plotly's typed array ({"dtype", "bdata"})."""
    if isinstance(values, dict) and "bdata" in values:
        return len(base64.b64decode(values["bdata"])) // np.dtype(values["dtype"]).itemsize
    return len(values or [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1500, help="points per series (an envelope: 3 a bucket; default 1500)")
    parser.add_argument("--tries", type=int, default=3)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    base = figure(10, args.points)
    print(f"load average {os.getloadavg()[0]:.1f}; figure: {len(base['data'])} traces, 10 runs x 4 charts, {args.points} points a series")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox", "--disable-gpu"])
        evals = {}
        for name, path in (("Dash's full plotly.js", FULL), ("radt's plotly-radt.min.js", RADT)):
            src = path.read_text()
            times = []
            for _ in range(args.tries):
                page = browser.new_page()
                page.set_content("<html><body></body></html>")
                times.append(page.evaluate(EVAL, src))
                page.close()
            evals[name] = sorted(times)[len(times) // 2]
            print(f"evaluate {name:<28} {path.stat().st_size / 1e6:5.2f} MB  median {evals[name]:6.0f} ms  ({', '.join(f'{t:.0f}' for t in times)})")
        full, radt = evals.values()
        print(f"RATIO evaluation radt / full = {radt / full:.2f}")
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.set_content("<html><body></body></html>")
        page.add_script_tag(path=str(RADT))
        print(f"\n{'points':>9} {'traces':>7} {'SVG ms':>8} {'WebGL ms':>9} {'WebGL / SVG':>12}")
        for copies in (1, 2, 4, 8):
            shown = dict(base, data=base["data"] * copies)
            points = sum(_length(t["y"]) for t in base["data"]) * copies
            paint = {}
            for kind in ("scatter", "scattergl"):
                for trace in shown["data"]:
                    trace["type"] = kind
                paint[kind] = sorted(page.evaluate(PAINT, shown) for _ in range(args.tries))[args.tries // 2]
            print(f"{points:>9,} {len(shown['data']):>7} {paint['scatter']:>8.0f} {paint['scattergl']:>9.0f} {paint['scattergl'] / paint['scatter']:>11.1f}x")
        browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
