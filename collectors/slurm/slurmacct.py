"""Slurm's accounting as radt reads it: `sacct --parsable2` rows into Jobs, and which GPUs each job had.

sacct keeps no GPU index; `scontrol show job -d` gives them while a job runs, and a job's AdminComment, which sacct keeps,
may hold them: radt's PrologSlurmctld (examples/slurm/radt-gres-prolog.sh) writes `radt-gres=NODES>GRES;...`, a site's
prolog may copy Slurm's own `GRES=gpu:2(IDX:0-1)` there, and Princeton's jobstats replaces it at the job's end with its
summary (JS1:), which names each node's GPUs and their figures over the job (admincomment.py reads all three).
Where Slurm keeps no accounting (no slurmdbd), `scontrol -o -d show job` gives the jobs slurmctld still holds: those
running, and those ended within its MinJobAge.
"""

from __future__ import annotations

import re
import secrets
import subprocess
from datetime import datetime
from typing import NamedTuple

from radt.collectors.slurm.admincomment import RADT_GRES, Summary, gpu_indices, hostlist
from radt.collectors.slurm.admincomment import read as read_admin
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


ADMIN_COMMENT = RADT_GRES  # Job.gpus_from: radt's prolog wrote the GPUs into the job's AdminComment (admincomment.py: the others)
SCONTROL = "scontrol"  # Job.gpus_from: scontrol's GRES of each node while the job runs


class AccountingError(UserError, RuntimeError):
    """sacct cannot answer (no accounting, not installed) or gave a line radt cannot read; one line with the fix."""


class NoAccounting(AccountingError):
    """This Slurm keeps no accounting (no slurmdbd): only scontrol can say which jobs run."""


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
    gpus_requested: int | None  # None: not known (Slurm's TRES count no GPU here, and nothing else said how many)
    gpus: dict[str, tuple[int, ...]] | None  # node -> GPU indices; None: not known (none in its AdminComment, not running)
    gpus_from: str = ""  # where `gpus` came from: ADMIN_COMMENT (or admincomment.py's others), SCONTROL, or what radt import --slurm found them by
    unread: str = ""  # why scontrol's record gave no GPUs though it may hold some (its name or comment holds Slurm's field names)
    summary: Summary | None = None  # jobstats' summary in its AdminComment: figures over the whole job, not series
    admin_note: str = ""  # where its AdminComment gave no GPU: what was looked for there and what it held

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
    try:
        return hostlist(text)
    except ValueError as exc:
        raise AccountingError(str(exc)) from None


_indices = gpu_indices  # 'gpu:2(IDX:0-1),gpu:1g.10gb:1(IDX:3)' -> (0, 1, 3): Slurm's GRES text of a node


def _tres_gpus(tres: str) -> int | None:
    """The GPUs a TRES list counts (AllocTRES, TRES, CfgTRES: 'cpu=8,gres/gpu=4,node=1' -> 4); None where it holds no
    gres/gpu: no GPU where Slurm counts GPUs in TRES (gpus_counted), and nothing said where it does not."""
    for item in tres.split(","):
        name, _, value = item.partition("=")
        if name == "gres/gpu" and value.isdigit():
            return int(value)
    return None


def _requested(tres: str, gpus: dict[str, tuple[int, ...]] | None, counted: bool | None) -> int | None:
    """A job's GPUs from sacct: its AllocTRES' gres/gpu; where they hold none, the GPUs radt's prolog recorded; else 0
    where Slurm counts GPUs in TRES, and not known (None) where it does not or cannot say (gpus_counted)."""
    found = _tres_gpus(tres)
    if found is not None:
        return found
    if gpus and any(gpus.values()):
        return sum(len(indices) for indices in gpus.values())
    return 0 if counted else None


