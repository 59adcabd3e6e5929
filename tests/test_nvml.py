"""NvmlSource, gpu_inventory() and gpu_count() against simulated GPUs behind the real pynvml module.

Only pynvml's function entry points are replaced (tests/fakes/fake_nvml.py); its constants,
structs and NVMLError classes stay the real ones, and everything above them is radt's own code.
"""

from __future__ import annotations

import os

import psutil
import pynvml
import pytest

from radt.collectors.sources.base import SamplingContext, SourceUnavailable
from radt.collectors.sources.nvml import NvmlSource, gpu_count, gpu_inventory
from tests.fakes.fake_nvml import A100, H100, FakeNvml, ManualClock, mig_gpu

MIB = 1024 * 1024


def gpu(base: dict, **overrides) -> dict:
    return {**base, **overrides}


def opened(devices=None, pids=lambda: [], slices=()) -> NvmlSource:
    source = NvmlSource()
    source.open(SamplingContext(interval=1.0, devices=devices, slices=list(slices), pids=pids))
    return source


def tick(fake: FakeNvml, source: NvmlSource, seconds: float = 1.0) -> dict[str, float]:
    fake.clock.advance(seconds)
    return source.sample()


GPM_KEYS = ("sm_active", "sm_occupancy", "gr_engine_active", "dram_active", "tensor_active", "fp64_active", "fp32_active", "fp16_active", "integer_active")


def test_h100_gpm_ratios_follow_the_load_between_consecutive_samples(nvml):
    fake = nvml([gpu(H100, load=0.6)])
    source = opened()
    first = source.sample()
    assert "system/gpu_0_utilization_percentage" in first
    assert "system/gpu_0_sm_active" not in first  # GPM needs two snapshots

    values = tick(fake, source)
    # the fake's GPM: SM_UTIL = 100 L, SM_OCCUPANCY = 50 L, GRAPHICS = 10 + 90 L, DRAM = 40 L, tensor 25 L, ...
    expected = {
        "sm_active": 0.6,
        "sm_occupancy": 0.3,
        "gr_engine_active": 0.64,
        "dram_active": 0.24,
        "tensor_active": 0.15,
        "fp64_active": 0.03,
        "fp32_active": 0.18,
        "fp16_active": 0.09,
        "integer_active": 0.12,
    }
    for name, value in expected.items():
        assert values[f"system/gpu_0_{name}"] == pytest.approx(value), name
    assert values["system/gpu_0_pcie_tx_bytes_per_second"] == pytest.approx(1000.0 * 0.6 * MIB)  # GPM MiB/s -> B/s
    assert values["system/gpu_0_pcie_rx_bytes_per_second"] == pytest.approx(3000.0 * 0.6 * MIB)

    fake.set_load(0, 0.2)
    assert tick(fake, source)["system/gpu_0_sm_active"] == pytest.approx(0.2)  # since the previous tick, not the first

    fake.clock.advance(0.5)
    fake.set_load(0, 1.0)
    fake.clock.advance(1.5)
    values = source.sample()
    assert values["system/gpu_0_sm_active"] == pytest.approx((0.2 * 0.5 + 1.0 * 1.5) / 2.0)  # time-weighted over the interval
    assert values["system/gpu_0_gr_engine_active"] == pytest.approx(0.1 + 0.9 * 0.8)
    for name in GPM_KEYS:
        assert 0.0 <= values[f"system/gpu_0_{name}"] <= 1.0, name
    source.close()


