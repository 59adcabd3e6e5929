"""The training run's process tree, refreshed at most once per tick and shared by the samplers, and the
kernel's means that keep it from outliving radt: PR_SET_PDEATHSIG in every child radt starts, radt as
a child subreaper (orphans of the tree come back to it), a cgroup v2 of the tree's own where one can be
made, and the tree's record in the run folder that the watchdog and the reaper kill from."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from radt.collectors.process.watchdog import cgroup_members, children, proc_stat, start_ticks
from radt.rundir import TREE_FILE, write_whole

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def descendants(root: int) -> list[int]:
    """The root pid and its descendants, read from /proc/<pid>/task/*/children: only the tree's
    own files, not every process on the host (psutil's children() scans all of /proc)."""
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            if pid == root and not os.path.isdir("/proc/self/task"):  # no procfs: ask psutil
                try:
                    return [root] + [p.pid for p in psutil.Process(root).children(recursive=True)]
                except psutil.Error:
                    return []
            continue
        if tasks:
            found.append(pid)
            stack.extend(children(pid))
    return found


class ProcessTree:
    """psutil.Process objects for a root pid and its descendants, kept between ticks so each is made once, not
    every tick (the host source measures their CPU from its own readings, sources/host.py).

    The tree also keeps what left the root's descendants: orphans radt took in as a child subreaper
    (see _adopted), members of the run's cgroup, and any process seen before that still runs (a helper
    that started a session of its own and lost its parent). With `record` (a run folder),
    the tree as seen is written to its tree.json, pids with start times, whenever it changes."""

    def __init__(self, root_pid: int | None = None, max_age: float = 0.9, record: Path | None = None) -> None:
        self.root_pid = root_pid
        self.cgroup: str | None = None
        self._known: dict[int, psutil.Process] = {}
        self._stamp = 0.0
        self._max_age = max_age
        self._current: list[psutil.Process] = []
        self._record = record / TREE_FILE if record is not None else None
        self._starts: dict[int, int] = {}
        self._written: frozenset | None = None
        self._lock = threading.Lock()  # the sampler's thread and radt's main thread both refresh it
        self._root_start = 0
        self._helpers: set[int] = set()

    def attach(self, root_pid: int, cgroup: str | None = None, helpers: set[int] | None = None) -> None:
        """Follow `root_pid` (the script) and, where one was made, its `cgroup`; `helpers`: radt's own children
        that are not the training's (its watchdog)."""
        self.root_pid = root_pid
        self.cgroup = cgroup
        self._root_start = start_ticks(root_pid) or 0
        self._helpers = set(helpers or ())
        self.processes(fresh=True)

    def processes(self, fresh: bool = False) -> list[psutil.Process]:
        with self._lock:
            now = time.monotonic()
            if self.root_pid is None:
                return []
            if not fresh and now - self._stamp < self._max_age:
                return self._current
            pids = descendants(self.root_pid)
            seen = set(pids)
            extra = cgroup_members(self.cgroup) | self._adopted() | {pid for pid, proc in self._known.items() if pid not in seen and _running(proc)}
            for pid in extra - seen:
                for found in descendants(pid):
                    if found not in seen:
                        seen.add(found)
                        pids.append(found)
            current = []
            for pid in pids:
                proc = self._known.get(pid)
                if proc is None:
                    try:
                        proc = psutil.Process(pid)
                    except psutil.Error:
                        continue
                current.append(proc)
            self._known = {p.pid: p for p in current}  # kept: made once, looked up by pid next tick
            self._current, self._stamp = current, now
            self._write_record()
            return current

    def pids(self) -> set[int]:
        return {p.pid for p in self.processes()}

    def _adopted(self) -> set[int]:
        """radt's own children that belong to the tree: orphans it took in as subreaper (a worker whose parent
        exited, a double-forked daemon). radt's own helpers are not: they started before the root (the
        watchdog, dcgmi) or run in radt's session (pip freeze). Those that have exited are reaped here."""
        adopted: set[int] = set()
        if not self._root_start:
            return adopted  # a tree not attached by the runner (a benchmark, a test) has no orphans of its own
        own_session = os.getsid(0)
        for pid in children(os.getpid()):
            if pid == self.root_pid or pid in self._helpers:
                continue
            stat = proc_stat(pid)
            if stat is None:
                continue
            if pid not in self._known and stat[3] != self.root_pid and (stat[3] == own_session or stat[4] <= self._root_start):
                continue
            if stat[0] == "Z":
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                continue
            adopted.add(pid)
        return adopted

    def _write_record(self) -> None:
        if self._record is None:
            return
        ids = set()
        for pid in self._known:
            start = self._starts.get(pid) or start_ticks(pid)
            if start is not None:
                self._starts[pid] = start
                ids.add((pid, start))
        ids = frozenset(ids)
        if ids == self._written:
            return
        self._starts = {pid: start for pid, start in ids}
        record = {"radt": [os.getpid(), start_ticks(os.getpid())], "session": os.getsid(0), "root": self.root_pid, "cgroup": self.cgroup}
        record["processes"] = sorted(ids)
        try:
            write_whole(self._record, json.dumps(record))  # a full disk leaves the last record whole, and no temporary file
            self._written = ids
        except OSError:
            pass  # the run folder is gone or full: the watchdog falls back on the cgroup and the sessions


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _prctl(option: int, value: int) -> None:
    if _LIBC is not None:
        _LIBC.prctl(option, value, 0, 0, 0)


def _load_libc():
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc if hasattr(libc, "prctl") else None  # Linux only
    except OSError:
        return None


_LIBC = _load_libc()  # loaded here, not in a child between fork and exec, where an import can deadlock


def _default_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def die_with_parent() -> None:
    """In a child before exec (Linux): SIGKILL when radt dies, however it dies; SIGINT and SIGTERM as a fresh process has them."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _default_signals()
    except (OSError, ValueError):
        pass


def child_setup(cgroup: str | None = None) -> Callable[[], None]:
    """The preexec_fn of a training (or a CSV run's radt): die_with_parent, then into the run's cgroup.

    If radt died between fork and prctl, no signal would ever come: the child exits instead."""
    parent = os.getpid()

    def setup() -> None:
        die_with_parent()
        if os.getppid() != parent:
            os._exit(137)
        if cgroup:
            try:
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                    f.write("0")
            except OSError:
                pass  # radt checks after the spawn and does without the cgroup

    return setup


def become_subreaper() -> None:
    """Orphans of the training tree (a worker whose parent exited) become radt's children, not init's: radt still sees and stops them."""
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    except OSError:
        pass


def restore_interrupts() -> None:
    """radt started with SIGINT or SIGTERM ignored (nohup, `cmd &` in a script, batch systems) still answers Ctrl-C and SIGTERM."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def catch_stops(handler) -> dict:
    """`handler` for Ctrl-C, SIGTERM and SIGHUP; the previous handlers, to put back. SIGHUP stays ignored where radt
    started with it ignored (`nohup radt train.py &`): closing the terminal must not stop a three-day training."""
    return {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS if not (sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN)}


def _cgroup2_root() -> str | None:
    """Where the unified (v2) hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts)."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if right.split()[:1] == ["cgroup2"] and len(fields) > 4 and fields[3] == "/":
                    return fields[4]
    except OSError:
        pass
    return None


def make_cgroup(name: str) -> str | None:
    """A cgroup v2 for the training tree below radt's own, or None where none can be made (no cgroup2, not
    writable: an unprivileged user, a container without delegation). Its members are the tree whatever
    they do (setsid, double fork), and `cgroup.kill` ends them all at once."""
    root = _cgroup2_root()
    if root is None:
        return None
    try:
        with open("/proc/self/cgroup") as f:
            own = next(line.strip()[3:] for line in f if line.startswith("0::"))
    except (OSError, StopIteration):
        return None
    path = os.path.join(root, own.lstrip("/"), name)
    try:
        os.mkdir(path)
    except OSError:
        return None
    return path


def check_cgroup(cgroup: str | None, pid: int) -> str | None:
    """The cgroup when `pid` joined it (child_setup); otherwise it is removed and radt does without."""
    if cgroup is None:
        return None
    if pid in cgroup_members(cgroup):
        return cgroup
    try:
        os.rmdir(cgroup)
    except OSError:
        pass
    return None
