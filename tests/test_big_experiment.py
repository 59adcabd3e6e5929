"""A large real-world experiment CSV end to end (issue #25, point 5): 200 workloads, 600 rows, 1 to 7 runs each, alone,
same GPU, MPS and every MIG profile of an A100 40GB (tests/support/big_experiment.py builds it from that shape).

It dry-runs with every row planned and the driver asked once per GPU (its planning time: bench/big_experiment.py), runs on the fake driver tools (tests/fakes/gpu_tools:
nvidia-smi with A100 40GB MIG placements, nvidia-cuda-mps-control) with every row's status written back,
resumes after Ctrl-C without running a finished row again, and under --slurm is one job per workload asking
the GPUs, or the MIG slices by profile, it needs. Real radt processes, a real SQLite store.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import signal
import subprocess
from pathlib import Path

import pytest

from radt.collectors.experiment.csvfile import ExperimentFile
from tests.support import big_experiment
from tests.support.polling import wait_for
from tests.support.radtproc import fake_tools_env, radt_command, radt_env, run_radt

MIG_GPUS = ",".join(map(str, big_experiment.MIG_GPUS))
TRAIN = """\
import json, os, sys, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
with open(os.environ["RADT_FAKE_TOOLS_LOG"], "a") as log:
    env = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "MLFLOW_RUN_ID")}
    log.write(json.dumps({"tool": "train", "args": sys.argv[1:], "time": time.time(), "env": env}) + "\\n")
while os.path.exists(args.get("--hold-while", "/nonexistent")):
    time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def workloads() -> list[big_experiment.Workload]:
    return big_experiment.build()


@pytest.fixture
def folder(tmp_path) -> Path:
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path


def _env(folder: Path, home: Path, store: str | None = None) -> dict[str, str]:
    """A user's shell on a 4-GPU A100 40GB node whose GPUs 2 and 3 are in MIG mode: the driver's tools faked.

    The fakes (#!/usr/bin/env python3) find this interpreter first: a version manager's shim in front of python3
    (pyenv's is a bash script) costs more than the fake itself, five times per MIG slice."""
    return radt_env(home, store, extra={**fake_tools_env(folder), "RADT_FAKE_MIG_GPUS": MIG_GPUS})


def _events(folder: Path, tool: str) -> list[dict]:
    log = folder / "tools.log"
    return [e for e in map(json.loads, log.read_text().splitlines()) if e["tool"] == tool] if log.exists() else []


def _cells(csv: Path, *columns: str) -> list[tuple[str, ...]]:
    exp = ExperimentFile.load(csv)
    return [tuple(exp.get(r, c) for c in columns) for r in exp.rows]


