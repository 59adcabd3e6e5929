"""DcgmSource against tests/fakes/bin/dcgmi, which replays real `dcgmi dmon` output recorded on a DGX A100.

The expected values come from the fixture file itself, read here with a few lines of code of
the test's own (not radt's parser), so a wrong column, scale or N/A rule in radt shows up.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest

from radt.catalogue import DCGM_BASIC_FIELDS
from radt.collectors.sources.base import SamplingContext, SourceUnavailable
from radt.collectors.sources.dcgm import DcgmSource
from radt.collectors.sources.parsers import parse_dcgmi_dmon, parse_mig_hierarchy
from radt.collectors.sources.toolmetrics import EnergyBaseline, dmon_metrics
from tests.support.paths import FAKE_BIN
from tests.support.polling import wait_for

LOG = "mnist_dcgmi_dmon_18fields.txt"
# dmon column -> (radt metric, scale to radt's unit), written out here rather than taken from the catalogue
COLUMNS = {
    "POWER": ("power_usage_watts", 1.0),
    "GPUTL": ("utilization_percentage", 1.0),
    "MCUTL": ("memory_utilization_percentage", 1.0),
    "GRACT": ("gr_engine_active", 1.0),
    "SMACT": ("sm_active", 1.0),
    "SMOCC": ("sm_occupancy", 1.0),
    "TENSO": ("tensor_active", 1.0),
    "DRAMA": ("dram_active", 1.0),
    "FP64A": ("fp64_active", 1.0),
    "FP32A": ("fp32_active", 1.0),
    "FP16A": ("fp16_active", 1.0),
    "PCITX": ("pcie_tx_bytes_per_second", 1.0),
    "PCIRX": ("pcie_rx_bytes_per_second", 1.0),
    "NVLTX": ("nvlink_tx_bytes_per_second", 1.0),
    "NVLRX": ("nvlink_rx_bytes_per_second", 1.0),
}


def fixture_rows(path: Path, gpu: int, mig: int | None = None, factor: float = 1.0) -> list[dict[str, float]]:
    """GPU `gpu`'s lines of a dmon log as {radt key: value}, N/A cells left out, energy relative to its first reading.

    With `mig`: the lines the fake prints for that GPU's instance, each number times `factor` with the decimals it had,
    under the slice's keys, energy relative to the slice's own first reading."""
    rows, tags, first_energy = [], [], None
    prefix = f"system/gpu_{gpu}_" + (f"mig_{mig}_" if mig is not None else "")
    for line in path.read_text().splitlines():
        parts = line.split()
        if line.startswith("#Entity"):
            tags = parts[1:]
        elif len(parts) >= 2 and parts[0] == "GPU" and parts[1] == str(gpu):
            cells = {t: _times(v, factor) for t, v in zip(tags, parts[2:]) if v != "N/A"}
            row = {prefix + COLUMNS[t][0]: v * COLUMNS[t][1] for t, v in cells.items() if t in COLUMNS}
            if "TOTEC" in cells:
                first_energy = cells["TOTEC"] if first_energy is None else first_energy
                row[prefix + "energy_joules"] = (cells["TOTEC"] - first_energy) / 1000.0
            rows.append(row)
    return rows


def _times(cell: str, factor: float) -> float:
    decimals = len(cell.split(".")[1]) if "." in cell else 0
    return round(float(cell) * factor, decimals)


def is_ordered_subsequence(seen: list[dict], expected: list[dict]) -> bool:
    position = 0
    for observed in seen:
        while position < len(expected) and not _same(observed, expected[position]):
            position += 1
        if position == len(expected):
            return False
    return True


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-9) for k in a)


@pytest.fixture
def dcgmi(monkeypatch, tmp_path, fixtures_dir):
    """The fake dcgmi first on PATH; returns a reader of the argument lists it was started with."""
    monkeypatch.setenv("PATH", os.pathsep.join([str(FAKE_BIN), os.environ.get("PATH", "")]))
    monkeypatch.setenv("RADT_FIXTURES", str(fixtures_dir))
    for name in (
        "RADT_FAKE_DCGMI_LOG",
        "RADT_FAKE_DCGMI_NO_PROFILING",
        "RADT_FAKE_DCGMI_NO_HOSTENGINE",
        "RADT_FAKE_DCGMI_EXIT_AFTER",
        "RADT_FAKE_DCGMI_MIG",
        "RADT_FAKE_DCGMI_DISCOVERY_ERROR",
    ):
        monkeypatch.delenv(name, raising=False)
    record = tmp_path / "dcgmi-argv.jsonl"
    monkeypatch.setenv("RADT_FAKE_DCGMI_ARGS", str(record))

    def invocations() -> list[list[str]]:
        return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []

    return invocations


@pytest.fixture
def source():
    sources = []

    def make() -> DcgmSource:
        sources.append(DcgmSource())
        return sources[-1]

    yield make
    for s in sources:
        s.close()


def collect(src: DcgmSource, until, timeout: float = 15.0) -> list[dict[str, float]]:
    """Sample every 20 ms until until(samples) holds; every non-empty sample, in order."""
    samples = []

    def sampled() -> bool:
        values = src.sample()
        if values:
            samples.append(values)
        return bool(values) and until(samples)

    wait_for(sampled, timeout, what=lambda: f"the samples to meet the condition; got {len(samples)}: {samples[-1:] if samples else 'none'}", interval=0.02)
    return samples


def gpu_part(values: dict[str, float], gpu: int) -> dict[str, float]:
    """The whole GPU's keys (its MIG slices' keys left out)."""
    return {k: v for k, v in values.items() if k.startswith(f"system/gpu_{gpu}_") and not k.startswith(f"system/gpu_{gpu}_mig_")}


def mig_part(values: dict[str, float], gpu: int, gi: int) -> dict[str, float]:
    return {k: v for k, v in values.items() if k.startswith(f"system/gpu_{gpu}_mig_{gi}_")}


def test_values_are_the_recorded_lines(dcgmi, source, fixtures_dir):
    src = source()
    src.open(SamplingContext(interval=0.1))
    argv = dcgmi()[0]
    assert argv[:2] == ["dmon", "-e"] and "1002" in argv[2].split(",") and argv[3:5] == ["-d", "100"]
    assert "-i" not in argv

    samples = collect(src, lambda s: any(v.get("system/gpu_0_sm_active", 0) > 0 for v in s) and len(s) >= 5)
    expected = fixture_rows(fixtures_dir / LOG, 0)
    seen = [gpu_part(v, 0) for v in samples if gpu_part(v, 0)]
    assert is_ordered_subsequence(seen, expected), (seen[:3], expected[:3])
    # open() returns at dmon's first data line, so sampling starts at the head of the log
    assert any(_same(seen[0], row) for row in expected[:5]), seen[0]
    assert seen[0]["system/gpu_0_energy_joules"] < seen[-1]["system/gpu_0_energy_joules"]
    # GPU 3 reads N/A for power and energy: those keys are left out, its other columns are there
    gpu3 = [gpu_part(v, 3) for v in samples if gpu_part(v, 3)]
    assert gpu3 and all("system/gpu_3_power_usage_watts" not in v and "system/gpu_3_energy_joules" not in v for v in gpu3)
    assert all("system/gpu_3_sm_active" in v for v in gpu3)
    assert not any(k.endswith("_nan") or v != v for s in samples for k, v in s.items())
    assert [f for f in src.fields if f > 1000] == list(range(1001, 1013))


HEALTH_ROWS = [  # POWER, DVCCTR (field 112), XIDER (230), ESVTL (310), EDVTL (311)
    ("100.0", "0", "N/A", "3", "0"),
    ("101.0", "4", "N/A", "3", "0"),
    ("102.0", "132", "79", "3", "1"),
    ("103.0", "132", "79", "3", "1"),
    ("104.0", "0", "79", "4", "1"),
    ("105.0", "96", "79", "4", "1"),
    ("106.0", "96", "79", "4", "1"),
    ("107.0", "0", "79", "4", "1"),
]


def health_log(path: Path) -> Path:
    """A dmon log of GPU 0 in dmon's own layout (DCGM 4.6's tags; DVCCTR is 20 wide, the others 5), one sample a line."""
    widths = (18, 21, 6, 6, 6)

    def line(entity: str, cells: tuple[str, ...]) -> str:
        return entity.ljust(10) + "".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + "\n"

    header = line("#Entity", ("POWER", "DVCCTR", "XIDER", "ESVTL", "EDVTL")) + line("ID", ("W", "", "", "", ""))
    path.write_text(header + "".join(line("GPU 0", row) for row in HEALTH_ROWS))
    return path


def test_clock_reasons_xid_and_ecc_come_from_dmons_own_fields(dcgmi, source, monkeypatch, tmp_path):
    """Field 112 is a bitmask (split into the three 0/1 series), 230 the last XID repeated in every row (one 79, however
    often dmon repeats it), 310/311 the volatile ECC totals."""
    monkeypatch.setenv("RADT_FAKE_DCGMI_LOG", str(health_log(tmp_path / "dmon.txt")))
    src = source()
    src.open(SamplingContext(interval=0.1))
    assert {112, 230, 310, 311} <= {int(f) for f in dcgmi()[0][2].split(",")}
    samples = collect(src, lambda s: len(s) >= 12)  # the log loops: past its end and into it again
    g = "system/gpu_0_"
    assert [v[g + "xid_error"] for v in samples if g + "xid_error" in v].count(79.0) == 1
    assert {v[g + "clocks_power_capped"] for v in samples} == {0.0, 1.0}
    assert {v[g + "clocks_thermal_slowdown"] for v in samples} == {0.0, 1.0}
    assert {v[g + "clocks_hardware_slowdown"] for v in samples} == {0.0}
    assert {v[g + "ecc_errors_corrected"] for v in samples} <= {3.0, 4.0} and {v[g + "ecc_errors_uncorrected"] for v in samples} <= {0.0, 1.0}


def test_an_xid_is_not_lost_when_several_dmon_rows_come_between_two_ticks(dcgmi, source, monkeypatch, tmp_path):
    """A tick slower than dmon's rows takes the newest of each value; the XID's row is an event and must survive the 0s after it."""
    monkeypatch.setenv("RADT_FAKE_DCGMI_LOG", str(health_log(tmp_path / "dmon.txt")))
    src = source()
    src.open(SamplingContext(interval=0.1))
    samples: list[dict[str, float]] = []

    def ticked() -> bool:  # about five dmon rows a tick
        samples.append(src.sample())
        return len(samples) >= 6

    wait_for(ticked, 15.0, what="six ticks", interval=0.5)
    assert [v.get("system/gpu_0_xid_error") for v in samples].count(79.0) == 1


def test_devices_are_passed_with_i(dcgmi, source):
    src = source()
    src.open(SamplingContext(interval=0.1, devices=[0, 2]))
    assert dcgmi()[0][-2:] == ["-i", "0,2"]
    samples = collect(src, lambda s: len(s) >= 3 and {k.split("_")[1] for v in s for k in v} >= {"0", "2"})
    gpus = {k.split("_")[1] for values in samples for k in values}
    assert gpus == {"0", "2"}


@pytest.mark.parametrize("refusal", ["1", "module"], ids=["profiling-module-error", "module-not-loaded"])
def test_profiling_refused_falls_back_to_the_basic_fields(dcgmi, source, monkeypatch, refusal):
    monkeypatch.setenv("RADT_FAKE_DCGMI_NO_PROFILING", refusal)
    src = source()
    src.open(SamplingContext(interval=0.1))
    first, second = dcgmi()
    assert any(1001 <= int(f) <= 1012 for f in first[first.index("-e") + 1].split(","))
    assert second[second.index("-e") + 1] == ",".join(map(str, DCGM_BASIC_FIELDS))
    assert src.fields == DCGM_BASIC_FIELDS
    assert src.errors and src.errors[0].startswith("Error setting watches. Result:")
    assert src.describe()["errors"] == src.errors
    samples = collect(src, lambda s: len(s) >= 3)
    assert all(values["system/gpu_0_power_usage_watts"] > 0 for values in samples if "system/gpu_0_power_usage_watts" in values)
    assert any("system/gpu_0_utilization_percentage" in values for values in samples)
    assert not any("sm_active" in k or "gr_engine_active" in k for values in samples for k in values)
    assert dcgmi_children() == [src.proc.pid]  # the refused dmon is gone, one dmon runs


def test_dcgmi_missing_is_unavailable_with_the_fix(monkeypatch, tmp_path, source):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SourceUnavailable, match=r"dcgmi not found on PATH; install DCGM .* or drop 'dcgm' from -l"):
        source().open(SamplingContext(interval=0.1))


def test_no_host_engine_is_unavailable_and_says_so(dcgmi, source, monkeypatch):
    monkeypatch.setenv("RADT_FAKE_DCGMI_NO_HOSTENGINE", "1")
    src = source()
    with pytest.raises(SourceUnavailable, match=r"unable to establish a connection to the specified host: localhost\); check that nv-hostengine runs"):
        src.open(SamplingContext(interval=0.1))
    assert len(dcgmi()) == 2  # tried the profiling set, then the basic set
    assert dcgmi_children() == []


def test_close_leaves_no_dcgmi_alive(dcgmi, source):
    src = source()
    src.open(SamplingContext(interval=0.1))
    proc = psutil.Process(src.proc.pid)
    assert proc.is_running() and "dcgmi" in " ".join(proc.cmdline())
    src.close()
    assert not psutil.pid_exists(proc.pid) or proc.status() == psutil.STATUS_ZOMBIE
    assert dcgmi_children() == []
    src.close()  # twice is harmless


def test_dmon_that_dies_mid_run_is_reported(dcgmi, source, monkeypatch):
    monkeypatch.setenv("RADT_FAKE_DCGMI_EXIT_AFTER", "3")
    src = source()
    src.open(SamplingContext(interval=0.1))

    def refused() -> RuntimeError | None:
        try:
            src.sample()
        except RuntimeError as exc:
            return exc
        return None

    error = wait_for(refused, 10, what="sample() to fail once dcgmi dmon exited (it kept answering)", interval=0.02)
    assert "dcgmi dmon exited with code 0" in str(error)


# --- MIG slices: `dcgmi discovery -c` names each slice's GPU-instance entity, dmon prints it as "GPU-I <id>" ---------

# dcgmi/tests/OutputTests.cpp of DCGM 4.6 (FormatMigHierarchy), its first two GPUs
HIERARCHY = """\
+-------------------+--------------------------------------------------------------------+
| Instance Hierarchy                                                                     |
+===================+====================================================================+
| GPU 0             | GPU GPU-f04cff15-f427-9612-3f5e-60a6e0cd2018 (EntityID: 0)         |
| -> I 0/0          | GPU Instance (EntityID: 0)                                         |
|    -> CI 0/0/0    | Compute Instance (EntityID: 0)                                     |
|    -> CI 0/0/1    | Compute Instance (EntityID: 1000)                                  |
| -> I 0/1          | GPU Instance (EntityID: 100)                                       |
|    -> CI 0/1/0    | Compute Instance (EntityID: 100)                                   |
|    -> CI 0/1/1    | Compute Instance (EntityID: 1100)                                  |
+-------------------+--------------------------------------------------------------------+
| GPU 1             | GPU GPU-1a7b269f-8591-c6a5-a274-6f4f1ad9f6b3 (EntityID: 10)        |
| -> I 1/0          | GPU Instance (EntityID: 10)                                        |
|    -> CI 1/0/0    | Compute Instance (EntityID: 10)                                    |
+-------------------+--------------------------------------------------------------------+
"""
UUID = "GPU-f04cff15-f427-9612-3f5e-60a6e0cd2018"


def mig_env(monkeypatch, *instances: tuple[int, int, float]) -> None:
    """GPU 0 in MIG mode with these (GPU instance id, DCGM entity id, factor of the fake's values) in DCGM's hierarchy."""
    gis = [{"gi": gi, "entity": entity, "factor": factor} for gi, entity, factor in instances]
    monkeypatch.setenv("RADT_FAKE_DCGMI_MIG", json.dumps([{"gpu": 0, "uuid": UUID, "instances": gis}]))


def test_mig_hierarchy_is_read_from_dcgms_own_table():
    assert parse_mig_hierarchy(HIERARCHY) == {(0, 0): 0, (0, 1): 100, (1, 0): 10}
    # other padding and arrows, and the "-> C" compute instance lines of older DCGM, read the same
    older = "| GPU 3 | GPU GPU-x (EntityID: 30)\n|  ->I 3/7 |GPU Instance (EntityID:  370)|\n|   -> C 3/7/0 | Compute Instance (EntityID: 370) |\n"
    assert parse_mig_hierarchy(older) == {(3, 7): 370}
    assert parse_mig_hierarchy("Error: Cannot get hierarchy information from the hostengine. Return: Host engine connection invalid/disconnected") == {}


def test_gpu_instance_lines_become_their_slices_keys_and_others_are_dropped():
    lines = [
        "#Entity   SMACT   TOTEC",
        "GPU 0     0.5     5000",
        "GPU-I 100 0.25    2000",
        "GPU-I 200 0.125   1000",
        "GPU 0     0.5     6000",
        "GPU-I 100 0.25    2500",
    ]
    rows, energy = list(parse_dcgmi_dmon(lines)), EnergyBaseline()
    metrics = [dmon_metrics(row, energy, instances={100: (0, 1)}) for row in rows]
    assert metrics[1] == {"system/gpu_0_mig_1_sm_active": 0.25, "system/gpu_0_mig_1_energy_joules": 0.0}
    assert metrics[2] == {}, "an instance not asked for is dropped"
    assert metrics[4]["system/gpu_0_mig_1_energy_joules"] == pytest.approx(0.5), "relative to the slice's own first reading"
    assert metrics[3]["system/gpu_0_energy_joules"] == pytest.approx(1.0)
    # `radt import` of a dmon log has no hierarchy: its GPU-I lines are dropped
    assert [dmon_metrics(row, EnergyBaseline()) for row in rows][1:3] == [{}, {}]


def test_a_mig_slice_is_its_own_series_from_dmons_gpu_instance_lines(dcgmi, source, monkeypatch, fixtures_dir):
    mig_env(monkeypatch, (0, 0, 1.0), (1, 100, 0.5))
    src = source()
    src.open(SamplingContext(interval=0.1, devices=[0], slices=[(0, 1)]))
    discovery, dmon = dcgmi()
    assert discovery == ["discovery", "-c"]
    assert dmon[:2] == ["dmon", "-e"] and dmon[-2:] == ["-i", "0,i:100"]

    samples = collect(src, lambda s: any(v.get("system/gpu_0_mig_1_sm_active", 0) > 0 for v in s) and len(s) >= 5)
    seen = [mig_part(v, 0, 1) for v in samples if mig_part(v, 0, 1)]
    expected = fixture_rows(fixtures_dir / LOG, 0, mig=1, factor=0.5)
    assert is_ordered_subsequence(seen, expected), (seen[:3], expected[:3])
    assert any(_same(seen[0], row) for row in expected[:5]), seen[0]
    whole = [gpu_part(v, 0) for v in samples if gpu_part(v, 0)]
    assert is_ordered_subsequence(whole, fixture_rows(fixtures_dir / LOG, 0)), "the GPU's own series go on beside the slice's"
    assert not [k for v in samples for k in v if "_mig_0_" in k or not k.startswith("system/gpu_0_")]
    assert src.describe()["mig_instances"] == {"0/1": 100} and "mig_activity" not in src.describe()


def test_two_slices_are_two_series(dcgmi, source, monkeypatch, fixtures_dir):
    mig_env(monkeypatch, (1, 100, 0.5), (2, 200, 0.25))
    src = source()
    src.open(SamplingContext(interval=0.1, slices=[(0, 1), (0, 2)]))  # no -d: the slices' GPU is named beside them
    assert dcgmi()[1][-2:] == ["-i", "0,i:100,i:200"]

    def both_active(samples):
        return any(v.get("system/gpu_0_mig_1_sm_active", 0) > 0 and v.get("system/gpu_0_mig_2_sm_active", 0) > 0 for v in samples)

    samples = collect(src, both_active)
    for gi, factor in ((1, 0.5), (2, 0.25)):
        seen = [mig_part(v, 0, gi) for v in samples if mig_part(v, 0, gi)]
        assert is_ordered_subsequence(seen, fixture_rows(fixtures_dir / LOG, 0, mig=gi, factor=factor)), gi
    last = next(v for v in reversed(samples) if v.get("system/gpu_0_mig_1_sm_active", 0) > 0 and v.get("system/gpu_0_mig_2_sm_active", 0) > 0)
    assert last["system/gpu_0_mig_1_sm_active"] > last["system/gpu_0_mig_2_sm_active"]


@pytest.mark.parametrize(
    ("hierarchy", "slices", "entities", "reason"),
    [
        ([(1, 100, 0.5)], [(0, 1), (0, 3)], "0,i:100", "DCGM's MIG hierarchy (dcgmi discovery -c) has no GPU 0 instance 3"),
        ([], [(0, 3)], "0", "DCGM's MIG hierarchy (dcgmi discovery -c) has no GPU 0 instance 3"),
        (None, [(0, 3)], "0", "dcgmi discovery -c failed (Error: Cannot get hierarchy information from the hostengine. Return: "),
    ],
    ids=["absent-from-the-hierarchy", "no-mig-instances", "discovery-fails"],
)
def test_a_slice_dcgm_does_not_list_is_reported_once_and_the_gpu_goes_on(dcgmi, source, monkeypatch, fixtures_dir, hierarchy, slices, entities, reason):
    if hierarchy is None:
        monkeypatch.setenv("RADT_FAKE_DCGMI_DISCOVERY_ERROR", "1")
    else:
        mig_env(monkeypatch, *hierarchy)
    src = source()
    src.open(SamplingContext(interval=0.1, devices=[0], slices=slices))
    assert [argv[0] for argv in dcgmi()] == ["discovery", "dmon"]
    assert dcgmi()[1][-2:] == ["-i", entities]
    said = src.describe()["mig_activity"]
    assert said.startswith("unavailable: " + reason) and said.endswith("; the GPU-level series are the whole GPU's")
    assert said.count("unavailable") == 1

    # until five samples hold the whole GPU's line (a sample taken between its line and a slice's holds only the slice)
    samples = collect(src, lambda s: sum(1 for v in s if gpu_part(v, 0)) >= 5)
    whole = [gpu_part(v, 0) for v in samples if gpu_part(v, 0)]
    assert len(whole) >= 5 and is_ordered_subsequence(whole, fixture_rows(fixtures_dir / LOG, 0))
    assert not [k for v in samples for k in v if "_mig_3_" in k]
    assert bool([k for v in samples for k in v if "_mig_1_" in k]) == (hierarchy == [(1, 100, 0.5)])
    assert src.describe()["mig_activity"] == said  # one reason, not one per sample


def test_profiling_refused_on_a_mig_slice_falls_back_and_says_the_activity_is_missing(dcgmi, source, monkeypatch):
    monkeypatch.setenv("RADT_FAKE_DCGMI_NO_PROFILING", "1")
    mig_env(monkeypatch, (1, 100, 0.5))
    src = source()
    src.open(SamplingContext(interval=0.1, devices=[0], slices=[(0, 1)]))
    _, first, second = dcgmi()
    assert first[-2:] == second[-2:] == ["-i", "0,i:100"]
    assert src.fields == DCGM_BASIC_FIELDS
    assert src.describe()["mig_activity"].startswith("unavailable: DCGM refused the profiling fields (Error setting watches.")
    samples = collect(src, lambda s: any("system/gpu_0_mig_1_power_usage_watts" in v for v in s) and len(s) >= 3)
    assert any("system/gpu_0_power_usage_watts" in v for v in samples)
    assert not any("sm_active" in k for v in samples for k in v)


def dcgmi_children() -> list[int]:
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if any("dcgmi" in part for part in child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                out.append(child.pid)
        except psutil.Error:
            continue
    return out
