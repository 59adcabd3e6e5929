"""A job's efficiency verdict: numbers over its own GPUs only, and the flags a person acts on, each with its numbers."""

from __future__ import annotations

import pytest

from radt.collectors.cluster.verdicts import Judged, Verdict, judge, share_partners

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
        memory_total_mib=81_559,  # an H100 80GB HBM3, as its driver reports it
        model="NVIDIA H100 80GB HBM3",
    )
    n = got.numbers
    assert n["smact_mean"] == pytest.approx((0.05 * 8 + 1.0) / 20) and n["smact_p95"] == 0.5
    assert n["gpu_1_idle_share"] == 1.0 and n["gpu_0_idle_share"] == 0.0 and n["gpus_unused"] == 1
    assert n["smact_low_share"] == pytest.approx(0.8)  # the GPUs' mean at each time: 0.025 eight times, 0.25 twice
    assert n["memory_peak_gb"] == pytest.approx(5.5) and n["energy_kj"] == pytest.approx((100 + 60) * 9 / 1000)
    assert got.flags == [
        "1 of 2 GPUs idle (GPU 1: SMACT never reached 0.01)",
        "SMACT < 0.1 for 80% of the time (mean 0.070, p95 0.500)",
        "peak memory 5.5 GB of 80 GB per GPU: fits a 1g.10gb MIG slice",
    ]
    assert got.tags()["radt.verdict.flags"].startswith("1 of 2 GPUs idle") and got.tags()["radt.verdict.gpus_unused"] == "1"


def test_a_busy_job_has_no_flag_and_no_series_is_said():
    busy = judge({"system/gpu_3_sm_active": series([0.7, 0.8, 0.9]), "system/gpu_3_memory_usage_megabytes": series([70_000.0] * 3)}, [3])
    assert busy.flags == [] and busy.tags()["radt.verdict.flags"] == "none" and busy.numbers["smact_mean"] == pytest.approx(0.8)
    empty = judge({"system/gpu_0_sm_active": series([0.5])}, [1])  # only another GPU's series
    assert empty.flags == ["no SM activity series for the job's GPUs: no verdict on its use"] and "smact_mean" not in empty.numbers


def test_a_two_node_jobs_idle_gpus_are_named_as_the_dashboard_names_them():
    """'GPU gpu01 1' read as a GPU named gpu01; the dashboard's legend and tooltips say 'gpu01 · GPU 1'."""
    got = judge(
        {
            "system/gpu01/gpu_0_sm_active": series([0.6] * 4),
            "system/gpu01/gpu_1_sm_active": series([0.0] * 4),
            "system/gpu02/gpu_0_sm_active": series([0.0] * 4),
            "system/gpu02/gpu_1_sm_active": series([0.7] * 4),
        },
        [("gpu01", 0), ("gpu01", 1), ("gpu02", 0), ("gpu02", 1)],
    )
    assert got.flags[0] == "2 of 4 GPUs idle (gpu01 · GPU 1, gpu02 · GPU 0: SMACT never reached 0.01)"
    assert got.numbers["gpu01/gpu_1_idle_share"] == 1.0 and got.numbers["gpus_unused"] == 2


@pytest.mark.parametrize(
    ("peak_mb", "total_mib", "model", "size", "flag"),
    [
        (5500, 40_536, "NVIDIA A100-SXM4-40GB", 40, "peak memory 5.5 GB of 40 GB per GPU: fits a 2g.10gb MIG slice"),  # 1g.5gb holds 4,864 MiB
        (4000, 40_536, "NVIDIA A100-SXM4-40GB", 40, "peak memory 4.0 GB of 40 GB per GPU: fits a 1g.5gb MIG slice"),
        (20_000, 143_771, "NVIDIA H200", 141, "peak memory 20.0 GB of 141 GB per GPU: fits a 2g.35gb MIG slice"),
        (50_000, 81_559, "NVIDIA H100 80GB HBM3", 80, None),  # past 3g.40gb: no smaller slice holds it
        (3000, 24_564, "NVIDIA GeForce RTX 4090", 24, "peak memory 3.0 GB of 24 GB per GPU (12%)"),  # A30's size, but no MIG
        (3000, 23_034, "NVIDIA L4", 22, "peak memory 3.0 GB of 22 GB per GPU (12%)"),
        (12_000, 23_034, "NVIDIA L4", 22, None),  # half the GPU: nothing to say
        (5500, None, "", None, None),  # the GPU's size unknown: no slice named
    ],
)
def test_the_memory_flag_names_a_slice_of_the_gpu_the_job_had(peak_mb, total_mib, model, size, flag):
    got = judge({"system/gpu_0_sm_active": series([0.7] * 3), "system/gpu_0_memory_usage_megabytes": series([peak_mb] * 3)}, [0], total_mib, model)
    assert [f for f in got.flags if f.startswith("peak memory")] == ([flag] if flag else [])
    assert got.numbers["memory_peak_gb"] == pytest.approx(peak_mb / 1000) and got.numbers.get("memory_total_gb") == size


