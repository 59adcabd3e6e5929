"""MIG under `radt experiment.csv --slurm` as clusters offer it (issue 25): an admin partitions the GPUs and Slurm
schedules the slices as GRES types. On the real one-node Slurm's MIG node (tests/support/slurm.py: `gpu:1g.5gb:7,
gpu:3g.20gb:2` on plain files, the fake NVML's two A100s in MIG mode behind it), a MIG row is submitted as
`--gres=gpu:<profile>:<n>`, runs on the slice Slurm assigned, and no MIG instance is created or destroyed in the
job; a profile the partition lacks is refused in one line before anything is submitted; --dry-run says that
Devices is not a physical index under Slurm. MPS rows likewise: Slurm's `mps` GRES where the partition has it
(its MPS node), else a GPU and radt's own daemon (tests/test_slurm_experiment.py).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from mlflow import MlflowClient

from radt.collectors.experiment.csvfile import ExperimentFile
from radt.collectors.slurm.job import given_devices
from radt.collectors.sources.gpus import Gpu, Machine, MigDevice
from tests.support import slurm
from tests.support.radtproc import fake_tools_env, radt_env, run_radt

HEADER = "Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params\n"
TRAIN = """\
import os, re, subprocess
job = subprocess.run(["scontrol", "show", "job", "-d", os.environ["SLURM_JOB_ID"]], capture_output=True, text=True).stdout
print("slurm gave", re.search(r"GRES=\\S*?\\(IDX:([0-9,-]+)\\)", job).group(1), "cuda", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
"""


@pytest.fixture
def folder(tmp_path, cluster) -> Path:
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path


def _env(folder: Path, home: Path, store: str | None = None) -> dict[str, str]:
    """The MIG node's GPUs behind the fake NVML; the fake driver tools first on PATH, recording every call."""
    return radt_env(home, store, fake_gpus=slurm.mig_gpus(), extra={**fake_tools_env(folder), **slurm.env()})


def _cells(csv: Path, column: str) -> list[str]:
    exp = ExperimentFile.load(csv)
    return [exp.get(r, column) for r in exp.rows]


def _slices(profile: str) -> list[str]:
    """The MIG UUIDs of the node's slices of `profile`, in Slurm's GRES order."""
    return [m["uuid"] for gpu in json.loads(slurm.mig_gpus()) for m in gpu["mig"] if m["profile"] == profile]


def _job(job: str) -> str:
    return subprocess.run(["scontrol", "show", "job", "-d", job], capture_output=True, text=True, env={**radt_env(Path("/tmp")), **slurm.env()}).stdout


def _mig_changes(folder: Path) -> list[list[str]]:
    """The fake nvidia-smi's calls that create or destroy a MIG instance."""
    log = folder / "tools.log"
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return [e["args"] for e in events if e["tool"] == "nvidia-smi" and {"-cgi", "-dgi", "-dci"} & set(e["args"])]


def test_mig_rows_ask_slurm_for_slices_of_their_profile_and_run_on_the_ones_it_assigned(folder, tmp_path, radt_home, empty_sqlite):
    rows = "mig,big,,,2,3g.20gb,train.py,host,\n" + "mig,seven,,,0,1g.5gb,train.py,host,\n" * 7  # row 2: Devices=2, as in the report
    (folder / "experiment.csv").write_text(HEADER + rows)
    store = empty_sqlite(tmp_path / "store.db")

    result = run_radt(
        ["--slurm", "--slurm-partition", slurm.MIG_PARTITION, "--interval", "0.5", "experiment.csv"],
        env=_env(folder, radt_home, store),
        cwd=folder,
        timeout=240,
    )

    assert result.returncode == 0, result.stderr[-3000:]
    csv = folder / "experiment.csv"
    assert _cells(csv, "Status") == ["FINISHED"] * 8
    big, seven = _cells(csv, "SlurmJob")[0], _cells(csv, "SlurmJob")[1]
    assert "TresPerNode=gres:gpu:3g.20gb:1" in _job(big), _job(big)
    assert "TresPerNode=gres:gpu:1g.5gb:7" in _job(seven), _job(seven)

    seen = re.findall(r"\[big\w\]\s+slurm gave (\S+) cuda (\S+)", (folder / "slurm" / f"mig-big-{big}.out").read_text())
    assert len(seen) == 1, seen
    index, visible = seen[0]
    assert index in ("7", "8") and visible == _slices("3g.20gb")[int(index) - 7], f"the 3g.20gb slice Slurm assigned (GRES IDX {index}): {seen}"
    sevens = re.findall(r"slurm gave (\S+) cuda (\S+)", (folder / "slurm" / f"mig-seven-{seven}.out").read_text())
    assert sorted(cuda for _, cuda in sevens) == sorted(_slices("1g.5gb")), f"each run on its own 1g.5gb slice of the seven Slurm gave: {sevens}"

    run = MlflowClient(store).get_run(_cells(csv, "Run")[0])
    watched = json.loads(run.data.tags["radt.gpus"])
    assert [w["series"] for w in watched if w["gpu_instance"] is not None] == [f"gpu_1_mig_{int(index) - 6}"], (
        f"the run watches its slice (GPU 1, GPU instance {int(index) - 6}) and no other: {watched}"
    )
    assert _mig_changes(folder) == [], "a job never creates or destroys a MIG instance"
    assert "created on GPU" not in result.stderr and "assigned by Slurm; nothing is created" in (folder / "slurm" / f"mig-big-{big}.out").read_text()


def test_a_mig_profile_the_partition_does_not_offer_is_refused_in_one_line(folder, radt_home):
    (folder / "experiment.csv").write_text(HEADER + "lack,1,,,0,1g.5gb,train.py,host,\nlack,1,,,0,7g.40gb,train.py,host,\n")
    before = (folder / "experiment.csv").read_text()

    result = run_radt(["--slurm", "--slurm-partition", slurm.MIG_PARTITION, "experiment.csv"], env=_env(folder, radt_home), cwd=folder, timeout=180)

    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "radt: experiment.csv row 3: MIG 7g.40gb is not offered by partition mig (sinfo: gpu:1g.5gb:7, gpu:3g.20gb:2); "
        "pick a partition that offers it (--slurm-partition) or a profile it has"
    ], result.stderr
    assert (folder / "experiment.csv").read_text() == before and not (folder / "slurm").exists(), "nothing was submitted"

    whole = run_radt(["--slurm", "experiment.csv"], env=_env(folder, radt_home), cwd=folder, timeout=180)  # the default partition: whole GPUs only
    assert whole.returncode == 2 and "radt: experiment.csv row 2: MIG 1g.5gb is not offered by partition debug (sinfo: no MIG GRES type)" in whole.stderr
    assert not (folder / "slurm").exists()


