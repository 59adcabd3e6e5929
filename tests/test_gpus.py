"""collectors/sources/gpus.py against simulated machines behind the real pynvml: every way a script names its GPUs
maps to the physical GPU (UUID, PCI bus id) and MIG slice that radt watches.

The machines: a DGX Station A100 (the "DGX Display" GPU sits at NVML index 3 by its PCI bus id, so
CUDA's fastest-first 3 is NVML's 4), an eight-H100 host, H100/A100 in MIG mode, and mixed hosts where
CUDA's fastest-first order can only be estimated.
"""

from __future__ import annotations

import json

import pynvml
import pytest

from radt.collectors.experiment.csvfile import ExperimentFile, real_machine
from radt.collectors.experiment.csvfile import plan as plan_experiment
from radt.collectors.sources import gpus
from tests.fakes.fake_nvml import A100, H100, ManualClock, dgx_station, eight_h100, install_fake, mig_gpu

STATION = dgx_station()
EIGHT = eight_h100()
MIG_H100 = mig_gpu(H100, (1, "3g.40gb", 0.8), (5, "1g.10gb", 0.2))


@pytest.fixture
def machine(monkeypatch):
    """machine(specs) -> collectors.sources.gpus.machine() of these simulated GPUs."""

    def build(config) -> gpus.Machine:
        install_fake(pynvml, config, monkeypatch.setattr, nvml=pynvml, clock=ManualClock())
        return gpus.machine()

    return build


def seen(visible: str | None, mach: gpus.Machine, order: str | None = None) -> list[tuple[str, int | None]]:
    watched, _ = gpus.visible_devices(visible, mach, order)
    return [(w.series, w.cuda) for w in watched]


def test_machine_lists_gpus_with_pci_bus_ids_and_mig_devices(machine):
    mach = machine({"driver": "570.86.15", "gpus": [*STATION[:2], {**MIG_H100, "pci_bus_id": "00000000:9A:00.0"}]})
    assert mach.driver == "570.86.15"
    assert [(g.index, g.pci_bus_id, g.name, g.mig_mode) for g in mach.gpus] == [
        (0, "00000000:01:00.0", "NVIDIA A100-SXM4-40GB", False),
        (1, "00000000:47:00.0", "NVIDIA A100-SXM4-40GB", False),
        (2, "00000000:9A:00.0", "NVIDIA H100 80GB HBM3", True),
    ]
    assert mach.gpus[0].uuid == STATION[0]["uuid"] and mach.gpus[2].compute_capability == (9, 0)
    assert [(m.gpu, m.index, m.gpu_instance, m.compute_instance, m.profile, m.uuid) for m in mach.migs] == [
        (2, 0, 1, 0, "3g.40gb", MIG_H100["mig"][0]["uuid"]),
        (2, 1, 5, 0, "1g.10gb", MIG_H100["mig"][1]["uuid"]),
    ]
    assert mach.migs[0].name == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"


def test_no_driver_is_one_reason(machine):
    with pytest.raises(gpus.NvmlUnavailable, match="NVML Shared Library Not Found"):
        machine(None)


def test_dgx_station_cuda_3_is_the_a100_that_nvml_calls_4_not_the_display(machine):
    mach = machine(STATION)
    order = gpus.cuda_order(mach.gpus, None)
    assert [g.index for g in order.gpus] == [0, 1, 2, 4, 3] and order.doubt is None  # compute capability 8.0 beats 7.5, and cores x clock agree
    assert seen("3", mach) == [("gpu_4", 0)]
    assert seen("3", mach, "FASTEST_FIRST") == [("gpu_4", 0)]
    assert seen("3", mach, "PCI_BUS_ID") == [("gpu_3", 0)], "PCI order is NVML's"
    assert seen("4,0", mach) == [("gpu_3", 0), ("gpu_0", 1)]
    assert seen(None, mach) == [("gpu_0", 0), ("gpu_1", 1), ("gpu_2", 2), ("gpu_4", 3), ("gpu_3", 4)], "unset: every GPU, in CUDA's numbering"
    assert seen("", mach) == []


