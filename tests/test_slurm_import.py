"""`radt import --slurm`: a run for every Slurm job from a real Slurm's accounting (slurmdbd on MariaDB) and the GPU
series of exactly the job's GPUs from a real Prometheus scraping a dcgm-exporter stand-in."""

from __future__ import annotations

import math
import os
import pwd
import re
import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from radt.app.db.jobs import job_rows, totals
from radt.app.db.store import make_read_engine
from radt.catalogue import EXPORTER_METRICS
from radt.cli import main as radt_main
from radt.collectors.slurm import slurmacct as acct
from radt.diagnosis import IDLE_GPUS, nominal_gb
from radt.runmodel import DIAGNOSIS_TAG, DIAGNOSIS_VERSION_TAG, GPU_MEMORY_TAG, NO_SERIES_TAG, diagnosis_tag
from tests.support import prometheus as prom
from tests.support import slurm as plain_slurm
from tests.support import slurmacct
from tests.support.dcgm_exporter import Device
from tests.support.polling import wait_for
from tests.test_prometheus_import import held, in_run

OTHER_NODE = "radt-test-node-b"  # a node only the exporter stand-in knows: Slurm's accounting lines name it
LOG = Path(__file__).parent / "fixtures" / "real-tool-logs" / "mnist_dcgmi_dmon_18fields.txt"


@pytest.fixture(scope="module")
def cluster(monkeypatch_module):
    env = slurmacct.cluster()
    monkeypatch_module.setenv("SLURM_CONF", env["SLURM_CONF"])
    return env


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def radt_import(capsys, *args: str) -> tuple[int, str]:
    code = radt_main(["import", *args])
    return code, capsys.readouterr().err


def runs_of(client: MlflowClient, user: str) -> dict[str, object]:
    experiment = client.get_experiment_by_name(f"slurm-{user}")
    return {r.data.tags["radt.slurm.job_id"]: r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("radt.role") == "run"}


def test_every_job_gets_one_run_with_its_slurm_facts_and_a_second_import_adds_nothing(cluster, store_uri, capsys):
    two = slurmacct.submit("--gres=gpu:2", "-J", "train-two", "--wrap", "sleep 1")
    array = slurmacct.submit("--array=0-1", "--gres=gpu:1", "-J", "sweep", "--wrap", "sleep 1")
    failing = slurmacct.submit("-J", "broken", "--wrap", "exit 3")
    jobs = [two, f"{array}_0", f"{array}_1", failing]
    for job, state in zip(jobs, ("COMPLETED", "COMPLETED", "COMPLETED", "FAILED"), strict=True):
        slurmacct.accounted(job, (state,))
    code, err = radt_import(capsys, "--slurm", ",".join(jobs), "--store", store_uri)
    assert code == 0, err
    client = MlflowClient(store_uri)
    runs = runs_of(client, "root")
    assert set(jobs) <= set(runs)
    facts = {j.job_id: j for j in acct.sacct(jobs)}
    for job in jobs:
        run, fact = runs[job], facts[job]
        tags = run.data.tags
        assert run.info.run_name == fact.name and run.info.start_time == fact.start_ms and run.info.end_time == fact.end_ms
        assert tags["radt.slurm.state"] == fact.state and tags["radt.slurm.partition"] == "debug" and tags["radt.host"] == slurmacct.host()
        assert tags["mlflow.user"] == "root" and tags["radt.slurm.gpus_requested"] == str(fact.gpus_requested)
    assert runs[failing].info.status == "FAILED" and runs[failing].data.tags["radt.slurm.exit_code"] == "3:0"
    assert runs[failing].data.tags[NO_SERIES_TAG] == "the job had no GPU"
    assert runs[two].info.status == "FINISHED"
    used = runs[two].data.tags["radt.slurm.gpus_used"]  # radt's prolog put the indices in the AdminComment
    host, _, indices = used.partition(":")
    assert host == slurmacct.host() and len(indices.split(",")) == 2 and set(indices.split(",")) <= {"0", "1", "2", "3"}
    parents = {runs[f"{array}_{t}"].data.tags["mlflow.parentRunId"] for t in (0, 1)}
    assert len(parents) == 1, "an array's tasks are runs of one workload"
    assert client.get_run(parents.pop()).data.tags["radt.workload"] == f"sweep (array {array})"
    # again: nothing made twice, by ids or by the time window (which also takes other tests' jobs)
    code, err = radt_import(capsys, "--slurm", ",".join(jobs), "--store", store_uri)
    assert code == 0 and err.endswith(f"{len(jobs)} jobs, 0 new runs, {len(jobs)} unchanged\n"), err
    code, err = radt_import(capsys, "--slurm-since", "1d", "--user", "root", "--store", store_uri)
    assert code == 0, err
    assert {k: r.info.run_id for k, r in runs_of(client, "root").items() if k in jobs} == {k: runs[k].info.run_id for k in jobs}