def test_too_many_slices_of_a_profile_for_any_node_are_refused(folder, radt_home):
    (folder / "experiment.csv").write_text(HEADER + "many,1,,,0,3g.20gb,train.py,host,\n" * 3)

    result = run_radt(["--slurm", "--slurm-partition", slurm.MIG_PARTITION, "experiment.csv"], env=_env(folder, radt_home), cwd=folder, timeout=180)

    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "workload many/1 asks for 3 × MIG 3g.20gb on one node, but no node of partition mig has more than 2" in result.stderr
    assert not (folder / "slurm").exists()


def test_dry_run_says_devices_is_not_a_physical_index_and_shows_the_mig_gres(folder, radt_home):
    (folder / "experiment.csv").write_text(HEADER + "dry,1,,,2,3g.20gb,train.py,host,\n" + "dry,2,,,0,1g.5gb,train.py,host,\n" * 7)

    dry = run_radt(["--slurm", "--dry-run", "--slurm-partition", slurm.MIG_PARTITION, "experiment.csv"], env=_env(folder, radt_home), cwd=folder, timeout=180)

    assert dry.returncode == 0, dry.stderr
    assert "Under Slurm, Devices is not a physical GPU index" in dry.stdout
    sbatch = [line for line in dry.stdout.splitlines() if "sbatch" in line]
    assert "--gres=gpu:3g.20gb:1" in sbatch[0].split() and "--gres=gpu:1g.5gb:7" in sbatch[1].split(), sbatch
    assert "create MIG" not in dry.stdout and "run A on a MIG 3g.20gb slice that Slurm assigns the job" in dry.stdout, dry.stdout
    assert not (folder / "slurm").exists()


