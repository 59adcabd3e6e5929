"""Slurm's own words into Jobs: `scontrol -o -d show job` lines as Slurm 22.05 printed them on the tests' cluster
(tests/support/slurmacct.py), a job name with spaces and an array's task among them (the first with its AdminComment
emptied, as on a cluster without radt's prolog)."""

from __future__ import annotations

import re

import pytest

from radt.collectors.slurm.slurmacct import parse_scontrol
from radt.runmodel import gpus_of_tag, gpus_used_tag

RUNNING = (
    "JobId=41 JobName=my job UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901724 Nice=0 Account=root QOS=normal "
    "JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 "
    "RunTime=00:00:02 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-26T21:54:08 EligibleTime=2026-11-26T21:54:08 "
    "AccrueTime=2026-11-26T21:54:08 StartTime=2026-11-26T21:54:08 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
    "LastSchedEval=2026-11-26T21:54:08 Scheduler=Main Partition=debug AllocNode:Sid=localhost:4260 ReqNodeList=(null) "
    "ExcNodeList=(null) NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=1,node=1,billing=1,gres/gpu=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:2   Nodes=vm CPU_IDs=0 "
    "Mem=0 GRES=gpu:2(IDX:0-1) MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK "
    "Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/work/main AdminComment=  "
    "StdErr=/tmp/radt-test-acct/out/x-41.out StdIn=/dev/null StdOut=/tmp/radt-test-acct/out/x-41.out Power= TresPerNode=gres:gpu:2 "
)
TASK = (
    "JobId=42 ArrayJobId=42 ArrayTaskId=1 JobName=arr UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901723 Nice=0 "
    "Account=root QOS=normal JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 "
    "DerivedExitCode=0:0 RunTime=00:00:02 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-26T21:54:08 "
    "EligibleTime=2026-11-26T21:54:08 AccrueTime=2026-11-26T21:54:08 StartTime=2026-11-26T21:54:08 EndTime=Unknown Deadline=N/A "
    "SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-26T21:54:08 Scheduler=Main Partition=debug AllocNode:Sid=localhost:4260 "
    "ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=1,node=1,billing=1,gres/gpu=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:1   Nodes=vm CPU_IDs=2 "
    "Mem=0 GRES=gpu:1(IDX:3) MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK "
    "Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/work/main AdminComment=radt-gres=vm>gpu:1(IDX:3)  "
    "StdErr=/tmp/radt-test-acct/out/x-42.out StdIn=/dev/null StdOut=/tmp/radt-test-acct/out/x-42.out Power= TresPerNode=gres:gpu:1 "
)


def test_a_running_jobs_line_gives_its_facts_and_the_gpus_slurm_gave_it():
    job = parse_scontrol(RUNNING)
    assert (job.job_id, job.raw_id, job.name, job.user, job.account, job.partition) == ("41", "41", "my job", "root", "root", "debug")
    assert job.state == "RUNNING" and job.status == "RUNNING" and job.end_ms is None and job.start_ms == job.submit_ms
    assert job.nodes == ("vm",) and job.gpus_requested == 2 and job.gpus == {"vm": (0, 1)} and job.gpus_from == "scontrol"


def test_an_array_tasks_line_is_named_as_users_write_it():
    job = parse_scontrol(TASK)
    assert (job.job_id, job.raw_id, job.array_job) == ("42_1", "42", "42") and job.gpus == {"vm": (3,)}


def test_the_gpus_used_tag_reads_back():
    gpus = {"gpu01": (0, 1), "gpu02": (3,)}
    assert gpus_of_tag(gpus_used_tag(gpus)) == gpus and gpus_of_tag("") == {} and gpus_of_tag("gpu01:x") == {}