def gpus_counted() -> bool | None:
    """Whether Slurm counts each job's GPUs in its TRES (gres/gpu in AccountingStorageTRES, which is not Slurm's
    default): where it does not, a job's TRES without gres/gpu say nothing of its GPUs. None where slurmctld cannot say."""
    try:
        done = _run(["scontrol", "show", "config"], 60, "slurmctld (scontrol ping)")
    except AccountingError:
        return None
    found = re.search(r"^AccountingStorageTRES\s*=\s*(\S*)", done.stdout, re.MULTILINE) if done.returncode == 0 else None
    return None if found is None else "gres/gpu" in found.group(1).split(",")


def parse_sacct(text: str, delimiter: str = "|", gpus_counted: bool | None = True) -> list[Job]:
    """Jobs from `sacct --parsable2 --noheader --allocations --delimiter=D -o <FIELDS>` output; AccountingError names a job it cannot read.

    A job name is any text its user gave (`sbatch -J`): with sacct's own `|` between fields, `a|alice|bigacct|...` is a
    job of alice's with the GPUs it claims. sacct() therefore asks for a delimiter drawn for each call, which no name
    submitted earlier can hold; and jobs are read by their fields, not their lines, since a name may hold a line break.
    `gpus_counted`: whether a job whose AllocTRES hold no gres/gpu had none (gpus_counted())."""
    jobs = []
    for number, row in enumerate(_records(text, delimiter), 1):
        code, _, sig = row["ExitCode"].partition(":")
        try:
            if not row["JobIDRaw"].isdigit():
                raise ValueError(f"JobIDRaw {row['JobIDRaw'][:40]!r} is not a number")
            nodes = expand_hostlist(row["NodeList"])
            admin = read_admin(row["AdminComment"], nodes)
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
                nodes=nodes,
                gpus_requested=_requested(row["AllocTRES"], admin.gpus, gpus_counted),
                gpus=admin.gpus,
                gpus_from=admin.source if admin.gpus else "",
                summary=admin.summary,
                admin_note=admin.note,
            )
        except ValueError as exc:
            raise AccountingError(f"sacct's job {number} cannot be read ({exc}): '{delimiter.join(row.values())[:120]}'") from None
        jobs.append(job)
    return jobs


def _records(text: str, delimiter: str) -> list[dict[str, str]]:
    """sacct's output as one dict per job: the first fields are the pieces between delimiters (a line break in one is
    text), the last (AdminComment, which may hold the delimiter) runs to the line break before the next job's id."""
    records: list[dict[str, str]] = []
    cells: list[str] = []
    last: str | None = None
    for piece in text.strip("\n").split(delimiter) if text.strip() else []:
        if len(cells) < len(FIELDS) - 1:
            cells.append(piece)
            continue
        last = piece if last is None else f"{last}{delimiter}{piece}"
        if "\n" in piece:  # the end of this job's last field, and the next job's id (which holds no line break)
            end, _, first = last.rpartition("\n")
            records.append(dict(zip(FIELDS, [*cells, end], strict=True)))
            cells, last = [first], None
    if len(cells) == 1 and last is None and records:  # no job's id: the last job's AdminComment went on past a line break
        records[-1]["AdminComment"] += f"\n{cells.pop()}"
    if cells:
        if len(cells) < len(FIELDS) - 1 or last is None:
            line = delimiter.join(cells)[:120]
            raise AccountingError(f"sacct's job {len(records) + 1} has {len(cells)} fields, not {len(FIELDS)}: '{line}'; is this sacct's --parsable2 output?")
        records.append(dict(zip(FIELDS, [*cells, last], strict=True)))
    return records


def _run(args: list[str], timeout: int, check: str) -> subprocess.CompletedProcess:
    """A Slurm client command; AccountingError in one line where it is not installed or does not answer (`check` says what to look at)."""
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise AccountingError(f"{args[0]} not found on PATH; run radt import --slurm on a host of the cluster (Slurm's client commands installed)") from None
    except subprocess.TimeoutExpired:
        raise AccountingError(f"{args[0]} did not answer in {timeout} s; check {check} and import again") from None


