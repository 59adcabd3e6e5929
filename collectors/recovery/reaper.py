"""Finish what a dead radt left behind: its training tree, its RUNNING run, a CSV workload's parent run,
start-gate folder and collocation set-up.

A radt that dies in a way its own code cannot see (SIGKILL, the OOM killer, a power cut) leaves its run
folder (meta.json, and tree.json: the tree as it last saw it, pids with start times) or, for
`radt experiment.csv`, its workload record (RADT_HOME/workloads/<parent run>.json). Its watchdog
(collectors/process/watchdog.py) normally kills the tree within a second; `reap()` is the second line, run at
the start of `radt train.py`, `radt experiment.csv` and `radt sync`. For each folder and record of this
host whose radt is gone it kills what is left of the tree (a pid counts only with its start time, so a
reused pid is never killed), ends the run KILLED (radt.stop_reason=radt_killed, logs attached), ends
the workload's parent run KILLED, marks its RUNNING CSV rows KILLED and removes the gate folder. A folder
whose radt lives (its record's pid and start time, meta.json's pid, the folder's lock) is never touched.
Cheap when there is nothing to do: a directory listing and, per unfinished folder, one small file.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import psutil

from radt.collectors._common import first_line
from radt.collectors.experiment.workloads import GATE_PREFIX, workloads_dir
from radt.collectors.process.watchdog import is_same, kill_recorded, read_record
from radt.rundir import DONE_FILE, LOCK_FILE, PENDING_FILE, BrokenRunFolder, read_meta
from radt.runmodel import STOP_REASON_TAG
from radt.settings import radt_home, runs_dir


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- who is dead -------------------------------------------------------------------------------


def _pid_alive(pid: int | None, start: int | None) -> bool:
    return bool(pid) and (is_same(pid, start) if start else os.path.exists(f"/proc/{pid}"))


def _run_owner_alive(run_dir: Path, meta: dict) -> bool:
    """The run's radt lives: its identity in tree.json, its pid in meta.json (started before the folder), or the folder's lock."""
    record = read_record(run_dir) or {}
    if "radt" in record and _pid_alive(*record["radt"]):
        return True
    try:
        if psutil.Process(meta["pid"]).create_time() <= meta.get("started", 0) + 1:
            return True
    except (KeyError, TypeError, ValueError, psutil.Error):
        pass

    lock = run_dir / LOCK_FILE
    if lock.exists():
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # drops the probe's own lock
    return False


def _dead_runs(host: str) -> list[tuple[Path, dict]]:
    found = []
    for run_dir in sorted(runs_dir().iterdir()):
        if (run_dir / DONE_FILE).exists():
            continue
        try:
            meta = read_meta(run_dir)
        except BrokenRunFolder:
            continue  # no meta.json yet (a radt starting now), or broken: `radt sync` names it
        if meta.get("host") == host and not _run_owner_alive(run_dir, meta):
            found.append((run_dir, meta))
    return found


def _dead_workloads(host: str) -> list[tuple[Path, dict]]:
    folder = workloads_dir()
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("host") == host and not _pid_alive(record.get("pid"), record.get("start")):
            found.append((path, record))
    return found


# --- finishing the job -------------------------------------------------------------------------


class _Stores:
    """One client per store, connected on first use; a store that fails is tried once."""

    def __init__(self) -> None:
        self.clients: dict[str, object] = {}

    def get(self, uri: str):
        if uri not in self.clients:
            from radt.collectors.store.tracking import connect

            try:
                self.clients[uri] = connect(uri)
            except Exception as exc:
                self.clients[uri] = exc
        client = self.clients[uri]
        if isinstance(client, Exception):
            raise client
        return client


def _end_run(stores: _Stores, run_dir: Path, meta: dict) -> str:
    """End a dead radt's run KILLED in its store; what was done, for the message."""
    run_id = meta["run_id"]
    if (run_dir / PENDING_FILE).exists():
        return "its final status waits for 'radt sync'"
    client = stores.get(meta["store"])
    if client.get_run(run_id).info.status != "RUNNING":
        (run_dir / DONE_FILE).touch()
        return "the run had ended"
    from radt.collectors.run.finish import mark_killed
    from radt.collectors.store.stores import stored_points

    points = stored_points(meta["store"], run_id, meta.get("node"))  # what the dead radt wrote; `radt sync` adds its spool's
    mark_killed(client, run_dir, run_id, meta.get("parent_id"), meta.get("node"), points)
    (run_dir / DONE_FILE).touch()  # a spool left behind is still sent by `radt sync`
    return "run ended KILLED"


