"""What every room of the tracker shares: the user's mistake (UsageError), an error as one line, and the checks of
names, numbers and hosts a user types, made before anything heavy is imported."""

from __future__ import annotations

import math

from radt import settings
from radt.errors import UserError
from radt.runmodel import WORKLOAD_PREFIX


class UsageError(UserError):
    """A mistake in how radt was called; the message names the problem and the fix."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An error as one line for a message: its first non-empty line, or its type when it says nothing."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


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


def check_host(text: str, option: str = "--host") -> str:
    """A node's name for --host; UsageError in one line naming the fix."""
    from radt.settings import is_host_name

    if not is_host_name(text.strip()):
        raise UsageError(f"{option} {text!r} is not a host name; give the node's name as its exporter labels it, e.g. {option} gpu-node-7")
    return text.strip()
