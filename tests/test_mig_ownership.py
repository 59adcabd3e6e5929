"""Issue 25, points 1 and 2: a run holds only its own devices, and a GPU in MIG mode is its slices.

A real Prometheus scrapes a dcgm-exporter stand-in serving the label sets of real nodes: an A100 in MIG mode whose
slices GPU_I_ID 7 and 8 run two Slurm jobs (`jobid`/`userid` labels, as a university cluster's prolog writes them), a
second GPU of a third job with the pod labels of a GKE node. radt runs as a user starts it, with the fake NVML missing
(no driver in the container) or present with GPU 0 in MIG mode. Every series of another job must stay out of the run,
live and on `radt import --prometheus`; the slices the run's own processes use must be in it.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from radt.catalogue import EXPORTER_METRICS, resolve
from radt.cli import main as radt_main
from radt.collectors.sources import gpus
from radt.collectors.sources.base import SamplingContext
from radt.collectors.sources.prometheus import Backfill, PrometheusSource, backfill
from radt.collectors.sources.promql import JOB_LABELS
from radt.runmodel import PROMETHEUS_GAP_TAG
from tests.fakes.fake_nvml import A100
from tests.support import prometheus as prom
from tests.support.dcgm_exporter import Device
from tests.support.radtproc import radt_env, run_radt

LOG = Path(__file__).parent / "fixtures" / "real-tool-logs" / "mnist_dcgmi_dmon_18fields.txt"
HERE = socket.gethostname()
NEWER = "node-newer"  # a newer exporter that also names each slice's MIG device UUID in a label
A100_80 = {**A100, "name": "NVIDIA A100 80GB PCIe", "memory_total": 85899345920}
GPU0 = "GPU-a100a100-0000-4000-8000-000000000000"  # the A100 in MIG mode
GPU1 = "GPU-a100a100-0000-4000-8000-000000000001"
MIG7 = "MIG-7f2e1c55-2b8d-5a0e-9c41-000000000007"  # the run's slice, GPU_I_ID 7
MIG8 = "MIG-8a3f2d66-3c9e-5b1f-8d52-000000000008"  # another job's slice, GPU_I_ID 8
MINE, OTHER, THIRD = "4242", "4343", "4444"  # Slurm jobs: the run's, slice 8's, GPU 1's
POD = (("pod", "trainer-7c9f-0"), ("namespace", "ml"), ("container", "trainer"))  # as on a GKE node
DEVICES = [
    Device(HERE, 0, 0, gi=7, profile="1g.10gb", gpu_uuid=GPU0, labels=(("jobid", MINE), ("userid", "1001"))),
    Device(HERE, 0, 2, gi=8, profile="1g.10gb", gpu_uuid=GPU0, labels=(("jobid", OTHER), ("userid", "1002"))),
    Device(HERE, 1, 1, gpu_uuid=GPU1, labels=(("jobid", THIRD), ("userid", "1003"), *POD)),
    Device(NEWER, 0, 0, gi=7, gpu_uuid=GPU0, labels=(("mig_uuid", MIG7),)),
    Device(NEWER, 0, 2, gi=8, gpu_uuid=GPU0, labels=(("mig_uuid", MIG8),)),
]
SCRAPES = 3
TRAIN = """
import os, sys, time
import radt
from tests.support.stored import points

if len(sys.argv) > 3:  # the script opens its CUDA context on the slice: the driver lists it there
    with open(sys.argv[3], "w") as pids:
        pids.write(str(os.getpid()))
with radt.run() as run:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if points(run.run_id, sys.argv[1]) >= int(sys.argv[2]):
            break
        time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def served():
    """(exporter, Prometheus, time before the first scrape in ms) once SCRAPES scrapes are stored."""
    start_ms = int(time.time() * 1000)
    until = f'DCGM_FI_PROF_SM_ACTIVE{{Hostname="{HERE}",GPU_I_ID="8"}}[1h]'
    with prom.serving(LOG, DEVICES, until, SCRAPES) as (exporter, server):
        yield exporter, server, start_ms


