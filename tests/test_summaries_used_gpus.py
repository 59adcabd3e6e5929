"""Summaries over the GPUs a run used (issue 23), on SQLite and the real PostgreSQL.

The real microbench 131072.1024 logs drive GPU 0 at SMACT ≈ 1 while GPUs 1–4 idle: the table said "SMACT 0.198" and
nothing else, and the filter `smact.mean < 0.3` called the run under-used. Imported logs cannot tell which GPUs the
run's processes used, so every watched GPU counts and the row says so, with the busiest GPU's SMACT beside the mean.
A radt run whose NVML per-process lists show it on GPUs 0 and 2 of four is summarised over those two.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io

import numpy as np
import pytest
from mlflow import MlflowClient

from radt.app.db.store import make_read_engine
from radt.app.export.paper import comparison_table
from radt.app.exportcli import _open_store
from radt.app.summary.compare import RUN_COLUMNS
from radt.app.summary.summaries import PROCESSES, WATCHED, gpu_use, run_summary
from radt.app.view.views import View
from radt.catalogue import Device
from radt.collectors.imports import importer
from radt.collectors.store.stores import open_metric_store
from radt.points import Point
from tests.support.paths import FIXTURES
from tests.support.runs import radt_run

pytestmark = pytest.mark.dialects  # the SQL radt issues differs per dialect: SQLite and the real PostgreSQL

BIG = ["microbench_131072.1024_dcgmi_dmon.txt", "microbench_131072.1024_nvidia_smi.csv"]
START = 1_700_000_000_000
N = 120  # samples of each written series, 1 s apart
SMACT_02 = {0: 0.55, 2: 0.45}  # the 2-of-4 run's busy GPUs; GPUs 1 and 3 sit at 0 (the old mean over four: 0.25)


@dataclasses.dataclass
class Built:
    uri: str
    experiment: str
    runs: dict[str, str]  # label -> run id


def _dmon_column(gpu: int, tag: str) -> np.ndarray:
    """A GPU's column of the real dcgmi log, read by plain splitting."""
    lines = (FIXTURES / BIG[0]).read_text().splitlines()
    col = lines[0].lstrip("#").split().index(tag) + 1  # cells after "GPU n"
    return np.array([float(line.split()[col]) for line in lines if line.startswith(f"GPU {gpu} ")])


def _series(writer, run_id: str, series: dict[str, float | list[float]]) -> None:
    """Each key's value (or values) once a second for N seconds."""
    points = []
    for key, value in series.items():
        values = np.resize(np.asarray(value, dtype=float), N)
        points += [Point(key, float(v), START + 1000 * i, i) for i, v in enumerate(values)]
    writer.write(run_id, points)


