"""The comparison figures (app/export/aggregates.py) on known stores, SQLite and PostgreSQL: every bar, box and CDF point
against the comparison table and a hand computation; the GRACT vs SMACT vs SMOCC view of the recorded microbenchmark.

`built`: one experiment, one command, four workloads of two runs each (SMACT constant per run, 10 steps, energy from a counter):
- alone: two runs one after another, 1 h each;
- timeslice: two overlapping runs on one GPU (collocation "-");
- mps: two overlapping runs under MPS;
- mig: two overlapping runs in MIG 3g.40gb instances.

`mixed`: what the issue found compared unlike with like: two experiments, two commands (MIXED), resnet alone, time-sliced
and under MPS in "vision", bert alone and time-sliced in "language", both with a workload "1 alone".
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from radt.app.export import aggregates
from radt.app.export.aggregates import (
    MAX_SERIES,
    FigureError,
    activity_figure,
    aggregate_figure,
    bar_figure,
    box_figure,
    cdf_figure,
    collocation_figure,
    groups,
    legend_text,
    short_commands,
)
from radt.app.export.exportoptions import ExportError
from radt.app.export.paper import activity_series, comparison_table
from radt.app.exportcli import _open_store
from radt.app.figures.palette import SERIES_DASHES, run_colors
from radt.app.view.views import View, view_runs
from radt.collectors.imports.importer import main as import_main
from radt.collectors.store.stores import open_metric_store
from radt.collectors.store.tracking import PROCESS_ONLY_ENV
from radt.points import Point
from radt.runmodel import COLLOCATION_TAG
from tests.support.runs import radt_run

pytestmark = pytest.mark.dialects  # the SQL radt issues differs per dialect: SQLite and the real PostgreSQL

BASE = 1_700_000_000_000
MIN = 60_000
# workload -> (collocation tag, [(start min, end min, SMACT, energy J, steps)] per run)
WORKLOADS = {
    "alone": ("-", [(0, 60, 0.60, 360_000, 10), (61, 121, 0.64, 380_000, 10)]),
    "timeslice": ("-", [(200, 320, 0.30, 500_000, 10), (205, 325, 0.34, 520_000, 10)]),
    "mps": ("mps", [(400, 490, 0.40, 450_000, 10), (402, 492, 0.44, 460_000, 10)]),
    "mig": ("3g.40gb", [(600, 720, 0.20, 300_000, 10), (600, 720, 0.26, 310_000, 10)]),
}
METHOD = {"alone": "alone", "timeslice": "same GPU", "mps": "MPS", "mig": "MIG"}


def _build(uri: str) -> tuple[str, dict[str, str]]:
    client, writer = MlflowClient(uri), open_metric_store(uri)
    exp = client.create_experiment("aggregates")
    runs = {}
    for workload, (collocation, specs) in WORKLOADS.items():
        for letter, (start, end, smact, joules, steps) in zip("AB", specs, strict=True):
            t0 = BASE + start * MIN
            run_id = radt_run(client, exp, f"{workload}{letter}", start_time=t0, workload=workload, letter=letter, script_args=("--model", "resnet50"))
            points = [Point("loss", 1.0 / (i + 1), t0 + 1000 * i, i) for i in range(steps)]
            points += [Point("system/gpu_0_sm_active", smact, t0 + 1000 * i, i) for i in range(20)]
            points += [Point("system/gpu_0_energy_joules", float(joules) * i, t0 + 1000 * i, i) for i in (0, 1)]
            writer.write(run_id, points)
            client.set_tag(run_id, COLLOCATION_TAG, collocation)
            client.set_terminated(run_id, "FINISHED", end_time=BASE + end * MIN)
            runs[f"{workload}{letter}"] = run_id
    writer.close()
    return exp, runs


@pytest.fixture
def built(store_uri, snapshots):
    built = snapshots.restore(_build, store_uri)
    _open_store(store_uri)
    return built


def _table(built):
    exp, runs = built
    return comparison_table(View([exp], list(runs.values())))


def _specs(workload: str, column: int) -> list[float]:
    return [spec[column] for spec in WORKLOADS[workload][1]]


def test_the_table_names_each_runs_collocation_and_energy_per_step(built):
    table = _table(built)
    runs = table[table["kind"] == "run"].set_index("run")
    for workload, method in METHOD.items():
        for letter, (_s, _e, _smact, joules, steps) in zip("AB", WORKLOADS[workload][1], strict=True):
            row = runs.loc[f"{workload}{letter}"]
            assert row["collocation"] == method, (workload, row["collocation"])
            assert row["energy_per_step_j"] == pytest.approx(joules / steps), "energy (J) ÷ steps"
            assert row["run_id"] == built[1][f"{workload}{letter}"]


def test_bars_are_the_tables_means_per_collocation_method(built):
    table = _table(built)
    figure = bar_figure(table, "smact_mean", "collocation")
    bar = figure.data[0]
    assert list(bar.x) == ["alone", "same GPU", "MPS", "MIG"], "the papers' order"
    runs = table[table["kind"] == "run"]
    for name, height in zip(bar.x, bar.y, strict=True):
        assert height == pytest.approx(runs[runs["collocation"] == name]["smact_mean"].mean())
    workload = {METHOD[w]: w for w in WORKLOADS}
    assert list(bar.y) == pytest.approx([np.mean(_specs(workload[m], 2)) for m in bar.x]), "each run's SMACT is its constant"
    assert list(bar.customdata) == [2, 2, 2, 2], "two runs a bar"
    by_workload = bar_figure(table, "steps_per_h", "workload").data[0]
    assert list(by_workload.x) == ["workload alone", "workload mig", "workload mps", "workload timeslice"]
    assert by_workload.showlegend is False, "one experiment's bars: no legend entry (an export drew one, 'mean SMACT', the axis title again)"
    hours = {w: [(e - s) / 60 for s, e, *_ in WORKLOADS[w][1]] for w in WORKLOADS}
    assert list(by_workload.y) == pytest.approx([np.mean([10 / h for h in hours[w]]) for w in ("alone", "mig", "mps", "timeslice")])


def test_boxes_hold_every_run_and_cdfs_end_at_the_extremes(built):
    table = _table(built)
    figure = box_figure(table, "energy_per_step_j", "workload")
    (box,) = [t for t in figure.data if t.type == "box"]
    categories = dict(zip(figure.layout.xaxis.tickvals, figure.layout.xaxis.ticktext, strict=True))
    mps = sorted(y for x, y in zip(box.x, box.y, strict=True) if categories[round(x)] == "workload mps")
    assert mps == pytest.approx(sorted(j / s for _a, _b, _c, j, s in WORKLOADS["mps"][1]))
    lines = {trace.name: trace for trace in cdf_figure(table, "smact_mean", "collocation").data}
    assert set(lines) == {"alone (2)", "same GPU (2)", "MPS (2)", "MIG (2)"}
    mig = lines["MIG (2)"]
    assert mig.x[0] == pytest.approx(0.20) and mig.x[-1] == pytest.approx(0.26), "from the lowest run to the highest"
    assert list(mig.y) == [0.5, 1.0], "the share of runs at or below each value"


def test_group_rows_and_unknown_runs_stay_out_of_the_figures(built):
    table = _table(built)
    assert (table["kind"] == "workload").any(), "runs together have their group's row"
    found = groups(table, "smact_mean", "workload")
    assert sum(len(g.values) for g in found) == 8, "only the runs, not their groups' rows"
    with pytest.raises(ValueError, match="statistic 'nope' is not one of"):
        bar_figure(table, "nope", "workload")


RESNET = ("--model", "resnet50", "--lr", "0.1")
BERT = ("--model", "bert", "--lr", "0.1")
# experiment -> [(run, workload, collocation tag, arguments, start min, end min, SMACT)]; every run 10 steps
MIXED = {
    "vision": [
        ("resnet 1A", "1 alone", "-", RESNET, 0, 60, 0.60),
        ("resnet 2A", "2 same GPU", "-", RESNET, 100, 200, 0.70),
        ("resnet 2B", "2 same GPU", "-", RESNET, 101, 221, 0.72),
        ("resnet 3A", "3 MPS", "mps", RESNET, 300, 375, 0.80),
        ("resnet 3B", "3 MPS", "mps", RESNET, 300, 380, 0.82),
    ],
    "language": [
        ("bert 1A", "1 alone", "-", BERT, 0, 30, 0.50),
        ("bert 2A", "2 same GPU", "-", BERT, 100, 160, 0.66),
        ("bert 2B", "2 same GPU", "-", BERT, 100, 150, 0.64),
    ],
}


def _build_mixed(uri: str) -> tuple[dict[str, str], dict[str, str]]:
    client, writer = MlflowClient(uri), open_metric_store(uri)
    experiments, runs = {}, {}
    for experiment, specs in MIXED.items():
        exp = experiments[experiment] = client.create_experiment(experiment)
        for name, workload, collocation, args, start, end, smact in specs:
            t0 = BASE + start * MIN
            run_id = runs[name] = radt_run(client, exp, name, start_time=t0, workload=workload, letter=name[-1], script_args=args)
            points = [Point("loss", 1.0 / (i + 1), t0 + 1000 * i, i) for i in range(10)]
            writer.write(run_id, points + [Point("system/gpu_0_sm_active", smact, t0 + 1000 * i, i) for i in range(20)])
            client.set_tag(run_id, COLLOCATION_TAG, collocation)
            client.set_terminated(run_id, "FINISHED", end_time=BASE + end * MIN)
    writer.close()
    return experiments, runs


@pytest.fixture
def mixed(store_uri, snapshots):
    """The comparison table of every run of MIXED, the experiments' names by id, the runs' ids by name."""
    experiments, runs = snapshots.restore(_build_mixed, store_uri)
    _open_store(store_uri)
    view = View(list(experiments.values()), list(runs.values()))
    return comparison_table(view), {i: n for n, i in experiments.items()}, runs, view


def _per_hour(name: str) -> float:
    (start, end) = next((s, e) for specs in MIXED.values() for n, *_r, s, e, _smact in specs if n == name)
    return 10 / ((end - start) / 60)


def _smact(*names: str) -> float:
    return float(np.mean([smact for specs in MIXED.values() for n, *_r, smact in specs if n in names]))


def test_by_collocation_each_command_is_compared_with_itself(mixed):
    """The bug: bert's alone run averaged into one "alone" bar with resnet's, beside resnet's collocated runs, no name saying so."""
    table, names, _runs, _view = mixed
    bars = {trace.name.split("<br>")[0]: trace for trace in bar_figure(table, "smact_mean", "collocation", names).data}
    assert set(bars) == {"--model resnet50", "--model bert"}, "a series per command, named by what tells it apart"
    resnet, bert = bars["--model resnet50"], bars["--model bert"]
    assert list(resnet.x) == ["alone", "same GPU", "MPS"] and list(bert.x) == ["alone", "same GPU"]
    assert list(resnet.y) == pytest.approx([_smact("resnet 1A"), _smact("resnet 2A", "resnet 2B"), _smact("resnet 3A", "resnet 3B")])
    assert list(bert.y) == pytest.approx([_smact("bert 1A"), _smact("bert 2A", "bert 2B")])
    assert "<i>vision</i>" in resnet.name and "<i>language</i>" in bert.name, "runs of two experiments: each series says which"

    one = table[table["experiment_id"] == mixed[3].experiments[0]]  # one experiment, one command: one series, the command whole
    (figure,) = bar_figure(one, "smact_mean", "collocation", names).data
    assert figure.name.replace("<br>", " ") == "train.py --model resnet50 --lr 0.1", figure.name


