"""The training command radt will run: `train.py`, `./job.sh` or a command on PATH, checked before anything heavy is
imported, so that a file the kernel would refuse answers at once in one line."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

from radt.collectors._common import UsageError, first_line


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


def check_script(script: str) -> None:
    """What build_command cannot say well: the script is a folder."""
    if Path(script).is_dir():
        raise UsageError(f"script '{script}' is a folder; give the training script in it, e.g. {Path(script) / 'train.py'}")
