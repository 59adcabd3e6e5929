"""`radt experiment.csv`: run the workloads of an experiment CSV one after another.

Each run of a workload is a `radt` child process (the same code path as `radt train.py`), told
to wait at a start gate; when every run of the workload has created its MLflow run and opened
its samplers, the gate opens and they start together. Collocation set-up (MPS, MIG) happens
before, and is undone after, on every exit path. The CSV gets each row's Status and Run after
every workload, so the same command resumes an interrupted experiment.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from radt import settings
from radt.collectors._common import first_line
from radt.collectors.experiment.collocation import CollocationError, MpsDaemon, Setup
from radt.collectors.experiment.csvfile import ExperimentFile, Machine, PlannedRun, Workload, collocation_label, plan
from radt.collectors.experiment.workloads import GATE_PREFIX, add_radts, record_workload, update_workload
from radt.collectors.process.proctree import catch_stops, child_setup, restore_interrupts
from radt.collectors.store.nodes import slurm_tags
from radt.collocation import Mode
from radt.errors import report
from radt.runmodel import COLLOCATION_TAG, EXPERIMENT_FILE_TAG, RUNS_TAG, STOP_REASON_TAG

COLOURS = (31, 32, 34, 35, 36, 33)  # radT's: red, green, blue, magenta, cyan, yellow
READY_TIMEOUT = 600.0  # seconds for every run of a workload to create its run and open its samplers


@dataclass
class ExperimentOptions:
    csv: Path
    store: str
    dry_run: bool = False
    rerun: bool = False
    interval: float = field(default_factory=settings.INTERVAL.get)
    max_epoch: int | None = None
    max_time: float | None = None
    flush_timeout: float = field(default_factory=settings.FLUSH_TIMEOUT.get)


def describe(exp: ExperimentFile, workloads: list[Workload], rerun: bool) -> str:
    """The plan as --dry-run prints it: workloads in order, per run the devices, the set-up, the command."""
    lines = [f"{exp.path.name}: {len(workloads)} workloads, {sum(len(w.runs) for w in workloads)} runs"]
    for workload in workloads:
        state = workload.state()
        if state == "finished" or (state == "failed" and not rerun):
            lines.append(f"workload {workload.label}: {state.upper()}, skipped" + (" (--rerun runs it again)" if state == "failed" else ""))
            continue
        lines.append(f"workload {workload.label}: {len(workload.runs)} run(s) starting together")
        for step in [*workload.notes, *setup_steps(workload)]:  # a note qualifies the steps after it (where placements came from)
            lines.append(f"  set-up: {step}")
        for run in workload.runs:
            gpus = "GPU " + "+".join(map(str, run.devices)) if run.devices else "no GPU"
            profiler = f", wrapped by {run.profiler}" if run.profiler else ""
            command = shlex.join([run.file, *run.params])
            lines.append(
                f"  {run.letter}: {gpus}, collocation {collocation_label(run.collocation)}, listeners {'+'.join(run.sources) or 'none'}{profiler}: {command}"
            )
    return "\n".join(lines)


def setup_steps(workload: Workload) -> list[str]:
    steps = []
    if workload.mps_devices:
        steps.append(f"start an MPS control daemon for GPU {'+'.join(map(str, workload.mps_devices))}, quit it after")
    for run in workload.runs:
        if run.mig:
            gpu, slot = run.devices[0], run.mig_slot
            where = f" at memory slice{'s' if slot.size > 1 else ''} {slot.text()}" if slot else ""
            profile = f"{run.collocation}:{slot.start}" if slot else run.collocation
            steps.append(f"create MIG {run.collocation} on GPU {gpu} for run {run.letter}{where} (nvidia-smi mig -i {gpu} -cgi {profile} -C), destroy it after")
    return steps


@dataclass
class Child:
    run: PlannedRun
    process: subprocess.Popen
    colour: int | None
    run_id: str = ""
    status: str = ""
    pumps: list[threading.Thread] = field(default_factory=list)


class WorkloadRunner:
    """One workload: set-up, synchronised start, prefixed output, Ctrl-C, tear-down, statuses."""

    def __init__(self, opts: ExperimentOptions, exp: ExperimentFile, workload: Workload, client, experiment_id: str) -> None:
        self.opts = opts
        self.exp = exp
        self.workload = workload
        self.client = client
        self.experiment_id = experiment_id
        self.interrupted = 0  # signals received
        self.children: list[Child] = []
        self.gate = Path(tempfile.mkdtemp(prefix=GATE_PREFIX))
        self.record: Path | None = None  # RADT_HOME/workloads/<parent>.json: what the reaper finishes if this process is killed
        self._parent_ended = False
        self.log_path = self.gate / "workload.log"
        self._log_lock = threading.Lock()
        self._colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")

    # --- signals ---------------------------------------------------------------------

    def on_signal(self, signum: int, _frame) -> None:
        self.interrupted += 1
        if self.interrupted == 1:
            report(f"radt: {signal.Signals(signum).name} received, stopping workload {self.workload.label} (again to force)")
        (self.gate / "abort").touch()
        for child in self.children:
            if child.process.poll() is None and (self.gate / "go").exists():
                try:
                    os.kill(child.process.pid, signal.SIGINT if self.interrupted == 1 else signal.SIGTERM)
                except ProcessLookupError:
                    pass

    # --- output ----------------------------------------------------------------------

    def _pump(self, stream, sink, prefix: bytes) -> threading.Thread:
        def run() -> None:
            with open(self.log_path, "ab") as log:
                for line in iter(stream.readline, b""):
                    with self._log_lock:
                        log.write(prefix + line)
                        log.flush()
                    try:
                        sink.write(prefix + line)
                        sink.flush()
                    except (OSError, ValueError):
                        pass

        thread = threading.Thread(target=run, name="radt-pump", daemon=True)
        thread.start()
        return thread

    def _prefix(self, run: PlannedRun, colour: int | None) -> bytes:
        text = f"[{self.workload.name}{run.letter}]".ljust(6) + " "
        return (f"\033[{colour}m{text}\033[0m" if colour else text).encode()

    # --- the workload ----------------------------------------------------------------

    def command(self, run: PlannedRun, env_visible: str | None) -> list[str]:
        o = self.opts
        args = [sys.executable, "-m", "radt", "-e", self.experiment_id, "-w", self.workload.name, "--parent-run", self.parent_id]
        args += ["--letter", run.letter, "--collocation", collocation_label(run.collocation), "-l", run.listeners, "--interval", str(o.interval)]
        args += [
            "--store",
            o.store,
            "--start-gate",
            str(self.gate),
            "--flush-timeout",
            str(o.flush_timeout),
            "-n",
            f"{Path(run.file).stem} {self.workload.name}{run.letter}",
        ]
        if run.devices is not None:
            args += ["-d", "+".join(map(str, run.devices))]
        if env_visible is not None:
            args += ["--cuda-visible", env_visible]
        if o.max_epoch is not None:
            args += ["--max-epoch", str(o.max_epoch)]
        if o.max_time is not None:
            args += ["--max-time", str(o.max_time)]
        return [*args, run.file, *run.params]

    def start_parent(self) -> None:
        from radt.collectors.store.tracking import create_workload

        kinds = sorted({collocation_label(r.collocation) for r in self.workload.runs})
        tags = {COLLOCATION_TAG: "+".join(kinds), EXPERIMENT_FILE_TAG: str(self.exp.path.resolve()), RUNS_TAG: str(len(self.workload.runs))}
        tags.update(slurm_tags(os.environ))  # a workload run as a Slurm job (radt experiment.csv --slurm): its job, node, partition
        self.parent_id = create_workload(self.client, self.experiment_id, self.workload.name, tags)

    def set_up(self, setup: Setup) -> dict[str, tuple[str | None, dict[str, str]]]:
        """Per letter: the CUDA_VISIBLE_DEVICES override and extra environment the collocation needs."""
        per_run: dict[str, tuple[str | None, dict[str, str]]] = {r.letter: (None, {}) for r in self.workload.runs}
        starts = self.mig_starts()  # before anything is set up: a set that no longer fits sets up nothing
        daemon: MpsDaemon | None = setup.mps(self.workload.mps_devices) if self.workload.mps_devices else None
        for run in self.workload.runs:
            if self.interrupted:
                raise KeyboardInterrupt
            if run.mode is Mode.MPS and daemon is not None:
                env = daemon.client_env(run.devices)
                per_run[run.letter] = (env.pop("CUDA_VISIBLE_DEVICES"), env)
            elif run.mig:
                instance = setup.mig(run.devices[0], run.collocation, starts.get(run.letter))
                per_run[run.letter] = (instance.uuid, {})
        return per_run

    def mig_starts(self) -> dict[str, int | None]:
        """Per MIG run's letter, the memory slice its slice starts at: the workload's slices placed together on their GPU as
        it is now (the plan's placement, unless the GPU changed since); CollocationError where they no longer fit."""
        from radt.collectors.experiment.collocation import placed_slices

        by_gpu: dict[int, list[PlannedRun]] = {}
        for run in self.workload.runs:
            if run.mig:
                by_gpu.setdefault(run.devices[0], []).append(run)
        starts: dict[str, int | None] = {}
        for gpu, runs in by_gpu.items():
            starts.update(zip([r.letter for r in runs], placed_slices(gpu, [r.collocation for r in runs], report), strict=True))
        return starts

    def spawn(self, per_run: dict[str, tuple[str | None, dict[str, str]]]) -> None:
        for number, run in enumerate(self.workload.runs):
            visible, extra = per_run[run.letter]
            env = {**os.environ, **extra}
            colour = COLOURS[number % len(COLOURS)] if self._colour else None
            process = subprocess.Popen(
                self.command(run, visible),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # Ctrl-C reaches radt here once; it is forwarded to each run
                preexec_fn=child_setup(),  # SIGKILL when this scheduler dies; default SIGINT/SIGTERM whatever it inherited
            )
            child = Child(run, process, colour)
            prefix = self._prefix(run, colour)
            child.pumps = [self._pump(process.stdout, sys.stdout.buffer, prefix), self._pump(process.stderr, sys.stderr.buffer, prefix)]
            self.children.append(child)
        if self.record:
            add_radts(self.record, [c.process.pid for c in self.children])

    def wait_ready(self) -> bool:
        """True when every run is ready to start; False when one failed to set up or we were interrupted."""
        deadline = time.monotonic() + READY_TIMEOUT
        while not self.interrupted:
            ready = [c for c in self.children if (self.gate / f"ready-{c.run.letter}").exists()]
            if len(ready) == len(self.children):
                for child in self.children:
                    child.run_id = (self.gate / f"ready-{child.run.letter}").read_text().strip()
                return True
            gone = [c for c in self.children if c.process.poll() is not None and c not in ready]
            if gone:
                report(
                    f"radt: run {gone[0].run.letter} of workload {self.workload.label} ended before it could start (see its lines above); calling the workload off"
                )
                return False
            if time.monotonic() > deadline:
                report(f"radt: the runs of workload {self.workload.label} were not ready after {READY_TIMEOUT:.0f} s; calling the workload off")
                return False
            time.sleep(0.02)
        return False

    def execute(self) -> str:
        """Run the workload; its final status (FINISHED, FAILED or KILLED)."""
        previous = catch_stops(self.on_signal)
        try:
            self.start_parent()
        except Exception as exc:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            from radt.collectors.store.tracking import StoreError, redact

            reason = first_line(exc)
            raise StoreError(f"cannot create the run of workload {self.workload.label} in {redact(self.opts.store)} ({reason}); nothing of it started, "
                             "run the same command when the store answers again") from exc  # fmt: skip
        self.record = record_workload(self.parent_id, self.opts.store, self.gate, self.exp.path, [r.row.line for r in self.workload.runs])
        started = False
        try:
            with Setup(report) as setup:
                try:
                    per_run = self.set_up(setup)
                except CollocationError as exc:
                    report(f"radt: workload {self.workload.label}: {exc}")
                    return self.finish("FAILED", "setup_failed")
                except KeyboardInterrupt:
                    return self.finish("KILLED", "interrupted")
                try:
                    self.spawn(per_run)
                    if self.wait_ready():
                        self.mark_running()
                        (self.gate / "go").touch()
                        started = True
                    else:
                        (self.gate / "abort").touch()
                except BaseException:  # never tear the set-up down under running trainings
                    self.stop_children()
                    raise
                for child in self.children:
                    child.process.wait()
                    for pump in child.pumps:
                        pump.join(10)
                    status_file = self.gate / f"status-{child.run.letter}"
                    child.status = status_file.read_text().strip() if status_file.exists() else ("KILLED" if self.interrupted else "FAILED")
                    if not child.run_id and (self.gate / f"ready-{child.run.letter}").exists():
                        child.run_id = (self.gate / f"ready-{child.run.letter}").read_text().strip()
            # the set-up is undone here, before the statuses are written
            statuses = [c.status for c in self.children]
            if self.interrupted:
                overall = "KILLED"
            elif started and all(s == "FINISHED" for s in statuses):
                overall = "FINISHED"
            else:
                overall = "FAILED"
            return self.finish(overall, None if started else "not_started")
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            shutil.rmtree(self.gate, ignore_errors=True)
            if self._parent_ended:
                self.record.unlink(missing_ok=True)

    def stop_children(self) -> None:
        """Call the workload off and stop every run: SIGINT, then SIGTERM, then SIGKILL."""
        (self.gate / "abort").touch()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            alive = [c for c in self.children if c.process.poll() is None]
            for child in alive:
                try:
                    os.kill(child.process.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 30
            while any(c.process.poll() is None for c in alive) and time.monotonic() < deadline:
                time.sleep(0.1)

    def mark_running(self) -> None:
        for child in self.children:
            self.exp.set(child.run.row, "Status", "RUNNING")
            self.exp.set(child.run.row, "Run", child.run_id)
        self.exp.save_or_say(report)

    def finish(self, overall: str, reason: str | None) -> str:
        """Write the rows' statuses, then end the parent run (its log attached)."""
        by_letter = {c.run.letter: c for c in self.children}
        for run in self.workload.runs:
            child = by_letter.get(run.letter)
            status = child.status if child and child.status else ("KILLED" if self.interrupted else "FAILED")
            self.exp.set(run.row, "Status", status)
            self.exp.set(run.row, "Run", child.run_id if child else "")
        self.exp.save_or_say(report)
        if self.log_path.exists():
            try:  # an artifact location that fails must not keep the parent RUNNING; the log stays on disk
                self.client.log_artifact(self.parent_id, str(self.log_path), artifact_path="radt")
            except Exception as exc:
                report(f"radt: could not attach {self.log_path} to workload run {self.parent_id} ({first_line(exc)}); it stays on disk")
        try:
            tags = [(STOP_REASON_TAG, reason)] if reason else []
            for key, value in tags:
                self.client.set_tag(self.parent_id, key, value)
            self.client.set_terminated(self.parent_id, status=overall)
            self._parent_ended = True
        except Exception as exc:  # the runs' own data is safe in their spools; the parent's end waits in its record
            if self.record:
                update_workload(self.record, status=overall)
            report(f"radt: could not end workload run {self.parent_id} ({first_line(exc)}); the CSV holds the statuses, 'radt sync' ends it")
        return overall


def open_experiment(client, store: str, workload: Workload) -> str:
    """The id of the workload's MLflow experiment (created if new), or StoreError in one line."""
    from radt.collectors.store.tracking import StoreError, redact, resolve_experiment

    try:
        return resolve_experiment(client, store, workload.experiment)
    except StoreError:
        raise
    except Exception as exc:
        reason = first_line(exc)
        raise StoreError(
            f"cannot open experiment '{workload.experiment}' in {redact(store)} ({reason}); run the same command when the store answers again"
        ) from exc


def run_experiment(opts: ExperimentOptions, finish_leftovers: Callable[[], None], machine: Machine | None = None) -> int:
    """0 when every workload FINISHED (or was already), 1 when one FAILED, 130 on Ctrl-C, 2 for a bad file.

    `finish_leftovers` ends what dead radts of this host left, once the CSV is held and before the first workload: cli
    passes the reaper (collectors/recovery/, a room above experiments: it finishes their workloads too)."""
    from radt.collectors.experiment.csvfile import CsvError, real_machine

    try:
        exp = ExperimentFile.load(opts.csv)
    except CsvError as exc:
        report(f"radt: {exc}")
        return 2
    workloads, problems = plan(exp, machine or real_machine(), rerun=opts.rerun)
    if problems:
        for line in problems:
            report(f"radt: {line}")
        report(f"radt: {len(problems)} problem(s) in {opts.csv}; nothing was started")
        return 2
    if opts.dry_run:
        print(describe(exp, workloads, opts.rerun))
        return 0
    if not os.access(opts.csv, os.W_OK) or not os.access(opts.csv.resolve().parent, os.W_OK):
        report(f"radt: cannot write {opts.csv} (or a file next to it), where the statuses go; make it writable or copy it to a folder of yours")
        return 2
    from radt.collectors.experiment.csvhold import run_holding

    return run_holding(opts.csv, exp.known, lambda: _run_workloads(opts, exp, workloads, finish_leftovers))


def _run_workloads(opts: ExperimentOptions, exp: ExperimentFile, workloads: list[Workload], finish_leftovers: Callable[[], None]) -> int:
    """The planned workloads, one after the other, while this radt holds the CSV."""
    from radt.collectors.experiment.collocation import undo_leftovers
    from radt.collectors.store.tracking import connect

    restore_interrupts()
    finish_leftovers()  # trees, runs, workloads and gates that killed radt processes left
    undo_leftovers(report)
    client = connect(opts.store)
    failed = 0
    todo = [w for w in workloads if w.state() == "todo" or (opts.rerun and w.state() == "failed")]
    place = {id(w): n for n, w in enumerate(todo, start=1)}  # by identity: comparing workloads field by field is O(n) each
    for number, workload in enumerate(workloads):
        if id(workload) not in place:
            report(f"radt: workload {workload.label} already {workload.state().upper()}, skipped")
            continue
        experiment_id = open_experiment(client, opts.store, workload)
        report(f"radt: workload {workload.label} ({place[id(workload)]} of {len(todo)} to run): {len(workload.runs)} run(s)")
        runner = WorkloadRunner(opts, exp, workload, client, experiment_id)
        status = runner.execute()
        where = f"its statuses are not in {opts.csv} yet ({exp.refused or 'not written'})" if exp.unwritten else f"statuses written to {opts.csv}"
        report(f"radt: workload {workload.label} {status}; {where}")
        if status == "KILLED" and runner.interrupted:
            rest = len(workloads) - number - 1
            report(f"radt: stopped; {rest} later workload(s) not started. Run the same command to carry on.")
            exp.say_notes(report)
            return 130
        failed += status != "FINISHED"
    return 1 if exp.say_notes(report) or failed else 0
