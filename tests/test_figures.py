"""The overlay figure draws every GPU of every run, tells them apart, and says which physical GPU a line is."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from radt.app.db.downsample import Envelope, envelope
from radt.app.figures.figures import ChartChoices, Panel, _alpha, legend_entries, overlay_figure
from radt.catalogue import METRICS, Device, Metric
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
    return [t for t in figure.data if not (t.meta or {}).get("band")]


def test_each_gpu_of_each_run_is_a_line_in_its_runs_colour_and_legend_entry():
    """A run's GPU and host series are one legend entry and one colour; which GPU a line is, is its dash style and meta."""
    runs = _runs("A", "B")
    gpus = Panel(METRICS["sm_active"], {"r0": {Device(None, 0): _series(0.1), Device(None, 1): _series(0.2)}, "r1": {Device(None, 0): _series(0.3)}})
    host = Panel(METRICS["cpu_utilization_percentage"], {"r0": {Device(): _series(30.0)}, "r1": {Device(): _series(40.0)}})
    figure = overlay_figure([gpus, host], runs)
    lines = _lines(figure)
    assert [(t.name, t.meta["device"]) for t in lines] == [("A", "GPU 0"), ("A", "GPU 1"), ("B", "GPU 0"), ("A", ""), ("B", "")]
    a0, a1, b0, a_host, b_host = lines
    assert a0.line.color == a1.line.color == a_host.line.color != b0.line.color == b_host.line.color, "a colour per run, host series too"
    assert a0.line.dash == b0.line.dash == "solid" != a1.line.dash, "GPU 1 is one dash style in every run"
    assert [t.showlegend for t in lines] == [True, False, True, False, False], "each run once in the legend (it held 'A · GPU 0' and 'A')"
    assert {t.legendgroup for t in lines} == {"r0", "r1"}
    assert [a.text for a in figure.layout.annotations] == ["SMACT", "CPU (% of all cores)"], "the title names the unit as the axis does"
    assert [float(np.mean(t.y)) for t in lines[:3]] == pytest.approx([0.1, 0.2, 0.3], rel=1e-6)


def test_a_runs_colour_is_its_place_in_the_view_so_adding_runs_keeps_the_colours_shown():
    from radt.app.figures.palette import PALETTE

    panel = lambda ids: Panel(METRICS["sm_active"], {r: {Device(None, 0): _series(0.5)} for r in ids})  # noqa: E731
    forward = _runs("A", "B", "C")
    backward = forward.iloc[::-1].reset_index(drop=True)
    colour = lambda fig: {t.meta["run_id"]: t.line.color for t in _lines(fig)}  # noqa: E731
    assert colour(overlay_figure([panel(["r0", "r1", "r2"])], forward)) == {"r0": PALETTE[0], "r1": PALETTE[1], "r2": PALETTE[2]}
    assert colour(overlay_figure([panel(["r2", "r1", "r0"])], backward)) == {"r2": PALETTE[0], "r1": PALETTE[1], "r0": PALETTE[2]}
    assert colour(overlay_figure([panel(["r0", "r1"])], forward.iloc[:2])) == {"r0": PALETTE[0], "r1": PALETTE[1]}


def test_one_run_gets_a_dash_per_gpu_and_its_gpus_mean_with_a_band():
    runs = _runs("solo")
    devices = {Device(None, g): _series(0.1 * (g + 1)) for g in range(4)}
    each = _lines(overlay_figure([Panel(METRICS["sm_active"], {"r0": devices})], runs))
    assert len({t.line.color for t in each}) == 1 and len({t.line.dash for t in each}) == 4
    mean = overlay_figure([Panel(METRICS["sm_active"], {"r0": devices})], runs, ChartChoices(gpu_mode="mean"))
    lines = _lines(mean)
    assert [(t.name, t.meta["device"]) for t in lines] == [("solo", "mean of 4 GPUs")]
    assert np.allclose(lines[0].y, 0.25)
    band = [t for t in mean.data if t.fill == "tonexty"]
    assert len(band) == 1 and np.allclose(band[0].y, 0.1), "the band's lower edge is the least busy GPU"
    assert np.allclose([t for t in mean.data if t.line and t.line.width == 0 and t.fill != "tonexty"][0].y, 0.4), "its upper edge the busiest"


