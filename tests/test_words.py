"""Counts as the pages write them (issue 52: the sidebar said "1 runs", a comparison bar's tooltip "min–max of 1 runs")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from radt.app.export.aggregates import bar_figure
from radt.app.figures.words import counted
from radt.catalogue import METRICS, Device


def test_a_count_is_written_in_the_number_of_its_noun():
    assert [counted(n, "run") for n in (0, 1, 2, 500)] == ["0 runs", "1 run", "2 runs", "500 runs"]
    assert counted(1, "series", "series") == "1 series" and counted(2, "series", "series") == "2 series"


def test_the_sidebar_counts_one_run_as_one_run():
    from radt.pages.parts.run_picker import count_line

    assert count_line(1, 1, filtered=False) == "1 run"
    assert count_line(10, 10, filtered=False) == "10 runs"
    assert count_line(1, 1, filtered=True) == "1 of 1 run matches"
    assert count_line(1, 5, filtered=True) == "1 of 5 runs match"  # what the filter tests read (tests/test_filter_bounds.py)


def test_a_bar_of_one_run_says_one_run_in_its_tooltip():
    table = pd.DataFrame(
        [
            {"kind": "run", "experiment_id": "1", "workload": "workload 1 alone", "run": "a", "run_id": "ra", "command": "train.py", "smact_mean": 0.5},
            {"kind": "run", "experiment_id": "1", "workload": "workload 2 pair", "run": "b", "run_id": "rb", "command": "train.py", "smact_mean": 0.6},
            {"kind": "run", "experiment_id": "1", "workload": "workload 2 pair", "run": "c", "run_id": "rc", "command": "train.py", "smact_mean": 0.7},
        ]
    )
    (bars,) = bar_figure(table, "smact_mean", "workload").data
    templates = dict(zip(bars.x, [bars.hovertemplate] * len(bars.x) if isinstance(bars.hovertemplate, str) else bars.hovertemplate, strict=True))
    assert "min–max of 1 run)" in templates["workload 1 alone"] and "1 runs" not in templates["workload 1 alone"], templates
    assert "min–max of 2 runs)" in templates["workload 2 pair"], templates
    assert list(bars.customdata) == [1, 2], "the runs a bar holds, as a number"


def test_a_runs_gpu_mean_says_what_it_is_over_in_words():
    """'mean of 2 GPUs' was the count of series: two MIG slices of one GPU, or a GPU and a slice of it, were "2 GPUs"."""
    from radt.app.figures.figures import ChartChoices, Panel, overlay_figure

    start = 1_760_000_000_000
    runs = pd.DataFrame(
        [
            {"run_id": r, "run_name": r, "start_time": start, "workload_id": "w", "workload_label": "workload 1", "letter": "A", "params": {}, "tags": {}}
            for r in ("slices", "whole", "pair")
        ]
    )
    series = (start + np.arange(30) * 1000, np.full(30, 0.5))
    devices = {
        "slices": {Device(None, 0, 1): series, Device(None, 0, 2): series},
        "whole": {Device(None, 0): series, Device(None, 0, 3): series},
        "pair": {Device(None, 0): series, Device(None, 1): series},
    }
    figure = overlay_figure([Panel(METRICS["sm_active"], devices)], runs, ChartChoices(gpu_mode="mean"))
    said = {t.meta["run_id"]: t.meta["device"] for t in figure.data if isinstance(t.meta, dict) and not t.meta.get("band")}
    assert said == {"slices": "mean of 2 MIG slices", "whole": "mean of 1 GPU", "pair": "mean of 2 GPUs"}, said
