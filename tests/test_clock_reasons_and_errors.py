"""Why the clocks are held down, and the GPU's hardware errors, per GPU and per sample: NVML (the fake driver at pynvml's
function boundary), `dcgmi dmon` lines, and dcgm-exporter's series as Prometheus returns them.

The bits the tests set are the real pynvml's nvmlClocksEventReason* constants (the driver's), not radt's own, so a wrong
bit in radt shows up here.
"""

from __future__ import annotations

import pynvml
import pytest

from radt.collectors.sources.base import SamplingContext
from radt.collectors.sources.nvml import NvmlSource
from radt.collectors.sources.parsers import parse_dcgmi_dmon
from radt.collectors.sources.promql import Series, Wanted, keyed_samples, selector
from radt.collectors.sources.toolmetrics import EnergyBaseline, dmon_metrics
from tests.fakes.fake_nvml import A100, H100, FakeNvml, mig_gpu

POWER, THERMAL, HARDWARE = "clocks_power_capped", "clocks_thermal_slowdown", "clocks_hardware_slowdown"
REASONS = (POWER, THERMAL, HARDWARE)
IDLE = pynvml.nvmlClocksEventReasonGpuIdle
APP_CLOCKS = pynvml.nvmlClocksEventReasonApplicationsClocksSetting
SW_POWER = pynvml.nvmlClocksEventReasonSwPowerCap
HW_SLOWDOWN = pynvml.nvmlClocksEventReasonHwSlowdown
SYNC_BOOST = pynvml.nvmlClocksEventReasonSyncBoost
SW_THERMAL = pynvml.nvmlClocksEventReasonSwThermalSlowdown
HW_THERMAL = pynvml.nvmlClocksEventReasonHwThermalSlowdown
POWER_BRAKE = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
DISPLAY = pynvml.nvmlClocksEventReasonDisplayClockSetting
NOT_SLOWDOWNS = IDLE | APP_CLOCKS | SYNC_BOOST | DISPLAY


@pytest.fixture
def opened():
    sources: list[NvmlSource] = []

    def open_(devices=None, slices=()) -> NvmlSource:
        sources.append(NvmlSource())
        sources[-1].open(SamplingContext(interval=1.0, devices=devices, slices=list(slices)))
        return sources[-1]

    yield open_
    for source in sources:
        source.close()


def tick(fake: FakeNvml, source: NvmlSource) -> dict[str, float]:
    fake.clock.advance(1.0)
    return source.sample()


def gpu_key(gpu: int, name: str, mig: int | None = None) -> str:
    return f"system/gpu_{gpu}_" + (f"mig_{mig}_" if mig is not None else "") + name


# --------------------------------------------------------------------------- NVML: clock event reasons