def test_the_tooltip_names_the_physical_gpu_and_warns_when_a_mig_slice_was_not_read():
    gpus = [{"series": "gpu_3", "index": 3, "name": "DGX Display", "uuid": "GPU-0a1b2c3d-0000-1111-2222-333344445555", "pci_bus_id": "00000000:C2:00.0"}]
    runs = _runs("mig run", tags={"mig run": {GPUS_TAG: json.dumps(gpus), MIG_ACTIVITY_TAG: "unavailable: no GPM on A100"}})
    figure = overlay_figure([Panel(METRICS["sm_active"], {"r0": {Device(None, 3): _series(0.5)}})], runs)
    meta = _lines(figure)[0].meta
    assert meta["device"] == "GPU 3" and "DGX Display" in meta["where"] and "GPU-0a1b2c3d-" in meta["where"] and "00000000:C2:00.0" in meta["where"]
    assert "whole GPU, not the run's MIG slice" in meta["where"] and "no GPM on A100" in meta["where"]


def _envelope(n: int = 10_800, budget: int = 2000) -> Envelope:
    ts, ys = START + np.arange(n) * 1000, 0.5 + 0.3 * np.sin(np.arange(n) / 30.0)
    ys[6000] = 0.99
    return envelope(ts, ys, budget)


def test_a_downsampled_run_is_its_mean_in_a_light_envelope_and_a_short_one_a_plain_line():
    runs = _runs("long", "short")
    panel = Panel(METRICS["sm_active"], {"r0": {Device(None, 0): _envelope()}, "r1": {Device(None, 0): _series(0.3)}})
    figure = overlay_figure([panel], runs)
    band = [t for t in figure.data if t.fill == "toself"]
    assert len(band) == 1 and band[0].meta["run_id"] == "r0" and band[0].meta["band"], "one envelope, for the long run only"
    assert band[0].hoverinfo == "skip" and band[0].showlegend is False and band[0].line.width == 0
    line = next(t for t in _lines(figure) if t.meta["run_id"] == "r0")
    assert band[0].fillcolor == _alpha(line.line.color, 0.18), "the run's own colour, light"
    assert float(np.max(band[0].y)) == pytest.approx(0.99) and float(np.max(line.y)) < 0.9, "the peak widens the band; the line is the mean"
    assert len(band[0].x) == 2 * len(line.x) and 3 * len(line.x) <= 2000
    assert list(figure.data).index(band[0]) < list(figure.data).index(line), "the band under its line"
    assert line.meta["mean"] and [t.name for t in _lines(figure)] == ["long", "short"]


def test_grouped_bands_are_clearly_visible():
    runs = _runs("A", "B")
    panel = Panel(METRICS["sm_active"], {"r0": {Device(None, 0): _series(0.2)}, "r1": {Device(None, 0): _series(0.6)}})
    figure = overlay_figure([panel], runs, ChartChoices(grouped=True))
    fill = next(t for t in figure.data if t.fill == "tonexty")
    assert fill.fillcolor.endswith(",0.3)") and fill.line.width >= 1, "a stronger fill than an envelope, with a border"
    assert next(t for t in figure.data if t.name.endswith("(mean of 2)") and t.showlegend).meta["workload_id"] == "w"


def test_grouped_workloads_of_two_experiments_with_one_label_are_told_apart():
    """The demo's long run and the 5-GPU import are each their experiment's "ungrouped": grouped, the legend read
    "ungrouped (mean of 1)" and "ungrouped (mean of 1 runs, 5 GPU series)", nothing saying which was which."""
    runs = _runs("long", "five").assign(experiment_id=["3", "4"], workload_id=["ungrouped:3", "ungrouped:4"], workload_label="ungrouped")
    panel = Panel(METRICS["sm_active"], {"r0": {Device(None, 0): _series(0.2)}, "r1": {Device(None, 0): _series(0.6), Device(None, 1): _series(0.4)}})
    names = sorted(t.name for t in overlay_figure([panel], runs.set_index("run_id", drop=False), ChartChoices(grouped=True)).data if t.showlegend)
    assert names == ["ungrouped · experiment 3 (mean of 1)", "ungrouped · experiment 4 (mean of 1 run, 2 GPU series)"], names


