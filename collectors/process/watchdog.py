"""The watchdog: a tiny process beside each training that outlives radt only to kill what radt left.

radt starts it (`python -I -S watchdog.py RUN_DIR`) in a session of its own, its stdin the read end of
a pipe whose write end only radt holds. When radt ends normally it stops the tree itself, writes
"done" and closes the pipe: the watchdog exits. When radt dies any other way (SIGKILL, the OOM killer,
a crash) the pipe ends without "done": the watchdog kills every process of the tree that radt recorded
in RUN_DIR/tree.json, and exits. Blocked on a read, it costs no CPU; standard library only, it starts
in a few tens of milliseconds.

A process is named by its pid and its start time (clock ticks since boot, /proc/<pid>/stat), so a pid
the kernel has given to another process since is never killed. What is killed: the recorded processes
that still are who they were, every process in the run's cgroup, their descendants, and every process
in a session or process group of a recorded process that is still alive (a worker forked after the
last record). `collectors.recovery.reaper` uses the same functions when the watchdog itself could not run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

# This file runs as `python -I -S watchdog.py` (no site-packages): it imports nothing of radt's, so the
# run folder's names are spelled here too; tests/test_layout.py checks they equal radt/rundir.py's.
TREE_FILE = "tree.json"
LOGS_DIR = "logs"
DONE = b"done"
KILL_FOR = 5.0  # seconds to keep killing what appears (children forked while their parents die)


def proc_stat(pid: int) -> tuple[str, int, int, int, int] | None:
    """(state, ppid, process group, session, start time in ticks) of a live pid, from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()  # the command name may hold spaces and parentheses
    return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19])


def start_ticks(pid: int) -> int | None:
    """When the process started (ticks since boot); with the pid, it names one process for ever."""
    stat = proc_stat(pid)
    return stat[4] if stat else None


def is_same(pid: int, start: int) -> bool:
    """True while `pid` is still the process that started at `start` and has not exited."""
    stat = proc_stat(pid)
    return stat is not None and stat[4] == start and stat[0] not in ("Z", "X")


def children(pid: int) -> list[int]:
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return found


def cgroup_members(cgroup: str | None) -> set[int]:
    if not cgroup:
        return set()
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            return {int(line) for line in f.read().split()}
    except (OSError, ValueError):
        return set()


def read_record(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / TREE_FILE).read_text())
    except (OSError, ValueError):
        return None


def members(record: dict, spare: set[int], just_died: bool = False) -> set[int]:
    """The live processes of a recorded tree now (never a pid in `spare`, never a zombie).

    `just_died`: radt died a moment ago (the watchdog), so the sessions and groups that recorded
    processes lead are the tree's even when their leader is already gone (the script, killed by
    PDEATHSIG first): a pid still in use as a session or group id cannot have been given to a new
    process. Not for the reaper, which may run days later.
    """
    found = {pid for pid, start in record.get("processes", []) if is_same(pid, start)}
    found |= cgroup_members(record.get("cgroup"))
    stats = {pid: proc_stat(pid) for pid in found}
    groups = {s[2] for s in stats.values() if s} | {s[3] for s in stats.values() if s}  # sessions and groups still alive cannot be reused
    if just_died:
        groups |= {pid for pid, _start in record.get("processes", [])}
    groups -= {record.get("session"), os.getsid(0), os.getpgid(0), 0, 1}  # radt's session and the caller's (a user's shell) are never the tree's
    if groups:
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in found:
                stat = proc_stat(int(entry))
                if stat and (stat[2] in groups or stat[3] in groups):
                    found.add(int(entry))
    stack = list(found)
    while stack:
        for child in children(stack.pop()):
            if child not in found:
                found.add(child)
                stack.append(child)
    live = set()
    for pid in found - spare:
        stat = proc_stat(pid)
        if stat and stat[0] not in ("Z", "X"):
            live.add(pid)
    return live


def kill_recorded(record: dict, timeout: float = KILL_FOR, just_died: bool = False) -> list[int]:
    """SIGKILL the tree of `record` until none of it runs (at most `timeout` s); the pids killed (`just_died`: see members)."""
    spare = {os.getpid(), os.getppid()}
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    cgroup = record.get("cgroup")
    while True:
        targets = members(record, spare, just_died)
        if not targets:
            break
        if cgroup:
            try:
                with open(os.path.join(cgroup, "cgroup.kill"), "w") as f:  # the kernel kills every member at once (5.14+)
                    f.write("1")
            except OSError:
                pass
        for pid in targets:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    remove_cgroup(cgroup)
    return sorted(killed)


def remove_cgroup(cgroup: str | None, timeout: float = 2.0) -> None:
    """rmdir the run's cgroup once its last member has gone (the kernel needs a moment after the kills)."""
    if not cgroup or not os.path.isdir(cgroup):
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.rmdir(cgroup)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)


class Guard:
    """radt's end of the watchdog: start() before the script, release() once radt has stopped the tree itself."""

    def __init__(self, proc, fd: int | None) -> None:
        self.proc = proc
        self.fd: int | None = fd

    @classmethod
    def start(cls, run_dir: Path) -> Guard:
        import subprocess

        read, write = os.pipe()  # both ends close-on-exec: only the watchdog's stdin and radt hold the pipe
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(run_dir)],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a signal to the terminal's or the script's group never reaches it
            )
        except OSError:
            os.close(write)
            return cls(None, None)  # PDEATHSIG and the reaper still hold
        finally:
            os.close(read)
        return cls(proc, write)

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.write(self.fd, DONE)
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None
        if self.proc is not None:
            try:
                self.proc.wait(5)
            except Exception:
                self.proc.kill()
                self.proc.wait()


def watch(run_dir: Path) -> int:
    """Block until radt closes the pipe on stdin; kill the recorded tree unless radt said it was done."""
    said = b""
    while True:
        try:
            chunk = os.read(0, 64)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        said += chunk
    if said.endswith(DONE):
        return 0
    record = read_record(run_dir)
    if record is None:
        return 0
    killed = kill_recorded(record, just_died=True)
    if killed:
        try:
            with open(run_dir / LOGS_DIR / "watchdog.log", "a") as log:
                log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} radt (pid {record.get('radt', ['?'])[0]}) ended without stopping the training; "
                          f"the watchdog killed {len(killed)} process(es) of its tree: {' '.join(map(str, killed))}\n")  # fmt: skip
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is radt's to handle, not the watchdog's
    sys.exit(watch(Path(sys.argv[1])))
