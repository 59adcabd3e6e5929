"""`radt import --slurm` on a real Slurm with accounting (slurmdbd on MariaDB, tests/support/slurmacct.py) whose jobs'
AdminComments hold what the tools of other sites keep there: radt's own prolog's radt-gres=, a site prolog's copy of
Slurm's GRES=...(IDX:...) (`scontrol update` while the job runs), and jobstats' summary (`sacctmgr update job` at its end,
replacing what was there). Each job's run gets its own GPUs; the jobstats job's run also its summary, marked as one,
from a Prometheus that no longer holds the job's series."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from mlflow.tracking import MlflowClient

from radt.cli import main as radt_main
from radt.collectors.slurm import slurmacct as acct
from radt.runmodel import PROMETHEUS_GAP_TAG, SLURM_SUMMARY_TAG
from tests.support import jobstats, slurmacct
from tests.support import prometheus as prom
from tests.support.polling import wait_for


@pytest.fixture(scope="module")
def cluster():
    with pytest.MonkeyPatch.context() as mp:
        env = slurmacct.cluster()
        mp.setenv("SLURM_CONF", env["SLURM_CONF"])
        yield env


def _own_gres(job: str) -> tuple[str, tuple[int, ...]]:
    """Once `job` runs: its node's detail line as `scontrol show job -d` prints it, and the GPU indices in it."""
    found = re.search(r" (Nodes=\S+ CPU_IDs=\S+ Mem=\S+ GRES=(\S+))", slurmacct.running(job))
    assert found, job
    return found.group(1), acct._indices(found.group(2))


def _comments(jobs: list[str]) -> dict[str, str]:
    """Each job's AdminComment as Slurm's accounting keeps it."""
    done = subprocess.run(["sacct", "-n", "-X", "-P", "-j", ",".join(jobs), "-o", "JobID,AdminComment"], env=slurmacct.env(), capture_output=True, text=True)
    return dict(line.split("|", 1) for line in done.stdout.splitlines() if "|" in line)


def _held(names: tuple[str, ...], release, write) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Jobs of one GPU each, named `names`, held running until `release` exists; once each runs and radt's prolog wrote its
    AdminComment, `write(name, job, detail)`; each job's id and own GPU indices."""
    hold = f"while [ ! -e {release} ]; do sleep 0.2; done"
    jobs = {name: slurmacct.submit("--gres=gpu:1", "-J", name, "--wrap", hold) for name in names}
    held = {}
    try:
        for name, job in jobs.items():
            detail, own = _own_gres(job)
            assert len(own) == 1, detail
            wait_for(lambda job=job: "radt-gres=" in slurmacct.scontrol("-o", "show", "job", job), timeout=30, what="radt's prolog's AdminComment")
            write(name, job, detail)
            held[name] = (job, own)
    finally:
        release.touch()
    for job, _own in held.values():
        slurmacct.accounted(job, ("COMPLETED",))
    return held


