"""What radt will run, checked before anything heavy is imported: a user's mistake answers at once."""

from __future__ import annotations

import os
import sys
from pathlib import Path


class UsageError(Exception):
    """A mistake in how radt was called; the message names the problem and the fix."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An error as one line for a message: its first non-empty line, or its type when it says nothing."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


def build_command(script: str, args: list[str]) -> list[str]:
    """`train.py` runs under this Python; anything else must be an executable file or on PATH."""
    path = Path(script)
    if script.endswith(".py"):
        if not path.is_file():
            raise UsageError(f"script '{script}' not found in {Path.cwd()}; pass the path to your training script")
        return [sys.executable, "-u", script, *args]
    if path.is_file() and os.access(path, os.X_OK):
        return [str(path), *args]
    from shutil import which

    if "/" not in script and which(script):
        return [script, *args]
    raise UsageError(f"script '{script}' not found (neither a .py file here nor a command on PATH); pass the path to your training script")