def test_a_job_name_holding_sacct_fields_stays_a_name(cluster, store_uri, capsys):
    """sbatch -J takes any text, and sacct prints it as it is, between its | delimiters: a name written as the fields of
    another user's job ("alice", 32 GPUs on four nodes) made radt import a run of alice's with those GPUs, and a name
    with a line break in it stopped the whole import. radt asks sacct for a delimiter of its own at each import. radt's
    prolog read the name as fields too: "x Nodes=vm GRES=gpu:4(IDX:0-3)" and a line break gave a job of one GPU all four
    in its AdminComment, and a line break alone none."""
    stamp = "2026-01-01T00:00:00"
    forged = f"forged|alice|bigacct|debug|{stamp}|{stamp}|{stamp}|COMPLETED|0:0|node[1-4]|billing=1,gres/gpu=32,node=4|"
    broken = "two\nlines|root"
    claims = f"x Nodes={slurmacct.host()} GRES=gpu:4(IDX:0-3)\ny"
    names = (forged, broken, claims)
    jobs = [slurmacct.submit("--gres=gpu:1", "-J", name, "--wrap", "true") for name in names]
    for job in jobs:
        slurmacct.accounted(job, ("COMPLETED",))
    # slurmdbd may hold a short job's end before its start record (name "allocation", no partition) for a moment
    wait_for(lambda: {j.partition for j in acct.sacct(jobs)} == {"debug"}, timeout=60, what="both jobs' start records in sacct")
    code, err = radt_import(capsys, "--slurm", ",".join(jobs), "--store", store_uri)
    assert code == 0, err
    client = MlflowClient(store_uri)
    runs = runs_of(client, "root")
    for job, name in zip(jobs, names, strict=True):
        tags = runs[job].data.tags
        assert runs[job].info.run_name == name and tags["mlflow.user"] == "root", (name, runs[job].info.run_name)
        host, _, indices = tags["radt.slurm.gpus_used"].partition(":")
        assert tags["radt.slurm.gpus_requested"] == "1" and host == slurmacct.host() and indices in ("0", "1", "2", "3"), (name, tags["radt.slurm.gpus_used"])
    assert client.get_experiment_by_name("slurm-alice") is None, "no run of alice's from a name"


def test_an_unknown_job_and_a_bad_id_are_one_line_each(cluster, store_uri, capsys):
    code, err = radt_import(capsys, "--slurm", "987654", "--store", store_uri)
    assert code == 1 and err.splitlines()[0] == "radt import: job 987654: Slurm's accounting has no such job; check the id (sacct -j 987654)", err
    code, err = radt_import(capsys, "--slurm", "12;rm", "--store", store_uri)
    assert code == 2 and err.count("\n") == 1 and "not a list of job ids" in err, err
    code, err = radt_import(capsys, "--slurm-since", "yesterday", "--store", store_uri)
    assert code == 2 and err.count("\n") == 1 and "--slurm-since 1d" in err, err


