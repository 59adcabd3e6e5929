"""The tool-log parsers and their mapping onto catalogue keys, checked against the real logs.

The files in fixtures/real-tool-logs are raw `dcgmi dmon`, `nvidia-smi --format=csv` and `top -b`
output recorded on a DGX Station A100 (GPUs 0..4, GPU 3 the "DGX Display"). Expected values are
read from the files with plain string splitting here, independently of the parsers, plus a few
numbers quoted from the files and the paper (GRACT 0.911 with SMACT 0.002 for one thread).
"""

from __future__ import annotations

import math
from datetime import datetime, time
from pathlib import Path

import pytest

from radt.catalogue import MIB
from radt.collectors.sources.parsers import (
    DmonParser,
    detect_format,
    dmon_error,
    parse_dcgmi_dmon,
    parse_nvidia_smi_csv,
    parse_top_batch,
)
from radt.collectors.sources.toolmetrics import EnergyBaseline, dmon_metrics, is_process, smi_metrics, top_metrics

DMON_FILES = [
    "microbench_1.1_dcgmi_dmon.txt",
    "microbench_128.32_dcgmi_dmon.txt",
    "microbench_1024.1024_dcgmi_dmon.txt",
    "microbench_131072.1024_dcgmi_dmon.txt",
    "mnist_dcgmi_dmon_18fields.txt",
]
SMI_FILES = [
    "microbench_1.1_nvidia_smi.csv",
    "microbench_128.32_nvidia_smi.csv",
    "microbench_1024.1024_nvidia_smi.csv",
    "microbench_131072.1024_nvidia_smi.csv",
    "mnist_nvidia_smi.csv",
]
TOP_FILE = "mnist_top_batch.txt"
STDOUT_FILE = "mnist_training_stdout.txt"
GPUS = [0, 1, 2, 3, 4]  # the DGX Station's four A100s and its display GPU (index 3)
DISPLAY_GPU = 3
GIB = 1024.0**3


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _cell(text: str) -> float | None:
    return None if text == "N/A" else float(text)


