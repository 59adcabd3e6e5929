"""`radt export`: a saved view, or runs picked by experiment/workload/run, as PNG, SVG, PDF or CSV."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from radt.app.figures.words import counted
from radt.options import store_parent
from radt.rundir import write_whole
from radt.settings import tracking_uri

if TYPE_CHECKING:
    import pandas as pd

METRICS_LISTED = 8  # the metrics an unknown --metric's message names; the dashboard's list has them all


def export_parser() -> argparse.ArgumentParser:
    from radt.app.export.exportoptions import BY, COLLOCATION, FORMATS, HEIGHT_RANGE, KINDS, LEGENDS, SIZES, STATS
    from radt.cli import OneLineParser  # mistakes in one line, like the rest of radt

    parser = OneLineParser(
        parents=[store_parent()],
        prog="radt export",
        description="Export a comparison figure or the data behind it: from a view saved in the dashboard (--view), or from runs picked by "
        "--experiment/--workload/--run and --metric.",
    )
    parser.add_argument("--view", type=Path, help="a view saved with the dashboard's 'save view' button (JSON)")
    parser.add_argument("--experiment", action="append", default=[], help="experiment name or id (repeatable)")
    parser.add_argument("--workload", action="append", default=[], help="only runs of this workload (its number or label; repeatable)")
    parser.add_argument("--run", action="append", default=[], help="only this run id (repeatable)")
    parser.add_argument(
        "--metric", action="append", default=[], help="smact, smocc, gract, a catalogue name such as power_usage_watts, or a stored key; repeatable"
    )
    parser.add_argument(
        "--filter",
        help="only the runs this filter keeps, in the dashboard's syntax: words, MLflow's (params.lr = '0.1', metrics.loss < 0.2) "
        "or radt's summaries (smact.mean > 0.5)",
    )
    parser.add_argument("--x", choices=("relative", "wall", "step"), help="x axis: time since start (default), wall clock, step")
    parser.add_argument("--grouped", action="store_true", help="one mean line and min-max band per workload")
    parser.add_argument("--gpu", action="append", default=[], help="only this GPU index (repeatable; default every GPU the runs used)")
    parser.add_argument("--gpu-mean", action="store_true", help="per run, the mean across its GPUs with a min-max band instead of a line per GPU")
    parser.add_argument("--format", choices=FORMATS, help="default: the suffix of -o")
    parser.add_argument("--size", choices=tuple(SIZES), default="double-column", help="single-column (3.5 in), double-column (7 in), slide (16:9)")
    parser.add_argument(
        "--height", type=float, help=f"figure height in inches ({HEIGHT_RANGE[0]:g}-{HEIGHT_RANGE[1]:g}; default: what the charts need, at most 9)"
    )
    parser.add_argument(
        "--figure",
        choices=("timeseries", *KINDS, COLLOCATION, "activity"),
        default="timeseries",
        help="timeseries: the charts over time (default); bar, box, cdf: a per-run statistic (--stat) by workload, collocation method, Slurm partition or user (--by), "
        "per command; collocation: throughput ÷ the same command alone and GPU SMACT per collocation method, per command; "
        "activity: GRACT vs SMACT vs SMOCC of one run (the first, or --run)",
    )
    parser.add_argument(
        "--by",
        choices=tuple(BY),
        default="workload",
        help="group bar/box/cdf figures by workload (default), collocation method, or a Slurm job's partition or user (one series over every experiment)",
    )
    parser.add_argument("--stat", choices=tuple(STATS), default="smact_mean", help="the per-run statistic of bar/box/cdf figures (default smact_mean)")
    parser.add_argument("--font-size", type=float, default=9.0, help="points (default 9)")
    parser.add_argument("--mono", "--monochrome", action="store_true", help="monochrome (the export panel's word): dash styles and markers instead of colours")
    parser.add_argument("--legend", choices=LEGENDS, default="top")
    parser.add_argument("--dpi", type=int, default=300, help="PNG resolution (default 300)")
    parser.add_argument(
        "--table",
        action="store_true",
        help="CSV of the comparison table (per run, and runs that ran together against the same runs alone) instead of the points",
    )
    parser.add_argument("-o", "--output", type=Path, required=True, help="file to write")
    return parser


def main(argv: list[str]) -> int:
    opts = export_parser().parse_args(argv)
    fmt = opts.format or opts.output.suffix.lstrip(".").lower()
    from radt.app.export.exportoptions import FORMATS, ExportError, ExportStyle, check_style

    if fmt not in FORMATS:
        print(f"radt export: cannot tell the format of '{opts.output}'; give --format {'/'.join(FORMATS)} or an output ending in one", file=sys.stderr)
        return 2
    problem = _output_problem(opts.output, fmt)
    if problem:  # before the store is read and the figure drawn (seconds): a typo in the folder costs nothing
        print(f"radt export: {problem}", file=sys.stderr)
        return 2
    if not opts.view and not opts.experiment:
        print(
            "radt export: say what to export: --view view.json (saved in the dashboard) or --experiment NAME [--workload W] [--metric smact]", file=sys.stderr
        )
        return 2
    try:
        style = check_style(ExportStyle(opts.size, opts.font_size, opts.mono, opts.legend, opts.dpi, height=opts.height))
        if opts.figure != "timeseries" and (opts.table or fmt == "csv"):
            raise ExportError(f"--figure {opts.figure} draws a PNG, SVG or PDF; give an output ending in one of those")
        _open_store(tracking_uri(opts.store))
        view = _view(opts)
        if opts.table:
            if fmt != "csv":
                raise ExportError("--table writes CSV; give an output ending in .csv")
            from radt.app.export.paper import comparison_table
            from radt.app.export.tables import table_csv

            write_whole(opts.output, table_csv(comparison_table(view)) or "")  # whole: a failed write leaves no half a file
        elif fmt == "csv":
            from radt.app.export.tables import data_csv

            text, missing = data_csv(view)
            _warn_missing(missing)
            write_whole(opts.output, text)
        else:
            from radt.app.export.image import chromium, image_bytes
            from radt.app.export.paper import figure_for

            chromium()  # before reading the store: say at once when no browser can draw it
            if opts.figure == "timeseries":
                figure, missing = figure_for(view, style)
                _warn_missing(missing)
            else:
                from radt.app.export.paper import comparison_figure

                figure = comparison_figure(view, style, opts.figure, opts.stat, opts.by, opts.run[0] if opts.run else None)
            write_whole(opts.output, image_bytes(figure, fmt, opts.dpi))
    except (ExportError, ValueError) as exc:
        print(f"radt export: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the disk filled, the folder went away while the figure was drawn
        print(f"radt export: cannot write {opts.output} ({exc.strerror or exc}); give another --output", file=sys.stderr)
        return 1
    print(f"radt export: wrote {opts.output} ({fmt.upper()}, {counted(len(view.runs), 'run')})", file=sys.stderr)
    return 0


def _output_problem(path: Path, fmt: str) -> str | None:
    """Why the output cannot be written where it is asked for (a folder, a folder that does not exist or is not ours), else None."""
    folder = path.parent
    try:
        if path.is_dir():
            return f"'{path}' is a folder; give a file in it, e.g. {path / f'figure.{fmt}'}"
        if not folder.is_dir():
            return f"the folder {folder} does not exist; create it (mkdir -p {folder}) or give a file in an existing folder"
    except OSError as exc:  # a folder on the way that is not ours to read (Python 3.11's is_dir raises it)
        return f"cannot reach {path} ({exc.strerror or exc}); give a file in a folder you can write"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write in {folder} (permission denied); give a file in a folder you can write"
    return None


def _open_store(uri: str) -> None:
    """The dashboard's read engine and a cache that keeps nothing (one export, one read)."""
    from flask import Flask

    from radt.app.db.state import STATE, connect_store
    from radt.app.export.exportoptions import ExportError
    from radt.app.view.cache import CACHE

    CACHE.init_app(Flask("radt-export"), config={"CACHE_TYPE": "NullCache", "CACHE_NO_NULL_WARNING": True})
    connect_store(uri)
    if STATE.error:
        raise ExportError(STATE.error)


