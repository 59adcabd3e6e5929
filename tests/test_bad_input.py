"""Every bad input is one line and a non-zero exit, and nothing is half-written.

A user types `radt ...` with a typo, a number out of range, a store radt cannot use, a CSV an
editor broke, a log with a mangled clock. Each row of the table below is one such command: radt
must answer with exactly one line on stderr (no traceback, no argparse usage block), exit non-zero,
and leave the store (no run, no experiment) and every file (the CSV's bytes, no new file) as they were.
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import sys
from pathlib import Path

import pytest

from tests.support.paths import FIXTURES, REPO
from tests.support.ports import free_port
from tests.support.radtproc import radt_env, run_radt

HEADER = "Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params\n"
ROW = "exp,1,,,-,-,ok.py,top,\n"
LONG = "x" * 300
PLANNED = "radt: 1 problem(s) in experiment.csv; nothing was started"  # a row the plan refuses: its line, then the count
LISTENER_FIX = "join names with one '+', e.g. nvml+host, or give '-' for none"
PORT_FIX = "is not a TCP port; give one from 1 to 65535 (default 8050)"
POINTS_FIX = "give a number of points from 0 to 1000000000 (default 1000000), or unset it"
FRAME_FIX = "'none', or 'self' and http(s) origins separated by spaces, e.g. 'self' https://portal.example.org; give one, or unset it for 'self'"
STORE_FIX = "give seconds from 0.1 to 86400 (default 5), or unset it"
PARENT_FIX = "--parent-run is the CSV scheduler's own option: run the workload from its CSV (radt experiment.csv)"
# (id, radt's arguments, the experiment CSV's bytes (or a broken log's name) or None, the exact line on stderr, exit status);
# {tmp} is the test's folder, {fixtures} the real tool logs
CASES = [
    ("interval-nan", ["--interval", "nan", "ok.py"], None, "radt: --interval nan is not a finite number; use 0.1 seconds or more", 2),
    ("interval-inf", ["--interval", "inf", "ok.py"], None, "radt: --interval inf is not a finite number; use 0.1 seconds or more", 2),
    ("interval-zero", ["--interval", "0", "ok.py"], None, "radt: --interval 0 is too short; use 0.1 seconds or more", 2),
    ("interval-negative", ["--interval=-2", "ok.py"], None, "radt: --interval -2 is too short; use 0.1 seconds or more", 2),
    (
        "max-time-negative",
        ["--max-time=-1", "ok.py"],
        None,
        "radt: --max-time -1 is not a positive number of minutes; give e.g. --max-time 90, or leave it out for no limit",
        2,
    ),
    (
        "max-time-nan",
        ["--max-time", "nan", "ok.py"],
        None,
        "radt: --max-time nan is not a positive number of minutes; give e.g. --max-time 90, or leave it out for no limit",
        2,
    ),
    (
        "max-time-inf",
        ["--max-time", "inf", "ok.py"],
        None,
        "radt: --max-time inf is not a positive number of minutes; give e.g. --max-time 90, or leave it out for no limit",
        2,
    ),
    ("max-epoch-negative", ["--max-epoch=-3", "ok.py"], None, "radt: --max-epoch -3 is negative; give the last epoch to train (0 or more), or leave it out", 2),
    ("flush-timeout-negative", ["--flush-timeout=-5", "ok.py"], None, "radt: --flush-timeout -5 is not 0 or more seconds; give e.g. --flush-timeout 60", 2),
    ("flush-timeout-inf", ["--flush-timeout", "inf", "ok.py"], None, "radt: --flush-timeout inf is not 0 or more seconds; give e.g. --flush-timeout 60", 2),
    (
        "csv-max-time-nan",
        ["--max-time", "nan", "experiment.csv"],
        HEADER + ROW,
        "radt: --max-time nan is not a positive number of minutes; give e.g. --max-time 90, or leave it out for no limit",
        2,
    ),
    (
        "store-unknown-scheme",
        ["--store", "mongodb://db:27017/runs", "ok.py"],
        None,
        "radt: --store mongodb://db:27017/runs: radt cannot use a 'mongodb' store; give a database URI (sqlite:///path/mlflow.db, "
        "postgresql://user@host/db, mysql://...), an MLflow server (http://host:5000) or the path of a SQLite file",
        2,
    ),
    (
        "store-file-uri",
        ["--store", "file:///{tmp}/mlruns", "ok.py"],
        None,
        "radt: --store file:///{tmp}/mlruns: MLflow's file store is not supported by radt; use a SQLite file (--store sqlite:///path/mlflow.db "
        "or a path ending in .db) or a database, and `mlflow migrate-filestore` to move runs you have there",
        2,
    ),
    (
        "store-folder",
        ["--store", "{tmp}/adir", "ok.py"],
        None,
        "radt: --store {tmp}/adir is a folder (MLflow's file store?); radt needs a database: give a SQLite file such as {tmp}/adir/mlflow.db",
        2,
    ),
    (  # what an MLflow user types: radt made a SQLite file named `mlruns` and recorded there, exit 0
        "store-mlruns",
        ["--store", "./mlruns", "ok.py"],
        None,
        "radt: --store ./mlruns: no such file, and mlruns is the folder of MLflow's file store, which radt does not use; "
        "give a SQLite file such as ./mlruns.db (radt creates it) or a database URI (postgresql://user@host/db)",
        2,
    ),
    (
        "store-new-file-without-db-suffix",
        ["--store", "{tmp}/runs", "ok.py"],
        None,
        "radt: --store {tmp}/runs: no such file; radt creates a new SQLite store only under a name ending in .db, .sqlite or .sqlite3 "
        "(a typo is not taken for one): give {tmp}/runs.db, or sqlite:///{tmp}/runs for that very name",
        2,
    ),
    (
        "store-path-in-missing-folder",
        ["--store", "{tmp}/nodir/runs.db", "ok.py"],
        None,
        "radt: --store {tmp}/nodir/runs.db: the folder {tmp}/nodir does not exist; create it (mkdir -p {tmp}/nodir) or give a SQLite file in an existing folder",
        2,
    ),
    (
        "store-sqlite-uri-in-missing-folder",
        ["--store", "sqlite:///{tmp}/nodir/runs.db", "experiment.csv"],
        HEADER + ROW,
        "radt: --store sqlite:///{tmp}/nodir/runs.db: the folder {tmp}/nodir does not exist; create it (mkdir -p {tmp}/nodir) "
        "or give a SQLite file in an existing folder",
        2,
    ),
    (
        "store-not-sqlite",
        ["--store", "{tmp}/ok.py", "ok.py"],
        None,
        "radt: the tracking store sqlite:///{tmp}/ok.py is not a SQLite database; give a new file name or the store's own file",
        2,
    ),
    (
        "experiment-name-too-long",
        ["-e", LONG, "ok.py"],
        None,
        "radt: -e is 300 characters long; MLflow keeps at most 256 for an experiment name: shorten it",
        2,
    ),
    ("run-name-too-long", ["-n", LONG, "ok.py"], None, "radt: -n is 300 characters long; MLflow keeps at most 250 for a run name: shorten it", 2),
    (
        "workload-too-long",
        ["-w", LONG[:242], "ok.py"],
        None,
        "radt: -w is 242 characters long; MLflow keeps at most 241 for a workload (its parent run is named 'workload <workload>'): shorten it",
        2,
    ),
    # an empty name (`-e "$EXP"` with EXP unset) recorded into the default experiment, or a run or workload named ""
    ("experiment-empty", ["-e", "", "ok.py"], None, "radt: -e is empty; give an experiment name or id, or leave -e out for MLflow's Default experiment", 2),
    ("run-name-blank", ["-n", "  ", "ok.py"], None, "radt: -n is blank; give a run name, or leave -n out for a name MLflow picks", 2),
    ("workload-empty", ["-w", "", "ok.py"], None, "radt: -w is empty; give a workload name, or leave -w out for a run of its own", 2),
    (
        "monitor-experiment-empty",
        ["monitor", "-e", ""],
        None,
        "radt monitor: -e is empty; give an experiment name or id, or leave -e out for the 'monitor' experiment",
        2,
    ),
    (  # old radt: recorded the host and ignored -d 7 without a word
        "monitor-devices-without-gpu-listener",
        ["monitor", "-l", "host", "-d", "7"],
        None,
        "radt monitor: -d 7 names GPUs, but -l host records none; add nvml or dcgm to -l, or drop -d",
        2,
    ),
    (
        "import-experiment-empty",
        ["import", "-e", "", "{fixtures}/mnist_dcgmi_dmon_18fields.txt"],
        None,
        "radt import: -e is empty; give an experiment name or id, or leave -e out for MLflow's Default experiment (see 'radt import --help')",
        2,
    ),
    (  # the CSV scheduler's own option, typed by hand: the run waited for ever at /etc, RUNNING, with files written there
        "start-gate-not-a-gate",
        ["--start-gate", "/etc", "ok.py"],
        None,
        "radt: --start-gate /etc is not a start-gate folder of radt's CSV scheduler (radt-gate-*, made for one workload); "
        "--start-gate is the scheduler's own option: run the workload from its CSV (radt experiment.csv)",
        2,
    ),
    (
        "start-gate-missing",
        ["--start-gate", "{tmp}/radt-gate-gone", "ok.py"],
        None,
        "radt: --start-gate {tmp}/radt-gate-gone is not a start-gate folder of radt's CSV scheduler (radt-gate-*, made for one workload); "
        "--start-gate is the scheduler's own option: run the workload from its CSV (radt experiment.csv)",
        2,
    ),
    ("script-is-a-folder", ["adir"], None, "radt: script 'adir' is a folder; give the training script in it, e.g. adir/train.py", 2),
    (
        "csv-unclosed-quote",
        ["experiment.csv"],
        HEADER + 'exp,1,,,-,-,ok.py,top,"--name x\nexp,2,,,-,-,ok.py,top,\nexp,3,,,-,-,ok.py,top,\n',
        'radt: experiment.csv row 2: a quote (") opened on this row is not closed, so rows 3 to 4 are read as part of it; close the quote',
        2,
    ),
    (
        "csv-unclosed-quote-last-row",
        ["experiment.csv"],
        HEADER + ROW + 'exp,2,,,-,-,ok.py,top,"--name x\n',
        'radt: experiment.csv row 3: a quote (") opened on this row is not closed; close the quote',
        2,
    ),
    (
        "csv-line-break-in-quotes",
        ["experiment.csv"],
        HEADER + 'exp,1,,,-,-,ok.py,top,"--a 1\n--b 2"\n' + ROW,
        "radt: experiment.csv row 2: a quoted cell runs over lines 2 to 3; a row is one line: remove the line break inside the quotes",
        2,
    ),
    (
        "csv-header-only",
        ["experiment.csv"],
        HEADER,
        "radt: 'experiment.csv' has a header but no rows; add one row per run, e.g. exp1,1,,,0,-,train.py,smi+top,--epochs 3",
        2,
    ),
    (
        "csv-cell-over-the-csv-limit",
        ["experiment.csv"],
        HEADER + 'exp,1,,,-,-,ok.py,top,"' + "y" * 140_000 + "\n" + ROW,
        "radt: experiment.csv row 2: a cell runs past 131072 characters, the most a CSV cell may hold; "
        'close the quote (") opened on this row, or shorten the cell',
        2,
    ),
    (
        "csv-nul-byte",
        ["experiment.csv"],
        HEADER + ROW + "exp,2,,,-,-,ok.py,top,--tag a\0b\n",
        "radt: experiment.csv row 3: a NUL byte in a cell; save the file as a UTF-8 CSV without it",
        2,
    ),
    (
        "csv-file-is-a-folder",
        ["experiment.csv"],
        HEADER + "exp,1,,,-,-,adir,top,\n",
        ["radt: experiment.csv row 2: File 'adir' is a folder; give the training script in it, e.g. adir/train.py", PLANNED],
        2,
    ),
    (
        "csv-experiment-name-too-long",
        ["experiment.csv"],
        HEADER + f"{LONG},1,,,-,-,ok.py,top,\n",
        ["radt: experiment.csv row 2: Experiment is 300 characters long; MLflow keeps at most 256 for an experiment name: shorten it", PLANNED],
        2,
    ),
    (
        "import-a-folder",  # was "'/tmp/.../adir' not found": it is there, and a folder
        ["import", "{tmp}/adir"],
        None,
        "radt import: '{tmp}/adir' is a folder; give the dcgmi dmon, nvidia-smi CSV or top -b logs in it, e.g. {tmp}/adir/*.csv",
        2,
    ),
    (
        "import-gpus-zero",
        ["import", "--gpus", "0", "{fixtures}/mnist_nvidia_smi.csv"],
        None,
        "radt import: --gpus 0 must be 1 or more: the GPUs of each sample in the nvidia-smi log (see 'radt import --help')",
        2,
    ),
    (
        "import-gpus-negative",
        ["import", "--gpus=-2", "{fixtures}/mnist_nvidia_smi.csv"],
        None,
        "radt import: --gpus -2 must be 1 or more: the GPUs of each sample in the nvidia-smi log (see 'radt import --help')",
        2,
    ),
    (
        "import-interval-inf",
        ["import", "--interval", "inf", "{fixtures}/mnist_dcgmi_dmon_18fields.txt"],
        None,
        "radt import: --interval inf is not a finite number of seconds; give e.g. --interval 1 (see 'radt import --help')",
        2,
    ),
    (
        "import-bad-smi-timestamp",
        ["import", "{fixtures}/mnist_dcgmi_dmon_18fields.txt", "smi.csv"],
        "smi.csv",
        "radt import: smi.csv:3: timestamp '2023/02/31 15:16:55.265' is not a time as nvidia-smi writes it (2023/02/21 15:16:55.262); "
        "fix or delete the line; nothing imported",
        2,
    ),
    (
        "import-bad-top-clock",
        ["import", "top.txt"],
        "top.txt",
        "radt import: top.txt:12: top's clock '25:16:08' is not a time of day (15:16:05); fix or delete the line; nothing imported",
        2,
    ),
    (
        "export-unknown-option",
        ["export", "-o", "out.png", "--experiment", "x", "--bogus"],
        None,
        "radt export: unrecognized arguments: --bogus (see 'radt export --help')",
        2,
    ),
    (
        "export-dpi-too-high",
        ["export", "-o", "out.png", "--experiment", "x", "--dpi", "3000"],
        None,
        "radt export: DPI 3000 is out of range; use 30 to 2400 (300 for print)",
        2,
    ),
    (
        "export-font-nan",
        ["export", "-o", "out.png", "--experiment", "x", "--font-size", "nan"],
        None,
        "radt export: font size nan is out of range; use 4 to 48 points (9 for a paper)",
        2,
    ),
    ("sync-unknown-option", ["sync", "--all"], None, "radt sync: unrecognized arguments: --all (see 'radt sync --help')", 2),
    ("listeners-plus-alone", ["-l", "+", "ok.py"], None, f"radt: listeners '+' hold an empty name: {LISTENER_FIX}", 2),
    ("listeners-empty", ["-l", "", "ok.py"], None, f"radt: listeners '' name no listener: {LISTENER_FIX}", 2),
    ("listeners-double-plus", ["-l", "nvml++", "ok.py"], None, f"radt: listeners 'nvml++' hold an empty name: {LISTENER_FIX}", 2),
    (
        "csv-listeners-plus-alone",
        ["experiment.csv"],
        HEADER + "exp,1,,,-,-,ok.py,+,\n",
        [f"radt: experiment.csv row 2: listeners '+' hold an empty name: {LISTENER_FIX}", PLANNED],
        2,
    ),
    (
        "prometheus-unclosed-ipv6",
        ["--prometheus", "http://[::1", "ok.py"],
        None,
        "radt: --prometheus 'http://[::1' is not a Prometheus server's http(s) URL; give e.g. --prometheus http://prometheus:9090",
        2,
    ),
    (
        "prometheus-port-out-of-range",
        ["--prometheus", "http://prom:99999", "ok.py"],
        None,
        "radt: --prometheus 'http://prom:99999' is not a Prometheus server's http(s) URL; give e.g. --prometheus http://prometheus:9090",
        2,
    ),
    ("dashboard-port-too-high", ["dashboard", "--port", "99999"], None, f"radt dashboard: --port 99999 {PORT_FIX}", 2),
    ("dashboard-port-zero", ["dashboard", "--port", "0"], None, f"radt dashboard: --port 0 {PORT_FIX}", 2),
    ("dashboard-port-negative", ["dashboard", "--port=-1"], None, f"radt dashboard: --port -1 {PORT_FIX}", 2),
]

# (id, the RADT_* variable and its value, radt's arguments, the experiment CSV or None, the exact line on stderr): a setting
# radt cannot use is refused before any command creates anything, whichever command reads it
SETTING_CASES = [
    (
        "frame-ancestors-another-directive",
        ("RADT_FRAME_ANCESTORS", "https://a.org; script-src *"),
        ["dashboard"],
        None,
        f"radt dashboard: RADT_FRAME_ANCESTORS='https://a.org; script-src *' is not {FRAME_FIX}",
    ),
    (
        "frame-ancestors-none-and-more",
        ("RADT_FRAME_ANCESTORS", "'none' 'self'"),
        ["dashboard"],
        None,
        f"radt dashboard: RADT_FRAME_ANCESTORS=\"'none' 'self'\" is not {FRAME_FIX}",
    ),
    ("memory-points-negative", ("RADT_MEMORY_POINTS", "-5"), ["ok.py"], None, f"radt: RADT_MEMORY_POINTS='-5' is out of range; {POINTS_FIX}"),
    ("memory-points-text", ("RADT_MEMORY_POINTS", "abc"), ["ok.py"], None, f"radt: RADT_MEMORY_POINTS='abc' is not a whole number; {POINTS_FIX}"),
    ("memory-points-csv", ("RADT_MEMORY_POINTS", "-5"), ["experiment.csv"], HEADER + ROW, f"radt: RADT_MEMORY_POINTS='-5' is out of range; {POINTS_FIX}"),
    ("store-timeout-overflow", ("RADT_STORE_TIMEOUT", "1e999"), ["ok.py"], None, f"radt: RADT_STORE_TIMEOUT='1e999' is not a finite number; {STORE_FIX}"),
    ("store-timeout-nan", ("RADT_STORE_TIMEOUT", "nan"), ["ok.py"], None, f"radt: RADT_STORE_TIMEOUT='nan' is not a finite number; {STORE_FIX}"),
    ("store-timeout-inf", ("RADT_STORE_TIMEOUT", "inf"), ["ok.py"], None, f"radt: RADT_STORE_TIMEOUT='inf' is not a finite number; {STORE_FIX}"),
    ("store-timeout-zero", ("RADT_STORE_TIMEOUT", "0"), ["ok.py"], None, f"radt: RADT_STORE_TIMEOUT='0' is out of range; {STORE_FIX}"),
    (
        "finish-timeout-negative-sync",
        ("RADT_FINISH_TIMEOUT", "-1"),
        ["sync"],
        None,
        "radt sync: RADT_FINISH_TIMEOUT='-1' is out of range; give seconds from 0.1 to 86400 (default 30), or unset it",
    ),
    (
        "retry-interval-zero",
        ("RADT_RETRY_INTERVAL", "0"),
        ["ok.py"],
        None,
        "radt: RADT_RETRY_INTERVAL='0' is out of range; give seconds from 0.01 to 3600 (default 2), or unset it",
    ),
    (
        "http-retries-text",
        ("RADT_HTTP_RETRIES", "many"),
        ["ok.py"],
        None,
        "radt: RADT_HTTP_RETRIES='many' is not a whole number; give a number of retries from 0 to 100 (default 0), or unset it",
    ),
    (
        "prometheus-url-unclosed-ipv6",
        ("RADT_PROMETHEUS_URL", "http://[::1"),
        ["ok.py"],
        None,
        "radt: RADT_PROMETHEUS_URL='http://[::1' is not a Prometheus server's http(s) URL such as http://prometheus:9090; give one, or unset it",
    ),
    (
        "prometheus-host-label",
        ("RADT_PROMETHEUS_HOST_LABEL", "host-name"),
        ["ok.py"],
        None,
        "radt: RADT_PROMETHEUS_HOST_LABEL='host-name' is not a Prometheus label name such as Hostname or instance; give one, or unset it for Hostname,hostname",
    ),
    (
        "import-store-timeout-nan",
        ("RADT_STORE_TIMEOUT", "nan"),
        ["import", "{fixtures}/mnist_dcgmi_dmon_18fields.txt"],
        None,
        f"radt import: RADT_STORE_TIMEOUT='nan' is not a finite number; {STORE_FIX}",
    ),
    (
        "dashboard-read-threads",
        ("RADT_READ_THREADS", "1000"),
        ["dashboard", "--port", "99999"],
        None,
        "radt dashboard: RADT_READ_THREADS='1000' is out of range; give a number of connections from 0 to 64 (default 2), or unset it",
    ),
    (
        "dashboard-cache",
        ("RADT_CACHE", "memcached://m:11211"),
        ["dashboard", "--port", "99999"],
        None,
        "radt dashboard: RADT_CACHE='memcached://m:11211' is not simple, null or a redis:// URL; give one, or unset it for simple",
    ),
    (
        "dashboard-url-prefix",
        ("RADT_URL_PREFIX", "/../admin"),
        ["dashboard", "--port", "99999"],
        None,
        "radt dashboard: RADT_URL_PREFIX='/../admin' is not a URL path of letters, digits and . _ ~ - between '/', e.g. /radt/ or /tools/radt/; give one, or unset it for /",
    ),
    (
        "dashboard-ready-timeout",
        ("RADT_READY_TIMEOUT", "0"),
        ["dashboard", "--port", "99999"],
        None,
        "radt dashboard: RADT_READY_TIMEOUT='0' is out of range; give seconds from 0.1 to 600 (default 2), or unset it",
    ),
    (
        "dashboard-cache-timeout",
        ("RADT_CACHE_TIMEOUT", "0"),
        ["dashboard", "--port", "99999"],
        None,
        "radt dashboard: RADT_CACHE_TIMEOUT='0' is out of range; give seconds from 0.05 to 60 (default 1), or unset it",
    ),
    (
        "dashboard-compress",
        ("RADT_COMPRESS", "2"),
        ["dashboard", "--port", "99999"],
        None,
        "radt dashboard: RADT_COMPRESS='2' is out of range; give a whole number from 0 to 1 (default 1), or unset it",
    ),
]


def _broken_log(tmp_path: Path, name: str) -> None:
    """A real log with one timestamp an editor or a disk broke."""
    if name == "smi.csv":
        lines = (FIXTURES / "mnist_nvidia_smi.csv").read_text().splitlines(keepends=True)
        lines[2] = lines[2].replace("2023/02/21 15:16:55.265", "2023/02/31 15:16:55.265")
    else:
        lines = (FIXTURES / "mnist_top_batch.txt").read_text().splitlines(keepends=True)
        assert lines[11].startswith("top - 15:16:08")
        lines[11] = lines[11].replace("top - 15:16:08", "top - 25:16:08")
    (tmp_path / name).write_text("".join(lines))


def _files(folder: Path, home: Path) -> dict[str, bytes | None]:
    """Every file and folder under `folder` but radt's own home, with a file's bytes: what a refused command must leave as it was."""
    found = (p for p in sorted(folder.rglob("*")) if p != home and home not in p.parents)
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in found}


def _count(store: Path, table: str) -> int:
    with sqlite3.connect(store) as conn:
        return conn.execute(f"select count(*) from {table}").fetchone()[0]  # noqa: S608 - a fixed table name


@pytest.mark.parametrize(("args", "csv_text", "line", "status"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_is_one_line_and_leaves_everything_as_it_was(args, csv_text, line, status, tmp_path, radt_home, sqlite_template):
    _refused(args, csv_text, line, status, {}, tmp_path, radt_home, sqlite_template)


@pytest.mark.parametrize(("variable", "args", "csv_text", "line"), [case[1:] for case in SETTING_CASES], ids=[case[0] for case in SETTING_CASES])
def test_bad_setting_is_one_line_before_anything_is_created(variable, args, csv_text, line, tmp_path, radt_home, sqlite_template):
    """Before, RADT_MEMORY_POINTS=-5 was refused after the run was created (and left RUNNING), and RADT_STORE_TIMEOUT=1e999 a traceback."""
    _refused(args, csv_text, line, 2, dict([variable]), tmp_path, radt_home, sqlite_template)


def _refused(args, csv_text, line, status, extra: dict[str, str], tmp_path: Path, radt_home: Path, sqlite_template: Path) -> None:
    """`radt ARGS` in a folder with ok.py (and the CSV or broken log): one line, `status`, and the store and every file as they were."""
    (tmp_path / "ok.py").write_text("print('ok')\n")
    (tmp_path / "adir").mkdir()
    store = tmp_path / "store.db"
    shutil.copy(sqlite_template, store)
    if csv_text in ("smi.csv", "top.txt"):
        _broken_log(tmp_path, csv_text)
    elif csv_text is not None:
        (tmp_path / "experiment.csv").write_bytes(csv_text.encode())
    args = [a.replace("{tmp}", str(tmp_path)).replace("{fixtures}", str(FIXTURES)) for a in args]
    before = _files(tmp_path, radt_home)
    runs, experiments = _count(store, "runs"), _count(store, "experiments")

    result = run_radt(args, env=radt_env(radt_home, f"sqlite:///{store}", extra=extra), cwd=tmp_path, timeout=120)

    lines = [x for x in result.stderr.splitlines() if x.strip()]
    expected = line if isinstance(line, list) else [line]
    assert lines == [x.replace("{tmp}", str(tmp_path)) for x in expected], result.stderr
    assert result.returncode == status and "Traceback" not in result.stderr
    assert (_count(store, "runs"), _count(store, "experiments")) == (runs, experiments), "nothing is written to the store"
    assert _files(tmp_path, radt_home) == before, "no file is created or changed (the CSV keeps its bytes)"
    assert not list(radt_home.glob("runs/*")), "no run folder: nothing waits for `radt sync`"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--parent-run", "0" * 32], f"radt: --parent-run {'0' * 32} names no run in this store; {PARENT_FIX}"),
        (["-e", "elsewhere", "--parent-run", "{parent}"], f"radt: --parent-run {{parent}} is a run of experiment 'home', not of -e elsewhere; {PARENT_FIX}"),
    ],
    ids=["not-in-store", "other-experiment"],
)
def test_a_parent_run_the_store_lacks_is_refused_before_the_run_is_made(args, line, tmp_path, radt_home, empty_sqlite):
    """`--parent-run 000...0` made a run whose parent does not exist. Whether a run is there only the store can say, so the
    store is opened (SQLite's journal mode may change): no run, no experiment, no run folder."""
    from mlflow import MlflowClient

    (tmp_path / "ok.py").write_text("print('ok')\n")
    store = empty_sqlite(tmp_path / "store.db")
    client = MlflowClient(store)
    parent = client.create_run(client.create_experiment("home")).info.run_id
    runs, experiments = _count(tmp_path / "store.db", "runs"), _count(tmp_path / "store.db", "experiments")
    args = [a.replace("{parent}", parent) for a in args]

    result = run_radt([*args, "ok.py"], env=radt_env(radt_home, store), cwd=tmp_path, timeout=120)

    assert [x for x in result.stderr.splitlines() if x.strip()] == [line.replace("{parent}", parent)], result.stderr
    assert result.returncode == 2
    assert (_count(tmp_path / "store.db", "runs"), _count(tmp_path / "store.db", "experiments")) == (runs, experiments)
    assert not list(radt_home.glob("runs/*")), "no run folder"


def test_a_gpu_index_is_refused_where_nvml_answers_and_said_unchecked_where_it_cannot(tmp_path, radt_home, sqlite_template):
    """`-d 99`: refused before anything starts where NVML lists the GPUs (the fake driver, one H100); without NVML radt
    cannot know the GPUs (a node whose exporter radt reads through Prometheus has none it can see), so it says what it did not check."""
    one_gpu = {"RADT_FAKE_NVML": '[{"name": "NVIDIA H100 80GB HBM3"}]'}
    _refused(
        ["-d", "99", "ok.py"], None, "radt: GPU 99 does not exist on this machine (GPUs: 0 to 0); fix -d", 2, one_gpu, tmp_path, radt_home, sqlite_template
    )
    store = tmp_path / "store.db"
    done = run_radt(["-d", "99", "-l", "host", "ok.py"], env=radt_env(radt_home, f"sqlite:///{store}"), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (
        "radt: -d 99 is not checked: NVML cannot be loaded here (NVML Shared Library Not Found), so radt cannot tell which GPUs "
        "this machine has; the script gets CUDA_VISIBLE_DEVICES=99 as given (no GPU, where that GPU does not exist)"
    ) in done.stderr.splitlines()


def test_mlflow_tracking_uri_is_checked_like_store(tmp_path, radt_home):
    (tmp_path / "ok.py").write_text("print('ok')\n")
    result = run_radt(["ok.py"], env=radt_env(radt_home, f"file://{tmp_path}/mlruns"), cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and result.stderr.splitlines() == [
        f"radt: MLFLOW_TRACKING_URI file://{tmp_path}/mlruns: MLflow's file store is not supported by radt; use a SQLite file "
        "(--store sqlite:///path/mlflow.db or a path ending in .db) or a database, and `mlflow migrate-filestore` to move runs you have there"
    ]
    assert not (tmp_path / "mlruns").exists()


# A driver that is not installed, whatever this machine has: a module of its name that cannot be imported, first on the path
MISSING_DRIVER = "raise ModuleNotFoundError(f'No module named {__name__!r}', name=__name__)\n"
DRIVER_FIX = "or name an installed driver"


@pytest.mark.parametrize(
    ("args", "store", "line"),
    [
        (
            ["ok.py"],
            "mysql://db/runs",
            f"radt: MLFLOW_TRACKING_URI mysql://db/runs needs the Python driver 'MySQLdb', which is not installed; `{{python}} -m pip install mysqlclient`, {DRIVER_FIX} (mysql+<driver>://)",
        ),
        (
            ["--store", "mssql://u:secret@db/runs", "ok.py"],
            None,
            f"radt: --store mssql://u:***@db/runs needs the Python driver 'pyodbc', which is not installed; `{{python}} -m pip install pyodbc`, {DRIVER_FIX} (mssql+<driver>://)",
        ),
        (
            ["monitor", "--store", "postgres+pg8000://u@db/runs"],
            None,
            f"radt monitor: --store postgres+pg8000://u@db/runs needs the Python driver 'pg8000', which is not installed; `{{python}} -m pip install pg8000`, {DRIVER_FIX} (postgresql+<driver>://)",
        ),
        (
            ["dashboard", "--store", "mysql+pymysql://db/runs", "--port", "{port}"],  # a free port: a developer's own dashboard may hold 8050
            None,
            f"radt dashboard: --store mysql+pymysql://db/runs needs the Python driver 'pymysql', which is not installed; `{{python}} -m pip install PyMySQL`, {DRIVER_FIX} (mysql+<driver>://)",
        ),
        (
            ["experiment.csv"],
            "postgresql+asyncpg://db/runs",
            "radt: MLFLOW_TRACKING_URI postgresql+asyncpg://db/runs: 'postgresql+asyncpg' is an asyncio driver; radt needs a synchronous one, e.g. postgresql://...",
        ),
        (
            ["export", "--store", "postgres+nosuch://db/runs", "--experiment", "x", "-o", "x.pdf"],
            None,
            "radt export: --store postgres+nosuch://db/runs: SQLAlchemy has no driver 'nosuch' for postgresql; give postgresql://... (its default driver) or postgresql+<driver>:// with a driver SQLAlchemy names",
        ),
        (
            ["--store", "MySQL://db/runs", "ok.py"],
            None,
            f"radt: --store MySQL://db/runs needs the Python driver 'MySQLdb', which is not installed; `{{python}} -m pip install mysqlclient`, {DRIVER_FIX} (mysql+<driver>://)",
        ),
        (
            ["ok.py"],
            "postgresql://u@db:5432x/runs",
            "radt: MLFLOW_TRACKING_URI postgresql://u@db:5432x/runs is not a database URI radt can read (invalid literal for int() with base 10: '5432x'); give e.g. postgresql://user@host:5432/db",
        ),
    ],
    ids=["run-mysql", "run-mssql", "monitor-pg8000", "dashboard-pymysql", "csv-asyncpg", "export-unknown-driver", "run-upper-case-scheme", "run-port-typo"],
)
def test_a_store_whose_driver_is_not_there_is_one_line_at_start(args, store, line, tmp_path, radt_home):
    """`--store mysql://...` without MySQLdb was a traceback from SQLAlchemy's create_engine (exit 1) in `radt train.py` and
    `radt monitor`, and `radt dashboard` served a page that could read nothing; the README lists MySQL and SQL Server."""
    drivers = tmp_path / "drivers"
    drivers.mkdir()
    for module in ("MySQLdb", "pyodbc", "pg8000", "pymysql"):
        (drivers / f"{module}.py").write_text(MISSING_DRIVER)
    (tmp_path / "ok.py").write_text("print('ok')\n")
    (tmp_path / "experiment.csv").write_text(HEADER + ROW)
    env = radt_env(radt_home, store)
    env["PYTHONPATH"] = os.pathsep.join([str(drivers), env["PYTHONPATH"]])
    result = run_radt([a.replace("{port}", str(free_port())) for a in args], env=env, cwd=tmp_path, timeout=60)
    assert result.stderr.splitlines() == [line.replace("{python}", sys.executable)], result.stderr
    assert result.returncode == 2
    assert not list(radt_home.glob("runs/*")) and not (radt_home / "mlflow.db").exists(), "nothing is created"


def test_name_limits_are_mlflows_own():
    """The limits radt checks -e, -n and -w against are read from MLflow's source: its validation and its tables."""
    from mlflow.store.tracking.dbmodels.models import SqlExperiment, SqlRun
    from mlflow.utils.validation import MAX_EXPERIMENT_NAME_LENGTH

    from radt.collectors._common import EXPERIMENT_NAME_LIMIT, RUN_NAME_LIMIT

    assert min(MAX_EXPERIMENT_NAME_LENGTH, SqlExperiment.__table__.c.name.type.length) == EXPERIMENT_NAME_LIMIT
    assert SqlRun.__table__.c.name.type.length == RUN_NAME_LIMIT


def test_store_uri_forms(tmp_path, monkeypatch):
    """One reading of a store for every command and the dashboard: postgres:// as SQLAlchemy users write it, a path as a SQLite file."""
    from radt.settings import StoreUriError, display_uri, store_uri, tracking_uri

    monkeypatch.chdir(tmp_path)
    assert store_uri("postgres://u:pw@db:5432/mlflow") == "postgresql://u:pw@db:5432/mlflow"
    assert store_uri("postgres+psycopg://u@db/mlflow") == "postgresql+psycopg://u@db/mlflow"
    assert store_uri("runs.db") == f"sqlite:///{tmp_path / 'runs.db'}"
    assert store_uri("~/x.db").startswith("sqlite:////") and "~" not in store_uri("~/x.db")
    assert store_uri("sqlite:///relative.db") == "sqlite:///relative.db" and store_uri("http://mlflow:5000") == "http://mlflow:5000"
    assert store_uri("Postgres://u@db/m") == store_uri("POSTGRESQL://u@db/m") == "postgresql://u@db/m"  # SQLAlchemy reads lower case only
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgres://u@db/m")
    assert tracking_uri() == "postgresql://u@db/m" and tracking_uri("x.db") == f"sqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(StoreUriError, match="a URI needs 'sqlite://'"):
        store_uri("sqlite:x.db")
    assert display_uri("postgresql://u:secret@db/m?password=other") == "postgresql://u:***@db/m?password=***"


def test_postgres_scheme_and_a_plain_path_work_everywhere(pg_uri, radt_home, tmp_path, empty_sqlite):
    """`postgres://` (SQLAlchemy's spelling) reaches the writer, MLflow's client and the dashboard as PostgreSQL; the start line names the store, password masked."""
    from mlflow import MlflowClient

    (tmp_path / "ok.py").write_text("print('ok')\n")
    written = "postgres://postgres:secret@" + pg_uri.split("://postgres@", 1)[1]
    result = run_radt(["--store", written, "-l", "host", "ok.py"], env=radt_env(radt_home), cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    first = result.stderr.splitlines()[0]
    shown = "postgresql://postgres:***@" + pg_uri.split("://postgres@", 1)[1]
    assert first.startswith("radt: run ") and first.endswith(f" in experiment 0 (store {shown})"), first
    assert "secret" not in result.stderr
    runs = MlflowClient(pg_uri).search_runs(["0"])
    assert [r.info.status for r in runs] == ["FINISHED"] and runs[0].data.metrics, "points written through the writer"

    empty_sqlite(tmp_path / "plain.db")  # the path is the point here, not creating the store (test_sqltracking's)
    result = run_radt(["--store", "plain.db", "-l", "host", "ok.py"], env=radt_env(radt_home), cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[0].endswith(f"(store sqlite:///{tmp_path / 'plain.db'})")

    from radt.app.db.state import STATE, connect_store
    from radt.settings import tracking_uri

    connect_store(tracking_uri(written))
    assert STATE.error is None and STATE.store_uri.startswith("postgresql://")
    STATE.engine.dispose()


def test_dashboard_on_a_taken_port_is_one_line(tmp_path, radt_home, empty_sqlite):
    """Before, werkzeug printed 'Address already in use' and a paragraph after radt's start line, exit 1."""
    store = empty_sqlite(tmp_path / "store.db")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_radt(["dashboard", "--port", str(port)], env=radt_env(radt_home, store), cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and result.stderr.splitlines() == [
        f"radt dashboard: cannot listen on 127.0.0.1:{port} (Address already in use); pick another with --port, or a --host of this machine"
    ]


def test_python_app_py_checks_the_settings_before_its_modules_read_them(tmp_path, radt_home):
    """`python app.py`, the checkout's way in, read RADT_READ_THREADS at import: a 25-line traceback, exit 1."""
    import subprocess
    import sys

    env = radt_env(radt_home) | {"RADT_READ_THREADS": "abc"}
    result = subprocess.run([sys.executable, str(REPO / "app.py"), "--port", "8050"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.splitlines() == [
        "radt dashboard: RADT_READ_THREADS='abc' is not a whole number; give a number of connections from 0 to 64 (default 2), or unset it"
    ], result.stderr


def test_export_of_a_metric_no_run_stored_is_one_line_and_writes_nothing(store_uri, radt_home, tmp_path):
    """Before, `radt export --metric <typo>` wrote a CSV of the header alone and exited 0."""
    from mlflow import MlflowClient

    client = MlflowClient(store_uri)
    run = client.create_run("0", run_name="r1")
    client.log_metric(run.info.run_id, "system/cpu_utilization_percentage", 50.0)
    client.log_metric(run.info.run_id, "loss", 0.5)
    client.set_terminated(run.info.run_id)
    env = radt_env(radt_home, store_uri)

    result = run_radt(["export", "--experiment", "0", "--metric", "loss", "--metric", "nosuch", "-o", "out.csv"], env=env, cwd=tmp_path, timeout=120)

    assert result.returncode == 2 and result.stderr.splitlines() == [
        "radt export: --metric nosuch: none of the 1 run(s) stored it; give one they have (cpu_utilization_percentage, loss), "
        "as the dashboard's metric list names them; nothing written"
    ]
    assert not (tmp_path / "out.csv").exists()
    result = run_radt(["export", "--experiment", "0", "--metric", "loss", "-o", "out.csv"], env=env, cwd=tmp_path, timeout=120)
    assert result.returncode == 0 and "loss" in (tmp_path / "out.csv").read_text(), result.stderr