def test_a_category_held_by_one_series_centres_its_bar_and_box_on_its_tick(mixed):
    """MPS holds resnet's runs only: Plotly's group mode drew its bar in resnet's half, left of the tick, half wide, and
    the box plot put its box there too; alone and same GPU hold both commands, side by side about their ticks."""
    table, names, _runs, _view = mixed
    bars = {trace.name.split("<br>")[0]: trace for trace in bar_figure(table, "smact_mean", "collocation", names).data}
    centres = {(name, x): offset + width / 2 for name, t in bars.items() for x, offset, width in zip(t.x, t.offset, t.width, strict=True)}
    widths = {(name, x): width for name, t in bars.items() for x, width in zip(t.x, t.width, strict=True)}
    assert centres[("--model resnet50", "MPS")] == pytest.approx(0) and widths[("--model resnet50", "MPS")] == pytest.approx(0.75), centres
    for method in ("alone", "same GPU"):
        resnet, bert = centres[("--model resnet50", method)], centres[("--model bert", method)]
        assert resnet == pytest.approx(-bert) and resnet < 0 < bert, (method, centres)
        assert resnet + widths[("--model resnet50", method)] / 2 <= bert - widths[("--model bert", method)] / 2
    boxes = {t.name.split("<br>")[0]: t for t in box_figure(table, "smact_mean", "collocation", names).data if t.type == "box"}
    assert set(boxes["--model resnet50"].x[-2:]) == {2.0}, "MPS (the third category) on its tick"
    assert sorted({round(x, 6) for x in boxes["--model bert"].x}) == [0.2, 1.2], "beside resnet's at alone and same GPU"