def test_uuids_full_abbreviated_and_invalid_entries_stop_like_cuda(machine):
    mach = machine(STATION)
    display, fourth = STATION[3]["uuid"], STATION[4]["uuid"]
    assert seen(display, mach) == [("gpu_3", 0)]
    assert seen(f"{fourth[:12]}, GPU-d15b", mach) == [("gpu_4", 0), ("gpu_3", 1)], "a unique prefix is enough, spaces are ignored"
    watched, notes = gpus.visible_devices("0,GPU-a1,1", mach, None)  # GPU-a1 is the prefix of all four A100s
    assert [w.series for w in watched] == ["gpu_0"]
    assert notes == [
        "radt: CUDA_VISIBLE_DEVICES=0,GPU-a1,1: 'GPU-a1' is no GPU or MIG device of this machine; CUDA stops there, so the script sees 1 device(s) and radt watches those"
    ]
    assert seen("1,-1,0", mach) == [("gpu_1", 0)]
    assert seen("2,7", mach) == [("gpu_2", 0)], "an index past the last GPU"
    assert seen("2,2,1", mach) == [("gpu_2", 0)], "a repeated GPU"
    assert seen("GPU-ffff,0", mach) == []


def test_mig_uuids_and_the_old_mig_gpu_form_name_a_slice(machine):
    mach = machine([H100, MIG_H100])
    first, second = (m["uuid"] for m in MIG_H100["mig"])
    assert seen(second, mach) == [("gpu_1_mig_5", 0)]
    assert seen(first[:14], mach) == [("gpu_1_mig_1", 0)]
    assert seen(f"MIG-{mach.gpus[1].uuid}/5/0", mach) == [("gpu_1_mig_5", 0)]
    assert seen(f"MIG-{mach.gpus[1].uuid}/9/0", mach) == []
    watched, _ = gpus.visible_devices(first, mach, None)
    assert (watched[0].mig.profile, watched[0].mig.gpu_instance, watched[0].gpu.uuid) == ("3g.40gb", 1, mach.gpus[1].uuid)


def test_eight_gpus_of_one_model_number_alike_in_cuda_and_nvml(machine):
    mach = machine(EIGHT)
    order = gpus.cuda_order(mach.gpus, None)
    assert [g.index for g in order.gpus] == list(range(8)) and order.doubt is None
    assert seen("5,2", mach) == [("gpu_5", 0), ("gpu_2", 1)]
    assert seen("GPU-7777,GPU-0000", mach) == [("gpu_7", 0), ("gpu_0", 1)]


@pytest.mark.parametrize(
    ("specs", "doubt"),
    [
        ([A100, {**A100, "name": "NVIDIA A100 80GB PCIe"}], "share compute capability 8.0"),
        ([{**A100, "name": "NVIDIA GeForce RTX 4090"}, H100], "rank differently by compute capability and by cores x clock"),
        ([H100, {**A100, "unsupported": ["nvmlDeviceGetCudaComputeCapability"]}], "NVML gives no speed figures for NVIDIA A100-SXM4-40GB"),
    ],
    ids=["same-capability", "capability-vs-throughput", "call-unsupported"],
)
def test_mixed_models_whose_cuda_order_is_a_guess_say_so_once_with_the_fix(machine, specs, doubt):
    mach = machine(specs)
    watched, notes = gpus.visible_devices("1,0", mach, None)
    assert len(watched) == 2 and len(notes) == 1
    assert doubt in notes[0] and "set CUDA_DEVICE_ORDER=PCI_BUS_ID or give -d/UUIDs" in notes[0]
    assert gpus.visible_devices("1,0", mach, "PCI_BUS_ID")[1] == [], "PCI order is known for sure"
    assert gpus.visible_devices(f"{mach.gpus[1].uuid},{mach.gpus[0].uuid}", mach, None)[1] == [], "UUIDs do not depend on the order"


