"""A cluster set up as Princeton's jobstats sets one up: its NVML exporter (`nvidia_gpu_*`, labelled `ordinal`,
`minor_number`, `uuid`, `jobid`) and its cgroup exporter (`cgroup_*` per Slurm job), scraped by a real Prometheus that
names each target node:port (tests/support/jobstats_exporter.py). Issue #56 item 1: on these names radt read nothing (0
points on 3 of 3 jobs, exit 0, a gap tag, no verdict) and said "no exporter series is labelled with the job (jobid,
hpc_job)" while `nvidia_gpu_*{jobid=...}` series were there. The prometheus listener, `radt import --prometheus` and
`radt import --slurm` now hold the run's (the job's) own GPUs' values, point for point what Prometheus holds."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import NamedTuple

import pytest
from mlflow.tracking import MlflowClient

from radt.cli import main as radt_main
from radt.collectors.run.sampler import Sampler
from radt.collectors.slurm import slurmacct as acct
from radt.collectors.sources.base import SamplingContext
from radt.collectors.sources.prometheus import PrometheusSource, final_backfill
from radt.diagnosis import nominal_gb
from radt.runmodel import DIAGNOSIS_VERSION_TAG, GPU_MEMORY_TAG, GPU_MODEL_TAG, NO_SERIES_TAG, PROMETHEUS_GAP_TAG
from tests.support import prometheus as prom
from tests.support import slurmacct
from tests.support.jobstats_exporter import CGROUP_PORT, GPU_PORT, MODEL, Gpu, scraped
from tests.support.polling import wait_for

LOG = Path(__file__).parent / "fixtures" / "real-tool-logs" / "mnist_dcgmi_dmon_18fields.txt"
NODE = "della-l02g8"  # a node the Slurm tests do not use: jobstats' documentation's node
OTHER = "della-l02g9"
HOST = slurmacct.host()  # the accounting cluster's one node
# NODE's GPU 2 is an A100 (no GPM series); HOST's GPUs serve the log's GPUs 0, 1, 2, 4 (its GPU 3 reads no power)
GPUS = [Gpu(NODE, 0, 0), Gpu(NODE, 1, 1), Gpu(NODE, 2, 2, gpm=False), Gpu(OTHER, 0, 4)]
GPUS += [Gpu(HOST, g, source) for g, source in enumerate((0, 1, 2, 4))]
# the exporter's name -> (the catalogue key's suffix, what to divide its value by), from the exporter's own units (main.go)
UNITS = {
    "nvidia_gpu_duty_cycle": ("utilization_percentage", 1.0),  # NVML's utilization rate, %: nvidia-smi's, not SMACT
    "nvidia_gpu_memory_used_bytes": ("memory_usage_megabytes", 1e6),  # MB: 10^6 bytes
    "nvidia_gpu_power_usage_milliwatts": ("power_usage_watts", 1e3),
    "nvidia_gpu_temperature_celsius": ("temperature_celsius", 1.0),
    "nvidia_gpu_graphics_util_percent": ("gr_engine_active", 1.0),  # GPM: NVML's percent / 100, a 0-1 ratio
    "nvidia_gpu_sm_util_percent": ("sm_active", 1.0),
    "nvidia_gpu_sm_occupancy_percent": ("sm_occupancy", 1.0),
    "nvidia_gpu_any_tensor_util_percent": ("tensor_active", 1.0),
    "nvidia_gpu_dram_bw_util_percent": ("dram_active", 1.0),
    "nvidia_gpu_fp64_util_percent": ("fp64_active", 1.0),
    "nvidia_gpu_fp32_util_percent": ("fp32_active", 1.0),
    "nvidia_gpu_fp16_util_percent": ("fp16_active", 1.0),
    "nvidia_gpu_pcie_tx_per_sec": ("pcie_tx_bytes_per_second", 1.0),
    "nvidia_gpu_pcie_rx_per_sec": ("pcie_rx_bytes_per_second", 1.0),
    "nvidia_gpu_nvlink_total_tx_per_sec": ("nvlink_tx_bytes_per_second", 1.0),
    "nvidia_gpu_nvlink_total_rx_per_sec": ("nvlink_rx_bytes_per_second", 1.0),
}


@pytest.fixture(scope="module")
def served():
    """(exporters, Prometheus, the time before the first scrape in ms) once every node's exporter has 3 scrapes stored."""
    assert prom.available(), "Debian's prometheus is not installed (apt-get install prometheus; .ci/run installs it)"
    start_ms = int(time.time() * 1000)
    with scraped(LOG, GPUS) as (exporters, server):
        yield exporters, server, start_ms