def _end_workload(stores: _Stores, path: Path, record: dict) -> None:
    """The parent run ends KILLED (or with the status its scheduler could not write), the workload's log attached."""
    client = stores.get(record["store"])
    parent_id = record["parent_id"]
    if client.get_run(parent_id).info.status == "RUNNING":
        log = Path(record.get("gate", "")) / "workload.log"
        if log.is_file():
            client.log_artifact(parent_id, str(log), artifact_path="radt")
        if not record.get("status"):
            client.set_tag(parent_id, STOP_REASON_TAG, "radt_killed")
        client.set_terminated(parent_id, status=record.get("status") or "KILLED")


def _mark_rows(record: dict) -> None:
    """The workload's rows still RUNNING in the CSV say KILLED (the next `radt experiment.csv` runs them again)."""
    csv = Path(record.get("csv", ""))
    if not csv.is_file():
        return
    from radt.collectors.experiment.csvfile import ExperimentFile

    exp = ExperimentFile.load(csv)
    rows = [r for r in exp.rows if r.line in set(record.get("lines", [])) and exp.get(r, "Status") == "RUNNING"]
    for row in rows:
        exp.set(row, "Status", "KILLED")
    if rows:
        exp.save()


def _remove_gate(record: dict) -> None:
    gate = Path(record.get("gate", ""))
    if gate.name.startswith(GATE_PREFIX) and gate.is_dir():
        shutil.rmtree(gate, ignore_errors=True)


def reap(report: Callable[[str], None] = _say, store: str | None = None, wait: bool = True) -> None:
    """Kill the trees and end the runs, workloads and set-up that dead radt processes of this host left.

    `store`: end only the runs of that store (the one this radt is about to use anyway; `radt sync`
    passes None: every store); the processes are killed whatever their store. `wait=False`: skip when
    another radt is reaping right now."""
    try:
        lock = open(radt_home() / "reaper.lock", "a")  # noqa: SIM115 - held for the whole pass
    except OSError as exc:
        report(f"radt: cannot look for what killed radt processes left ({first_line(exc)})")
        return
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return
        _reap(report, store)
    except Exception as exc:  # cleaning up after others must never stop this command
        report(f"radt: could not finish what killed radt processes left ({first_line(exc)}); 'radt sync' tries again")
    finally:
        lock.close()


def _reap(report: Callable[[str], None], store: str | None) -> None:
    """One pass (the caller holds the reaper lock): kill first, then end what the store must know."""
    host = socket.gethostname()
    workloads = _dead_workloads(host)
    for _path, record in workloads:  # their radts first: a live one would keep its own tree going
        kill_recorded({"processes": [r for r in record.get("radts", []) if r[1]]}, timeout=2.0)
    runs = _dead_runs(host)
    stores = _Stores()
    for run_dir, meta in runs:
        record = read_record(run_dir)
        killed = kill_recorded(record) if record else []
        pid = meta.get("pid", "?")
        what = f"{len(killed)} leftover process(es) killed" if killed else "no process left"
        if store is not None and meta.get("store") != store:
            if killed:
                report(f"radt: run {meta.get('run_id')} lost its radt (pid {pid}): {what}; 'radt sync' ends it in its store")
            continue
        try:
            done = _end_run(stores, run_dir, meta)
        except Exception as exc:
            done = f"'radt sync' ends it KILLED once its store answers ({first_line(exc)})"
        report(f"radt: run {meta.get('run_id')} lost its radt (pid {pid}): {what}, {done}")
    for path, record in workloads:
        try:
            _mark_rows(record)
        except Exception as exc:
            report(f"radt: could not mark the rows of {record.get('csv')} KILLED ({first_line(exc)})")
        if store is not None and record.get("store") != store:
            continue
        try:
            _end_workload(stores, path, record)
            _remove_gate(record)
            path.unlink(missing_ok=True)
            report(f"radt: workload run {record['parent_id']} lost its radt (pid {record.get('pid')}); ended {record.get('status') or 'KILLED'}")
        except Exception as exc:
            report(f"radt: workload run {record['parent_id']} lost its radt; 'radt sync' ends it KILLED once its store answers ({first_line(exc)})")
    from radt.collectors.experiment.collocation import undo_leftovers

    undo_leftovers(report)  # MPS daemons and MIG instances of dead experiments (reads a journal only if there is one)