def sacct(
    job_ids: list[str] | None = None, since: str | None = None, user: str | None = None, partition: str | None = None, account: str | None = None
) -> list[Job]:
    """The jobs sacct keeps (by id, or started since `since`, a time sacct takes: now-1days, 2026-11-26T00:00), without steps."""
    delimiter = f"|{secrets.token_hex(8)}|"  # no job name submitted before this call holds it (parse_sacct)
    args = ["sacct", "--parsable2", "--noheader", "--allocations", f"--delimiter={delimiter}", "-o", ",".join(FIELDS)]
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
    done = _run(args, 300, "slurmdbd (sacctmgr list cluster)")
    if done.returncode != 0:
        said = " ".join(done.stderr.split())[:300]
        if any(sign in said.lower() for sign in ("accounting storage is disabled", "accounting_storage/none", "supported accounting_storage", "slurmdbd")):
            raise NoAccounting(
                f"Slurm keeps no accounting here ({said}); radt import --slurm needs slurmdbd (AccountingStorageType=accounting_storage/slurmdbd)"
            )
        raise AccountingError(f"sacct failed: {said or 'exit ' + str(done.returncode)}")
    return parse_sacct(done.stdout, delimiter, gpus_counted())


# --- scontrol: the jobs slurmctld holds, and the GPUs of a running job ---------------------------------------------


def _pairs(line: str) -> list[tuple[str, str]]:
    """`scontrol -o` fields in order (a key may repeat: each node's Nodes= ... GRES=); a word without '=' belongs to the
    value before it (a job name with spaces)."""
    pairs: list[tuple[str, str]] = []
    for word in line.split():
        key, eq, value = word.partition("=")
        if eq and re.fullmatch(r"[A-Za-z][A-Za-z_:/]*", key):
            pairs.append((key, value))
        elif pairs:
            pairs[-1] = (pairs[-1][0], f"{pairs[-1][1]} {word}")
    return pairs


DETAIL_KEYS = {"Nodes", "CPU_IDs", "Mem", "GRES"}  # `-d`'s fields of each node: the only ones Slurm prints more than once


class _Record(NamedTuple):
    """One job's `scontrol -o -d show job` text cut where the job's owner cannot write: the name (whatever it holds, line
    breaks included), the fields Slurm writes (ids, state, nodes, each node's GPUs), and those from Command= on (the
    script, its folder, comments, output paths: the owner's words, with AdminComment among them)."""

    head: dict[str, str]  # JobId and the array's fields, before the name
    name: str
    middle: list[tuple[str, str]]  # from UserId= to the first Command= after it
    tail: list[tuple[str, str]]  # from Command= on
    forged: str  # why the record cannot be read unambiguously (a name or comment holding Slurm's field names), else ""


class Held(NamedTuple):
    """What squeue says of a job slurmctld holds, from fields Slurm writes and the name last (_held): the job's exact name,
    which cuts its scontrol record where Slurm's fields start, and the GPUs its request asks for (None: not known)."""

    name: str
    gpus: int | None


# squeue's fields for Held: Slurm's own (no spaces, no '|', no line break), then the name, which runs to the output's end
HELD_FORMAT = "tres-per-job:0|,tres-per-node:0|,tres-per-task:0|,tres-per-socket:0|,numnodes:0|,numtasks:0|,name:0"


def _gres_gpus(text: str) -> int | None:
    """The GPUs a TresPer* request names ('gres:gpu:2', 'gres/gpu:a100:2', 'gres:gpu:1,gres:mps:100' -> 2, 2, 1); None
    where it names none ('N/A', 'gres:mps:100')."""
    total = None
    for item in text.replace("gres/", "gres:").replace("=", ":").split(","):
        parts = item.split(":")
        if len(parts) >= 2 and parts[:2] == ["gres", "gpu"]:
            total = (total or 0) + (int(parts[-1]) if len(parts) > 2 and parts[-1].isdigit() else 1)
    return total