@pytest.fixture(scope="module")
def cluster(monkeypatch_module):
    env = slurmacct.cluster()
    monkeypatch_module.setenv("SLURM_CONF", env["SLURM_CONF"])
    return env


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def held(server: prom.Prometheus, node: str, gpu: int, start_ms: int, end_ms: int, job: str = "", under: str = "") -> dict[str, dict[int, float]]:
    """{key: {timestamp: value}}: what Prometheus itself holds for GPU `gpu` (NVML's index, `ordinal`) of `node` in
    [start_ms, end_ms], unlabelled or labelled with `job`, in the catalogue's units (under node `under`'s keys)."""
    span = end_ms - start_ms + 1
    promql = f'{{__name__=~"{"|".join(UNITS)}",instance="{node}:{GPU_PORT}",ordinal="{gpu}",GPU_I_ID="",jobid=~"|{job}"}}[{span}ms]'
    out: dict[str, dict[int, float]] = {}
    for series in server.api("/api/v1/query", query=promql, time=f"{end_ms / 1000:.3f}")["result"]:
        suffix, divisor = UNITS[series["metric"]["__name__"]]
        got = out.setdefault(f"system/{under + '/' if under else ''}gpu_{gpu}_{suffix}", {})
        got.update({round(float(t) * 1000): float(v) / divisor for t, v in series["values"] if start_ms <= round(float(t) * 1000) <= end_ms})
    return {k: v for k, v in out.items() if v}


def cgroup_held(server: prom.Prometheus, node: str, job: str, start_ms: int, end_ms: int) -> dict[str, dict[int, float]]:
    """The job's CPU (% of one core: the rise of its CPU seconds between two scrapes, per second) and RSS (MB) as
    Prometheus holds its cgroup's series (the whole job's: step="", task="") in [start_ms, end_ms]."""
    out: dict[str, dict[int, float]] = {}
    for name in ("cgroup_cpu_total_seconds", "cgroup_memory_rss_bytes"):
        promql = f'{name}{{instance="{node}:{CGROUP_PORT}",jobid="{job}",step="",task=""}}[{end_ms - start_ms + 1}ms]'
        (series,) = server.api("/api/v1/query", query=promql, time=f"{end_ms / 1000:.3f}")["result"]
        samples = [(round(float(t) * 1000), float(v)) for t, v in series["values"]]
        if name == "cgroup_memory_rss_bytes":
            out["system/process_memory_rss_megabytes"] = {t: v / 1e6 for t, v in samples}
        else:
            out["system/process_cpu_utilization_percentage"] = {
                t: (v - u) / ((t - s) / 1000) * 100 for (s, u), (t, v) in zip(samples, samples[1:], strict=False)
            }
    return out


def in_run(client: MlflowClient, run_id: str) -> dict[str, dict[int, float]]:
    """{key: {timestamp: value}} of the run's system series; a key logged twice at one time fails."""
    out: dict[str, dict[int, float]] = {}
    for where in client.get_run(run_id).data.metrics:
        history = client.get_metric_history(run_id, where)
        assert len({m.timestamp for m in history}) == len(history), where
        out[where] = {m.timestamp: m.value for m in history}
    return out


def radt_import(capsys, *args: str) -> tuple[int, str]:
    code = radt_main(["import", *args])
    return code, capsys.readouterr().err


def test_import_fills_a_run_from_the_nvml_exporter_in_the_catalogues_units(served, store_uri, capsys):
    """`radt import --prometheus URL --run R --host NODE --gpus 0+2`: NODE's GPUs 0 and 2 (by `ordinal`, the node by its
    scrape target NODE:9445), their duty cycle as GPU utilization, W, MB and GPM's ratios; another GPU or node: absent."""
    _exporters, server, start_ms = served
    client = MlflowClient(tracking_uri=store_uri)
    run_id = client.create_run(client.create_experiment("jobstats"), start_time=start_ms).info.run_id  # plain MLflow
    end_ms = int(time.time() * 1000)
    client.set_terminated(run_id, "FINISHED", end_time=end_ms)
    code, err = radt_import(capsys, "--prometheus", server.url, "--run", run_id, "--store", store_uri, "--host", NODE, "--gpus", "0+2")
    assert code == 0, err
    want = held(server, NODE, 0, start_ms, end_ms) | held(server, NODE, 2, start_ms, end_ms)
    assert "system/gpu_0_sm_active" in want and "system/gpu_2_sm_active" not in want  # GPU 2 has no GPM
    assert {k for k in want if k.startswith("system/gpu_2_")} == {
        f"system/gpu_2_{s}" for s in ("utilization_percentage", "memory_usage_megabytes", "power_usage_watts", "temperature_celsius")
    }
    assert in_run(client, run_id) == want, "point for point what Prometheus holds for NODE's GPUs 0 and 2"
    assert all(50 < v < 700 for v in want["system/gpu_0_power_usage_watts"].values())  # watts, not milliwatts
    tags = client.get_run(run_id).data.tags
    assert PROMETHEUS_GAP_TAG not in tags and "0 new points" not in err, (tags, err)