def _nearest_box(boxes: list, x: float):
    """The box trace whose box stands nearest a point's x (a run's point lies within its own box's width)."""
    return min(boxes, key=lambda b: min(abs(x - c) for c in b.x))


def test_a_box_plots_points_take_the_colour_its_legend_gives_them(mixed):
    """Box plots coloured each run's point by the run and each box by its command, against their own legend: by
    collocation a bert run's point was resnet's orange inside bert's blue box (issue 52). With a legend (commands,
    experiments) a point takes its box's colour; without one (one experiment by workload) the box is grey and each point
    keeps its run's colour, the one Explore's legend gives it."""
    table, names, runs, view = mixed
    colours = run_colors(view_runs(view))
    for by in ("collocation", "workload"):
        figure = box_figure(table, "smact_mean", by, names, colours)
        boxes = [t for t in figure.data if t.type == "box"]
        (points,) = [t for t in figure.data if t.type == "scatter"]
        assert len(boxes) == 2 and all(b.showlegend is not False for b in boxes), (by, [b.name for b in boxes])
        assert len({b.line.color for b in boxes}) == 2, (by, "a colour per legend entry")
        drawn = [(run_id, x, colour) for (run_id, _category), x, colour in zip(points.customdata, points.x, points.marker.color, strict=True)]
        assert sorted(r for r, _x, _c in drawn) == sorted(runs.values()), "every run once"
        wrong = [(r, c, _nearest_box(boxes, x).line.color) for r, x, c in drawn if c != _nearest_box(boxes, x).line.color]
        assert not wrong, (by, "a point in another colour than its box's legend entry", wrong)
    one = table[table["experiment_id"] == view.experiments[0]]
    figure = box_figure(one, "smact_mean", "workload", names, colours)
    (box,) = [t for t in figure.data if t.type == "box"]
    (points,) = [t for t in figure.data if t.type == "scatter"]
    assert box.showlegend is False and box.line.color not in colours.values(), ("one series, no legend: a grey box, no run's colour", box.line.color)
    drawn = {run_id: colour for (run_id, _category), colour in zip(points.customdata, points.marker.color, strict=True)}
    assert drawn and drawn == {r: colours[r] for r in drawn}, "without a legend of its own, each point in its run's colour (Explore's)"