def test_without_accounting_the_jobs_slurmctld_holds_come_from_scontrol(cluster, tmp_path, store_uri, capsys, monkeypatch):
    """A Slurm without slurmdbd: sacct fails; radt says so in one line and imports what scontrol shows, GPUs included."""
    job = slurmacct.submit("--gres=gpu:2", "-J", "no accounting", "--wrap", "sleep 30")
    jobs = [job]
    try:
        mine = acct._indices(slurmacct.running(job))
        conf = tmp_path / "slurm.conf"
        conf.write_text(
            Path(slurmacct.env()["SLURM_CONF"])
            .read_text()
            .replace("AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageType=accounting_storage/none")
        )
        monkeypatch.setenv("SLURM_CONF", str(conf))
        code, err = radt_import(capsys, "--slurm", job, "--store", store_uri)
        assert code == 0, err
        assert "slurmdbd" in err.splitlines()[0] and "from scontrol" in err.splitlines()[0], err
        run = runs_of(MlflowClient(store_uri), "root")[job]
        tags = run.data.tags
        assert run.info.status == "RUNNING" and run.info.run_name == "no accounting" and tags["radt.slurm.state"] == "RUNNING"
        assert tags["radt.slurm.gpus_used"] == f"{slurmacct.host()}:{','.join(map(str, mine))}" and tags["radt.slurm.gpus_from"] == "scontrol", tags
        code, err = radt_import(capsys, "--slurm", "987654", "--store", store_uri)
        assert code == 1 and "job 987654: slurmctld has no such job; check the id (scontrol show job 987654)" in err, err
        # a name holding UserId= and a node's GRES is cut off by its exact text (squeue's): the job has its own GPU, its owner
        forged = slurmacct.submit("--gres=gpu:1", "-J", f"x UserId=alice(7) Nodes={slurmacct.host()} CPU_IDs=0 Mem=0 GRES=gpu:8(IDX:0-7)", "--wrap", "sleep 30")
        jobs.append(forged)
        own = acct._indices(re.search(r" Nodes=\S+ CPU_IDs=\S+ Mem=\S+ GRES=(\S+) MinCPUsNode=", slurmacct.running(forged)).group(1))
        code, err = radt_import(capsys, "--slurm", forged, "--store", store_uri)
        assert code == 0 and "cannot be read" not in err, err
        assert not MlflowClient(store_uri).get_experiment_by_name("slurm-alice"), "no run of alice's from a name"
        tags = runs_of(MlflowClient(store_uri), "root")[forged].data.tags
        assert len(own) == 1 and tags["radt.slurm.gpus_used"] == f"{slurmacct.host()}:{own[0]}" and tags["radt.slurm.gpus_requested"] == "1", tags
    finally:
        subprocess.run(["scancel", *jobs], env=slurmacct.env(), check=False)


def test_a_running_import_keeps_the_gpus_scontrol_gave_for_the_import_after_the_end(cluster, store_uri, capsys, monkeypatch, tmp_path):
    """Accounting without radt's prolog: an import while the job runs takes its GPUs from scontrol and the run keeps them,
    so the import after its end (when only sacct knows the job, without GPUs) still knows them."""
    monkeypatch.delenv("RADT_PROMETHEUS_URL", raising=False)
    release = tmp_path / "release"  # the job runs until the test has imported it once
    job = slurmacct.submit("--gres=gpu:1", "-J", "caught running", "--wrap", f"while [ ! -e {release} ]; do sleep 0.2; done")
    try:
        mine = acct._indices(slurmacct.running(job))
        slurmacct.scontrol("update", f"JobId={job}", "AdminComment=")  # as on a cluster without radt's prolog
        seen = lambda: [j for j in acct.sacct([job]) if j.state == "RUNNING" and j.gpus_requested == 1]  # noqa: E731
        wait_for(seen, timeout=30, what=f"job {job} running with its GPU in sacct")  # slurmdbd hears of the start after slurmctld
        code, err = radt_import(capsys, "--slurm", job, "--store", store_uri)
    finally:
        release.touch()
    assert code == 0, err
    client = MlflowClient(store_uri)
    tags = runs_of(client, "root")[job].data.tags
    used = f"{slurmacct.host()}:{','.join(map(str, mine))}"
    assert tags.get("radt.slurm.gpus_from") == "scontrol" and tags["radt.slurm.gpus_used"] == used, (tags, err)
    slurmacct.accounted(job, ("COMPLETED",))
    assert not (acct.sacct([job])[0].gpus or {}), "sacct alone has no GPU for it"
    code, err = radt_import(capsys, "--slurm", job, "--store", store_uri)
    assert code == 0, err
    run = runs_of(client, "root")[job]
    assert run.info.status == "FINISHED" and run.data.tags["radt.slurm.gpus_used"] == used, run.data.tags
    assert run.data.tags["radt.slurm.gpus_from"] == "scontrol, while it ran"


