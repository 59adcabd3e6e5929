"""What other tools keep in a job's AdminComment, read for its GPUs: Slurm's own GRES text (`scontrol show job -d`'s
`GRES=gpu:2(IDX:0-1)`, which a site's prolog copies there), and Princeton's jobstats summary (JS1:, gzipped JSON in base64),
which also gives the job's run its figures, marked as a summary and never as series. As sacct and scontrol print them."""

from __future__ import annotations

import json

import pytest

from radt.collectors.slurm.slurmacct import parse_sacct, parse_scontrol
from radt.runmodel import SLURM_SUMMARY_TAG
from tests.support import jobstats


def sacct_line(comment: str, nodes: str = "vm", job: int = 71, tres: str = "billing=1,cpu=1,gres/gpu=2,node=1") -> str:
    """One job as sacct prints it with radt's delimiter (|), its AdminComment last."""
    return f"{job}|{job}|train|alice|proj|debug|2026-11-20T10:00:00|2026-11-20T10:00:05|2026-11-20T11:00:05|COMPLETED|0:0|{nodes}|{tres}|{comment}\n"


SITE_PROLOG = "AdminComment (Slurm's GRES)"


@pytest.mark.parametrize(
    ("comment", "nodes", "gpus"),
    [
        ("gres=gpu:2(IDX:0-1)", "vm", {"vm": (0, 1)}),  # a site prolog copying scontrol's GRES= (lower case)
        ("Nodes=node1 CPU_IDs=0-3 Mem=1024 GRES=gpu:2(IDX:0-1)", "node1", {"node1": (0, 1)}),  # scontrol -d's whole line
        ("gres/gpu:a100:2(IDX:0,2)", "vm", {"vm": (0, 2)}),  # a typed GPU, its indices a list
        ("GRES=GPU:2(idx:1-2)", "vm", {"vm": (1, 2)}),  # whatever the case
        ("GRES=gpu:1g.10gb:1(IDX:0),gpu:3g.40gb:0(IDX:)", "vm", {"vm": (0,)}),  # MIG-like types: one given, one not
        ("GRES=gpu:1(IDX:2),nic:1(IDX:0)", "vm", {"vm": (2,)}),  # another GRES's indices are not GPUs
        ("site note; gres=gpu:1(IDX:3) checked", "vm", {"vm": (3,)}),  # among other text
        (
            "Nodes=gpu01 CPU_IDs=0-3 Mem=1024 GRES=gpu:2(IDX:0-1) Nodes=gpu02 CPU_IDs=0-3 Mem=1024 GRES=gpu:1(IDX:3)",
            "gpu[01-02]",
            {"gpu01": (0, 1), "gpu02": (3,)},
        ),  # each node's own line
        ("nodes=gpu[01-02] cpu_ids=0-3 mem=0 gres=gpu:2(IDX:0-1)", "gpu[01-02]", {"gpu01": (0, 1), "gpu02": (0, 1)}),  # scontrol groups alike nodes
        ("Nodes=gpu01 GRES=gpu:2(IDX:0-1)\nNodes=gpu02 GRES=gpu:2(IDX:2-3)", "gpu[01-02]", {"gpu01": (0, 1), "gpu02": (2, 3)}),  # a line each
    ],
)
def test_slurms_gres_text_in_an_admincomment_gives_the_jobs_gpus(comment, nodes, gpus):
    (job,) = parse_sacct(sacct_line(comment, nodes))
    assert job.gpus == gpus and job.gpus_from == SITE_PROLOG and not job.admin_note, job


def test_a_garbled_gres_index_is_left_out_and_stops_nothing():
    """An index list no Slurm prints ('0-', a range past any node's GPUs) gives no index, not a failed import or a
    range of a billion GPUs."""
    (job,) = parse_sacct(sacct_line("gres=gpu:2(IDX:0-,3),gpu:1(IDX:1-99999999999)"))
    assert job.gpus == {"vm": (3,)}, job