def test_the_collocation_figure_sets_each_command_against_itself_alone(mixed):
    table, names, _runs, _view = mixed
    figure = collocation_figure(table, names)
    panels = {axis: {t.name.split("<br>")[0]: t for t in figure.data if t.xaxis == axis} for axis in ("x", "x2")}
    throughput, smact = panels["x"], panels["x2"]
    assert list(throughput["--model resnet50"].x) == ["alone", "same GPU", "MPS"]
    alone = _per_hour("resnet 1A")
    expected = [1.0, np.mean([_per_hour("resnet 2A"), _per_hour("resnet 2B")]) / alone, np.mean([_per_hour("resnet 3A"), _per_hour("resnet 3B")]) / alone]
    assert list(throughput["--model resnet50"].y) == pytest.approx(expected), "steps/h ÷ the same command alone; alone = 1"
    bert = _per_hour("bert 1A")
    assert list(throughput["--model bert"].y) == pytest.approx([1.0, np.mean([_per_hour("bert 2A"), _per_hour("bert 2B")]) / bert])
    runs = table[table["kind"] == "run"].set_index("run")
    assert throughput["--model bert"].y[1] == pytest.approx(runs.loc[["bert 2A", "bert 2B"], "normalised"].mean()), "the table's own normalised"
    assert list(smact["--model resnet50"].y) == pytest.approx([_smact("resnet 1A"), _smact("resnet 2A", "resnet 2B"), _smact("resnet 3A", "resnet 3B")])
    assert list(smact["--model bert"].y) == pytest.approx([_smact("bert 1A"), _smact("bert 2A", "bert 2B")])
    assert sorted(t.name.split("<br>")[0] for t in figure.data if t.showlegend is not False) == ["--model bert", "--model resnet50"], "a command once"
    colours = {t.name: t.marker.color for t in figure.data}
    assert len(set(colours.values())) == 2, "a command has one colour in both panels"
    titles = [a.text for a in figure.layout.annotations]
    assert "throughput ÷ same command alone" in titles and any(t.startswith("GPU SMACT") for t in titles)


