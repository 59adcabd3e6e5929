"""A run's local folder and its last writes (logs, tags, final status), shared by the runner,
`radt monitor`, `radt sync` and the reaper: each of them ends runs the same way.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

from radt.collectors._common import UsageError, first_line
from radt.collectors.run.artifacts import attach_logs
from radt.collectors.sources import gpus
from radt.collectors.sources.nvml import gpu_inventory
from radt.collectors.store.nodes import node_scoped, worst
from radt.collectors.store.tracking import find_runs, set_tags
from radt.collectors.store.writer import StoreTimeout, call_with_deadline
from radt.errors import report
from radt.rundir import DONE_FILE, LOGS_DIR, META_FILE, PENDING_FILE, claim_run_dir, owner_pid, write_whole
from radt.runmodel import (
    EXIT_CODE_TAG,
    PARENT_TAG,
    POINTS_TAG,
    PROMETHEUS_GAP_TAG,
    SCRIPT_END_TAG,
    SCRIPT_START_TAG,
    STOP_REASON_TAG,
    node_statuses,
    node_tag,
)
from radt.settings import FINISH_TIMEOUT, radt_home, runs_dir


def local_run_dir(store: str, run_id: str, parent_id: str | None, node: str | None = None, **extra) -> Path:
    """The run's folder under RADT_HOME/runs: logs/, and meta.json, which `radt sync` reads to finish
    the run if this radt dies (which store, which process on which host).

    This process owns the folder (its lock, see writer.claim_run_dir) before meta.json exists, so
    `radt sync` never takes a live run for a dead one."""
    run_dir = runs_dir() / (f"{run_id}@{node}" if node else run_id)  # two nodes of one run may share a host
    (run_dir / LOGS_DIR).mkdir(parents=True, exist_ok=True)
    if claim_run_dir(run_dir) is None:
        raise UsageError(f"the run folder {run_dir} belongs to another radt process (pid {owner_pid(run_dir)}); stop it first")
    meta = {"store": store, "run_id": run_id, "parent_id": parent_id, "pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), **extra}
    if node:
        meta["node"] = node
    write_whole(run_dir / META_FILE, json.dumps(meta))
    return run_dir


def describe_environment(logs: Path, plan: gpus.Plan | None = None) -> None:
    """The GPU inventory (cheap, at start), with the run's series under "watched"; pip freeze runs after the training (see freeze)."""
    if plan is not None and plan.machine is None:
        inventory = {"available": False, "reason": plan.reason}
    elif plan is not None:
        inventory = gpu_inventory(plan.machine, gpus.series_entries(plan.watched or []))
    else:
        inventory = gpu_inventory()
    (logs / "gpu-inventory.json").write_text(json.dumps(inventory, indent=2))


def freeze(logs: Path) -> None:
    """pip freeze of the script's interpreter, taken after the training so it never slows an epoch.

    Kept per interpreter until a package is installed or removed (its site-packages folder
    changes), so a CSV experiment of a hundred runs does not spend a second per run on it."""
    cached = freeze_cache()
    if cached.exists():
        shutil.copyfile(cached, logs / "pip-freeze.txt")
        return
    try:
        frozen = subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True, timeout=120)
        (logs / "pip-freeze.txt").write_text(frozen.stdout or frozen.stderr)
        if frozen.returncode == 0:
            tmp = cached.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(frozen.stdout)
            tmp.replace(cached)
    except (OSError, subprocess.SubprocessError) as exc:
        (logs / "pip-freeze.txt").write_text(f"pip freeze failed: {exc}\n")


def freeze_cache() -> Path:
    """Where this interpreter's last pip freeze is kept; the name changes with any install or removal."""
    import hashlib

    stamp = [sys.executable]
    for entry in sys.path:
        path = Path(entry)
        if path.name in ("site-packages", "dist-packages") and path.is_dir():
            stamp.append(f"{path}:{path.stat().st_mtime_ns}")
    folder = radt_home() / "cache"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"pip-freeze-{hashlib.sha1('|'.join(stamp).encode()).hexdigest()[:16]}.txt"


class Unwritten:
    """What of a run's folder its disk refused (a full disk): bytes of the script's output per log, and radt's own files.

    The run goes on without them; `line()` says it all once at the end, so a full disk is one line, not one per file."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.output: dict[str, int] = {}  # log name -> bytes of the script's output not in it (each tee adds to its own)
        self.files: list[str] = []  # radt's own files not written, relative to the run folder
        self.reason: str | None = None  # the first refusal's, as the OS says it

    def lost_output(self, log: Path, count: int, exc: OSError | None = None) -> None:
        self.output[log.name] = self.output.get(log.name, 0) + count
        self._refused(exc)

    def file(self, path: Path, exc: OSError) -> None:
        self.files.append(str(path.relative_to(self.run_dir)) if path.is_relative_to(self.run_dir) else str(path))
        self._refused(exc)

    def _refused(self, exc: OSError | None) -> None:
        if exc is not None and self.reason is None:
            self.reason = exc.strerror or str(exc)

    def line(self) -> str | None:
        """The one line at the run's end, or None when the disk took everything."""
        lost = sum(self.output.values())
        if not lost and not self.files:
            return None
        parts = [f"{lost:,} bytes of the script's output are not in its logs (the terminal got them)"] if lost else []
        if self.files:
            parts.append(f"not written {'either' if lost else 'there'}: {', '.join(self.files)}")
        return f"radt: {self.run_dir} could not be written ({self.reason or 'no reason given'}): {'; '.join(parts)}"


