"""`radt report`: a report per run or Slurm job that a cluster team can mail (issue 54), on SQLite and the real PostgreSQL.

The runs are the real tool logs imported as `radt import` does: the 1.1 microbenchmark (one thread block of one thread:
GRACT ~0.9, SMACT ~0.002 on GPU 0) and the 131072.1024 one (GPU 0 busy), each with GPUs 1-4 idle, and the MNIST
dmon log with its GPUs' power. Every figure the tests check is computed here from the logs themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import time
from datetime import datetime, timedelta

import numpy as np
import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from radt import cli, mlflowdb
from radt.collectors.cluster.slurmimport import job_tags
from radt.collectors.imports import importer
from radt.collectors.slurm.slurmacct import Job
from radt.diagnosis import FITS_SMALLER, IDLE_GPUS, LABELS, NO_TENSOR_CORES, SMALL_KERNELS
from radt.runmodel import DIAGNOSIS_PREFIX, DIAGNOSIS_TAG, FOOTPRINT_PREFIX
from tests.support.paths import FIXTURES

pytestmark = pytest.mark.dialects  # the selection's SQL (users, Slurm tags, spans) differs per dialect

SMALL = ["microbench_1.1_dcgmi_dmon.txt", "microbench_1.1_nvidia_smi.csv"]
BIG = ["microbench_131072.1024_dcgmi_dmon.txt", "microbench_131072.1024_nvidia_smi.csv"]
MNIST = ["mnist_dcgmi_dmon_18fields.txt"]
BASIS = {"RADT_GRID_INTENSITY": "250", "RADT_PUE": "1.5", "RADT_GPU_HOUR_PRICE": "3", "RADT_CURRENCY": "EUR"}
INTENSITY, PUE, PRICE = 250.0, 1.5, 3.0
MIB_MB = 1.048576  # MB (10^6 bytes) per MiB: nvidia-smi's unit and radt's
A100 = "NVIDIA A100-SXM4-40GB"
JOB = Job(
    job_id="4242",
    raw_id="4242",
    name="train-resnet",
    user="bob",
    account="physics",
    partition="gpu-a100",
    submit_ms=None,
    start_ms=None,
    end_ms=None,
    state="COMPLETED",
    exit_code=0,
    signal=0,
    nodes=("node-7",),
    gpus_requested=5,
    gpus={"node-7": (0, 1, 2, 3, 4)},
)


@dataclasses.dataclass
class Built:
    uri: str
    runs: dict[str, str]  # label -> run id


def _import(uri: str, files: list[str], experiment: str, start: str, user: str, *name: str) -> str:
    """`radt import FILES -e EXPERIMENT --start START [-n NAME]` as USER; the new run's id."""
    import os

    os.environ["LOGNAME"] = user  # whom getpass (and so MLflow's user_id) names
    out = io.StringIO()
    argv = [*(str(FIXTURES / f) for f in files), "-e", experiment, "--start", start, "--store", uri, *(("-n", *name) if name else ())]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert importer.main(argv) == 0
    return out.getvalue().split()[-1]


def _build(uri: str) -> Built:
    """The real logs imported by three users, a Slurm job's facts on one of them, and a run of two hours ago."""
    import os

    os.environ.update(BASIS)  # a diagnosis stored at import (should imports keep one) uses the tests' basis too
    runs = {
        "small": _import(uri, SMALL, "microbench", "2023-02-20T12:00:00", "ops"),
        "big": _import(uri, BIG, "microbench", "2023-02-20T13:00:00", "ops"),
        "mnist": _import(uri, MNIST, "mnist", "2023-02-21T15:17:00", "alice"),  # on a 10-second boundary: whole buckets
        "job": _import(uri, SMALL, "slurm-bob", "2023-02-22T09:00:00", "ops", JOB.name),  # imported by ops, the job is bob's
        "recent": _import(uri, SMALL, "recent", (datetime.now() - timedelta(hours=2)).replace(microsecond=0).isoformat(), "carol"),
    }
    client = MlflowClient(uri)
    for key, value in job_tags(JOB).items():
        client.set_tag(runs["job"], key, value)
    return Built(uri, runs)


@pytest.fixture
def built(store_uri, snapshots, monkeypatch) -> Built:
    for name, value in BASIS.items():
        monkeypatch.setenv(name, value)
    return dataclasses.replace(snapshots.restore(_build, store_uri), uri=store_uri)


