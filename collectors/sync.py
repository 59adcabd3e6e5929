"""`radt sync`: send what a run kept locally while its store was away (samples, final status, logs)."""

from __future__ import annotations

import argparse
import functools
import json
import socket
import sys
import time

import psutil

from app.config import runs_dir
from collectors.command import first_line
from collectors.runner import complete_run
from collectors.stores import open_metric_store
from collectors.tracking import connect
from collectors.writer import SPOOL_NAME, Spool


def orphaned(meta: dict) -> bool:
    """A run whose radt process on this host is gone (killed with SIGKILL, machine rebooted)."""
    if meta.get("host") != socket.gethostname() or "pid" not in meta:
        return False
    try:
        proc = psutil.Process(meta["pid"])
        return proc.create_time() > meta.get("started", 0) + 1  # the pid was reused
    except psutil.Error:
        return True


def replay_spool(store_uri: str, run_dir, run_id: str) -> int:
    """Write what the run spooled while its store was away, in order; the number of points sent."""
    store = open_metric_store(store_uri)
    try:
        return Spool(run_dir / SPOOL_NAME).replay(functools.partial(store.write, run_id))
    finally:
        store.close()


def mark_killed(client, run_dir, run_id: str, parent_id: str | None) -> None:
    """End a run whose radt process died: KILLED, tagged radt_killed, with the logs it left attached."""
    killed = {"status": "KILLED", "end_time": int(time.time() * 1000), "tags": {"radt.stop_reason": "radt_killed"}, "parent_id": parent_id}
    complete_run(client, run_dir, run_id, killed)


def pending_runs():
    """Run folders that still hold a spool or an unfinished final status, or whose radt died."""
    for run_dir in sorted(runs_dir().iterdir()):
        if not (run_dir / "meta.json").exists():
            continue
        waiting = (run_dir / SPOOL_NAME).exists() or (run_dir / "pending.json").exists()
        if waiting or (not (run_dir / "done").exists() and orphaned(json.loads((run_dir / "meta.json").read_text()))):
            yield run_dir


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="radt sync", description="Write samples and statuses kept locally while the store was unreachable.")
    parser.parse_args(argv)
    left = 0
    for run_dir in pending_runs():
        meta = json.loads((run_dir / "meta.json").read_text())
        run_id = meta["run_id"]
        try:
            client = connect(meta["store"])
            sent = replay_spool(meta["store"], run_dir, run_id)
            pending = run_dir / "pending.json"
            if pending.exists():
                complete_run(client, run_dir, run_id, json.loads(pending.read_text()))
            elif client.get_run(run_id).info.status == "RUNNING" and orphaned(meta):
                mark_killed(client, run_dir, run_id, meta.get("parent_id"))
                print(f"radt sync: run {run_id} lost its radt process; marked KILLED with its logs", file=sys.stderr)
            (run_dir / "done").touch()
            print(f"radt sync: run {run_id}: {sent} points written", file=sys.stderr)
        except Exception as exc:  # StoreError, or the store failing mid-replay
            left += 1
            print(f"radt sync: run {run_id} still waits ({first_line(exc)})", file=sys.stderr)
    if left:
        print(f"radt sync: {left} run(s) still wait; run 'radt sync' again once their store answers", file=sys.stderr)
        return 1
    return 0
