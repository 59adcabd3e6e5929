"""`radt experiment.csv --slurm`: each workload one Slurm job, run on its node by the same WorkloadRunner.

The submitter checks the CSV against the cluster (sinfo: partitions, GPUs and MIG GRES types per node), submits
one sbatch job per workload asking `--gres=gpu:N` for its GPUs and `gpu:<profile>:<n>` for its MIG rows (as
clusters offer MIG: slices an admin made, scheduled as GRES types), writes SlurmJob and the rows' statuses into the CSV, and watches
the jobs (squeue, scontrol; sacct where the cluster keeps accounting) until they end. Ctrl-C scancels
them; any other end of the submitter (SIGTERM, a closed terminal, SIGKILL) leaves them running, and the
same command picks them up again instead of submitting them twice.

On the node the job runs `radt --slurm-rows LINES experiment.csv`: exactly that workload, through
scheduler.WorkloadRunner (start gate, MPS set-up and tear-down, parent run) on the GPUs and MIG slices Slurm
assigned; it never creates or destroys a MIG instance. Its statuses go to slurm/<job id>.json next to the
CSV; only the submitter writes the CSV itself. Devices is not a physical index under Slurm.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from radt import settings
from radt.collectors.collocation import MIG_PROFILE, MigInstance, MigProfile, MpsDaemon, Setup
from radt.collectors.command import UsageError, first_line
from radt.collectors.experiment import ExperimentFile, Machine, Row, Workload, parse_devices_cell, plan
from radt.collectors.proctree import catch_stops
from radt.collectors.scheduler import ExperimentOptions, WorkloadRunner, describe
from radt.errors import report
from radt.rundir import write_whole

if TYPE_CHECKING:
    from radt.collectors import gpus

JOB_COLUMN = "SlurmJob"
FOLDER = "slurm"  # next to the CSV: the job scripts, the jobs' output (<workload>-<job>.out) and results (<job>.json)
CANCEL_WAIT = 120.0  # seconds for cancelled jobs to end before their rows are written KILLED anyway
FINAL = ("FINISHED", "FAILED", "KILLED")
PENDING_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
ENDED_STATES = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED"}
KILLED_STATES = {"CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE", "REVOKED"}  # stopped from outside: KILLED, like Ctrl-C
MPS_PIPE_DIRECTORY, MPS_LOG_DIRECTORY = "/tmp/nvidia-mps", "/var/log/nvidia-mps"  # NVIDIA's defaults: a site's daemon where it set none
DEVICES_NOTE = (
    "Under Slurm, Devices is not a physical GPU index: a workload's Devices are numbered onto the GPUs Slurm gives its job "
    "(0+1 and 2+3 both ask for two), and each MIG row runs on a slice of its profile that Slurm assigns (--gres=gpu:<profile>:<n>)"
)


class SlurmError(UsageError):
    """Slurm cannot be used from here (no commands, no controller) or refuses the CSV; the message says what to do."""


@dataclass
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    sbatch: list[str] = field(default_factory=list)  # further sbatch options, passed as they are, after radt's own

    def args(self) -> list[str]:
        """The user's sbatch options: radt's defaults come before them, so these win."""
        given = [f"--partition={self.partition}" if self.partition else "", f"--account={self.account}" if self.account else ""]
        return [a for a in given if a] + ([f"--time={self.time}"] if self.time else []) + self.sbatch

    def wanted_partition(self) -> str | None:
        """The partition the jobs will go to, as far as the options say (--slurm-partition, or -p/--partition in --sbatch)."""
        found = self.partition
        args = self.sbatch
        for number, arg in enumerate(args):
            if arg in ("-p", "--partition") and number + 1 < len(args):
                found = args[number + 1]
            elif arg.startswith("--partition="):
                found = arg.split("=", 1)[1]
            elif arg.startswith("-p") and len(arg) > 2:
                found = arg[2:]
        return found


# --- Slurm's commands ----------------------------------------------------------------------------


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


# --- the job script ------------------------------------------------------------------------------

LINE_ENDS = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL byte"}  # what no shell quoting makes safe in a script's line


def line_end(value: str) -> str:
    """'a newline' (or a carriage return, a NUL byte) where `value` holds one, else ''."""
    return next((name for char, name in LINE_ENDS.items() if char in value), "")


def output_pattern(path: Path) -> str:
    """`path` in sbatch's --output, where `%` starts a replacement (a folder `runs%j` would become `runs1234`): each one doubled."""
    return str(path).replace("%", "%%")


def job_command(opts: ExperimentOptions, lines: list[int], csv: str, python: str = sys.executable) -> list[str]:
    """The radt command line a job runs on its node: exactly the workload of these CSV rows."""
    args = [python, "-m", "radt", "--store", opts.store, "--interval", str(opts.interval), "--flush-timeout", str(opts.flush_timeout)]
    if opts.max_epoch is not None:
        args += ["--max-epoch", str(opts.max_epoch)]
    if opts.max_time is not None:
        args += ["--max-time", str(opts.max_time)]
    return args + ["--slurm-rows", ",".join(map(str, lines)), csv]


