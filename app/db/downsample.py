"""Downsampling of one time series to a point budget, keeping what a reader sees: minima and maxima.

The work is done by tsdownsample (Rust, SIMD): MinMax by default, which splits the x range into
``budget / 2`` equally wide buckets and keeps the minimum and the maximum of each, so every peak
and dip that is visible at the chart's resolution survives (the global minimum and maximum
always do). M4 (first, last, min, max per bucket) and MinMaxLTTB (the smoother-looking variant,
with the global extremes added back) are there for callers that prefer them.

A series at or under its budget is returned as it is. NaN values (MLflow's ``is_nan`` points:
a sample that had no value) are not downsampled; the first NaN of every run of NaNs is kept as a
gap marker, so a plotted line breaks where the data has holes.

``envelope`` is the other shape a long series can take: per equal-width bucket its mean, minimum and
maximum, drawn as a mean line in a light min-max band, so many long runs overlaid stay apart
(MinMax's points, joined by a line, zig-zag into a solid block of colour).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from tsdownsample import M4Downsampler, MinMaxDownsampler, MinMaxLTTBDownsampler

METHODS = ("minmax", "m4", "minmaxlttb")
ENVELOPE = "envelope"  # not a choice of points: series.load_series returns an Envelope instead
DEFAULT_BUDGET = 2000
_NAN_SHARE = 4  # at most budget // 4 gap markers


def downsample_indices(x: np.ndarray, y: np.ndarray, budget: int = DEFAULT_BUDGET, method: str = "minmax") -> np.ndarray:
    """Sorted indices of the points to keep, at most ``budget``; ``x`` must be sorted ascending.

    Every index when the series has ``budget`` points or fewer.
    """
    if method not in METHODS:
        raise ValueError(f"unknown downsampling method {method!r}; one of {', '.join(METHODS)}")
    if budget < 4:
        raise ValueError("budget must be at least 4 points")
    x = np.asarray(x)
    y = np.asarray(y, dtype=np.float64)
    n = len(y)
    if n <= budget:
        return np.arange(n, dtype=np.int64)
    nan = np.isnan(y)
    if not nan.any():
        return _numeric(x, y, budget, method)
    markers = np.flatnonzero(nan & ~np.concatenate(([False], nan[:-1])))  # first NaN of each run of NaNs
    limit = budget // _NAN_SHARE
    if len(markers) > limit:
        markers = markers[np.linspace(0, len(markers) - 1, limit).round().astype(np.int64)]
    values = np.flatnonzero(~nan)
    room = budget - len(markers)
    if len(values) > room:
        values = values[_numeric(x[values], y[values], room, method)]
    return np.union1d(values, markers).astype(np.int64)


def _numeric(x: np.ndarray, y: np.ndarray, budget: int, method: str) -> np.ndarray:
    """Indices for a series without NaN, longer than the budget."""
    if len(y) <= budget:
        return np.arange(len(y), dtype=np.int64)
    x = _plain(x)
    if method == "m4" and budget >= 8:  # tsdownsample needs two buckets or more
        idx = M4Downsampler().downsample(x, y, n_out=budget - budget % 4)
    elif method == "minmaxlttb" and budget >= 5:  # one point per bucket; the global extremes added back
        idx = MinMaxLTTBDownsampler().downsample(x, y, n_out=budget - 2)
        idx = np.union1d(idx, [int(np.argmin(y)), int(np.argmax(y))])
    elif budget >= 4:
        idx = MinMaxDownsampler().downsample(x, y, n_out=budget - budget % 2)
    else:  # room for two or three points only (a budget mostly taken by gap markers)
        idx = np.array([int(np.argmin(y)), int(np.argmax(y))])
    return np.unique(idx.astype(np.int64))


def _plain(x: np.ndarray) -> np.ndarray:
    """A contiguous numeric array tsdownsample accepts (it takes no datetime64 or object arrays)."""
    if x.dtype.kind == "M":
        x = x.view(np.int64)
    if x.dtype.kind not in "iuf":
        x = x.astype(np.float64)
    return np.ascontiguousarray(x)


def downsample(x: np.ndarray, y: np.ndarray, budget: int = DEFAULT_BUDGET, method: str = "minmax") -> tuple[np.ndarray, np.ndarray]:
    """(x, y) with at most ``budget`` points, minima and maxima kept; the arrays themselves when under budget."""
    if len(y) <= budget:
        return x, y
    idx = downsample_indices(x, y, budget, method)
    return x[idx], y[idx]


class Envelope(NamedTuple):
    """A series too long for its budget, as equal-width x buckets: each bucket's mean x, mean, minimum and maximum.

    Drawn as a mean line inside a light min-max band: many long runs stay apart instead of MinMax's zig-zag blocks."""

    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray


