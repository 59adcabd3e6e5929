"""`radt experiment.csv --slurm`: each workload one Slurm job, run on its node by the same WorkloadRunner.

The submitter checks the CSV against the cluster (sinfo: partitions, GPUs and MIG GRES types per node), submits
one sbatch job per workload asking `--gres=gpu:N` for its GPUs and `gpu:<profile>:<n>` for its MIG rows (as
clusters offer MIG: slices an admin made, scheduled as GRES types), writes SlurmJob and the rows' statuses into the CSV, and watches
the jobs (squeue, scontrol; sacct where the cluster keeps accounting) until they end. Ctrl-C scancels
them; any other end of the submitter (SIGTERM, a closed terminal, SIGKILL) leaves them running, and the
same command picks them up again instead of submitting them twice.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import time
from dataclasses import dataclass

from radt import settings
from radt.collectors._common import first_line
from radt.collectors.experiment.csvfile import ExperimentFile, Machine, Row, Workload, plan
from radt.collectors.experiment.scheduler import ExperimentOptions, describe
from radt.collectors.process.proctree import catch_stops
from radt.collectors.slurm.commands import (
    ENDED_STATES,
    KILLED_STATES,
    PENDING_STATES,
    AnyProfiles,
    JobState,
    Node,
    Offer,
    SlurmError,
    cluster_nodes,
    job_states,
    slurm,
    type_profile,
)
from radt.collectors.slurm.jobscript import FOLDER, SlurmOptions, job_command, job_script, name_problems, output_pattern, script_problems
from radt.collocation import Mode
from radt.errors import report

JOB_COLUMN = "SlurmJob"


CANCEL_WAIT = 120.0  # seconds for cancelled jobs to end before their rows are written KILLED anyway


FINAL = ("FINISHED", "FAILED", "KILLED")


DEVICES_NOTE = (
    "Under Slurm, Devices is not a physical GPU index: a workload's Devices are numbered onto the GPUs Slurm gives its job "
    "(0+1 and 2+3 both ask for two), and each MIG row runs on a slice of its profile that Slurm assigns (--gres=gpu:<profile>:<n>)"
)


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
    return bool(offer.mps_per_gpu and gpu_runs and all(r.mode is Mode.MPS for r in gpu_runs) and len(workload.mps_devices) == 1)


def slug(workload: Workload) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{workload.experiment}-{workload.name}").strip("_") or "workload"


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
    from radt.collectors.experiment.csvfile import CsvError

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
        from radt.collectors.store.tracking import connect

        connect(opts.store)  # refused here, in one line, not in every job; a new store gets its schema once, not from jobs racing
    from radt.collectors.experiment.csvhold import run_holding

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
    from radt.collectors.store.tracking import redact

    return text.replace(store, redact(store))