def test_the_listener_reads_each_scrape_of_the_runs_gpus_once(served):
    """The prometheus listener on NODE (found by its scrape target, `instance` NODE:9445, with no option): every scrape of
    the run's GPUs 0 and 1 between its start and end, live and at its end, once each; GPU 2 and OTHER's GPU 0 never."""
    _exporters, server, _ = served
    lines: list[str] = []
    source = PrometheusSource(server.url, host=NODE, report=lines.append, uuids={})
    source.open(SamplingContext(interval=0.5, devices=[0, 1]))
    points: list = []
    sampler = Sampler([source], 0.25, points.extend, report=lines.append)
    live = lambda: len([p for p in points if p.key == "system/gpu_1_sm_active"])  # noqa: E731
    wait_for(lambda: sampler.tick() or live() >= 3, timeout=20, what="three live scrapes of GPU 1's SM activity")
    end_ms = int(time.time() * 1000)
    points += final_backfill(source, source.since_ms, end_ms)
    got: dict[str, dict[int, float]] = {}
    for point in points:
        assert point.timestamp not in got.get(point.key, {}), point  # none twice
        got.setdefault(point.key, {})[point.timestamp] = point.value
    want = held(server, NODE, 0, source.since_ms, end_ms) | held(server, NODE, 1, source.since_ms, end_ms)
    assert got == want and want, "each scrape of the run's GPUs, at its own time"
    assert lines == [], lines
    facts = source.describe()
    assert "nvidia_gpu_sm_util_percent" in facts["read"] and facts["errors"] == [], facts


def test_a_node_without_series_is_one_line_naming_the_exporter_and_every_label_tried(served, store_uri, capsys):
    """A node Prometheus holds no series of: the line says which exporter it looked for (the one the cluster runs, asked of
    Prometheus) and every label tried, `instance` among them."""
    _exporters, server, start_ms = served
    client = MlflowClient(tracking_uri=store_uri)
    run_id = client.create_run(client.create_experiment("elsewhere"), start_time=start_ms).info.run_id
    client.set_terminated(run_id, "FINISHED", end_time=int(time.time() * 1000))
    code, err = radt_import(capsys, "--prometheus", server.url, "--run", run_id, "--store", store_uri, "--host", "della-x99", "--gpus", "0")
    line = err.splitlines()[0]
    assert code == 0 and line.startswith("radt import: no nvidia_gpu_prometheus_exporter series for GPU 0 "), err
    assert line.endswith(f"of Hostname=della-x99 or hostname=della-x99 or instance=della-x99 at {server.url} over the run"), err


# --- radt import --slurm: the accounting cluster's jobs, their GPUs labelled by the exporter as jobstats' prolog has it ---


def _scraped_after(server: prom.Prometheus, node: str, gpu: int, ms: int) -> None:
    """Wait until Prometheus stored a scrape of the GPU later than `ms` (a job's last second is then in)."""
    promql = f'nvidia_gpu_duty_cycle{{instance="{node}:{GPU_PORT}",ordinal="{gpu}"}}[30s]'
    wait_for(lambda: any(float(t) * 1000 > ms for r in server.api("/api/v1/query", query=promql)["result"] for t, _v in r["values"]), timeout=30)


class Ran(NamedTuple):
    job: str  # as sacct names it: 1234, or an array's task 1234_0
    raw: str  # SLURM_JOB_ID, which jobstats' prolog gives the exporters: an array task's own id
    gpus: tuple[int, ...]


