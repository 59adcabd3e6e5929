"""What radt will run, checked before anything heavy is imported: a user's mistake answers at once."""

from __future__ import annotations

import errno
import math
import os
import sys
from pathlib import Path

from radt import settings
from radt.errors import UserError
from radt.runmodel import WORKLOAD_PREFIX


class UsageError(UserError):
    """A mistake in how radt was called; the message names the problem and the fix."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An error as one line for a message: its first non-empty line, or its type when it says nothing."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


def build_command(script: str, args: list[str]) -> list[str]:
    """`train.py` runs under this Python. A path with a slash (`./train.sh`, `bin/run`) is that file, never
    a PATH lookup; a bare name is an executable file here (run as `./name`), else a command on PATH.
    A file that cannot run as a program is refused here with the reason and the fix (check_executable)."""
    path = Path(script)
    if script.endswith(".py"):
        if not path.is_file():
            raise UsageError(f"script '{script}' not found in {Path.cwd()}; pass the path to your training script")
        return [sys.executable, "-u", script, *args]
    if "/" in script:
        check_executable(script)
        return [script, *args]
    from shutil import which

    if path.is_file() and (os.access(path, os.X_OK) or not which(script)):
        check_executable(f"./{script}")
        return [f"./{script}", *args]  # with a slash, so that exec never searches PATH for it
    if which(script):
        return [script, *args]
    raise UsageError(f"script '{script}' not found (neither a .py file here nor a command on PATH); pass the path to your training script")


def check_executable(script: str) -> None:
    """UsageError, naming the file and the fix, when the kernel would refuse to run `script`: missing, a
    folder, no x bit, a #! line whose interpreter is missing (or ends in a Windows \\r), no #! line at all."""
    path = Path(script)
    if not path.exists():
        raise UsageError(f"script '{script}' not found in {Path.cwd()}; pass the path to your training script")
    if path.is_dir():
        raise UsageError(f"script '{script}' is a folder; give the training script in it")
    if not os.access(path, os.X_OK):
        raise UsageError(f"script '{script}' is not executable; make it so with 'chmod +x {script}', or name its interpreter: radt bash {script}")
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return  # executable but unreadable: a binary may still run; exec says the rest
    if head.startswith(b"\x7fELF"):
        return
    if not head.startswith(b"#!"):
        raise UsageError(
            f"script '{script}' has no #! line, so it cannot run as a program; add one as its first line "
            f"(#!/bin/sh, #!/usr/bin/env python3) or name its interpreter: radt bash {script}"
        )
    line = head[2:].split(b"\n", 1)[0]
    if line.endswith(b"\r"):
        raise UsageError(f"script '{script}' has Windows line endings (its #! line ends in \\r); convert it with 'dos2unix {script}'")
    words = line.decode(errors="replace").split()
    if not words:
        raise UsageError(f"script '{script}' has an empty #! line; name its interpreter there, e.g. #!/bin/sh")
    interpreter = words[0]
    if not os.path.isfile(interpreter):
        raise UsageError(f"script '{script}': its #! line names {interpreter}, which does not exist; fix that line (e.g. #!/usr/bin/env python3)")
    if not os.access(interpreter, os.X_OK):
        raise UsageError(f"script '{script}': its #! line names {interpreter}, which is not executable; fix that line or the interpreter's permissions")
    if Path(interpreter).name == "env":
        from shutil import which

        program = next((w for w in words[1:] if not w.startswith("-") and "=" not in w), None)
        if program and which(program) is None:
            raise UsageError(
                f"script '{script}': its #! line runs '{program}', but '{program}' is not on PATH; install it, add its folder to PATH or fix that line"
            )


def exec_failure(program: str, exc: OSError) -> str:
    """One line for a program the kernel would not start (exec's error), with the fix."""
    reason = exc.strerror or first_line(exc)
    if exc.errno == errno.ENOEXEC:
        fix = f"it is not a program this machine can run; add a #! line or name its interpreter (radt bash {program})"
    elif exc.errno == errno.ENOENT:
        fix = "it, or the interpreter its #! line names, is missing"
    elif exc.errno == errno.EACCES:
        fix = f"make it executable with 'chmod +x {program}'"
    else:
        fix = "check the file"
    return f"cannot run '{program}' ({reason}): {fix}"


# MLflow's limits, from its source: validation allows experiment names of 500 characters
# (mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH) but its tables keep 256 (experiments.name
# is String(256): PostgreSQL refuses longer ones) and run names of 250 (runs.name, String(250)).
# tests/test_bad_input.py reads them from MLflow, so an MLflow upgrade that changes them fails there.
EXPERIMENT_NAME_LIMIT = 256
RUN_NAME_LIMIT = 250


NAME_LIMITS = {  # what a name becomes in MLflow, and the most characters it may have there
    "experiment": ("an experiment name", EXPERIMENT_NAME_LIMIT),
    "run": ("a run name", RUN_NAME_LIMIT),
    "workload": (f"a workload (its parent run is named '{WORKLOAD_PREFIX}<workload>')", RUN_NAME_LIMIT - len(WORKLOAD_PREFIX)),
}


EMPTY_NAMES = {  # what to give instead of an empty name, and what radt does when the option is left out
    "experiment": ("an experiment name or id", "MLflow's Default experiment"),
    "run": ("a run name", "a name MLflow picks"),
    "workload": ("a workload name", "a run of its own"),
}


def check_name(kind: str, value: str | None, label: str, left_out: str | None = None) -> None:
    """An experiment, run or workload name (-e, -n, -w; a CSV's Experiment, Workload) as MLflow can store it.

    An empty one (`-e "$EXP"` with EXP unset) is refused: it silently meant the default (`left_out`: a command's own default, if not MLflow's)."""
    what, limit = NAME_LIMITS[kind]
    if value is not None and not value.strip():
        noun, default = EMPTY_NAMES[kind]
        raise UsageError(f"{label} is {'empty' if not value else 'blank'}; give {noun}, or leave {label} out for {left_out or default}")
    if value is not None and len(value) > limit:
        raise UsageError(f"{label} is {len(value)} characters long; MLflow keeps at most {limit} for {what}: shorten it")


def check_numbers(interval: float | None, max_time: float | None, max_epoch: int | None, flush_timeout: float | None) -> None:
    """--interval, --max-time, --max-epoch and --flush-timeout: finite, and in range (argparse only checks they are numbers)."""
    floor = settings.MIN_INTERVAL
    if interval is not None and not (math.isfinite(interval) and interval >= floor):
        problem = "is too short" if math.isfinite(interval) else "is not a finite number"
        raise UsageError(f"--interval {interval:g} {problem}; use {floor:g} seconds or more")
    if max_time is not None and not (math.isfinite(max_time) and max_time > 0):
        raise UsageError(f"--max-time {max_time:g} is not a positive number of minutes; give e.g. --max-time 90, or leave it out for no limit")
    if max_epoch is not None and max_epoch < 0:
        raise UsageError(f"--max-epoch {max_epoch} is negative; give the last epoch to train (0 or more), or leave it out")
    if flush_timeout is not None and not (math.isfinite(flush_timeout) and flush_timeout >= 0):
        raise UsageError(f"--flush-timeout {flush_timeout:g} is not 0 or more seconds; give e.g. --flush-timeout 60")


def check_script(script: str) -> None:
    """What build_command cannot say well: the script is a folder."""
    if Path(script).is_dir():
        raise UsageError(f"script '{script}' is a folder; give the training script in it, e.g. {Path(script) / 'train.py'}")
