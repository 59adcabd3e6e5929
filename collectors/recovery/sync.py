"""`radt sync`: send what a run kept locally while its store was away (samples, final status, logs).

A run folder whose radt is alive is left to it: that radt holds the folder's lock (writer.claim_run_dir)
and replays its own spool. sync takes the lock of a folder whose owner is gone, so no two processes
ever append to, replay or trim one spool, and no live run is ended by mistake. Every store call has a
deadline (settings.FINISH_TIMEOUT: sync is not in a hurry, a store just back may be).
"""

from __future__ import annotations

import json
import socket
import sys

import psutil

from radt.collectors._common import first_line
from radt.collectors.recovery.reaper import reap
from radt.collectors.run.finish import finish, killed, run_tags_of_nodes, save_pending
from radt.collectors.run.scriptlog import sync as sync_script_log
from radt.collectors.run.scriptlog import unsent
from radt.collectors.store.nodes import node_scoped
from radt.collectors.store.stores import open_metric_store, stored_points
from radt.collectors.store.tracking import connect, set_tags
from radt.collectors.store.writer import Spool, call_with_deadline
from radt.rundir import DONE_FILE, META_FILE, PENDING_FILE, SPOOL_FILE, BrokenRunFolder, claim_run_dir, owner_pid, read_meta, release_run_dir
from radt.runmodel import POINTS_TAG
from radt.settings import FINISH_TIMEOUT, runs_dir


def orphaned(meta: dict) -> bool:
    """A run whose radt process on this host is gone (killed with SIGKILL, machine rebooted)."""
    if meta.get("host") != socket.gethostname() or "pid" not in meta:
        return False
    try:
        proc = psutil.Process(meta["pid"])
        return proc.create_time() > meta.get("started", 0) + 1  # the pid was reused
    except psutil.Error:
        return True


def replay_spool(store_uri: str, run_dir, run_id: str, spool: Spool | None = None) -> int:
    """Write what the run spooled while its store was away, in order; the number of points sent.

    Each batch has FINISH_TIMEOUT s (a store just back has a queue to work through, and nothing waits on sync);
    on a failure the unsent rest stays, and `spool.sent` says what went."""
    spool = spool or Spool(run_dir / SPOOL_FILE)
    if not spool:
        return 0
    store = open_metric_store(store_uri)
    timeout = FINISH_TIMEOUT.get()
    try:
        return spool.replay(lambda batch: call_with_deadline(lambda: store.write(run_id, batch), timeout), store.batch_points)
    finally:
        store.close()


def set_points(client, run_id: str, node: str | None, total: int) -> None:
    """radt.points of a run that had ended (a node's part: its own, and the run's sum once no part runs)."""
    timeout = FINISH_TIMEOUT.get()
    call_with_deadline(lambda: set_tags(client, run_id, node_scoped({POINTS_TAG: str(total)}, node)), timeout)
    if node:
        run = call_with_deadline(lambda: client.get_run(run_id), timeout)
        summed = run_tags_of_nodes(run.data.tags).get(POINTS_TAG)
        if run.info.status != "RUNNING" and summed:
            call_with_deadline(lambda: set_tags(client, run_id, {POINTS_TAG: summed}), timeout)