def _run_job(exporters, gres: str, name: str, admin_comment: bool = True, array: bool = False) -> Ran:
    """Submit a job (an array's one task) and, as jobstats' prolog does, have the exporter label its GPUs with it (and its
    cgroup published) while it runs. `admin_comment` False: radt's prolog's record of its GPUs removed, as on a cluster
    without radt's prolog."""
    job = slurmacct.submit(*(["--array=0"] if array else []), f"--gres=gpu:{gres}", "-J", name, "--wrap", "sleep 4")
    job = f"{job}_0" if array else job
    detail = slurmacct.running(job)
    raw = re.search(r"(?:^| )JobId=(\d+)", detail).group(1)
    mine = acct._indices(detail)
    exporters.start_job(HOST, mine, raw)
    if not admin_comment:
        slurmacct.scontrol("update", f"JobId={raw}", "AdminComment=")
    return Ran(job, raw, mine)


def _ended(server, exporters, ran: list[Ran]) -> dict[str, acct.Job]:
    """Wait for the jobs' ends in sacct and a scrape after each; the exporter's labels and cgroups gone; their facts."""
    try:
        for one in ran:
            slurmacct.accounted(one.job, ("COMPLETED",))
        facts = {j.job_id: j for j in acct.sacct([one.job for one in ran])}
        for one in ran:
            _scraped_after(server, HOST, one.gpus[0], facts[one.job].end_ms)
    finally:
        for one in ran:
            exporters.end_job(one.raw)
    return facts


def runs_of(client: MlflowClient, user: str) -> dict[str, object]:
    experiment = client.get_experiment_by_name(f"slurm-{user}")
    return {r.data.tags["radt.slurm.job_id"]: r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("radt.role") == "run"}


