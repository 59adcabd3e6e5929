"""The training run's process tree, refreshed at most once per tick and shared by the samplers."""

from __future__ import annotations

import os
import signal
import time

import psutil


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
        found.append(pid)
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    stack.extend(int(child) for child in f.read().split())
            except (OSError, ValueError):
                continue
    return found


class ProcessTree:
    """psutil.Process objects for a root pid and its descendants, kept between ticks so
    `cpu_percent()` measures the interval since the previous tick."""

    def __init__(self, root_pid: int | None = None, max_age: float = 0.9) -> None:
        self.root_pid = root_pid
        self._known: dict[int, psutil.Process] = {}
        self._stamp = 0.0
        self._max_age = max_age
        self._current: list[psutil.Process] = []

    def attach(self, root_pid: int) -> None:
        self.root_pid = root_pid

    def processes(self) -> list[psutil.Process]:
        now = time.monotonic()
        if self.root_pid is None:
            return []
        if now - self._stamp < self._max_age:
            return self._current
        current = []
        for pid in descendants(self.root_pid):
            proc = self._known.get(pid)
            if proc is None:
                try:
                    proc = psutil.Process(pid)
                except psutil.Error:
                    continue
            current.append(proc)
        self._known = {p.pid: p for p in current}  # kept: cpu_percent() measures since this object's last call
        self._current, self._stamp = current, now
        return current

    def pids(self) -> set[int]:
        return {p.pid for p in self.processes()}


def die_with_parent() -> None:
    """In a child before exec (Linux): get SIGTERM if radt itself is killed, even by SIGKILL."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