def test_runs_of_several_experiments_are_named_and_keep_their_colour(mixed):
    """By workload, "1 alone" of vision and "1 alone" of language are two bars, each named by its experiment."""
    table, names, runs, view = mixed
    bars = {trace.name: trace for trace in bar_figure(table, "steps_per_h", "workload", names).data}
    assert set(bars) == {"<i>vision</i>", "<i>language</i>"}
    assert list(bars["<i>language</i>"].x) == ["workload 1 alone", "workload 2 same GPU"]
    assert bars["<i>language</i>"].y[0] == pytest.approx(_per_hour("bert 1A")) and bars["<i>vision</i>"].y[0] == pytest.approx(_per_hour("resnet 1A"))
    unnamed = bar_figure(table, "steps_per_h", "workload")
    assert {t.name for t in unnamed.data} == {f"<i>experiment {i}</i>" for i in names}, "an experiment known only by its id"

    lines = cdf_figure(table, "smact_mean", "collocation", names).data
    assert {t.legendgrouptitle.text.split("<br>")[0] for t in lines} == {"--model resnet50", "--model bert"}


# Launched commands and their short names, a view's worth each.
LAUNCHED = [
    # a launcher is not the script: `radt import`'s run and a `python train.py` run were named "radt" and "python"
    {
        "radt import a.csv b.txt": "radt import",
        "python train.py --lr 0.1": "python train.py",
        "python -m torch.distributed.run eval.py": "python eval.py",  # the script it trains, not the module that launched it
        "vit.py --lr 1": "vit.py",
    },
    # a launcher's option with a value is not its script: `torchrun --nproc_per_node 8 train.py` was "torchrun 8", and two
    # such runs on 4 and 8 GPUs "torchrun 4" and "torchrun 8", as if they trained two scripts
    {
        "torchrun --nproc_per_node 4 train.py --lr 0.1": "torchrun train.py --nproc_per_node 4",
        "torchrun --nproc_per_node 8 train.py --lr 0.1": "torchrun train.py --nproc_per_node 8",
        "vit.py": "vit.py",
    },
    # launchers in a row name the script after the last: `ncu python train.py` read "ncu python" (compare.command_text drops a
    # leading interpreter only), Slurm's `srun -N 2 python train.py` "srun 2", a profiled `radt import` "nsys radt"
    {
        "ncu python train.py --lr 0.1": "ncu python train.py",
        "srun -N 2 python train.py --lr 0.1": "srun python train.py",
        "python eval.py": "python eval.py",
        "accelerate launch --num_processes 2 ft.py": "accelerate ft.py",
        "nsys radt import a.csv": "nsys radt import",
    },
    # a launcher by its path or its version is one still, named by its file: "/opt/conda/bin/python3.10 train.py" read
    # "/opt/conda/bin/python3.10" beside another script, as if the interpreter were what ran
    {
        "/opt/conda/bin/python3.10 train.py --lr 0.1": "python3.10 train.py",
        "vit.py": "vit.py",
        "/usr/bin/torchrun --nproc_per_node 2 eval.py": "torchrun eval.py",
    },
]