def _report(capsys, *argv: str) -> tuple[int, str, str]:
    """`radt report ARGV...` as the command line runs it: (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = cli.main(["report", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# --- reading the fixture and the report --------------------------------------------------------------------------------


def _dmon(name: str, gpu: int, field: str) -> np.ndarray:
    """A GPU's column of a real dcgmi dmon log (N/A left out), read by plain splitting."""
    lines = (FIXTURES / name).read_text().splitlines()
    col = lines[0].lstrip("#").split().index(field) + 1  # cells after "GPU n"
    cells = [line.split()[col] for line in lines if line.startswith(f"GPU {gpu} ")]
    return np.array([float(c) for c in cells if c != "N/A"])


def _smi_used_mib(name: str, gpu: int, gpus: int = 5) -> np.ndarray:
    """A GPU's memory.used column (MiB) of a real nvidia-smi CSV without an index column (GPUs in order per sample)."""
    rows = (FIXTURES / name).read_text().splitlines()[1:]
    return np.array([float(row.split(",")[-1].split()[0]) for row in rows[gpu::gpus]])


def _span_s(name: str) -> float:
    """A dmon log's span at its 1-second interval: its first sample to its last."""
    return len(_dmon(name, 0, "SMACT")) - 1.0


def _blocks(text: str) -> dict[str, list[str]]:
    """A text report's sections: title -> its lines (the title's underline left out)."""
    out: dict[str, list[str]] = {}
    for block in text.strip("\n").split("\n\n"):
        lines = block.splitlines()
        if len(lines) >= 2 and set(lines[1]) <= {"-", "="} and lines[1]:
            out[lines[0]] = lines[2:]
    return out


def _reports(text: str) -> list[str]:
    """A text report of several runs: each run's part, then the summary's."""
    return text.split("\n" + "=" * 100 + "\n")


def _section(text: str, start: str) -> list[str]:
    found = [lines for title, lines in _blocks(text).items() if title.startswith(start)]
    assert len(found) == 1, f"one section {start!r} in:\n{text}"
    return found[0]


def _pairs(lines: list[str]) -> dict[str, str]:
    return {m.group(1): m.group(2) for line in lines if (m := re.match(r"^  ([^:*-][^:]*):\s+(.*)$", line))}


def _table(lines: list[str]) -> dict[str, dict[str, str]]:
    """The GPU table: GPU label -> column -> cell (columns split on two or more spaces)."""
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines if line.startswith("  ") and not line.strip().startswith("Not recorded")]
    head, body = rows[0], rows[1:]
    return {row[0]: dict(zip(head, row)) for row in body}


def _number(text: str) -> float:
    return float(re.match(r"^[\d.]+(?:e-?\d+)?", text).group(0))


def _findings(lines: list[str]) -> dict[str, str]:
    """Findings section: label -> its sentence and action, wrapped lines joined."""
    out: dict[str, str] = {}
    label = None
    for line in lines:
        if line.startswith("  * "):
            label, _, rest = line[4:].partition(": ")
            out[label] = rest
        elif label is not None:
            out[label] += " " + line.strip()
    return out


# --- one run ------------------------------------------------------------------------------------------------------------