@pytest.mark.parametrize("columns,beside", [(1, None), (2, 2), (3, 3)])
def test_charts_in_a_grid_of_columns_share_one_x_axis(columns, beside):
    runs = _runs("A")
    names = ["sm_active", "sm_occupancy", "power_usage_watts", "cpu_utilization_percentage"]
    panels = [Panel(METRICS[n], {"r0": {Device(None, 0) if METRICS[n].per_gpu else Device(): _series(0.5)}}) for n in names]
    layout = overlay_figure(panels, runs, ChartChoices(columns=columns)).layout
    axes = [layout[f"xaxis{i if i > 1 else ''}"] for i in range(1, 5)]
    assert len({a.matches for a in axes if a.matches}) == 1 and sum(a.matches is None for a in axes) <= 1, "one shared x axis"
    if beside is None:
        assert all(a.domain == axes[0].domain for a in axes) and layout.yaxis2.domain[1] < layout.yaxis.domain[0]
    else:
        assert axes[beside].domain[0] == axes[0].domain[0] and layout[f"yaxis{beside + 1}"].domain[1] < layout.yaxis.domain[0], "the next row"
        assert axes[1].domain[0] > axes[0].domain[1], "the second chart beside the first"
        assert axes[0].domain[1] - axes[0].domain[0] < 1 / columns
    last_in_column = {c: max(i for i in range(4) if i % columns == c) for c in range(columns)}
    for i, axis in enumerate(axes):
        assert axis.showticklabels is True, "tick labels under every chart: a screen of 900 px shows two rows and no bottom axis"
        assert bool(axis.title.text) == (i in last_in_column.values()), "the axis title under each column's last chart"
    if columns == 3:
        assert layout.xaxis5.visible is False and layout.xaxis6.visible is False, "the grid's empty cells draw nothing"


def _y(metric: str, values: np.ndarray, **kw) -> dict:
    device = Device(None, 0) if METRICS[metric].per_gpu else Device()
    figure = overlay_figure([Panel(METRICS[metric], {"r0": {device: (START + np.arange(len(values)) * 1000, values)}})], _runs("A"), ChartChoices(**kw))
    return figure.layout.yaxis


def test_every_axis_has_a_unit_and_a_floor_saturated_metrics_do_not_autoscale():
    ratio = _y("sm_active", np.full(60, 0.98))
    assert list(ratio.range) == pytest.approx([-0.0204, 1.02]) and ratio.title.text == "ratio (0–1)"
    busy = _y("cpu_utilization_percentage", np.linspace(97, 100, 60))
    assert busy.range[1] == pytest.approx(105) and busy.title.text == "% of all cores", "a saturated CPU is a flat line near the top, not a swing"
    tree = _y("process_cpu_utilization_percentage", np.linspace(80, 250, 60))
    assert tree.range[1] == pytest.approx(262.5) and tree.title.text == "% of one core", "250 % (2.5 cores) is on the chart"
    power = _y("power_usage_watts", np.linspace(240, 250, 60))
    assert power.range[1] == pytest.approx(262.5) and power.title.text == "W"
    memory = _y("memory_usage_megabytes", np.zeros(60))
    assert memory.range[0] < 0 < memory.range[1] and memory.title.text == "MB"
    loss = overlay_figure([Panel(Metric("delta", "delta", "", False, None, None), {"r0": {Device(): _series(-3.0)}})], _runs("A")).layout.yaxis
    assert loss.range[0] < -3.0 < loss.range[1] and loss.range[1] - loss.range[0] >= 0.29 and loss.title.text == "value"
    assert _y("sm_active", np.full(60, 0.5), log_y=True).type == "log"