def test_slurm_jobs_hold_their_own_gpus_series_from_the_nvml_exporter(cluster, served, store_uri, capsys):
    """The issue's case: jobs whose GPUs radt's prolog recorded, on a node whose exporter is jobstats'. Each run holds its
    own GPUs' series point for point (it had 0 points, a gap tag and no verdict), its job's CPU and memory from the cgroup
    exporter, its GPUs' size from nvidia_gpu_memory_total_bytes, and a diagnosis."""
    exporters, server, _ = served
    ran = [_run_job(exporters, "2", "jobstats-two"), _run_job(exporters, "1", "jobstats-sweep", array=True)]
    assert ran[1].raw != ran[1].job, "an array task: the exporters label it with its own id, sacct names it <array>_<task>"
    facts = _ended(server, exporters, ran)
    code, err = radt_import(capsys, "--slurm", ",".join(one.job for one in ran), "--prometheus", server.url, "--store", store_uri)
    assert code == 0, err
    client = MlflowClient(store_uri)
    runs = runs_of(client, "root")
    for job, raw, mine in ran:
        fact, run = facts[job], runs[job]
        assert run.data.tags["radt.slurm.gpus_used"] == f"{HOST}:{','.join(map(str, mine))}", run.data.tags  # radt's prolog or the label said which
        want = {k: v for gpu in mine for k, v in held(server, HOST, gpu, fact.start_ms, fact.end_ms, job=raw).items()}
        got = in_run(client, run.info.run_id)
        gpu_keys = {k for k in got if k.startswith("system/gpu_")}
        assert {k: got[k] for k in gpu_keys} == want and f"system/gpu_{mine[0]}_sm_active" in want, "point for point, the job's GPUs only"
        assert {int(k.split("_")[1]) for k in gpu_keys} == set(mine)
        cpu = cgroup_held(server, HOST, raw, fact.start_ms, fact.end_ms)
        assert got["system/process_memory_rss_megabytes"] == cpu["system/process_memory_rss_megabytes"]
        assert got["system/process_cpu_utilization_percentage"] == pytest.approx(cpu["system/process_cpu_utilization_percentage"])
        rates = sorted(got["system/process_cpu_utilization_percentage"].values())
        assert rates and 110 < rates[len(rates) // 2] < 190, ("1.5 cores busy: 150 % of one core", rates)
        tags = client.get_run(run.info.run_id).data.tags
        assert PROMETHEUS_GAP_TAG not in tags and NO_SERIES_TAG not in tags, tags
        assert DIAGNOSIS_VERSION_TAG in tags, "the job has a verdict"
        assert tags[GPU_MODEL_TAG] == MODEL and nominal_gb(float(tags[GPU_MEMORY_TAG])) == 80, tags


def test_gpus_the_exporter_labels_with_the_job_are_its_own_where_accounting_has_none(cluster, served, store_uri, capsys):
    """No radt prolog: the GPUs whose nvidia_gpu_* series carry the job's `jobid` are the job's (radt said "no exporter
    series is labelled with the job (jobid, hpc_job)"); their samples from before the label came are joined."""
    exporters, server, _ = served
    job, _raw, mine = ran = _run_job(exporters, "2", "labelled by jobstats", admin_comment=False)
    fact = _ended(server, exporters, [ran])[job]
    assert not (fact.gpus or {}).get(HOST), "Slurm's accounting alone cannot say which GPUs the job had"
    code, err = radt_import(capsys, "--slurm", job, "--prometheus", server.url, "--store", store_uri)
    assert code == 0, err
    client = MlflowClient(store_uri)
    run = runs_of(client, "root")[job]
    tags = run.data.tags
    assert tags["radt.slurm.gpus_from"] == "exporter label jobid" and tags["radt.slurm.gpus_used"] == f"{HOST}:{','.join(map(str, mine))}", tags
    want = {k: v for gpu in mine for k, v in held(server, HOST, gpu, fact.start_ms, fact.end_ms, job=job).items()}
    got = in_run(client, run.info.run_id)
    assert {k: v for k, v in got.items() if k.startswith("system/gpu_")} == want and want, "point for point, across the label's coming"


def test_an_exporter_without_job_labels_is_said_with_what_was_looked_for_and_found(cluster, served, store_uri, capsys):
    """An exporter from before September 2025 (no `jobid` label) and no radt prolog: the run says which series radt looked
    for with which labels, and what it found on the node instead."""
    exporters, server, _ = served
    exporters.job_labels = False
    try:
        ran = _run_job(exporters, "1", "unlabelled", admin_comment=False)
        _ended(server, exporters, [ran])
    finally:
        exporters.job_labels = True
    code, err = radt_import(capsys, "--slurm", ran.job, "--prometheus", server.url, "--store", store_uri)
    assert code == 0, err
    reason = runs_of(MlflowClient(store_uri), "root")[ran.job].data.tags[NO_SERIES_TAG]
    # the job's first second (sacct's resolution) may hold the previous job's last scrape of its GPU: named as another job's
    said = re.match(r"no exporter series is labelled with the job: looked for (.*?); found (.*?) on (\S+), ", reason)
    assert said and said.group(1) == "DCGM_FI_DEV_GPU_UTIL{hpc_job|jobid}, nvidia_gpu_duty_cycle{jobid}", reason
    assert re.fullmatch(r"nvidia_gpu_duty_cycle without jobid( and labelled jobid=\d+(, jobid=\d+)*( \.\.\.)? \(other jobs\))?", said.group(2)), reason
    assert said.group(3) == HOST, reason
    assert reason in err


def test_a_job_on_two_nodes_gets_each_nodes_own_gpus_by_their_scrape_targets(served, store_uri):
    """A two-node job (an accounting line as sacct prints one): each node's GPUs from its own exporter (instance
    <node>:9445), under the node's keys; the other GPUs of both nodes absent."""
    from radt.collectors.cluster.slurmimport import JobImporter
    from radt.collectors.imports.importer import prometheus_main
    from radt.collectors.store.tracking import connect

    _exporters, server, start_ms = served
    now = math.floor(time.time()) - 1
    stamp = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))  # noqa: E731  (sacct prints local time)
    line = (
        f"301|301|two-nodes|root|root|debug|{stamp(now - 4)}|{stamp(now - 3)}|{stamp(now)}|COMPLETED|0:0|{NODE},{OTHER}|"
        f"billing=1,gres/gpu=3,node=2|radt-gres={NODE}>gpu:2(IDX:0,1);{OTHER}>gpu:1(IDX:0)\n"
    )
    (job,) = acct.parse_sacct(line)
    assert job.start_ms >= start_ms
    _scraped_after(server, OTHER, 0, job.end_ms)
    importer = JobImporter(connect(store_uri), store_uri, url=server.url, fill=prometheus_main)
    done = importer.job(job)
    assert done.reason is None and done.filled
    want = {k: v for node, gpu in ((NODE, 0), (NODE, 1), (OTHER, 0)) for k, v in held(server, node, gpu, job.start_ms, job.end_ms, under=node).items()}
    assert in_run(MlflowClient(store_uri), done.run_id) == want and want, "each node's own GPUs, point for point, under the node's keys"