def _dmon_reference(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """(tags of the first header, [(gpu, cells)] of every entity line), by plain splitting."""
    lines = _lines(path)
    tags = lines[0].lstrip("#").split()[1:]
    rows = [(int(line.split()[1]), line.split()[2:]) for line in lines if line.startswith("GPU ")]
    return tags, rows


def _smi_reference(path: Path) -> tuple[list[str], list[list[str]]]:
    lines = _lines(path)
    header = [c.strip().split(" [")[0] for c in lines[0].split(",")]
    return header, [[c.strip() for c in line.split(",")] for line in lines[1:] if line.strip()]


def test_the_fixture_set_is_the_one_these_tests_cover(fixtures_dir):
    """A log added to the fixtures must be added here too, so it gets parsed and checked."""
    logs = {p.name for p in fixtures_dir.iterdir() if p.name != "README.md"}
    assert logs == {*DMON_FILES, *SMI_FILES, TOP_FILE, STDOUT_FILE}


# --------------------------------------------------------------------------- dcgmi dmon


@pytest.mark.parametrize("name", DMON_FILES)
def test_every_dmon_log_parses_to_five_gpus_per_sample(fixtures_dir, name):
    path = fixtures_dir / name
    tags, expected = _dmon_reference(path)
    rows = list(parse_dcgmi_dmon(_lines(path)))

    assert len(rows) == len(expected) > 0
    assert len(rows) % len(GPUS) == 0
    for i, (row, (gpu, cells)) in enumerate(zip(rows, expected)):
        assert row.sample == i // len(GPUS), f"line {i}: the sample advances when GPU 0 comes again"
        assert row.gpu == gpu == GPUS[i % len(GPUS)]
        assert row.entity == f"GPU {gpu}"
        assert list(row.values) == tags
        assert list(row.values.values()) == [_cell(c) for c in cells[: len(tags)]]
    assert not any(row.entity.startswith("ID") for row in rows), "the units line is not data"


@pytest.mark.parametrize("name", DMON_FILES)
def test_dmon_line_by_line_feeding_matches_the_whole_file(fixtures_dir, name):
    """The live dcgm source feeds one line at a time; it must see what `radt import` sees."""
    lines = _lines(fixtures_dir / name)
    parser = DmonParser()
    fed = [row for row in map(parser.feed, lines) if row is not None]
    assert fed == list(parse_dcgmi_dmon(lines))
    units = next(line for line in lines if line.startswith("ID"))
    assert DmonParser().feed(lines[0]) is None and parser.feed(units) is None


def _gpu0(name: str, fixtures_dir: Path, tag: str) -> list[float]:
    return [r.values[tag] for r in parse_dcgmi_dmon(_lines(fixtures_dir / name)) if r.gpu == 0]


def test_one_thread_keeps_gract_high_while_the_sms_idle(fixtures_dir):
    """The paper's Figure 1: 1 block of 1 thread reads GRACT ~0.9 while SMACT is 0.002, SMOCC 0."""
    name = "microbench_1.1_dcgmi_dmon.txt"
    gract, smact, smocc = (_gpu0(name, fixtures_dir, t) for t in ("GRACT", "SMACT", "SMOCC"))
    assert len(gract) == 7
    assert gract[:2] == [0.0, 0.251]  # idle, then the kernel starts
    assert max(gract) == 0.911
    assert all(0.89 <= v <= 0.911 for v in gract[2:])
    assert smact[2:] == [0.002] * 5 and max(smact) == 0.002
    assert set(smocc) == {0.0}
    assert _gpu0(name, fixtures_dir, "GPUTL")[2:] == [91.0] * 5
    others = [r for r in parse_dcgmi_dmon(_lines(fixtures_dir / name)) if r.gpu != 0]
    assert others and all(set(r.values.values()) == {0.0} for r in others), "the other GPUs stay idle"


def test_a_full_grid_saturates_gract_smact_and_smocc(fixtures_dir):
    """131072 blocks of 1024 threads: GRACT 1.0, SMACT 0.995, SMOCC 0.782, over 58 headers."""
    name = "microbench_131072.1024_dcgmi_dmon.txt"
    lines = _lines(fixtures_dir / name)
    assert sum(line.startswith("#Entity") for line in lines) == 58
    rows = list(parse_dcgmi_dmon(lines))
    assert len(rows) == 4010 and rows[-1].sample == 801
    busy = [r.values for r in rows if r.gpu == 0 and r.values["GRACT"] == 1.0]
    assert len(busy) == 799
    assert {(v["SMACT"], v["SMOCC"], v["TENSO"], v["GPUTL"]) for v in busy} == {(0.995, 0.782, 0.008, 100.0)}


def test_the_middle_grids_sit_between(fixtures_dir):
    smact_128 = _gpu0("microbench_128.32_dcgmi_dmon.txt", fixtures_dir, "SMACT")
    smocc_1024 = _gpu0("microbench_1024.1024_dcgmi_dmon.txt", fixtures_dir, "SMOCC")
    assert max(smact_128) == 0.222
    assert max(smocc_1024) == 0.388 and len(smocc_1024) == 28


def test_mnist_18_fields_with_na_cells(fixtures_dir):
    rows = list(parse_dcgmi_dmon(_lines(fixtures_dir / "mnist_dcgmi_dmon_18fields.txt")))
    assert len(rows) == 250 and rows[-1].sample == 49
    tags = list(rows[0].values)
    assert len(tags) == 18
    assert tags[:5] == ["POWER", "TOTEC", "TXTPT", "RXTPT", "GPUTL"] and tags[-4:] == ["PCITX", "PCIRX", "NVLTX", "NVLRX"]
    assert rows[0].values["POWER"] == 60.048 and rows[0].values["TOTEC"] == 1265183027.0
    assert rows[0].values["PCITX"] == 882006.0
    display = [r for r in rows if r.gpu == DISPLAY_GPU]
    assert len(display) == 50
    assert all(r.values["POWER"] is None and r.values["TOTEC"] is None for r in display)
    assert all(r.values["TXTPT"] is None and r.values["RXTPT"] is None for r in rows)
    assert all(r.values["PCITX"] is not None for r in display), "the display GPU still reports PCIe bytes"


def test_mnist_dmon_metrics_leave_na_out_and_convert_units(fixtures_dir):
    rows = list(parse_dcgmi_dmon(_lines(fixtures_dir / "mnist_dcgmi_dmon_18fields.txt")))
    energy = EnergyBaseline()
    metrics = [dmon_metrics(r, energy) for r in rows]
    first = {r.gpu: m for r, m in zip(rows, metrics) if r.sample == 0}
    second = {r.gpu: m for r, m in zip(rows, metrics) if r.sample == 1}

    gpu0 = first[0]
    assert gpu0 == {
        "system/gpu_0_power_usage_watts": 60.048,
        "system/gpu_0_energy_joules": 0.0,
        "system/gpu_0_utilization_percentage": 54.0,
        "system/gpu_0_memory_utilization_percentage": 1.0,
        "system/gpu_0_gr_engine_active": 0.0,
        "system/gpu_0_sm_active": 0.0,
        "system/gpu_0_sm_occupancy": 0.0,
        "system/gpu_0_tensor_active": 0.0,
        "system/gpu_0_dram_active": 0.0,
        "system/gpu_0_fp64_active": 0.0,
        "system/gpu_0_fp32_active": 0.0,
        "system/gpu_0_fp16_active": 0.0,
        "system/gpu_0_pcie_tx_bytes_per_second": 882006.0,
        "system/gpu_0_pcie_rx_bytes_per_second": 910603.0,
        "system/gpu_0_nvlink_tx_bytes_per_second": 0.0,
        "system/gpu_0_nvlink_rx_bytes_per_second": 0.0,
    }
    # TOTEC is mJ since the driver loaded: J since the first reading, per GPU
    assert second[0]["system/gpu_0_energy_joules"] == pytest.approx((1265243527 - 1265183027) / 1000)
    assert second[1]["system/gpu_1_energy_joules"] == pytest.approx((917600939 - 917550329) / 1000)
    # GPU 3's power and energy read N/A: left out, not written as 0
    assert "system/gpu_3_power_usage_watts" not in first[3] and "system/gpu_3_energy_joules" not in first[3]
    assert first[3]["system/gpu_3_pcie_tx_bytes_per_second"] == 123841.0
    assert len(first[3]) == len(gpu0) - 2
    assert not any(k.startswith(("system/gpu_3_power", "system/gpu_3_energy")) for m in metrics for k in m)
    assert sum("system/gpu_3_sm_active" in m for m in metrics) == 50
    last0 = [m for r, m in zip(rows, metrics) if r.gpu == 0][-1]
    assert last0["system/gpu_0_energy_joules"] == pytest.approx((1268275938 - 1265183027) / 1000)
    assert all(not math.isnan(v) for m in metrics for v in m.values())


def test_dmon_throughput_in_kb_per_second_becomes_bytes(fixtures_dir):
    """TXTPT/RXTPT (fields 200/201) print KB/s; the catalogue stores bytes/s."""
    lines = [
        "#Entity   POWER    TOTEC        TXTPT     RXTPT",
        "ID        W        mJ           KB/       KB/",
        "GPU 0     60.0     1000         250       1000",
        "GPU 0     61.0     3500         N/A       2",
    ]
    energy = EnergyBaseline()
    first, second = (dmon_metrics(r, energy) for r in parse_dcgmi_dmon(lines))
    assert first["system/gpu_0_pcie_tx_bytes_per_second"] == 250 * 1024
    assert first["system/gpu_0_pcie_rx_bytes_per_second"] == 1000 * 1024
    assert first["system/gpu_0_energy_joules"] == 0.0
    assert "system/gpu_0_pcie_tx_bytes_per_second" not in second
    assert second["system/gpu_0_pcie_rx_bytes_per_second"] == 2048
    assert second["system/gpu_0_energy_joules"] == pytest.approx(2.5)


@pytest.mark.parametrize("header", ["#Entity TXTPT PCITX RXTPT PCIRX", "#Entity PCITX TXTPT PCIRX RXTPT"])
def test_dmon_profiling_pcie_bytes_win_over_the_old_throughput_fields(header):
    """Both map to pcie_*_bytes_per_second; the column order must not decide which one is kept."""
    tags = header.split()[1:]
    cells = {"TXTPT": "100", "PCITX": "5000", "RXTPT": "200", "PCIRX": "N/A"}
    lines = [header, "GPU 0 " + " ".join(cells[t] for t in tags)]
    (row,) = parse_dcgmi_dmon(lines)
    metrics = dmon_metrics(row, EnergyBaseline())
    assert metrics["system/gpu_0_pcie_tx_bytes_per_second"] == 5000.0
    assert metrics["system/gpu_0_pcie_rx_bytes_per_second"] == 200 * 1024, "PCIRX N/A: the KB/s field stands in"


def test_dmon_repeated_and_changed_headers():
    lines = [
        "#Entity   GRACT   SMACT",
        "ID",
        "GPU 0     0.5     0.25",
        "GPU 1     0.0     0.0",
        "",
        "#Entity   GRACT   SMACT",
        "ID",
        "GPU 0     0.6     0.30",
        "GPU 1     0.1     0.05",
        "#Entity   SMOCC   DRAMA   FP32A",
        "ID",
        "GPU 0     0.7     0.1     0.2",
        "GPU 1     N/A     0.0     0.0",
    ]
    rows = list(parse_dcgmi_dmon(lines))
    assert [(r.sample, r.gpu) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert rows[2].values == {"GRACT": 0.6, "SMACT": 0.30}
    assert rows[4].values == {"SMOCC": 0.7, "DRAMA": 0.1, "FP32A": 0.2}
    assert rows[5].values["SMOCC"] is None
    assert dmon_metrics(rows[5], EnergyBaseline()) == {"system/gpu_1_dram_active": 0.0, "system/gpu_1_fp32_active": 0.0}


def test_dmon_ignores_lines_before_a_header_and_short_lines():
    lines = [
        "GPU 0     0.5     0.25",  # no header yet: no tags to name the cells
        "#Entity   GRACT   SMACT",
        "GPU 0     0.5",  # cut off (the tool was killed mid-line)
        "GPU 0     0.4     0.2     extra",
        "",
    ]
    rows = list(parse_dcgmi_dmon(lines))
    assert len(rows) == 1 and rows[0].values == {"GRACT": 0.4, "SMACT": 0.2} and rows[0].sample == 0


def test_dmon_single_gpu_and_mig_entities():
    single = list(parse_dcgmi_dmon(["#Entity SMACT", "GPU 2  0.1", "GPU 2  0.2", "GPU 2  0.3"]))
    assert [(r.sample, r.gpu) for r in single] == [(0, 2), (1, 2), (2, 2)]
    assert dmon_metrics(single[0], EnergyBaseline()) == {"system/gpu_2_sm_active": 0.1}
    mig = list(parse_dcgmi_dmon(["#Entity SMACT", "GPU-I 1  0.4", "GPU-I 2  0.5", "GPU-I 1  0.6"]))
    assert [(r.sample, r.entity, r.gpu) for r in mig] == [(0, "GPU-I 1", None), (0, "GPU-I 2", None), (1, "GPU-I 1", None)]
    assert dmon_metrics(mig[0], EnergyBaseline()) == {}, "no GPU index, no per-GPU key"
    assert dmon_metrics(mig[0], EnergyBaseline(), gpu=0) == {"system/gpu_0_sm_active": 0.4}


def test_dmon_error_lines():
    assert dmon_error("Error setting watches. Result: The third-party Profiling module returned an unrecoverable error\n").startswith("Error setting")
    assert dmon_error("Error: Unable to connect to host engine. Host engine connection invalid/disconnected.") is not None
    assert dmon_error("GPU 0     0.5     0.25") is None


# --------------------------------------------------------------------------- nvidia-smi


@pytest.mark.parametrize("name", SMI_FILES)
def test_every_smi_log_parses_to_five_gpus_per_sample(fixtures_dir, name):
    path = fixtures_dir / name
    header, expected = _smi_reference(path)
    rows = parse_nvidia_smi_csv(_lines(path))

    assert len(rows) == len(expected) > 0 and len(rows) % len(GPUS) == 0
    for i, (row, cells) in enumerate(zip(rows, expected)):
        assert (row.sample, row.gpu) == (i // len(GPUS), GPUS[i % len(GPUS)])
        assert row.text == dict(zip(header, cells))
        assert row.values["utilization.gpu"] == float(cells[header.index("utilization.gpu")].removesuffix(" %"))
        assert row.values["utilization.memory"] == float(cells[header.index("utilization.memory")].removesuffix(" %"))
        assert row.values["memory.used"] == float(cells[header.index("memory.used")].removesuffix(" MiB"))
        if row.gpu == DISPLAY_GPU:
            assert row.text["name"] == "NVIDIA DGX Display" and row.values["memory.total"] == 4096.0
        else:
            assert row.text["name"] == "NVIDIA A100-SXM4-40GB" and row.values["memory.total"] == 40960.0
        assert row.values["name"] is None, "text columns have no numeric value"


@pytest.mark.parametrize("name", SMI_FILES)
def test_smi_metrics_for_every_row(fixtures_dir, name):
    rows = parse_nvidia_smi_csv(_lines(fixtures_dir / name))
    for row in rows:
        metrics = smi_metrics(row)
        g = row.gpu
        used = row.values["memory.used"]
        assert metrics[f"system/gpu_{g}_utilization_percentage"] == row.values["utilization.gpu"]
        assert metrics[f"system/gpu_{g}_memory_utilization_percentage"] == row.values["utilization.memory"]
        assert metrics[f"system/gpu_{g}_memory_usage_megabytes"] == pytest.approx(used * 1.048576)
        assert metrics[f"system/gpu_{g}_memory_usage_percentage"] == pytest.approx(100 * used / row.values["memory.total"])
        assert all(k.startswith(f"system/gpu_{g}_") for k in metrics)
        assert not any("total" in k for k in metrics), "memory.total is a property, not a series"


def test_smi_microbench_values(fixtures_dir):
    rows = parse_nvidia_smi_csv(_lines(fixtures_dir / "microbench_1.1_nvidia_smi.csv"))
    gpu0 = [r for r in rows if r.gpu == 0]
    assert len(gpu0) == 7
    assert [r.values["utilization.gpu"] for r in gpu0] == [0, 0, 91, 91, 91, 91, 91]
    assert max(r.values["memory.used"] for r in gpu0) == 419.0
    assert smi_metrics(gpu0[2])["system/gpu_0_memory_usage_megabytes"] == pytest.approx(419 * 1024 * 1024 / 1e6)
    big = parse_nvidia_smi_csv(_lines(fixtures_dir / "microbench_131072.1024_nvidia_smi.csv"))
    assert len(big) == 3990 and big[-1].sample == 797
    assert max(r.values["memory.used"] for r in big if r.gpu == 0) == 1441.0
    assert {r.values["utilization.gpu"] for r in big if r.gpu != 0} == {0.0}


def test_smi_mnist_timestamps_and_pstates(fixtures_dir):
    rows = parse_nvidia_smi_csv(_lines(fixtures_dir / "mnist_nvidia_smi.csv"))
    assert len(rows) == 250 and rows[-1].sample == 49
    assert rows[0].timestamp == pytest.approx(datetime(2023, 2, 21, 15, 16, 55, 262000).timestamp())
    assert rows[-1].timestamp == pytest.approx(datetime(2023, 2, 21, 15, 17, 44, 584000).timestamp())
    assert rows[0].text["timestamp"] == "2023/02/21 15:16:55.262"
    assert "timestamp" not in rows[0].values
    stamps = [r.timestamp for r in rows]
    assert stamps == sorted(stamps)
    firsts = [r.timestamp for r in rows if r.gpu == 0]
    assert all(0.9 < b - a < 1.2 for a, b in zip(firsts, firsts[1:])), "one sample a second"
    assert {r.text["pstate"] for r in rows if r.gpu == DISPLAY_GPU} == {"P8"}
    assert {r.text["pstate"] for r in rows if r.gpu != DISPLAY_GPU} == {"P0"}
    assert smi_metrics(rows[3])["system/gpu_3_pstate"] == 8.0
    assert smi_metrics(rows[0]) == {
        "system/gpu_0_pstate": 0.0,
        "system/gpu_0_utilization_percentage": 33.0,
        "system/gpu_0_memory_utilization_percentage": 1.0,
        "system/gpu_0_memory_usage_megabytes": 0.0,
        "system/gpu_0_memory_usage_percentage": 0.0,
    }
    gpu0 = [r for r in rows if r.gpu == 0]
    assert max(r.values["memory.used"] for r in gpu0) == 2411.0


def test_smi_index_column_names_the_gpus():
    """`-i 2,3` with an index column: GPUs 2 and 3, whatever their names."""
    lines = [
        "index, name, utilization.gpu [%], power.draw [W], memory.used [MiB], memory.total [MiB]",
        "2, NVIDIA H100 80GB HBM3, 40 %, 312.50 W, 1000 MiB, 81559 MiB",
        "3, NVIDIA H100 80GB HBM3, 0 %, [N/A], 0 MiB, 81559 MiB",
        "2, NVIDIA H100 80GB HBM3, 41 %, 313.00 W, 1001 MiB, 81559 MiB",
        "3, NVIDIA H100 80GB HBM3, 1 %, [Not Supported], 2 MiB, 81559 MiB",
    ]
    rows = parse_nvidia_smi_csv(lines)
    assert [(r.sample, r.gpu) for r in rows] == [(0, 2), (0, 3), (1, 2), (1, 3)]
    assert rows[0].values["power.draw"] == 312.5
    assert rows[1].values["power.draw"] is None and rows[3].values["power.draw"] is None
    assert smi_metrics(rows[0])["system/gpu_2_power_usage_watts"] == 312.5
    assert "system/gpu_3_power_usage_watts" not in smi_metrics(rows[1]), "[N/A] is left out, not 0"
    assert smi_metrics(rows[3])["system/gpu_3_utilization_percentage"] == 1.0


def test_smi_uuid_column_numbers_gpus_in_order_of_appearance():
    lines = ["uuid, utilization.gpu [%]", "GPU-aaa, 1 %", "GPU-bbb, 2 %", "GPU-aaa, 3 %", "GPU-bbb, 4 %"]
    rows = parse_nvidia_smi_csv(lines)
    assert [(r.sample, r.gpu, r.values["utilization.gpu"]) for r in rows] == [(0, 0, 1), (0, 1, 2), (1, 0, 3), (1, 1, 4)]


def test_smi_repeated_header_nounits_and_gpu_count():
    lines = [
        "utilization.gpu [%], memory.used [MiB]",
        "10, 100",
        "20, 200",
        "",
        "utilization.gpu [%], memory.used [MiB]",  # nvidia-smi restarted into the same file
        "30, 300",
        "40, 400",
        "50",  # cut off
    ]
    rows = parse_nvidia_smi_csv(lines, gpu_count=2)
    assert [(r.sample, r.gpu, r.values["utilization.gpu"], r.values["memory.used"]) for r in rows] == [
        (0, 0, 10, 100),
        (0, 1, 20, 200),
        (1, 0, 30, 300),
        (1, 1, 40, 400),
    ]
    alone = parse_nvidia_smi_csv(lines[:3])
    assert [(r.sample, r.gpu) for r in alone] == [(0, 0), (1, 0)], "same-looking rows without a hint: one GPU"


def test_smi_timestamp_bursts_give_the_gpu_count():
    lines = [
        "timestamp, name, utilization.gpu [%]",
        "2024/05/01 23:59:59.001, NVIDIA H100, 1 %",
        "2024/05/01 23:59:59.004, NVIDIA H100, 2 %",
        "2024/05/02 00:00:00.002, NVIDIA H100, 3 %",
        "2024/05/02 00:00:00.005, NVIDIA H100, 4 %",
    ]
    rows = parse_nvidia_smi_csv(lines)
    assert [(r.sample, r.gpu) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert rows[2].timestamp - rows[0].timestamp == pytest.approx(1.001)
    assert rows[0].timestamp == pytest.approx(datetime(2024, 5, 1, 23, 59, 59, 1000).timestamp())


def test_smi_empty_input():
    assert parse_nvidia_smi_csv([]) == []
    assert parse_nvidia_smi_csv(["name, utilization.gpu [%]"]) == []


# --------------------------------------------------------------------------- top -b


def _top_reference(path: Path) -> list[dict]:
    """Per frame, by plain splitting: clock, idle, used/total MiB, python %CPU and RES cells."""
    frames: list[dict] = []
    table = False
    for line in _lines(path):
        words = line.split()
        if line.startswith("top - "):
            frames.append({"clock": words[2], "python": []})
            table = False
        elif line.startswith("%Cpu(s):"):
            frames[-1]["idle"] = float(words[words.index("id,") - 1])
        elif line.startswith("MiB Mem"):
            frames[-1]["total"] = float(words[3])
            frames[-1]["used"] = float(words[7])
        elif words[:1] == ["PID"]:
            table = True
        elif table and words and words[-1] == "python":
            frames[-1]["python"].append((words[8], words[5]))
    return frames


def _res_bytes(cell: str) -> float:
    if cell.endswith("g"):
        return float(cell[:-1]) * GIB
    return float(cell) * 1024  # KiB


def test_top_mnist_frames(fixtures_dir):
    path = fixtures_dir / TOP_FILE
    expected = _top_reference(path)
    frames = list(parse_top_batch(_lines(path)))
    assert len(frames) == len(expected) == 17
    assert frames[0].clock == time(15, 16, 5) and frames[-1].clock == time(15, 16, 53)
    assert [f.clock.strftime("%H:%M:%S") for f in frames] == [e["clock"] for e in expected]
    for frame, exp in zip(frames, expected):
        assert frame.cpu_percent == pytest.approx(100 - exp["idle"])
        assert frame.mem_used_mb == pytest.approx(exp["used"] * MIB)
        assert frame.mem_total_mb == pytest.approx(exp["total"] * MIB)
        assert frame.swap_used_mb == 0.0
        python = [p for p in frame.processes if p.command == "python"]
        assert [(p.cpu_percent, p.rss_bytes) for p in python] == [(float(c), pytest.approx(_res_bytes(r))) for c, r in exp["python"]]
        assert len(frame.processes) >= 3
    assert frames[0].cpu_percent == pytest.approx(0.9)
    assert frames[0].mem_used_mb == pytest.approx(3349.7 * 1.048576)
    assert frames[1].processes[0].pid == 89616 and frames[1].processes[0].rss_bytes == pytest.approx(3.0 * GIB)
    assert frames[1].processes[1].rss_bytes == pytest.approx(1.2 * GIB)
    assert frames[0].processes[0].rss_bytes == 106644 * 1024
    assert frames[1].processes[0].user == "ehyo" and frames[1].processes[0].mem_percent == 0.6


def test_top_mnist_metrics(fixtures_dir):
    frames = list(parse_top_batch(_lines(fixtures_dir / TOP_FILE)))
    metrics = [top_metrics(f) for f in frames]
    assert metrics[1] == {
        "system/cpu_utilization_percentage": pytest.approx(1.5),
        "system/system_memory_usage_megabytes": pytest.approx(5845.3 * MIB),
        "system/system_memory_usage_percentage": pytest.approx(100 * 5845.3 / 515637.3),
        "system/swap_usage_megabytes": 0.0,
        "system/process_cpu_utilization_percentage": pytest.approx(159.6 + 26.5),
        "system/process_memory_rss_megabytes": pytest.approx((3.0 + 1.2) * GIB / 1e6),
    }
    assert metrics[0]["system/process_cpu_utilization_percentage"] == 88.2
    assert metrics[-1]["system/process_cpu_utilization_percentage"] == pytest.approx(42.2 + 15.6)
    assert metrics[-1]["system/process_memory_rss_megabytes"] == pytest.approx((3.9 + 3.2) * GIB / 1e6)
    assert all(m["system/process_cpu_utilization_percentage"] > 0 for m in metrics), "python is in every frame"
    containerd = top_metrics(frames[0], "containerd")
    assert containerd["system/process_cpu_utilization_percentage"] == 5.9
    assert containerd["system/process_memory_rss_megabytes"] == pytest.approx(42320 * 1024 / 1e6)
    host_only = top_metrics(frames[0], None)
    assert "system/process_cpu_utilization_percentage" not in host_only and len(host_only) == 4


KIB_TOP = """\
top - 23:59:58 up 10 days,  2:03,  1 user,  load average: 0.52, 0.58, 0.59
Tasks: 250 total,   1 running, 249 sleeping,   0 stopped,   0 zombie
%Cpu(s): 12.5 us,  2.5 sy,  0.0 ni, 85.0 id,  0.0 wa,  0.0 hi,  0.0 si,  0.0 st
KiB Mem : 16318488 total,  8123456 free,  4000000 used,  4195032 buff/cache
KiB Swap:  2097148 total,  2000000 free,    97148 used. 11800000 avail Mem

  PID USER      PR  NI    VIRT    RES    SHR S  %CPU %MEM     TIME+ COMMAND
 4242 alice     20   0 8123456 2048000  65536 R 150.0 12.6   1:02.03 python3
 4243 alice     20   0 3123456 512000  65536 S  25.0  3.1   0:12.03 python3.11
 4244 alice     20   0  123456  10240   6536 S   1.0  0.1   0:00.03 pythonista
    1 root      20   0  225620   9508   6680 S   0.0  0.1   0:05.12 systemd

top - 00:00:01 up 10 days,  2:03,  1 user,  load average: 0.52, 0.58, 0.59
Tasks: 250 total,   1 running, 249 sleeping,   0 stopped,   0 zombie
%Cpu(s):  0.0 us,  0.0 sy,  0.0 ni,100.0 id,  0.0 wa,  0.0 hi,  0.0 si,  0.0 st
KiB Mem : 16318488 total,  8123456 free,  4000004 used,  4195028 buff/cache
KiB Swap:  2097148 total,  2000000 free,    97148 used. 11800000 avail Mem

  PID USER      PR  NI    VIRT    RES    SHR S  %CPU %MEM     TIME+ COMMAND
 4242 alice     20   0 8123456   1.9g  65536 R  99.0 12.6   1:03.03 python3
"""


def test_top_kib_memory_and_python3():
    frames = list(parse_top_batch(KIB_TOP.splitlines()))
    assert [f.clock for f in frames] == [time(23, 59, 58), time(0, 0, 1)]
    first, second = frames
    assert first.cpu_percent == 15.0
    assert second.cpu_percent == 0.0, "'ni,100.0 id' has no space after the comma"
    assert first.mem_total_mb == pytest.approx(16318488 * 1024 / 1e6)
    assert first.mem_used_mb == pytest.approx(4000000 * 1024 / 1e6)
    assert first.swap_used_mb == pytest.approx(97148 * 1024 / 1e6)
    assert first.processes[0].rss_bytes == 2048000 * 1024, "RES without a suffix is KiB"
    assert second.processes[0].rss_bytes == pytest.approx(1.9 * GIB)
    metrics = top_metrics(first)
    assert metrics["system/process_cpu_utilization_percentage"] == 175.0, "python3 and python3.11 are python; pythonista is not"
    assert metrics["system/process_memory_rss_megabytes"] == pytest.approx((2048000 + 512000) * 1024 / 1e6)
    assert metrics["system/system_memory_usage_percentage"] == pytest.approx(100 * 4000000 / 16318488)
    assert top_metrics(first, "python3.11")["system/process_cpu_utilization_percentage"] == 25.0


def test_top_gib_memory_per_cpu_lines_and_full_command_lines():
    text = """\
top - 10:00:00 up 1 day,  1:00,  0 users,  load average: 2.00, 2.00, 2.00
Tasks:   3 total,   1 running,   2 sleeping,   0 stopped,   0 zombie
%Cpu0  : 90.0 us, 10.0 sy,  0.0 ni,  0.0 id,  0.0 wa,  0.0 hi,  0.0 si,  0.0 st
%Cpu1  :  0.0 us,  0.0 sy,  0.0 ni,100.0 id,  0.0 wa,  0.0 hi,  0.0 si,  0.0 st
%Cpu2  : 50.0 us,  0.0 sy,  0.0 ni, 50.0 id,  0.0 wa,  0.0 hi,  0.0 si,  0.0 st   %Cpu3  : 10.0 us,  0.0 sy,  0.0 ni, 90.0 id,  0.0 wa,  0.0 hi,  0.0 si,  0.0 st
GiB Mem :     62.5 total,     40.0 free,     12.5 used,     10.0 buff/cache
GiB Swap:      8.0 total,      8.0 free,      0.0 used.     49.0 avail Mem

    PID USER      PR  NI    VIRT    RES    SHR S  %CPU  %MEM     TIME+ COMMAND
    777 bob       20   0   20.0g   3.5g 100000 R 120.0   5.6   9:00.00 /usr/bin/python3 train.py --batch-size 256
    778 bob       20   0   10.0g 524288  10000 S  10.0   0.8   0:10.00 bash -c python3 train.py
"""
    (frame,) = parse_top_batch(text.splitlines())
    assert frame.cpu_percent == pytest.approx((100 + 0 + 50 + 10) / 4), "mean over the CPUs, not the last CPU's line"
    assert frame.mem_used_mb == pytest.approx(12.5 * GIB / 1e6)
    assert frame.mem_total_mb == pytest.approx(62.5 * GIB / 1e6)
    assert frame.processes[0].command == "/usr/bin/python3 train.py --batch-size 256"
    assert frame.processes[1].rss_bytes == 524288 * 1024
    metrics = top_metrics(frame)
    assert metrics["system/process_cpu_utilization_percentage"] == 120.0, "bash -c python3 ... is bash"
    assert metrics["system/process_memory_rss_megabytes"] == pytest.approx(3.5 * GIB / 1e6)


def test_top_summary_line_wins_over_per_cpu_lines():
    text = [
        "top - 10:00:00 up 1 day",
        "%Cpu(s): 20.0 us,  0.0 sy,  0.0 ni, 80.0 id,  0.0 wa",
        "%Cpu0  : 40.0 us,  0.0 sy,  0.0 ni, 60.0 id,  0.0 wa",
        "%Cpu1  :  0.0 us,  0.0 sy,  0.0 ni,100.0 id,  0.0 wa",
    ]
    (frame,) = parse_top_batch(text)
    assert frame.cpu_percent == 20.0


def test_top_skips_text_before_the_first_frame_and_bad_rows():
    text = [
        "some banner",
        "  PID USER PR NI VIRT RES SHR S %CPU %MEM TIME+ COMMAND",
        "    1 root 20 0 1 1 1 S 50.0 0.0 0:00.00 python",
        "top - 01:02:03 up 1 day",
        "  PID USER PR NI VIRT RES SHR S %CPU %MEM TIME+ COMMAND",
        "  abc root 20 0 1 1 1 S 50.0 0.0 0:00.00 python",
        "    2 root 20 0 1 2m 1 S 7.5 0.0 0:00.00 python",
        "    3 root 20 0 1",
    ]
    (frame,) = parse_top_batch(text)
    assert frame.clock == time(1, 2, 3)
    assert [(p.pid, p.cpu_percent, p.rss_bytes) for p in frame.processes] == [(2, 7.5, 2 * 1024 * 1024)]
    assert frame.cpu_percent is None and frame.mem_used_mb is None
    assert top_metrics(frame) == {"system/process_cpu_utilization_percentage": 7.5, "system/process_memory_rss_megabytes": 2 * 1024 * 1024 / 1e6}


@pytest.mark.parametrize(
    ("command", "process", "expected"),
    [
        ("python", "python", True),
        ("python3", "python", True),
        ("python3.11", "python", True),
        ("/opt/conda/bin/python3.10 -m torch.distributed.run", "python", True),
        ("pythonw", "python", False),
        ("ipython", "python", False),
        ("torchrun", "python", False),
        ("torchrun", "torchrun", True),
        ("", "python", False),
    ],
)
def test_is_process(command, process, expected):
    assert is_process(command, process) is expected


# --------------------------------------------------------------------------- format detection


@pytest.mark.parametrize(
    ("name", "fmt"),
    [*((n, "dcgmi") for n in DMON_FILES), *((n, "nvidia-smi") for n in SMI_FILES), (TOP_FILE, "top"), (STDOUT_FILE, None), ("README.md", None)],
)
def test_detect_format_of_every_fixture(fixtures_dir, name, fmt):
    with open(fixtures_dir / name) as f:
        head = f.read(4096)  # what `radt import` reads
    assert detect_format(head) == fmt


@pytest.mark.parametrize(
    ("head", "fmt"),
    [
        ("", None),
        ("\n\n   \n", None),
        ("\n#Entity   SMACT\nID\n", "dcgmi"),
        ("GPU 0     0.5     0.25\n", "dcgmi"),  # dmon started without its header in the file
        ("GPU-I 1   0.5\n", "dcgmi"),
        ("top - 00:00:01 up 10 days\n", "top"),
        ("temperature.gpu, power.draw [W], clocks.sm [MHz]\n45, 300.1 W, 1410 MHz\n", "nvidia-smi"),
        ("index, name, utilization.gpu [%]\n", "nvidia-smi"),
        ("timestamp, utilization.gpu [%]\n", "nvidia-smi"),
        ("Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params\n", None),  # a radT experiment CSV
        ("NVIDIA A100-SXM4-40GB, 0 %, 0 %, 40960 MiB, 0 MiB\n", None),  # noheader CSV: columns unknown
        ("Train Epoch: 1 [0/60000 (0%)]\tLoss: 2.299824\n", None),
        ("epoch,loss,accuracy\n1,0.5,0.9\n", None),
    ],
)
def test_detect_format_hand_written(head, fmt):
    assert detect_format(head) == fmt