def test_jobs_are_read_by_their_fields_whatever_their_names_hold():
    """Two jobs as sacct prints them with radt's delimiter: a name holding | and a line break, an AdminComment holding
    the delimiter; each field where it belongs, the second job's id after the first job's last line break."""
    from radt.collectors.slurm.slurmacct import FIELDS, AccountingError, parse_sacct

    d = "|0123456789abcdef|"
    first = ["61", "61", "a|alice\nb", "root", "root", "debug", "2026-11-26T21:54:08", "2026-11-26T21:54:08", "2026-11-26T21:55:08",
             "COMPLETED", "0:0", "vm", "billing=1,gres/gpu=1", f"radt-gres=vm>gpu:1(IDX:2){d}note"]  # fmt: skip
    second = ["62", "62", "plain", "bob", "proj", "debug", "2026-11-26T21:54:08", "Unknown", "Unknown", "PENDING", "0:0", "None Assigned", "", ""]
    assert len(first) == len(second) == len(FIELDS)
    jobs = parse_sacct(d.join(first) + "\n" + d.join(second) + "\n", d)
    assert [(j.job_id, j.name, j.user, j.gpus) for j in jobs] == [("61", "a|alice\nb", "root", {"vm": (2,)}), ("62", "plain", "bob", None)]
    with pytest.raises(AccountingError) as caught:
        parse_sacct(d.join(first[:5]), d)
    assert str(caught.value).startswith("sacct's job 1 has 5 fields, not 14"), caught.value


# Records a job's owner forged, as Slurm 22.05 printed them on the tests' cluster (each job had 2 GPUs): its name holding a
# node's GRES, its name holding UserId= and a whole GRES detail, and its comment holding an AdminComment= (no radt prolog
# record: the prolog of that time stopped at the forged one); the old parse gave the first job GPUs 0-7 of its node.
FORGED_NAME = "JobId=89 JobName=x Nodes=vm GRES=gpu:8(IDX:0-7) UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901677 Nice=0 Account=root QOS=normal JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-27T22:57:40 EligibleTime=2026-11-27T22:57:40 AccrueTime=2026-11-27T22:57:40 StartTime=2026-11-27T22:57:40 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-27T22:57:40 Scheduler=Main Partition=debug AllocNode:Sid=localhost:4323 ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1,gres/gpu=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:2   Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1) MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/work/main AdminComment=radt-gres=vm>gpu:2(IDX:0-1)  StdErr=/tmp/radt-test-acct/out/slurm-89.out StdIn=/dev/null StdOut=/tmp/radt-test-acct/out/slurm-89.out Power= TresPerNode=gres:gpu:2 \n"
FORGED_USER = "JobId=90 JobName=x UserId=alice(7) Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:8(IDX:0-7) UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901676 Nice=0 Account=root QOS=normal JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-27T22:57:40 EligibleTime=2026-11-27T22:57:40 AccrueTime=2026-11-27T22:57:40 StartTime=2026-11-27T22:57:43 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-27T22:57:43 Scheduler=Main Partition=debug AllocNode:Sid=localhost:4323 ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1,gres/gpu=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:2   Nodes=vm CPU_IDs=1 Mem=0 GRES=gpu:2(IDX:2-3) MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/work/main AdminComment=radt-gres=vm>gpu:2(IDX:2-3)  StdErr=/tmp/radt-test-acct/out/slurm-90.out StdIn=/dev/null StdOut=/tmp/radt-test-acct/out/slurm-90.out Power= TresPerNode=gres:gpu:2 \n"
FORGED_COMMENT = "JobId=92 JobName=plain UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901674 Nice=0 Account=root QOS=normal JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-27T22:58:01 EligibleTime=2026-11-27T22:58:01 AccrueTime=2026-11-27T22:58:01 StartTime=2026-11-27T22:58:04 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-27T22:58:04 Scheduler=Main Partition=debug AllocNode:Sid=localhost:4323 ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1,gres/gpu=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:2   Nodes=vm CPU_IDs=1 Mem=0 GRES=gpu:2(IDX:2-3) MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/work/main Comment=x AdminComment=radt-gres=vm>gpu:8(IDX:0-7) Nodes=vm GRES=gpu:4(IDX:4-7)  StdErr=/tmp/radt-test-acct/out/slurm-92.out StdIn=/dev/null StdOut=/tmp/radt-test-acct/out/slurm-92.out Power= TresPerNode=gres:gpu:2 \n"


