"""`radt experiment.csv --slurm` on a real one-node Slurm (tests/support/slurm.py: munged, slurmctld, slurmd, 4 GPUs
as plain files): each workload one sbatch job running its collocated runs through the same WorkloadRunner; the
CSV gets SlurmJob and the statuses; a stopped radt leaves its jobs to Slurm and the same command picks them up;
Ctrl-C cancels them; a CSV asking what the cluster lacks is refused. No fake sbatch; the GPUs the runs see are
the fake NVML's four (tests/fakes), numbered as Slurm's gres files are.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
from mlflow import MlflowClient

from radt.collectors.experiment.csvfile import ExperimentFile
from tests.support import slurm
from tests.support.disks import fill, tmpfs
from tests.support.polling import wait_for
from tests.support.radtproc import DEFAULT_PERIODS, LiveRadt, fake_tools_env, radt_env, run_radt

HEADER = "Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params\n"
FOUR_GPUS = json.dumps([{"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-5105{n}000-0000-0000-0000-00000000000{n}"} for n in range(4)])
TRAIN = """\
import os, re, subprocess, sys, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
job = subprocess.run(["scontrol", "show", "job", "-d", os.environ["SLURM_JOB_ID"]], capture_output=True, text=True).stdout
print("slurm gave", re.search(r"GRES=\\S*?\\(IDX:([0-9,-]+)\\)", job).group(1), "cuda", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
time.sleep(float(args.get("--seconds", "0.2")))
while os.path.exists(args.get("--hold-while", "/nonexistent")):
    time.sleep(0.05)
sys.exit(int(args.get("--exit", "0")))
"""


@pytest.fixture
def folder(tmp_path, cluster) -> Path:
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path


def _env(home: Path, store: str | None = None, periods: dict | None = None) -> dict[str, str]:
    return radt_env(home, store, fake_gpus=FOUR_GPUS, extra={**slurm.env(), **(periods or {})})


def _cells(csv: Path, column: str) -> list[str]:
    exp = ExperimentFile.load(csv)
    return [exp.get(r, column) for r in exp.rows]


def _seen(output: Path) -> dict[str, tuple[str, str]]:
    """Per run letter, what its training saw: (Slurm's GRES IDX of the job, CUDA_VISIBLE_DEVICES)."""
    found = re.findall(r"\[\w*?([A-Z])\]\s+slurm gave (\S+) cuda (\S+)", output.read_text())
    return {letter: (idx, cuda) for letter, idx, cuda in found}


def test_each_workload_is_one_slurm_job_and_the_csv_gets_its_job_and_statuses(folder, store_uri, radt_home):
    rows = "sl,1,,,0,-,train.py,host,--seconds 0.5\nsl,1,,,1,-,train.py,host,--seconds 0.5\nsl,2,,,3,-,train.py,host,--exit 3\n"
    (folder / "experiment.csv").write_text(HEADER + rows)

    env = _env(radt_home, store_uri, DEFAULT_PERIODS)  # squeue at its real 1 s period; the other Slurm tests poll faster
    result = run_radt(["--slurm", "--interval", "0.5", "experiment.csv"], env=env, cwd=folder, timeout=180)

    assert result.returncode == 1, f"workload 2 FAILED, so radt exits 1:\n{result.stderr[-3000:]}"
    csv = folder / "experiment.csv"
    assert _cells(csv, "Status") == ["FINISHED", "FINISHED", "FAILED"]
    jobs = _cells(csv, "SlurmJob")
    assert jobs[0] == jobs[1] != jobs[2] and all(j.isdigit() for j in jobs), f"one job per workload: {jobs}"
    assert f"output in slurm/sl-1-{jobs[0]}.out" in result.stderr
    assert "[1A]" in (folder / "slurm" / f"sl-1-{jobs[0]}.out").read_text(), "the job's output holds its runs' lines"

    client = MlflowClient(store_uri)
    runs = [client.get_run(run_id) for run_id in _cells(csv, "Run")]
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED", "FAILED"]
    assert [r.data.tags["radt.slurm.job_id"] for r in runs] == jobs, "each run names its Slurm job"
    parent = client.get_run(runs[0].data.tags["mlflow.parentRunId"])
    assert parent.data.tags["radt.slurm.job_id"] == jobs[0] and parent.data.tags["radt.slurm.partition"] == slurm.PARTITION
    assert parent.info.status == "FINISHED" and runs[0].data.tags["mlflow.parentRunId"] == runs[1].data.tags["mlflow.parentRunId"]
    seen = _seen(folder / "slurm" / f"sl-1-{jobs[0]}.out")
    low, high = (int(n) for n in seen["A"][0].split("-")) if "-" in seen["A"][0] else (int(n) for n in seen["A"][0].split(","))
    assert [seen["A"][1], seen["B"][1]] == [str(low), str(high)], f"the CSV's GPUs 0 and 1 are the two Slurm gave the job: {seen}"
    assert [r.data.tags["radt.devices"] for r in runs[:2]] == [str(low), str(high)]
    one = _seen(folder / "slurm" / f"sl-2-{jobs[2]}.out")["A"]
    assert one[1] == one[0] == runs[2].data.tags["radt.devices"], f"Devices 3 of a one-GPU workload is the job's one GPU: {one}"


def test_mps_is_set_up_and_torn_down_by_the_job_on_the_gpu_slurm_gave_it(folder, tmp_path, radt_home, empty_sqlite):
    rows = "colo,1,,,2,MPS,train.py,host,\ncolo,1,,,2,MPS,train.py,host,\n"  # MIG rows: tests/test_slurm_mig.py (Slurm assigns the slices)
    (folder / "experiment.csv").write_text(HEADER + rows)
    tools = {**fake_tools_env(folder), **slurm.env()}  # the driver's tools faked
    env = radt_env(radt_home, empty_sqlite(tmp_path / "store.db"), extra=tools)

    result = run_radt(["--slurm", "--interval", "0.5", "experiment.csv"], env=env, cwd=folder, timeout=180)

    assert result.returncode == 0, result.stderr[-3000:]
    csv = folder / "experiment.csv"
    assert _cells(csv, "Status") == ["FINISHED"] * 2
    jobs = _cells(csv, "SlurmJob")
    mps_runs = _seen(folder / "slurm" / f"colo-1-{jobs[0]}.out")
    events = [json.loads(line) for line in (folder / "tools.log").read_text().splitlines()]
    daemon = [e for e in events if e["tool"] == "nvidia-cuda-mps-control"]
    assert daemon[0]["env"]["CUDA_VISIBLE_DEVICES"] == mps_runs["A"][0] == mps_runs["B"][0], "the MPS daemon serves the GPU Slurm gave job 1"
    assert daemon[-1].get("stdin") == "quit" and mps_runs["A"][1] == mps_runs["B"][1] == "0", "the runs see the daemon's GPU 0; it is quit after"
    assert json.loads((folder / "tools-state.json").read_text()) == {"mig": [], "mps": []}, "the job left nothing set up"


def test_a_stopped_radt_leaves_its_jobs_to_slurm_and_the_same_command_picks_them_up(folder, store_uri, radt_home):
    hold = folder / "hold"
    hold.touch()
    (folder / "experiment.csv").write_text(HEADER + f"resume,1,,,0,-,train.py,host,--hold-while {hold}\nresume,1,,,1,-,train.py,host,--hold-while {hold}\n")
    csv, env = folder / "experiment.csv", _env(radt_home, store_uri)
    first = LiveRadt(["--slurm", "--interval", "0.5", "experiment.csv"], env=env, cwd=folder)
    try:
        wait_for(lambda: _cells(csv, "Status") == ["RUNNING"] * 2 and all(_cells(csv, "Run")), timeout=180, what=lambda: f"rows RUNNING: {csv.read_text()}")
        first.proc.send_signal(signal.SIGTERM)
        assert first.wait(60) == 128 + signal.SIGTERM
    finally:
        first.end()
    assert "keep running" in first.stderr, first.stderr
    job, runs = _cells(csv, "SlurmJob")[0], _cells(csv, "Run")
    assert slurm.job_state(job) == "RUNNING", "stopping radt does not stop the job"

    again = LiveRadt(["--slurm", "--interval", "0.5", "experiment.csv"], env=env, cwd=folder)
    try:
        again.line(f"already submitted as Slurm job {job}; watching it", timeout=180)
        hold.unlink()
        assert again.wait(180) == 0, again.stderr
    finally:
        again.end()
    assert "submitted as Slurm job" not in again.stderr.replace("already submitted", ""), "nothing is submitted twice"
    assert _cells(csv, "Status") == ["FINISHED"] * 2 and _cells(csv, "SlurmJob") == [job] * 2 and _cells(csv, "Run") == runs
    client = MlflowClient(store_uri)
    assert [client.get_run(r).info.status for r in runs] == ["FINISHED"] * 2


def test_ctrl_c_cancels_the_jobs_and_their_rows_say_killed(folder, tmp_path, radt_home, empty_sqlite):
    store = empty_sqlite(tmp_path / "store.db")
    hold = folder / "hold"
    hold.touch()
    rows = f"cancel,1,,,0+1+2+3,-,train.py,host,--hold-while {hold}\ncancel,2,,,0,-,train.py,host\n"  # 2 waits for 1's four GPUs
    (folder / "experiment.csv").write_text(HEADER + rows)
    csv = folder / "experiment.csv"
    radt = LiveRadt(["--slurm", "--interval", "0.5", "experiment.csv"], env=_env(radt_home, store), cwd=folder)
    try:
        wait_for(lambda: _cells(csv, "Status")[0] == "RUNNING" and _cells(csv, "Run")[0], timeout=180, what=lambda: f"workload 1 RUNNING: {csv.read_text()}")
        assert _cells(csv, "Status")[1] == "PENDING", "workload 2 waits for the GPUs workload 1 holds"
        radt.proc.send_signal(signal.SIGINT)
        assert radt.wait(120) == 130, radt.stderr
    finally:
        radt.end()
    jobs = _cells(csv, "SlurmJob")
    assert _cells(csv, "Status") == ["KILLED", "KILLED"]
    assert [slurm.job_state(j) for j in jobs] == ["CANCELLED", "CANCELLED"]
    assert not [j for j, _ in slurm.jobs() if j in jobs], "squeue lists none of the experiment's jobs"
    run = MlflowClient(store).get_run(_cells(csv, "Run")[0])
    assert run.info.status == "KILLED", "the cancelled job's run ends KILLED"


def test_a_csv_asking_more_gpus_than_any_node_has_is_refused(folder, radt_home):
    (folder / "experiment.csv").write_text(HEADER + "big,1,,,0+1+2+3+4+5+6+7,-,train.py,host,\n")
    before = (folder / "experiment.csv").read_text()

    result = run_radt(["--slurm", "experiment.csv"], env=_env(radt_home), cwd=folder, timeout=180)

    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1, f"one line: {result.stderr}"
    assert result.stderr.startswith("radt: experiment.csv rows 2: workload big/1 asks for 8 GPUs on one node"), result.stderr
    assert "no node of partition debug has more than 4" in result.stderr
    assert (folder / "experiment.csv").read_text() == before and not (folder / "slurm").exists(), "nothing was submitted"


def test_an_unknown_partition_is_refused_and_dry_run_prints_the_jobs(folder, radt_home):
    (folder / "experiment.csv").write_text(HEADER + "dry,1,,,0,-,train.py,host,\ndry,1,,,2,-,train.py,host,\n")
    env = _env(radt_home, "postgresql://radt:secret@127.0.0.1:5432/nowhere")

    refused = run_radt(["--slurm", "--slurm-partition", "nope", "experiment.csv"], env=env, cwd=folder, timeout=180)
    assert (
        refused.returncode == 2
        and f"radt: Slurm has no partition 'nope' (it has debug, {slurm.MIG_PARTITION}, {slurm.MPS_PARTITION}); fix --slurm-partition" in refused.stderr
    ), refused.stderr

    dry = run_radt(
        ["--slurm", "--dry-run", "--slurm-time", "0:10:00", "--sbatch=--qos=normal --comment=radt", "experiment.csv"], env=env, cwd=folder, timeout=180
    )
    assert dry.returncode == 0, dry.stderr
    sbatch = next(line for line in dry.stdout.splitlines() if "sbatch" in line)
    assert "--gres=gpu:2" in sbatch and sbatch.endswith("--time=0:10:00 --qos=normal --comment=radt " + str(folder / "slurm" / "dry-1.sh")), sbatch
    assert "--slurm-rows 2,3" in dry.stdout and "secret" not in dry.stdout, "the job script, its store's password left out"
    assert not (folder / "slurm").exists() and "SlurmJob" not in (folder / "experiment.csv").read_text()

    alone = run_radt(["--slurm-time", "0:10:00", "experiment.csv"], env=env, cwd=folder, timeout=180)
    assert alone.returncode == 2 and alone.stderr.startswith("radt: --slurm-time only apply with --slurm"), alone.stderr


def test_an_sbatch_refusal_ends_in_one_line_and_submits_nothing(folder, tmp_path, radt_home, empty_sqlite):
    (folder / "experiment.csv").write_text(HEADER + "mem,1,,,0,-,train.py,host,\nmem,2,,,0,-,train.py,host,\n")
    env = _env(radt_home, empty_sqlite(tmp_path / "store.db"))

    result = run_radt(["--slurm", "--sbatch=--mem=900G", "experiment.csv"], env=env, cwd=folder, timeout=180)

    assert result.returncode == 2, result.stderr
    assert "radt: sbatch refused workload mem/1 (" in result.stderr and "no further workload submitted" in result.stderr, result.stderr
    assert _cells(folder / "experiment.csv", "Status") == ["", ""] and "SlurmJob" not in (folder / "experiment.csv").read_text()


def test_a_csv_on_a_full_disk_submits_no_job_with_a_cut_script_and_says_so_in_one_line(folder, tmp_path, radt_home, empty_sqlite):
    """The job scripts are written next to the CSV; on a full disk the first one once failed with a traceback."""
    env = _env(radt_home, empty_sqlite(tmp_path / "store.db"))
    rows = f"fulldisk,1,,,0,-,{folder / 'train.py'},host,\nfulldisk,2,,,0,-,{folder / 'train.py'},host,\n"
    with tmpfs(folder / "shared", size="64k") as disk:
        (disk / "experiment.csv").write_text(HEADER + rows)
        (disk / "slurm").mkdir()
        fill(disk)
        result = run_radt(["--slurm", "experiment.csv"], env=env, cwd=disk, timeout=180)
        assert (disk / "experiment.csv").read_text() == HEADER + rows
        assert not [p.name for p in (disk / "slurm").iterdir()], "no script, cut or whole, is left"
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert [line for line in result.stderr.splitlines() if "job script" in line] == [
        "radt: cannot write slurm/fulldisk-1.sh, the job script of workload fulldisk/1 (No space left on device); "
        "free space next to experiment.csv, or copy it to a disk with room; no further workload submitted"
    ], result.stderr
    assert not slurm.jobs("fulldisk"), "nothing was submitted"


def test_a_csv_another_radt_runs_is_not_submitted_again(folder, tmp_path, radt_home, empty_sqlite):
    """`radt --slurm experiment.csv` while another radt holds the CSV (here this test process, as `radt experiment.csv`
    holds it): one line naming the holder, exit 2, no job."""
    import os
    import socket

    from radt.collectors.experiment.csvhold import holding

    (folder / "experiment.csv").write_text(HEADER + "held,1,,,0,-,train.py,host,\n")
    csv = folder / "experiment.csv"
    with holding(csv, csv.read_bytes()):
        result = run_radt(["--slurm", "experiment.csv"], env=_env(radt_home, empty_sqlite(tmp_path / "store.db")), cwd=folder, timeout=120)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(f"radt: experiment.csv is being run by another radt (pid {os.getpid()} on {socket.gethostname()}, since "), line
    assert line.endswith(f"(or kill -INT {os.getpid()}), then run the same command to carry on"), line
    assert not slurm.jobs("held") and _cells(folder / "experiment.csv", "Status") == [""]


def test_a_job_slurm_has_forgotten_without_a_word_from_it_is_failed_not_submitted_again(folder, radt_home):
    forgotten = "999999"  # never this test cluster's (its ids count from 1); a job squeue and scontrol no longer know, no sacct
    (folder / "experiment.csv").write_text(
        "Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params,SlurmJob\n" + f"gone,1,RUNNING,,0,-,train.py,host,,{forgotten}\n"
    )

    result = run_radt(["--slurm", "experiment.csv"], env=_env(radt_home), cwd=folder, timeout=180)

    assert result.returncode == 1, result.stderr
    assert f"already submitted as Slurm job {forgotten}" in result.stderr and "Slurm no longer knows the job" in result.stderr, result.stderr
    assert _cells(folder / "experiment.csv", "Status") == ["FAILED"] and _cells(folder / "experiment.csv", "SlurmJob") == [forgotten]


def test_a_job_whose_id_never_reached_the_csv_is_found_in_squeue_not_submitted_again(folder, tmp_path, radt_home, empty_sqlite):
    hold = folder / "hold"
    hold.touch()
    (folder / "experiment.csv").write_text(HEADER + f"lost,1,,,0,-,train.py,host,--hold-while {hold}\n")
    csv, env = folder / "experiment.csv", _env(radt_home, empty_sqlite(tmp_path / "store.db"))
    first = LiveRadt(["--slurm", "experiment.csv"], env=env, cwd=folder)
    try:
        wait_for(lambda: _cells(csv, "SlurmJob")[0], timeout=180, what=lambda: f"the job id in the CSV: {csv.read_text()}")
        first.proc.kill()  # radt killed outright; below, the CSV as if that happened before it wrote the id
    finally:
        first.end()
    job = _cells(csv, "SlurmJob")[0]
    (folder / "experiment.csv").write_text(HEADER + f"lost,1,,,0,-,train.py,host,--hold-while {hold}\n")

    again = LiveRadt(["--slurm", "experiment.csv"], env=env, cwd=folder)
    try:
        again.line(f"is Slurm job {job} already", timeout=180)
        hold.unlink()
        assert again.wait(180) == 0, again.stderr
    finally:
        again.end()
    assert _cells(csv, "SlurmJob") == [job] and _cells(csv, "Status") == ["FINISHED"]
    assert "submitted as Slurm job" not in again.stderr, "the job is not submitted twice"
