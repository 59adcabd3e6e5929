"""Slurm's accounting as radt reads it: `sacct --parsable2` rows into Jobs, and which GPUs each job had.

sacct keeps no GPU index; radt's PrologSlurmctld (examples/slurm/radt-gres-prolog.sh) copies them into the job's
AdminComment as `radt-gres=NODES>GRES;...`, which is read here, and `scontrol show job -d` gives them while a job runs.
"""

from __future__ import annotations

import re
import subprocess
from datetime import datetime
from typing import NamedTuple

from radt.errors import UserError

FIELDS = (
    "JobID",
    "JobIDRaw",
    "JobName",
    "User",
    "Account",
    "Partition",
    "Submit",
    "Start",
    "End",
    "State",
    "ExitCode",
    "NodeList",
    "AllocTRES",
    "AdminComment",
)
ENDED = {"COMPLETED": "FINISHED", "FAILED": "FAILED", "TIMEOUT": "FAILED", "OUT_OF_MEMORY": "FAILED", "NODE_FAIL": "FAILED", "BOOT_FAIL": "FAILED",
         "DEADLINE": "FAILED", "PREEMPTED": "KILLED", "CANCELLED": "KILLED", "REVOKED": "KILLED"}  # fmt: skip
_IDX = re.compile(r"IDX:([0-9,\-]*)\)")


class AccountingError(UserError, RuntimeError):
    """sacct cannot answer (no accounting, not installed) or gave a line radt cannot read; one line with the fix."""


class Job(NamedTuple):
    """One job (an array's task is a job of its own) as sacct keeps it."""

    job_id: str  # as users write it: 1234, or 1234_5 for an array's task
    raw_id: str
    name: str
    user: str
    account: str
    partition: str
    submit_ms: int | None
    start_ms: int | None
    end_ms: int | None
    state: str  # sacct's first word: COMPLETED, FAILED, CANCELLED, RUNNING, PENDING, TIMEOUT …
    exit_code: int
    signal: int
    nodes: tuple[str, ...]
    gpus_requested: int
    gpus: dict[str, tuple[int, ...]] | None  # node -> GPU indices; None: not known (no radt-gres in AdminComment)

    @property
    def array_job(self) -> str | None:
        """The array's id for an array task (1234 of 1234_5), else None."""
        head, _, task = self.job_id.partition("_")
        return head if task else None

    @property
    def status(self) -> str:
        """The MLflow run status this job's state means."""
        return ENDED.get(self.state, "RUNNING")


def _time_ms(text: str) -> int | None:
    if not text or text in ("Unknown", "None") or not text[:4].isdigit():
        return None
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Slurm's hostlist: 'gpu[01-03,07],login1' -> ('gpu01', 'gpu02', 'gpu03', 'gpu07', 'login1')."""
    hosts: list[str] = []
    for prefix, ranges, suffix, plain in re.findall(r"([^,\[]*)\[([^\]]*)\]([^,]*)|([^,\[\]]+)", text):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise AccountingError(f"node list '{text}' is not a Slurm hostlist radt can read")
            for n in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{n:0{len(lo)}d}{suffix}")
    return tuple(h for h in hosts if h and h != "None")


def _indices(text: str) -> tuple[int, ...]:
    """'gpu:2(IDX:0-1),gpu:1g.10gb:1(IDX:3)' -> (0, 1, 3); '' or 'gpu:0(IDX:)' -> ()."""
    found: set[int] = set()
    for group in _IDX.findall(text):
        for part in filter(None, group.split(",")):
            lo, _, hi = part.partition("-")
            found.update(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(found))


def gres_indices(comment: str) -> dict[str, tuple[int, ...]] | None:
    """node -> GPU indices from radt's `radt-gres=NODES>GRES;...` in an AdminComment; None where it holds none."""
    match = re.search(r"radt-gres=(\S*)", comment or "")
    if not match:
        return None
    out: dict[str, tuple[int, ...]] = {}
    for entry in filter(None, match.group(1).split(";")):
        nodes, _, gres = entry.partition(">")
        for node in expand_hostlist(nodes):
            out[node] = tuple(sorted(set(out.get(node, ())) | set(_indices(gres))))
    return out


def _gpus_requested(tres: str) -> int:
    for item in tres.split(","):
        name, _, value = item.partition("=")
        if name == "gres/gpu" and value.isdigit():
            return int(value)
    return 0


def parse_sacct(text: str) -> list[Job]:
    """Jobs from `sacct --parsable2 --noheader --allocations -o <FIELDS>` output; AccountingError names a line it cannot read."""
    jobs = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = line.split("|")
        if len(cells) < len(FIELDS):
            raise AccountingError(f"sacct line {number} has {len(cells)} fields, not {len(FIELDS)}: '{line[:120]}'; is this sacct's --parsable2 output?")
        row = dict(zip(FIELDS, cells[: len(FIELDS) - 1] + ["|".join(cells[len(FIELDS) - 1 :])], strict=True))  # AdminComment may hold a |
        code, _, sig = row["ExitCode"].partition(":")
        try:
            job = Job(
                job_id=row["JobID"],
                raw_id=row["JobIDRaw"],
                name=row["JobName"],
                user=row["User"],
                account=row["Account"],
                partition=row["Partition"],
                submit_ms=_time_ms(row["Submit"]),
                start_ms=_time_ms(row["Start"]),
                end_ms=_time_ms(row["End"]),
                state=(row["State"].split() or ["UNKNOWN"])[0],
                exit_code=int(code or 0),
                signal=int(sig or 0),
                nodes=expand_hostlist(row["NodeList"]),
                gpus_requested=_gpus_requested(row["AllocTRES"]),
                gpus=gres_indices(row["AdminComment"]),
            )
        except ValueError as exc:
            raise AccountingError(f"sacct line {number} cannot be read ({exc}): '{line[:120]}'") from None
        jobs.append(job)
    return jobs


def sacct(
    job_ids: list[str] | None = None, since: str | None = None, user: str | None = None, partition: str | None = None, account: str | None = None
) -> list[Job]:
    """The jobs sacct keeps (by id, or started since `since`, a time sacct takes: now-1days, 2026-11-26T00:00), without steps."""
    args = ["sacct", "--parsable2", "--noheader", "--allocations", "-o", ",".join(FIELDS)]
    if job_ids:
        args += ["-j", ",".join(job_ids)]
    if since:
        args += ["-S", since, "-E", "now"]
    elif job_ids:
        args += ["-S", "1970-01-02"]  # sacct shows only today's jobs unless told where to start
    if not (job_ids or user):
        args += ["--allusers"]
    for flag, value in (("-u", user), ("-r", partition), ("-A", account)):
        if value:
            args += [flag, value]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
        raise AccountingError("sacct not found on PATH; run radt import --slurm on a host of the cluster (Slurm's client commands installed)") from None
    except subprocess.TimeoutExpired:
        raise AccountingError("sacct did not answer in 300 s; check slurmdbd (sacctmgr list cluster) and import again") from None
    if done.returncode != 0:
        said = " ".join(done.stderr.split())[:300]
        if any(sign in said.lower() for sign in ("accounting storage is disabled", "accounting_storage/none", "supported accounting_storage", "slurmdbd")):
            raise AccountingError(
                f"Slurm keeps no accounting here ({said}); radt import --slurm needs slurmdbd (AccountingStorageType=accounting_storage/slurmdbd)"
            )
        raise AccountingError(f"sacct failed: {said or 'exit ' + str(done.returncode)}")
    return parse_sacct(done.stdout)
