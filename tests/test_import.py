"""`radt import` run as a user runs it, on SQLite (the mnist trio on the real PostgreSQL too), read back with MLflow.

Every real tool log is imported (the mnist trio as one run, each microbench dcgmi + nvidia-smi pair
as one run) and MLflow's own client must read back the values of the files, their timestamps,
monotonic steps, `latest_metrics` equal to the last point of each series, status FINISHED and the
raw files as artifacts. Expected values are read from the files by plain splitting here.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime, time
from pathlib import Path

import mlflow
import pytest

from radt.cli import main as cli_main
from radt.collectors.imports.importer import build_points, left_out_note
from radt.collectors.imports.importer import main as import_main
from radt.collectors.sources.parsers import parse_dcgmi_dmon, parse_nvidia_smi_csv
from radt.collectors.store.tracking import PROCESS_ONLY_ENV
from tests.support.radtproc import radt_env, run_radt
from tests.support.rollupcheck import assert_rollups_cover_raw

MNIST = ["mnist_dcgmi_dmon_18fields.txt", "mnist_nvidia_smi.csv", "mnist_top_batch.txt"]
MICROBENCH = ["1.1", "128.32", "1024.1024", "131072.1024"]
GPUS = range(5)
MIB_IN_MB = 1.048576
RUN_ID = re.compile(r"^[0-9a-f]{32}$")


def _ms(moment: datetime) -> int:
    return int(round(moment.timestamp() * 1000))


def _smi(path: Path) -> tuple[list[str], list[list[str]]]:
    lines = path.read_text().splitlines()
    header = [c.strip().split(" [")[0] for c in lines[0].split(",")]
    return header, [[c.strip() for c in line.split(",")] for line in lines[1:] if line.strip()]


def _smi_column(path: Path, gpu: int, column: str) -> list[float]:
    header, rows = _smi(path)
    return [float(r[header.index(column)].split()[0]) for r in rows[gpu :: len(GPUS)]]


def _dmon_column(path: Path, gpu: int, tag: str) -> list[float | None]:
    lines = path.read_text().splitlines()
    col = lines[0].lstrip("#").split().index(tag) + 1  # cells after "GPU n"
    cells = [line.split()[col] for line in lines if line.startswith(f"GPU {gpu} ")]
    return [None if c == "N/A" else float(c) for c in cells]


def _import(fixtures_dir: Path, files: list[str], home: Path, store: str, cwd: Path, *options: str):
    return run_radt(["import", *(str(fixtures_dir / f) for f in files), *options], radt_env(home, store), cwd)


def _imported_run_id(result) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    run_id = result.stdout.strip()
    assert RUN_ID.match(run_id), f"stdout is the run id alone: {result.stdout!r}"
    return run_id


def _histories(client: mlflow.MlflowClient, run) -> dict[str, list]:
    return {k: client.get_metric_history(run.info.run_id, k) for k in run.data.metrics}


def _check_series_shape(run, histories: dict[str, list]) -> None:
    """Per key: steps 0..n-1 in time order, strictly later each step, latest_metrics = last point."""
    assert histories
    for k, history in histories.items():
        history = sorted(history, key=lambda m: (m.timestamp, m.step))
        assert [m.step for m in history] == list(range(len(history))), k
        stamps = [m.timestamp for m in history]
        assert all(a < b for a, b in zip(stamps, stamps[1:])), f"{k}: one point per instant"
        assert run.data.metrics[k] == history[-1].value, f"{k}: latest_metrics is the last point"
    assert sum(map(len, histories.values())) == int(run.data.tags["radt.points"])


def _check_artifacts(client: mlflow.MlflowClient, run_id: str, fixtures_dir: Path, files: list[str], dst: Path) -> None:
    listed = client.list_artifacts(run_id, "imported")
    assert sorted(Path(a.path).name for a in listed) == sorted(files)
    for name in files:
        local = Path(client.download_artifacts(run_id, f"imported/{name}", str(dst)))
        assert local.read_bytes() == (fixtures_dir / name).read_bytes()


# --------------------------------------------------------------------------- mnist: dcgmi + nvidia-smi + top


@pytest.mark.dialects  # the import's PostgreSQL end to end; the microbench pairs take SQLite
def test_import_mnist_trio_as_one_run(store_uri, radt_home, tmp_path, fixtures_dir):
    result = _import(fixtures_dir, MNIST, radt_home, store_uri, tmp_path, "-e", "mnist", "-n", "mnist-cnn")
    run_id = _imported_run_id(result)
    client = mlflow.MlflowClient(store_uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "mnist-cnn"
    assert client.get_experiment(run.info.experiment_id).name == "mnist"
    assert run.data.tags["radt.listeners"] == "dcgmi+nvidia-smi+top"
    assert run.data.params["radt.imported"] == "mnist_dcgmi_dmon_18fields.txt:dcgmi,mnist_nvidia_smi.csv:nvidia-smi,mnist_top_batch.txt:top"
    histories = _histories(client, run)
    _check_series_shape(run, histories)
    _check_artifacts(client, run_id, fixtures_dir, MNIST, tmp_path / "artifacts")
    assert assert_rollups_cover_raw(store_uri, run_id) == sum(len(h) for h in histories.values())  # the real logs' rollups

    dmon, smi, top = (fixtures_dir / f for f in MNIST)
    header, smi_rows = _smi(smi)
    smi_stamps = [_ms(datetime.strptime(r[header.index("timestamp")], "%Y/%m/%d %H:%M:%S.%f")) for r in smi_rows]
    sample_ms = smi_stamps[:: len(GPUS)]  # a sample is stamped with its first GPU line's time
    assert sample_ms[0] == _ms(datetime(2023, 2, 21, 15, 16, 55, 262000))

    # nvidia-smi: its own timestamps, units stripped, MiB -> MB, pstate number
    for gpu in GPUS:
        util = histories[f"system/gpu_{gpu}_utilization_percentage"]
        assert [m.value for m in util] == _smi_column(smi, gpu, "utilization.gpu"), "nvidia-smi's, not dcgmi's GPUTL as well"
        assert [m.timestamp for m in util] == sample_ms
        used = histories[f"system/gpu_{gpu}_memory_usage_megabytes"]
        assert [m.value for m in used] == pytest.approx([v * MIB_IN_MB for v in _smi_column(smi, gpu, "memory.used")])
        assert [m.value for m in histories[f"system/gpu_{gpu}_memory_utilization_percentage"]] == _smi_column(smi, gpu, "utilization.memory")
        assert {m.value for m in histories[f"system/gpu_{gpu}_pstate"]} == ({8.0} if gpu == 3 else {0.0})
    assert histories["system/gpu_0_utilization_percentage"][0].value == 33.0  # dcgmi's GPUTL read 54 then
    assert "also in mnist_nvidia_smi.csv" in result.stderr

    # dcgmi: no timestamps of its own: one a second from the first nvidia-smi timestamp
    anchor = datetime(2023, 2, 21, 15, 16, 55, 262000).timestamp()
    dcgmi_ms = [int(round((anchor + n) * 1000)) for n in range(50)]
    for gpu in GPUS:
        for tag, name in [("GRACT", "gr_engine_active"), ("SMACT", "sm_active"), ("SMOCC", "sm_occupancy"), ("PCITX", "pcie_tx_bytes_per_second")]:
            history = histories[f"system/gpu_{gpu}_{name}"]
            assert [m.value for m in history] == _dmon_column(dmon, gpu, tag), (gpu, tag)
            assert [m.timestamp for m in history] == dcgmi_ms
    assert max(m.value for m in histories["system/gpu_0_gr_engine_active"]) == 0.221
    power = histories["system/gpu_0_power_usage_watts"]
    assert [m.value for m in power] == _dmon_column(dmon, 0, "POWER")
    energy = _dmon_column(dmon, 0, "TOTEC")
    assert [m.value for m in histories["system/gpu_0_energy_joules"]] == pytest.approx([(e - energy[0]) / 1000 for e in energy])
    assert "system/gpu_3_power_usage_watts" not in run.data.metrics and "system/gpu_3_energy_joules" not in run.data.metrics
    assert "system/gpu_3_sm_active" in run.data.metrics

    # top: the clock on the nvidia-smi date, 100 - idle, python's lines summed
    cpu = histories["system/cpu_utilization_percentage"]
    clocks = [line.split()[2] for line in top.read_text().splitlines() if line.startswith("top - ")]
    assert [m.timestamp for m in cpu] == [_ms(datetime.combine(date(2023, 2, 21), time.fromisoformat(c))) for c in clocks]
    assert cpu[0].timestamp == _ms(datetime(2023, 2, 21, 15, 16, 5))
    idle = [float(line.split()[7]) for line in top.read_text().splitlines() if line.startswith("%Cpu(s):")]
    assert [m.value for m in cpu] == pytest.approx([100 - i for i in idle])
    mem = histories["system/system_memory_usage_megabytes"]
    assert mem[0].value == pytest.approx(3349.7 * MIB_IN_MB)
    proc = histories["system/process_cpu_utilization_percentage"]
    assert [m.value for m in proc[:3]] == pytest.approx([88.2, 159.6 + 26.5, 83.1 + 46.2])
    rss = histories["system/process_memory_rss_megabytes"]
    assert rss[1].value == pytest.approx((3.0 + 1.2) * 1024**3 / 1e6)
    assert len(cpu) == 17

    # one series per key, each from one log: 5 nvidia-smi keys and 14 (GPU 3: 12) dcgmi keys per GPU, 6 top keys
    assert len(run.data.metrics) == 5 * 5 + (4 * 14 + 12) + 6
    assert int(run.data.tags["radt.points"]) == 50 * 25 + 50 * 68 + 17 * 6
    assert run.info.start_time == cpu[0].timestamp, "the run starts at its earliest point (top's)"
    assert run.info.end_time == sample_ms[-1], "and ends at its latest (nvidia-smi's)"


# --------------------------------------------------------------------------- microbench: dcgmi + nvidia-smi pairs

OPTIONS = {
    "1.1": ["--start", "2023-02-20T10:00:00"],
    "128.32": ["--start", "2023-02-20T11:00:00", "--interval", "0.5"],
    "1024.1024": ["--gpus", "5"],  # no --start: laid out to end at the file's modification time
    "131072.1024": ["--start", "2023-02-20T12:00:00"],
}


def _pair(fixtures_dir: Path, grid: str) -> list[str]:
    return [str(fixtures_dir / f"microbench_{grid}_dcgmi_dmon.txt"), str(fixtures_dir / f"microbench_{grid}_nvidia_smi.csv")]


def test_import_every_microbench_pair(store_uri, radt_home, tmp_path, fixtures_dir, capsys, monkeypatch):
    """The big pair through the real command; the three small ones through the same entry point in
    this process meanwhile (a subprocess costs seconds of start-up each)."""
    for name, value in PROCESS_ONLY_ENV.items():  # what radt sets in its own process, undone after the test
        monkeypatch.setenv(name, os.environ.get(name, value))
    with ThreadPoolExecutor(1) as pool:
        big = pool.submit(
            run_radt, ["import", *_pair(fixtures_dir, "131072.1024"), "-e", "microbench", *OPTIONS["131072.1024"]], radt_env(radt_home, store_uri), tmp_path
        )
        small = {}
        for grid in ("1.1", "128.32", "1024.1024"):
            assert import_main([*_pair(fixtures_dir, grid), "--store", store_uri, "-e", "microbench", *OPTIONS[grid]]) == 0
            out, err = capsys.readouterr()
            small[grid] = (out.strip(), err)
        result = big.result()
    client = mlflow.MlflowClient(store_uri)
    runs = {grid: client.get_run(run_id) for grid, (run_id, _) in small.items()}
    runs["131072.1024"] = client.get_run(_imported_run_id(result))
    stderr = {grid: err for grid, (_, err) in small.items()} | {"131072.1024": result.stderr}
    assert all(RUN_ID.match(r.info.run_id) for r in runs.values()) and len({r.info.run_id for r in runs.values()}) == 4
    assert len({r.info.experiment_id for r in runs.values()}) == 1

    for grid, run in runs.items():
        dmon, smi = fixtures_dir / f"microbench_{grid}_dcgmi_dmon.txt", fixtures_dir / f"microbench_{grid}_nvidia_smi.csv"
        assert run.info.status == "FINISHED" and run.info.run_name == f"microbench_{grid}_dcgmi_dmon"
        assert len(run.data.metrics) == 5 * 9, "7 dmon fields and 2 more nvidia-smi series per GPU"
        histories = _histories(client, run)
        _check_series_shape(run, histories)
        for gpu in GPUS:
            for tag, name in [("GRACT", "gr_engine_active"), ("SMACT", "sm_active"), ("SMOCC", "sm_occupancy"), ("GPUTL", "utilization_percentage")]:
                assert [m.value for m in histories[f"system/gpu_{gpu}_{name}"]] == _dmon_column(dmon, gpu, tag), (grid, gpu, tag)
            used = histories[f"system/gpu_{gpu}_memory_usage_megabytes"]
            assert [m.value for m in used] == pytest.approx([v * MIB_IN_MB for v in _smi_column(smi, gpu, "memory.used")])
        assert "kept those of " + dmon.name in stderr[grid], "neither log has timestamps: the first named wins"

        sm = histories["system/gpu_0_sm_active"]
        mem = histories["system/gpu_0_memory_usage_megabytes"]
        interval = 500 if grid == "128.32" else 1000
        if "--start" in OPTIONS[grid]:
            start = _ms(datetime.fromisoformat(OPTIONS[grid][1]))
            assert [m.timestamp for m in sm] == [start + interval * n for n in range(len(sm))]
            assert [m.timestamp for m in mem] == [start + interval * n for n in range(len(mem))]
            assert run.info.start_time == start
        else:
            assert sm[-1].timestamp == int(round(dmon.stat().st_mtime * 1000))
            assert mem[-1].timestamp == int(round(smi.stat().st_mtime * 1000))
            assert [b.timestamp - a.timestamp for a, b in zip(sm, sm[1:])] == [1000] * (len(sm) - 1)
        assert run.info.end_time == max(m.timestamp for h in histories.values() for m in h)
        _check_artifacts(client, run.info.run_id, fixtures_dir, [dmon.name, smi.name], tmp_path / grid)

    one_thread, full = runs["1.1"].data.metrics, runs["131072.1024"].data.metrics
    assert max(m.value for m in client.get_metric_history(runs["1.1"].info.run_id, "system/gpu_0_gr_engine_active")) == 0.911
    assert (one_thread["system/gpu_0_sm_active"], one_thread["system/gpu_0_sm_occupancy"]) == (0.002, 0.0)
    assert (full["system/gpu_0_gr_engine_active"], full["system/gpu_0_sm_active"], full["system/gpu_0_sm_occupancy"]) == (1.0, 0.995, 0.782)
    assert len(client.get_metric_history(runs["131072.1024"].info.run_id, "system/gpu_4_sm_active")) == 802
    assert len(client.get_metric_history(runs["131072.1024"].info.run_id, "system/gpu_4_memory_usage_megabytes")) == 798


# --------------------------------------------------------------------------- user errors


def test_user_errors_are_one_line_and_exit_2(tmp_path, radt_home, fixtures_dir):
    """A missing file and a file that is no tool log, through the real command."""
    store_file = tmp_path / "never.db"
    env = radt_env(radt_home, f"sqlite:///{store_file}")
    cases = {
        "missing": (["import", str(tmp_path / "missing_dcgmi.txt")], "not found"),
        "not a log": (["import", str(fixtures_dir / "mnist_training_stdout.txt")], "is not a dcgmi dmon"),
    }
    with ThreadPoolExecutor(len(cases)) as pool:
        results = dict(zip(cases, pool.map(lambda args: run_radt(args, env, tmp_path), (a for a, _ in cases.values()))))
    for case, result in results.items():
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (case, result.stderr)
        assert len(lines) == 1 and "Traceback" not in result.stderr, (case, result.stderr)
        assert lines[0].startswith("radt import: ") and cases[case][1] in lines[0], (case, lines)
        assert result.stdout == "", case
    assert "missing_dcgmi.txt" in results["missing"].stderr
    assert "mnist_training_stdout.txt" in results["not a log"].stderr
    assert not store_file.exists(), "nothing was written anywhere"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{good}", "{tmp}/nope.csv"], "nope.csv' not found"),  # one good, one missing: nothing imported
        (["{tmp}"], "is a folder; give the dcgmi dmon, nvidia-smi CSV or top -b logs in it"),
        (["{good}", "--start", "yesterday"], "--start 'yesterday' is not an ISO time"),
        (["{good}", "--interval", "0"], "--interval 0.0 must be more than 0"),
        ([], "the following arguments are required: files"),
        (["{good}", "--gpus", "two"], "invalid int value"),
    ],
)
def test_more_user_errors_through_the_cli_entry_point(args, message, tmp_path, radt_home, fixtures_dir, capsys):
    store_file = tmp_path / "never.db"
    argv = ["import", *(a.format(good=fixtures_dir / "mnist_nvidia_smi.csv", tmp=tmp_path) for a in args), "--store", f"sqlite:///{store_file}"]
    try:
        code = cli_main(argv)
    except SystemExit as exc:  # argparse exits
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and message in err and err.startswith("radt import")
    assert not store_file.exists()


# --------------------------------------------------------------------------- layout rules, in process


def test_top_alone_ends_by_its_files_modification_time_and_rolls_over_midnight(tmp_path):
    """top prints the time of day only. Its samples were put on the modification time's date: a log written from 23:59:58
    to 00:00:04 and last modified at 00:00:05 went a day after the file was written, not before it."""
    log = tmp_path / "top.txt"
    log.write_text(
        "top - 23:59:58 up 1 day\n%Cpu(s):  5.0 us,  0.0 sy,  0.0 ni, 95.0 id\n"
        "top - 00:00:01 up 1 day\n%Cpu(s): 10.0 us,  0.0 sy,  0.0 ni, 90.0 id\n"
        "top - 00:00:04 up 1 day\n%Cpu(s): 20.0 us,  0.0 sy,  0.0 ni, 80.0 id\n"
    )
    mtime = datetime(2024, 3, 1, 0, 0, 5).timestamp()
    os.utime(log, (mtime, mtime))
    notes: list[str] = []
    points, formats = build_points([log], 1.0, None, "python", None, notes)
    assert formats == {"top.txt": "top"}
    cpu = [p for p in points if p.key == "system/cpu_utilization_percentage"]
    assert [(p.step, p.value) for p in cpu] == [(0, 5.0), (1, 10.0), (2, 20.0)]
    assert [p.timestamp for p in cpu] == [
        _ms(datetime(2024, 2, 29, 23, 59, 58)),
        _ms(datetime(2024, 3, 1, 0, 0, 1)),
        _ms(datetime(2024, 3, 1, 0, 0, 4)),
    ]
    assert notes == [
        "top.txt: top's clock has no date; dated 2024-02-29 23:59:58 to 2024-03-01 00:00:04, to end by the file's modification "
        "time 2024-03-01 00:00:05; if it was recorded on another day, give --start with that day, e.g. --start 2024-02-29T23:59:58"
    ]
    given: list[str] = []
    build_points([log], 1.0, None, "python", datetime(2023, 2, 21).timestamp(), given)
    assert given == [], "with --start nothing is guessed"


def test_logs_dated_by_their_modification_time_say_so_in_one_line_naming_start(tmp_path, radt_home, fixtures_dir, empty_sqlite):
    """`radt import top.txt` put the samples on the file's date without a word (15 h off in the check)."""
    top, dmon = tmp_path / "top.txt", tmp_path / "dmon.txt"
    top.write_bytes((fixtures_dir / "mnist_top_batch.txt").read_bytes())  # a copy, as users move logs: its date is today's
    dmon.write_text("#Entity SMACT\nGPU 0 0.1\nGPU 0 0.3\nGPU 0 0.5\n")
    mtime = datetime(2026, 11, 28, 6, 0, 0).timestamp()
    for path in (top, dmon):
        os.utime(path, (mtime, mtime))
    done = run_radt(["import", str(top), str(dmon)], radt_env(radt_home, empty_sqlite(tmp_path / "s.db")), tmp_path)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "--start" in line]
    assert said == [
        "radt import: top.txt: top's clock has no date; dated 2026-11-27 15:16:05 to 2026-11-27 15:16:53, to end by the file's "
        "modification time 2026-11-28 06:00:00; if it was recorded on another day, give --start with that day, e.g. --start 2026-11-27T15:16:05",
        "radt import: dmon.txt has no timestamps; its 3 samples, 1 s apart, were placed to end at the file's modification time "
        "2026-11-28 06:00:00; if it was recorded at another time, give --start with its first sample's date and time, e.g. --start 2026-11-28T05:59:58",
    ], done.stderr