def _view(opts: argparse.Namespace):
    """The view to export: the saved one (narrowed by --metric/--x/--grouped), or one built from the run picks."""
    from radt.app.export.exportoptions import ExportError
    from radt.app.view import data
    from radt.app.view.views import View, load_view, metric_spec

    table = None  # the experiments' runs, where they were read for the run picks
    if opts.view:
        view = load_view(opts.view)
        for note in view.notes:  # a view file edited by hand: what of it cannot be drawn
            print(f"radt export: {opts.view}: {note}", file=sys.stderr)
    else:
        experiments = [_experiment_id(name) for name in opts.experiment]
        table = data.runs(experiments)
        if opts.workload:
            table = table[[_workload_matches(label, wid, opts.workload) for label, wid in zip(table["workload_label"], table["workload_id"], strict=False)]]
        if opts.run:
            table = table[table["run_id"].isin(opts.run)]
        if table.empty:
            raise ExportError(
                f"no runs in experiment {', '.join(opts.experiment)}"
                + (f" workload {', '.join(opts.workload)}" if opts.workload else "")
                + "; check the names in the dashboard"
            )
        view = View(experiments, list(table["run_id"]))
    if opts.filter:
        view.runs = _filtered(view, opts.filter, table)
    if opts.metric:
        view.metrics = [metric_spec(m) for m in opts.metric]
        _check_metrics(opts.metric, view.metrics, view.runs)
    if opts.x:
        view.x = opts.x
    if opts.grouped:
        view.mode = "grouped"
    if opts.gpu:
        bad = [g for g in opts.gpu if not g.strip().isdigit()]
        if bad:
            raise ExportError(f"--gpu {bad[0]} is not a GPU index; give the index the dashboard shows, e.g. --gpu 0")
        view.gpus = sorted({int(g) for g in opts.gpu})
    if opts.gpu_mean:
        view.gpu_mode = "mean"
    return view