@pytest.fixture(scope="module")
def served(cluster):
    devices = [Device(slurmacct.host(), gpu, gpu, memory_mib=40_536) for gpu in range(4)]  # an A100 40GB's memory, as its driver says
    devices += [Device(OTHER_NODE, gpu, 3 - gpu, memory_mib=81_559) for gpu in range(2)]  # a second node, of A100 80GBs (jobs on two nodes)
    until = f'DCGM_FI_PROF_SM_ACTIVE{{Hostname="{slurmacct.host()}",gpu="0"}}[1h]'
    with prom.serving(LOG, devices, until, 2) as (exporter, server):
        yield exporter, server


def test_a_job_gets_the_series_of_its_own_gpus_and_no_other(served, store_uri, capsys):
    _exporter, server = served
    job = slurmacct.submit("--gres=gpu:2", "-J", "train-series", "--wrap", "sleep 3")
    slurmacct.accounted(job, ("COMPLETED",))
    fact = acct.sacct([job])[0]
    mine = fact.gpus[slurmacct.host()]
    _scraped_after(server, slurmacct.host(), mine[0], fact.end_ms)  # the scrape after the job's last second is stored
    code, err = radt_import(capsys, "--slurm", job, "--prometheus", server.url, "--store", store_uri)
    assert code == 0, err
    client = MlflowClient(store_uri)
    run = runs_of(client, "root")[job]
    gpus = {int(k.split("_")[1]) for k in run.data.metrics if k.startswith("system/gpu_")}
    assert gpus == set(mine), (gpus, mine)
    for key in run.data.metrics:
        history = client.get_metric_history(run.info.run_id, key)
        assert len(history) >= 3 and all(fact.start_ms <= m.timestamp <= fact.end_ms for m in history), (
            key,
            fact.start_ms,
            fact.end_ms,
            [m.timestamp for m in history],
        )
    expected = {k: v for gpu in mine for k, v in held(server, slurmacct.host(), gpu, fact.start_ms, fact.end_ms).items()}
    assert in_run(client, run.info.run_id) == expected, "point for point what Prometheus holds for the job's GPUs over its time"
    assert NO_SERIES_TAG not in run.data.tags
    tags = client.get_run(run.info.run_id).data.tags
    assert DIAGNOSIS_VERSION_TAG in tags, "the job is diagnosed as it is imported"
    assert nominal_gb(float(tags[GPU_MEMORY_TAG])) == 40, "the GPUs' size, from the exporter's FB_FREE + FB_USED"
    hours = (fact.end_ms - fact.start_ms) / 3.6e6
    assert float(tags["radt.footprint.gpu_hours"]) == pytest.approx(2 * hours, rel=0.02), "over the job's own two GPUs"
    idle = [g for g in mine if g != 0]  # the exporter serves the log's GPU g as GPU g: GPU 0 busy, GPUs 1-4 idle
    codes = tags[DIAGNOSIS_TAG].split(",")
    assert (IDLE_GPUS in codes) == bool(idle), tags[DIAGNOSIS_TAG]
    if idle:
        sentence = tags[diagnosis_tag(IDLE_GPUS)]
        assert f"{len(idle)} of 2 GPUs idle" in sentence and all(f"GPU {g} " in sentence for g in idle), sentence
        experiment = client.get_experiment_by_name("slurm-root").experiment_id
        found = client.search_runs([experiment], filter_string="tags.`radt.diagnosis` LIKE '%idle_gpus%'")
        assert run.info.run_id in {r.info.run_id for r in found}, "MLflow's own search finds the wasteful jobs"
    code, err = radt_import(capsys, "--slurm", job, "--prometheus", server.url, "--store", store_uri)
    assert code == 0 and "unchanged since the last import" in err, err  # its run holds it all: nothing read again


def _scraped_after(server, host: str, gpu: int, ms: int) -> None:
    """Wait until Prometheus stored a scrape of the GPU later than `ms` (a job's last second is then in)."""
    promql = f'DCGM_FI_PROF_SM_ACTIVE{{Hostname="{host}",gpu="{gpu}"}}[30s]'
    wait_for(lambda: any(float(t) * 1000 > ms for r in server.api("/api/v1/query", query=promql)["result"] for t, _v in r["values"]), timeout=30)


