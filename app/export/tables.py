"""The data behind a figure as CSV: every stored point of a view's runs and metrics, the comparison table, their text
cells spreadsheet-safe."""

from __future__ import annotations

import csv
import io

import pandas as pd

from radt.app.export.paper import chosen_runs
from radt.app.view import data
from radt.app.view.data import spec_metric
from radt.app.view.views import View, x_range

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # a spreadsheet runs a cell that begins so as a formula (OWASP's CSV injection)


def cell_text(value):
    """A text cell as a spreadsheet will show it, not run it: a leading ' before a formula's first character (a run named
    =HYPERLINK("http://…?"&A1) in a shared store, opened by a colleague's Excel). Numbers, and text that reads as one
    ("-0.5"), are left as they are."""
    if not isinstance(value, str) or not value.startswith(FORMULA_STARTS):
        return value
    try:
        float(value)
        return value
    except ValueError:
        return "'" + value


def table_csv(table: pd.DataFrame, path=None) -> str | None:
    """The comparison table as CSV (to `path`, else returned), its text cells spreadsheet-safe (cell_text)."""
    return table.map(cell_text).to_csv(path, index=False, float_format="%.6g")


def data_csv(view: View, charts: list[str] | None = None) -> tuple[str, dict[str, list[str]]]:
    """Every stored point of the view's runs and metrics (within its zoom), long format; and the runs lacking a metric."""
    runs = chosen_runs(view)
    limits = x_range(view)
    windows = data.zoom_windows(limits, view.axis, runs) if limits else {}
    buffer = io.StringIO()
    out = csv.writer(buffer, lineterminator="\n")
    out.writerow(
        [
            "run_id",
            "run_name",
            "experiment_id",
            "workload",
            "letter",
            "node",
            "gpu",
            "mig_instance",
            "metric",
            "timestamp_ms",
            "seconds_since_start",
            "value",
            "label",
        ]
    )  # label: the catalogue's name, which says what a figure is ("Run power (estimate)")
    missing: dict[str, list[str]] = {}
    meta = runs.set_index("run_id", drop=False)
    for spec in charts or view.metrics:
        found = data.series(spec, runs, windows, budget=10**9, x="relative", gpus=view.gpus)
        lacking = [meta.loc[r, "run_name"] for r in runs["run_id"] if r not in found]
        if lacking:
            missing[spec] = lacking
        name, label = spec.partition(":")[2], cell_text(spec_metric(spec).label)
        for run_id, devices in found.items():
            row = meta.loc[run_id]
            for device, (ts, ys) in devices.items():
                start = row["start_time"] if pd.notna(row["start_time"]) else (ts[0] if len(ts) else 0)
                where = ["" if v is None else v for v in (device.node, device.gpu, device.mig)]
                texts = [cell_text(row["run_name"]), row["experiment_id"], cell_text(row["workload_label"]), cell_text(row["letter"])]
                head = [run_id, *texts, *map(cell_text, where), cell_text(name)]  # the same for each point of this series
                for t, y in zip(ts.tolist(), ys.tolist(), strict=False):
                    out.writerow([*head, int(t), f"{(t - start) / 1000:.3f}", repr(float(y)), label])
    return buffer.getvalue(), missing