def held(server: prom.Prometheus, host: str, gpu: int, gi: int | None, start_ms: int, end_ms: int) -> dict[str, dict[int, float]]:
    """{catalogue key: {timestamp: value}} that Prometheus itself holds for one GPU or slice of `host` in [start_ms, end_ms]."""
    names = "|".join(EXPORTER_METRICS)
    promql = f'{{__name__=~"{names}",Hostname="{host}",gpu="{gpu}",GPU_I_ID="{"" if gi is None else gi}"}}[{end_ms - start_ms + 1}ms]'
    data = server.api("/api/v1/query", query=promql, time=f"{end_ms / 1000:.3f}")
    where = f"gpu_{gpu}_" + (f"mig_{gi}_" if gi is not None else "")
    out: dict[str, dict[int, float]] = {}
    for series in data["result"]:
        name, scale = EXPORTER_METRICS[series["metric"]["__name__"]]
        stamps = {round(float(t) * 1000): float(v) * scale for t, v in series["values"]}
        out[f"system/{where}{name}"] = {t: v for t, v in stamps.items() if start_ms <= t <= end_ms}
    return {k: v for k, v in out.items() if v}


def place(key: str) -> tuple[int | None, int | None]:
    """(GPU, GPU instance id) a stored key was measured on."""
    found = resolve(key)
    return found.gpu, found.mig


def gpu_series(client: MlflowClient, run_id: str) -> dict[str, dict[int, float]]:
    """{key: {timestamp: value}} of the run's GPU series; a key logged twice at one time fails."""
    out: dict[str, dict[int, float]] = {}
    for where in client.get_run(run_id).data.metrics:
        if where.startswith("system/gpu_"):
            history = client.get_metric_history(run_id, where)
            assert len({m.timestamp for m in history}) == len(history), where
            out[where] = {m.timestamp: m.value for m in history}
    return out


def only_slice_7(server: prom.Prometheus, got: dict[str, dict[int, float]], start_ms: int, end_ms: int) -> None:
    """The run's GPU series are slice 7's and nothing else; each point one Prometheus holds for slice 7."""
    assert got, "no GPU series at all"
    foreign = sorted(k for k in got if not k.startswith("system/gpu_0_mig_7_"))
    assert not foreign, f"another job's series in the run: {foreign}"
    every = held(server, HERE, 0, 7, start_ms - 60_000, end_ms + 5_000)
    for where, points in got.items():
        assert points.items() <= every[where].items(), where


def store(tmp_path: Path, sqlite_template: Path) -> str:
    path = tmp_path / "store.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


def the_run(uri: str):
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.`radt.role` = 'run'")
    assert len(runs) == 1, runs
    return client, runs[0]


# --- point 1: NVML missing, the run's GPU given as a MIG UUID ---------------------------------


@pytest.mark.parametrize("given", ["CUDA_VISIBLE_DEVICES", "-d"])
def test_without_nvml_a_mig_uuid_run_holds_its_slice_and_no_other_jobs_series(given, served, tmp_path, sqlite_template, radt_home, capsys):
    """Slurm gives the job slice 7 (CUDA_VISIBLE_DEVICES=MIG-…, or the user passes -d MIG-…); radt in a container without
    the driver used to watch every GPU and stored slice 8 (job 4343) and GPU 1 (job 4444). Now the exporter's jobid label
    proves slice 7 is this job's, live and on import, and one line says what the nvml/dcgm listeners could not watch."""
    _, server, _ = served
    uri = store(tmp_path, sqlite_template)
    (tmp_path / "train.py").write_text(TRAIN)
    extra = {"RADT_PROMETHEUS_URL": server.url, "SLURM_JOB_ID": MINE}
    args = ["-l", "prometheus+host", "--interval", "0.5"]
    if given == "-d":
        args += ["-d", MIG7]
    else:
        extra["CUDA_VISIBLE_DEVICES"] = MIG7
    done = run_radt([*args, "train.py", "system/gpu_0_mig_7_sm_active", "2"], radt_env(radt_home, uri, extra=extra), tmp_path, timeout=90)
    assert done.returncode == 0, done.stderr
    client, run = the_run(uri)
    start, end = int(run.info.start_time), int(run.info.end_time)
    got = gpu_series(client, run.info.run_id)
    only_slice_7(server, got, start, end)
    assert "watching every GPU" not in done.stderr
    said = [line for line in done.stderr.splitlines() if "cannot map to a GPU" in line]
    assert len(said) == 1 and MIG7 in said[0] and "watch none of them" in said[0], done.stderr
    assert len(got["system/gpu_0_mig_7_sm_active"]) >= 2
    assert PROMETHEUS_GAP_TAG not in run.data.tags, run.data.tags.get(PROMETHEUS_GAP_TAG)
    code = radt_main(["import", "--prometheus", server.url, "--run", run.info.run_id, "--store", uri])
    assert code == 0, capsys.readouterr().err
    only_slice_7(server, gpu_series(client, run.info.run_id), start, end)  # the import adds nothing of another job's