class RunPart(NamedTuple):
    """Which run radt ends (a node's part of it, `node`), its local folder, and the workload parent it ends too (-w)."""

    run_id: str
    run_dir: Path
    parent_id: str | None = None
    node: str | None = None


class RunEnd(NamedTuple):
    """How a run ended: its status, the script's exit code, why it stopped; the script's own start and exit (epoch ms,
    the duration the comparison table uses); further run tags (a source's gap), node-scoped like the others."""

    status: str
    returncode: int = 0
    stop_reason: str | None = None
    script_ms: tuple[int, int] | None = None
    tags: dict[str, str] | None = None


def finish_run(
    client, part: RunPart, end: RunEnd, all_written: bool, points: int, deadline: float | None = None, cancel: threading.Event | None = None
) -> None:
    """Attach logs, tag and terminate the run (and its workload parent); on failure leave it to `radt sync`.
    A node's part (`part.node`) ends its part; the run ends with the last part (see complete_run).

    ``all_written``: nothing of the run waits in its spool; ``points``: radt.points.
    ``deadline`` (monotonic; at least a second from now) bounds the store calls, FINISH_TIMEOUT without
    it; ``cancel`` (Ctrl-C at exit) stops them: what is not sent waits in pending.json for `radt sync`."""
    run_dir, run_id, status, script_ms, stop_reason = part.run_dir, part.run_id, end.status, end.script_ms, end.stop_reason
    tags = {**(end.tags or {}), EXIT_CODE_TAG: str(end.returncode), POINTS_TAG: str(points)}
    if script_ms:
        tags[SCRIPT_START_TAG], tags[SCRIPT_END_TAG] = str(script_ms[0]), str(script_ms[1])
    if stop_reason:
        tags[STOP_REASON_TAG] = stop_reason
    end_time = int(time.time() * 1000)
    pending = {"status": status, "end_time": end_time, "tags": tags, "parent_id": part.parent_id}
    if part.node:
        pending["node"] = part.node
    if not all_written:
        unsaved = write_pending(run_dir, pending)
        if unsaved is None:
            report(f"radt: samples and the final status of run {run_id} wait in {run_dir}; run 'radt sync' once the store answers")
            return
        # a final status with nowhere to wait (a full disk) is written now, where the store answers: the rest waits for sync
        report(f"radt: cannot save the final status in {run_dir} ({unsaved}); ending run {run_id} now, what it has not sent stays there for 'radt sync'")
    timeout = max(1.0, deadline - time.monotonic()) if deadline is not None else FINISH_TIMEOUT.get()
    try:
        call_with_deadline(lambda: complete_run(client, run_dir, run_id, pending), timeout, cancel.is_set if cancel else lambda: False)
    except Exception as exc:
        save_pending(run_dir, pending)
        reason = first_line(exc)
        if cancel and cancel.is_set():
            reason = "interrupted"
        elif isinstance(exc, StoreTimeout):
            reason = f"the store did not answer within {timeout:.0f} s"
        report(f"radt: could not finish run {run_id} ({reason}); run 'radt sync' when the store is back")
        return
    try:
        (run_dir / DONE_FILE).touch()
    except OSError:
        pass  # `radt sync` finds the run ended and says nothing more
    report(f"radt: run {run_id} {ended(end)}, {points} points written")


def ended(end: RunEnd) -> str:
    """The status as the last line says it: a FAILED run with why (the script's exit status, or the signal that killed it)."""
    if end.status != "FAILED" or not end.returncode:
        return end.status
    if end.returncode < 0:
        try:
            return f"FAILED (the script was killed by {signal.Signals(-end.returncode).name})"
        except ValueError:
            return f"FAILED (the script was killed by signal {-end.returncode})"
    return f"FAILED (the script exited with status {end.returncode})"


def write_pending(run_dir: Path, pending: dict) -> str | None:
    """The final status that waits for `radt sync` (written whole or not at all); None, or why the disk refused it."""
    try:
        write_whole(run_dir / PENDING_FILE, json.dumps(pending))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def save_pending(run_dir: Path, pending: dict) -> None:
    """write_pending, said in one line where the disk refuses it: the run is then left for `radt sync` to end KILLED."""
    unsaved = write_pending(run_dir, pending)
    if unsaved is not None:
        report(f"radt: cannot save the final status in {run_dir} ({unsaved}); 'radt sync' will end the run KILLED")