def test_a_name_holding_a_nodes_gres_is_a_name_and_the_job_keeps_its_own_gpus():
    job = parse_scontrol(FORGED_NAME.rstrip("\n"))
    assert job.name == "x Nodes=vm GRES=gpu:8(IDX:0-7)" and job.user == "root" and job.gpus == {"vm": (0, 1)} and not job.unread


def test_a_record_whose_name_holds_slurms_fields_gives_no_gpus_and_says_why():
    job = parse_scontrol(FORGED_USER.rstrip("\n"))
    assert job.user == "root" and job.gpus is None and job.gpus_from == "", job
    assert job.unread == "its name holds Slurm's field names (UserId twice)"


def test_an_admincomment_in_the_users_comment_is_not_the_jobs():
    """While the job runs its nodes' GRES win; once it ended (the same record without them) the AdminComment the user
    wrote claims 8 GPUs of a job given 2, and is not taken."""
    running = parse_scontrol(FORGED_COMMENT.rstrip("\n"))
    assert running.gpus == {"vm": (2, 3)} and running.gpus_from == "scontrol"
    ended = re.sub(r"  Nodes=vm CPU_IDs=\S+ Mem=\S+ GRES=\S+", "", FORGED_COMMENT.rstrip("\n")).replace("JobState=RUNNING", "JobState=COMPLETED")
    job = parse_scontrol(ended)
    assert job.gpus is None and "AdminComment" in job.unread, job


UNCOUNTED = "".join(  # sacct's lines on a Slurm whose TRES count no GPU (AccountingStorageTRES without gres/gpu)
    f"{job}|{job}|train|alice|proj|debug|2026-11-20T10:00:00|2026-11-20T10:00:05|2026-11-20T11:00:05|COMPLETED|0:0|vm|billing=1,cpu=1,node=1|{comment}\n"
    for job, comment in ((71, "radt-gres=vm>gpu:1(IDX:2)"), (72, ""))
)


def test_where_slurms_tres_count_no_gpu_a_job_without_one_has_radts_count_or_none():
    """TRES without gres/gpu mean no GPU only where Slurm counts GPUs in them; elsewhere radt's prolog says how many the job
    had (its AdminComment), and without it the number is not known: None, never 0."""
    from radt.collectors.slurm.slurmacct import parse_sacct

    assert [j.gpus_requested for j in parse_sacct(UNCOUNTED, gpus_counted=False)] == [1, None]
    assert [j.gpus_requested for j in parse_sacct(UNCOUNTED, gpus_counted=None)] == [1, None]
    assert [j.gpus_requested for j in parse_sacct(UNCOUNTED, gpus_counted=True)] == [1, 0]


def test_a_job_whose_gpus_are_not_known_is_not_listed_as_a_job_without_gpu(store_uri):
    """The Cluster page: a job whose GPUs no source gave is 'unknown' with the reason, and its group's GPU-hours say that
    some are missing, instead of 0 GPUs and 'the job had no GPU'."""
    from radt.app.db.jobs import job_rows, totals
    from radt.app.db.store import make_read_engine
    from radt.collectors.cluster import slurmimport
    from radt.collectors.slurm.slurmacct import parse_sacct
    from radt.collectors.store.tracking import connect

    client = connect(store_uri)
    importer = slurmimport.JobImporter(client, store_uri)
    runs = {job.job_id: importer.job(job).run_id for job in parse_sacct(UNCOUNTED, gpus_counted=False)}
    tags = client.get_run(runs["72"]).data.tags
    assert tags["radt.slurm.gpus_requested"] == "unknown" and "AccountingStorageTRES" in tags["radt.slurm.no_gpu_series"], tags
    assert client.get_run(runs["71"]).data.tags["radt.slurm.gpus_requested"] == "1"
    rows = {row["job"]: row for row in job_rows(make_read_engine(store_uri))}
    assert rows["71"]["gpus"] == 1 and rows["72"]["gpus"] is None and rows["72"]["idle_gpu_hours"] is None, rows
    (alice,) = totals(list(rows.values()), "user")
    assert alice["jobs"] == 2 and alice["gpu_hours"] == pytest.approx(1.0) and alice["gpus_unknown"] == 1, alice
