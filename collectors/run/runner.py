"""Track one training script: create the run, sample while the script trains, finish the run.

The script runs as a child in its own session (so Ctrl-C reaches radt once and is forwarded
once), with MLFLOW_RUN_ID set so `mlflow.start_run()` inside it joins the same run. Every exit
path stops the samplers, flushes the writer, attaches the logs and sets the final status: the parts
open on one recording.Recording, which closes them in reverse whichever way run_script leaves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import psutil

import radt
from radt import settings
from radt.collectors._common import UsageError
from radt.collectors.process.proctree import ProcessTree, become_subreaper, check_cgroup, child_setup, make_cgroup, restore_interrupts
from radt.collectors.process.watchdog import Guard, kill_recorded, read_record, remove_cgroup
from radt.collectors.run.command import build_command, exec_failure
from radt.collectors.run.finish import RunEnd, RunPart, Unwritten, describe_environment, local_run_dir
from radt.collectors.run.profilers import wrap
from radt.collectors.run.recording import Recording
from radt.collectors.run.sampler import Sampler
from radt.collectors.run.scriptlog import ScriptLog
from radt.collectors.sources import gpus
from radt.collectors.sources.base import SamplingContext
from radt.collectors.store.nodes import membership, node_scoped, on_node
from radt.collectors.store.tracking import ADDED_ENV, NewRun, check_parent, connect, create_run, join_run, resolve_experiment, set_tags
from radt.collocation import SHARED
from radt.errors import report
from radt.rundir import CONTEXT_FILE, LOGS_DIR, STARTED_FILE, STOP_REASON_FILE
from radt.runmodel import GPU_SHARE_TAG, GPUS_TAG, INTERVAL_TAG, MIG_ACTIVITY_TAG, PROMETHEUS_GAP_TAG
from radt.settings import POINTS_LOST_EXIT, display_uri, radt_home

STOP_GRACE = 30.0  # seconds between SIGINT and SIGTERM, and SIGTERM and SIGKILL, at --max-time


@dataclass
class RunOptions:
    script: str
    script_args: list[str] = field(default_factory=list)
    store: str = ""
    experiment: str | None = None
    name: str | None = None
    workload: str | None = None
    devices: list[int | str] | None = None  # -d: NVML indices and GPU-/MIG- UUIDs
    listeners: list[str] = field(default_factory=lambda: ["nvml", "host"])
    interval: float = field(default_factory=settings.INTERVAL.get)
    max_epoch: int | None = None
    max_time: float | None = None  # minutes
    manual: bool = False
    letter: str = "A"
    collocation: str = SHARED.cell
    flush_timeout: float = field(default_factory=settings.FLUSH_TIMEOUT.get)
    profiler: str | None = None  # nsys/ncu wrapping the command (collectors/run/profilers.py)
    parent_run: str | None = None  # a workload parent that the CSV scheduler creates and ends
    cuda_visible: str | None = None  # CUDA_VISIBLE_DEVICES when it is not -d (a MIG UUID, an MPS daemon's numbering)
    start_gate: Path | None = None  # CSV workloads: wait here so that collocated runs start together


def check_devices(devices: list[int | str] | None, cuda_visible: str | None = None, environ: dict[str, str] | None = None) -> gpus.Plan:
    """Map -d (or CUDA_VISIBLE_DEVICES) to this machine's GPUs by UUID and PCI bus id; refuse what it lacks.

    Notes (a CUDA order radt can only estimate, a CUDA_VISIBLE_DEVICES entry CUDA stops at, no NVML
    with -d) are said once here; without NVML the plan keeps radt's old behaviour."""
    environ = os.environ if environ is None else environ
    try:
        plan = gpus.plan(devices, cuda_visible, environ, gpus.machine())
    except gpus.NvmlUnavailable as exc:
        plan = gpus.plan_without_nvml(devices, cuda_visible, environ, str(exc))
    except gpus.DeviceError as exc:
        raise UsageError(str(exc)) from exc
    for note in plan.notes:
        report(note)
    return plan


