"""jobstats' exporters' labels and units as radt names them, without a Prometheus (the inner loop's share of
test_jobstats_cluster.py): the NVML exporter's GPU by `ordinal`, else `minor_number`, else its `uuid`; its series
before, during and after a job (`jobid`, `userid` come and go) one series; the cgroup exporter's CPU seconds as a rate,
its whole job's only; and which labels find a node where an exporter names it only by its scrape target."""

from __future__ import annotations

from radt.catalogue import EXPORTER_FAMILIES
from radt.collectors.sources.exporters import GPU_FAMILIES, exporter_word, node_labels
from radt.collectors.sources.promql import Series, Wanted, keyed_samples

GPU = {"__name__": "nvidia_gpu_power_usage_milliwatts", "ordinal": "1", "minor_number": "3", "uuid": "GPU-b", "name": "NVIDIA H100 80GB HBM3"}
GPU |= {"instance": "della-l02g8:9445", "job": "Jobstats GPU Nodes", "cluster": "della"}
CPU = {"__name__": "cgroup_cpu_total_seconds", "jobid": "77", "instance": "della-l02g8:9306", "job": "Jobstats GPU Nodes"}
DCGM, NVML, RADT, CGROUP = EXPORTER_FAMILIES


def test_the_nvml_exporters_gpu_is_its_ordinal_in_watts_and_one_series_across_a_job():
    before = Series(GPU, [(1000, 136074.0)])
    during = Series(GPU | {"jobid": "77", "userid": "331233"}, [(2000, 250500.0)])
    after = Series(GPU, [(3000, 61000.0)])
    got = keyed_samples([during, after, before], Wanted(gpus=[1], owners={"jobid": "77", "hpc_job": "77"}), conflicts := [])
    assert got == {"system/gpu_1_power_usage_watts": [(1000, 136.074), (2000, 250.5), (3000, 61.0)]} and conflicts == []
    other_job = Series(GPU | {"jobid": "78", "userid": "1"}, [(4000, 1.0)])
    assert keyed_samples([other_job], Wanted(gpus=[1], owners={"jobid": "77"})) == {}


def test_without_an_ordinal_the_minor_number_and_where_nvml_maps_it_the_uuid_name_the_gpu():
    old = {k: v for k, v in GPU.items() if k != "ordinal"}  # an exporter from before 2024
    assert list(keyed_samples([Series(old, [(1000, 1000.0)])], Wanted(gpus=[3]))) == ["system/gpu_3_power_usage_watts"]
    assert list(keyed_samples([Series(GPU, [(1000, 1000.0)])], Wanted(gpus=[5], uuids={"GPU-b": 5}))) == ["system/gpu_5_power_usage_watts"]
    gpm = Series(GPU | {"__name__": "nvidia_gpu_sm_util_percent"}, [(1000, 0.42)])  # NVML's percent / 100: a ratio already
    assert keyed_samples([gpm], Wanted(gpus=[1])) == {"system/gpu_1_sm_active": [(1000, 0.42)]}


def test_the_jobs_cpu_seconds_are_its_cpu_in_percent_of_one_core_and_only_the_whole_jobs():
    whole = Series(CPU, [(1000, 10.0), (3000, 13.0), (4000, 14.5), (5000, 0.5), (6000, 2.0)])  # a reset at 5000
    step = Series(CPU | {"step": "batch"}, [(1000, 1.0), (2000, 9.0)])
    rss = Series(CPU | {"__name__": "cgroup_memory_rss_bytes"}, [(1000, 3.5e9)])
    got = keyed_samples([whole, step, rss], Wanted(owners={"jobid": "77"}))
    assert got == {
        "system/process_cpu_utilization_percentage": [(3000, 150.0), (4000, 150.0), (6000, 150.0)],
        "system/process_memory_rss_megabytes": [(1000, 3500.0)],
    }
    assert keyed_samples([whole], Wanted(owners={"jobid": "78"})) == {} and keyed_samples([whole], Wanted()) == {}


def test_instance_is_tried_where_an_exporter_names_its_node_only_by_its_scrape_target():
    labels = ("Hostname", "hostname")
    assert node_labels(labels, [DCGM]) == labels
    assert node_labels(labels, [NVML]) == ("instance", *labels)  # nothing else could match
    assert node_labels(labels, [DCGM, NVML]) == (*labels, "instance")  # dcgm-exporter's series first
    assert node_labels(("instance",), [NVML]) == ("instance",)
    assert CGROUP not in GPU_FAMILIES and exporter_word(None) == "dcgm-exporter" and exporter_word([NVML.name]) == "nvidia_gpu_prometheus_exporter"
    assert exporter_word([]).startswith("GPU exporter (Prometheus holds no DCGM_FI_DEV_GPU_UTIL, nvidia_gpu_duty_cycle")