def test_d_takes_indices_and_uuids_and_refuses_what_the_machine_lacks(machine):
    assert gpus.device_tokens("0+1") == [0, 1] and gpus.device_tokens("2,GPU-8a1c") == [2, "GPU-8a1c"] and gpus.device_tokens("-") is None
    with pytest.raises(ValueError, match="bad -d 'gpu0'"):
        gpus.device_tokens("gpu0")
    mach = machine([*STATION[:2], MIG_H100])
    chosen = gpus.resolve_tokens([STATION[1]["uuid"][:12], MIG_H100["mig"][1]["uuid"], 0], mach)
    assert [w.series for w in chosen] == ["gpu_1", "gpu_2_mig_5", "gpu_0"]
    with pytest.raises(gpus.DeviceError, match=r"^GPU 3 does not exist on this machine \(GPUs: 0 to 2\); fix -d$"):
        gpus.resolve_tokens([3], mach)
    with pytest.raises(gpus.DeviceError, match=r"-d MIG-77 is no GPU or MIG device of this machine; fix -d"):
        gpus.resolve_tokens(["MIG-77"], mach)
    with pytest.raises(gpus.DeviceError, match=r"-d GPU-a1 matches 2 devices .*give more of the UUID"):
        gpus.resolve_tokens(["GPU-a1"], mach)