def watched_devices(devices: list[int] | None, visible: str | None) -> list[int] | None:
    """Without NVML: GPUs the samplers watch: -d, else CUDA_VISIBLE_DEVICES when it lists indices, else all (None); UUIDs never all."""
    indices, note = gpus.fallback_indices(devices, visible)
    if note:
        report(note)
    return indices


def gpu_tags(plan: gpus.Plan, sources: list) -> dict[str, str]:
    """radt.gpus (which physical device each series is) and, for a MIG run whose slice's own activity cannot be read, radt.mig_activity."""
    if plan.watched is None:
        return {}
    tags = {GPUS_TAG: gpus.gpus_tag(gpus.series_entries(plan.watched))}
    if plan.slices:  # the tag only when no running source (nvml: GPM per instance, dcgm: dmon's GPU-I lines) reads the slice
        readers = [s for s in sources if s.name in ("nvml", "dcgm")]
        reasons = {s.name: s.describe().get("mig_activity") for s in readers}
        if not readers:
            tags[MIG_ACTIVITY_TAG] = "unavailable: neither the nvml nor the dcgm listener is running; no series of the slice's own activity"
        elif all(reasons.values()):
            tags[MIG_ACTIVITY_TAG] = "; ".join(reasons.values()) if len(reasons) == 1 else "; ".join(f"{n}: {r}" for n, r in reasons.items())
    return tags | share_tag(sources) if plan.watched else tags


def share_tag(sources: list, at_end: bool = False) -> dict[str, str]:
    """radt.gpu_share, why the run has no share series of its own on a GPU ("device only"), said once: at the start
    what the nvml listener found opening, at the end again only where a reason turned up while sampling (MPS)."""
    nvml = next((s for s in sources if s.name == "nvml"), None)
    if nvml is None:
        return {} if at_end else {GPU_SHARE_TAG: "device only: the nvml listener is not running, and only NVML gives per-process figures"}
    if at_end and not nvml.share_found_later:
        return {}
    reason = nvml.share_reason()
    return {GPU_SHARE_TAG: reason} if reason else {}


def child_environment(
    opts: RunOptions, run_id: str, experiment_id: str, run_dir: Path, deadline: float | None, plan: gpus.Plan | None = None
) -> dict[str, str]:
    """The script's environment; its CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER from `plan` (check_devices), so that it sees what radt watches."""
    env = {k: v for k, v in os.environ.items() if k not in ADDED_ENV}
    env.update(
        {
            "MLFLOW_TRACKING_URI": opts.store,
            "MLFLOW_RUN_ID": run_id,
            "MLFLOW_EXPERIMENT_ID": experiment_id,
            "RADT_RUN_DIR": str(run_dir),
            "RADT_MANUAL": "1" if opts.manual else "0",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if opts.max_epoch is not None:
        env["RADT_MAX_EPOCH"] = str(opts.max_epoch)
    if deadline is not None:
        env["RADT_DEADLINE"] = f"{deadline:.3f}"
    if plan is None:  # no mapping known: -d as given
        plan = gpus.plan_without_nvml(opts.devices, opts.cuda_visible, env)
    if plan.visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = plan.visible
    if plan.order is not None:
        env.setdefault("CUDA_DEVICE_ORDER", plan.order)  # CUDA numbers GPUs as nvidia-smi and -d do; a user's own order gets UUIDs
    # `import radt` works in the script whatever interpreter runs it, and nothing else of radt's is on its path
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(radt_import_path())) if p)
    return env