def sync_run(run_dir, meta: dict) -> tuple[int, bool]:
    """Send what a run whose radt is gone left behind (the caller holds its lock): its spool, then its
    final status (pending.json; KILLED for a RUNNING run of this host that never got one).
    Returns (points sent, whether it was marked KILLED here); raises while the store fails."""
    run_id = meta["run_id"]
    client = connect(meta["store"])
    pending_file = run_dir / PENDING_FILE
    pending = json.loads(pending_file.read_text()) if pending_file.exists() else None
    marked = False
    if pending is None and not (run_dir / DONE_FILE).exists() and meta.get("host", socket.gethostname()) == socket.gethostname():
        status = call_with_deadline(lambda: client.get_run(run_id).info.status, FINISH_TIMEOUT.get())
        if status == "RUNNING":  # its radt died before ending it
            pending, marked = killed(meta.get("parent_id"), meta.get("node")), True
            save_pending(run_dir, pending)  # from here on, what is sent is counted there, also across failed tries
    spool = Spool(run_dir / SPOOL_FILE)
    try:
        replay_spool(meta["store"], run_dir, run_id, spool)
    finally:
        if spool.sent and pending is not None:
            tags = pending.setdefault("tags", {})
            before = tags.get(POINTS_TAG, "0")
            tags[POINTS_TAG] = str((int(before) if before.isdigit() else 0) + spool.sent)
            save_pending(run_dir, pending)
    sync_script_log(meta["store"], client, run_dir, run_id, lambda line: print(line, file=sys.stderr))  # its radt.run() calls radt did not hand on
    if pending is not None or spool.sent:  # radt's own count is missing (it died) or short of what was sent since
        total = call_with_deadline(lambda: stored_points(meta["store"], run_id, meta.get("node")), FINISH_TIMEOUT.get())
    if pending is not None:
        pending.setdefault("tags", {})[POINTS_TAG] = str(total)
        finish(client, run_dir, run_id, pending)
    elif spool.sent:
        set_points(client, run_id, meta.get("node"), total)
    (run_dir / DONE_FILE).touch()
    return spool.sent, marked


def pending_runs():
    """Run folders that still hold a spool or an unfinished final status, or whose run never ended here."""
    host = socket.gethostname()
    for run_dir in sorted(runs_dir().iterdir()):
        if not (run_dir / META_FILE).exists():
            continue
        if (run_dir / SPOOL_FILE).exists() or (run_dir / PENDING_FILE).exists() or unsent(run_dir):
            yield run_dir
        elif not (run_dir / DONE_FILE).exists() and _host(run_dir) in (host, None):
            yield run_dir  # a run of another host (a shared RADT_HOME) is that host's to end; a broken folder is said by main


def _host(run_dir) -> str | None:
    """The host a run folder's meta.json names (this one where it names none); None where it cannot be read."""
    try:
        return read_meta(run_dir).get("host", socket.gethostname())
    except BrokenRunFolder:
        return None


def main(argv: list[str]) -> int:
    from radt.cli import OneLineParser  # mistakes in one line, like the rest of radt

    parser = OneLineParser(prog="radt sync", description="Write samples and statuses kept locally while the store was unreachable.")
    parser.parse_args(argv)
    reap()  # first the trees and runs of dead radt processes (collectors/recovery/reaper.py): killed, ended KILLED
    left = seen = 0
    for run_dir in pending_runs():
        seen += 1
        if claim_run_dir(run_dir) is None:  # its radt is alive and sends it itself (and may be writing meta.json right now)
            print(f"radt sync: run {run_dir.name.split('@')[0]} is being recorded by radt (pid {owner_pid(run_dir) or '?'}); left to it", file=sys.stderr)
            continue
        try:
            meta = read_meta(run_dir)
        except BrokenRunFolder as exc:  # nothing to send it with; every other run still is
            release_run_dir(run_dir)
            print(
                f"radt sync: skipped {run_dir}: {exc}, so which run and store it belongs to is unknown; keep what you need of it and remove the folder",
                file=sys.stderr,
            )
            continue
        run_id = meta["run_id"]
        try:
            sent, marked = sync_run(run_dir, meta)
            if marked:
                print(f"radt sync: run {run_id} lost its radt process; marked KILLED with its logs", file=sys.stderr)
            print(f"radt sync: run {run_id}: {sent} points written", file=sys.stderr)
        except Exception as exc:  # StoreError, the store failing mid-replay, a call past its deadline
            left += 1
            print(f"radt sync: run {run_id} still waits ({first_line(exc)})", file=sys.stderr)
        finally:
            release_run_dir(run_dir)
    if left:
        print(f"radt sync: {left} run(s) still wait; run 'radt sync' again once their store answers", file=sys.stderr)
        return 1
    if not seen:  # said, so that a quiet `radt sync` after an outage is not mistaken for one that did nothing it should have
        print(f"radt sync: nothing waits in {runs_dir()}; every run recorded here has reached its store", file=sys.stderr)
    return 0
