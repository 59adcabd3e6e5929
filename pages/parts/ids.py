"""Every component id of the pages, named once: layouts and callbacks use these, so a renamed id cannot leave a callback behind.

The values are what the browser sees (and what the browser tests select); pattern-matching ids are
a type constant and the key that tells the components of that type apart (``workload_runs(ALL)``).
"""

from __future__ import annotations

# --- shared ---------------------------------------------------------------------------------------

STORE_ERROR_REASON = "store-error-reason"  # why the store cannot be read, on either page

# --- explore: the run picker ----------------------------------------------------------------------

EXPERIMENTS = "experiments"
RUN_FILTER = "run-filter"
RUN_TREE = "run-tree"
WORKLOAD_ALL = "wl-all"  # pattern type: a workload's select-all box
WORKLOAD_RUNS = "wl-runs"  # pattern type: a workload's run boxes
WORKLOAD_KEY = "wl"  # the workload id in those patterns

# --- explore: the run filter (FILTER, issue #14: pages/parts/run_picker.py, app/view/filters.py) ----------------

RUN_FILTER_ERROR = "run-filter-error"  # the one line saying why the filter cannot be read
RUN_FILTER_COUNT = "run-filter-count"  # "12 of 500 runs match"
RUN_TICK_MATCHING = "run-tick-matching"  # ticks every run the filter leaves

# --- explore: the controls and the charts ---------------------------------------------------------

METRICS = "metrics"
X_MODE = "x-mode"
GROUP_MODE = "group-mode"
SMOOTHING = "smoothing"
LOG_Y = "log-y"
GPU_MODE = "gpu-mode"
GPU_FILTER = "gpu-filter"
VIEW_NOTE = "view-note"
CHARTS = "charts"
SUMMARY = "summary"
VIEW = "view"  # the view as the URL holds it
ZOOM = "zoom"
URL_SINK = "url-sink"

# --- explore: the page shell (PAGE, issue #14: columns, sticky legend, running runs) ---------------

COLUMNS = "chart-columns"  # 1, 2 or 3 charts side by side (URL key cols)
LEGEND = "chart-legend"  # the sticky HTML legend above the charts
EXPLORE_TICK = "explore-tick"  # redraws while a drawn run is RUNNING
LIVE_BADGE = "live-badge"  # "● live" and the running runs' names

# --- explore: the export panel --------------------------------------------------------------------

EXPORT_SIZE = "export-size"
EXPORT_FONT = "export-font"
EXPORT_DPI = "export-dpi"
EXPORT_LEGEND = "export-legend"
EXPORT_COLOUR = "export-colour"
EXPORT_CHARTS = "export-charts"
EXPORT_BUTTON = "export"  # pattern type: one download button per format
FORMAT_KEY = "fmt"  # the format in that pattern
SAVE_VIEW = "save-view"
OPEN_VIEW = "open-view"
EXPORT_STATUS = "export-status"
EXPORT_DOWNLOAD = "export-download"
OPEN_VIEW_QUERY = "open-view-query"
OPEN_VIEW_SINK = "open-view-sink"

# --- explore: the summary table and the comparison figures (TABLE, issue #14: pages/parts/summary_table.py, pages/parts/comparison.py) ---

SUMMARY_SINK = "summary-sink"  # the run a table row click highlighted ('' for none)
COMPARE_KIND = "compare-kind"  # bar, box, cdf, collocation, activity
SUMMARY_COLUMNS = "summary-columns"  # the table's "columns" control: which of its columns it shows
COMPARE_BY = "compare-by"  # workload, collocation, partition or user (aggregates.BY)
COMPARE_STAT = "compare-stat"  # the per-run aggregate drawn
COMPARE_RUN = "compare-run"  # the run of the activity figure
COMPARE_FIGURE = "compare-figure"
EXPORT_HEIGHT = "export-height"  # the export panel's figure height in inches (empty: fit 9 in)

# --- explore: the runs' diagnosis (issue #54: pages/parts/findings.py) -----------------------------------------------

FINDINGS = "run-findings"  # each drawn run's findings, what it lacked, its footprint
FINDING_ZOOM = "finding-zoom"  # pattern type: a finding's button that zooms the charts to the span it covers
CODE_KEY = "code"  # the finding's code in that pattern (with RUN_KEY, the run's id)

# --- live -----------------------------------------------------------------------------------------

LIVE_WINDOW = "live-window"
LIVE_PAUSE = "live-pause"
LIVE_CLOCK = "live-clock"
LIVE_TICK = "live-tick"
LIVE_GO = "live-go"  # a poll the server answers: the tick, held back while the last poll's answers are out
LIVE_DONE = "live-done"  # the cards' render answered a poll: the tick's points follow it
LIVE_TICKED = "live-ticked"  # the tick answered: the poll is done and the gate opens
LIVE_SIGNATURE = "live-signature"
LIVE_RUNS = "live-runs"
LIVE_VALUES = "live-values"  # pattern type: a run card's current values
LIVE_FLAGS = "live-flags"  # pattern type: a run card's stale and idle flags
LIVE_CHART = "live-chart"  # pattern type: a run card's chart
LIVE_CURSOR = "live-cursor"  # pattern type: a run card's newest timestamp, keys, status
LIVE_FINDINGS = "live-findings"  # pattern type: a run card's findings over its last minutes (radt/diagnosis.py)
RUN_KEY = "run"  # the run id in the live patterns


def workload_all(workload: object) -> dict:
    """A workload's select-all box (``workload`` is its id, or a wildcard such as ALL or MATCH)."""
    return {"type": WORKLOAD_ALL, WORKLOAD_KEY: workload}


def is_workload_all(component_id: object) -> bool:
    """Whether a callback's trigger (``ctx.triggered_id``) is a workload's select-all box."""
    return isinstance(component_id, dict) and component_id.get("type") == WORKLOAD_ALL


def workload_runs(workload: object) -> dict:
    """A workload's run boxes (``workload`` is its id, or a wildcard)."""
    return {"type": WORKLOAD_RUNS, WORKLOAD_KEY: workload}


def export_button(fmt: object) -> dict:
    """The export button of a format (png, svg, pdf, csv, table), or a wildcard."""
    return {"type": EXPORT_BUTTON, FORMAT_KEY: fmt}


def card(kind: str, run: object) -> dict:
    """A run card's part (LIVE_VALUES, LIVE_FLAGS, LIVE_FINDINGS, LIVE_CHART, LIVE_CURSOR) for a run id, or a wildcard."""
    return {"type": kind, RUN_KEY: run}


def finding_zoom(run: object, code: object) -> dict:
    """A finding's zoom button: its run's id and its code, or wildcards."""
    return {"type": FINDING_ZOOM, RUN_KEY: run, CODE_KEY: code}