def test_the_small_kernel_microbenchmark_reports_its_findings_gpus_and_figures(built, capsys):
    code, out, err = _report(capsys, built.runs["small"], "--store", built.uri)
    assert code == 0, err
    name, span = SMALL[0], _span_s(SMALL[0])
    head = _pairs(_section(out, "Run microbench_1.1_dcgmi_dmon"))
    assert built.runs["small"] in out.splitlines()[0]
    assert head["Experiment"] == "microbench" and head["User"] == "ops" and head["State"] == "FINISHED"
    assert head["Start"] == datetime.fromisoformat("2023-02-20T12:00:00").astimezone().strftime("%Y-%m-%d %H:%M:%S %z")
    assert head["Duration"] == f"00:00:{span:02.0f}"
    assert head["GPUs"].startswith("5: 4 × NVIDIA A100-SXM4-40GB (40 GB)"), "the models and sizes nvidia-smi named"

    gpus = _table(_section(out, "GPU activity"))
    assert set(gpus) == {f"GPU {g}" for g in range(5)}
    gpu0 = gpus["GPU 0"]
    assert gpu0["Model"] == A100 and gpu0["Memory"] == "40 GB"
    assert _number(gpu0["SMACT"]) == pytest.approx(_dmon(name, 0, "SMACT").mean(), abs=5e-4)
    assert _number(gpu0["GRACT"]) == pytest.approx(_dmon(name, 0, "GRACT").mean(), abs=5e-3)
    assert _number(gpu0["GPU util"]) == pytest.approx(_dmon(name, 0, "GPUTL").mean(), abs=0.5)
    assert _number(gpu0["Memory peak"]) == pytest.approx(_smi_used_mib(SMALL[1], 0).max() * MIB_MB / 1000, abs=5e-3)
    assert "Power" not in gpu0 and "power" in _section(out, "GPU activity")[-1], "no power in these logs, and the report says so"

    figures = _pairs(_section(out, "Energy"))
    gpu_hours = 5 * span / 3600
    idle = sum(not _dmon(name, g, "GRACT").any() for g in range(5))
    assert idle == 4, "the fixture as its README tells it: GPUs 1-4 idle"
    assert _number(figures["GPU-hours"]) == pytest.approx(gpu_hours, rel=1e-3)
    assert _number(figures["Idle GPU-hours"]) == pytest.approx(idle * span / 3600, rel=1e-3)
    assert _number(figures["Cost"]) == pytest.approx(gpu_hours * PRICE, rel=1e-3) and figures["Cost"].endswith("EUR")
    assert figures["Energy"].startswith("not recorded")
    assert figures["Basis"] == "250 gCO2eq/kWh, PUE 1.5, 3 EUR per GPU-hour"

    findings = _findings(_section(out, "Findings"))
    assert set(findings) == {LABELS[IDLE_GPUS], LABELS[SMALL_KERNELS], LABELS[FITS_SMALLER]}, "0.4 GB of 40 GB, SMACT ~0: a 1g.5gb slice"
    assert "GPU 1 100%, GPU 2 100%, GPU 3 100%, GPU 4 100%" in findings[LABELS[IDLE_GPUS]]
    assert "What to do: a larger batch" in findings[LABELS[SMALL_KERNELS]], "each finding with its action"
    assert any("input_starved (no CPU series)" in line for line in _section(out, "Not judged"))


def test_the_busy_microbenchmark_reports_gpu_0s_activity_and_no_small_kernels(built, capsys):
    code, out, err = _report(capsys, built.runs["big"], "--store", built.uri)
    assert code == 0, err
    name, span = BIG[0], _span_s(BIG[0])
    gpu0 = _table(_section(out, "GPU activity"))["GPU 0"]
    assert _number(gpu0["SMACT"]) == pytest.approx(_dmon(name, 0, "SMACT").mean(), abs=5e-3)
    assert _number(gpu0["SMOCC"]) == pytest.approx(_dmon(name, 0, "SMOCC").mean(), abs=5e-3)
    assert _number(gpu0["Tensor"]) == pytest.approx(_dmon(name, 0, "TENSO").mean(), abs=5e-4)
    assert _number(gpu0["DRAM"]) == pytest.approx(_dmon(name, 0, "DRAMA").mean(), abs=5e-3)
    assert _number(gpu0["Memory peak"]) == pytest.approx(_smi_used_mib(BIG[1], 0).max() * MIB_MB / 1000, abs=5e-3)
    assert _pairs(_section(out, "Run "))["Duration"] == time.strftime("%H:%M:%S", time.gmtime(span))
    figures = _pairs(_section(out, "Energy"))
    assert _number(figures["GPU-hours"]) == pytest.approx(5 * span / 3600, rel=1e-3)
    assert _number(figures["Idle GPU-hours"]) == pytest.approx(4 * span / 3600, rel=1e-3)
    findings = _findings(_section(out, "Findings"))
    assert set(findings) == {LABELS[IDLE_GPUS], LABELS[NO_TENSOR_CORES]}, "SMACT 0.99: no small kernels"