def test_without_proof_nothing_is_watched_and_one_line_says_what(served):
    """A MIG UUID with no Slurm job (no jobid to match) and an exporter naming no MIG UUID: no series is the run's; the
    one line names the device and why. A newer exporter's MIG UUID label proves the slice without a job."""
    _, server, start_ms = served
    lines: list[str] = []
    source = PrometheusSource(server.url, HERE, report=lines.append, uuids={})
    source.open(SamplingContext(interval=0.5, devices=[], given=(MIG7,)))
    assert source.readings(int(time.time() * 1000)) == []
    assert len(lines) == 1 and MIG7 in lines[0] and "not watched" in lines[0], lines
    end_ms = int(time.time() * 1000)
    assert backfill(Backfill(server.url, HERE, [], start_ms, end_ms, 1.0, given=(MIG7,))) == []
    assert backfill(Backfill(server.url, HERE, None, start_ms, end_ms, 1.0, given=(MIG7,))) == []  # never every GPU
    mixed = backfill(Backfill(server.url, HERE, [1], start_ms, end_ms, 1.0, given=(MIG7,)))  # -d MIG-…+1: GPU 1 by index
    assert {place(p.key) for p in mixed} == {(1, None)}
    newer = backfill(Backfill(server.url, NEWER, [], start_ms, end_ms, 1.0, given=(MIG7,)))
    assert newer and {place(p.key) for p in newer} == {(0, 7)}
    # the old form MIG-GPU-<uuid>/<gi>/<ci> names the GPU and the instance: proof enough
    old = backfill(Backfill(server.url, HERE, [], start_ms, end_ms, 1.0, given=(f"MIG-{GPU0}/8/0",)))
    assert old and {place(p.key) for p in old} == {(0, 8)}


def test_a_series_labelled_with_another_job_is_never_the_runs(served):
    """With GPUs the run was given by index (NVML present), a series the exporter labels with another Slurm job stays out."""
    _, server, start_ms = served
    end_ms = int(time.time() * 1000)
    owners = dict.fromkeys(JOB_LABELS, MINE)
    points = backfill(Backfill(server.url, HERE, [0, 1], start_ms, end_ms, 1.0, slices=[(0, 7), (0, 8)], owners=owners))
    assert points and {place(p.key) for p in points} == {(0, 7)}


def test_without_nvml_uuids_never_widen_to_every_gpu():
    """The plan without NVML: MIG UUIDs watch no GPU by index, GPU UUIDs on a Slurm node Slurm's own GPUs of the job."""
    plan = gpus.plan_without_nvml(None, None, {"CUDA_VISIBLE_DEVICES": MIG7}, "NVML Shared Library Not Found")
    assert (plan.indices, plan.unmapped) == ([], (MIG7,))
    assert len(plan.notes) == 1 and "watching every GPU" not in plan.notes[0]
    plan = gpus.plan_without_nvml([MIG7, 1], None, {})
    assert (plan.indices, plan.unmapped, plan.visible) == ([1], (MIG7,), f"{MIG7},1")
    slurm = gpus.plan_without_nvml(None, None, {"CUDA_VISIBLE_DEVICES": GPU1, "SLURM_JOB_GPUS": "1"})
    assert (slurm.indices, slurm.unmapped) == ([1], (GPU1,))


# --- point 2: NVML present, GPU 0 in MIG mode, no -d ------------------------------------------


