"""Waiting on a condition with a deadline, never a fixed sleep."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Callable

import psutil


def wait_for(
    condition,
    timeout: float = 60.0,
    what: str | Callable[[], str] = "condition",
    interval: float = 0.05,
    process: subprocess.Popen | None = None,
):
    """The first truthy value of `condition()`; AssertionError naming `what` after `timeout` seconds.

    `what` may be a callable, asked only on failure (to say what was seen). With `process`, its exit
    while waiting fails at once, with what it wrote on stderr (when that is a pipe)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            said = process.stderr.read() if process.stderr else ""
            raise AssertionError(f"{_what(what)}: the process exited with {process.returncode} while waiting: {said}")
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {_what(what)}"
        time.sleep(interval)


def _what(what: str | Callable[[], str]) -> str:
    return what() if callable(what) else what


def wait_http(url: str, process: subprocess.Popen, timeout: float = 60, output: Callable[[], str] | None = None) -> None:
    """Until `url` answers 200; the process's death fails at once, with its output in the failure
    (`output()`, else its stdout when that is a pipe)."""

    def answers() -> bool:
        if process.poll() is not None:
            said = output() if output else process.stdout.read() if process.stdout else ""
            raise AssertionError(f"{url}: the server exited with {process.returncode}:\n{said}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    wait_for(answers, timeout=timeout, what=f"{url} to answer", interval=0.05)


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
