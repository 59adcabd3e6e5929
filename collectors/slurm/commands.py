"""Slurm's commands as radt reads them: sinfo (partitions, nodes, GPU and MIG GRES), squeue, scontrol and sacct (job states).

A cluster without the commands or its controller is a SlurmError naming what to do."""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass, field

from radt.collectors._common import UsageError, first_line
from radt.collectors.experiment.collocation import MigProfile
from radt.collocation import MIG_PROFILE

PENDING_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SPECIAL_EXIT"}


ENDED_STATES = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED"}


KILLED_STATES = {"CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE", "REVOKED"}  # stopped from outside: KILLED, like Ctrl-C


class SlurmError(UsageError):
    """Slurm cannot be used from here (no commands, no controller) or refuses the CSV; the message says what to do."""


def slurm(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """One Slurm command; in its own session, so a Ctrl-C meant for radt does not kill an sbatch half-way."""
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, start_new_session=True, stdin=subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise SlurmError(f"--slurm needs Slurm's {args[0]} on PATH; run radt on a machine that submits to your cluster (a login node)") from exc
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(f"'{shlex.join(args[:3])}' did not answer in {timeout:.0f} s; check that slurmctld runs (scontrol ping)") from exc


@dataclass
class Node:
    name: str
    partitions: list[str]
    gpus: int  # whole GPUs
    slices: dict[str, int] = field(default_factory=dict)  # MIG slices per Slurm GRES type ('1g.5gb', 'a100_1g.5gb')
    mps: int = 0  # Slurm's mps GRES: shares of its GPUs (100 per GPU, as sites configure it)


@dataclass
class Offer:
    """What a partition offers beyond whole GPUs: its GRES type of each MIG profile, the mps GRES of one GPU (0: none)."""

    types: dict[str, str] = field(default_factory=dict)
    mps_per_gpu: int = 0


def gres_types(gres: str, name: str = "gpu") -> dict[str, int]:
    """Count per GRES type of `name` in sinfo's %G ('' for untyped): 'gpu:4', 'gpu:a100:4(S:0-1)', 'gpu:1g.5gb:7,gpu:3g.20gb:2', 'gpu:2,mps:200', '(null)'."""
    found: dict[str, int] = {}
    for item in re.sub(r"\([^)]*\)", "", gres).split(","):
        parts = item.strip().split(":")
        if parts[0] == name and len(parts) > 1 and parts[-1].isdigit():
            kind = ":".join(parts[1:-1])
            found[kind] = found.get(kind, 0) + int(parts[-1])
    return found


def type_profile(kind: str) -> str | None:
    """The MIG profile a Slurm GRES type names ('1g.5gb'; AutoDetect=nvml's 'a100_1g.5gb'), or None for a whole GPU's type."""
    tail = kind.rsplit("_", 1)[-1].lower()
    return tail if MIG_PROFILE.match(tail) else None


def cluster_nodes() -> tuple[list[Node], str | None]:
    """The cluster's nodes with their partitions and GPUs, and the default partition."""
    done = slurm(["sinfo", "-h", "-N", "-o", "%N|%P|%G"])
    if done.returncode != 0:
        raise SlurmError(f"sinfo failed ({first_line(done.stderr or done.stdout)}); check that slurmctld runs (scontrol ping)")
    nodes: dict[str, Node] = {}
    default = None
    for line in done.stdout.splitlines():
        if line.count("|") != 2:
            continue
        name, partition, gres = line.split("|")
        if partition.endswith("*"):
            partition = partition[:-1]
            default = partition
        node = nodes.setdefault(name, Node(name, [], 0))
        node.partitions.append(partition)
        types = gres_types(gres)
        node.gpus = max(node.gpus, sum(n for kind, n in types.items() if type_profile(kind) is None))
        node.slices = {kind: n for kind, n in types.items() if type_profile(kind)} or node.slices
        node.mps = max(node.mps, sum(gres_types(gres, "mps").values()))
    return list(nodes.values()), default


@dataclass
class JobState:
    state: str  # Slurm's: PENDING, RUNNING, COMPLETED, CANCELLED, ...; "" when Slurm no longer knows the job
    node: str = ""
    reason: str = ""


def job_states(jobs: list[str]) -> dict[str, JobState]:
    """Slurm's state of each job it still knows (squeue keeps ended jobs for MinJobAge); sacct for the others where it can."""
    if not jobs:
        return {}
    done = slurm(["squeue", "-h", "-t", "all", "-j", ",".join(jobs), "-o", "%i|%T|%N|%r"])
    if done.returncode != 0 and "Invalid job id" not in done.stderr:
        raise SlurmError(f"squeue failed ({first_line(done.stderr or done.stdout)}); check that slurmctld runs (scontrol ping)")
    found = {}
    for line in done.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 4 and parts[0] in jobs:
            found[parts[0]] = JobState(parts[1], parts[2], parts[3])
    forgotten = [j for j in jobs if j not in found]
    if forgotten:
        found.update(accounted_states(forgotten))
    return found


def accounted_states(jobs: list[str]) -> dict[str, JobState]:
    """From sacct, for jobs squeue has forgotten; {} where the cluster keeps no accounting."""
    try:
        done = slurm(["sacct", "-n", "-X", "-P", "-j", ",".join(jobs), "-o", "JobID,State,NodeList"])
    except SlurmError:
        return {}
    if done.returncode != 0:
        return {}  # "Slurm accounting storage is disabled": the job's own result file is all there is
    found = {}
    for line in done.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[0] in jobs:
            found[parts[0]] = JobState(parts[1].split()[0] if parts[1].split() else "", parts[2])
    return found


class AnyProfiles(dict):
    """Every MIG profile, with room for the most instances a GPU has: the node checks the real ones when the job starts."""

    def __contains__(self, name: object) -> bool:
        return True

    def __missing__(self, name: str) -> MigProfile:
        return MigProfile(name, 0, 7, 7)