def _asked_gpus(per_job: str, per_node: str, per_task: str, per_socket: str, nodes: str, tasks: str) -> int | None:
    """The GPUs a job's request gives it at least (--gpus, --gres / --gpus-per-node times its nodes, --gpus-per-task times
    its tasks): the largest; 0 where it asks for none; None where only a per-socket count says (its sockets unknown)."""
    counts = [_gres_gpus(per_job)]
    counts += [_gres_gpus(per_node) * int(nodes)] if _gres_gpus(per_node) is not None and nodes.isdigit() else [None]
    counts += [_gres_gpus(per_task) * int(tasks)] if _gres_gpus(per_task) is not None and tasks.isdigit() else [None]
    known = [c for c in counts if c is not None]
    if known:
        return max(known)
    return None if _gres_gpus(per_socket) is not None or any(_gres_gpus(t) is not None for t in (per_node, per_task)) else 0


def _held(raw: str) -> Held | None:
    """squeue's Held for the job whose raw id is `raw`; None where slurmctld no longer holds it or its answer is not one
    record."""
    done = _run(["squeue", "-h", "--states=all", "-j", raw, "-O", HELD_FORMAT], 60, "slurmctld (scontrol ping)")
    if _failed("squeue", done):
        return None
    text = done.stdout[:-1] if done.stdout.endswith("\n") else done.stdout
    parts = text.split("|", 6)
    if len(parts) != 7 or any("\n" in part for part in parts[:6]):
        return None
    return Held(parts[6], _asked_gpus(*parts[:6]))


def requested_gpus(job: Job) -> int | None:
    """The GPUs `job` asked for, where slurmctld still holds it (running, or ended within MinJobAge) under its name; None
    otherwise."""
    try:
        held = _held(job.raw_id)
    except AccountingError:
        return None
    return held.gpus if held is not None and held.name == job.name else None


def _record(text: str, held: Held | None = None) -> _Record:
    """A job's record cut after its name and at the first ' Command=' after it. With the job's exact name from squeue
    (`held`) the name is cut off whatever it holds; without it, at the first ' UserId=', and where the name holds
    ' UserId=' the middle starts inside it and then holds a key twice: `forged` says so, and no GPU is taken from it."""
    before, sep, rest = text.partition(" JobName=")
    if sep and held is not None and rest.startswith(f"{held.name} UserId="):
        name, sep_user, rest = held.name, " UserId=", rest[len(held.name) + len(" UserId=") :]
    else:
        name, sep_user, rest = rest.partition(" UserId=") if sep else ("", "", "")
    middle_text, sep_cmd, tail_text = rest.partition(" Command=")
    head = dict(_pairs(before))
    middle = _pairs("UserId=" + middle_text) if sep_user else []
    tail = _pairs("Command=" + tail_text) if sep_cmd else []
    keys = [key for key, _ in middle if key not in DETAIL_KEYS]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    forged = ""
    if not sep or not sep_user:
        forged = "its line has no JobName= or UserId="
    elif repeated:
        forged = f"its name holds Slurm's field names ({', '.join(repeated[:3])} twice)"
    return _Record(head, name, middle, tail, forged)


_DETAIL = {key.lower() for key in DETAIL_KEYS}


def _admin_comments(tail: list[tuple[str, str]]) -> list[str]:
    """The text of each AdminComment= in a record's tail, with the fields of a node's detail that follow it: a site's prolog
    may copy scontrol -d's `Nodes=n1 CPU_IDs=0-3 Mem=1024 GRES=gpu:2(IDX:0-1)` there, which _pairs cut into fields of their
    own, and Slurm prints none of those after the AdminComment (SystemComment, Comment, StdErr ... follow it)."""
    found: list[str] = []
    inside = False
    for key, value in tail:
        if key == "AdminComment":
            found.append(value)
            inside = True
        elif inside and key.lower() in _DETAIL:
            found[-1] = f"{found[-1]} {key}={value}"
        else:
            inside = False
    return found


