"""Waiting on a condition with a deadline, never a fixed sleep."""

from __future__ import annotations

import time

import psutil


def wait_for(condition, timeout: float = 60.0, what: str = "condition", interval: float = 0.05):
    """The first truthy value of `condition()`; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(interval)


def alive(pids) -> list[int]:
    """The pids that still run (a zombie, which only waits for its parent to read its status, does not)."""
    left = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.Error:
            continue
    return left


def gone_within(pids, timeout: float) -> float:
    """Seconds until none of `pids` runs; AssertionError listing the survivors after `timeout`."""
    start = time.monotonic()
    while alive(pids):
        assert time.monotonic() - start < timeout, f"still alive after {timeout:.0f} s: {[(p, _cmdline(p)) for p in alive(pids)]}"
        time.sleep(0.05)
    return time.monotonic() - start


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())[:120]
    except psutil.Error:
        return "?"