def test_radts_own_prolog_text_is_read_first():
    (job,) = parse_sacct(sacct_line("gres=gpu:4(IDX:0-3) radt-gres=vm>gpu:1(IDX:2)"))
    assert job.gpus == {"vm": (2,)} and job.gpus_from == "AdminComment", job


def test_an_admincomment_without_gpus_says_what_it_looked_for_and_found():
    plain, empty, named = parse_sacct(sacct_line("checked by ops", job=1) + sacct_line("", job=2) + sacct_line("gres=gpu:2(IDX:0-1)", "gpu[01-02]", job=3))
    assert plain.gpus is None and "neither radt-gres=, GRES=...(IDX:...) nor a jobstats summary" in plain.admin_note, plain
    assert "'checked by ops'" in plain.admin_note
    assert empty.gpus is None and "AdminComment is empty" in empty.admin_note, empty
    # scontrol prints a line per group of nodes; a GRES without its Nodes= cannot say which of two nodes had it
    assert named.gpus is None and "names no node" in named.admin_note and "2 nodes" in named.admin_note, named


def test_the_reason_a_run_has_no_series_names_what_the_admincomment_held():
    from radt.collectors.cluster.slurmimport import why_no_series

    (job,) = parse_sacct(sacct_line("checked by ops"))
    reason = why_no_series(job)
    assert "AdminComment holds neither radt-gres=, GRES=...(IDX:...) nor a jobstats summary" in reason and "checked by ops" in reason, reason


DELLA = {  # jobstats' documented example (docs/setup/summaries.md), on a node of its own and a second node of two GPUs
    "vm.cluster.example.org": jobstats.node("12", "57620.8", "84683702272", "137438953472", {1: ("98.63", "83314868224", "85899345920")}),
    "gpu02": jobstats.node("4", "1200", "1073741824", "4294967296", {0: ("0", "524288", "85899345920"), 3: ("51.25", "2147483648", "85899345920")}),
}


def test_a_jobstats_summary_gives_the_jobs_gpus_and_its_figures():
    """jobstats names a node by its exporter's host (here the FQDN of Slurm's vm) and each GPU by its minor number."""
    comment = jobstats.admin_comment(DELLA, 50944, 3)
    (job,) = parse_sacct(sacct_line(comment, "vm,gpu02", tres="billing=1,cpu=16,gres/gpu=3,node=2"))
    assert job.gpus == {"vm": (1,), "gpu02": (0, 3)} and job.gpus_from == "AdminComment (jobstats' summary)", job
    summary = job.summary
    assert summary is not None and summary.seconds == 50944 and set(summary.nodes) == {"vm", "gpu02"}
    vm = summary.nodes["vm"]
    assert (vm.cpus, vm.cpu_seconds, vm.memory_used_bytes, vm.memory_total_bytes) == (12, 57620.8, 84683702272, 137438953472)
    assert vm.gpus[1] == (98.6, 83314868224, 85899345920)  # utilization %, memory used, memory total
    assert summary.nodes["gpu02"].gpus[3].utilization_pct == 51.2 and summary.nodes["gpu02"].gpus[0].utilization_pct == 0


def test_a_jobstats_comment_without_a_summary_says_so():
    """Short and None: jobstats kept none; a summary sacctmgr lowercased (Slurm before 23.02, SchedMD bug 14338, as the
    tests' Slurm 22.05 does) cannot be read by anyone; a CPU job's names no GPU."""
    short, none, broken, cpu, lowered = parse_sacct(
        sacct_line("JS1:Short", job=1)
        + sacct_line("JS1:None", job=2)
        + sacct_line("JS1:H4sInotbase64!", job=3)
        + sacct_line(jobstats.admin_comment({"vm": jobstats.node("2", "10.5", "1024", "2048", {})}, 60, 0), job=4, tres="billing=1,cpu=2,node=1")
        + sacct_line(jobstats.admin_comment(DELLA, 50944, 3).lower(), job=5)
    )
    assert lowered.gpus is None and lowered.summary is None and "lower case" in lowered.admin_note and "Slurm 23.02" in lowered.admin_note, lowered
    assert short.gpus is None and short.summary is None and "JS1:Short" in short.admin_note and "too short" in short.admin_note, short
    assert none.gpus is None and "JS1:None" in none.admin_note, none
    assert broken.gpus is None and broken.summary is None and "cannot be read" in broken.admin_note, broken
    assert cpu.gpus is None and cpu.gpus_requested == 0 and cpu.summary.nodes["vm"].cpus == 2 and not cpu.summary.nodes["vm"].gpus, cpu


