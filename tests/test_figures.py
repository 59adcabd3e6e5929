"""The overlay figure draws every GPU of every run, tells them apart, and says which physical GPU a line is."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from radt.app.figures import Panel, overlay_figure
from radt.catalogue import METRICS, Device
from radt.runmodel import GPUS_TAG, MIG_ACTIVITY_TAG

START = 1_700_000_000_000


def _runs(*names: str, tags: dict | None = None) -> pd.DataFrame:
    rows = [
        {
            "run_id": f"r{i}",
            "run_name": name,
            "start_time": START,
            "workload_id": "w",
            "workload_label": "workload 1",
            "letter": chr(65 + i),
            "params": {},
            "tags": (tags or {}).get(name, {}),
        }
        for i, name in enumerate(names)
    ]
    return pd.DataFrame(rows)


def _series(level: float, n: int = 60) -> tuple[np.ndarray, np.ndarray]:
    return START + np.arange(n) * 1000, np.full(n, level)


def _lines(figure) -> list:
    return [t for t in figure.data if t.fill != "tonexty" and not (t.line and t.line.width == 0)]


def test_each_gpu_of_each_run_is_a_line_named_run_and_gpu():
    runs = _runs("A", "B")
    panel = Panel(METRICS["sm_active"], {"r0": {Device(None, 0): _series(0.1), Device(None, 1): _series(0.2)}, "r1": {Device(None, 0): _series(0.3)}})
    figure = overlay_figure([panel], runs)
    lines = _lines(figure)
    assert [t.name for t in lines] == ["A · GPU 0", "A · GPU 1", "B · GPU 0"]
    a0, a1, b0 = lines
    assert a0.line.color == a1.line.color != b0.line.color, "several runs: a colour per run"
    assert a0.line.dash != a1.line.dash, "and a dash style per GPU of a run"
    assert [float(np.mean(t.y)) for t in lines] == pytest.approx([0.1, 0.2, 0.3], rel=1e-6)


def test_one_run_gets_a_colour_per_gpu_and_its_gpus_mean_with_a_band():
    runs = _runs("solo")
    devices = {Device(None, g): _series(0.1 * (g + 1)) for g in range(4)}
    each = _lines(overlay_figure([Panel(METRICS["sm_active"], {"r0": devices})], runs))
    assert len({t.line.color for t in each}) == 4
    mean = overlay_figure([Panel(METRICS["sm_active"], {"r0": devices})], runs, gpu_mode="mean")
    lines = _lines(mean)
    assert [t.name for t in lines] == ["solo · mean of 4 GPUs"]
    assert np.allclose(lines[0].y, 0.25)
    band = [t for t in mean.data if t.fill == "tonexty"]
    assert len(band) == 1 and np.allclose(band[0].y, 0.1), "the band's lower edge is the least busy GPU"
    assert np.allclose([t for t in mean.data if t.line and t.line.width == 0 and t.fill != "tonexty"][0].y, 0.4), "its upper edge the busiest"


def test_the_tooltip_names_the_physical_gpu_and_warns_when_a_mig_slice_was_not_read():
    gpus = [{"series": "gpu_3", "index": 3, "name": "DGX Display", "uuid": "GPU-0a1b2c3d-0000-1111-2222-333344445555", "pci_bus_id": "00000000:C2:00.0"}]
    runs = _runs("mig run", tags={"mig run": {GPUS_TAG: json.dumps(gpus), MIG_ACTIVITY_TAG: "unavailable: no GPM on A100"}})
    figure = overlay_figure([Panel(METRICS["sm_active"], {"r0": {Device(None, 3): _series(0.5)}})], runs)
    hover = _lines(figure)[0].hovertemplate
    assert "GPU 3" in hover and "DGX Display" in hover and "GPU-0a1b2c3d-" in hover and "00000000:C2:00.0" in hover
    assert "whole GPU, not the run's MIG slice" in hover and "no GPM on A100" in hover