def _inconsistent(commented: dict[str, tuple[int, ...]] | None, nodes: tuple[str, ...], gpus: int) -> str:
    """Why an AdminComment's GPUs, read from scontrol's text, cannot be the job's: a node the job did not run on, or
    another number of GPUs than Slurm gave it (its TRES, else its request). (On a cluster without radt's prolog there is no real AdminComment, and one
    in the job's folder name or comment would be read as if it were.)"""
    if not commented:
        return ""
    if not set(commented) <= set(nodes) or (gpus and sum(len(found) for found in commented.values()) != gpus):  # 0: TRES counts no gres/gpu (shards)
        return "its AdminComment names other nodes or another number of GPUs than Slurm gave the job"
    return ""


def parse_scontrol(line: str, held: Held | None = None) -> Job:
    """A Job from `scontrol -o -d show job`'s record of one job: its GPU indices per node from the GRES of each node's
    detail (while it runs), else from its AdminComment (admincomment.read); how many from its TRES, else those indices, else its request
    (`held`, squeue's: a Slurm whose TRES count no GPU gave every job 0).

    The record is read where the job's owner cannot write (_record): a name or comment holding `Nodes=... GRES=...` once
    gave the job GPUs it never had, and a name holding `UserId=` hid the GPU it had. A record that cannot be read
    unambiguously keeps its facts but no GPU indices."""
    record = _record(line, held)
    fields = dict(record.middle)
    gpus: dict[str, tuple[int, ...]] = {}
    nodes: tuple[str, ...] = ()
    for key, value in record.middle:
        if key == "Nodes":
            nodes = expand_hostlist(value)
        elif key == "GRES" and nodes:
            for node in nodes:
                gpus[node] = tuple(sorted(set(gpus.get(node, ())) | set(_indices(value))))
    raw = record.head.get("JobId", "")
    task = record.head.get("ArrayTaskId", "")
    job_id = f"{record.head['ArrayJobId']}_{task}" if record.head.get("ArrayJobId") and task.isdigit() else raw
    code, _, sig = fields.get("ExitCode", "0:0").partition(":")
    listed, tres = expand_hostlist(fields.get("NodeList", "")), _tres_gpus(fields.get("TRES", ""))
    asked = held.gpus if held is not None else None  # squeue's, where the TRES count no GPU
    comments = _admin_comments(record.tail)
    admin = read_admin(comments[0] if len(comments) == 1 else "", listed)
    commented = admin.gpus if len(comments) == 1 else None
    forged = record.forged
    if not forged and not any(gpus.values()):  # the nodes' GRES while it runs win; after it, only a consistent AdminComment
        if len(comments) > 1:
            forged = "its script, folder or comment holds an AdminComment="
        else:
            forged = _inconsistent(commented, listed, (tres if tres is not None else asked) or 0)
    if forged:
        gpus, commented, admin = {}, None, admin._replace(summary=None)
    given = gpus if any(gpus.values()) else commented or {}
    requested = tres if tres is not None else sum(len(found) for found in given.values()) or asked
    try:
        return Job(
            job_id=job_id,
            raw_id=raw,
            name=record.name,
            user=fields.get("UserId", "").partition("(")[0],
            account=fields.get("Account", ""),
            partition=fields.get("Partition", ""),
            submit_ms=_time_ms(fields.get("SubmitTime", "")),
            start_ms=_time_ms(fields.get("StartTime", "")),
            end_ms=_time_ms(fields.get("EndTime", "")) if fields.get("JobState") != "RUNNING" else None,
            state=fields.get("JobState", "UNKNOWN"),
            exit_code=int(code or 0),
            signal=int(sig or 0),
            nodes=listed,
            gpus_requested=requested,
            gpus=gpus if any(gpus.values()) else commented,
            gpus_from=SCONTROL if any(gpus.values()) else admin.source if commented else "",
            unread=forged,
            summary=admin.summary,
            admin_note="" if any(gpus.values()) or commented else admin.note,
        )
    except ValueError as exc:
        raise AccountingError(f"scontrol's line for job {raw or '?'} cannot be read ({exc}): '{line[:120]}'") from None