def test_the_big_experiment_dry_run_plans_every_row_and_asks_the_driver_once_per_gpu(folder, radt_home, workloads):
    csv = folder / "big.csv"
    big_experiment.write(csv, workloads)
    assert len(workloads) == 200 and sum(len(w.runs) for w in workloads) == 600
    assert {len(w.runs) for w in workloads} == set(range(1, 8)), "1 to 7 runs per workload"
    per_gpu = [[r.collocation for r in w.runs if r.devices == gpu] for w in workloads if w.mode == "mig" for gpu in {r.devices for r in w.runs}]
    assert all(big_experiment.fits(slices) for slices in per_gpu) and not big_experiment.fits(["3g.20gb", "3g.20gb", "1g.5gb"])
    result = run_radt(["--dry-run", "big.csv"], env=_env(folder, radt_home), cwd=folder, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout.splitlines()
    assert out[0] == "big.csv: 200 workloads, 600 runs"
    assert sum(line.startswith("workload ") and line.endswith("starting together") for line in out) == 200
    assert sum(bool(re.match(r"  [A-G]: GPU ", line)) for line in out) == 600
    mig_rows = sum(1 for w in workloads for r in w.runs if r.collocation not in ("-", "MPS"))
    assert sum("  set-up: create MIG " in line for line in out) == mig_rows
    assert sum("  set-up: start an MPS control daemon" in line for line in out) == sum(w.mode == "mps" for w in workloads)
    calls = _events(folder, "nvidia-smi")
    assert not any("-cgi" in c["args"] for c in calls) and not _events(folder, "nvidia-cuda-mps-control"), "a dry run sets nothing up"
    # -L, then per MIG GPU its profiles (-lgip), placements (-lgipp) and instances (-lgi), once each
    assert len(calls) <= 1 + 3 * len(big_experiment.MIG_GPUS), f"the driver is asked once per GPU, not once per row: {[c['args'] for c in calls]}"
    # radt's own planning time per row and at 10x the rows: bench/big_experiment.py (a wall-clock bound here only flaked under load)


def test_a_slice_of_every_mode_runs_on_the_fake_driver_and_every_row_gets_its_status(folder, radt_home, workloads, empty_sqlite):
    chosen = big_experiment.slice_covering(workloads)
    assert {w.mode for w in chosen} == set(big_experiment.MODES) and any(len(w.runs) == 7 for w in chosen)
    assert set().union(*(w.mig_gres for w in chosen)) == set(big_experiment.A100_40GB_PLACEMENTS), "every MIG profile of an A100 40GB"
    csv = folder / "big.csv"
    big_experiment.write(csv, chosen)
    store = empty_sqlite(folder / "store.db")
    result = run_radt(["--interval", "0.5", "big.csv"], env=_env(folder, radt_home, store), cwd=folder, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]

    cells = _cells(csv, "Workload", "Status", "Run", "Collocation")
    assert [c[1] for c in cells] == ["FINISHED"] * len(cells), cells
    run_ids = [c[2] for c in cells]
    assert all(re.fullmatch(r"[0-9a-f]{32}", r) for r in run_ids) and len(set(run_ids)) == len(run_ids)
    starts = {e["env"]["MLFLOW_RUN_ID"]: e["env"] for e in _events(folder, "train")}
    assert sorted(starts) == sorted(run_ids), "each row ran once, on the run its row names"
    for _, _, run_id, collocation in cells:
        seen = starts[run_id]
        if collocation == "MPS":
            assert seen["CUDA_MPS_PIPE_DIRECTORY"], f"run {run_id} is an MPS client"
        elif collocation != "-":
            assert seen["CUDA_VISIBLE_DEVICES"].startswith("MIG-"), f"run {run_id} sees its {collocation} slice: {seen}"
    created = [c["args"] for c in _events(folder, "nvidia-smi") if "-cgi" in c["args"]]
    tuples = [a[a.index("-cgi") + 1].partition(":") for a in created]  # 3g.20gb:4: each slice created where the plan placed it
    assert all(start.isdigit() for _profile, _colon, start in tuples), tuples
    assert sorted(profile for profile, _colon, _start in tuples) == sorted(c[3] for c in cells if c[3] not in ("-", "MPS"))
    assert json.loads((folder / "tools-state.json").read_text()) == {"mig": [], "mps": []}, "every slice and daemon undone"


def test_ctrl_c_in_the_big_experiment_then_the_same_command_runs_only_what_is_left(folder, radt_home, workloads, empty_sqlite):
    chosen = big_experiment.slice_covering(workloads)
    held = next(w for w in chosen if w.mode == "mig" and len({r.devices for r in w.runs}) == 2)  # slices on both MIG GPUs
    before = min(workloads[: workloads.index(held)], key=lambda w: len(w.runs))  # one run each: the slices are what is tested
    after = min(workloads[workloads.index(held) + 1 :], key=lambda w: len(w.runs))
    hold = folder / "hold"
    hold.touch()
    runs = tuple(dataclasses.replace(r, params=f"{r.params} --hold-while {hold}") for r in held.runs)
    file = [dataclasses.replace(held, runs=runs) if w is held else w for w in workloads]
    todo = {before.name, held.name, after.name}
    csv = folder / "big.csv"
    big_experiment.write(csv, file, finished=[w.name for w in workloads if w.name not in todo])  # an experiment far along
    finished_before = [(n, c) for n, c in enumerate(_cells(csv, "Workload", "Status", "Run")) if c[1] == "FINISHED"]
    assert len(finished_before) == 600 - sum(len(w.runs) for w in workloads if w.name in todo)
    env = _env(folder, radt_home, empty_sqlite(folder / "store.db"))
    radt = subprocess.Popen(radt_command("--interval", "0.5", "big.csv"), cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(
            lambda: len(_events(folder, "train")) == len(before.runs) + len(held.runs), timeout=120, what=f"workload {held.label}'s runs to start", process=radt
        )
        radt.send_signal(signal.SIGINT)
        output, _ = radt.communicate(timeout=120)
    finally:
        if radt.poll() is None:
            radt.kill()
    assert radt.returncode == 130 and "Run the same command to carry on" in output, output[-3000:]
    status = {name: sorted({s for w, s, _ in _cells(csv, "Workload", "Status", "Run") if w == name}) for name in todo}
    assert status == {before.name: ["FINISHED"], held.name: ["KILLED"], after.name: [""]}, output[-3000:]
    assert json.loads((folder / "tools-state.json").read_text()) == {"mig": [], "mps": []}, "Ctrl-C undid the slices on both GPUs"
    kept = {n: c for n, c in enumerate(_cells(csv, "Workload", "Status", "Run")) if c[1] == "FINISHED"}

    hold.unlink()
    (folder / "tools.log").unlink()
    result = run_radt(["--interval", "0.5", "big.csv"], env=env, cwd=folder, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    cells = _cells(csv, "Workload", "Status", "Run")
    assert [c[1] for c in cells] == ["FINISHED"] * 600, "every row ends with a status"
    assert all(cells[n] == c for n, c in kept.items()), "a finished row keeps its run"
    again = sorted(e["env"]["MLFLOW_RUN_ID"] for e in _events(folder, "train"))
    assert again == sorted(r for w, _, r in cells if w in (held.name, after.name)), "only the killed and the unstarted workloads ran"
    assert f"radt: workload {before.label} already FINISHED, skipped" in result.stderr


def _gres(sbatch: list[str]) -> dict[str, int]:
    """What a job asks of Slurm as {MIG profile or 'gpu' or 'mps': count}, however the options spell it (--gres=gpu:T:N,..., --gpus=T:N)."""
    asked: dict[str, int] = {}
    for arg in sbatch:
        name, _, value = arg.partition("=")
        for item in value.split(",") if name in ("--gres", "--gpus") else []:
            parts = item.split(":")
            if name == "--gres" and parts[0] == "mps":
                asked["mps"] = int(parts[-1])
                continue
            if name == "--gres":
                parts = parts[1:] if parts[0] == "gpu" else []
            if parts:  # a typed GRES named after its MIG profile ('1g.5gb', or AutoDetect=nvml's 'a100_1g.5gb') counts as that profile
                kind = parts[0] if len(parts) == 2 else "gpu"
                kind = profile.group(0) if (profile := re.search(r"\d+g\.\d+gb(\+\w+)?$", kind)) else kind
                asked[kind] = asked.get(kind, 0) + int(parts[-1])
    return asked


def test_under_slurm_each_workload_is_one_job_asking_its_gpus_or_its_mig_slices(folder, radt_home, workloads):
    big_experiment.write(folder / "big.csv", workloads)
    env = _env(folder, radt_home, "postgresql://radt@127.0.0.1:5432/nowhere")
    result = run_radt(["--slurm", "--dry-run", "big.csv"], env=env, cwd=folder, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = {}
    for line in result.stdout.splitlines():
        found = re.match(r"workload (\S+): (sbatch .*)", line)
        if found:
            jobs[found.group(1)] = shlex.split(found.group(2))
    assert sorted(jobs) == sorted(w.label for w in workloads), "one job per workload"
    lines = iter(range(2, 602))
    for workload in workloads:
        sbatch = jobs[workload.label]
        rows = [str(next(lines)) for _ in workload.runs]
        assert any(a.startswith("--comment=") and a.endswith(f" rows {','.join(rows)}") for a in sbatch), (workload.label, sbatch)
        asked = _gres(sbatch)
        if workload.mode == "mig":
            assert asked == workload.mig_gres, f"{workload.label} asks Slurm for its MIG slices by profile: {asked} against {workload.mig_gres}"
        else:
            gpus = len({d for r in workload.runs for d in r.devices.split("+")})
            assert asked.get("gpu") == gpus or (workload.mode == "mps" and "mps" in asked), f"{workload.label}: {asked}, wants {gpus} GPU(s)"