def job_script(command: list[str], cwd: str, label: str, lines: list[int], csv: str) -> str:
    """The sbatch script of one workload. Every value is shell-quoted; the comment shows line ends escaped, so no
    value starts a line of its own (script_problems refuses them before anything is submitted all the same).
    No #SBATCH lines: sbatch gets its options as arguments."""
    comment = f"workload {shlex.quote(label)} (rows {', '.join(map(str, lines))}) of {shlex.quote(csv)}"
    for char in LINE_ENDS:
        comment = comment.replace(char, repr(char)[1:-1])
    return (
        "#!/bin/sh\n"
        f"# radt experiment.csv --slurm: {comment}\n"
        f"cd {shlex.quote(cwd)} || exit 1\n"  # where radt was started, as for a local experiment (relative paths, a relative store)
        f"exec {shlex.join(command)}\n"
    )


def script_problems(csv: Path, store: str, slurm_opts: SlurmOptions, python: str = sys.executable) -> list[str]:
    """What would put a line end into a job script or sbatch's arguments: the CSV's path, the folder radt runs in,
    radt's Python, the store, the Slurm options; one line each, the value shown escaped (the store's not: it may hold a password)."""
    path, cwd = str(csv.resolve()), os.getcwd()
    checks = [
        (path, f"the CSV's path {path!r}", "rename the file (or its folder) without it"),
        (cwd, f"the current folder {cwd!r}", "run radt from a folder whose path has none"),
        (python, f"radt's Python {python!r}", "install radt in a folder whose path has none"),
        (store, "the tracking URI (--store or MLFLOW_TRACKING_URI)", "give the URI without it"),
    ]
    options = [("--slurm-partition", slurm_opts.partition), ("--slurm-account", slurm_opts.account), ("--slurm-time", slurm_opts.time)]
    checks += [(value, f"{flag} {value!r}", "give it without") for flag, value in options if value]
    checks += [(arg, f"the --sbatch option {arg!r}", "give it without") for arg in slurm_opts.sbatch]
    problems = [f"{what} has {line_end(value)}, which cannot go into a Slurm job; {fix}" for value, what, fix in checks if line_end(value)]
    if "\\" in path and not line_end(path):  # sbatch reads a backslash in --output as "replace nothing": every job would write one file
        problems.append(
            f"the CSV's path {path!r} has a backslash, which cannot go into a Slurm job; rename the file (or its folder) without it "
            "(sbatch's --output reads a backslash as: replace nothing)"
        )
    return problems


def name_problems(exp: ExperimentFile, workloads: list[Workload]) -> list[str]:
    """A workload whose Experiment or Workload cell holds a line end: its name goes into the job script's comment."""
    problems = []
    for workload in workloads:
        for column, value in (("Experiment", workload.experiment), ("Workload", workload.name)):
            if line_end(value):
                rows = ", ".join(str(r.row.line) for r in workload.runs)
                problems.append(
                    f"{exp.path.name} rows {rows}: {column} {value!r} has {line_end(value)}, which cannot go into a Slurm job; remove it from the cell"
                )
    return problems


# --- the submitter -------------------------------------------------------------------------------


@dataclass
class Job:
    workload: Workload
    slug: str  # the workload in file names: <experiment>-<workload>
    id: str = ""
    state: str = ""  # the rows' status as last written: PENDING, RUNNING, FINISHED, FAILED, KILLED
    cancelled: bool = False
    adopted: bool = False  # found in squeue by its comment, its id not yet in the CSV

    @property
    def rows(self) -> list[Row]:
        return [r.row for r in self.workload.runs]