def test_short_command_names_say_what_differs():
    assert short_commands(["train.py --model a --lr 0.1", "train.py --model b --lr 0.1"]) == {
        "train.py --model a --lr 0.1": "--model a",
        "train.py --model b --lr 0.1": "--model b",
    }
    found = short_commands(["vit.py --lr 1", "bert.py --workers 1 --amp", "bert.py --workers 8 --amp"])
    assert found == {"vit.py --lr 1": "vit.py", "bert.py --workers 1 --amp": "bert.py --workers 1", "bert.py --workers 8 --amp": "bert.py --workers 8"}
    assert short_commands(["train.py --a 1 --b 2", "train.py --b 2 --a 1"]) == {
        "train.py --a 1 --b 2": "train.py --a 1 --b 2",
        "train.py --b 2 --a 1": "train.py --b 2 --a 1",
    }
    assert short_commands(["", "x.py"])[""] == "(no command)"
    for names in LAUNCHED:
        assert short_commands(list(names)) == names, names
    # a command is anyone's text in a shared store: launchers in a row were followed one call deeper each, and 3,000 of
    # them (a 9,000-character param) raised RecursionError in every page that named the run
    hostile = "sh " * 3000 + "x.py --lr 1"
    named = short_commands([hostile, "y.py"])[hostile]
    assert named == "sh " * 3000 + "x.py", named[-40:]
    # compare.command_text puts the profiler first: a run under ncu is its own series, named by it, not a second "train.py"
    profiled = short_commands(["ncu train.py --model resnet50", "train.py --model resnet50", "nsys-raw train.py --model resnet50"])
    assert profiled == {
        "ncu train.py --model resnet50": "ncu train.py",
        "train.py --model resnet50": "train.py",
        "nsys-raw train.py --model resnet50": "nsys-raw train.py",
    }
    wrapped = legend_text("train_imagenet.py --model resnet50 --batch-size 256 --lr 0.1 --epochs 10 --workers 8 --amp <b>")
    assert wrapped.count("<br>") == 2 and wrapped.endswith(" …") and all(len(line) <= 30 for line in wrapped.split("<br>"))
    assert legend_text("a <b>bold</b> name") == "a &lt;b&gt;bold&lt;/b&gt; name", "a name is text, never Plotly's markup"
    # a path is one word: whole, "tests/fixtures/real-tool-logs/mnist_dcgmi_dmon_18fields.txt" (58 characters) of an
    # imported run's command reached the comparison figure's right edge at 1440 px, and a longer one ran past it
    imported = legend_text("radt import /data/cluster/logs/2026-11-28/node07/mnist_dcgmi_dmon_18fields.txt other.csv")
    assert all(len(line) <= 30 for line in imported.split("<br>")), imported
    assert imported.startswith("radt import<br>/data/cluster/logs/2026-11-28/"), imported


def _sweep(commands: int, runs_each: int = 2):
    """A comparison table of a learning-rate sweep: each command run alone and under MPS."""
    rows = [
        {"kind": "run", "experiment_id": "1", "command": f"python train.py --model resnet50 --lr {0.001 * (c + 1):.3f}", "run": f"lr{c}{m}{r}",
         "run_id": f"{c:04d}{m}{r}".ljust(32, "0"), "collocation": method, "workload": f"w{c}", "smact_mean": 0.1 + 0.01 * c, "steps_per_h": 100.0 - 40 * m,
         "alone_steps_per_h": 100.0, "normalised": 0.6 if m else None}
        for c in range(commands) for m, method in enumerate(("alone", "MPS")) for r in range(runs_each)
    ]  # fmt: skip
    return pd.DataFrame(rows)