def radt_import_path() -> Path:
    """A folder holding only a link to the `radt` package, for the script's PYTHONPATH: `import radt` works
    from any interpreter (torchrun, a conda python) and radt's app/, pages/ and tests/ shadow nothing of the user's."""
    folder = radt_home() / "pythonpath"
    folder.mkdir(parents=True, exist_ok=True)
    link, target = folder / "radt", Path(radt.__file__).resolve().parent
    if not (link.is_symlink() and Path(os.readlink(link)) == target):
        spare = folder / f".radt.{os.getpid()}"
        spare.unlink(missing_ok=True)
        spare.symlink_to(target, target_is_directory=True)
        os.replace(spare, link)  # atomic: a run starting beside this one sees the old link or the new, never none
    return folder


def _tee(source, sink, log: ScriptOutputLog) -> threading.Thread:
    """Copy a child stream to the terminal and a log file as bytes arrive (progress bars included).

    A log that cannot be written (a full disk) is given up (ScriptOutputLog): the stream is still read to its
    end, so the script never blocks on a full pipe, and the terminal still gets every byte."""

    def pump() -> None:
        fd = source.fileno()
        log.open()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            log.write(chunk)
            try:
                sink.write(chunk)
                sink.flush()
            except (OSError, ValueError):
                pass  # terminal gone: keep the log
        log.close()

    thread = threading.Thread(target=pump, name="radt-tee", daemon=True)
    thread.start()
    return thread