def test_energy_and_carbon_come_from_the_recorded_power_with_the_basis_they_used(built, capsys):
    code, out, err = _report(capsys, built.runs["mnist"], "--store", built.uri)
    assert code == 0, err
    name = MNIST[0]
    joules = sum(_dmon(name, g, "POWER").sum() * 1.0 for g in range(5))  # 1-second samples
    kwh = joules / 3.6e6
    figures = _pairs(_section(out, "Energy"))
    assert _number(figures["Energy"]) == pytest.approx(kwh, rel=1e-3) and "kWh" in figures["Energy"]
    assert _number(figures["CO2eq"]) == pytest.approx(kwh * PUE * INTENSITY / 1000, rel=1e-3) and "kg" in figures["CO2eq"]
    assert figures["Basis"] == "250 gCO2eq/kWh, PUE 1.5, 3 EUR per GPU-hour"
    gpus = _table(_section(out, "GPU activity"))
    for g in range(5):
        watts = _dmon(name, g, "POWER")
        assert gpus[f"GPU {g}"]["Power"] == (f"{watts.mean():.0f} W" if len(watts) else "-"), "a GPU whose power reads N/A shows none"


def test_a_stored_diagnosis_is_reported_with_the_basis_it_was_figured_with(built, capsys, monkeypatch):
    run = built.runs["mnist"]
    assert cli.main(["diagnose", run, "--store", built.uri]) == 0  # kept on the run under PUE 1.5
    monkeypatch.setenv("RADT_PUE", "2.0")
    code, out, err = _report(capsys, run, "--store", built.uri)
    assert code == 0, err
    figures = _pairs(_section(out, "Energy"))
    assert figures["Basis"] == "250 gCO2eq/kWh, PUE 1.5, 3 EUR per GPU-hour", "the figures' own basis, not today's settings"
    assert _number(figures["CO2eq"]) == pytest.approx(_number(figures["Energy"]) * PUE * INTENSITY / 1000, rel=2e-3)
    assert "stored on the run" in [t for t in _blocks(out) if t.startswith("Findings")][0]


def test_runs_without_a_diagnosis_are_diagnosed_for_the_report_and_nothing_is_written(built, capsys):
    client = MlflowClient(built.uri)
    bench = [built.runs["small"], built.runs["big"]]
    for run in bench:  # as runs recorded before radt diagnosed them are
        for key in client.get_run(run).data.tags:
            if key == DIAGNOSIS_TAG or key.startswith((DIAGNOSIS_PREFIX, FOOTPRINT_PREFIX)):
                client.delete_tag(run, key)
    engine = sa.create_engine(built.uri)
    t = mlflowdb.tags.c

    def tags() -> list[tuple]:
        with engine.connect() as conn:
            return sorted(conn.execute(sa.select(t.run_uuid, t.key, t.value)).all())

    before = tags()
    code, out, err = _report(capsys, "--experiment", "microbench", "--store", built.uri)
    after = tags()
    engine.dispose()
    assert code == 0, err
    assert after == before, "no diagnosis, footprint or any other tag written"
    small, big, _summary = _reports(out)
    for part in (small, big):
        assert any(title.startswith("Findings (diagnosed for this report, not stored") for title in _blocks(part))
    assert set(_findings(_section(small, "Findings"))) == {LABELS[IDLE_GPUS], LABELS[SMALL_KERNELS], LABELS[FITS_SMALLER]}
    assert set(_findings(_section(big, "Findings"))) == {LABELS[IDLE_GPUS], LABELS[NO_TENSOR_CORES]}
    figures = _pairs(_section(small, "Energy"))
    assert _number(figures["GPU-hours"]) == pytest.approx(5 * _span_s(SMALL[0]) / 3600, rel=1e-3)
    assert figures["Basis"] == "250 gCO2eq/kWh, PUE 1.5, 3 EUR per GPU-hour", "today's settings: the footprint made now"


# --- several runs, Markdown, the selections --------------------------------------------------------------------------------


def test_several_runs_are_reported_one_after_another_then_summed_up(built, capsys):
    code, out, err = _report(capsys, "--experiment", "microbench", "--store", built.uri)
    assert code == 0, err
    titles = [title for title in _blocks(out) if title.startswith("Run ")]
    assert [t.split()[1] for t in titles] == ["microbench_1.1_dcgmi_dmon", "microbench_131072.1024_dcgmi_dmon"], "oldest first"
    summary = _pairs(_section(out, "Summary of 2 runs"))
    spans = [_span_s(SMALL[0]), _span_s(BIG[0])]
    assert summary["Runs"].startswith("2")
    assert _number(summary["GPU-hours"]) == pytest.approx(5 * sum(spans) / 3600, rel=1e-3)
    assert _number(summary["Idle GPU-hours"]) == pytest.approx(4 * sum(spans) / 3600, rel=1e-3)
    assert summary["Energy"].startswith("not recorded")
    assert summary["Most common findings"].startswith(f"{LABELS[IDLE_GPUS]} (2 runs)")
    assert f"{LABELS[SMALL_KERNELS]} (1)" in summary["Most common findings"]