@pytest.mark.parametrize("kind", ["bar", "box", "cdf", "collocation"])
def test_a_sweep_of_more_commands_than_colours_by_collocation_says_what_to_pick(kind):
    """A 150-command learning-rate sweep by collocation drew 150 one-pixel bars in colours that came round again beside a
    2,860 px legend (a 4,406 px tall figure at 1440 px). Up to the palette's 20 each command is its own colour (a CDF's
    command its own dash: six), its every line apart; past that the figure says how many commands there are and what to
    pick instead."""
    most = len(SERIES_DASHES) if kind == "cdf" else MAX_SERIES
    figure = aggregate_figure(kind, _sweep(most), "smact_mean", "collocation", {}, {})
    drawn = [t for t in figure.data if t.showlegend is not False]  # a box plot's run points and the second panel's bars repeat a series
    looks = {(t.marker.color if t.type == "bar" else t.line.color, t.line.dash if t.type == "scatter" else None) for t in drawn}
    assert len(looks) == len(drawn) >= most, (kind, len(looks), len(drawn))
    with pytest.raises(FigureError, match=f"{most + 1} different commands.*compare by workload, or filter the runs to {most} commands"):
        aggregate_figure(kind, _sweep(most + 1), "smact_mean", "collocation", {}, {})
    assert len(groups(_sweep(MAX_SERIES + 130), "smact_mean", "workload")) == MAX_SERIES + 130  # by workload: one series, a bar a workload


def test_a_cdf_of_more_workloads_than_colours_says_to_use_bars():
    """A CDF's workload is its colour: the 21st workload's line looked like the first's."""
    assert len(cdf_figure(_sweep(MAX_SERIES), "smact_mean", "workload").data) == MAX_SERIES
    with pytest.raises(FigureError, match=f"{MAX_SERIES + 1} workloads, more lines than a CDF tells apart.*use bars or box plots"):
        cdf_figure(_sweep(MAX_SERIES + 1), "smact_mean", "workload")


