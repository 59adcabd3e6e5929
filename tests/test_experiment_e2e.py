"""`radt experiment.csv` end to end: real radt processes, real training scripts, a real store.

Only the driver tools are fakes (tests/fakes/gpu_tools: nvidia-smi, nvidia-cuda-mps-control,
nsys, ncu, which record each call); the training scripts append their own start and end to
the same log, so the order of set-up, training and tear-down is read from one timeline.
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

from radt.collectors.experiment.csvfile import ExperimentFile
from tests.support.disks import fill, tmpfs
from tests.support.polling import wait_for
from tests.support.radtproc import fake_tools_env, radt_command, radt_env, run_radt

HEADER = "Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params\n"
TRAIN = """\
import fcntl, json, os, sys, time

def note(event):
    with open(os.environ["RADT_FAKE_TOOLS_LOG"], "a") as log:
        fcntl.flock(log, fcntl.LOCK_EX)
        env = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "RADT_NVTX_RANGE", "MLFLOW_RUN_ID")}
        log.write(json.dumps({"tool": "train", "event": event, "args": sys.argv[1:], "time": time.time(), "env": env}) + "\\n")

args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
note("start")
hold = bytearray(int(args.get("--mb", "1")) * 2**20)  # memory this run's process tree really holds
end = time.time() + float(args.get("--seconds", "0.5"))
while time.time() < end:  # "training" without MLflow's 3 s import (the suite runs many of these), asleep: burnt CPU would only slow the tests beside it
    time.sleep(0.02)
while os.path.exists(args.get("--hold-while", "/nonexistent")):
    time.sleep(0.05)