ENVELOPE_POINTS = 3  # points drawn per bucket: the mean, and the band's upper and lower edge


def envelope(x: np.ndarray, y: np.ndarray, budget: int = DEFAULT_BUDGET) -> Envelope:
    """``budget // 3`` equal-width buckets over sorted ``x`` (empty ones left out): at most ``budget`` points drawn.

    NaN values are skipped; a bucket holding only NaN is NaN throughout, so the line breaks there."""
    if budget < 2 * ENVELOPE_POINTS:
        raise ValueError(f"budget must be at least {2 * ENVELOPE_POINTS} points")
    xf = _plain(np.asarray(x)).astype(np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(y) == 0:
        empty = np.array([], dtype=np.float64)
        return Envelope(empty, empty, empty, empty)
    buckets = budget // ENVELOPE_POINTS
    origin = xf[0]
    starts = _bucket_starts(xf, buckets)
    nan = np.isnan(y)
    count = np.add.reduceat((~nan).astype(np.float64), starts)
    total = np.add.reduceat(np.where(nan, 0.0, y), starts)
    low = np.minimum.reduceat(np.where(nan, np.inf, y), starts)
    high = np.maximum.reduceat(np.where(nan, -np.inf, y), starts)
    size = np.diff(np.append(starts, len(y))).astype(np.float64)
    centre = origin + np.add.reduceat(xf - origin, starts) / size
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    low = np.where(count > 0, low, np.nan)
    high = np.where(count > 0, high, np.nan)
    return Envelope(centre, mean, low, high)


def _bucket_starts(xf: np.ndarray, buckets: int) -> np.ndarray:
    """The first index of each of ``buckets`` equal-width x buckets over sorted ``xf`` that holds a point."""
    origin, span = xf[0], xf[-1] - xf[0]
    edges = origin + span * np.arange(1, buckets) / buckets
    starts = np.unique(np.concatenate(([0], np.searchsorted(xf, edges, side="left"))))
    return starts[starts < len(xf)]


def coarser(values: tuple[np.ndarray, np.ndarray] | Envelope, buckets: int) -> Envelope:
    """A series (points or an Envelope) as an Envelope of at most ``buckets`` equal-width buckets: every minimum and maximum
    kept, each mean the mean of the finer buckets' (equal widths: a time-weighted mean). An Envelope no finer is returned as is."""
    if not isinstance(values, Envelope):
        return envelope(values[0], values[1], max(buckets, 2) * ENVELOPE_POINTS)
    if len(values.x) <= buckets:
        return values
    xf = np.asarray(values.x, dtype=np.float64)
    starts = _bucket_starts(xf, buckets)
    size = np.diff(np.append(starts, len(xf))).astype(np.float64)
    known = np.isfinite(values.mean)
    count = np.add.reduceat(known.astype(np.float64), starts)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, np.add.reduceat(np.where(known, values.mean, 0.0), starts) / np.maximum(count, 1), np.nan)
    low = np.minimum.reduceat(np.where(np.isfinite(values.low), values.low, np.inf), starts)
    high = np.maximum.reduceat(np.where(np.isfinite(values.high), values.high, -np.inf), starts)
    centre = np.add.reduceat(xf, starts) / size
    return Envelope(centre, mean, np.where(count > 0, low, np.nan), np.where(count > 0, high, np.nan))


def swings(y: np.ndarray, step: float) -> int:
    """How many times a line goes up or down by more than ``step`` from one sample to the next (a climb over several is one
    swing; smaller moves, a series' noise, and a move across a gap are none): what, when there are more than its chart has
    room for, fills the chart with one run's colour."""
    moves = np.diff(np.asarray(y, dtype=np.float64))
    signs = np.sign(moves[np.abs(moves) > step])  # NaN compares False: no move across a gap
    return int(len(signs) and 1 + np.count_nonzero(signs[1:] != signs[:-1]))