class Submitter:
    """Submits the workloads, then watches their jobs and writes what Slurm and the jobs say into the CSV."""

    def __init__(self, opts: ExperimentOptions, slurm_opts: SlurmOptions, exp: ExperimentFile, offer: Offer | None = None) -> None:
        self.opts = opts
        self.slurm_opts = slurm_opts
        self.exp = exp
        self.offer = offer or Offer()  # unknown (--dry-run without Slurm): MIG profiles as the CSV names them, no mps GRES
        self.folder = exp.path.resolve().parent / FOLDER
        self.interrupt = 0  # Ctrl-Cs received
        self.detach: int | None = None  # SIGTERM or SIGHUP: stop watching, leave the jobs to Slurm
        self.unanswered = 0  # squeue calls failed in a row

    # --- the job script and the sbatch command ---------------------------------------------------

    def script(self, job: Job) -> str:
        lines = [r.line for r in job.rows]
        return job_script(job_command(self.opts, lines, str(self.exp.path.resolve())), os.getcwd(), job.workload.label, lines, str(self.exp.path.resolve()))

    def sbatch(self, job: Job) -> list[str]:
        gres = gres_request(job.workload, self.offer)
        args = ["sbatch", "--parsable", f"--job-name=radt-{job.slug}", f"--comment={self.comment(job)}", "--nodes=1", "--ntasks=1"]
        args += [f"--cpus-per-task={len(job.rows)}"]
        args += [f"--gres={gres}"] if gres else []
        args += [f"--output={output_pattern(self.folder / job.slug)}-%j.out", *self.slurm_opts.args(), str(self.folder / f"{job.slug}.sh")]
        return args

    def comment(self, job: Job) -> str:
        """The job's sbatch comment: which CSV rows it runs, so a job whose id never reached the CSV is found again."""
        return f"radt {self.exp.path.resolve()} rows {','.join(str(r.line) for r in job.rows)}"

    def adopt(self, jobs: list[Job]) -> None:
        """Jobs of these rows still in squeue, submitted by a radt stopped before it wrote their ids: watched, not submitted again."""
        import getpass

        waiting = {self.comment(j): j for j in jobs if not j.id}
        if not waiting:
            return
        done = slurm(["squeue", "-h", "-u", getpass.getuser(), "-o", "%i|%k"])
        for line in done.stdout.splitlines() if done.returncode == 0 else []:
            number, _, comment = line.partition("|")
            job = waiting.pop(comment.strip(), None)
            if job:
                job.id, job.state, job.adopted = number.strip(), "watch", True
                report(f"radt: workload {job.workload.label} is Slurm job {job.id} already (its id had not reached {self.exp.path.name}); watching it")

    def output(self, job: Job) -> str:
        """The job's output file, as the user finds it from the CSV's folder."""
        return f"{FOLDER}/{job.slug}-{job.id}.out"

    # --- the CSV ---------------------------------------------------------------------------------

    def write(self, job: Job, status: str, runs: dict[int, tuple[str, str]] | None = None) -> None:
        """The workload's rows: its job id, `status` (or each row's own from the job's result), its run ids."""
        for row in job.rows:
            own_status, run_id = (runs or {}).get(row.line, (status, self.exp.get(row, "Run")))
            self.exp.set(row, JOB_COLUMN, job.id)
            self.exp.set(row, "Status", own_status or status)
            self.exp.set(row, "Run", run_id)
        self.exp.save_or_say(say)
        job.state = status

    def result(self, job: Job) -> dict[int, tuple[str, str]]:
        """What the job wrote about its rows: line -> (status, run id); {} before it wrote anything."""
        try:
            rows = json.loads((self.folder / f"{job.id}.json").read_text())
        except (OSError, ValueError):
            return {}
        return {int(line): (cell.get("Status", ""), cell.get("Run", "")) for line, cell in rows.items()}

    # --- signals ---------------------------------------------------------------------------------

    def on_signal(self, signum: int, _frame) -> None:
        if signum == signal.SIGINT:
            self.interrupt += 1
            say(f"radt: Ctrl-C: cancelling the experiment's Slurm jobs (scancel){'; again to stop waiting for them' if self.interrupt == 1 else ''}")
        else:
            self.detach = signum

    # --- the experiment --------------------------------------------------------------------------

    def run(self, jobs: list[Job]) -> int:
        previous = catch_stops(self.on_signal)
        try:
            self.folder.mkdir(exist_ok=True)
            self.adopt(jobs)
            refused = False
            for job in jobs:
                if self.interrupt or self.detach:
                    break
                if job.id:
                    if job.state == "watch" and not job.adopted:
                        report(f"radt: workload {job.workload.label} already submitted as Slurm job {job.id}; watching it")
                    continue
                try:
                    self.submit(job)
                except SlurmError as exc:  # the jobs already submitted are watched to their end all the same
                    report(f"radt: {exc}; no further workload submitted")
                    refused = True
                    break
            code = self.watch(jobs)
            if self.exp.say_notes(say):  # the job ids and statuses the CSV lacks decide what the next command submits again
                code = code or 1
            return 2 if refused and code in (0, 1) else code
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def submit(self, job: Job) -> None:
        script = self.folder / f"{job.slug}.sh"
        try:
            script.write_text(self.script(job))
            script.chmod(0o700)  # it holds the store's URI
        except OSError as exc:  # a full disk: a script cut short must never reach sbatch
            script.unlink(missing_ok=True)
            raise SlurmError(f"cannot write {FOLDER}/{script.name}, the job script of workload {job.workload.label} ({exc.strerror or exc}); "
                             f"free space next to {self.exp.path}, or copy it to a disk with room") from exc  # fmt: skip
        done = slurm(self.sbatch(job))
        if done.returncode != 0:
            raise SlurmError(f"sbatch refused workload {job.workload.label} ({first_line(done.stderr or done.stdout)}); fix the sbatch options")
        job.id = done.stdout.strip().split(";")[0]
        self.write(job, "PENDING", {r.line: ("PENDING", "") for r in job.rows})
        report(f"radt: workload {job.workload.label} submitted as Slurm job {job.id}; output in {self.output(job)}")

    def watch(self, jobs: list[Job]) -> int:
        """Until every job ended: the rows' statuses from squeue and the jobs' results; 130 after Ctrl-C."""
        cancelled_at = None
        while True:
            live = [j for j in jobs if j.id and j.state not in FINAL]
            if self.detach:
                ids = " ".join(j.id for j in live)
                say(f"radt: {signal.Signals(self.detach).name}: stopped watching; Slurm job(s) {ids or 'none'} keep running. "
                    f"Run the same command to pick them up (scancel {ids} stops them)")  # fmt: skip
                return 128 + self.detach
            if self.interrupt and cancelled_at is None:
                cancelled_at = time.monotonic()
                self.cancel(live)
            if self.interrupt > 1 or (cancelled_at and time.monotonic() - cancelled_at > CANCEL_WAIT):
                for job in live:
                    self.write(job, "KILLED", {line: (s if s in FINAL else "KILLED", run) for line, (s, run) in self.result(job).items()})
                live = []
            if not live:
                break
            try:
                states = job_states([j.id for j in live])
            except SlurmError as exc:  # slurmctld restarting, a timeout: the jobs run on, ask again
                if not self.unanswered:
                    say(f"radt: {exc}; asking again")
                self.unanswered += 1
                time.sleep(settings.SLURM_POLL.get() * 5)
                continue
            self.unanswered = 0
            for job in live:
                self.update(job, states.get(job.id, JobState("")))
            if all(j.state in FINAL for j in live):
                continue
            time.sleep(settings.SLURM_POLL.get())  # RADT_SLURM_POLL: seconds between squeue calls
        if self.interrupt:
            say(f"radt: stopped; the experiment's jobs are cancelled and their rows KILLED in {self.exp.path}. Run the same command to carry on.")
            return 130
        return 0 if all(j.state == "FINISHED" for j in jobs if j.id) else 1

    def cancel(self, live: list[Job]) -> None:
        for job in live:
            job.cancelled = True
        if live:
            done = slurm(["scancel", *[j.id for j in live]])
            if done.returncode != 0:
                say(f"radt: scancel {' '.join(j.id for j in live)} failed ({first_line(done.stderr)}); cancel them by hand")

    def update(self, job: Job, state: JobState) -> None:
        """One job's rows from Slurm's state and the job's own result file."""
        result = self.result(job)
        label = f"workload {job.workload.label} (Slurm job {job.id})"
        if state.state in PENDING_STATES:
            if job.state != "PENDING":
                self.write(job, "PENDING")
        elif state.state and state.state not in ENDED_STATES:  # RUNNING, COMPLETING, SUSPENDED, ...
            runs = {line: ("RUNNING", run) for line, (_, run) in result.items()}
            if job.state != "RUNNING":
                report(f"radt: {label} RUNNING on {state.node or 'its node'}")
            if job.state != "RUNNING" or any(runs[r.line][1] != self.exp.get(r, "Run") for r in job.rows if r.line in runs):
                self.write(job, "RUNNING", runs)
        else:
            ended = {line: (status, run) for line, (status, run) in result.items() if status in FINAL}
            if len(ended) == len(job.rows):
                statuses = [s for s, _ in ended.values()]
                overall = "FINISHED" if all(s == "FINISHED" for s in statuses) else "KILLED" if "KILLED" in statuses else "FAILED"
                self.write(job, overall, ended)
                report(f"radt: {label} {overall}; statuses written to {self.exp.path}, output in {self.output(job)}")
                return
            if state.state in KILLED_STATES or job.cancelled:
                overall, why = "KILLED", f"Slurm ended it {state.state or 'CANCELLED'}"
            elif state.state:
                overall, why = "FAILED", f"the job ended {state.state} before its runs did"
            else:
                overall, why = "FAILED", "Slurm no longer knows the job (squeue forgets it MinJobAge after its end, sacct needs accounting) and it wrote no end"
            runs = {line: (overall, run) for line, (_, run) in result.items()}
            self.write(job, overall, runs)
            report(f"radt: {label} {overall}: {why}; see {self.output(job)}")