note("end")
sys.exit(int(args.get("--exit", "0")))
"""


def _events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _timeline(events: list[dict]) -> list[str]:
    """Set-up, training and tear-down steps in the order they happened, as short words."""
    words = []
    for e in sorted(events, key=lambda e: e["time"]):
        args = e["args"]
        if e["tool"] == "train":
            words.append(f"{e['event']} {args[args.index('--name') + 1]}")
        elif e["tool"] == "nvidia-cuda-mps-control":
            words.append("mps quit" if e.get("stdin") == "quit" else "mps start")
        elif e["tool"] == "nvidia-smi" and {"-cgi", "-dci", "-dgi"} & set(args):
            op = next(a for a in args if a in ("-cgi", "-dci", "-dgi"))
            words.append(f"mig {op} " + (args[args.index("-cgi") + 1] if op == "-cgi" else f"gi{args[args.index('-gi') + 1]}"))
    return words


@pytest.fixture
def experiment(tmp_path, radt_home):
    """A folder with the training script, and the environment of a user whose PATH holds the driver tools."""
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path, fake_tools_env(tmp_path)  # pynvml without a driver, whatever this machine has: the GPUs are nvidia-smi's


def _radt(folder: Path, env: dict, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return run_radt(list(args), env=env, cwd=folder, timeout=timeout)


def _children(client: MlflowClient, parent_id: str) -> list:
    exp_id = client.get_run(parent_id).info.experiment_id
    return client.search_runs([exp_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'")


def test_collocated_runs_start_together_and_land_on_their_own_runs(experiment, pg_uri, radt_home):
    folder, extra = experiment
    rows = "pair,1,,,-,-,train.py,top,--name A --mb 40 --seconds 3\npair,1,,,-,-,train.py,top,--name B --mb 240 --seconds 3\n"
    (folder / "experiment.csv").write_text(HEADER + rows)
    result = _radt(folder, radt_env(radt_home, pg_uri, extra=extra), "--interval", "0.5", "experiment.csv")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[1A]" in result.stderr and "[1B]" in result.stderr, "each run's lines carry its prefix"

    exp = ExperimentFile.load(folder / "experiment.csv")
    assert [exp.get(r, "Status") for r in exp.rows] == ["FINISHED", "FINISHED"]
    run_ids = [exp.get(r, "Run") for r in exp.rows]
    client = MlflowClient(pg_uri)
    runs = [client.get_run(run_id) for run_id in run_ids]
    parent_id = runs[0].data.tags["mlflow.parentRunId"]
    parent = client.get_run(parent_id)
    assert parent.data.tags["radt.role"] == "workload" and parent.data.tags["radt.workload"] == "1" and parent.info.status == "FINISHED"
    assert sorted(r.info.run_id for r in _children(client, parent_id)) == sorted(run_ids)
    assert [r.data.tags["radt.letter"] for r in runs] == ["A", "B"] and all(r.info.status == "FINISHED" for r in runs)
    assert client.get_experiment(parent.info.experiment_id).name == "pair"
    assert "radt/workload.log" in [a.path for a in client.list_artifacts(parent_id, "radt")]
    assert not list(radt_home.glob("workloads/*.json")), "an ended workload leaves no record for the reaper"

    rss = {r.data.tags["radt.letter"]: client.get_metric_history(r.info.run_id, "system/process_memory_rss_megabytes") for r in runs}
    peak = {letter: max(p.value for p in history) for letter, history in rss.items()}
    assert 150 < peak["B"] - peak["A"] < 250, f"B holds 200 MB more than A, and each run's samples are its own process tree's: {peak}"
    first = [min(p.timestamp for p in client.get_metric_history(r.info.run_id, "system/cpu_utilization_percentage")) for r in runs]
    # each sampler's first tick follows the gate by its process's own scheduling: within 1.5 intervals (0.75 s) on a
    # loaded 2-core machine (504 ms seen); without the gate the second run starts seconds later
    assert abs(first[0] - first[1]) <= 750, f"first samples {abs(first[0] - first[1])} ms apart; the start gate lets them start together"
    starts = {e["args"][1]: e["time"] for e in _events(folder / "tools.log") if e["tool"] == "train" and e["event"] == "start"}
    # each script's own Python start after the gate opens: 0.72 s apart seen with the suite's three workers on 2 cores
    assert abs(starts["A"] - starts["B"]) < 1.0, starts


def test_mps_mig_and_profilers_are_set_up_and_torn_down_around_the_runs(experiment, tmp_path, radt_home, empty_sqlite):
    folder, extra = experiment
    store = empty_sqlite(tmp_path / "store.db")
    rows = (
        "colo,1,,,0,MPS,train.py,top+nsys,--name 1A\n"
        "colo,1,,,0,mps,train.py,top+ncu,--name 1B\n"
        "colo,2,,,2,3g.20gb,train.py,top,--name 2A\n"
        "colo,2,,,2,3g.20gb,train.py,top,--name 2B --exit 3\n"
        "colo,3,,,1,-,train.py,top,--name 3A\n"
    )
    (folder / "experiment.csv").write_text(HEADER + rows)
    result = _radt(folder, radt_env(radt_home, store, extra=extra), "--interval", "0.5", "experiment.csv")
    assert result.returncode == 1, result.stderr[-3000:]  # workload 2 failed, the rest ran
    events = _events(folder / "tools.log")
    order = _timeline(events)
    w1, w2, w3 = order[: order.index("mps quit") + 1], order[order.index("mps quit") + 1 : -2], order[-2:]
    assert w1[0] == "mps start" and w1[-1] == "mps quit" and sorted(w1[1:-1]) == ["end 1A", "end 1B", "start 1A", "start 1B"]
    assert w2[:2] == ["mig -cgi 3g.20gb:0", "mig -cgi 3g.20gb:4"] and sorted(w2[2:6]) == ["end 2A", "end 2B", "start 2A", "start 2B"]
    assert w2[6:] == ["mig -dci gi2", "mig -dgi gi2", "mig -dci gi1", "mig -dgi gi1"], "removed in reverse order, also after a crash"
    assert w3 == ["start 3A", "end 3A"]
    assert json.loads((folder / "tools-state.json").read_text()) == {"mig": [], "mps": []}, "nothing left behind"

    trains = {e["args"][1]: e["env"] for e in events if e["tool"] == "train" and e["event"] == "start"}
    daemon = next(e for e in events if e["tool"] == "nvidia-cuda-mps-control")["env"]
    assert daemon["CUDA_VISIBLE_DEVICES"] == "0" and trains["1A"]["CUDA_MPS_PIPE_DIRECTORY"] == daemon["CUDA_MPS_PIPE_DIRECTORY"]
    assert trains["1A"]["CUDA_VISIBLE_DEVICES"] == trains["1B"]["CUDA_VISIBLE_DEVICES"] == "0"
    migs = {trains["2A"]["CUDA_VISIBLE_DEVICES"], trains["2B"]["CUDA_VISIBLE_DEVICES"]}
    assert len(migs) == 2 and all(m.startswith("MIG-") for m in migs), "each MIG run sees its own instance"
    assert trains["3A"]["CUDA_VISIBLE_DEVICES"] == "1" and trains["3A"]["CUDA_MPS_PIPE_DIRECTORY"] is None
    assert trains["1A"]["RADT_NVTX_RANGE"] == "profile" and trains["2A"]["RADT_NVTX_RANGE"] is None

    exp = ExperimentFile.load(folder / "experiment.csv")
    assert [exp.get(r, "Status") for r in exp.rows] == ["FINISHED", "FINISHED", "FINISHED", "FAILED", "FINISHED"]
    client = MlflowClient(store)
    one_a, one_b = (exp.get(r, "Run") for r in exp.rows[:2])
    nsys_report = [a.path for a in client.list_artifacts(one_a, "radt") if a.path.endswith(".nsys-rep")]
    ncu_report = [a.path for a in client.list_artifacts(one_b, "radt") if a.path.endswith(".ncu-rep")]
    assert len(nsys_report) == 1 and len(ncu_report) == 1, "profiler reports are attached to their runs"
    profiled = {r: client.get_run(exp.get(row, "Run")).data.tags.get("radt.profiler") for r, row in zip(["1A", "1B", "2A"], exp.rows, strict=False)}
    assert profiled == {"1A": "nsys", "1B": "ncu", "2A": None}, "a profiled run says so: its GPU figures and times are the profiler's"
    nsys_call = next(e["args"] for e in events if e["tool"] == "nsys")
    assert {"--capture-range=nvtx", "--nvtx-capture=profile"} <= set(nsys_call)
    ncu_call = next(e["args"] for e in events if e["tool"] == "ncu")
    assert ncu_call[ncu_call.index("--nvtx-include") + 1] == "profile/"
    failed = client.get_run(exp.get(exp.rows[3], "Run"))
    assert failed.info.status == "FAILED" and failed.data.tags["radt.exit_code"] == "3"
    assert client.get_run(failed.data.tags["mlflow.parentRunId"]).info.status == "FAILED"
    assert failed.data.tags["radt.collocation"] == "3g.20gb"

    env = radt_env(radt_home, store, extra=extra)
    again = _radt(folder, env, "--dry-run", "experiment.csv")
    assert "workload colo/2: FAILED, skipped (--rerun runs it again)" in again.stdout and "workload colo/1: FINISHED, skipped" in again.stdout
    rerun = _radt(folder, env, "--dry-run", "--rerun", "experiment.csv")
    assert "workload colo/2: 2 run(s) starting together" in rerun.stdout and "workload colo/3: FINISHED, skipped" in rerun.stdout


def _rows_with(csv_path: Path, status: str) -> list[tuple[int, str]]:
    """(row index, run id) of the rows with this status; the CSV is replaced atomically, so a read never sees half a file."""
    exp = ExperimentFile.load(csv_path)
    return [(i, exp.get(r, "Run")) for i, r in enumerate(exp.rows) if exp.get(r, "Status") == status]


_wait_for = functools.partial(wait_for, timeout=120.0)


@contextlib.contextmanager
def _scheduler(folder: Path, env: dict) -> Iterator[subprocess.Popen]:
    """`radt experiment.csv` started in `folder`, its stderr piped; killed where the test leaves it running."""
    process = subprocess.Popen(radt_command("experiment.csv"), cwd=folder, env=env, stderr=subprocess.PIPE, text=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()


def _ended(process: subprocess.Popen, hold: Path) -> str:
    """Let the held training end, then the scheduler, which must exit 0; its stderr."""
    hold.unlink()
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-3000:]
    return err  # tests/support/polling.py, with the longer wait a workload needs


def test_ctrl_c_in_the_second_workload_then_resume_runs_only_the_unfinished_work(experiment, tmp_path, radt_home, empty_sqlite):
    folder, extra = experiment
    store = empty_sqlite(tmp_path / "store.db")
    hold = folder / "hold"
    hold.touch()
    rows = (
        "resume,1,,,-,-,train.py,top,--name 1A\n"
        f"resume,2,,,0,MPS,train.py,top,--name 2A --hold-while {hold}\n"
        "resume,2,,,0,MPS,train.py,top,--name 2B\n"
        "resume,3,,,-,-,train.py,top,--name 3A\n"
    )
    csv_path = folder / "experiment.csv"
    csv_path.write_text(HEADER + rows)
    env = radt_env(radt_home, store, extra=extra)
    scheduler = subprocess.Popen(radt_command("experiment.csv"), cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        running = _wait_for(lambda: [r for r in _rows_with(csv_path, "RUNNING") if r[0] > 0], what="workload 2 to be RUNNING in the CSV")
        assert [r[0] for r in running] == [1, 2] and _rows_with(csv_path, "FINISHED")[0][0] == 0, "the CSV says what ran and what runs"
        # radt marks a run done once it has ended it in the store (the script's own MLflow atexit says FINISHED earlier)
        _wait_for(lambda: (radt_home / "runs" / running[1][1] / "done").exists(), what="radt to finish run 2B")
        _wait_for(lambda: any(e["tool"] == "train" and e["args"][1] == "2A" for e in _events(folder / "tools.log")), what="run 2A to start")
        scheduler.send_signal(signal.SIGINT)
        output, _ = scheduler.communicate(timeout=120)
    finally:
        if scheduler.poll() is None:
            scheduler.kill()
    assert scheduler.returncode == 130, output[-3000:]
    assert "Run the same command to carry on" in output
    first = ExperimentFile.load(csv_path)
    assert [first.get(r, "Status") for r in first.rows] == ["FINISHED", "KILLED", "FINISHED", ""], output[-3000:]
    run_1a = first.get(first.rows[0], "Run")
    client = MlflowClient(store)
    assert _timeline(_events(folder / "tools.log"))[-1] == "mps quit", "Ctrl-C undid the MPS set-up"
    killed = client.get_run(first.get(first.rows[1], "Run"))
    assert killed.info.status == "KILLED" and client.get_run(killed.data.tags["mlflow.parentRunId"]).info.status == "KILLED"

    hold.unlink()
    (folder / "tools.log").unlink()
    result = _radt(folder, env, "--max-epoch", "5", "experiment.csv")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "workload resume/1 already FINISHED, skipped" in result.stderr
    ran = [w.split()[1] for w in _timeline(_events(folder / "tools.log")) if w.startswith("start")]
    assert sorted(ran) == ["2A", "2B", "3A"], "only the unfinished workloads ran again"
    second = ExperimentFile.load(csv_path)
    assert [second.get(r, "Status") for r in second.rows] == ["FINISHED"] * 4
    assert second.get(second.rows[0], "Run") == run_1a
    new_2a = client.get_run(second.get(second.rows[1], "Run"))
    assert new_2a.info.run_id != killed.info.run_id and new_2a.data.params["max_epoch"] == "5"
    assert new_2a.data.tags["mlflow.parentRunId"] != killed.data.tags["mlflow.parentRunId"], "a rerun has its own workload run"


def test_a_csv_on_a_full_disk_costs_no_training_and_the_last_line_says_which_statuses_it_lacks(experiment, tmp_path, radt_home, empty_sqlite):
    """The statuses are written back to the CSV as runs start and end. Its disk full (a shared home at quota, a scratch
    volume filled by a checkpoint) once stopped the trainings at their start and left the workload's run RUNNING with
    a traceback; the CSV is a ledger, so the runs go on, the store gets every run ended, and radt says what the CSV lacks."""
    folder, extra = experiment
    store = empty_sqlite(tmp_path / "store.db")
    rows = f"full,1,,,-,-,{folder / 'train.py'},top,--name 1A\nfull,1,,,-,-,{folder / 'train.py'},top,--name 1B\nfull,2,,,-,-,{folder / 'train.py'},top,--name 2A\n"
    with tmpfs(folder / "shared", size="64k") as disk:
        csv_path = disk / "experiment.csv"
        csv_path.write_text(HEADER + rows)
        fill(disk)
        result = _radt(disk, radt_env(radt_home, store, extra=extra), "experiment.csv")
        lines = result.stderr.splitlines()
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
        assert csv_path.read_text() == HEADER + rows, "the CSV is whole, as it was"
        assert not list(disk.glob(".*radt-tmp")), "no temporary file is left on the full disk"
    assert result.returncode == 1, result.stderr[-3000:]
    ran = sorted(w.split()[1] for w in _timeline(_events(folder / "tools.log")) if w.startswith("end"))
    assert ran == ["1A", "1B", "2A"], "every training ran to its end"
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("full").experiment_id])
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 5, "both workloads' runs and their three runs ended in the store"
    said = [line for line in lines if line.startswith("radt: cannot write the statuses to ")]
    assert said == ["radt: cannot write the statuses to experiment.csv (No space left on device); the runs go on, and the next status written brings them"], (
        "said once, not at every status"
    )
    ends = [line for line in lines if line.startswith("radt: workload ") and " FINISHED; " in line]
    # each workload's line gives the write's own reason (it said "its disk refused them" whatever the reason was)
    assert len(ends) == 2 and all(line.endswith("its statuses are not in experiment.csv yet (No space left on device)") for line in ends), ends
    last = lines[-1]
    assert last.startswith("radt: experiment.csv lacks what radt wrote of row 2 (Status FINISHED, Run "), lines
    assert "(No space left on device); write these into it" in last, last
    assert all(f"row {n} (Status FINISHED, Run " in last for n in (2, 3, 4)), last
    assert last.endswith("or the next 'radt experiment.csv' runs those rows again"), last
    assert all(r.info.run_id in last for r in runs if r.data.tags.get("mlflow.parentRunId")), last


def test_rows_the_user_adds_and_edits_while_the_experiment_runs_are_kept(experiment, tmp_path, radt_home, empty_sqlite):
    """A long experiment's CSV is edited while it runs: a workload added at the top for later, a later row's Params fixed.
    radt wrote each status from the copy it read at start, so the next status write erased both edits without a word.
    It now writes its statuses into the file as it is on disk: the edits stay, the rows it ran get their statuses where
    they moved to, and a row edited after radt read it gets none (what ran is not what it says now; the next run runs it)."""
    folder, extra = experiment
    store = empty_sqlite(tmp_path / "store.db")
    hold = folder / "hold"
    hold.touch()
    csv_path = folder / "experiment.csv"
    csv_path.write_text(
        HEADER + f"edit,1,,,-,-,train.py,top,--name 1A --hold-while {hold}\nedit,2,,,-,-,train.py,top,--name 2A\nedit,3,,,-,-,train.py,top,--name 3A\n"
    )
    with _scheduler(folder, radt_env(radt_home, store, extra=extra)) as scheduler:
        _wait_for(lambda: _rows_with(csv_path, "RUNNING"), what="workload 1 to be RUNNING in the CSV")
        run_1a = _rows_with(csv_path, "RUNNING")[0][1]
        edited = csv_path.read_text().splitlines()
        assert edited[1].startswith("edit,1,RUNNING,"), edited
        later = "later,9,,,-,-,train.py,top,--name 9A"
        edited.insert(1, later)  # a workload added above the others: every row moves down one line
        edited[3] = "edit,2,,,-,-,train.py,top,--name 2A --seconds 0.1"  # Params fixed after radt read them
        csv_path.write_text("\n".join(edited) + "\n")
        err = _ended(scheduler, hold)
    final = ExperimentFile.load(csv_path)
    cells = [(final.get(r, "Workload"), final.get(r, "Status"), final.get(r, "Params")) for r in final.rows]
    assert cells == [
        ("9", "", "--name 9A"),
        ("1", "FINISHED", f"--name 1A --hold-while {hold}"),
        ("2", "", "--name 2A --seconds 0.1"),
        ("3", "FINISHED", "--name 3A"),
    ], csv_path.read_text()
    assert final.get(final.rows[1], "Run") == run_1a
    lines = err.splitlines()
    assert [line for line in lines if "changed on disk" in line] == [
        "radt: experiment.csv changed on disk since radt read it; radt writes its statuses into it as it is now and keeps your edits "
        "(rows you added or changed run with the next 'radt experiment.csv')"
    ], err[-3000:]
    assert lines[-1].startswith("radt: experiment.csv no longer holds row 3 as radt read it (edited or removed), so its status "
                                "(Status FINISHED, Run "), lines[-1]  # fmt: skip


def test_a_second_radt_on_a_csv_that_is_running_is_refused_and_starts_nothing(experiment, tmp_path, radt_home, empty_sqlite):
    """The same command typed again in another terminal (or a script that "carries on" while the first still runs) ran
    the RUNNING workloads a second time, beside the first on the same GPU: two runs measured collocated that no row says
    are. The CSV is now held by the radt that runs it; a second one says who holds it and what to do, exit 2."""
    folder, extra = experiment
    store = empty_sqlite(tmp_path / "store.db")
    hold = folder / "hold"
    hold.touch()
    csv_path = folder / "experiment.csv"
    csv_path.write_text(HEADER + f"twice,1,,,0,-,train.py,top,--name 1A --hold-while {hold}\ntwice,2,,,0,-,train.py,top,--name 2A\n")
    env = radt_env(radt_home, store, extra=extra)
    with _scheduler(folder, env) as first:
        _wait_for(lambda: _rows_with(csv_path, "RUNNING"), what="workload 1 to be RUNNING in the CSV")
        second = _radt(folder, env, "experiment.csv", timeout=60)
        assert second.returncode == 2, second.stderr
        assert second.stderr.splitlines() == [
            f"radt: experiment.csv is being run by another radt (pid {first.pid} on {socket.gethostname()}, since "
            + second.stderr.split(", since ", 1)[1].split(")", 1)[0]
            + f"); wait for it to end, or stop it with Ctrl-C in its terminal (or kill -INT {first.pid}), then run the same command to carry on"
        ], second.stderr
        assert [w for w in _timeline(_events(folder / "tools.log")) if w.startswith("start")] == ["start 1A"], "the second radt started nothing"
        _ended(first, hold)
    assert [w for w in _timeline(_events(folder / "tools.log")) if w.startswith("start")] == ["start 1A", "start 2A"]
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == [], "the lock goes with the radt that held it"
    again = _radt(folder, env, "experiment.csv", timeout=60)
    assert again.returncode == 0 and "workload twice/2 already FINISHED, skipped" in again.stderr, again.stderr