def _judged(job_id: str, smact: float, p95: float, memory: float, total: float = 80, gpus: int = 1) -> Judged:
    numbers = {"gpus": gpus, "smact_mean": smact, "smact_p95": p95, "memory_peak_gb": memory, "memory_total_gb": total}
    return Judged(job_id, f"train-{job_id}", "alice", numbers)


def test_a_light_job_is_paired_with_the_busiest_job_that_fits_beside_it_on_one_gpu():
    jobs = [
        _judged("1", 0.20, 0.30, 6.0),
        _judged("2", 0.40, 0.60, 30.0),  # fits beside 1: 0.30 + 0.60 <= 1, 6 + 30 <= 72 GB
        _judged("3", 0.65, 0.75, 10.0),  # busier, but 0.30 + 0.75 > 1
        _judged("4", 0.30, 0.35, 70.0),  # 6 + 70 GB > 90 % of 80 GB
        _judged("5", 0.10, 0.20, 5.0, total=40),  # another GPU size
        _judged("6", 0.05, 0.10, 2.0, gpus=2),  # two GPUs: not paired
    ]
    found = share_partners(jobs)
    assert found["1"][0].job_id == "2"
    assert found["1"][1] == "could share a GPU under MPS with a job like 2 (train-2, alice): SMACT p95 0.30 + 0.60, memory 6.0 + 30.0 GB of 80 GB"
    assert found["2"][0].job_id == "1", "the pairing goes both ways"
    assert "3" not in found, "SMACT mean 0.65: busy enough alone"
    assert "4" not in found and "5" not in found and "6" not in found, found


def test_the_import_writes_the_sharing_flag_into_both_jobs_verdicts(store_uri):
    from radt.collectors.cluster import slurmimport
    from radt.collectors.slurm import slurmacct
    from radt.collectors.store.tracking import connect

    lines = "".join(
        f"{job}|{job}|train-{job}|alice|proj|gpu|2026-11-20T10:00:00|2026-11-20T10:00:05|2026-11-20T11:00:05|COMPLETED|0:0|gpu01|"
        f"billing=1,cpu=8,gres/gpu=1,node=1|radt-gres=gpu01>gpu:1(IDX:{job % 4})\n"
        for job in (101, 102)
    )
    client = connect(store_uri)
    importer = slurmimport.JobImporter(client, store_uri)
    runs = {}
    for job, (smact, p95, memory) in zip(slurmacct.parse_sacct(lines), ((0.2, 0.3, 6.0), (0.4, 0.6, 30.0)), strict=True):
        runs[job.job_id] = importer.job(job).run_id  # the facts (no Prometheus here); the verdict as judge() would give it
        verdict = Verdict(["none of the others"], {"gpus": 1, "smact_mean": smact, "smact_p95": p95, "memory_peak_gb": memory, "memory_total_gb": 80})
        importer.judged.append((runs[job.job_id], verdict, Judged(job.job_id, job.name, job.user, verdict.numbers)))
    assert importer.share() == 2
    tags = client.get_run(runs["101"]).data.tags
    assert tags["radt.verdict.mps_partner"] == "102"
    assert tags["radt.verdict.flags"] == "none of the others; could share a GPU under MPS with a job like 102 (train-102, alice): " + (
        "SMACT p95 0.30 + 0.60, memory 6.0 + 30.0 GB of 80 GB"
    )
    assert client.get_run(runs["102"]).data.tags["radt.verdict.mps_partner"] == "101"


def test_jobs_without_a_verdict_come_after_the_judged_ones_newest_first(store_uri):
    """A new user's first import without Prometheus: no verdicts; the list is by start, newest first (9 started after 10)."""
    import sqlalchemy as sa

    from radt.app.db.jobs import job_rows
    from radt.collectors.cluster import slurmimport
    from radt.collectors.slurm import slurmacct
    from radt.collectors.store.tracking import connect

    lines = "".join(
        f"{job}|{job}|train|alice|proj|gpu|2026-11-20T{hour}:00:00|2026-11-20T{hour}:00:05|2026-11-20T{hour}:30:05|COMPLETED|0:0|n1|"
        f"billing=1,gres/gpu=1,node=1|radt-gres=n1>gpu:1(IDX:0)\n"
        for job, hour in ((9, "12"), (10, "11"), (11, "09"))
    )
    client = connect(store_uri)
    importer = slurmimport.JobImporter(client, store_uri)
    runs = {job.job_id: importer.job(job).run_id for job in slurmacct.parse_sacct(lines)}
    client.set_tag(runs["11"], "radt.verdict.smact_mean", "0.5")  # the oldest, but judged: first
    assert [row["job"] for row in job_rows(sa.create_engine(store_uri))] == ["11", "9", "10"]