def say(message: str) -> None:
    """report, where the terminal may be gone (SIGHUP)."""
    try:
        report(message)
    except OSError:
        pass


def gpus_needed(workload: Workload) -> int:
    """The whole GPUs the workload's job asks for: its runs' distinct Devices (0+1 and 2+3 both ask for two); MIG rows ask for slices."""
    return len({d for run in workload.runs if not run.mig for d in run.devices or []})


def slices_needed(workload: Workload) -> dict[str, int]:
    """The MIG slices the workload's job asks for: one per MIG row, per profile (seven 1g.5gb runs ask for gpu:1g.5gb:7)."""
    found: dict[str, int] = {}
    for run in workload.runs:
        if run.mig:
            found[run.collocation] = found.get(run.collocation, 0) + 1
    return found


def gres_request(workload: Workload, offer: Offer) -> str:
    """sbatch's --gres for the workload: 'gpu:2', 'gpu:3g.20gb:1', 'gpu:1,gpu:1g.5gb:7', 'mps:100'; '' for no GPU."""
    if uses_mps_gres(workload, offer):
        return f"mps:{offer.mps_per_gpu}"  # one GPU's whole MPS share: the workload's runs share it, as on one GPU of radt's own daemon
    gpus = gpus_needed(workload)
    items = [f"gpu:{gpus}"] if gpus else []
    return ",".join(items + [f"gpu:{offer.types.get(profile, profile)}:{count}" for profile, count in slices_needed(workload).items()])


