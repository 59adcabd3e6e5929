"""Downsampling keeps what a reader sees (minima, maxima, spikes, gaps), never exceeds the budget,
and leaves a series under budget untouched."""

from __future__ import annotations

import numpy as np
import pytest

from radt.app.db.downsample import METHODS, downsample, downsample_indices, envelope

BASE = 1_700_000_000_000


def _series(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = BASE + np.cumsum(rng.integers(900, 1100, n)).astype(np.int64)  # ~1 Hz with jitter
    y = np.sin(np.arange(n) / 300.0) + rng.normal(0, 0.05, n)
    return x, y


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n,budget", [(10_800, 2000), (10_800, 999), (5_001, 5_000), (100_000, 500), (2_001, 4)])
def test_never_more_than_the_budget_and_only_real_points(method, n, budget):
    x, y = _series(n)
    idx = downsample_indices(x, y, budget, method)
    assert 0 < len(idx) <= budget
    assert np.all(np.diff(idx) > 0), "sorted, no duplicates"
    xs, ys = downsample(x, y, budget, method)
    assert np.array_equal(xs, x[idx]) and np.array_equal(ys, y[idx]), "points are taken, never invented"


@pytest.mark.parametrize("method", METHODS)
def test_under_budget_is_returned_untouched(method):
    x, y = _series(1500)
    xs, ys = downsample(x, y, 2000, method)
    assert xs is x and ys is y
    assert np.array_equal(downsample_indices(x, y, 1500, method), np.arange(1500))


@pytest.mark.parametrize("method", METHODS)
def test_global_extremes_and_isolated_spikes_survive(method):
    x, y = _series(10_800, seed=3)
    spikes = [500, 2_400, 4_000, 7_777, 10_000]
    dips = [1_200, 5_555, 9_100]
    for i, at in enumerate(spikes):
        y[at] = 5.0 + i  # one sample up: a reader sees a spike
    for i, at in enumerate(dips):
        y[at] = -5.0 - i
    idx = set(downsample_indices(x, y, 2000, method).tolist())
    assert int(np.argmax(y)) in idx and int(np.argmin(y)) in idx
    if method != "minmaxlttb":  # MinMax and M4 keep every bucket's extremes
        assert set(spikes) <= idx and set(dips) <= idx


@pytest.mark.parametrize("method", ["minmax", "m4"])
@pytest.mark.parametrize("seed", range(5))
def test_every_visible_peak_and_dip_is_drawn(method, seed):
    """Drawn at the chart's resolution (one pixel column per few buckets), the downsampled series
    reaches the same top and bottom in every column as the raw one, to within one bucket's width."""
    x, y = _series(20_000, seed)
    rng = np.random.default_rng(seed)
    y[rng.choice(len(y), 40, replace=False)] += rng.normal(0, 3, 40)  # bursts and drops anywhere
    budget = 2000
    idx = downsample_indices(x, y, budget, method)
    xs, ys = x[idx], y[idx]
    buckets = budget // (2 if method == "minmax" else 4)
    width = (x[-1] - x[0]) / buckets
    columns = buckets // 4
    edges = np.linspace(x[0], x[-1], columns + 1)
    for lo, hi in zip(edges[:-1], edges[1:]):
        raw = y[(x >= lo) & (x <= hi)]
        near = ys[(xs >= lo - width) & (xs <= hi + width)]
        assert near.max() >= raw.max() and near.min() <= raw.min()


def test_nan_gaps_are_kept_as_breaks_within_budget():
    x, y = _series(10_000)
    y[3000:3100] = np.nan  # a gap of 100 samples
    y[7000] = np.nan  # a single missing sample
    idx = downsample_indices(x, y, 1000)
    assert len(idx) <= 1000
    kept = y[idx]
    assert np.isnan(kept).sum() == 2, "one marker per run of NaN"
    assert 3000 in idx and 7000 in idx
    assert np.nanmax(kept) == np.nanmax(y) and np.nanmin(kept) == np.nanmin(y)


def test_many_gaps_do_not_break_the_budget():
    x, y = _series(10_000)
    y[::7] = np.nan  # 1,429 separate gaps
    idx = downsample_indices(x, y, 1000)
    assert len(idx) <= 1000
    assert 0 < np.isnan(y[idx]).sum() <= 250
    assert np.nanmax(y[idx]) == np.nanmax(y)


def test_all_nan_series():
    x = np.arange(5000, dtype=np.int64)
    y = np.full(5000, np.nan)
    idx = downsample_indices(x, y, 100)
    assert len(idx) == 1 and np.isnan(y[idx]).all()


def test_datetime_x_and_bad_arguments():
    x, y = _series(5000)
    idx = downsample_indices(x.astype("datetime64[ms]"), y, 1000)
    assert np.array_equal(idx, downsample_indices(x, y, 1000))
    with pytest.raises(ValueError, match="method"):
        downsample_indices(x, y, 1000, "lttb-ish")
    with pytest.raises(ValueError, match="budget"):
        downsample_indices(x, y, 3)


def test_an_envelope_is_each_buckets_mean_minimum_and_maximum_within_the_budget():
    x, y = _series(10_800, seed=4)
    y[6000] = 9.0  # one second of peak: in the band, not in the mean
    y[100:140] = np.nan  # a gap inside one bucket or two
    env = envelope(x, y, 2000)
    assert len(env.x) <= 2000 // 3 and 3 * len(env.x) <= 2000, "mean + two band edges within the point budget"
    assert np.all(np.diff(env.x) > 0)
    edges = np.linspace(x[0], x[-1], 2000 // 3 + 1)
    for i in (0, 1, 250, 665):  # brute force on a few buckets (the last one closed on the right)
        inside = (x >= edges[i]) & ((x < edges[i + 1]) if i < 665 else (x <= edges[i + 1]))
        j = int(np.argmin(np.abs(env.x - x[inside].mean())))
        assert env.mean[j] == pytest.approx(np.nanmean(y[inside])) and env.low[j] == np.nanmin(y[inside]) and env.high[j] == np.nanmax(y[inside])
    assert np.nanmax(env.high) == 9.0 and np.nanmax(env.mean) < 2.0, "the spike widens the band, it does not jump the line"
    assert np.nanmin(env.low) == np.nanmin(y)


def test_an_envelope_breaks_where_a_whole_bucket_is_missing():
    x = np.arange(9000, dtype=np.int64) * 1000
    y = np.ones(9000)
    y[3000:3600] = np.nan  # 600 samples: whole buckets of 27
    env = envelope(x, y, 1000)
    assert np.isnan(env.mean).any() and np.isnan(env.low).any() and np.isnan(env.high).any()
    assert np.nanmin(env.mean) == np.nanmax(env.mean) == 1.0
    with pytest.raises(ValueError, match="budget"):
        envelope(x, y, 5)
