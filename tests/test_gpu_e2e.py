"""`radt -d 0 -l nvml+host train.py` end to end on simulated GPUs, read back through MLflow.

The GPUs exist only below pynvml (tests/fakes/nvml_shadow puts the fake driver behind the real
pynvml module) and behind the `dcgmi` executable (tests/fakes/bin/dcgmi replays a real dmon log);
radt, MLflow and the stores are real. The training script keeps training until the store holds
enough GPU samples (or its own deadline passes), so no test waits a fixed time.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.fakes.fake_nvml import A100, H100, dgx_station, eight_h100, mig_gpu
from tests.support.radtproc import radt_command, radt_env, run_radt

GPUS = json.dumps([{**H100, "load": 0.7}, {**A100, "load": 0.3}])

TRAIN = textwrap.dedent(
    """
    import os, sys, time
    import radt
    from tests.support.stored import points

    key, wanted = sys.argv[1], int(sys.argv[2])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    print(f"CUDA_VISIBLE_DEVICES={visible}", flush=True)
    print(f"CUDA_DEVICE_ORDER={os.environ.get('CUDA_DEVICE_ORDER', 'unset')}", flush=True)
    with radt.run() as run:
        run.log_param("cuda_visible_devices", visible)
        deadline = time.monotonic() + 40
        epoch = 0
        while True:
            time.sleep(0.1)  # an "epoch": the GPUs' activity is the fake driver's, so burning this machine's CPU would only slow the tests beside it
            run.log_metric("loss", 1.0 / (epoch + 1), step=epoch)
            epoch += 1
            if points(run.run_id, key) >= wanted or time.monotonic() > deadline:
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
    tags = client.get_run(run_id).data.tags  # diagnosed as it ended (issue 54): a busy GPU using its tensor pipes, nothing found
    assert tags["radt.diagnosis.version"] == "1" and tags["radt.diagnosis"] == "", tags.get("radt.diagnosis")
    assert float(tags["radt.footprint.energy_kwh"]) > 0 and float(tags["radt.footprint.gpu_hours"]) > 0
    entry = json.loads(tags["radt.gpus"])[0]
    assert entry["memory_total_mb"] == round(H100["memory_total"] / 1e6), "the GPU's size, which fits_smaller says a slice against"