def test_basics_in_catalogue_units(nvml):
    me = psutil.Process(os.getpid())
    processes = [
        {"pid": me.pid, "used": 2_000_000_000},
        {"pid": 4_000_000, "used": 5_000_000_000},  # another user's training on the same GPU
        {"pid": me.pid + 1_000_000, "used": None},  # pynvml's None (no permission / WDDM)
    ]
    fake = nvml([gpu(H100, load=0.6, memory_used=30_000_000_000, power_limit_mw=700_000, idle_power_mw=60_000, processes=processes)])
    source = opened(pids=lambda: [me])
    values = source.sample()
    g = "system/gpu_0_"
    assert values[g + "utilization_percentage"] == 60.0
    assert values[g + "memory_utilization_percentage"] == 24.0
    assert values[g + "memory_usage_megabytes"] == pytest.approx(30_000.0)  # bytes -> MB (10^6)
    assert values[g + "memory_usage_percentage"] == pytest.approx(100.0 * 30_000_000_000 / H100["memory_total"])
    power_w = (60_000 + (560_000 - 60_000) * 0.6) / 1000.0  # the fake draws idle + load * (80 % of the limit - idle)
    assert values[g + "power_usage_watts"] == pytest.approx(power_w)  # mW -> W
    assert values[g + "power_usage_percentage"] == pytest.approx(100.0 * power_w / 700.0)
    assert values[g + "energy_joules"] == 0.0  # relative to the first reading, not the driver's counter
    assert values[g + "temperature_celsius"] == 54.0
    assert values[g + "sm_clock_mhz"] == 1326.0
    assert values[g + "pstate"] == 0.0
    assert values[g + "process_memory_megabytes"] == pytest.approx(2000.0)  # only the run's pids

    values = tick(fake, source, 2.0)
    assert values[g + "energy_joules"] == pytest.approx(power_w * 2.0, abs=0.002)  # mJ -> J
    fake.set_load(0, 0.0)
    values = tick(fake, source, 1.0)
    assert values[g + "energy_joules"] == pytest.approx(power_w * 2.0 + 60.0, abs=0.002)
    assert values[g + "pstate"] == 8.0
    assert values[g + "sm_active"] == 0.0
    source.close()


def test_a100_without_gpm_gives_basics_and_pcie_but_no_sm_active(nvml):
    fake = nvml([gpu(A100, load=0.5, pcie_kbps=1_000_000)])
    source = opened()
    ticks = [source.sample()] + [tick(fake, source) for _ in range(3)]
    for values in ticks:
        assert values["system/gpu_0_utilization_percentage"] == 50.0
        assert values["system/gpu_0_pcie_tx_bytes_per_second"] == pytest.approx(500_000 * 1024.0)  # KB/s -> B/s
        assert values["system/gpu_0_pcie_rx_bytes_per_second"] == pytest.approx(1_000_000 * 1024.0)
        assert not any(k.endswith(("_sm_active", "_sm_occupancy", "_gr_engine_active", "_dram_active")) for k in values)
    assert source.describe() == {"gpm": {"0": False}}
    assert fake.count("nvmlGpmSampleGet") == 0
    source.close()
    assert fake.refcount == 0


def test_device_selection_watches_only_the_chosen_gpus(nvml):
    fake = nvml([gpu(H100), gpu(A100), gpu(H100, load=0.9)])
    source = opened(devices=[2])
    source.sample()
    values = tick(fake, source)
    assert values["system/gpu_2_sm_active"] == pytest.approx(0.9)
    assert {k.split("_")[1] for k in values} == {"2"}  # system/gpu_2_... only
    assert fake.count("nvmlDeviceGetUtilizationRates", 0) == fake.count("nvmlDeviceGetUtilizationRates", 1) == 0
    source.close()


def test_a_gpu_that_does_not_exist_is_refused_with_the_fix(nvml):
    fake = nvml([gpu(H100), gpu(A100)])
    with pytest.raises(SourceUnavailable, match=r"GPU 5 does not exist .*2.* -d from 0 to 1"):
        opened(devices=[0, 5])
    assert fake.refcount == 0  # NVML shut down again


def test_no_gpu_at_all_is_unavailable(nvml):
    fake = nvml([])
    with pytest.raises(SourceUnavailable, match="no GPU"):
        opened()
    assert fake.refcount == 0