def test_mps_rows_on_a_partition_with_slurms_mps_gres_ask_for_it_and_use_the_sites_daemon(folder, tmp_path, radt_home, empty_sqlite):
    (folder / "experiment.csv").write_text(HEADER + "mps,1,,,2,MPS,train.py,host,\nmps,1,,,2,MPS,train.py,host,\n")
    four = json.dumps([{"name": "NVIDIA A100-SXM4-40GB", "uuid": f"GPU-a1000000-0000-4000-8000-00000000000{n}"} for n in range(4)])
    env = radt_env(radt_home, empty_sqlite(tmp_path / "store.db"), fake_gpus=four, extra={**fake_tools_env(folder), **slurm.env()})

    result = run_radt(["--slurm", "--slurm-partition", slurm.MPS_PARTITION, "--interval", "0.5", "experiment.csv"], env=env, cwd=folder, timeout=180)

    assert result.returncode == 0, result.stderr[-3000:]
    csv = folder / "experiment.csv"
    assert _cells(csv, "Status") == ["FINISHED"] * 2
    job = _cells(csv, "SlurmJob")[0]
    assert f"TresPerNode=gres:mps:{slurm.MPS_PER_GPU}" in _job(job), _job(job)
    output = (folder / "slurm" / f"mps-1-{job}.out").read_text()
    seen = re.findall(r"slurm gave (\S+) cuda (\S+)", output)
    assert [cuda for _, cuda in seen] == ["0", "0"], f"the runs see the MPS daemon's GPU 0: {seen}"
    events = [json.loads(line) for line in (folder / "tools.log").read_text().splitlines()] if (folder / "tools.log").exists() else []
    assert not [e for e in events if e["tool"] == "nvidia-cuda-mps-control"], "the site's prolog runs the daemon of Slurm's mps GRES, not radt"
    assert "radt starts none" in output
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    assert {client.get_run(r).data.tags["radt.devices"] for r in _cells(csv, "Run")} == {seen[0][0]}, "the runs watch the GPU Slurm gave the job"


def test_dry_run_shows_mps_gres_only_where_a_workload_can_use_it(folder, radt_home):
    rows = "d,1,,,2,MPS,train.py,host,\nd,1,,,2,MPS,train.py,host,\nd,2,,,0,MPS,train.py,host,\nd,2,,,1,-,train.py,host,\n"  # 2: MPS beside a whole GPU
    (folder / "experiment.csv").write_text(HEADER + rows)

    dry = run_radt(["--slurm", "--dry-run", "--slurm-partition", slurm.MPS_PARTITION, "experiment.csv"], env=_env(folder, radt_home), cwd=folder, timeout=180)

    assert dry.returncode == 0, dry.stderr
    sbatch = [line.split() for line in dry.stdout.splitlines() if "sbatch" in line]
    assert f"--gres=mps:{slurm.MPS_PER_GPU}" in sbatch[0] and "--gres=gpu:2" in sbatch[1], sbatch
    assert "MPS from Slurm's mps GRES" in dry.stdout and "start an MPS control daemon for GPU 0" in dry.stdout, dry.stdout


# --- which slices a job was given: AutoDetect=nvml's MIG UUIDs, or GRES indices in the node's order -----------------

GPU0 = Gpu(0, "GPU-aaaa", "00000000:07:00.0", "NVIDIA A100-SXM4-40GB", (8, 0), 6912, 1410, True, None, False)
GPU1 = Gpu(1, "GPU-bbbb", "00000000:0F:00.0", "NVIDIA A100-SXM4-40GB", (8, 0), 6912, 1410, False, None, False)
SLICES = [MigDevice(0, n, f"MIG-{n}", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "3g.20gb", n + 1, 0, None) for n in range(2)]
NODE = Machine("550.54.15", [GPU0, GPU1], SLICES)


def test_the_slices_named_in_the_jobs_cuda_visible_devices_are_its_own():
    assert given_devices(NODE, [1], "MIG-1") == ([], [SLICES[1]])
    assert given_devices(NODE, [], "MIG-GPU-aaaa/1/0") == ([], [SLICES[0]]), "drivers before R470 name a slice MIG-GPU-<uuid>/<gi>/<ci>"


def test_gres_indices_count_each_slice_of_a_gpu_in_mig_mode_and_each_other_gpu():
    assert given_devices(NODE, [0, 2], None) == ([1], [SLICES[0]]), "Slurm's device 2 is GPU 1: GPU 0 is its two slices"