def test_markdown_renders_the_gpus_as_a_table(built, capsys, tmp_path):
    target = tmp_path / "report.md"
    code, out, err = _report(capsys, built.runs["small"], built.runs["mnist"], "--format", "markdown", "--output", str(target), "--store", built.uri)
    assert code == 0, err
    assert out == "" and str(target) in err
    text = target.read_text()
    assert text.startswith("## Run microbench_1.1_dcgmi_dmon")
    header = next(line for line in text.splitlines() if line.startswith("| GPU |"))
    lines = text.splitlines()
    at = lines.index(header)
    assert re.fullmatch(r"\|( --- \|)+", lines[at + 1]), "a Markdown table's rule"
    rows = [line for line in lines[at + 2 : at + 8] if line.startswith("| GPU ")]
    assert len(rows) == 5 and f"| {A100} |" in rows[0]
    assert f"- **{LABELS[SMALL_KERNELS]}:**" in text and "## Summary of 2 runs" in text


def test_user_selects_the_runs_of_that_user_and_the_jobs_of_that_slurm_user(built, capsys):
    code, out, err = _report(capsys, "--user", "alice", "--store", built.uri)
    assert code == 0, err
    assert [t for t in _blocks(out) if t.startswith(("Run ", "Job "))] == [f"Run mnist_dcgmi_dmon_18fields ({built.runs['mnist']})"]

    code, out, err = _report(capsys, "--user", "bob", "--store", built.uri)
    assert code == 0, err
    title, lines = next((t, lines) for t, lines in _blocks(out).items() if t.startswith("Job "))
    assert title == f"Job 4242 train-resnet ({built.runs['job']})" and len([t for t in _blocks(out) if t.startswith(("Run ", "Job "))]) == 1
    head = _pairs(lines)
    assert (head["User"], head["Account"], head["Partition"], head["Node"]) == ("bob", "physics", "gpu-a100", "node-7")
    assert head["State"] == "COMPLETED (exit code 0:0)"

    code, out, err = _report(capsys, "--user", "carol", "--since", "7d", "--store", built.uri)
    assert code == 0, err
    assert [t for t in _blocks(out) if t.startswith("Run ")] == [f"Run microbench_1.1_dcgmi_dmon ({built.runs['recent']})"]
    code, out, err = _report(capsys, "--user", "ops", "--since", "7d", "--store", built.uri)
    assert (code, out) == (0, "") and "no runs" in err and "ops" in err, "ops' runs are from 2023"


# --- mistakes ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, said",
    [
        (["0123456789abcdef0123456789abcdef"], "run '0123456789abcdef0123456789abcdef' not found"),
        (["--user", "mallory"], "no runs of user 'mallory'"),
        (["--experiment", "nothing-here"], "no experiment named 'nothing-here'"),
        ([], "name what to report"),
        (["--since", "soon"], "--since 'soon' is not a span of time"),
    ],
)
def test_a_mistake_is_one_line_with_the_fix(built, capsys, argv, said):
    code, out, err = _report(capsys, *argv, "--store", built.uri)
    assert (code, out) == (2, "")
    assert err.startswith("radt report: ") and said in err and err.count("\n") == 1 and "Traceback" not in err


def test_an_mlflow_server_or_a_missing_file_is_refused_in_one_line(capsys, radt_home, tmp_path):
    code, out, err = _report(capsys, "--user", "ops", "--store", "http://127.0.0.1:5000")
    assert (code, out) == (2, "") and "is an MLflow server" in err and "--store postgresql://" in err and err.count("\n") == 1
    missing = tmp_path / "none.db"
    code, out, err = _report(capsys, "--user", "ops", "--store", f"sqlite:///{missing}")
    assert (code, out) == (2, "") and "no store" in err and err.count("\n") == 1
    assert not missing.exists(), "a report creates no store"


def test_an_output_file_in_a_missing_folder_is_refused_before_anything_is_read(built, capsys, tmp_path):
    code, out, err = _report(capsys, built.runs["small"], "--output", str(tmp_path / "no" / "r.txt"), "--store", built.uri)
    assert (code, out) == (2, "") and "--output" in err and err.count("\n") == 1
    assert not (tmp_path / "no").exists()
