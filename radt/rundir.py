"""A run's local folder (RADT_HOME/runs/<run id>): the files radt, `radt sync`, the reaper and the
training script share, and its owner lock, so exactly one live process writes a run.

`import radt` in a training script reads the names of the files it writes here, so this module
imports nothing heavy.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

META_FILE = "meta.json"  # the run's id, store, host and radt's pid, written before the script starts
LOGS_DIR = "logs"  # stdout.log, stderr.log, gpu-inventory.json, pip freeze: attached to the run as artifacts
SPOOL_FILE = "spool.jsonl"  # points the store did not take yet; `radt sync` sends them
PENDING_FILE = "pending.json"  # the run's last writes (status, tags, logs) while the store was away
DONE_FILE = "done"  # everything of the run is in the store; `radt sync` and the reaper skip the folder
LOCK_FILE = "owner.lock"  # flock of the one live process that owns the folder, with its pid
TREE_FILE = "tree.json"  # the watchdog's record of the script's process tree
# written by the training script (radt.run()) and read by radt
STARTED_FILE = "started"  # --manual: sampling starts when the script enters `with radt.run()`
CONTEXT_FILE = "context"  # the script uses `with radt.run()`: at --max-time it stops itself at its next log_metric
STOP_REASON_FILE = "stop_reason"  # the script reached a limit (max_epoch, max_time) and is ending
SCRIPT_LOG_FILE = "script.jsonl"  # the script's run.log_*/set_tag calls, one JSON line each; radt's process sends them on
SCRIPT_ARTIFACTS_DIR = "script-artifacts"  # copies of what the script passed to run.log_artifact, until radt uploads them
# written by radt
SCRIPT_OFFSET_FILE = "script.offset"  # bytes of script.jsonl already in the store or the spool; `radt sync` sends the rest


class RunFolderLock:
    """An exclusive flock on `<run folder>/owner.lock`, held until release() or the end of the process."""

    def __init__(self, run_dir: Path, fd: int) -> None:
        self.run_dir = run_dir
        self.fd = fd

    def release(self) -> None:
        if self.fd >= 0:
            _HELD.pop(self.run_dir, None)
            os.close(self.fd)  # closing the only descriptor drops the flock
            self.fd = -1


_HELD: dict[Path, RunFolderLock] = {}  # the locks this process holds, kept open for its lifetime


def claim_run_dir(run_dir: Path) -> RunFolderLock | None:
    """Become the owner of `run_dir`: the lock, with this pid written in it; None while another live process owns it."""
    run_dir = Path(run_dir)
    if run_dir in _HELD:
        return _HELD[run_dir]
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:  # a full disk: the lock holds all the same, only the pid is not shown
        pass
    lock = _HELD[run_dir] = RunFolderLock(run_dir, fd)
    return lock


def release_run_dir(run_dir: Path) -> None:
    """Give up ownership of `run_dir` (a finished monitor run); nothing if this process does not own it."""
    lock = _HELD.get(Path(run_dir))
    if lock is not None:
        lock.release()


def owner_pid(run_dir: Path) -> int | None:
    """The pid written in the folder's lock by its owner (for messages), or None."""
    try:
        text = (Path(run_dir) / LOCK_FILE).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def write_whole(path: Path, content: str | bytes) -> None:
    """`content` into `path` whole or not at all (a temporary file renamed over it): a reader never sees half a file, and
    a write that fails (a full disk, a folder gone) leaves neither half a file nor the temporary one."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        if isinstance(content, bytes):
            tmp.write_bytes(content)
        else:
            tmp.write_text(content, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class BrokenRunFolder(Exception):
    """A run folder whose meta.json cannot be used (empty or cut, as a full disk leaves it); says what is wrong with it."""


def read_meta(run_dir: Path) -> dict:
    """The run folder's meta.json; BrokenRunFolder where it is missing, empty, not JSON, or names no run and store."""
    try:
        text = (run_dir / META_FILE).read_text()
    except OSError as exc:
        raise BrokenRunFolder(f"its {META_FILE} cannot be read ({exc.strerror or exc})") from None
    try:
        meta = json.loads(text)
    except ValueError:
        raise BrokenRunFolder(f"its {META_FILE} is {'empty' if not text.strip() else 'not JSON'} (a disk that was full?)") from None
    if not isinstance(meta, dict) or not all(isinstance(meta.get(key), str) for key in ("run_id", "store")):
        raise BrokenRunFolder(f"its {META_FILE} names no run id and store")
    return meta