def _failed(tool: str, done: subprocess.CompletedProcess) -> bool:
    """Whether slurmctld's `tool` answered that it holds no such job; AccountingError with its words for any other failure."""
    if done.returncode == 0:
        return False
    if "invalid job id" in done.stderr.lower():
        return True
    raise AccountingError(f"{tool} failed: {' '.join(done.stderr.split())[:300] or 'exit ' + str(done.returncode)}")


def _raw_ids(target: str | None, narrowed: list[str]) -> list[str]:
    """The raw job ids slurmctld holds for `target` (a job, an array, or None: every job that has started), one per record:
    a job's name or comment may hold line breaks and text that looks like another job's record, so each job is asked for
    on its own. `narrowed`: squeue's -u/-p/-A, so a busy cluster's other jobs are not asked for."""
    args = ["squeue", "-h", "--states=all", "-o", "%A %T", *narrowed] + (["-j", target] if target else [])
    done = _run(args, 60, "slurmctld (scontrol ping)")
    if _failed("squeue", done):
        return []
    rows = [line.split() for line in done.stdout.splitlines()]
    return list(dict.fromkeys(row[0] for row in rows if len(row) == 2 and row[0].isdigit() and (target or row[1] != "PENDING")))


def scontrol_jobs(job_ids: list[str] | None = None, user: str | None = None, partition: str | None = None, account: str | None = None) -> list[Job]:
    """The jobs slurmctld holds (running, or ended within MinJobAge), by id or all of them; an id it does not hold is left out."""
    records: list[tuple[str, Held | None]] = []
    narrowed: list[str] = []
    for flag, value in (("-u", user), ("-p", partition), ("-A", account)):
        narrowed += [flag, value] if value else []
    for target in job_ids or [None]:
        for raw in _raw_ids(target, narrowed):
            held = _held(raw)  # before scontrol: a job that ends in between still has its name and request
            done = _run(["scontrol", "-o", "-d", "show", "job", raw], 60, "slurmctld (scontrol ping)")
            _failed("scontrol", done)
            text = done.stdout.rstrip("\n")
            if text.startswith(f"JobId={raw} "):
                records.append((text, held))  # one job's record, line breaks of its name or comment included
    jobs = [parse_scontrol(text, held) for text, held in records]
    wanted = {"user": user, "partition": partition, "account": account}
    return [j for j in jobs if all(not v or getattr(j, k) == v for k, v in wanted.items())]


def running_gpus(job: Job) -> dict[str, tuple[int, ...]] | None:
    """node -> GPU indices of a job while it runs (`scontrol -o -d show job`'s GRES per node); None once slurmctld no
    longer says (ended, or scontrol unreachable)."""
    try:
        found = scontrol_jobs([job.raw_id or job.job_id])
    except AccountingError:
        return None
    for other in found:
        if other.raw_id == job.raw_id and other.state == "RUNNING" and other.gpus and any(other.gpus.values()):
            return other.gpus
    return None


def node_gpus(node: str) -> int | None:
    """How many GPUs a node has as Slurm configures it (`scontrol show node`'s CfgTRES gres/gpu); None where it cannot say."""
    try:
        done = _run(["scontrol", "-o", "show", "node", node], 60, "slurmctld (scontrol ping)")
    except AccountingError:
        return None
    for line in done.stdout.splitlines():
        fields = dict(_pairs(line))
        if fields.get("NodeName") == node:
            return _tres_gpus(fields.get("CfgTRES", "")) or None
    return None
