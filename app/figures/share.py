"""The "GPU share" chart (issue #55): the runs that shared one GPU, each run's own SM share stacked over time with the
GPU's idle remainder, so a collocation's who-used-what is one picture."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from radt.app.db.downsample import Envelope
from radt.catalogue import METRICS, Device, MetricName
from radt.runmodel import HOST_TAG

SHARE_METRIC = METRICS[MetricName.RUN_SM_UTILIZATION_PERCENTAGE]
IDLE_NAME = "idle"
IDLE_COLOR = "#d9d9d9"  # the GPU's unused time: grey under the runs' colours


@dataclass
class SharedGpu:
    """One GPU of one host that two or more drawn runs used at overlapping times: each run's share, and the device's
    utilization (None where no run stored it: the idle remainder is then 100 minus the shares' sum)."""

    host: str
    gpu: int
    shares: dict[str, tuple[np.ndarray, np.ndarray]]
    device: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def title(self) -> str:
        return f"GPU share · {self.host} · GPU {self.gpu}"


def _line(values) -> tuple[np.ndarray, np.ndarray]:
    """A series' points, or an Envelope's bucket means, as float arrays."""
    xs, ys = (values.x, values.mean) if isinstance(values, Envelope) else (values[0], values[1])
    return np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)


def _host(runs: pd.DataFrame, run_id: str) -> str | None:
    tags = runs.loc[run_id, "tags"] if run_id in runs.index and "tags" in runs else None
    return str(tags[HOST_TAG]) if isinstance(tags, dict) and tags.get(HOST_TAG) else None


def _overlap(spans: list[tuple[float, float]]) -> bool:
    """Whether at least two of the (start, end) spans overlap in time."""
    ordered = sorted(spans)
    return any(later[0] < earlier[1] for earlier, later in zip(ordered, ordered[1:], strict=False))


def shared_gpus(runs: pd.DataFrame, shares: dict[str, dict[Device, object]], device: dict[str, dict[Device, object]]) -> list[SharedGpu]:
    """The GPUs that runs of `runs` shared: same radt.host tag and GPU index, their share series overlapping in time."""
    runs = runs.set_index("run_id", drop=False) if "run_id" in runs else runs
    groups: dict[tuple[str, int], dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for run_id, devices in shares.items():
        host = _host(runs, run_id)
        for dev, values in devices.items():
            xs, ys = _line(values)
            if host is None or dev.gpu is None or dev.mig is not None or not len(xs):
                continue
            groups.setdefault((host, dev.gpu), {})[run_id] = (xs, ys)
    found = []
    for (host, gpu), members in groups.items():
        if len(members) < 2 or not _overlap([(float(np.nanmin(x)), float(np.nanmax(x))) for x, _ in members.values()]):
            continue
        utilization = next((_line(v) for r in members for d, v in (device.get(r) or {}).items() if d.gpu == gpu and d.mig is None), None)
        found.append(SharedGpu(host, gpu, members, utilization))
    return sorted(found, key=lambda s: (s.host, s.gpu))


def stacked(shared: SharedGpu) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """Every run's share on one time grid (0 where a run has no sample: it was not running) and the idle remainder:
    100 minus the device's utilization, or minus the shares' sum where the device series is absent; never below 0."""
    grid = np.unique(np.concatenate([x for x, _ in shared.shares.values()]))
    on_grid = {}
    for run_id, (xs, ys) in shared.shares.items():
        order = np.argsort(xs)
        values = np.interp(grid, xs[order], np.nan_to_num(ys[order]), left=0.0, right=0.0)
        on_grid[run_id] = np.clip(values, 0.0, 100.0)
    total = np.sum(list(on_grid.values()), axis=0)
    busy = total
    if shared.device is not None and len(shared.device[0]):
        xs, ys = shared.device
        order = np.argsort(xs)
        device = np.interp(grid, xs[order], np.nan_to_num(ys[order]), left=np.nan, right=np.nan)
        busy = np.where(np.isfinite(device), np.maximum(device, total), total)  # the shares never sum past the device's busy time
    return grid, on_grid, np.clip(100.0 - busy, 0.0, 100.0)


def share_metric(shared: SharedGpu):
    """The chart's metric: the run SM share, titled with the host and GPU it is of."""
    return dataclasses.replace(SHARE_METRIC, label=shared.title)


def draw_share(fig: go.Figure, shared: SharedGpu, chart: dict, look: dict) -> None:
    """One GPU share chart into `fig` at `chart["cell"]`: each run's share stacked, in its colour, then the idle remainder.

    `chart`: cell, x (grid ms -> chart x), colour (run id -> colour), name (run id -> legend name, Plotly text), label
    (run id -> its name as typed, for the tooltip), stack (its stack id)."""
    grid, shares, idle = stacked(shared)
    xs = chart["x"](grid)
    for run_id, values in shares.items():
        colour = chart["colour"].get(run_id, "#444")
        meta = {"run_id": run_id, "name": chart["label"].get(run_id, run_id), "device": f"GPU {shared.gpu}", "share": True} | look
        fig.add_trace(
            go.Scatter(
                x=xs, y=values, mode="lines", stackgroup=chart["stack"], line={"width": 0.5, "color": colour}, fillcolor=colour,
                name=chart["name"].get(run_id, run_id), legendgroup=run_id, showlegend=False, hoverinfo="none", meta=meta,
            ),
            **chart["cell"],
        )  # fmt: skip
    fig.add_trace(
        go.Scatter(
            x=xs, y=idle, mode="lines", stackgroup=chart["stack"], line={"width": 0.5, "color": IDLE_COLOR}, fillcolor=IDLE_COLOR,
            name=IDLE_NAME, showlegend=False, hoverinfo="none", meta={"idle": True, "name": IDLE_NAME, "device": f"GPU {shared.gpu}"} | look,
        ),
        **chart["cell"],
    )  # fmt: skip