def test_short_names_of_a_thousand_command_sweep_are_read_once_per_script():
    """short_commands read every command's options again for each command of its script: 1.3 s for a 1,000-run sweep in
    every summary table and Live page that named it. Now once (a 1,000-command call counts 1,000 reads, not 1,000,000)."""
    calls = []
    real = aggregates._pairs
    commands = [f"python train.py --lr {i} --bs 64" for i in range(1000)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(aggregates, "_pairs", lambda words: calls.append(1) or real(words))
        names = short_commands(commands)
    assert names[commands[7]] == "--lr 7" and len(set(names.values())) == 1000
    assert len(calls) == 1000, len(calls)


def test_activity_view_of_the_recorded_microbenchmark(store_uri, fixtures_dir, monkeypatch, capsys):
    """One thread block of one thread (the paper's Figure 1): GRACT and nvidia-smi read busy, SMACT ~0.002, SMOCC 0 on GPU 0, the busy one of five."""
    for name, value in PROCESS_ONLY_ENV.items():
        monkeypatch.setenv(name, os.environ.get(name, value))
    files = [str(fixtures_dir / f"microbench_1.1_{f}") for f in ("dcgmi_dmon.txt", "nvidia_smi.csv")]
    assert import_main([*files, "--store", store_uri, "-e", "microbench", "--start", "2023-02-20T10:00:00"]) == 0
    run_id = capsys.readouterr().out.strip()
    _open_store(store_uri)
    exp = MlflowClient(store_uri).get_run(run_id).info.experiment_id
    series, title = activity_series(View([exp], [run_id]), run_id)
    assert "GPU 0" in title
    means = {name: float(np.mean(values[len(values) // 4 : -len(values) // 4])) for name, (_x, values) in series.items()}  # the kernel's middle half
    assert means["gr_engine_active"] > 0.5 and means["utilization_percentage"] > 50, f"the GPU reads busy: {means}"
    assert means["sm_active"] < 0.01 and means["sm_occupancy"] < 0.01, f"while almost no SM works: {means}"
    figure = activity_figure(series, title)
    names = [trace.name.split(" (")[0] for trace in figure.data]
    assert names == ["GRACT", "SMACT", "SMOCC", "nvidia-smi GPU util ÷ 100"]
    assert list(figure.layout.yaxis.range) == [0, 1.02], "one 0-1 axis"
    with pytest.raises(ExportError, match="not in the view's experiments"):
        activity_series(View([exp], [run_id]), "0" * 32)
    MlflowClient(store_uri).set_tag(run_id, "radt.profiler", "ncu-raw")  # the same run, had ncu wrapped it
    _open_store(store_uri)
    assert activity_series(View([exp], [run_id]), run_id)[1] == f"{title} · under ncu-raw", "the paper's figure says it"


def test_a_clusters_jobs_compare_by_partition_and_user_across_the_users_experiments(store_uri):
    """radt import --slurm makes an experiment per user; "SMACT CDF per partition" is one line per partition over all of them."""
    from radt import settings
    from radt.collectors.cluster import slurmimport
    from radt.collectors.diagnose.stored import diagnose_and_store
    from radt.collectors.slurm import slurmacct
    from radt.collectors.store.tracking import connect

    jobs = {  # job -> (user, partition, SMACT): 201's GPU idle all along
        "201": ("alice", "a100", 0.0),
        "202": ("alice", "a100", 0.30),
        "203": ("bob", "a100", 0.50),
        "204": ("bob", "h100", 0.80),
        "205": ("carol", "h100", 0.60),
    }
    lines = "".join(
        f"{job}|{job}|train|{user}|proj|{partition}|2026-11-20T10:00:00|2026-11-20T10:00:05|2026-11-20T11:00:05|COMPLETED|0:0|n1|"
        f"billing=1,gres/gpu=1,node=1|radt-gres=n1>gpu:1(IDX:0)\n"
        for job, (user, partition, _smact) in jobs.items()
    )
    client, writer = connect(store_uri), open_metric_store(store_uri)
    importer = slurmimport.JobImporter(client, store_uri)
    runs = {}
    for job in slurmacct.parse_sacct(lines):
        run_id = runs[job.job_id] = importer.job(job).run_id
        writer.write(run_id, [Point("system/gpu_0_sm_active", jobs[job.job_id][2], job.start_ms + 1000 * i, i) for i in range(10)])
    writer.close()
    diagnose_and_store(client, [runs["201"], runs["205"]])  # as radt import --slurm does for the jobs it found series of
    _open_store(store_uri)
    experiments = sorted({r.info.experiment_id for r in (client.get_run(i) for i in runs.values())})
    assert len(experiments) == 3, "one experiment per user"
    table = comparison_table(View(experiments, list(runs.values())))
    by_run = table[table["kind"] == "run"].set_index("run_id")
    assert by_run.loc[runs["201"], ["partition", "user", "diagnosis"]].tolist() == ["a100", "alice", "idle_gpus"]
    assert by_run.loc[runs["205"], "diagnosis"] == "none" and by_run.loc[runs["204"], "diagnosis"] == "", "diagnosed and clean; never diagnosed"
    # the footprint: its one GPU idle through the job's hour (1 GPU-hour held, all idle), no power series (no energy)
    assert by_run.loc[runs["201"], ["idle_gpu_hours", "cost"]].tolist() == pytest.approx([1.0, settings.GPU_HOUR_PRICE.get()], rel=1e-3)
    assert np.isnan(by_run.loc[runs["201"], "energy_kwh"]) and np.isnan(by_run.loc[runs["204"], "cost"])
    assert by_run.loc[runs["201"], "footprint_basis"].startswith(f"{settings.GRID_INTENSITY.get():g} gCO2eq/kWh")
    figure = cdf_figure(table, "smact_mean", "partition")
    lines_drawn = {t.name: sorted(t.x) for t in figure.data}
    assert set(lines_drawn) == {"a100 (3)", "h100 (2)"}, "a line per partition, each over every user's jobs"
    assert lines_drawn["a100 (3)"] == pytest.approx([0.0, 0.3, 0.5]) and lines_drawn["h100 (2)"] == pytest.approx([0.6, 0.8])
    bars = bar_figure(table, "smact_mean", "user").data
    assert len(bars) == 1 and list(bars[0].x) == ["alice", "bob", "carol"], "one series over every user's experiment"
    assert list(bars[0].y) == pytest.approx([0.15, 0.65, 0.6])