def test_gpus_the_exporter_labels_with_the_job_are_its_own_where_accounting_has_none(served, store_uri, capsys):
    """A cluster without radt's prolog but with dcgm-exporter's HPC job mapping: the GPUs whose series carry the job's
    hpc_job label are the job's; their samples from before the label appeared are joined, another job's GPU is not taken."""
    exporter, server = served
    host = slurmacct.host()
    job = slurmacct.submit("--gres=gpu:2", "-J", "labelled", "--wrap", "sleep 4")
    mine = acct._indices(slurmacct.running(job))  # the GPUs Slurm gave it
    other = next(g for g in range(4) if g not in mine)
    slurmacct.scontrol("update", f"JobId={job}", "AdminComment=")  # what radt's prolog wrote: gone, as on a cluster without it
    plain = list(exporter.devices)
    labels = {g: (("hpc_job", job),) for g in mine} | {other: (("hpc_job", "424242"),)}  # another job on a third GPU
    exporter.devices = [Device(host, g, g, labels=labels.get(g, ())) for g in range(4)]
    try:
        slurmacct.accounted(job, ("COMPLETED",))
        fact = acct.sacct([job])[0]
        _scraped_after(server, host, mine[0], fact.end_ms)
    finally:
        exporter.devices = plain
    assert not (fact.gpus or {}).get(host), "Slurm's accounting alone cannot say which GPUs the job had"
    code, err = radt_import(capsys, "--slurm", job, "--prometheus", server.url, "--store", store_uri)
    assert code == 0, err
    client = MlflowClient(store_uri)
    run = runs_of(client, "root")[job]
    tags = run.data.tags
    assert tags["radt.slurm.gpus_from"] == "exporter label hpc_job" and tags["radt.slurm.gpus_used"] == f"{host}:{','.join(map(str, mine))}", tags
    assert {int(k.split("_")[1]) for k in run.data.metrics if k.startswith("system/gpu_")} == set(mine)
    expected: dict[str, dict[int, float]] = {}
    for gpu in mine:  # every series Prometheus holds for the GPU over the job, unlabelled or labelled with this job
        span = fact.end_ms - fact.start_ms + 1
        promql = f'{{__name__=~"{"|".join(EXPORTER_METRICS)}",Hostname="{host}",gpu="{gpu}",hpc_job=~"|{job}"}}[{span}ms]'
        for series in server.api("/api/v1/query", query=promql, time=f"{fact.end_ms / 1000:.3f}")["result"]:
            name, scale = EXPORTER_METRICS[series["metric"]["__name__"]]
            got = expected.setdefault(f"system/gpu_{gpu}_{name}", {})
            got.update({round(float(t) * 1000): float(v) * scale for t, v in series["values"] if fact.start_ms <= round(float(t) * 1000) <= fact.end_ms})
    assert in_run(client, run.info.run_id) == {k: v for k, v in expected.items() if v}, "point for point, across the label's coming"


def test_a_job_on_two_nodes_gets_each_nodes_own_gpus_under_its_node(served, store_uri):
    """A two-node job (an accounting line as sacct prints one; the tests' Slurm has one node): each node's GPUs from its
    own exporter series, under the node's keys as radt's own multi-node runs have them, and one diagnosis over all three,
    its memory said against the largest GPU of both nodes."""
    from radt.collectors.cluster.slurmimport import JobImporter
    from radt.collectors.imports.importer import prometheus_main
    from radt.collectors.store.tracking import connect

    _exporter, server = served
    host = slurmacct.host()
    # the job's time lies ahead, when the exporter serves its plain devices (an earlier test of this module relabels them)
    start = math.ceil(time.time()) + 1
    stamp = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))  # noqa: E731  (sacct prints local time)
    line = (
        f"301|301|two-nodes|root|root|debug|{stamp(start - 1)}|{stamp(start)}|{stamp(start + 3)}|COMPLETED|0:0|{host},{OTHER_NODE}|"
        f"billing=1,gres/gpu=3,node=2|radt-gres={host}>gpu:2(IDX:1,3);{OTHER_NODE}>gpu:1(IDX:1)\n"
    )
    (job,) = acct.parse_sacct(line)
    _scraped_after(server, OTHER_NODE, 1, job.end_ms)
    client = connect(store_uri)
    importer = JobImporter(client, store_uri, url=server.url, fill=prometheus_main)
    done = importer.job(job)
    assert done.reason is None and done.filled
    expected = {k: v for node, gpu in ((host, 1), (host, 3), (OTHER_NODE, 1)) for k, v in held(server, node, gpu, job.start_ms, job.end_ms, node=node).items()}
    assert in_run(MlflowClient(store_uri), done.run_id) == expected and expected, "each node's own GPUs, point for point, under the node's keys"
    importer.diagnose()
    tags = client.get_run(done.run_id).data.tags
    assert tags[f"radt.node.{OTHER_NODE}/host"] == OTHER_NODE
    assert float(tags["radt.footprint.gpu_hours"]) == pytest.approx(3 * (job.end_ms - job.start_ms) / 3.6e6, rel=0.05), "one diagnosis over all three"
    # its GPUs' size over both nodes (40 GB here, 80 GB there): the largest, as on one node; the first node's alone said 40
    assert nominal_gb(float(tags[GPU_MEMORY_TAG])) == 80, tags
    if IDLE_GPUS in tags[DIAGNOSIS_TAG].split(","):  # each GPU named as the dashboard names it: node · GPU i
        assert f"{OTHER_NODE} · GPU 1" in tags[diagnosis_tag(IDLE_GPUS)] or f"{host} · GPU" in tags[diagnosis_tag(IDLE_GPUS)]


