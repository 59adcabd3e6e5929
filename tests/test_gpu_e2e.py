"""`radt -d 0 -l nvml+host train.py` end to end on simulated GPUs, read back through MLflow.

The GPUs exist only below pynvml (tests/fakes/nvml_shadow puts the fake driver behind the real
pynvml module) and behind the `dcgmi` executable (tests/fakes/bin/dcgmi replays a real dmon log);
radt, MLflow and the stores are real. The training script keeps training until the store holds
enough GPU samples (or its own deadline passes), so no test waits a fixed time.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.conftest import radt_env, run_radt
from tests.fakes.fake_nvml import A100, H100

GPUS = json.dumps([{**H100, "load": 0.7}, {**A100, "load": 0.3}])

TRAIN = textwrap.dedent(
    """
    import os, sys, time
    from mlflow import MlflowClient
    import radt

    key, wanted = sys.argv[1], int(sys.argv[2])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    print(f"CUDA_VISIBLE_DEVICES={visible}", flush=True)
    client = MlflowClient()
    with radt.run() as run:
        run.log_param("cuda_visible_devices", visible)
        deadline = time.monotonic() + 40
        epoch = 0
        while True:
            started = time.monotonic()
            while time.monotonic() - started < 0.1:  # a CPU "epoch"
                sum(i * i for i in range(2000))
            run.log_metric("loss", 1.0 / (epoch + 1), step=epoch)
            epoch += 1
            if len(client.get_metric_history(run.run_id, key)) >= wanted or time.monotonic() > deadline:
                break
    print(f"trained {epoch} epochs", flush=True)
    """
)


def _only_run(client: MlflowClient, experiment: str):
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"experiment {experiment} was not created"
    runs = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("radt.role") == "run"]
    assert len(runs) == 1
    return runs[0]


def _series(client: MlflowClient, run_id: str, key: str) -> list:
    history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)
    steps = [m.step for m in history]
    assert steps == sorted(steps) and len(set(steps)) == len(steps), f"{key}: one increasing step per sample"
    return history


def _artifact(client: MlflowClient, run_id: str, path: str, into: Path) -> str:
    return Path(client.download_artifacts(run_id, path, str(into))).read_text()


def test_nvml_gpu_metrics_of_the_chosen_gpu_reach_mlflow(store_uri, radt_home, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    result = run_radt(
        ["-e", "gpu", "-d", "0", "-l", "nvml+host", "--interval", "0.2", "train.py", "system/gpu_0_sm_active", "8"],
        env=radt_env(radt_home, store_uri, fake_gpus=GPUS),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "skipped" not in result.stderr, result.stderr  # every listener opened
    assert "CUDA_VISIBLE_DEVICES=0" in result.stdout

    client = MlflowClient(store_uri)
    run = _only_run(client, "gpu")
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    assert run.data.params["cuda_visible_devices"] == "0"
    assert run.data.tags["radt.devices"] == "0"

    # the fake H100 runs at load 0.7: SM_UTIL 70 %, SM_OCCUPANCY 35 %, GRAPHICS 10 + 63 %, DRAM 28 % -> 0-1 ratios
    expected = {"sm_active": 0.7, "sm_occupancy": 0.35, "gr_engine_active": 0.73, "dram_active": 0.28, "tensor_active": 0.175}
    for name, value in expected.items():
        history = _series(client, run_id, f"system/gpu_0_{name}")
        assert len(history) >= 7, name  # GPM needs two snapshots, so one tick less than the basics
        assert all(m.value == pytest.approx(value) for m in history), name
    util = _series(client, run_id, "system/gpu_0_utilization_percentage")
    assert len(util) >= 8 and all(m.value == 70.0 for m in util)
    memory = _series(client, run_id, "system/gpu_0_memory_usage_megabytes")
    assert all(m.value == pytest.approx(512 * 1024 * 1024 / 1e6) for m in memory)
    energy = [m.value for m in _series(client, run_id, "system/gpu_0_energy_joules")]
    assert energy[0] == 0.0 and energy == sorted(energy) and energy[-1] > 0
    power = _series(client, run_id, "system/gpu_0_power_usage_watts")
    assert all(m.value == pytest.approx(60 + (560 - 60) * 0.7) for m in power)
    assert "system/gpu_0_process_memory_megabytes" in run.data.metrics
    assert len(_series(client, run_id, "system/cpu_utilization_percentage")) >= 5  # the host listener ran beside it
    assert not [k for k in run.data.metrics if k.startswith("system/gpu_1_")], "only -d 0 is watched"
    loss_steps = sorted(m.step for m in client.get_metric_history(run_id, "loss"))
    assert loss_steps and loss_steps == list(range(len(loss_steps)))  # the script's own metrics joined the run

    inventory = json.loads(_artifact(client, run_id, "radt/gpu-inventory.json", tmp_path))
    assert inventory["available"] is True
    assert [(g["name"], g["gpm_supported"]) for g in inventory["gpus"]] == [(H100["name"], True), (A100["name"], False)]
    assert "CUDA_VISIBLE_DEVICES=0" in _artifact(client, run_id, "radt/stdout.log", tmp_path)
    sources = json.loads(_artifact(client, run_id, "radt/radt-sources.json", tmp_path))
    assert sources["nvml"] == {"gpm": {"0": True}}


@pytest.mark.parametrize("store_uri", ["sqlite"], indirect=True)
def test_a_gpu_that_does_not_exist_is_refused_before_anything_starts(store_uri, radt_home, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    result = run_radt(
        ["-e", "gpu", "-d", "5", "-l", "nvml+host", "train.py", "system/gpu_0_sm_active", "1"],
        env=radt_env(radt_home, store_uri, fake_gpus=GPUS),
        cwd=tmp_path,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "GPU 5" in lines[0] and "0 to 1" in lines[0] and "-d" in lines[0]
    assert "CUDA_VISIBLE_DEVICES" not in result.stdout  # the script never ran
    client = MlflowClient(store_uri)
    assert client.get_experiment_by_name("gpu") is None
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []


def test_dcgmi_listener_records_smact_from_dmon(store_uri, radt_home, tmp_path, fixtures_dir):
    (tmp_path / "train.py").write_text(TRAIN)
    argv_file = tmp_path / "dcgmi-argv.jsonl"
    env = radt_env(radt_home, store_uri, fake_gpus=GPUS, fake_bin=True, extra={"RADT_FAKE_DCGMI_ARGS": str(argv_file), "RADT_FIXTURES": str(fixtures_dir)})
    result = run_radt(["-e", "dcgm", "-d", "0", "-l", "dcgmi", "--interval", "0.2", "train.py", "system/gpu_0_sm_active", "6"], env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "skipped" not in result.stderr, result.stderr

    argv = json.loads(argv_file.read_text().splitlines()[0])
    assert argv[0] == "dmon" and argv[argv.index("-i") + 1] == "0" and argv[argv.index("-d") + 1] == "200"

    recorded = set()
    for line in (fixtures_dir / "mnist_dcgmi_dmon_18fields.txt").read_text().splitlines():
        if line.startswith("#Entity"):
            column = line.split().index("SMACT") + 1  # "GPU 0" takes two fields where "#Entity" takes one
        elif line.startswith("GPU 0 "):
            recorded.add(float(line.split()[column]))

    client = MlflowClient(store_uri)
    run = _only_run(client, "dcgm")
    smact = _series(client, run.info.run_id, "system/gpu_0_sm_active")
    assert len(smact) >= 6
    assert {m.value for m in smact} <= recorded
    assert _series(client, run.info.run_id, "system/gpu_0_gr_engine_active")
    assert not [k for k in run.data.metrics if k.startswith("system/gpu_") and not k.startswith("system/gpu_0_")]
    sources = json.loads(_artifact(client, run.info.run_id, "radt/radt-sources.json", tmp_path))
    assert 1002 in sources["dcgm"]["dcgm_fields"]