def uses_mps_gres(workload: Workload, offer: Offer) -> bool:
    """The workload runs on Slurm's mps GRES: the partition has it, and every GPU row is MPS on one GPU (Slurm gives mps on
    one GPU and never with gres/gpu in one job); else its MPS rows get a GPU and radt's own daemon."""
    gpu_runs = [r for r in workload.runs if r.devices]
    return bool(offer.mps_per_gpu and gpu_runs and all(r.collocation == "mps" for r in gpu_runs) and len(workload.mps_devices) == 1)


def slug(workload: Workload) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{workload.experiment}-{workload.name}").strip("_") or "workload"


class AnyProfiles(dict):
    """Every MIG profile, with room for the most instances a GPU has: the node checks the real ones when the job starts."""

    def __contains__(self, name: object) -> bool:
        return True

    def __missing__(self, name: str) -> MigProfile:
        return MigProfile(name, 0, 7, 7)


def any_machine() -> Machine:
    """The submitter's view of a node: GPUs, MIG profiles and tools are checked on the node when the job starts."""
    return Machine(lambda: None, lambda gpu: AnyProfiles(), lambda exe: True)


def check_cluster(exp: ExperimentFile, workloads: list[Workload], slurm_opts: SlurmOptions) -> tuple[list[str], Offer]:
    """What the CSV asks of the cluster that it does not have (a partition it lacks, more GPUs than any node has, a MIG
    profile the partition offers no GRES type for), and what the partition offers beyond whole GPUs."""
    nodes, default = cluster_nodes()
    partitions = sorted({p for n in nodes for p in n.partitions})
    partition = slurm_opts.wanted_partition() or default
    if partition and partition not in partitions:
        return [f"Slurm has no partition '{partition}' (it has {', '.join(partitions) or 'none'}); fix --slurm-partition"], Offer()
    in_partition = [n for n in nodes if not partition or partition in n.partitions]
    where = f"partition {partition}" if partition else "the cluster"
    most = max((n.gpus for n in in_partition), default=0)
    types = {type_profile(kind) or kind: kind for n in in_partition for kind in n.slices}
    offer = Offer(types, min((n.mps // n.gpus for n in in_partition if n.mps and n.gpus), default=0))
    problems = []
    for workload in workloads:
        wanted = gpus_needed(workload)
        if wanted > most:
            rows = ", ".join(str(r.row.line) for r in workload.runs)
            problems.append(
                f"{exp.path.name} rows {rows}: workload {workload.label} asks for {wanted} GPUs on one node, but no node of {where} has more than {most} "
                "(sinfo); give it fewer Devices or pick a partition with bigger nodes"
            )
        problems += slice_problems(exp, workload, in_partition, types, where)
    return problems, offer


def slice_problems(exp: ExperimentFile, workload: Workload, nodes: list[Node], types: dict[str, str], where: str) -> list[str]:
    """A MIG row whose profile no node of the partition offers as a GRES type, or more of one than a node has: one line each."""
    offered = ", ".join(f"gpu:{kind}:{max(n.slices.get(kind, 0) for n in nodes)}" for kind in sorted(set(types.values()))) or "no MIG GRES type"
    problems = []
    for profile, count in slices_needed(workload).items():
        line = next(r.row.line for r in workload.runs if r.collocation == profile)
        most = max((n.slices.get(types.get(profile, ""), 0) for n in nodes), default=0)
        if profile not in types:
            problems.append(
                f"{exp.path.name} row {line}: MIG {profile} is not offered by {where} (sinfo: {offered}); "
                "pick a partition that offers it (--slurm-partition) or a profile it has"
            )
        elif count > most:
            problems.append(
                f"{exp.path.name} row {line}: workload {workload.label} asks for {count} × MIG {profile} on one node, but no node of {where} has more "
                f"than {most} (sinfo: {offered}); give it fewer {profile} rows"
            )
    return problems


def submit_experiment(opts: ExperimentOptions, slurm_opts: SlurmOptions) -> int:
    """`radt experiment.csv --slurm`: 0 when every workload FINISHED, 1 when one did not, 130 on Ctrl-C, 2 for what the cluster lacks."""
    from radt.collectors.experiment import CsvError

    problems = script_problems(opts.csv, opts.store, slurm_opts)  # before the CSV's name goes into any message
    if problems:
        for line in problems:
            report(f"radt: {line}")
        return 2
    try:
        exp = ExperimentFile.load(opts.csv)
    except CsvError as exc:
        report(f"radt: {exc}")
        return 2
    workloads, problems = plan(exp, any_machine(), rerun=opts.rerun)
    jobs = _jobs(exp, workloads, opts.rerun)
    to_submit = [j.workload for j in jobs if not j.id]
    problems += name_problems(exp, to_submit)
    offer = Offer()
    try:
        if not problems and (to_submit or not opts.dry_run):
            problems, offer = check_cluster(exp, to_submit, slurm_opts) if to_submit else ([], Offer())
    except SlurmError as exc:
        if not opts.dry_run:
            raise
        report(f"radt: {exc} (the plan below is not checked against the cluster)")
    if problems:
        for line in problems:
            report(f"radt: {line}")
        if len(problems) > 1:
            report(f"radt: {len(problems)} problems in {opts.csv}; nothing was submitted")
        return 2
    submitter = Submitter(opts, slurm_opts, exp, offer)
    if opts.dry_run:
        print(describe_for_slurm(describe(exp, workloads, opts.rerun), workloads, offer))
        _print_jobs(submitter, jobs, opts.store)
        return 0
    if not os.access(opts.csv, os.W_OK) or not os.access(opts.csv.resolve().parent, os.W_OK):
        report(f"radt: cannot write {opts.csv} (or the {FOLDER}/ folder next to it), where the statuses go; make it writable or copy it to a folder of yours")
        return 2
    if any(not j.id for j in jobs):
        from radt.collectors.tracking import connect

        connect(opts.store)  # refused here, in one line, not in every job; a new store gets its schema once, not from jobs racing
    from radt.collectors.csvhold import run_holding

    return run_holding(opts.csv, exp.known, lambda: submitter.run(jobs))  # its jobs are one radt's to submit and watch


def _jobs(exp: ExperimentFile, workloads: list[Workload], rerun: bool) -> list[Job]:
    """A job for each workload still to run: one an earlier radt submitted (its job id in the CSV, PENDING or RUNNING)
    is watched, not submitted again; a FINISHED one (or a FAILED one without --rerun) is skipped, in a line."""
    jobs = []
    for workload in workloads:
        ids = {exp.get(r.row, JOB_COLUMN) for r in workload.runs}
        words = {(exp.get(r.row, "Status").split() or [""])[0].upper() for r in workload.runs}
        job = Job(workload, slug(workload))
        if len(ids) == 1 and "" not in ids and words <= {"PENDING", "RUNNING"}:
            job.id, job.state = ids.pop(), "watch"  # submitted by an earlier radt: picked up, not submitted again
        elif workload.state() == "finished" or (workload.state() == "failed" and not rerun):
            report(f"radt: workload {workload.label} already {workload.state().upper()}, skipped")
            continue
        jobs.append(job)
    return jobs


def _print_jobs(submitter: Submitter, jobs: list[Job], store: str) -> None:
    """--dry-run: each job's sbatch command and script (the store's password left out), or the job it watches."""
    for job in jobs:
        if job.id:
            print(f"\nworkload {job.workload.label}: already Slurm job {job.id}, watched")
            continue
        print(f"\nworkload {job.workload.label}: {shlex.join(submitter.sbatch(job))}")
        print(redacted(submitter.script(job), store), end="")


def describe_for_slurm(plan_text: str, workloads: list[Workload], offer: Offer) -> str:
    """The plan as a job runs it: Devices not physical (DEVICES_NOTE), each MIG row on a slice Slurm assigns (none created),
    MPS on Slurm's mps GRES served by the site's daemon."""
    lines, current = [DEVICES_NOTE], None
    for line in plan_text.splitlines():
        current = next((w for w in workloads if line.startswith(f"workload {w.label}: ")), current)
        created = re.match(r"  set-up: create MIG (\S+) on GPU \S+ for run (\S+) ", line)
        if created:
            line = f"  set-up: run {created[2]} on a MIG {created[1]} slice that Slurm assigns the job (none is created or destroyed)"
        elif line.startswith("  set-up: start an MPS control daemon") and current and uses_mps_gres(current, offer):
            line = f"  set-up: MPS from Slurm's mps GRES (--gres=mps:{offer.mps_per_gpu}): the site's daemon serves the GPU Slurm gives; radt starts none"
        lines.append(line)
    return "\n".join(lines)


def redacted(text: str, store: str) -> str:
    from radt.collectors.tracking import redact

    return text.replace(store, redact(store))


# --- the job, on its node ------------------------------------------------------------------------


@dataclass
class JobRows(ExperimentFile):
    """The CSV as the job sees it: the statuses WorkloadRunner saves go to the job's result file, which the submitter reads."""

    result: Path = Path()

    def save(self) -> None:
        rows = {str(r.line): {"Status": self.get(r, "Status"), "Run": self.get(r, "Run")} for r in self.rows}
        write_whole(self.result, json.dumps(rows))
        self.unwritten.clear()


def allocated_gpus(environ: dict[str, str] | os._Environ, job: str) -> list[int]:
    """The node's GPUs (NVML indices) Slurm gave this job: SLURM_JOB_GPUS, else `scontrol show job -d`'s GRES IDX."""
    given = environ.get("SLURM_JOB_GPUS", "")
    if given and all(p.strip().isdigit() for p in given.split(",")):
        return [int(p) for p in given.split(",")]
    done = slurm(["scontrol", "show", "job", "-d", job])
    match = re.search(r"GRES=\S*?\(IDX:([0-9,\-]+)\)", done.stdout)
    if not match:
        return []
    found = []
    for part in match.group(1).split(","):
        low, _, high = part.partition("-")
        found += range(int(low), int(high or low) + 1)
    return found


def job_file(exp: ExperimentFile, lines: list[int], result: Path) -> tuple[JobRows, str]:
    """The job's rows as their own file (problems elsewhere in the CSV are not this job's), and why they cannot run."""
    rows = [r for r in exp.rows if r.line in lines]
    keys = {(exp.get(r, "Experiment"), exp.get(r, "Workload")) for r in rows}
    whole = [r for r in exp.rows if (exp.get(r, "Experiment"), exp.get(r, "Workload")) in keys]
    sub = JobRows(exp.path, exp.header, rows, exp.newline, dict(exp.index), bom=exp.bom, result=result)
    if len(rows) != len(lines) or len(keys) != 1 or len(whole) != len(rows):
        return sub, f"rows {', '.join(map(str, lines))} of {exp.path.name} are no longer one workload (the file changed after the job was submitted)"
    return sub, ""


def run_job(opts: ExperimentOptions, lines: list[int]) -> int:
    """Inside the Slurm job: run the workload of these rows with WorkloadRunner, on the GPUs Slurm gave the job."""
    from radt.collectors.collocation import undo_leftovers
    from radt.collectors.experiment import real_machine
    from radt.collectors.proctree import restore_interrupts
    from radt.collectors.reaper import reap
    from radt.collectors.scheduler import open_experiment
    from radt.collectors.tracking import connect

    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        raise UsageError("--slurm-rows is what a job of 'radt experiment.csv --slurm' runs; submit with: radt experiment.csv --slurm")
    exp = ExperimentFile.load(opts.csv)
    folder = opts.csv.resolve().parent / FOLDER
    folder.mkdir(exist_ok=True)
    rows, problem = job_file(exp, lines, folder / f"{job}.json")
    machine = real_machine()
    slices: list[MigInstance] = []
    if not problem:
        slices, problem = place_rows(rows, os.environ, job, machine)
    workloads, problems = plan(rows, slice_machine(machine), rerun=True) if not problem else ([], [problem])
    if problems:
        for line in problems:
            report(f"radt: {line}")
        for row in rows.rows:
            rows.set(row, "Status", "FAILED")
        rows.save()
        return 2
    restore_interrupts()
    reap(report, store=opts.store, wait=False)
    undo_leftovers(report)
    client = connect(opts.store)
    workload = workloads[0]
    report(f"radt: Slurm job {job}: workload {workload.label}, {len(workload.runs)} run(s) on {os.environ.get('SLURMD_NODENAME', 'this node')}")
    site_mps = bool(workload.mps_devices) and on_mps_gres(job)
    runner = SlurmWorkloadRunner(opts, rows, workload, client, open_experiment(client, opts.store, workload), slices=slices, site_mps=site_mps)
    status = runner.execute()
    report(f"radt: workload {workload.label} {status}")
    return {"FINISHED": 0, "KILLED": 130}.get(status, 1)


def map_devices(rows: JobRows, gpus: list[int], visible: int | None, skip: frozenset[int] | set[int] = frozenset()) -> str:
    """Each row's Devices (but the `skip` lines') renumbered onto the job's GPUs (the workload's distinct indices in order); why not, or ''.

    Where Slurm confines the job to its GPUs (cgroups), NVML sees only those, numbered from 0."""
    if visible is not None and len(gpus) == visible and gpus and max(gpus) >= visible:
        gpus = list(range(visible))
    cells = {}
    for row in rows.rows:
        if row.line in skip:
            continue
        try:
            cells[row.line] = parse_devices_cell(rows.get(row, "Devices")) or []
        except ValueError:
            return ""  # plan says what is wrong with the cell
    wanted = sorted({d for devices in cells.values() for d in devices if isinstance(d, int)})
    if len(wanted) > len(gpus):
        return f"the workload uses {len(wanted)} GPUs but Slurm gave job {os.environ.get('SLURM_JOB_ID')} {len(gpus)} ({gpus}); submit it with --gres=gpu:{len(wanted)}"
    place = {d: gpus[n] for n, d in enumerate(wanted)}
    for row in rows.rows:
        if cells.get(row.line):
            rows.set(row, "Devices", "+".join(str(place[d]) if isinstance(d, int) else d for d in cells[row.line]))
    return ""


def row_profile(rows: JobRows, row: Row) -> str | None:
    """The row's MIG profile, or None (no MIG, or a cell plan refuses)."""
    from radt.collectors.experiment import parse_collocation

    try:
        collocation = parse_collocation(rows.get(row, "Collocation"))
    except ValueError:
        return None
    return collocation if collocation not in ("-", "mps") else None


def place_rows(rows: JobRows, environ: dict[str, str] | os._Environ, job: str, machine: Machine) -> tuple[list[MigInstance], str]:
    """Each MIG row on a slice of its profile that Slurm gave the job (its Devices: the slice's GPU), the others' Devices
    renumbered onto the job's GPUs; the slices the rows use, and why the rows cannot run, or ''."""
    from radt.collectors.gpus import NvmlUnavailable
    from radt.collectors.gpus import machine as nvml_machine

    profiles = {r.line: p for r in rows.rows if (p := row_profile(rows, r))}
    given = allocated_gpus(environ, job)
    if not profiles:
        return [], map_devices(rows, given, machine.gpu_count())
    try:
        node = nvml_machine()
    except NvmlUnavailable as exc:
        return [], f"cannot find the MIG slices Slurm gave job {job}: NVML is unavailable ({exc}); run the job on a node with the NVIDIA driver"
    whole, free = given_devices(node, given, environ.get("CUDA_VISIBLE_DEVICES"))
    used = []
    for row in rows.rows:
        if row.line not in profiles:
            continue
        found = next((m for m in free if m.profile == profiles[row.line]), None)
        if found is None:
            have = ", ".join(f"{m.profile} ({m.uuid})" for m in free) or "no free MIG slice"
            return [], (
                f"row {row.line} wants a MIG {profiles[row.line]} slice, but Slurm gave job {job} {have}; "
                f"submit it with radt experiment.csv --slurm (it asks --gres=gpu:{profiles[row.line]}:N)"
            )
        free.remove(found)
        rows.set(row, "Devices", str(found.gpu))
        used.append(MigInstance(found.gpu, found.profile, found.gpu_instance, found.compute_instance, found.uuid))
    return used, map_devices(rows, whole, len(node.gpus), skip=set(profiles))


def given_devices(node: gpus.Machine, indices: list[int], visible: str | None) -> tuple[list[int], list[gpus.MigDevice]]:
    """The whole GPUs (NVML indices) and the MIG slices Slurm gave the job: the slices named in the job's
    CUDA_VISIBLE_DEVICES (AutoDetect=nvml sets their MIG UUIDs), else its GRES indices in Slurm's numbering of the node:
    each GPU, or each slice of a GPU in MIG mode, in NVML order (as AutoDetect=nvml and a gres.conf in that order number them)."""
    from radt.collectors.gpus import MigDevice

    named = {t.strip() for t in (visible or "").split(",") if t.strip().startswith("MIG-")}
    gpu_uuid = {g.index: g.uuid for g in node.gpus}
    listed = [d for g in node.gpus for d in ([m for m in node.migs if m.gpu == g.index] if g.mig_mode else [g])]
    picked = [listed[i] for i in indices if i < len(listed)]
    if named:
        slices = [m for m in node.migs if m.uuid in named or f"MIG-{gpu_uuid[m.gpu]}/{m.gpu_instance}/{m.compute_instance}" in named]
    else:
        slices = [d for d in picked if isinstance(d, MigDevice)]
    if not node.migs:
        return indices, slices  # no GPU in MIG mode: Slurm's indices are NVML's (map_devices knows cgroups' renumbering)
    return [d.index for d in picked if not isinstance(d, MigDevice)], slices


def slice_machine(machine: Machine) -> Machine:
    """The node as a job's plan checks it: MIG rows run on slices that exist (Slurm's), so no profile needs room to be created."""
    return Machine(machine.gpu_count, lambda gpu: AnyProfiles(), machine.has, machine.gpu_uuids)


def on_mps_gres(job: str) -> bool:
    """The job was given Slurm's mps GRES (`--gres=mps:N`): the site's prolog runs the MPS daemon of its GPU."""
    return "gres:mps:" in slurm(["scontrol", "show", "job", "-d", job]).stdout  # TresPerNode=gres:mps:100


class AssignedSlices:
    """A job's Setup: a MIG row gets a slice Slurm assigned, used as it is, never created or destroyed; MPS rows get
    radt's own daemon, or on Slurm's mps GRES the site's (its prolog starts it), which radt neither starts nor stops."""

    def __init__(self, setup: Setup, slices: list[MigInstance], site_mps: bool = False) -> None:
        self.setup = setup
        self.free = list(slices)
        self.site_mps = site_mps

    def mps(self, devices: list[int]) -> MpsDaemon:
        if not self.site_mps:
            return self.setup.mps(devices)
        pipe, log = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", MPS_PIPE_DIRECTORY), os.environ.get("CUDA_MPS_LOG_DIRECTORY", MPS_LOG_DIRECTORY)
        share = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "as Slurm set it")
        report(f"radt: MPS on GPU {'+'.join(map(str, devices))} from Slurm's mps GRES (the site's daemon, {pipe}; thread share {share}); radt starts none")
        return MpsDaemon(tuple(sorted(devices)), Path(pipe), Path(log))

    def mig(self, gpu: int, profile: str, start: int | None = None) -> MigInstance:
        instance = next(i for i in self.free if i.gpu == gpu and i.profile == profile)  # place_rows set the row's Devices to its GPU
        self.free.remove(instance)
        report(f"radt: MIG {profile} slice {instance.uuid} (GPU {gpu}, GPU instance {instance.gpu_instance}) assigned by Slurm; nothing is created")
        return instance


class SlurmWorkloadRunner(WorkloadRunner):
    """WorkloadRunner inside a Slurm job: its MIG rows run on the slices Slurm assigned the job."""

    def __init__(self, *args, slices: list[MigInstance], site_mps: bool = False) -> None:
        super().__init__(*args)
        self.slices = slices
        self.site_mps = site_mps

    def set_up(self, setup: Setup) -> dict[str, tuple[str | None, dict[str, str]]]:
        return super().set_up(AssignedSlices(setup, self.slices, self.site_mps))

    def mig_starts(self) -> dict[str, int | None]:
        """None: the slices Slurm assigned exist already, where the site made them; none is placed or created."""
        return {}