def test_a_job_given_every_gpu_of_its_node_has_them_all_without_any_other_source(cluster, store_uri, capsys, monkeypatch):
    """No prolog, no exporter label, not caught running: a job that asked for all 4 GPUs of its node had each of them."""
    monkeypatch.delenv("RADT_PROMETHEUS_URL", raising=False)
    job = slurmacct.submit("--gres=gpu:4", "-J", "whole node", "--wrap", "sleep 2")
    slurmacct.running(job)
    slurmacct.scontrol("update", f"JobId={job}", "AdminComment=")
    slurmacct.accounted(job, ("COMPLETED",))
    code, err = radt_import(capsys, "--slurm", job, "--store", store_uri)
    assert code == 0, err
    tags = runs_of(MlflowClient(store_uri), "root")[job].data.tags
    assert tags["radt.slurm.gpus_from"] == "whole node" and tags["radt.slurm.gpus_used"] == f"{slurmacct.host()}:0,1,2,3", tags


def test_the_prolog_copies_the_gpu_indices_slurm_gave_the_job(cluster):
    job = slurmacct.submit("--gres=gpu:1", "--wrap", "sleep 3")
    detail = slurmacct.running(job)
    slurmacct.accounted(job, ("COMPLETED",))
    fact = acct.sacct([job])[0]
    assert fact.gpus == {slurmacct.host(): acct._indices(detail)} and len(fact.gpus[slurmacct.host()]) == 1, (fact, detail)


def test_prometheus_away_leaves_the_jobs_facts_and_a_gap_the_next_import_fills(served, store_uri, capsys):
    _exporter, server = served
    job = slurmacct.submit("--gres=gpu:1", "-J", "gap", "--wrap", "sleep 2")
    slurmacct.accounted(job, ("COMPLETED",))
    _scraped_after(server, slurmacct.host(), 0, acct.sacct([job])[0].end_ms)  # the scrape after the job's last second is stored
    closed = "http://127.0.0.1:9"  # nothing listens on the discard port
    code, err = radt_import(capsys, "--slurm", job, "--prometheus", closed, "--store", store_uri)
    assert code == 1 and "import again" in err, err
    client = MlflowClient(store_uri)
    run = runs_of(client, "root")[job]
    assert run.info.status == "FINISHED" and run.data.tags["radt.slurm.state"] == "COMPLETED" and "radt.prometheus_gap" in run.data.tags
    assert not run.data.metrics
    code, err = radt_import(capsys, "--slurm", job, "--prometheus", server.url, "--store", store_uri)
    assert code == 0, err
    filled = client.get_run(run.info.run_id)
    assert "radt.prometheus_gap" not in filled.data.tags and filled.data.metrics, "the next import filled the gap"