class ScriptOutputLog:
    """One of the script's logs (stdout.log, stderr.log): the first write its disk refuses is said once, and from there
    on every byte not written is counted in `unwritten` (the run's end says the total)."""

    def __init__(self, path: Path, unwritten: Unwritten) -> None:
        self.path, self.unwritten = path, unwritten
        self._file = None
        self._broken = False

    def open(self) -> None:
        self._step(b"")

    def write(self, chunk: bytes) -> None:
        if self._broken:
            self.unwritten.lost_output(self.path, len(chunk))
        else:
            self._step(chunk)

    def _step(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        try:
            if self._file is None:
                self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - closed at the stream's end
            while view:
                view = view[self._file.write(view) :]
        except OSError as exc:
            self._broken = True
            report(f"radt: cannot write the script's output to {self.path} ({exc.strerror or exc}); from here on it goes to the terminal only")
            self.unwritten.lost_output(self.path, len(view), exc)
            self.close()

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None


def _kill_tree(pid: int, leftovers: list[psutil.Process]) -> None:
    """No child outlives radt: the child's process group and every descendant seen."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        alive = []
        for proc in leftovers:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    proc.send_signal(sig)
                    alive.append(proc)
            except psutil.Error:
                continue
        if not alive:
            return
        _, leftovers = psutil.wait_procs(alive, timeout=3)


class Supervisor:
    """Forwards Ctrl-C/SIGTERM to the child's group, and enforces --max-time.

    A script inside `with radt.run()` (it wrote CONTEXT_FILE) stops itself at its next log_metric past
    the deadline and may save its checkpoint; it gets SIGINT only if it has not said so (STOP_REASON_FILE)
    STOP_GRACE s after the deadline. Twice a second `refresh` (the process tree's record) runs too."""

    def __init__(self, child: subprocess.Popen, deadline: float | None, run_dir: Path | None = None, refresh=None) -> None:
        self.child = child
        self.deadline = deadline
        self.run_dir = run_dir
        self.refresh = refresh or (lambda: None)
        self.interrupted: int | None = None
        self.time_limited = False  # radt had to interrupt the script at --max-time
        self._deadline_seen = False
        self._self_stop_by: float | None = None
        self._escalate_at: float | None = None
        self._escalation = [signal.SIGTERM, signal.SIGKILL]

    def _flag(self, name: str) -> bool:
        return self.run_dir is not None and (self.run_dir / name).exists()

    def _limit(self, now: float) -> None:
        self.time_limited = True
        report("radt: --max-time reached, stopping the script")
        self._send(signal.SIGINT)
        self._escalate_at = now + STOP_GRACE

    def _send(self, sig: int) -> None:
        try:
            os.killpg(self.child.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def on_signal(self, signum: int, _frame) -> None:
        if self.child.poll() is not None:
            return
        if self.interrupted is None:
            self.interrupted = signum
            report(f"radt: {signal.Signals(signum).name} received, stopping the script (again to force)")
            self._send(signum)
            self._escalate_at = time.monotonic() + STOP_GRACE
        else:
            report("radt: forcing the script to stop")
            self._send(signal.SIGKILL)

    def wait(self) -> int:
        """Block until the child exits; wake twice a second only for --max-time and escalation.

        A thread waits on the child (no polling); Popen.wait(timeout) would wake radt up to 1000
        times a second and steal time from a training that fills every core.
        """
        exited = threading.Event()
        threading.Thread(target=lambda: (self.child.wait(), exited.set()), name="radt-wait", daemon=True).start()
        while not exited.wait(0.5):
            self.refresh()
            now = time.monotonic()
            if self.deadline is not None and not self._deadline_seen and time.time() >= self.deadline:
                self._deadline_seen = True
                if self._flag(CONTEXT_FILE):
                    self._self_stop_by = now + STOP_GRACE
                else:
                    self._limit(now)
            if self._self_stop_by is not None and now >= self._self_stop_by:
                self._self_stop_by = None
                if not self._flag(STOP_REASON_FILE):  # not at a log_metric in time; one that is saving its checkpoint is left to finish
                    report(f"radt: --max-time passed {STOP_GRACE:.0f} s ago and the script has not called log_metric since")
                    self._limit(now)
            if self._escalate_at is not None and now >= self._escalate_at and self._escalation:
                self._send(self._escalation.pop(0))
                self._escalate_at = now + STOP_GRACE
        return self.child.returncode


def _prometheus_final(sampler: Sampler, start_ms: int, end_ms: int, put, plan: gpus.Plan | None = None) -> dict[str, str]:
    """The prometheus listener's scrapes stored after its last tick go into the run (its series only, see owners.py);
    returns its gap tag for finish_run, if any, and radt.gpus with the MIG slices it found the run on. Never fails the run."""
    if "radt.collectors.sources.prometheus" not in sys.modules:  # no such listener was built (listeners.py imports it for one)
        return {}  # and the end of every other run does not import `requests` for nothing (~35 ms of radt's end cost)
    try:
        from radt.collectors.sources.prometheus import PrometheusSource, final_backfill, gap

        for source in sampler.sources:
            if isinstance(source, PrometheusSource):
                put(sampler.owners.late(source, final_backfill(source, start_ms, end_ms)))
                found = [s for s in source.wanted.slices if plan is not None and s not in plan.slices]
                tags = {GPUS_TAG: gpus.gpus_tag(gpus.series_entries(gpus.with_slices(plan, found)))} if found else {}
                if gap(source):
                    return tags | {PROMETHEUS_GAP_TAG: gap(source)}
                return tags
    except Exception as exc:
        report(f"radt: listener 'prometheus': its last scrapes not read ({type(exc).__name__}: {exc})")
    return {}


def final_status(returncode: int, supervisor: Supervisor, stop_reason: str | None) -> str:
    """radt's --max-time interrupt, or the script's own stop at a limit (radt.run()) that exited 0: FINISHED."""
    if supervisor.time_limited or (stop_reason and returncode == 0):
        return "FINISHED"
    if supervisor.interrupted is not None:
        return "KILLED"
    return "FINISHED" if returncode == 0 else "FAILED"


def exit_code(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode


class StartGate:
    """A CSV workload's synchronised start: say 'ready' with the run id, then wait for 'go' (or 'abort')."""

    def __init__(self, folder: Path, letter: str) -> None:
        self.folder = folder
        self.letter = letter
        self.signals: list[int] = []

    def on_signal(self, signum: int, _frame) -> None:
        self.signals.append(signum)

    def wait(self, run_id: str) -> bool:
        """True once the scheduler says go; False when it aborts, dies, or a signal arrives first."""
        tmp = self.folder / f".ready-{self.letter}"
        tmp.write_text(run_id)
        tmp.rename(self.folder / f"ready-{self.letter}")
        parent = os.getppid()
        while not self.signals:
            if (self.folder / "go").exists():
                return True
            if (self.folder / "abort").exists() or os.getppid() != parent:
                return False
            time.sleep(0.01)
        return False

    def record(self, status: str) -> None:
        (self.folder / f"status-{self.letter}").write_text(status)


def run_script(opts: RunOptions) -> int:
    """Run and track one script; returns the script's exit code for radt to pass through."""
    command = build_command(opts.script, opts.script_args)
    restore_interrupts()
    become_subreaper()
    gpu_plan = check_devices(opts.devices, opts.cuda_visible)
    gate = StartGate(opts.start_gate, opts.letter) if opts.start_gate else None
    with Recording(opts.flush_timeout) as rec:
        if gate:
            rec.catch_signals(gate.on_signal)  # before the run exists: a Ctrl-C while it is created calls it off
            rec.callback(lambda: rec.end and gate.record(rec.end.status))  # after finish_run: the scheduler reads it
        code = _record(rec, opts, command, gpu_plan, gate)
    if rec.writer.lost and code == 0:
        report(f"radt: exit status {POINTS_LOST_EXIT}: the script succeeded, but {rec.writer.lost:,} points of its run were lost (see above)")
        return POINTS_LOST_EXIT
    return code


def _open_run(opts: RunOptions, client, command: list[str], member) -> tuple[RunPart, str]:
    """Create the run (or join it, a node of a multi-node run) and claim its local folder; the run's part and experiment id."""
    run_settings = {INTERVAL_TAG: str(opts.interval), "max_epoch": str(opts.max_epoch), "max_time": str(opts.max_time), "manual": str(opts.manual)}
    if member.run_id:  # a node joining a run that exists (MLFLOW_RUN_ID + MLFLOW_SYSTEM_METRICS_NODE_ID)
        run_id = member.run_id
        experiment_id, parent_id = join_run(client, run_id, member.node)
    else:
        if opts.parent_run:
            check_parent(client, opts.parent_run, opts.experiment)
        experiment_id = resolve_experiment(client, opts.store, opts.experiment)
        run_id, parent_id = create_run(
            client,
            experiment_id,
            NewRun(
                command=command,
                script=opts.script,
                script_args=opts.script_args,
                run_name=opts.name,
                workload=opts.workload,
                parent_id=opts.parent_run,
                letter=opts.letter,
                devices="+".join(map(str, opts.devices)) if opts.devices is not None else os.environ.get("CUDA_VISIBLE_DEVICES", "all"),
                collocation=opts.collocation,
                listeners=opts.listeners,
                settings=run_settings,
                profiler=opts.profiler,
            ),
            member=member,
        )
    if opts.parent_run:
        parent_id = None  # the scheduler ends the workload's parent run, not its children
    run_dir = local_run_dir(opts.store, run_id, parent_id, node=member.node)
    part = f" as node {member.node}" if member.node else ""
    report(f"radt: run {run_id}{part} in experiment {experiment_id} (store {display_uri(opts.store)})")
    return RunPart(run_id, run_dir, parent_id, member.node), experiment_id


class Prepared(NamedTuple):
    """What is set up before the script starts: the run, its process tree's record, sources, command and containment."""

    client: object
    part: RunPart
    experiment_id: str
    tree: ProcessTree
    sources: list
    command: list[str]
    profiler_env: dict[str, str]
    cgroup: str | None
    guard: Guard


def _prepare(rec: Recording, opts: RunOptions, command: list[str], gpu_plan: gpus.Plan) -> Prepared:
    """The run, its writer and sources on the recording; the GPU tags, the profiler's command, the cgroup and the watchdog."""
    member = membership(os.environ)
    client = connect(opts.store)
    part, experiment_id = _open_run(opts, client, command, member)
    logs = part.run_dir / LOGS_DIR
    rec.write(client, part, opts.store)
    tree = ProcessTree(record=part.run_dir)  # tree.json, for the watchdog and the reaper
    ctx = SamplingContext(interval=opts.interval, devices=gpu_plan.indices, slices=gpu_plan.slices, pids=tree.processes, given=gpu_plan.unmapped)
    sources = rec.open_sources(opts.listeners, ctx)
    describe_environment(logs, gpu_plan)
    if gpu_plan.watched is not None:
        set_tags(client, part.run_id, node_scoped(gpu_tags(gpu_plan, sources), member.node))
    command, profiler_env = wrap(opts.profiler, command, logs, f"{experiment_id}_{opts.workload or 'run'}_{opts.letter}")
    # before a CSV workload's gate: once it opens, only the script's own start is left
    cgroup = make_cgroup(f"radt-{part.run_id[:12]}-{os.getpid()}")
    guard = Guard.start(part.run_dir)  # kills the tree if this process dies without doing it
    rec.callback(_release, guard, cgroup)
    return Prepared(client, part, experiment_id, tree, sources, command, profiler_env, cgroup, guard)


def _record(rec: Recording, opts: RunOptions, command: list[str], gpu_plan: gpus.Plan, gate: StartGate | None) -> int:
    """Open the recording's parts, start the script and wait for it; sets `rec.end` and returns radt's exit code."""
    run = _prepare(rec, opts, command, gpu_plan)
    part, logs = run.part, run.part.run_dir / LOGS_DIR
    if gate and not gate.wait(part.run_id):
        report(f"radt: run {opts.letter} did not start: {'interrupted' if gate.signals else 'the workload was called off'}")
        rec.end = RunEnd("KILLED", -signal.SIGINT, "not_started")
        return 130
    deadline = time.time() + opts.max_time * 60 if opts.max_time else None
    child_env = child_environment(opts, part.run_id, run.experiment_id, part.run_dir, deadline, gpu_plan)
    child_env.update(run.profiler_env)
    caught: list[int] = []  # a Ctrl-C between the script's start and the supervisor's handlers: passed on, not lost
    _touch_logs(logs)
    if not gate:
        rec.catch_signals(lambda signum, _frame: caught.append(signum))
    try:
        child = _popen(run.command, child_env, run.cgroup)
    except OSError as exc:  # the file changed since build_command checked it, or the kernel refuses it
        code = _cannot_start(logs, run.command[0], exc)
        rec.end = RunEnd("FAILED", code)
        return code
    supervisor = Supervisor(child, deadline, part.run_dir, run.tree.processes)
    script_start_ms = _follow(rec, opts, run, child, gpu_plan)
    rec.catch_signals(supervisor.on_signal)
    if gate and gate.signals:  # a signal between the gate opening and now
        supervisor.on_signal(gate.signals[0], None)
    elif caught:  # a signal since the script started (radt started with SIGINT ignored would have dropped it)
        supervisor.on_signal(caught[0], None)
    returncode = supervisor.wait()
    rec.end = _outcome(part.run_dir, returncode, supervisor, (script_start_ms, int(time.time() * 1000)))
    return 0 if supervisor.time_limited else exit_code(returncode)


def _touch_logs(logs: Path) -> None:
    for name in ("stdout.log", "stderr.log"):  # there from the script's start: a radt SIGKILLed at once leaves them to sync
        try:
            (logs / name).touch()
        except OSError:
            pass  # a full disk: the tee says so once


def _outcome(run_dir: Path, returncode: int, supervisor: Supervisor, script_ms: tuple[int, int]) -> RunEnd:
    """The ended script's run: its status, exit code, why it stopped (radt.run()'s own reason, or radt's --max-time)."""
    stop_file = run_dir / STOP_REASON_FILE
    stop_reason = stop_file.read_text().strip() if stop_file.exists() else None
    status = final_status(returncode, supervisor, stop_reason)
    return RunEnd(status, returncode, stop_reason or ("max_time" if supervisor.time_limited else None), script_ms)


def _cannot_start(logs: Path, program: str, exc: OSError) -> int:
    """Say why the script could not start, here and in its stderr.log (attached to the run); its exit code, as a shell gives it."""
    line = exec_failure(program, exc)
    report(f"radt: {line}")
    try:
        with open(logs / "stderr.log", "a") as log:  # attached to the run: the reason is in the store too
            log.write(line + "\n")
    except OSError:
        pass
    return 127 if isinstance(exc, FileNotFoundError) else 126


def _follow(rec: Recording, opts: RunOptions, run: Prepared, child: subprocess.Popen, gpu_plan: gpus.Plan) -> int:
    """The started script's parts on the recording: its tree (stopped first at the end), output tees, sampler, script log.
    Returns the script's start, epoch ms."""
    script_start_ms = int(time.time() * 1000)
    part, logs, guard = run.part, run.part.run_dir / LOGS_DIR, run.guard
    script = Script(child, run.tree, part.run_dir, guard)
    rec.callback(script.stop)  # before the sampler stops: the tree killed, the watchdog released, the output read
    rec.freeze = True
    run.tree.attach(child.pid, check_cgroup(run.cgroup, child.pid), helpers={guard.proc.pid} if guard.proc else None)
    script.tees = [
        _tee(child.stdout, sys.stdout.buffer, ScriptOutputLog(logs / "stdout.log", rec.unwritten)),
        _tee(child.stderr, sys.stderr.buffer, ScriptOutputLog(logs / "stderr.log", rec.unwritten)),
    ]
    put = on_node(rec.writer.put, part.node)
    started_flag = part.run_dir / STARTED_FILE
    rec.sample(
        run.sources,
        opts.interval,
        put,
        start_gate=started_flag.exists if opts.manual else None,
        late=lambda sampler: share_tag(sampler.sources, at_end=True) | _prometheus_final(sampler, script_start_ms, _script_end_ms(rec), put, gpu_plan),
    )
    writer = rec.writer
    rec.script_log = ScriptLog(part.run_dir, part.run_id, run.client, writer.put, report).start(lambda: writer.healthy)  # the script's radt.run() calls
    return script_start_ms


def _script_end_ms(rec: Recording) -> int:
    """The script's exit (epoch ms); now, where radt ends the recording without it (an exception)."""
    return rec.end.script_ms[1] if rec.end and rec.end.script_ms else int(time.time() * 1000)


def _popen(command: list[str], env: dict[str, str], cgroup: str | None) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL if not sys.stdin or not sys.stdin.isatty() else None,
        start_new_session=True,
        preexec_fn=child_setup(cgroup),  # SIGKILL when radt dies, default SIGINT/SIGTERM, into the cgroup
        env=env,
    )


def _release(guard: Guard, cgroup: str | None) -> None:
    """The watchdog told radt is done, and the run's cgroup removed (nothing of the script left in it)."""
    guard.release()
    remove_cgroup(cgroup)


class Script:
    """The training script's process tree as a part of the recording: stop() ends what is left of it, once."""

    def __init__(self, child: subprocess.Popen, tree: ProcessTree, run_dir: Path, guard: Guard) -> None:
        self.child, self.tree, self.run_dir, self.guard = child, tree, run_dir, guard
        self.tees: list[threading.Thread] = []

    def stop(self) -> None:
        leftovers = [p for p in self.tree.processes(fresh=True) if p.pid != self.child.pid]
        _kill_tree(self.child.pid, leftovers)
        kill_recorded(read_record(self.run_dir) or {"cgroup": self.tree.cgroup}, timeout=2.0)  # what escaped the group meanwhile; the cgroup goes
        self.guard.release()
        for tee in self.tees:
            tee.join(5)