@pytest.mark.parametrize("config", [None, {"error": "driver_not_loaded", "gpus": [H100]}], ids=["no-library", "driver-not-loaded"])
def test_no_driver_is_unavailable_and_inventory_says_why(nvml, config):
    nvml(config)
    with pytest.raises(SourceUnavailable, match=r"NVML cannot be loaded \((NVML Shared Library Not Found|Driver Not Loaded)\).*driver"):
        opened()
    inventory = gpu_inventory()
    assert inventory["available"] is False
    assert inventory["reason"] in ("NVML Shared Library Not Found", "Driver Not Loaded")
    assert gpu_count() is None


def test_unsupported_counters_are_skipped_once_and_the_rest_carries_on(nvml):
    spec = gpu(
        H100,
        load=0.5,
        unsupported=["nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetEnforcedPowerLimit"],
        gpm_unsupported=[pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL],
    )
    fake = nvml([spec, gpu(A100, unsupported=["nvmlDeviceGetPcieThroughput", "nvmlDeviceGetTemperature"])])
    source = opened()
    source.sample()
    for _ in range(5):
        values = tick(fake, source)
        assert values["system/gpu_0_sm_active"] == pytest.approx(0.5)
        assert values["system/gpu_0_power_usage_watts"] > 0
        assert "system/gpu_0_energy_joules" not in values
        assert "system/gpu_0_power_usage_percentage" not in values
        assert "system/gpu_0_dram_active" not in values
        assert "system/gpu_1_temperature_celsius" not in values
        assert "system/gpu_1_pcie_tx_bytes_per_second" not in values
        assert values["system/gpu_1_temperature_celsius".replace("temperature_celsius", "sm_clock_mhz")] > 0
    # NOT_SUPPORTED is remembered: each call was tried once, not on every tick
    assert fake.count("nvmlDeviceGetTotalEnergyConsumption", 0) == 1
    assert fake.count("nvmlDeviceGetEnforcedPowerLimit", 0) == 1
    assert fake.count("nvmlDeviceGetTemperature", 1) == 1
    assert fake.count("nvmlDeviceGetPcieThroughput", 1) == 2  # TX and RX, once each
    assert fake.count("nvmlDeviceGetPowerUsage", 0) == 6
    source.close()


def test_unknown_pstate_is_left_out(nvml):
    fake = nvml([gpu(A100, pstate=pynvml.NVML_PSTATE_UNKNOWN)])
    source = opened()
    values = tick(fake, source)
    assert "system/gpu_0_pstate" not in values
    assert "system/gpu_0_utilization_percentage" in values
    source.close()


def test_gpm_sampling_that_fails_falls_back_to_the_basics_without_leaking(nvml):
    """An H100 in MIG mode reports GPM support but refuses device-level samples."""
    fake = nvml([gpu(H100, load=0.5, unsupported=["nvmlGpmSampleGet"])])
    source = opened()
    for _ in range(3):
        values = tick(fake, source)
        assert "system/gpu_0_sm_active" not in values
        assert values["system/gpu_0_utilization_percentage"] == 50.0
    assert values["system/gpu_0_pcie_tx_bytes_per_second"] > 0  # the non-GPM PCIe counters took over
    assert fake.count("nvmlGpmSampleGet", 0) == 1
    assert fake.samples == {}  # the snapshot that could not be taken was freed
    source.close()
    assert fake.refcount == 0


def test_close_frees_gpm_samples_and_shuts_nvml_down(nvml):
    fake = nvml([gpu(H100), gpu(H100)])
    source = opened()
    for _ in range(4):
        tick(fake, source)
    assert len(fake.samples) == 2  # one live snapshot per GPU, the older ones freed as it goes
    source.close()
    assert fake.samples == {}
    assert fake.refcount == 0


