"""The sbatch script of one workload's job: `radt --slurm-rows LINES experiment.csv` on the node, every value quoted
so that no cell of the CSV or option can break the script's lines (the folder `slurm/` next to the CSV holds it)."""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from radt.collectors.experiment.csvfile import ExperimentFile, Workload
from radt.collectors.experiment.scheduler import ExperimentOptions

FOLDER = "slurm"  # next to the CSV: the job scripts, the jobs' output (<workload>-<job>.out) and results (<job>.json)


@dataclass
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    sbatch: list[str] = field(default_factory=list)  # further sbatch options, passed as they are, after radt's own

    def args(self) -> list[str]:
        """The user's sbatch options: radt's defaults come before them, so these win."""
        given = [f"--partition={self.partition}" if self.partition else "", f"--account={self.account}" if self.account else ""]
        return [a for a in given if a] + ([f"--time={self.time}"] if self.time else []) + self.sbatch

    def wanted_partition(self) -> str | None:
        """The partition the jobs will go to, as far as the options say (--slurm-partition, or -p/--partition in --sbatch)."""
        found = self.partition
        args = self.sbatch
        for number, arg in enumerate(args):
            if arg in ("-p", "--partition") and number + 1 < len(args):
                found = args[number + 1]
            elif arg.startswith("--partition="):
                found = arg.split("=", 1)[1]
            elif arg.startswith("-p") and len(arg) > 2:
                found = arg[2:]
        return found


LINE_ENDS = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL byte"}  # what no shell quoting makes safe in a script's line


def line_end(value: str) -> str:
    """'a newline' (or a carriage return, a NUL byte) where `value` holds one, else ''."""
    return next((name for char, name in LINE_ENDS.items() if char in value), "")


def output_pattern(path: Path) -> str:
    """`path` in sbatch's --output, where `%` starts a replacement (a folder `runs%j` would become `runs1234`): each one doubled."""
    return str(path).replace("%", "%%")


def job_command(opts: ExperimentOptions, lines: list[int], csv: str, python: str = sys.executable) -> list[str]:
    """The radt command line a job runs on its node: exactly the workload of these CSV rows."""
    args = [python, "-m", "radt", "--store", opts.store, "--interval", str(opts.interval), "--flush-timeout", str(opts.flush_timeout)]
    if opts.max_epoch is not None:
        args += ["--max-epoch", str(opts.max_epoch)]
    if opts.max_time is not None:
        args += ["--max-time", str(opts.max_time)]
    return args + ["--slurm-rows", ",".join(map(str, lines)), csv]


def job_script(command: list[str], cwd: str, label: str, lines: list[int], csv: str) -> str:
    """The sbatch script of one workload. Every value is shell-quoted; the comment shows line ends escaped, so no
    value starts a line of its own (script_problems refuses them before anything is submitted all the same).
    No #SBATCH lines: sbatch gets its options as arguments."""
    comment = f"workload {shlex.quote(label)} (rows {', '.join(map(str, lines))}) of {shlex.quote(csv)}"
    for char in LINE_ENDS:
        comment = comment.replace(char, repr(char)[1:-1])
    return (
        "#!/bin/sh\n"
        f"# radt experiment.csv --slurm: {comment}\n"
        f"cd {shlex.quote(cwd)} || exit 1\n"  # where radt was started, as for a local experiment (relative paths, a relative store)
        f"exec {shlex.join(command)}\n"
    )


def script_problems(csv: Path, store: str, slurm_opts: SlurmOptions, python: str = sys.executable) -> list[str]:
    """What would put a line end into a job script or sbatch's arguments: the CSV's path, the folder radt runs in,
    radt's Python, the store, the Slurm options; one line each, the value shown escaped (the store's not: it may hold a password)."""
    path, cwd = str(csv.resolve()), os.getcwd()
    checks = [
        (path, f"the CSV's path {path!r}", "rename the file (or its folder) without it"),
        (cwd, f"the current folder {cwd!r}", "run radt from a folder whose path has none"),
        (python, f"radt's Python {python!r}", "install radt in a folder whose path has none"),
        (store, "the tracking URI (--store or MLFLOW_TRACKING_URI)", "give the URI without it"),
    ]
    options = [("--slurm-partition", slurm_opts.partition), ("--slurm-account", slurm_opts.account), ("--slurm-time", slurm_opts.time)]
    checks += [(value, f"{flag} {value!r}", "give it without") for flag, value in options if value]
    checks += [(arg, f"the --sbatch option {arg!r}", "give it without") for arg in slurm_opts.sbatch]
    problems = [f"{what} has {line_end(value)}, which cannot go into a Slurm job; {fix}" for value, what, fix in checks if line_end(value)]
    if "\\" in path and not line_end(path):  # sbatch reads a backslash in --output as "replace nothing": every job would write one file
        problems.append(
            f"the CSV's path {path!r} has a backslash, which cannot go into a Slurm job; rename the file (or its folder) without it "
            "(sbatch's --output reads a backslash as: replace nothing)"
        )
    return problems


def name_problems(exp: ExperimentFile, workloads: list[Workload]) -> list[str]:
    """A workload whose Experiment or Workload cell holds a line end: its name goes into the job script's comment."""
    problems = []
    for workload in workloads:
        for column, value in (("Experiment", workload.experiment), ("Workload", workload.name)):
            if line_end(value):
                rows = ", ".join(str(r.row.line) for r in workload.runs)
                problems.append(
                    f"{exp.path.name} rows {rows}: {column} {value!r} has {line_end(value)}, which cannot go into a Slurm job; remove it from the cell"
                )
    return problems