def test_a_timestamped_log_keeps_shared_series_whatever_the_order(tmp_path):
    dmon = tmp_path / "dmon.txt"
    dmon.write_text("#Entity GPUTL SMACT\nID\nGPU 0 54 0.5\nGPU 0 55 0.6\n")
    smi = tmp_path / "smi.csv"
    smi.write_text("timestamp, utilization.gpu [%]\n2023/02/21 15:16:55.262, 33 %\n2023/02/21 15:16:56.262, 34 %\n")
    for order in ([dmon, smi], [smi, dmon]):
        notes: list[str] = []
        points, _ = build_points(order, 1.0, None, "python", None, notes)
        util = [(p.step, p.timestamp, p.value) for p in points if p.key == "system/gpu_0_utilization_percentage"]
        base = _ms(datetime(2023, 2, 21, 15, 16, 55, 262000))
        assert util == [(0, base, 33.0), (1, base + 1000, 34.0)]
        assert [(p.timestamp, p.value) for p in points if p.key == "system/gpu_0_sm_active"] == [(base, 0.5), (base + 1000, 0.6)]
        assert notes == ["1 series of dmon.txt (system/gpu_0_utilization_percentage) also in smi.csv; kept those of smi.csv"]


def test_start_and_interval_lay_out_untimed_logs(tmp_path):
    dmon = tmp_path / "dmon.txt"
    dmon.write_text("#Entity SMACT\nGPU 0 0.1\nGPU 1 0.2\nGPU 0 0.3\nGPU 1 0.4\nGPU 0 0.5\nGPU 1 0.6\n")
    start = datetime(2024, 1, 2, 3, 4, 5).timestamp()
    points, _ = build_points([dmon], 0.25, None, None, start)
    assert [(p.key[-15:], p.step, p.timestamp - _ms(datetime(2024, 1, 2, 3, 4, 5)), p.value) for p in points] == [
        ("gpu_0_sm_active", 0, 0, 0.1),
        ("gpu_1_sm_active", 0, 0, 0.2),
        ("gpu_0_sm_active", 1, 250, 0.3),
        ("gpu_1_sm_active", 1, 250, 0.4),
        ("gpu_0_sm_active", 2, 500, 0.5),
        ("gpu_1_sm_active", 2, 500, 0.6),
    ]