def test_gpu_inventory_and_count(nvml):
    fake = nvml({"driver": "560.35.03", "gpus": [gpu(H100, uuid="GPU-11111111-2222-3333-4444-555555555555"), gpu(A100)]})
    inventory = gpu_inventory()
    assert inventory["available"] is True
    assert inventory["driver"] == "560.35.03"
    assert [(g["index"], g["name"], g["memory_total_bytes"], g["gpm_supported"]) for g in inventory["gpus"]] == [
        (0, "NVIDIA H100 80GB HBM3", 85899345920, True),
        (1, "NVIDIA A100-SXM4-40GB", 42949672960, False),
    ]
    assert inventory["gpus"][0]["uuid"] == "GPU-11111111-2222-3333-4444-555555555555"
    assert inventory["gpus"][1]["uuid"].startswith("GPU-")
    assert gpu_count() == 2
    assert fake.refcount == 0  # both shut NVML down again


def test_gpu_count_is_none_when_the_driver_cannot_enumerate(nvml, monkeypatch):
    nvml([gpu(H100)])

    def broken():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", broken)
    assert gpu_count() is None
    with pytest.raises(SourceUnavailable, match="GPU is lost"):
        opened()


class ReservingDriver(FakeNvml):
    """A driver that sets memory aside for itself, as real ones do: nvmlDeviceGetMemoryInfo v1 counts
    it in `used` (NVML: "Sum of Reserved and Allocated device memory"), v2 reports it as `reserved`
    and `used` is the allocated memory alone, which is nvidia-smi's memory.used. With `v2=False`
    the driver predates v2 (the real pynvml raises FUNCTION_NOT_FOUND for its missing symbol)."""

    RESERVED = 600 * MIB
    v2 = True

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        if version and not self.v2:
            self._enter("nvmlDeviceGetMemoryInfo_v2")
            raise self._error(self.nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        info = super().nvmlDeviceGetMemoryInfo(handle, version)
        if version:
            self.calls[("nvmlDeviceGetMemoryInfo_v2", None)] += 1
            info.reserved = self.RESERVED
        else:
            info.used += self.RESERVED
        info.free -= self.RESERVED
        return info


@pytest.fixture
def reserving(monkeypatch):
    def install(config, v2: bool = True) -> ReservingDriver:
        fake = ReservingDriver.from_config(config, nvml=pynvml, clock=ManualClock())
        fake.v2 = v2
        fake.install(pynvml, monkeypatch.setattr)
        return fake

    return install


def test_memory_used_excludes_driver_reserved_memory_like_nvidia_smi(reserving):
    """Regression: radt read v1, whose `used` includes the driver-reserved memory, so an idle H100
    showed hundreds of MB more than nvidia-smi's memory.used (and than imported nvidia-smi logs,
    which land in the same series)."""
    reserving([gpu(H100, memory_used=30_000_000_000)])
    source = opened()
    values = source.sample()
    assert values["system/gpu_0_memory_usage_megabytes"] == pytest.approx(30_000.0)  # not 30_000 + 629 (600 MiB)
    assert values["system/gpu_0_memory_usage_percentage"] == pytest.approx(100.0 * 30_000_000_000 / H100["memory_total"])
    source.close()


def test_memory_falls_back_to_v1_once_on_a_driver_without_v2(reserving):
    fake = reserving([gpu(H100, memory_used=30_000_000_000)], v2=False)
    source = opened()
    for _ in range(3):
        values = tick(fake, source)
        assert values["system/gpu_0_memory_usage_megabytes"] == pytest.approx(30_000.0 + ReservingDriver.RESERVED / 1e6)  # v1: all v1 can say
    assert fake.count("nvmlDeviceGetMemoryInfo_v2") == 1  # the missing v2 is remembered, not retried every tick
    assert fake.count("nvmlDeviceGetMemoryInfo", 0) == 3
    source.close()


def test_each_mig_slice_has_its_own_activity_and_memory_and_the_gpu_keeps_its_basics(nvml):
    """An H100 in MIG mode: each slice's GPM per instance and memory under its own keys; the GPU's power
    and clocks under the GPU's keys; no whole-GPU activity presented as the slices'."""
    spec = mig_gpu(H100, (1, "3g.40gb", 0.8), (5, "1g.10gb", 0.2), load=0.5)
    spec["mig"][1].update(memory_used=3_000_000_000, memory_total=10_000_000_000)
    fake = nvml([gpu(H100, load=0.9), spec])
    source = opened(devices=[1], slices=[(1, 1), (1, 5)])
    first = source.sample()
    assert "system/gpu_1_mig_1_sm_active" not in first  # GPM needs two snapshots
    values = tick(fake, source)
    assert values["system/gpu_1_mig_1_sm_active"] == pytest.approx(0.8)
    assert values["system/gpu_1_mig_5_sm_active"] == pytest.approx(0.2)
    assert values["system/gpu_1_mig_5_dram_active"] == pytest.approx(0.08)
    assert values["system/gpu_1_mig_5_memory_usage_megabytes"] == pytest.approx(3000.0)
    assert values["system/gpu_1_mig_5_memory_usage_percentage"] == pytest.approx(30.0)
    assert values["system/gpu_1_power_usage_watts"] > 0 and "system/gpu_1_temperature_celsius" in values
    assert not [k for k in values if k.startswith("system/gpu_1_") and k.endswith(("_sm_active", "utilization_percentage")) and "_mig_" not in k]
    assert not [k for k in values if k.startswith("system/gpu_0_")]
    fake.set_load(1, 0.4, gi=5)
    assert tick(fake, source)["system/gpu_1_mig_5_sm_active"] == pytest.approx(0.4)
    assert "mig_activity" not in source.describe() and source.describe()["mig_gpm"] == {"1/1": True, "1/5": True}
    source.close()
    assert fake.samples == {} and fake.refcount == 0


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (
            mig_gpu(A100, (2, "1g.5gb", 0.6)),
            "unavailable: GPM per MIG instance not supported on NVIDIA A100-SXM4-40GB; the GPU-level series are the whole GPU's",
        ),
        (
            mig_gpu(H100, (2, "1g.10gb", 0.6), unsupported=["nvmlGpmMigSampleGet"]),
            "unavailable: GPM per MIG instance not supported on NVIDIA H100 80GB HBM3 (Not Supported); the GPU-level series are the whole GPU's",
        ),
        (mig_gpu(H100, (3, "1g.10gb", 0.6)), "unavailable: GPU 0 (NVIDIA H100 80GB HBM3) has no MIG instance 2; the GPU-level series are the whole GPU's"),
    ],
    ids=["a100-no-gpm", "call-unsupported", "no-such-instance"],
)
def test_a_slice_whose_activity_cannot_be_read_says_why(nvml, spec, reason):
    fake = nvml([spec])
    source = opened(devices=[0], slices=[(0, 2)])
    for _ in range(3):
        values = tick(fake, source)
        assert not [k for k in values if k.endswith("_sm_active")]
        assert values["system/gpu_0_power_usage_watts"] > 0
    assert source.describe()["mig_activity"] == reason
    if "no MIG instance" not in reason:  # the slice exists: its memory is its own
        assert values["system/gpu_0_mig_2_memory_usage_megabytes"] > 0
    source.close()
    assert fake.samples == {} and fake.refcount == 0


def test_inventory_has_pci_bus_ids_and_mig_devices(nvml):
    nvml([gpu(A100, pci_bus_id="00000000:47:00.0"), mig_gpu(H100, (1, "3g.40gb", 0.5), pci_bus_id="00000000:C2:00.0")])
    inventory = gpu_inventory()
    assert [(g["index"], g["pci_bus_id"], g["mig_mode"]) for g in inventory["gpus"]] == [(0, "00000000:47:00.0", False), (1, "00000000:C2:00.0", True)]
    (mig,) = inventory["gpus"][1]["mig_devices"]
    assert (mig["profile"], mig["gpu_instance"], mig["compute_instance"], mig["uuid"].startswith("MIG-")) == ("3g.40gb", 1, 0, True)