def mig_machine(pids_file: Path) -> str:
    """The fake NVML: GPU 0 an A100 80GB in MIG mode with slices 7 and 8 (the script's pid listed on 7), GPU 1 whole."""
    instances = [
        {"gi": 7, "profile": "1g.10gb", "uuid": MIG7, "processes_from": str(pids_file)},
        {"gi": 8, "profile": "1g.10gb", "uuid": MIG8, "processes": [{"pid": 1, "used": None}]},  # another job's process
    ]
    return json.dumps([{**A100_80, "uuid": GPU0, "mig": instances}, {**A100_80, "uuid": GPU1}])


def test_a_gpu_in_mig_mode_is_the_slices_the_runs_processes_use(served, tmp_path, sqlite_template, radt_home, capsys):
    """`radt --prometheus URL train.py`, no -d: the script runs on slice 7 of GPU 0 (NVML lists its pid there). The run used
    to hold only GPU 1 and say "no dcgm-exporter series for GPU 0"; now slice 7's series are in it, slice 8's are not."""
    _, server, _ = served
    uri = store(tmp_path, sqlite_template)
    (tmp_path / "train.py").write_text(TRAIN)
    pids = tmp_path / "slice7.pids"
    env = radt_env(radt_home, uri, fake_gpus=mig_machine(pids))
    done = run_radt(["--prometheus", server.url, "--interval", "0.5", "train.py", "system/gpu_0_mig_7_sm_active", "2", str(pids)], env, tmp_path, timeout=90)
    assert done.returncode == 0, done.stderr
    assert "no dcgm-exporter series" not in done.stderr, done.stderr
    client, run = the_run(uri)
    got = gpu_series(client, run.info.run_id)
    mine = {k: v for k, v in got.items() if "_mig_" in k}
    assert len(mine.get("system/gpu_0_mig_7_sm_active", {})) >= 2, sorted(got)
    only_slice_7(server, mine, int(run.info.start_time), int(run.info.end_time))  # slice 8 (another job's process) is not the run's
    assert any(k.startswith("system/gpu_1_") for k in got)  # the second GPU, as before
    listed = {e["series"] for e in json.loads(client.get_run(run.info.run_id).data.tags["radt.gpus"])}
    assert "gpu_0_mig_7" in listed and "gpu_0_mig_8" not in listed, listed  # the slice it ran on, for a later import
    code = radt_main(["import", "--prometheus", server.url, "--run", run.info.run_id, "--store", uri])
    err = capsys.readouterr().err
    assert code == 0 and "no dcgm-exporter series" not in err, err
    assert PROMETHEUS_GAP_TAG not in client.get_run(run.info.run_id).data.tags


def test_import_gpus_0_on_a_mig_gpu_imports_its_slices(served, tmp_path, sqlite_template, capsys):
    """`radt import --prometheus … --gpus 0` where GPU 0 is in MIG mode: its slices, not nothing and a gap; with the run's
    Slurm job on it, only that job's slice."""
    _, server, start_ms = served
    uri = store(tmp_path, sqlite_template)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("imported")
    runs = {}
    for label, tags in (("any", {}), ("job", {"radt.slurm.job_id": MINE})):
        run = client.create_run(experiment, start_time=start_ms, tags=tags)
        client.set_terminated(run.info.run_id, end_time=int(time.time() * 1000))
        runs[label] = run.info.run_id
    code = radt_main(["import", "--prometheus", server.url, "--run", runs["any"], "--store", uri, "--host", HERE, "--gpus", "0"])
    err = capsys.readouterr().err
    assert code == 0 and "no dcgm-exporter series" not in err, err
    got = gpu_series(client, runs["any"])
    assert {place(k) for k in got} == {(0, 7), (0, 8)}, sorted(got)
    assert PROMETHEUS_GAP_TAG not in client.get_run(runs["any"]).data.tags
    end_ms = int(client.get_run(runs["any"]).info.end_time)
    for gi in (7, 8):
        for where, points in held(server, HERE, 0, gi, start_ms, end_ms).items():
            assert points.items() <= got[where].items(), where
    assert radt_main(["import", "--prometheus", server.url, "--run", runs["job"], "--store", uri, "--host", HERE, "--gpus", "0"]) == 0
    only_slice_7(server, gpu_series(client, runs["job"]), start_ms, end_ms)