@pytest.mark.parametrize("store_uri", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("d", "needles"), [("5", ("GPU 5", "0 to 1", "-d")), ("GPU-0bad", ("-d GPU-0bad is no GPU or MIG device", "fix -d")), ("MIG-77", ("-d MIG-77", "fix -d"))]
)
def test_a_gpu_that_does_not_exist_is_refused_before_anything_starts(store_uri, radt_home, tmp_path, d, needles):
    (tmp_path / "train.py").write_text(TRAIN)
    result = run_radt(
        ["-e", "gpu", "-d", d, "-l", "nvml+host", "train.py", "system/gpu_0_sm_active", "1"],
        env=radt_env(radt_home, store_uri, fake_gpus=GPUS),
        cwd=tmp_path,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert all(n in lines[0] for n in needles), lines[0]
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


# --- which GPU the script sees is the GPU radt watches (collectors/sources/gpus.py) ----------------------------

STATION = dgx_station()
for _i, _load in enumerate((0.1, 0.2, 0.3, 0.4, 0.9)):
    STATION[_i]["load"] = _load  # GPU utilization tells the GPUs apart: NVML 3 (the display) 40 %, NVML 4 90 %


def _env(home: Path, store: str, gpus: list[dict], **cuda: str) -> dict[str, str]:
    """radt's environment on these simulated GPUs, with exactly the CUDA_* variables given (none inherited from this machine)."""
    env = radt_env(home, store, fake_gpus=json.dumps(gpus))
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        env.pop(name, None)
    return env | cuda


def _gpu_keys(run) -> set[str]:
    return {k.split("_")[1] for k in run.data.metrics if k.startswith("system/gpu_")}


def _tag(run) -> list[dict]:
    return json.loads(run.data.tags["radt.gpus"])


def _entry(spec: dict, index: int, cuda: int | None, mig: dict | None = None) -> dict:
    return {
        "series": f"gpu_{index}" + (f"_mig_{mig['gi']}" if mig else ""),
        "index": index,
        "name": spec["name"],
        "uuid": (mig or spec)["uuid"],
        "pci_bus_id": spec["pci_bus_id"],
        "mig_profile": mig["profile"] if mig else None,
        "gpu_instance": mig["gi"] if mig else None,
        "cuda": cuda,
        "memory_total_mb": round((mig or spec).get("memory_total", 10 * 1024**3 if mig else 85899345920) / 1e6),  # the fake's defaults
    }


@pytest.mark.parametrize("store_uri", ["sqlite"], indirect=True)
def test_dgx_station_cuda_visible_devices_3_is_watched_as_the_a100_cuda_calls_3(store_uri, radt_home, tmp_path):
    """CUDA numbers GPUs fastest first by default: its 3 is the fourth A100 (NVML 4), not NVML's 3, the display GPU."""
    (tmp_path / "train.py").write_text(TRAIN)
    env = _env(radt_home, store_uri, STATION, CUDA_VISIBLE_DEVICES="3")
    result = run_radt(["-e", "station", "-l", "nvml", "--interval", "0.2", "train.py", "system/gpu_4_utilization_percentage", "3"], env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "CUDA_VISIBLE_DEVICES=3\nCUDA_DEVICE_ORDER=unset" in result.stdout, "the script's own CUDA_VISIBLE_DEVICES is left alone"
    client = MlflowClient(store_uri)
    run = _only_run(client, "station")
    assert _gpu_keys(run) == {"4"}
    assert all(m.value == 90.0 for m in _series(client, run.info.run_id, "system/gpu_4_utilization_percentage"))
    assert _tag(run) == [_entry(STATION[4], 4, 0)]
    inventory = json.loads(_artifact(client, run.info.run_id, "radt/gpu-inventory.json", tmp_path))
    assert inventory["watched"] == _tag(run)
    assert [(g["index"], g["name"], g["pci_bus_id"]) for g in inventory["gpus"]][3] == (3, "DGX Display", "00000000:C1:00.0")


@pytest.mark.parametrize("store_uri", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("d", "order", "seen", "seen_order", "index"),
    [
        ("3", None, "3", "PCI_BUS_ID", 3),
        (STATION[4]["uuid"][:13], "FASTEST_FIRST", STATION[4]["uuid"], "FASTEST_FIRST", 4),
        (STATION[0]["uuid"], None, "0", "PCI_BUS_ID", 0),
    ],
    ids=["index-is-nvmls", "abbreviated-uuid-under-the-users-order", "full-uuid"],
)
def test_d_names_gpus_as_nvidia_smi_does_and_the_script_sees_the_same_gpu(store_uri, radt_home, tmp_path, d, order, seen, seen_order, index):
    (tmp_path / "train.py").write_text(TRAIN)
    env = _env(radt_home, store_uri, STATION, **({"CUDA_DEVICE_ORDER": order} if order else {}))
    result = run_radt(
        ["-e", "d", "-d", d, "-l", "nvml", "--interval", "0.2", "train.py", f"system/gpu_{index}_utilization_percentage", "3"], env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert f"CUDA_VISIBLE_DEVICES={seen}\nCUDA_DEVICE_ORDER={seen_order}" in result.stdout
    run = _only_run(MlflowClient(store_uri), "d")
    assert _gpu_keys(run) == {str(index)}
    assert _tag(run) == [_entry(STATION[index], index, 0)]


@pytest.mark.parametrize("store_uri", ["sqlite"], indirect=True)
def test_uuids_and_an_entry_cuda_stops_at_on_an_eight_gpu_host(store_uri, radt_home, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    gpus = eight_h100()
    visible = "5,GPU-2222,GPU-9,1"  # CUDA sees GPU 5 and GPU 2, and stops at GPU-9, which no GPU's UUID starts with
    env = _env(radt_home, store_uri, gpus, CUDA_VISIBLE_DEVICES=visible)
    result = run_radt(["-e", "eight", "-l", "nvml", "--interval", "0.2", "train.py", "system/gpu_2_sm_active", "3"], env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"CUDA_VISIBLE_DEVICES={visible}" in result.stdout
    notes = [line for line in result.stderr.splitlines() if "GPU-9" in line]
    assert notes == [
        f"radt: CUDA_VISIBLE_DEVICES={visible}: 'GPU-9' is no GPU or MIG device of this machine; CUDA stops there, so the script sees 2 device(s) and radt watches those"
    ]
    client = MlflowClient(store_uri)
    run = _only_run(client, "eight")
    assert _gpu_keys(run) == {"5", "2"}
    assert all(m.value == pytest.approx(0.3) for m in _series(client, run.info.run_id, "system/gpu_2_sm_active"))
    assert _tag(run) == [_entry(gpus[2], 2, 1), _entry(gpus[5], 5, 0)]


def test_two_runs_on_their_own_mig_slices_of_one_h100_record_their_own_activity(pg_uri, radt_home, tmp_path):
    """MIG collocation: each radt is given its slice's MIG UUID and records that slice's GPM, not the GPU's nor its neighbour's."""
    (tmp_path / "train.py").write_text(TRAIN)
    h100 = mig_gpu(H100, (1, "3g.40gb", 0.8), (5, "1g.10gb", 0.2), pci_bus_id="00000000:18:00.0", uuid="GPU-4b1d0e55-7c3a-4e6b-a2f0-9d8e7c6b5a41")
    runs = {}
    for letter, mig in zip("AB", h100["mig"]):
        env = _env(radt_home, pg_uri, [h100], CUDA_VISIBLE_DEVICES=mig["uuid"])
        command = radt_command("-e", "mig", "-n", letter, "-l", "nvml", "--interval", "0.2", "train.py", f"system/gpu_0_mig_{mig['gi']}_sm_active", "4")
        runs[letter] = (mig, subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    client = MlflowClient(pg_uri)
    exp = None
    for letter, (mig, proc) in runs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert f"CUDA_VISIBLE_DEVICES={mig['uuid']}" in out
        exp = client.get_experiment_by_name("mig")
        run = client.search_runs([exp.experiment_id], filter_string=f"attributes.run_name = '{letter}'")[0]
        other = 5 if mig["gi"] == 1 else 1
        history = _series(client, run.info.run_id, f"system/gpu_0_mig_{mig['gi']}_sm_active")
        assert len(history) >= 4 and all(m.value == pytest.approx(mig["load"]) for m in history)
        assert not [k for k in run.data.metrics if f"_mig_{other}_" in k], "the neighbour's slice is not this run's"
        assert "system/gpu_0_sm_active" not in run.data.metrics and "system/gpu_0_power_usage_watts" in run.data.metrics
        assert _tag(run) == [_entry(h100, 0, None), _entry(h100, 0, 0, mig)]
        assert "radt.mig_activity" not in run.data.tags


@pytest.mark.parametrize("store_uri", ["sqlite"], indirect=True)
def test_an_a100_mig_run_without_gpm_says_its_slices_activity_is_unavailable(store_uri, radt_home, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    a100 = mig_gpu(A100, (2, "1g.5gb", 0.6), pci_bus_id="00000000:07:00.0", uuid="GPU-5fd15f35-a1b2-4c3d-8e9f-0a1b2c3d4e5f")
    mig = a100["mig"][0]
    env = _env(radt_home, store_uri, [a100])
    result = run_radt(
        ["-e", "a100", "-d", mig["uuid"], "-l", "nvml", "--interval", "0.2", "train.py", "system/gpu_0_mig_2_memory_usage_megabytes", "3"],
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert f"CUDA_VISIBLE_DEVICES={mig['uuid']}\n" in result.stdout, "-d takes a MIG UUID, which the script gets"
    run = _only_run(MlflowClient(store_uri), "a100")
    tag = "unavailable: GPM per MIG instance not supported on NVIDIA A100-SXM4-40GB; the GPU-level series are the whole GPU's"
    assert run.data.tags["radt.mig_activity"] == tag
    assert not [k for k in run.data.metrics if k.endswith("_sm_active")]
    assert _tag(run) == [_entry(a100, 0, None), _entry(a100, 0, 0, mig)]


@pytest.mark.parametrize("store_uri", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("listeners", "key", "tagged"),
    [("dcgm", "sm_active", False), ("nvml+dcgm", "sm_active", False), ("nvml", "memory_usage_megabytes", True)],
    ids=["dcgm", "nvml+dcgm", "nvml-only"],
)
def test_dcgm_records_an_a100_mig_slices_own_activity_which_gpm_cannot(store_uri, radt_home, tmp_path, fixtures_dir, listeners, key, tagged):
    """An A100 has no GPM, so NVML cannot read a slice's activity; DCGM can (dmon's GPU-I line), and then the run has no radt.mig_activity tag."""
    (tmp_path / "train.py").write_text(TRAIN)
    a100 = mig_gpu(A100, (2, "3g.20gb", 0.6), (5, "1g.5gb", 0.1), pci_bus_id="00000000:07:00.0", uuid="GPU-5fd15f35-a1b2-4c3d-8e9f-0a1b2c3d4e5f")
    mig = a100["mig"][0]
    hierarchy = [{"gpu": 0, "uuid": a100["uuid"], "instances": [{"gi": 2, "entity": 200, "factor": 0.5}, {"gi": 5, "entity": 500, "factor": 0.25}]}]
    argv_file = tmp_path / "dcgmi-argv.jsonl"
    extra = {"RADT_FAKE_DCGMI_ARGS": str(argv_file), "RADT_FIXTURES": str(fixtures_dir), "RADT_FAKE_DCGMI_MIG": json.dumps(hierarchy)}
    env = radt_env(radt_home, store_uri, fake_gpus=json.dumps([a100]), fake_bin=True, extra=extra)
    env.pop("CUDA_DEVICE_ORDER", None)
    env["CUDA_VISIBLE_DEVICES"] = mig["uuid"]
    result = run_radt(["-e", "a100", "-l", listeners, "--interval", "0.2", "train.py", f"system/gpu_0_mig_2_{key}", "4"], env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "skipped" not in result.stderr, result.stderr
    client = MlflowClient(store_uri)
    run = _only_run(client, "a100")
    assert _tag(run) == [_entry(a100, 0, None), _entry(a100, 0, 0, mig)]
    assert not [k for k in run.data.metrics if "_mig_5_" in k], "the neighbour's slice is not this run's"
    if not tagged:
        recorded = set()  # the fake prints the slice's line as the recorded GPU 0 line times 0.5
        for line in (fixtures_dir / "mnist_dcgmi_dmon_18fields.txt").read_text().splitlines():
            if line.startswith("#Entity"):
                column = line.split().index("SMACT") + 1
            elif line.startswith("GPU 0 "):
                recorded.add(round(float(line.split()[column]) * 0.5, 3))
        smact = _series(client, run.info.run_id, "system/gpu_0_mig_2_sm_active")
        assert len(smact) >= 4 and {m.value for m in smact} <= recorded
        assert "system/gpu_0_power_usage_watts" in run.data.metrics, "the GPU's own series beside the slice's"
        assert "radt.mig_activity" not in run.data.tags
        discovery, dmon = [json.loads(line) for line in argv_file.read_text().splitlines()][:2]
        assert discovery == ["discovery", "-c"] and dmon[0] == "dmon" and dmon[dmon.index("-i") + 1] == "0,i:200"
        sources = json.loads(_artifact(client, run.info.run_id, "radt/radt-sources.json", tmp_path))
        assert sources["dcgm"]["mig_instances"] == {"0/2": 200}
    else:
        tag = "unavailable: GPM per MIG instance not supported on NVIDIA A100-SXM4-40GB; the GPU-level series are the whole GPU's"
        assert run.data.tags["radt.mig_activity"] == tag
        assert not [k for k in run.data.metrics if k.endswith("_sm_active")]