def complete_run(client, run_dir: Path, run_id: str, pending: dict) -> None:
    """The last writes of a run: logs as artifacts, tags, status; the parent when its children are done.

    A node's part writes its logs under radt/<node> and its tags as radt.node.<node>/...; the run itself
    ends only when no node's part runs, with the worst status of its parts and tags summed over them."""
    node = pending.get("node")
    failed = attach_logs(client, run_dir, run_id, node)
    attached = failed is None
    if failed:  # the logs wait in run_dir, and this part's last writes in pending.json, for `radt sync` to repeat
        unsaved = write_pending(run_dir, pending)
        then = "'radt sync' uploads them" if unsaved is None else f"'radt sync' cannot upload them ({PENDING_FILE} cannot be written: {unsaved})"
        report(f"radt: {failed}; they stay in {run_dir / LOGS_DIR}, {then}")
    if node:
        set_tags(client, run_id, {**node_scoped(pending["tags"], node), node_tag(node): pending["status"]})
        tags = client.get_run(run_id).data.tags  # read after this node's own write: of two nodes ending at once, one sees both
        status = worst(list(node_statuses(tags).values()))
        if status == "RUNNING":
            if attached:
                (run_dir / PENDING_FILE).unlink(missing_ok=True)
            return
        pending = {**pending, "status": status, "tags": run_tags_of_nodes(tags)}
    set_tags(client, run_id, pending["tags"])
    client.set_terminated(run_id, status=pending["status"], end_time=pending["end_time"])
    from radt.collectors.diagnose.stored import diagnose_ended, said  # here: a run's start never loads the diagnosis

    diagnosis = diagnose_ended(client, run_id)
    if diagnosis is not None and diagnosis.findings:
        report(f"radt: {said(run_id, diagnosis)}")
    parent_id = pending.get("parent_id")
    if parent_id:  # a -w workload: RUNNING while a run of it runs, then the worst of its runs (FAILED > KILLED > FINISHED)
        experiment = [client.get_run(parent_id).info.experiment_id]

        def any_child(status: str) -> bool:
            return bool(find_runs(client, experiment, {PARENT_TAG: parent_id}, status=status, max_results=1))

        if not any_child("RUNNING"):
            worst_child = next((status for status in ("FAILED", "KILLED") if any_child(status)), "FINISHED")
            client.set_terminated(parent_id, status=worst_child, end_time=pending["end_time"])
    if attached:
        (run_dir / PENDING_FILE).unlink(missing_ok=True)


def run_tags_of_nodes(tags: dict[str, str]) -> dict[str, str]:
    """The run's own tags from its nodes' parts: the first failing exit code, points summed, the script from first start to last end."""
    nodes = sorted(node_statuses(tags))

    def each(what: str) -> list[str]:
        return [tags[node_tag(n, what)] for n in nodes if node_tag(n, what) in tags]

    found: dict[str, str] = {}
    codes = each(EXIT_CODE_TAG.removeprefix("radt."))
    if codes:
        found[EXIT_CODE_TAG] = next((c for c in codes if c != "0"), "0")
    points = [int(p) for p in each(POINTS_TAG.removeprefix("radt.")) if p.isdigit()]
    if points:
        found[POINTS_TAG] = str(sum(points))
    starts = [int(v) for v in each(SCRIPT_START_TAG.removeprefix("radt.")) if v.isdigit()]
    ends = [int(v) for v in each(SCRIPT_END_TAG.removeprefix("radt.")) if v.isdigit()]
    if starts and ends:
        found[SCRIPT_START_TAG], found[SCRIPT_END_TAG] = str(min(starts)), str(max(ends))
    reasons = sorted(set(each(STOP_REASON_TAG.removeprefix("radt."))))
    if reasons:
        found[STOP_REASON_TAG] = ",".join(reasons)
    gap = PROMETHEUS_GAP_TAG.removeprefix("radt.")
    gaps = {n: tags[node_tag(n, gap)] for n in nodes if node_tag(n, gap) in tags}
    if gaps:
        found[PROMETHEUS_GAP_TAG] = "; ".join(f"{n}: {reason}" for n, reason in gaps.items())
    return found


def killed(parent_id: str | None, node: str | None = None) -> dict:
    """The final status of a run (or a node's part of it) whose radt process died: KILLED, tagged radt_killed."""
    pending = {"status": "KILLED", "end_time": int(time.time() * 1000), "tags": {STOP_REASON_TAG: "radt_killed"}, "parent_id": parent_id}
    if node:
        pending["node"] = node
    return pending


def finish(client, run_dir, run_id: str, pending: dict) -> None:
    """complete_run within FINISH_TIMEOUT s (complete_run removes pending.json once the run is ended)."""
    call_with_deadline(lambda: complete_run(client, run_dir, run_id, pending), FINISH_TIMEOUT.get())


def mark_killed(client, run_dir, run_id: str, parent_id: str | None, node: str | None = None, points: int | None = None) -> None:
    """End a run (or a node's part) whose radt process died: KILLED, tagged radt_killed, with the logs it left attached
    and, where counted, radt.points (a SIGKILLed radt never wrote its count)."""
    pending = killed(parent_id, node)
    if points is not None:
        pending["tags"][POINTS_TAG] = str(points)  # complete_run scopes it to the node
    finish(client, run_dir, run_id, pending)
