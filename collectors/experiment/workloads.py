"""The scheduler's workload records: what a SIGKILLed `radt experiment.csv` would leave, for the reaper to finish.

While a workload runs, RADT_HOME/workloads/<parent run id>.json names its parent run, its start-gate folder, its
CSV rows and its runs' radt processes (collectors/recovery/reaper.py reads them once the scheduler is gone).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from radt.collectors.process.watchdog import start_ticks
from radt.settings import radt_home

WORKLOADS = "workloads"  # RADT_HOME/workloads/<parent run id>.json while `radt experiment.csv` runs a workload
GATE_PREFIX = "radt-gate-"  # the scheduler's start-gate folders; the reaper removes no other folder


def workloads_dir() -> Path:
    """The folder of the records of workloads running on this host now (or whose scheduler died)."""
    return radt_home() / WORKLOADS


def record_workload(parent_id: str, store: str, gate: Path, csv: Path, lines: list[int]) -> Path:
    """What a SIGKILLed `radt experiment.csv` would leave: its parent run, its gate folder, its CSV rows."""
    folder = workloads_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{parent_id}.json"
    record = {"host": socket.gethostname(), "pid": os.getpid(), "start": start_ticks(os.getpid()), "store": store, "parent_id": parent_id}
    record.update({"gate": str(gate), "csv": str(csv.resolve()), "lines": lines, "radts": []})
    _write(path, record)
    return path


def add_radts(path: Path, pids: list[int]) -> None:
    """The runs' radt processes, so that none survives its scheduler (they also get SIGKILL by PR_SET_PDEATHSIG)."""
    record = json.loads(path.read_text())
    update_workload(path, radts=record["radts"] + [[pid, start_ticks(pid)] for pid in pids])


def update_workload(path: Path, **changes) -> None:
    """`status`: the parent's end that the store did not take; the reaper sets it once the scheduler is gone."""
    _write(path, {**json.loads(path.read_text()), **changes})


def _write(path: Path, record: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)
