"""A series whose line swings up and down more often than its chart can show (the demo's bert-base 1A: SMACT 0 <-> 0.7
every few seconds for 30 minutes) is drawn as its mean over a light min-max envelope, as a long run is, so the runs under
it stay visible; a calm series of as many points stays its raw line, and the legend's numbers are the same either way
(issue #52, item 3)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from radt.app.db.downsample import Envelope, coarser, envelope, swings
from radt.app.figures.figures import Panel, legend_entries, overlay_figure
from radt.catalogue import METRICS, Device

START = 1_700_000_000_000
POINTS = 1800  # 30 minutes at 1 Hz: under the 2,000-point budget, so it reaches the figure raw


def _runs(*names: str) -> pd.DataFrame:
    rows = [{"run_id": f"r{i}", "run_name": name, "start_time": START, "workload_id": "w", "workload_label": "workload 1", "letter": "", "params": {},
             "tags": {}} for i, name in enumerate(names)]  # fmt: skip
    return pd.DataFrame(rows)


def _starved(n: int = POINTS) -> tuple[np.ndarray, np.ndarray]:
    """A data-loader-bound run: 4 s at 0.7, 4 s at 0.02, over and over."""
    return START + np.arange(n) * 1000.0, np.where((np.arange(n) // 4) % 2 == 0, 0.7, 0.02)


def _calm(n: int = POINTS) -> tuple[np.ndarray, np.ndarray]:
    """A steady run with its sampling noise and a slow drift: a line a chart draws as it is."""
    rng = np.random.default_rng(0)
    return START + np.arange(n) * 1000.0, 0.6 + 0.1 * np.sin(np.arange(n) / 200.0) + rng.normal(0, 0.01, n)


def _traces(figure, run_id: str) -> tuple[list, list]:
    mine = [t for t in figure.data if (t.meta or {}).get("run_id") == run_id]
    return [t for t in mine if t.meta.get("band")], [t for t in mine if not t.meta.get("band")]


def test_a_series_that_swings_faster_than_its_chart_shows_is_its_mean_in_an_envelope():
    panel = Panel(METRICS["sm_active"], {"r0": {Device(None, 0): _starved()}, "r1": {Device(None, 0): _calm()}})
    figure = overlay_figure([panel], _runs("bert-base 1A", "resnet50 1A"))
    bands, lines = _traces(figure, "r0")
    assert len(bands) == 1 and len(lines) == 1, "the starved run: a light envelope and its mean line"
    assert bands[0].fill == "toself" and "0.18" in bands[0].fillcolor
    mean = np.asarray(lines[0].y, dtype=float)
    assert len(mean) <= 200, "a bucket holds several swings"
    assert mean.min() > 0.25 and mean.max() < 0.5, "the mean line stays near the run's mean (0.36): no zig-zag from 0 to 0.7"
    assert max(bands[0].y) == pytest.approx(0.7) and min(bands[0].y) == pytest.approx(0.02), "every swing's top and bottom is in the envelope"
    calm_bands, calm_lines = _traces(figure, "r1")
    assert calm_bands == [] and len(calm_lines[0].x) == POINTS, "the calm run keeps every raw point"


def test_the_legend_reads_the_same_numbers_whichever_way_a_series_is_drawn():
    xs, ys = _starved()
    panel = Panel(METRICS["sm_active"], {"r0": {Device(None, 0): (xs, ys)}})

    class Drawn:  # what views.render returns, as legend_entries reads it
        figure = overlay_figure([panel], _runs("bert-base 1A"))
        panels = [panel]
        runs = _runs("bert-base 1A")

    stats = legend_entries(Drawn)[0]["stats"][0]
    assert (stats["mean"], stats["max"], stats["last"]) == pytest.approx((ys.mean(), 0.7, ys[-1]))


def test_swings_count_the_moves_a_reader_sees_not_the_noise():
    _xs, starved = _starved(80)
    assert swings(starved, 0.1) == 19, "ten periods of 8 s: up and down, every move from one level to the other"
    _xs, calm = _calm()
    assert swings(calm, 0.1) == 0
    assert swings(np.array([0.0, np.nan, 0.7, 0.0]), 0.1) == 1, "a gap is no move"


def test_coarser_buckets_keep_every_extreme_and_the_time_weighted_mean():
    xs, ys = _starved()
    fine = envelope(xs, ys, 1500)
    coarse = coarser(fine, 50)
    assert isinstance(coarse, Envelope) and len(coarse.x) <= 50
    assert np.nanmax(coarse.high) == pytest.approx(0.7) and np.nanmin(coarse.low) == pytest.approx(0.02)
    assert float(np.nanmean(coarse.mean)) == pytest.approx(ys.mean(), rel=0.02)
    assert coarser(fine, 5000) is fine, "an envelope already that coarse is left as it is"
    raw = coarser((xs, ys), 50)
    assert len(raw.x) <= 50 and np.nanmax(raw.high) == pytest.approx(0.7)