def test_a_gpu_power_capped_for_part_of_a_recording_is_1_in_those_samples_and_0_elsewhere(nvml, opened):
    fake = nvml([{**H100, "load": 0.9}])
    source = opened()
    timeline = [0, 0, SW_POWER, SW_POWER | IDLE, POWER_BRAKE, 0, NOT_SLOWDOWNS]
    seen = []
    for reasons in timeline:
        fake.set_clock_reasons(0, reasons)
        seen.append(tick(fake, source))
    assert [s[gpu_key(0, POWER)] for s in seen] == [0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert all(s[gpu_key(0, THERMAL)] == 0.0 and s[gpu_key(0, HARDWARE)] == 0.0 for s in seen)


@pytest.mark.parametrize(
    ("reasons", "expected"),
    [
        (SW_THERMAL, {THERMAL: 1.0}),
        (HW_THERMAL, {THERMAL: 1.0}),
        (HW_SLOWDOWN, {HARDWARE: 1.0}),
        (SW_POWER | HW_THERMAL | HW_SLOWDOWN, {POWER: 1.0, THERMAL: 1.0, HARDWARE: 1.0}),
        (IDLE, {}),
        (APP_CLOCKS, {}),
        (SYNC_BOOST, {}),
        (DISPLAY, {}),
    ],
)
def test_each_reason_lands_in_its_series_and_settings_are_not_slowdowns(nvml, opened, reasons, expected):
    fake = nvml([H100])
    fake.set_clock_reasons(0, reasons)
    values = opened().sample()
    assert {name: values[gpu_key(0, name)] for name in REASONS} == {name: expected.get(name, 0.0) for name in REASONS}


def test_a_driver_without_the_newer_call_gives_the_reasons_through_the_older_one(nvml, opened):
    """nvmlDeviceGetCurrentClocksEventReasons came with driver 535; older drivers lack the symbol (FUNCTION_NOT_FOUND)."""
    fake = nvml([H100])
    fake.lack("nvmlDeviceGetCurrentClocksEventReasons")
    fake.set_clock_reasons(0, HW_THERMAL)
    source = opened()
    for _ in range(3):
        assert tick(fake, source)[gpu_key(0, THERMAL)] == 1.0
    assert fake.count("nvmlDeviceGetCurrentClocksEventReasons") == 1  # not retried every tick
    assert fake.count("nvmlDeviceGetCurrentClocksThrottleReasons", 0) == 3


def test_a_slice_keeps_the_gpus_reasons_under_the_gpus_keys(nvml, opened):
    """The GPU's clocks are the whole GPU's, as its power and temperature are: not written under the slice's keys."""
    fake = nvml([mig_gpu(H100, (1, "3g.40gb", 0.8))])
    fake.set_clock_reasons(0, SW_POWER)
    values = opened(devices=[], slices=[(0, 1)]).sample()
    assert values[gpu_key(0, POWER)] == 1.0
    assert not any(k.startswith(gpu_key(0, "", mig=1)) and k.endswith(REASONS) for k in values)


# --------------------------------------------------------------------------- NVML: XID events


def test_an_xid_79_shows_in_one_sample_and_0_after(nvml, opened):
    fake = nvml([H100, H100])
    source = opened()
    assert tick(fake, source)[gpu_key(1, "xid_error")] == 0.0
    fake.inject_xid(1, 79)
    values = tick(fake, source)
    assert values[gpu_key(1, "xid_error")] == 79.0
    assert values[gpu_key(0, "xid_error")] == 0.0  # another GPU's error is not this one's
    assert [tick(fake, source)[gpu_key(1, "xid_error")] for _ in range(3)] == [0.0, 0.0, 0.0]


def test_the_first_of_several_xids_in_one_interval_is_kept_and_none_spills_into_the_next(nvml, opened):
    fake = nvml([H100])
    source = opened()
    fake.inject_xid(0, 13)
    fake.inject_xid(0, 43)
    assert tick(fake, source)[gpu_key(0, "xid_error")] == 13.0
    assert tick(fake, source)[gpu_key(0, "xid_error")] == 0.0


def test_an_xid_from_before_the_recording_is_not_the_runs(nvml, opened):
    """The driver delivers an event only to the sets registered when it happens."""
    fake = nvml([H100])
    fake.inject_xid(0, 31)
    source = opened()
    assert tick(fake, source)[gpu_key(0, "xid_error")] == 0.0


def test_polling_never_blocks_and_the_event_set_is_freed_on_close(nvml):
    fake = nvml([H100, A100])
    source = NvmlSource()
    source.open(SamplingContext(interval=1.0))
    assert len(fake.event_sets) == 1
    for _ in range(3):
        tick(fake, source)
    assert fake.wait_timeouts and set(fake.wait_timeouts) == {0}
    source.close()
    assert fake.event_sets == {} and fake.refcount == 0


# --------------------------------------------------------------------------- NVML: ECC


def test_ecc_counts_are_the_volatile_totals(nvml, opened):
    fake = nvml([{**H100, "ecc_corrected": 5, "ecc_uncorrected": 0, "ecc_aggregate": 1000}])
    source = opened()
    values = tick(fake, source)
    assert values[gpu_key(0, "ecc_errors_corrected")] == 5.0
    assert values[gpu_key(0, "ecc_errors_uncorrected")] == 0.0
    fake.add_ecc_errors(0, corrected=2, uncorrected=1)
    values = tick(fake, source)
    assert values[gpu_key(0, "ecc_errors_corrected")] == 7.0
    assert values[gpu_key(0, "ecc_errors_uncorrected")] == 1.0


def test_a_gpu_spec_schedules_reasons_and_xids_for_subprocess_tests(nvml, opened):
    """The JSON spec a subprocess test gives (RADT_FAKE_NVML): a reasons timeline, XIDs at set times, an older driver."""
    spec = {**H100, "clock_reasons": [[0, 0], [2.5, SW_THERMAL], [4.5, IDLE]], "xids": [[3.5, 48]]}
    fake = nvml({"gpus": [spec], "lacks": ["nvmlDeviceGetCurrentClocksEventReasons"]})
    source = opened()
    seen = [tick(fake, source) for _ in range(6)]
    assert [s[gpu_key(0, THERMAL)] for s in seen] == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert [s[gpu_key(0, "xid_error")] for s in seen] == [0.0, 0.0, 0.0, 48.0, 0.0, 0.0]
    assert fake.count("nvmlDeviceGetCurrentClocksThrottleReasons", 0) == 6


# --------------------------------------------------------------------------- NVML: NOT_SUPPORTED


def test_not_supported_gives_no_series_never_a_zero(nvml, opened):
    unsupported = ["nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceRegisterEvents"]
    fake = nvml([{**H100, "unsupported": unsupported, "ecc": False}, H100])
    source = opened()
    for _ in range(3):
        values = tick(fake, source)
        for name in (*REASONS, "xid_error", "ecc_errors_corrected", "ecc_errors_uncorrected"):
            assert gpu_key(0, name) not in values, name
            assert gpu_key(1, name) in values, name  # the other GPU has them
        assert values[gpu_key(0, "utilization_percentage")] > 0
    # each refusal is remembered: tried once, not every tick
    assert fake.count("nvmlDeviceGetCurrentClocksEventReasons", 0) == 1
    assert fake.count("nvmlDeviceGetCurrentClocksThrottleReasons", 0) == 1
    assert fake.count("nvmlDeviceGetTotalEccErrors", 0) == 2  # uncorrected and corrected, once each


def test_no_event_support_on_any_gpu_leaves_no_event_set(nvml, opened):
    fake = nvml([{**A100, "event_types": 0}])
    values = tick(fake, opened())
    assert gpu_key(0, "xid_error") not in values
    assert fake.event_sets == {}


# --------------------------------------------------------------------------- dcgmi dmon


DMON = [
    "#Entity   DVCCTR               XIDER  ESVTL  EDVTL",
    "ID",
    "GPU 0     0                    N/A    3      0",
    "GPU 1     43                   43     N/A    N/A",
    "GPU 0     4                    N/A    3      0",
    "GPU 1     1                    43     N/A    N/A",
    "GPU 0     132                  79     4      1",
    "GPU 1     N/A                  43     N/A    N/A",
    "GPU 0     96                   79     4      1",
    "GPU 1     8                    31     N/A    N/A",
    "GPU 0     274                  31     4      1",
    "GPU 1     0                    31     N/A    N/A",
]


def test_dmon_splits_a_recorded_bitmask_and_keeps_only_new_xids():
    energy = EnergyBaseline()
    rows = [(row.gpu, dmon_metrics(row, energy)) for row in parse_dcgmi_dmon(DMON)]
    gpu0 = [m for gpu, m in rows if gpu == 0]
    gpu1 = [m for gpu, m in rows if gpu == 1]
    # 0, 4 (SW power cap), 132 (power brake + power cap), 96 (SW + HW thermal), 274 (display, sync boost, app clocks)
    assert [[m[gpu_key(0, n)] for n in REASONS] for m in gpu0] == [[0, 0, 0], [1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 0]]
    # 43 (SW thermal 0x20, HW slowdown 0x8, app clocks, idle), 1 (idle), N/A (no reading), 8 (HW slowdown), 0
    assert [[m.get(gpu_key(1, n)) for n in REASONS] for m in gpu1] == [[0, 1, 1], [0, 0, 0], [None] * 3, [0, 0, 1], [0, 0, 0]]
    # DCGM repeats the last XID in every row: the row where it changes has the code, repeats 0, N/A no reading
    assert [m.get(gpu_key(0, "xid_error")) for m in gpu0] == [None, None, 79.0, 0.0, 31.0]
    # a code already there at the first row happened before dmon started: not the run's
    assert [m.get(gpu_key(1, "xid_error")) for m in gpu1] == [0.0, 0.0, 0.0, 31.0, 0.0]
    assert [m[gpu_key(0, "ecc_errors_corrected")] for m in gpu0] == [3.0, 3.0, 4.0, 4.0, 4.0]
    assert [m[gpu_key(0, "ecc_errors_uncorrected")] for m in gpu0] == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert not any(k.endswith("ecc_errors_corrected") for m in gpu1 for k in m)  # ECC off: N/A, no series


# --------------------------------------------------------------------------- dcgm-exporter through Prometheus

NODE = {"gpu": "0", "UUID": "GPU-0", "Hostname": "node-1", "instance": "node-1:9400", "job": "dcgm"}
SCRAPES = [1000, 2000, 3000, 4000, 5000, 6000]


def exporter(name: str, values: list[float], stamps: list[int] = SCRAPES, **labels: str) -> Series:
    return Series({"__name__": name, **NODE, **labels}, list(zip(stamps, values, strict=True)))


@pytest.mark.parametrize("name", ["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"])
def test_the_exporters_clock_reasons_bitmask_is_split_into_the_three_series(name):
    found = [exporter(name, [0, SW_POWER, POWER_BRAKE | IDLE, SW_THERMAL, HW_SLOWDOWN, NOT_SLOWDOWNS])]
    got = keyed_samples(found, Wanted(gpus=[0]))
    assert got == {
        gpu_key(0, POWER): list(zip(SCRAPES, [0.0, 1.0, 1.0, 0.0, 0.0, 0.0], strict=True)),
        gpu_key(0, THERMAL): list(zip(SCRAPES, [0.0, 0.0, 0.0, 1.0, 0.0, 0.0], strict=True)),
        gpu_key(0, HARDWARE): list(zip(SCRAPES, [0.0, 0.0, 0.0, 0.0, 1.0, 0.0], strict=True)),
    }
    assert name in selector("node-1")  # asked of Prometheus at all


def test_the_exporters_ecc_totals_are_read():
    found = [exporter("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", [2, 2, 3, 3, 3, 3]), exporter("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", [0, 0, 0, 1, 1, 1])]
    got = keyed_samples(found, Wanted(gpus=[0]))
    assert [v for _, v in got[gpu_key(0, "ecc_errors_corrected")]] == [2, 2, 3, 3, 3, 3]
    assert [v for _, v in got[gpu_key(0, "ecc_errors_uncorrected")]] == [0, 0, 0, 1, 1, 1]


def test_the_exporters_sticky_xid_from_before_the_window_is_not_the_runs():
    """dcgm-exporter repeats the last XID at every scrape until it restarts: present from the first scrape, it is old."""
    found = [exporter("DCGM_FI_PROF_SM_ACTIVE", [0.5] * 6), exporter("DCGM_FI_DEV_XID_ERRORS", [43] * 6)]
    got = keyed_samples(found, Wanted(gpus=[0]))
    assert [v for _, v in got[gpu_key(0, "xid_error")]] == [0.0] * 6


def test_the_exporters_xid_is_kept_where_it_appears_or_changes_and_0_while_it_repeats():
    """dcgm-exporter publishes the XID series from the first XID on, labelled with its code (err_code) in newer versions:
    the series that appears mid-window, and the one that replaces it with another code, are one device's series."""
    found = [
        exporter("DCGM_FI_PROF_SM_ACTIVE", [0.5] * 6),
        exporter("DCGM_FI_DEV_XID_ERRORS", [79, 79], SCRAPES[2:4], err_code="79", err_msg="GPU has fallen off the bus"),
        exporter("DCGM_FI_DEV_XID_ERRORS", [31, 31], SCRAPES[4:], err_code="31", err_msg="GPU memory page fault"),
    ]
    conflicts: list[str] = []
    got = keyed_samples(found, Wanted(gpus=[0]), conflicts)
    assert got[gpu_key(0, "xid_error")] == list(zip(SCRAPES[2:], [79.0, 0.0, 31.0, 0.0], strict=True))
    assert conflicts == []


def test_radt_monitors_own_xid_series_is_taken_as_it_is():
    """radt monitor's radt_gpu_xid_error already holds only the new XIDs: nothing to undo."""
    found = [exporter("radt_gpu_xid_error", [0, 79, 79, 0, 0, 0])]
    got = keyed_samples(found, Wanted(gpus=[0]))
    assert [v for _, v in got[gpu_key(0, "xid_error")]] == [0, 79, 79, 0, 0, 0]