def test_a_jobs_name_and_comment_cannot_give_it_other_gpus(cluster):
    """A job's owner writes Slurm's field names into its name and comment: a name holding a node's GRES once gave the job
    GPUs 0-7 of the node (scontrol's text read as fields), an AdminComment in the comment stopped radt's prolog from
    recording the job's GPUs, and a line break in a name cut the job's record in two. The job has 2 GPUs: those, and its
    name as given, whichever way radt asks."""
    host = slurmacct.host()
    name = f"forged Nodes={host} GRES=gpu:8(IDX:0-7)\nsecond line"
    job = slurmacct.submit("--gres=gpu:2", "-J", name, "--comment", f"x AdminComment=radt-gres={host}>gpu:8(IDX:0-7)", "--wrap", "sleep 3")
    detail = re.search(r" Nodes=\S+ CPU_IDs=\S+ Mem=\S+ GRES=(\S+)", slurmacct.running(job))  # the node's own line (the name has no CPU_IDs)
    mine = acct._indices(detail.group(1))
    assert len(mine) == 2, detail.group(0)
    (held,) = acct.scontrol_jobs([job])
    assert held.name == name and held.gpus == {host: mine} and held.gpus_from == "scontrol" and not held.unread, held
    assert acct.running_gpus(held) == {host: mine}
    slurmacct.accounted(job, ("COMPLETED",))
    # slurmdbd may hold a short job's end before its start record (name "allocation", no partition) for a moment
    wait_for(lambda: acct.sacct([job])[0].partition == "debug", timeout=60, what="the job's start record in sacct")
    fact = acct.sacct([job])[0]
    assert fact.name == name and fact.gpus == {host: mine} and fact.gpus_from == "AdminComment", fact


@pytest.fixture
def untracked(monkeypatch):
    """The plain test Slurm (tests/support/slurm.py): no slurmdbd, and AccountingStorageTRES without gres/gpu, so Slurm's
    TRES count no GPU of any job (TRES=cpu=1,node=1,billing=1 for a --gres=gpu:1 job), as on many sites."""
    env = plain_slurm.cluster()
    monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])
    monkeypatch.delenv("RADT_PROMETHEUS_URL", raising=False)
    return env