def _build(uri: str) -> Built:
    """The microbench logs imported as `radt import` does, and radt runs whose process lists name the GPUs they used."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert importer.main([*(str(FIXTURES / f) for f in BIG), "-e", "microbench", "--start", "2023-02-20T12:00:00", "--store", uri]) == 0
    runs = {"microbench": out.getvalue().split()[-1]}
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("microbench").experiment_id
    writer = open_metric_store(uri)

    runs["two of four"] = radt_run(client, experiment, "two of four", start_time=START)
    busy = {g: g in SMACT_02 for g in range(4)}
    _series(writer, runs["two of four"], {
        **{f"system/gpu_{g}_sm_active": [SMACT_02.get(g, 0.0) - 0.05, SMACT_02.get(g, 0.0) + 0.05] if b else 0.0 for g, b in busy.items()},
        **{f"system/gpu_{g}_sm_occupancy": 0.3 if b else 0.0 for g, b in busy.items()},
        **{f"system/gpu_{g}_gr_engine_active": 0.6 if b else 0.0 for g, b in busy.items()},
        **{f"system/gpu_{g}_power_usage_watts": 300.0 if b else 60.0 for g, b in busy.items()},
        **{f"system/gpu_{g}_process_memory_megabytes": [0.0, 9000.0] if b else 0.0 for g, b in busy.items()},  # the list names the run late
        **{f"system/gpu_{g}_memory_usage_megabytes": 12_000.0 if b else 70_000.0 for g, b in busy.items()},  # another job's GPUs hold 70 GB
    })  # fmt: skip

    runs["ddp"] = radt_run(client, experiment, "ddp", start_time=START)  # two nodes, each radt writing under its node id
    _series(writer, runs["ddp"], {
        **{f"system/{node}/gpu_{g}_sm_active": 0.8 if (node, g) in (("node-a", 0), ("node-b", 1)) else 0.0 for node in ("node-a", "node-b") for g in (0, 1)},
        **{f"system/{node}/gpu_{g}_process_memory_megabytes": 5000.0 if (node, g) in (("node-a", 0), ("node-b", 1)) else 0.0
           for node in ("node-a", "node-b") for g in (0, 1)},
    })  # fmt: skip

    runs["mig"] = radt_run(client, experiment, "mig", start_time=START)  # its slice on GPU 0; GPU 1 watched, not used
    _series(writer, runs["mig"], {
        "system/gpu_0_mig_3_sm_active": 0.7,
        "system/gpu_0_power_usage_watts": 200.0,
        "system/gpu_0_process_memory_megabytes": 4000.0,
        "system/gpu_0_memory_usage_megabytes": 30_000.0,  # the whole GPU: its other slices' jobs too
        "system/gpu_0_mig_3_memory_usage_megabytes": 4_500.0,  # its slice's own
        "system/gpu_1_memory_usage_megabytes": 60_000.0,
        "system/gpu_1_sm_active": 0.0,
        "system/gpu_1_power_usage_watts": 50.0,
        "system/gpu_1_process_memory_megabytes": 0.0,
    })  # fmt: skip

    runs["radT"] = client.create_run(experiment, run_name="radT", start_time=START).info.run_id  # radT's keys: DCGM's 0 W is "no reading"
    _series(writer, runs["radT"], {"DCGMI - Power Usage": [250.0, 0.0, 260.0], "DCGMI - SM Active": [0.4, -1.0]})
    writer.close()
    for run_id in runs.values():
        client.set_terminated(run_id, "FINISHED", end_time=START + N * 1000)
    return Built(uri, experiment, runs)


@pytest.fixture
def built(store_uri, snapshots) -> Built:
    """_build()'s rows in the test's own store (filled once per test run), the dashboard's reads pointed at it through a cache
    that keeps the summaries between a test's filters, as the dashboard's does."""
    from flask import Flask

    from radt.app.view.cache import CACHE, cache_config

    built = dataclasses.replace(snapshots.restore(_build, store_uri), uri=store_uri)
    _open_store(store_uri)
    CACHE.init_app(Flask(__name__), config=cache_config("simple"))
    CACHE.clear()
    return built


@pytest.fixture
def summary(built):
    engine = make_read_engine(built.uri)
    yield run_summary(engine, list(built.runs.values())).set_index("run_id")
    engine.dispose()


def _selected(built: Built, text: str) -> set[str]:
    from radt.app.view import data, filters

    kept = set(filters.apply(data.runs([built.experiment]), text)["run_id"])
    return {label for label, run_id in built.runs.items() if run_id in kept}


# --- the real microbench logs: GPU 0 busy, GPUs 1–4 idle -------------------------------------------------


def test_the_microbench_runs_busy_gpu_shows_beside_the_mean_of_every_watched_gpu(built, summary):
    row = summary.loc[built.runs["microbench"]]
    gpu0 = _dmon_column(0, "SMACT")
    every = np.concatenate([_dmon_column(g, "SMACT") for g in range(5)])
    assert gpu0.mean() > 0.99 and not np.concatenate([_dmon_column(g, "SMACT") for g in range(1, 5)]).any(), "the fixture as the issue tells it"
    assert row.smact_busiest == pytest.approx(gpu0.mean()), "GPU 0's own mean, not 0.198"
    assert row.smact_mean == pytest.approx(every.mean()) == pytest.approx(0.198, abs=1e-3), "imported logs cannot tell: every watched GPU counts"
    assert (row.gpu_basis, row.gpus_watched, row.gpus_used, row.gpus_text) == (WATCHED, 5, 5, "5 watched"), "and the row says so"
    assert row.gract_mean == pytest.approx(np.concatenate([_dmon_column(g, "GRACT") for g in range(5)]).mean())
    assert "microbench" in _selected(built, "smact.busiest > 0.9")
    assert "microbench" not in _selected(built, "smact.busiest < 0.9")


# --- a radt run on two of four GPUs ------------------------------------------------------------------------


def test_a_run_on_two_of_four_gpus_is_summarised_over_those_two(built, summary):
    row = summary.loc[built.runs["two of four"]]
    used = np.concatenate([np.resize([v - 0.05, v + 0.05], N) for v in SMACT_02.values()])
    assert (row.gpu_basis, row.gpus_used, row.gpus_watched, row.gpus_text) == (PROCESSES, 2, 4, "2 of 4 used")
    assert row.smact_mean == pytest.approx(used.mean()) == pytest.approx(0.5), "GPUs 0 and 2, not the four (0.25)"
    assert row.smact_p95 == pytest.approx(np.percentile(used, 95))
    assert row.smact_busiest == pytest.approx(0.55), "GPU 0's mean"
    assert row.smocc_mean == pytest.approx(0.3) and row.smocc_p95 == pytest.approx(0.3)
    assert row.gract_mean == pytest.approx(0.6) and row.power_mean_w == pytest.approx(300.0), "per used GPU, the idle ones' 60 W left out"
    assert row.gpu_memory_peak_mb == pytest.approx(12_000.0), "its GPUs' memory, not the 70 GB of GPUs it only watched"
    assert "two of four" not in _selected(built, "smact.mean < 0.3"), "not under-used: its two GPUs ran at 0.5"
    assert _selected(built, "gpus.used = 2") == {"two of four", "ddp"}
    assert _selected(built, "power.mean > 0.28kW") == {"two of four"}
    assert _selected(built, "gract.mean > 50%") == {"two of four"}


def test_multi_node_runs_and_mig_slices_count_the_gpus_their_processes_used(built, summary):
    ddp, mig = summary.loc[built.runs["ddp"]], summary.loc[built.runs["mig"]]
    assert (ddp.gpu_basis, ddp.gpus_used, ddp.gpus_watched, ddp.gpus_text) == (PROCESSES, 2, 4, "2 of 4 used · 2 nodes")
    assert ddp.smact_mean == pytest.approx(0.8), "node-a's GPU 0 and node-b's GPU 1, each node's idle GPU left out"
    assert (mig.gpu_basis, mig.gpus_used, mig.gpus_watched, mig.gpus_text) == (PROCESSES, 1, 2, "1 of 2 used")
    assert mig.smact_mean == pytest.approx(0.7) and mig.smact_busiest == pytest.approx(0.7), "its slice of GPU 0 stands for GPU 0"
    assert mig.power_mean_w == pytest.approx(200.0), "the whole GPU 0 the slice is on"
    assert mig.gpu_memory_peak_mb == pytest.approx(4_500.0), "its slice's memory: not GPU 0's 30 GB, nor GPU 1's 60 GB"


def test_radTs_no_reading_values_are_no_part_of_a_mean(built, summary):
    old = summary.loc[built.runs["radT"]]
    assert old.power_mean_w == pytest.approx((250.0 + 260.0) / 2), "DCGM's 0 W is an N/A, not a reading"
    assert old.smact_mean == pytest.approx(0.4) and (old.gpu_basis, old.gpus_text) == (WATCHED, "1 watched")


def test_the_comparison_table_says_which_gpus_its_figures_are_over(built):
    table = comparison_table(View([built.experiment], list(built.runs.values())))
    assert {"gpus_text", "smact_busiest", "gract_mean", "power_mean_w", "gpus_used", "gpus_watched", "gpu_basis"} <= set(RUN_COLUMNS) == set(table.columns)
    rows = {row["run"]: row for row in table.to_dict("records")}
    two = rows["two of four"]
    assert (two["gpus_text"], two["gpus_used"], two["gpus_watched"], two["gpu_basis"]) == ("2 of 4 used", 2, 4, PROCESSES)
    assert two["smact_mean"] == pytest.approx(0.5) and two["smact_busiest"] == pytest.approx(0.55) and two["power_mean_w"] == pytest.approx(300.0)
    bench = rows["microbench_131072.1024_dcgmi_dmon"]
    assert bench["gpus_text"] == "5 watched" and bench["smact_busiest"] == pytest.approx(_dmon_column(0, "SMACT").mean())


# --- which GPUs count -----------------------------------------------------------------------------------------


def test_a_node_whose_process_lists_never_named_the_run_counts_every_gpu_it_watched():
    a0, a1, b0, b1 = Device("a", 0), Device("a", 1), Device("b", 0), Device("b", 1)
    mixed = gpu_use([a0, a1, b0, b1], [a0])  # the run's processes held memory on a's GPU 0; b's radt could not match them
    assert (mixed.used, mixed.basis, mixed.text) == ((a0, b0, b1), WATCHED, "3 of 4 used · 2 nodes · b: all watched")
    blind = gpu_use([Device(gpu=0), Device(gpu=1)], [])
    assert (len(blind.used), blind.basis, blind.text) == (2, WATCHED, "2 watched"), "lists that never named the run tell nothing"
    assert gpu_use([], []).text == "" and gpu_use([], []).basis == ""
