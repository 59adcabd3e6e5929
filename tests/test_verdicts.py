"""A job's efficiency verdict: numbers over its own GPUs only, and the flags a person acts on, each with its numbers."""

from __future__ import annotations

import pytest

from radt.collectors.verdicts import judge

T0 = 1_795_700_000_000


def series(values: list[float]) -> list[tuple[int, float]]:
    return [(T0 + i * 1000, v) for i, v in enumerate(values)]


def test_an_idle_gpu_low_activity_small_memory_and_energy_are_said_with_their_numbers():
    got = judge(
        {
            "system/gpu_0_sm_active": series([0.05] * 8 + [0.5, 0.5]),
            "system/gpu_1_sm_active": series([0.0] * 10),
            "system/gpu_2_sm_active": series([0.9] * 10),  # another job's GPU: not this job's
            "system/gpu_0_memory_usage_megabytes": series([5500.0] * 10),
            "system/gpu_1_memory_usage_megabytes": series([600.0] * 10),
            "system/gpu_0_power_usage_watts": series([100.0] * 10),
            "system/gpu_1_power_usage_watts": series([60.0] * 10),
        },
        [0, 1],
    )
    n = got.numbers
    assert n["smact_mean"] == pytest.approx((0.05 * 8 + 1.0) / 20) and n["smact_p95"] == 0.5
    assert n["gpu_1_idle_share"] == 1.0 and n["gpu_0_idle_share"] == 0.0 and n["gpus_unused"] == 1
    assert n["smact_low_share"] == pytest.approx(0.8)  # the GPUs' mean at each time: 0.025 eight times, 0.25 twice
    assert n["memory_peak_gb"] == pytest.approx(5.5) and n["energy_kj"] == pytest.approx((100 + 60) * 9 / 1000)
    assert got.flags == [
        "1 of 2 GPUs idle (GPU 1: SMACT never reached 0.01)",
        "SMACT < 0.1 for 80% of the time (mean 0.070, p95 0.500)",
        "peak memory 5.5 GB per GPU: fits a 1g.10gb MIG slice",
    ]
    assert got.tags()["radt.verdict.flags"].startswith("1 of 2 GPUs idle") and got.tags()["radt.verdict.gpus_unused"] == "1"


def test_a_busy_job_has_no_flag_and_no_series_is_said():
    busy = judge({"system/gpu_3_sm_active": series([0.7, 0.8, 0.9]), "system/gpu_3_memory_usage_megabytes": series([70_000.0] * 3)}, [3])
    assert busy.flags == [] and busy.tags()["radt.verdict.flags"] == "none" and busy.numbers["smact_mean"] == pytest.approx(0.8)
    empty = judge({"system/gpu_0_sm_active": series([0.5])}, [1])  # only another GPU's series
    assert empty.flags == ["no SM activity series for the job's GPUs: no verdict on its use"] and "smact_mean" not in empty.numbers