@pytest.mark.parametrize("x_mode", ["relative", "wall", "step"])
def test_the_tooltip_gets_run_device_metric_unit_and_format_and_plotly_draws_no_box_of_its_own(x_mode):
    runs = _runs("A")
    figure = overlay_figure([Panel(METRICS["power_usage_watts"], {"r0": {Device(None, 1): _series(250.0)}})], runs, ChartChoices(x_mode=x_mode))
    line = _lines(figure)[0]
    assert {k: line.meta[k] for k in ("name", "device", "metric", "unit")} == {"name": "A", "device": "GPU 1", "metric": "Power", "unit": "W"}
    assert line.hoverinfo == "none" and not line.hovertemplate, "assets/charts.js draws one small box per chart; Plotly's boxes buried the page"
    assert line.meta["detail"]["workload"] == "workload 1 A", "the run's details (parameters) on a click, not in every box"
    assert figure.layout.hovermode == "x" and figure.layout.xaxis.showspikes and figure.layout.xaxis.spikemode == "across"


def test_a_run_shorter_than_two_minutes_is_drawn_in_seconds():
    """The README's first tracked run (1.5 s) showed x ticks of '0.005 min'."""
    runs = _runs("quick")
    ts = START + np.arange(4) * 500.0
    figure = overlay_figure([Panel(METRICS["sm_active"], {"r0": {Device(None, 0): (ts, np.full(4, 0.5))}})], runs, ChartChoices(x_range=(0.0, 0.025)))
    assert figure.layout.xaxis.title.text == "time since run start (s)" and figure.layout.meta["x_per_minute"] == 60
    assert float(np.max(_lines(figure)[0].x)) == pytest.approx(1.5) and list(figure.layout.xaxis.range) == pytest.approx([0, 1.5])
    long = overlay_figure([Panel(METRICS["sm_active"], {"r0": _envelope_series()})], runs)
    assert long.layout.xaxis.title.text == "time since run start (min)"


def test_a_zoom_into_a_long_run_keeps_its_minutes():
    """A 10-minute run zoomed to its first minute loads only that minute: the axis stays in minutes (the zoom is in minutes)."""
    runs = _runs("ten minutes").assign(duration_s=600.0)
    ts = START + np.arange(12, 60) * 1000.0
    figure = overlay_figure([Panel(METRICS["sm_active"], {"r0": {Device(None, 0): (ts, np.full(len(ts), 0.5))}})], runs, ChartChoices(x_range=(0.2, 1.0)))
    assert figure.layout.meta["x_per_minute"] == 1 and list(figure.layout.xaxis.range) == [0.2, 1.0]


def _envelope_series() -> dict:
    return {Device(None, 0): (START + np.arange(600) * 1000.0, np.full(600, 0.5))}


def test_an_idle_gpu_is_drawn_above_the_axis_line_and_reads_zero_in_the_legend():
    """The 5-GPU microbench run: GPUs 1-4 lay on the x axis line, five legend entries and one line seen, nothing said why."""
    runs = _runs("five")
    devices = {Device(None, 0): _series(1.0)} | {Device(None, g): _series(0.0) for g in range(1, 5)}
    panel = Panel(METRICS["sm_active"], {"r0": devices})
    figure = overlay_figure([panel], runs)
    assert figure.layout.yaxis.range[0] < 0, "0 is above the axis line"
    rendered = type("Rendered", (), {"figure": figure, "panels": [panel]})()
    (entry,) = legend_entries(rendered)
    assert entry["stats"][0] | {} == {"metric": "SMACT", "unit": "", "fmt": ".3f", "mean": 0.2, "max": 1.0, "last": 0.2, "series": 5}
    assert all(d["stats"][0]["fmt"] == ".3f" for d in entry["devices"]), "a GPU's own figures printed as the run's"
    assert [(d["label"], d["dash"], d["stats"][0]["max"]) for d in entry["devices"]] == [
        ("GPU 0", "solid", 1.0), ("GPU 1", "dash", 0.0), ("GPU 2", "dot", 0.0), ("GPU 3", "dashdot", 0.0), ("GPU 4", "longdash", 0.0)
    ]  # fmt: skip