def test_build_points_refuses_what_is_not_a_log(tmp_path, fixtures_dir):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="is not a dcgmi dmon"):
        build_points([empty], 1.0, None, None, None)
    with pytest.raises(FileNotFoundError, match="not found"):
        build_points([fixtures_dir / "mnist_top_batch.txt", tmp_path / "nope.txt"], 1.0, None, None, None)
    with pytest.raises(FileNotFoundError, match="is a folder"):
        build_points([fixtures_dir / "mnist_top_batch.txt", tmp_path], 1.0, None, None, None)
    header_only = tmp_path / "h.csv"
    header_only.write_text("name, utilization.gpu [%]\n")
    assert build_points([header_only], 1.0, None, None, None)[0] == []


def _cut_last_line(source: Path, target: Path) -> int:
    """SOURCE with its last line cut in half, as a log copied while the tool was writing it: the cut line's number (from 1)."""
    lines = source.read_text().splitlines(keepends=True)
    while not lines[-1].strip():
        lines.pop()
    target.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    return len(lines)


@pytest.mark.parametrize("name", ["mnist_nvidia_smi.csv", "mnist_dcgmi_dmon_18fields.txt"])
def test_a_log_cut_while_written_says_which_line_it_left_out(name, tmp_path, fixtures_dir, radt_home, empty_sqlite, capsys):
    """Before, the cut last line of an nvidia-smi or dmon log was dropped without a word: the user saw a sample fewer
    than the tool wrote and no reason. Now the import says the line's number; every whole line is imported as before."""
    cut = tmp_path / name
    number = _cut_last_line(fixtures_dir / name, cut)
    whole = tmp_path / "whole" / name
    whole.parent.mkdir()
    whole.write_text("".join(cut.read_text().splitlines(keepends=True)[:-1]))  # the same log without the cut line

    notes: list[str] = []
    points, _ = build_points([cut], 1.0, None, None, None, notes)
    notes = [note for note in notes if "--start" not in note]  # the dmon log is also said to be dated by its modification time
    assert notes == [f"{name}: line {number} left out: not as many cells as the log's header names (a line cut while written, or a message between samples)"]
    expected, _ = build_points([whole], 1.0, None, None, None)
    assert [(p.key, p.step, p.value) for p in points] == [(p.key, p.step, p.value) for p in expected] and points

    store = empty_sqlite(tmp_path / "store.db")
    assert cli_main(["import", str(cut), "--store", store]) == 0
    err = capsys.readouterr().err
    assert f"radt import: {notes[0]}" in err.splitlines(), err
    client = mlflow.MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("Default").experiment_id])
    assert int(run.data.tags["radt.points"]) == len(points)


def test_messages_between_samples_are_counted_by_line():
    """An error nvidia-smi printed between samples, and two short rows: each line named, the others read."""
    left_out: list[int] = []
    lines = ["name, utilization.gpu [%]", "H100, 10 %", "Unable to determine the device handle for GPU0000:41:00.0: Unknown Error", "H100, 12 %"]
    assert [r.values["utilization.gpu"] for r in parse_nvidia_smi_csv(lines, left_out=left_out)] == [10.0, 12.0]
    assert left_out == [3]
    left_out = []
    dmon = ["#Entity SMACT SMOCC", "ID", "GPU 0 0.1 0.2", "GPU 0 0.3", "GPU 0 0.5 0.6", "GPU 0"]
    assert [r.values["SMACT"] for r in parse_dcgmi_dmon(dmon, left_out)] == [0.1, 0.5]
    assert left_out == [4, 6]
    assert left_out_note(Path("a.csv"), list(range(1, 9))).startswith("a.csv: 8 lines 1, 2, 3, 4, 5 and 3 more left out: ")
