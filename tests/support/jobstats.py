"""Princeton's jobstats summary as its slurmctld epilog stores it in a job's AdminComment, built the way jobstats builds it
(github.com/PrincetonUniversity/jobstats: jobstats.py's get_data_out, __str__ and report_job_json; slurm/slurmctldepilog.sh).

jobstats keeps, per node (the host of the exporter's `instance` label), what it asked Prometheus at the job's end:
total_memory, used_memory, total_time (CPU seconds), cpus, and per GPU (its exporter's `minor_number`) gpu_total_memory,
gpu_used_memory, gpu_utilization; each value trimmed as get_data_out trims Prometheus' text. `jobstats -f -b` prints
{"nodes", "total_time", "gpus"} as compact JSON, gzipped and base64-encoded (or Short / None), and the epilog stores it
with `sacctmgr -i update job where jobid=N set AdminComment=JS1:<that>`.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import subprocess

from tests.support import slurmacct


def value(text: str) -> int | float:
    """A Prometheus value's text as jobstats keeps it (get_data_out): one decimal where it has a point, else an int."""
    return round(float(text), 1) if "." in text else int(text)


def node(cpus: str, cpu_seconds: str, memory_used: str, memory_total: str, gpus: dict[int, tuple[str, str, str]]) -> dict:
    """One node's entry, its keys in the order jobstats asks for them (get_job_stats); `gpus`: minor number ->
    (utilization %, memory used, memory total) as Prometheus answered them."""
    entry: dict = {"total_memory": value(memory_total), "used_memory": value(memory_used), "total_time": value(cpu_seconds), "cpus": value(cpus)}
    if gpus:
        entry["gpu_total_memory"] = {str(g): value(total) for g, (_util, _used, total) in gpus.items()}
        entry["gpu_used_memory"] = {str(g): value(used) for g, (_util, used, _total) in gpus.items()}
        entry["gpu_utilization"] = {str(g): value(util) for g, (util, _used, _total) in gpus.items()}
    return entry


def admin_comment(nodes: dict[str, dict], total_time: int, gpus: int) -> str:
    """The AdminComment jobstats' epilog writes: JS1: and `jobstats -b`'s base64 of the gzipped compact JSON."""
    data = json.dumps({"nodes": nodes, "total_time": total_time, "gpus": gpus}, separators=(",", ":"))
    return "JS1:" + base64.b64encode(gzip.compress(data.encode("ascii"))).decode("ascii")


def store(job: str, comment: str) -> None:
    """What the epilog does with it: sacctmgr writes the AdminComment of an ended job into Slurm's accounting (which
    sacctmgr before Slurm 23.02 lowercases, SchedMD bug 14338: the tests' Debian 12 Slurm is 22.05)."""
    done = subprocess.run(
        ["sacctmgr", "-i", "update", "job", "where", f"jobid={job}", "set", f"AdminComment={comment}"],
        env=slurmacct.env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr or done.stdout


def sacctmgr_keeps_case() -> bool:
    """Whether this Slurm's sacctmgr stores an AdminComment as given: from 23.02 on (SchedMD bug 14338, by jobstats' author)."""
    said = subprocess.run(["sacctmgr", "-V"], env=slurmacct.env(), capture_output=True, text=True, timeout=30).stdout
    found = re.search(r"(\d+)\.(\d+)", said)
    assert found, said
    return (int(found.group(1)), int(found.group(2))) >= (23, 2)