def _filtered(view, text: str, table: pd.DataFrame | None) -> list[str]:
    """The view's runs that the dashboard's run filter `text` keeps (on `table`, the runs already read, or the view's
    experiments' runs); ExportError where it cannot be read or keeps none."""
    from radt.app.export.exportoptions import ExportError
    from radt.app.view import data
    from radt.app.view.filters import FilterError, apply

    try:
        kept = set(apply(data.runs(view.experiments) if table is None else table, text)["run_id"])
    except FilterError as exc:
        raise ExportError(f"--filter: {exc}") from None
    runs = [r for r in view.runs if r in kept]
    if not runs:
        raise ExportError(f"--filter {text[:80]!r} keeps none of the {counted(len(view.runs), 'run')}; try it in the dashboard's filter box")
    return runs


def _check_metrics(names: list[str], specs: list[str], run_ids: list[str]) -> None:
    """A --metric that none of the runs stored is a typo: refused before anything is written, naming the metrics they have."""
    from radt.app.db.runs import keys_by_run, present_metrics
    from radt.app.db.series import own_keys
    from radt.app.db.state import STATE
    from radt.app.export.exportoptions import ExportError

    keys = keys_by_run(STATE.engine, run_ids)
    stored = set().union(*keys.values())
    catalogued = list(dict.fromkeys(name for name, _gpu in present_metrics(STATE.engine, run_ids, keys=keys)))
    for name, spec in zip(names, specs, strict=True):
        kind, _, metric = spec.partition(":")
        if metric in (catalogued if kind == "cat" else stored):
            continue
        have = catalogued + own_keys(stored)
        listed = ", ".join(have[:METRICS_LISTED]) + (f" and {len(have) - METRICS_LISTED} more" if len(have) > METRICS_LISTED else "")
        raise ExportError(
            f"--metric {name}: none of the {len(run_ids)} run(s) stored it; give one they have ({listed or 'none'}), "
            "as the dashboard's metric list names them; nothing written"
        )


def _workload_matches(label: str, workload_id: str, wanted: list[str]) -> bool:
    """--workload 2 picks "workload 2" and "workload 2 same GPU" (a CSV's Workload, then its note), or the parent run's id."""
    name = str(label).removeprefix("workload ")
    return any(w.strip() in (name, str(workload_id)) or name.startswith(f"{w.strip()} ") for w in wanted)


def _experiment_id(name: str) -> str:
    from radt.app.db.runs import list_experiments
    from radt.app.db.state import STATE
    from radt.app.export.exportoptions import ExportError

    for exp in list_experiments(STATE.engine):
        if name in (str(exp["experiment_id"]), exp["name"]):
            return str(exp["experiment_id"])
    raise ExportError(f"no experiment '{name}' in this store; give its name or id as the dashboard lists it")


def _warn_missing(missing: dict[str, list[str]]) -> None:
    for spec, names in missing.items():
        print(f"radt export: {spec.partition(':')[2]} is absent from {len(names)} run(s), exported without them: {', '.join(names)}", file=sys.stderr)