def test_a_jobstats_summary_is_kept_on_the_run_as_a_summary_never_as_series(store_uri, monkeypatch):
    """No Prometheus (or none that still holds the job's series): the run has the summary's figures, each GPU's once over
    the whole job, in tags marked as jobstats' summary, and no metric."""
    from mlflow.tracking import MlflowClient

    from radt.collectors.cluster.slurmimport import JobImporter
    from radt.collectors.store.tracking import connect

    monkeypatch.delenv("RADT_PROMETHEUS_URL", raising=False)
    (job,) = parse_sacct(sacct_line(jobstats.admin_comment(DELLA, 50944, 3), "vm,gpu02", tres="billing=1,cpu=16,gres/gpu=3,node=2"))
    done = JobImporter(connect(store_uri), store_uri).job(job)
    run = MlflowClient(store_uri).get_run(done.run_id)
    tags = run.data.tags
    assert "jobstats" in tags[SLURM_SUMMARY_TAG] and "not series" in tags[SLURM_SUMMARY_TAG], tags
    assert tags["radt.slurm.gpus_used"] == "gpu02:0,3;vm:1" and tags["radt.slurm.gpus_from"] == "AdminComment (jobstats' summary)"
    vm = json.loads(tags[f"{SLURM_SUMMARY_TAG}.vm"])
    assert vm["gpus"] == {"1": {"utilization_pct": 98.6, "memory_used_bytes": 83314868224, "memory_total_bytes": 85899345920}}, vm
    assert vm["cpus"] == 12 and vm["cpu_seconds"] == 57620.8 and vm["cpu_utilization_pct"] == pytest.approx(100 * 57620.8 / (50944 * 12), abs=0.05)
    assert vm["memory_used_bytes"] == 84683702272 and vm["memory_total_bytes"] == 137438953472
    assert json.loads(tags[f"{SLURM_SUMMARY_TAG}.gpu02"])["gpus"]["3"]["utilization_pct"] == 51.2
    assert not run.data.metrics, "a summary is never written as series points"


ENDED = (  # Slurm 22.05's record of an ended job (no node's GRES any more), its AdminComment as a site's prolog wrote it
    "JobId=93 JobName=plain UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901674 Nice=0 Account=root QOS=normal "
    "JobState=COMPLETED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 "
    "RunTime=00:00:03 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-27T22:58:01 EligibleTime=2026-11-27T22:58:01 "
    "AccrueTime=2026-11-27T22:58:01 StartTime=2026-11-27T22:58:04 EndTime=2026-11-27T22:58:07 Deadline=N/A SuspendTime=None "
    "SecsPreSuspend=0 LastSchedEval=2026-11-27T22:58:04 Scheduler=Main Partition=debug AllocNode:Sid=localhost:4323 "
    "ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=1,node=1,billing=1,gres/gpu=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:2 MinCPUsNode=1 "
    "MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) "
    "Network=(null) Command=(null) WorkDir=/work/main AdminComment={comment}  StdErr=/tmp/radt-test-acct/out/slurm-93.out "
    "StdIn=/dev/null StdOut=/tmp/radt-test-acct/out/slurm-93.out Power= TresPerNode=gres:gpu:2"
)


@pytest.mark.parametrize("comment", ["Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:2-3)", "gres=gpu:2(IDX:2-3)"])
def test_scontrols_record_of_an_ended_job_gives_the_gpus_its_admincomment_holds(comment):
    job = parse_scontrol(ENDED.format(comment=comment))
    assert job.gpus == {"vm": (2, 3)} and job.gpus_from == SITE_PROLOG and not job.unread, job