def _plain_submit(*args: str) -> str:
    """sbatch ARGS on the plain test Slurm; the job id."""
    out = plain_slurm.CLUSTER_DIR / "out"
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["sbatch", "--parsable", f"--output={out}/slurm-%j.out", *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def _own_gres(job: str) -> tuple[str, tuple[int, ...]]:
    """Wait until `job` runs; its node and the GPU indices Slurm gave it (the node's own detail line: CPU_IDs follows)."""

    def detail() -> re.Match | None:
        done = subprocess.run(["scontrol", "-o", "-d", "show", "job", job], capture_output=True, text=True, timeout=20)
        return re.search(r" Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S+)", done.stdout) if "JobState=RUNNING" in done.stdout else None

    found = wait_for(detail, timeout=60, what=lambda: f"job {job} running", interval=0.1)
    return found.group(1), acct._indices(found.group(2))


def _ended(job: str) -> None:
    """Wait until slurmctld says `job` ended (it keeps the record for MinJobAge, 300 s here)."""
    states = lambda: subprocess.run(["squeue", "-h", "--states=all", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=20).stdout  # noqa: E731
    wait_for(lambda: states().strip() in ("COMPLETED", "FAILED"), timeout=60, what=lambda: f"job {job} ended ({states()!r})")


def test_a_jobs_name_cannot_hide_its_gpu_from_the_cluster_page(untracked, store_uri, capsys):
    """Issue #52 item 17: a job named "two\\nlines UserId=root(0)" that held one GPU was listed with 0 GPUs and "the job
    had no GPU": its name made scontrol's record ambiguous (UserId twice), so its GPU indices were dropped, and this Slurm's
    TRES count no GPU. Its owner kept its GPU-hours out of the totals by naming the job."""
    owner = pwd.getpwuid(os.getuid()).pw_name
    job = _plain_submit("--gres=gpu:1", "-J", "two\nlines UserId=root(0)", "--wrap", "sleep 60")
    try:
        node, mine = _own_gres(job)
        assert len(mine) == 1, mine
        code, err = radt_import(capsys, "--slurm", job, "--store", store_uri)
    finally:
        subprocess.run(["scancel", job], check=False)
    assert code == 0, err
    run = runs_of(MlflowClient(store_uri), owner)[job]
    tags = run.data.tags
    assert tags[NO_SERIES_TAG] != "the job had no GPU" and "cannot be read" not in err, (tags, err)
    assert tags["radt.slurm.gpus_requested"] == "1" and tags["radt.slurm.gpus_used"] == f"{node}:{mine[0]}", (tags, err)
    assert run.info.run_name == "two\nlines UserId=root(0)" and tags["mlflow.user"] == owner and tags["radt.slurm.user"] == owner, tags
    (row,) = [r for r in job_rows(make_read_engine(store_uri)) if r["job"] == job]
    assert row["gpus"] == 1 and row["user"] == owner, row
    (total,) = [t for t in totals([row], "user") if t["name"] == owner]
    assert total["gpu_hours"] == pytest.approx(row["hours"]) and total["gpu_hours"] > 0, total


def test_gpus_requested_come_from_the_jobs_gres_where_slurms_tres_count_none(untracked, store_uri, capsys):
    """`radt.slurm.gpus_requested` was 0 for --gres=gpu:1 jobs on a Slurm that does not count GPUs in its TRES: read from
    the job's own request (--gres, --gpus), running or ended, and 0 only for a job that asked for no GPU."""
    owner = pwd.getpwuid(os.getuid()).pw_name
    ended = _plain_submit("--gres=gpu:1", "-J", "gres one", "--wrap", "true")
    cpu = _plain_submit("-J", "cpu only", "--wrap", "true")
    running = _plain_submit("--gpus=2", "-J", "gpus two", "--wrap", "sleep 60")
    try:
        _own_gres(running)
        _ended(ended)
        _ended(cpu)
        code, err = radt_import(capsys, "--slurm", f"{ended},{cpu},{running}", "--store", store_uri)
    finally:
        subprocess.run(["scancel", running], check=False)
    assert code == 0, err
    runs = runs_of(MlflowClient(store_uri), owner)
    requested = {job: runs[job].data.tags["radt.slurm.gpus_requested"] for job in (ended, cpu, running)}
    assert requested == {ended: "1", cpu: "0", running: "2"}, (requested, err)
    assert runs[cpu].data.tags[NO_SERIES_TAG] == "the job had no GPU"
    assert runs[ended].data.tags[NO_SERIES_TAG] != "the job had no GPU", runs[ended].data.tags


def test_whether_slurms_tres_count_gpus_is_read_from_slurmctld(untracked, monkeypatch):
    """A job whose TRES hold no gres/gpu had no GPU only where the cluster counts GPUs (AccountingStorageTRES)."""
    assert acct.gpus_counted() is False
    monkeypatch.setenv("SLURM_CONF", slurmacct.cluster()["SLURM_CONF"])
    assert acct.gpus_counted() is True


def test_a_cluster_load_stopped_at_its_deadline_with_no_lock_is_not_said_to_be_locked(store_uri):
    """Issue #52 item 17: the first /cluster load after an import said the store was "busy or locked for 20 s" with no
    other connection. Nothing held it: SQLite's progress handler stopped the page's own read at the request's deadline
    (a large store, a busy machine), and every read stopped there was said to be a lock."""
    from radt.app.db import deadline
    from radt.collectors.cluster.slurmimport import JobImporter
    from radt.collectors.store.tracking import connect

    lines = "".join(
        f"{job}|{job}|train|user{job % 7}|proj|gpu|2026-11-20T10:00:00|2026-11-20T10:00:05|2026-11-20T11:00:05|COMPLETED|0:0|n1|"
        f"billing=1,gres/gpu=1,node=1|radt-gres=n1>gpu:1(IDX:0)\n"
        for job in range(1000, 1120)
    )
    importer = JobImporter(connect(store_uri), store_uri)
    for job in acct.parse_sacct(lines):
        importer.job(job)
    engine = make_read_engine(store_uri)
    deadline.start(1e-9)  # the deadline passes while the page reads, as 20 s do on a store of 100,000 jobs
    try:
        with pytest.raises(Exception) as stopped:
            job_rows(engine)
    finally:
        deadline.clear()
    assert deadline.timed_out(stopped.value), stopped.value
    said = deadline.store_message(stopped.value)
    assert "busy or locked" not in said and "took longer than" in said and "no lock" in said, said
