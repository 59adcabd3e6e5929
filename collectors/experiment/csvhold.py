"""One radt per experiment CSV: the radt that runs a CSV holds a lock beside it for as long as it runs.

The same command typed again in another terminal, or a script that "carries on" while the first still runs, ran the
RUNNING workloads a second time on the same GPUs: runs measured collocated that no row says are. The lock is flock(2)
on `.NAME.radt-lock` next to the CSV (the CSV itself is replaced at each status write, so its own inode cannot carry
one), taken once the plan is made and removed at the end; the file holds who has it, for the line a second radt says.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from radt.errors import UserError, report

SUFFIX = ".radt-lock"


class CsvBusy(UserError):
    """Another radt runs this CSV now; the message names it and what to do."""


def lock_path(csv: Path) -> Path:
    target = csv.resolve()
    return target.with_name(f".{target.name}{SUFFIX}")


@contextmanager
def holding(csv: Path, read: bytes) -> Iterator[None]:
    """Hold `csv` for this radt while it runs the plan made from `read`, its bytes as read; CsvBusy where another radt holds
    it, or wrote it since (its plan would be stale). A folder where no lock can be made is held by nobody."""
    fd = _take(csv)
    try:
        try:
            now = csv.read_bytes()
        except OSError:
            now = read
        if now != read:
            raise CsvBusy(f"{csv} changed while radt read it (another radt's statuses?); run the same command again to plan from it as it is now")
        yield
    finally:
        if fd is not None:
            lock_path(csv).unlink(missing_ok=True)  # before the lock goes: a radt that opened this file sees it is gone
            os.close(fd)


def run_holding(csv: Path, read: bytes, run: Callable[[], int]) -> int:
    """run()'s exit status while this radt holds `csv` (planned from `read`); 2 and one line where another radt holds it."""
    try:
        with holding(csv, read):
            return run()
    except CsvBusy as exc:
        report(f"radt: {exc}")
        return 2


def _take(csv: Path) -> int | None:
    """The lock file's descriptor, locked; CsvBusy naming the holder; None where it cannot be made."""
    lock = lock_path(csv)
    try:
        mode = stat.S_IMODE(os.stat(csv).st_mode)
    except OSError:
        return None
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            message = _busy(csv, fd)
            os.close(fd)
            raise CsvBusy(message) from None
        opened = os.fstat(fd)
        try:
            same = opened.st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # its holder removed it as this one opened it: take the next one
            os.close(fd)
            continue
        try:  # the CSV's own bits (a group that shares the CSV shares its lock), and who holds it, for a second radt's line
            if opened.st_uid == os.getuid():
                os.fchmod(fd, mode)
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}).encode(), 0)
        except OSError:  # a full disk leaves it empty; the lock works all the same
            pass
        return fd


def _busy(csv: Path, fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        holder = {}
    pid, host = holder.get("pid"), holder.get("host")
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["since"])) if isinstance(holder.get("since"), (int, float)) else "?"
    if not isinstance(pid, int) or not isinstance(host, str):
        return f"{csv} is being run by another radt; wait for it to end, or stop it with Ctrl-C in its terminal, then run the same command to carry on"
    return (f"{csv} is being run by another radt (pid {pid} on {host}, since {since}); wait for it to end, or stop it with "
            f"Ctrl-C in its terminal (or kill -INT {pid}), then run the same command to carry on")  # fmt: skip