def test_legend_entries_name_each_series_once_with_its_run_colour_and_dash():
    runs = _runs("A", "B")
    panels = [
        Panel(METRICS["sm_active"], {"r0": {Device(None, 0): _envelope(), Device(None, 1): _series(0.2)}, "r1": {Device(None, 0): _series(0.3)}}),
        Panel(METRICS["power_usage_watts"], {"r0": {Device(None, 0): _series(200.0)}}),
    ]
    figure = overlay_figure(panels, runs)
    entries = legend_entries(figure)
    assert [(e["id"], e["name"]) for e in entries] == [("r0", "A"), ("r1", "B")], "one entry per run (it was one per run and GPU)"
    assert entries[0]["color"] != entries[1]["color"]
    rendered = type("Rendered", (), {"figure": figure, "panels": panels})()
    stats = legend_entries(rendered)
    assert [c["metric"] for c in stats[0]["stats"]] == ["SMACT", "Power"] and stats[1]["stats"][1] == {"metric": "Power", "unit": "W", "fmt": ",.4~g"}
    assert stats[0]["stats"][1]["mean"] == pytest.approx(200.0) and stats[1]["stats"][0]["max"] == pytest.approx(0.3)
    assert stats[0]["stats"][0]["max"] == pytest.approx(0.99), "an envelope's peak, not its bucket means'"
    grouped = legend_entries(overlay_figure(panels, runs, ChartChoices(grouped=True)))
    assert [e["id"] for e in grouped] == ["w"]


def test_a_legend_row_gives_its_runs_command_on_hover():
    """A sweep's runs carry MLflow's random names ("crawling-gull-54"): the legend row's hover says which command it ran."""
    from radt.pages.parts.legend import children

    runs = _runs("crawling-gull-54", "nervous-shark-42")
    runs["params"] = [{"command": "python train.py --lr 0.1"}, {}]
    panels = [Panel(METRICS["sm_active"], {"r0": {Device(None, 0): _series(0.5)}, "r1": {Device(None, 0): _series(0.3)}})]
    rendered = type("Rendered", (), {"figure": overlay_figure(panels, runs), "panels": panels, "runs": runs})()
    entries = legend_entries(rendered)
    assert [e.get("command") for e in entries] == ["train.py --lr 0.1", None], "the command as a reader names it; none where the run has none"
    (table,) = children(entries)
    titles = [row.children[0].title for row in table.children[1].children]
    assert titles == ["crawling-gull-54\ntrain.py --lr 0.1", "nervous-shark-42"], titles


def test_a_profiled_runs_tooltips_and_legend_row_say_the_profiler_wrapped_it():
    """Under ncu an H200's matrix products read SMACT 0.015 (docs/GPU.md, 2026-11-28): whoever reads a profiled run's figure is told."""
    runs = _runs("bert-1", "plain", tags={"bert-1": {"radt.profiler": "ncu"}})
    runs["params"] = [{"command": "python train.py --lr 0.1"}] * 2
    devices = {Device(None, g): _series(0.1 * (g + 1)) for g in range(2)}
    panels = [Panel(METRICS["sm_active"], {"r0": devices, "r1": {Device(None, 0): _series(0.5)}})]
    where = {t.meta["run_id"]: t.meta.get("where", "") for t in _lines(overlay_figure(panels, runs))}
    assert "profiled by ncu" in where["r0"] and "profiled by ncu" not in where["r1"], where
    mean = {t.meta["run_id"]: t.meta.get("where", "") for t in _lines(overlay_figure(panels, runs, ChartChoices(gpu_mode="mean")))}
    assert "profiled by ncu" in mean["r0"], "the mean of its GPUs too"
    rendered = type("Rendered", (), {"figure": overlay_figure(panels, runs), "panels": panels, "runs": runs})()
    assert [e.get("command") for e in legend_entries(rendered)] == ["ncu train.py --lr 0.1", "train.py --lr 0.1"]
    assert [e["name"] for e in legend_entries(rendered)] == ["bert-1 (under ncu)", "plain"], "an exported legend says it too"
    assert [e["name"] for e in legend_entries(overlay_figure(panels, runs, ChartChoices(gpu_mode="mean")))] == ["bert-1 (under ncu)", "plain"]