def test_each_job_gets_the_gpus_its_admincomment_holds_whichever_tool_wrote_it(cluster, store_uri, capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("RADT_PROMETHEUS_URL", raising=False)
    host = slurmacct.host()
    figures = lambda own: {host: jobstats.node("1", "2.3", "52428800", "1073741824", {own[0]: ("37.52", "2147483648", "85899345920")})}  # noqa: E731

    def write(name: str, job: str, detail: str) -> None:
        if name == "site gres":  # a site's prolog: scontrol -d's GRES of the node, as its own text (../shared/slurm-accounting.md)
            slurmacct.scontrol("update", f"JobId={job}", f"AdminComment=gres={detail.partition(' GRES=')[2]}")
        elif name == "site detail":  # another's: the node's whole detail line
            slurmacct.scontrol("update", f"JobId={job}", f"AdminComment={detail}")
        elif name == "jobstats":  # jobstats' summary, kept by slurmctld (scontrol keeps its case; sacctmgr before 23.02 does not)
            slurmacct.scontrol("update", f"JobId={job}", f"AdminComment={jobstats.admin_comment(figures(_own_gres(job)[1]), 2, 1)}")

    held = _held(("radt prolog", "site gres", "site detail", "jobstats"), tmp_path / "release", write)
    # jobstats' slurmctld epilog: its summary of the ended job, stored by sacctmgr, replacing what radt's prolog wrote
    held |= _held(("jobstats epilog",), tmp_path / "release2", lambda *_: None)
    job, own = held["jobstats epilog"]
    fact = wait_for(lambda: next((j for j in acct.sacct([job]) if j.end_ms and j.partition == "debug"), None), timeout=60)
    jobstats.store(job, jobstats.admin_comment(figures(own), round((fact.end_ms - fact.start_ms) / 1000), 1))
    jobs = [job for job, _own in held.values()]
    starts = {"radt prolog": "radt-gres=", "site gres": "gres=gpu:1(IDX:", "site detail": f"Nodes={host} ", "jobstats": "JS1:H4s"}
    starts["jobstats epilog"] = "JS1:H4s" if jobstats.sacctmgr_keeps_case() else "js1:h4s"  # lowercased before 23.02
    kept = lambda: all(_comments(jobs).get(held[n][0], "").startswith(start) for n, start in starts.items())  # noqa: E731
    wait_for(kept, timeout=60, what=lambda: f"each job's AdminComment in sacct: {_comments(jobs)}")
    with prom.taken() as server:  # the cluster's Prometheus, which no longer holds the jobs' series
        code = radt_main(["import", "--slurm", ",".join(jobs), "--prometheus", server.url, "--store", store_uri])
    err = capsys.readouterr().err
    assert code == 0, err
    experiment = MlflowClient(store_uri).get_experiment_by_name("slurm-root")
    runs = {r.data.tags["radt.slurm.job_id"]: r for r in MlflowClient(store_uri).search_runs([experiment.experiment_id])}
    sources = {"radt prolog": "AdminComment", "site gres": "AdminComment (Slurm's GRES)", "site detail": "AdminComment (Slurm's GRES)"}
    sources["jobstats"] = sources["jobstats epilog"] = "AdminComment (jobstats' summary)"
    readable = [name for name in held if starts[name] != "js1:h4s"]
    for name in readable:
        job, own = held[name]
        tags = runs[job].data.tags
        assert tags["radt.slurm.gpus_used"] == f"{host}:{own[0]}" and tags["radt.slurm.gpus_from"] == sources[name], (name, tags, err)
        assert (SLURM_SUMMARY_TAG in tags) == name.startswith("jobstats"), (name, tags)
    for name in [n for n in readable if n.startswith("jobstats")]:
        job, own = held[name]
        run = runs[job]
        tags = run.data.tags
        assert "jobstats" in tags[SLURM_SUMMARY_TAG] and "not series" in tags[SLURM_SUMMARY_TAG] and PROMETHEUS_GAP_TAG in tags, tags
        node = json.loads(tags[f"{SLURM_SUMMARY_TAG}.{host}"])
        assert node["gpus"] == {str(own[0]): {"utilization_pct": 37.5, "memory_used_bytes": 2147483648, "memory_total_bytes": 85899345920}}, node
        assert node["cpus"] == 1 and node["cpu_seconds"] == 2.3 and node["memory_used_bytes"] == 52428800 and node["memory_total_bytes"] == 1073741824
        assert not run.data.metrics, "the summary's figures are no series points"
    if "jobstats epilog" not in readable:  # this Slurm lowercased what jobstats stored: the run says so, and takes no GPU
        tags = runs[held["jobstats epilog"][0]].data.tags
        reason = tags["radt.slurm.no_gpu_series"]
        assert "lower case" in reason and "Slurm 23.02" in reason and not tags["radt.slurm.gpus_used"] and SLURM_SUMMARY_TAG not in tags, tags
