"""A device's series change their labels as jobs come and go on it (dcgm-exporter's hpc_job, a prolog's jobid, a pod):
radt joins them into the device's one series, and never takes another job's."""

from __future__ import annotations

from radt.collectors.sources.promql import Series, Wanted, keyed_samples

BASE = {"__name__": "DCGM_FI_PROF_SM_ACTIVE", "gpu": "1", "UUID": "GPU-1", "Hostname": "node-1", "instance": "node-1:9400", "job": "dcgm"}


def test_a_gpus_series_before_during_and_after_a_job_are_one():
    before = Series(BASE, [(1000, 0.0), (2000, 0.0)])
    during = Series(BASE | {"hpc_job": "77"}, [(3000, 0.5), (4000, 0.7)])
    after = Series(BASE, [(5000, 0.0)])
    got = keyed_samples([during, before, after], Wanted(gpus=[1], owners={"hpc_job": "77", "jobid": "77"}), conflicts := [])
    assert got == {"system/gpu_1_sm_active": [(1000, 0.0), (2000, 0.0), (3000, 0.5), (4000, 0.7), (5000, 0.0)]}
    assert conflicts == []


def test_another_jobs_time_on_the_gpu_is_not_the_runs():
    mine = Series(BASE | {"hpc_job": "77"}, [(3000, 0.5)])
    theirs = Series(BASE | {"hpc_job": "78"}, [(9000, 0.9)])
    got = keyed_samples([theirs, mine], Wanted(gpus=[1], owners={"hpc_job": "77", "jobid": "77"}))
    assert got == {"system/gpu_1_sm_active": [(3000, 0.5)]}


def test_two_nodes_behind_one_label_are_still_a_clash():
    one = Series(BASE, [(1000, 0.1)])
    other = Series(BASE | {"Hostname": "node-2", "UUID": "GPU-2"}, [(1000, 0.9)])
    conflicts: list[str] = []
    got = keyed_samples([one, other], Wanted(gpus=[1]), conflicts)
    assert got == {"system/gpu_1_sm_active": [(1000, 0.1)]} and len(conflicts) == 1, conflicts