def test_the_run_picker_labels_a_profiled_run_and_a_mig_run_whose_slice_was_not_read():
    from radt.pages.parts.run_picker import _label

    row = type("Row", (), {"status": "FINISHED", "letter": "A", "run_name": "bert", "duration_s": 90.0})
    assert "⚠ profiled by ncu" in _label(type("R", (row,), {"tags": {"radt.profiler": "ncu"}})())
    both = _label(type("R", (row,), {"tags": {"radt.profiler": "nsys", "radt.mig_activity": "no GPM on A100"}})())
    assert "⚠ MIG slice activity not recorded (no GPM on A100)" in both and "⚠ profiled by nsys" in both
    assert "⚠" not in _label(type("R", (row,), {"tags": {}})())


def test_hardware_samples_sit_on_the_training_step_the_script_was_at(store_uri):
    """The script logs its loss every 100 steps, 10 s apart; radt samples the GPU every second with its own counter as step."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric as Logged

    from radt.app.exportcli import _open_store
    from radt.app.figures.figures import X_STEP_PLACED
    from radt.app.view import data
    from radt.app.view.views import View, render

    client = MlflowClient(store_uri)
    experiment = client.create_experiment("steps")
    trained = client.create_run(experiment, run_name="trained", start_time=START).info.run_id
    bare = client.create_run(experiment, run_name="bare", start_time=START).info.run_id
    samples = [Logged("system/gpu_0_sm_active", 0.5, START + s * 1000, s) for s in range(35)]
    client.log_batch(trained, metrics=[Logged("loss", 1.0 / (i + 1), START + i * 10_000, i * 100) for i in range(4)] + samples)
    client.log_batch(bare, metrics=samples)
    for run_id in (trained, bare):
        client.set_terminated(run_id, "FINISHED", end_time=START + 35_000)
    _open_store(store_uri)
    runs = data.runs([experiment])

    found = data.series("cat:sm_active", runs, x="step")
    steps, _values = found[trained][Device(None, 0)]
    assert steps.tolist() == pytest.approx([10.0 * s for s in range(31)]), "sample at 17 s: step 170; after the last logged step (30 s): left out"
    assert bare not in found, "a run that logged nothing of its own has no training steps to place samples on"
    zoomed = data.series("cat:sm_active", runs, data.zoom_windows((100, 200), "step", runs), x="step")
    assert zoomed[trained][Device(None, 0)][0].tolist() == pytest.approx([10.0 * s for s in range(10, 21)]), "a step window is its time window"

    rendered = render(View([experiment], [trained, bare], ["cat:sm_active", "key:loss"], x="step"))
    layout = rendered.figure.layout
    assert X_STEP_PLACED in {layout.xaxis.title.text, layout.xaxis2.title.text}
    loss = next(t for t in rendered.figure.data if t.name == "trained" and (t.yaxis or "y") == "y2")
    assert list(loss.x) == [0, 100, 200, 300], "the run's own metric on its own steps"
    assert any("bare" in note and "no hardware series" in note for note in rendered.notes)


def test_the_number_of_columns_is_part_of_the_view_and_its_link():
    from radt.app.view.views import View

    view = View.from_dict({"runs": "r0", "cols": "2"})
    assert view.cols == 2 and view.to_dict()["cols"] == "2" and View.from_dict(view.to_dict()).cols == 2
    assert "cols" not in View.from_dict({"runs": "r0"}).to_dict(), "one column: the link stays as it was"
    wide, junk = View.from_dict({"cols": "9"}), View.from_dict({"cols": ["x", "2"]})
    assert wide.cols == 3 and "columns 9" in wide.notes[0]
    assert junk.cols == 1 and "columns 'x'" in junk.notes[0]


def test_a_series_of_one_sample_is_a_dot_not_nothing():
    """The README's first run once had one CPU sample: its chart was empty while the legend gave its mean."""
    panel = Panel(METRICS["cpu_utilization_percentage"], {"r0": {Device(): _series(90.5, n=1)}, "r1": {Device(): _series(40.0)}})
    figure = overlay_figure([panel], _runs("short", "long"))
    modes = {t.meta["run_id"]: t.mode for t in _lines(figure)}
    assert modes == {"r0": "lines+markers", "r1": "lines"}