def test_plan_gives_the_script_exactly_the_watched_gpus(machine):
    mach = machine(STATION)
    display = gpus.plan([3], None, {}, mach)
    assert (display.visible, display.order, [(w.series, w.cuda) for w in display.watched]) == ("3", "PCI_BUS_ID", [("gpu_3", 0)])
    by_uuid = gpus.plan([STATION[4]["uuid"], 0], None, {}, mach)
    assert (by_uuid.visible, by_uuid.order, by_uuid.indices) == ("4,0", "PCI_BUS_ID", [0, 4])
    own_order = gpus.plan([3], None, {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, mach)
    assert (own_order.visible, own_order.order) == (STATION[3]["uuid"], None), "under the user's own order only UUIDs are safe"
    unset = gpus.plan(None, None, {"CUDA_VISIBLE_DEVICES": "3"}, mach)
    assert (unset.visible, [w.series for w in unset.watched]) == (None, ["gpu_4"]), "the script's own CUDA_VISIBLE_DEVICES is left alone"


def test_plan_numbers_by_pci_bus_id_when_nvml_order_differs(machine):
    """Never by position alone: a GPU whose NVML index is not its PCI rank still gets CUDA's index."""
    mach = machine([{**H100, "pci_bus_id": "00000000:9A:00.0"}, {**H100, "pci_bus_id": "00000000:18:00.0"}])
    assert gpus.plan([0], None, {}, mach).visible == "1"


def test_plan_for_mig_slices_and_the_csv_schedulers_override(machine):
    mach = machine([H100, MIG_H100])
    first, second = (m["uuid"] for m in MIG_H100["mig"])
    mig = gpus.plan([second], None, {}, mach)
    assert (mig.visible, mig.indices, mig.slices) == (second, [1], [(1, 5)])
    csv = gpus.plan([1], first, {}, mach)  # radt experiment.csv: -d 1 --cuda-visible <the MIG device it created>
    assert (csv.visible, csv.indices, csv.slices, csv.watched[0].cuda) == (first, [1], [(1, 1)], 0)
    mps = gpus.plan([1], "0", {}, mach)  # an MPS daemon's numbering: -d's GPU is watched, its CUDA ordinal unknown
    assert (mps.visible, [(w.series, w.cuda) for w in mps.watched]) == ("0", [("gpu_1", None)])
    elsewhere = gpus.plan([0], first, {}, mach)
    assert elsewhere.slices == [] and "names no device of -d" in elsewhere.notes[0]


def test_without_nvml_d_is_kept_as_given():
    plan = gpus.plan_without_nvml([1, 3], None, {"CUDA_VISIBLE_DEVICES": "7"}, "NVML Shared Library Not Found")
    assert (plan.visible, plan.order, plan.indices, plan.watched) == ("1,3", "PCI_BUS_ID", [1, 3], None)
    assert plan.notes == [  # was "cannot check -d here (NVML unavailable)": which -d, why, and what the script gets
        "radt: -d 1+3 is not checked: NVML cannot be loaded here (NVML Shared Library Not Found), so radt cannot tell which GPUs "
        "this machine has; the script gets CUDA_VISIBLE_DEVICES=1,3 as given (no GPU, where that GPU does not exist)"
    ]
    assert gpus.plan_without_nvml(None, None, {"CUDA_VISIBLE_DEVICES": "0,2"}).indices == [0, 2]


def test_tag_lists_every_series_with_its_identity_and_fits_mlflow(machine):
    mach = machine([H100, MIG_H100])
    watched = gpus.plan([MIG_H100["mig"][1]["uuid"], 0], None, {}, mach).watched
    entries = gpus.series_entries(watched)
    assert entries == [
        {
            "series": "gpu_0",
            "index": 0,
            "name": H100["name"],
            "uuid": mach.gpus[0].uuid,
            "pci_bus_id": "00000000:07:00.0",
            "mig_profile": None,
            "gpu_instance": None,
            "cuda": 1,
            "memory_total_mb": round(H100["memory_total"] / 1e6),  # MLflow's MB, for the diagnosis' MIG slice
        },
        {
            "series": "gpu_1",
            "index": 1,
            "name": H100["name"],
            "uuid": mach.gpus[1].uuid,
            "pci_bus_id": "00000000:0F:00.0",
            "mig_profile": None,
            "gpu_instance": None,
            "cuda": None,
            "memory_total_mb": round(H100["memory_total"] / 1e6),
        },
        {
            "series": "gpu_1_mig_5",
            "index": 1,
            "name": H100["name"],
            "uuid": MIG_H100["mig"][1]["uuid"],
            "pci_bus_id": "00000000:0F:00.0",
            "mig_profile": "1g.10gb",
            "gpu_instance": 5,
            "cuda": 0,
            "memory_total_mb": round(next(m.memory_total_bytes for m in mach.migs if m.gpu_instance == 5) / 1e6),  # the slice's own
        },
    ]
    assert json.loads(gpus.gpus_tag(entries)) == entries
    many = [dict(entries[2], series=f"gpu_{g}_mig_{gi}") for g in range(8) for gi in range(7)]  # 8 GPUs, 7 slices each
    text = gpus.gpus_tag(many)
    assert len(text) <= gpus.TAG_CHARS and json.loads(text)[0]["uuid"] == entries[2]["uuid"]


def test_csv_devices_may_name_gpus_by_uuid(machine, tmp_path, monkeypatch):
    machine(STATION)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('training')\n")
    body = f"e,1,,,{STATION[4]['uuid'][:13]},-,train.py,smi,\ne,2,,,GPU-a1,-,train.py,smi,\ne,3,,,GPU-0bad,-,train.py,smi,\n"
    (tmp_path / "experiment.csv").write_text("Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params\n" + body)
    workloads, problems = plan_experiment(ExperimentFile.load(tmp_path / "experiment.csv"), real_machine())
    assert workloads[0].runs[0].devices == [4]
    assert problems == [
        "experiment.csv row 3: Devices GPU-a1 is more than one GPU of this machine (nvidia-smi -L lists them); fix Devices",
        "experiment.csv row 4: Devices GPU-0bad is no GPU of this machine (nvidia-smi -L lists them); fix Devices",
    ]
