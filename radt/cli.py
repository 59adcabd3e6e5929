"""The `radt` command line: `radt [options] train.py [args...]`, `radt experiment.csv`, and the
subcommands, each dispatched lazily to the side that does it.

Only the chosen command's modules are imported: `radt train.py` never loads the dashboard, and
`radt export` never loads the samplers. User mistakes end in one line naming the problem and the
fix, and exit code 2; a script's own exit code is passed through otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from radt.errors import UserError
from radt.settings import check_settings

# subcommand -> the module whose main(argv) runs it; anything else is a script or an experiment CSV
COMMANDS = {
    "import": "radt.collectors.imports.importer",
    "sync": "radt.collectors.recovery.sync",
    "rollup": "radt.collectors.store.rollup",
    "diagnose": "radt.collectors.diagnose.command",
    "report": "radt.collectors.diagnose.report",
    "retain": "radt.app.retain",
    "demo": "radt.collectors.demo",
    "monitor": "radt.collectors.monitor.machine",
    "export": "radt.app.exportcli",
    "dashboard": "radt.app.main",
}
RUN_COMMAND = "radt.collectors.cli"  # `radt [options] train.py` and `radt experiment.csv`
# what each subcommand does, for `radt --help` and `radt` alone (one entry per COMMANDS name)
COMMAND_HELP = {
    "dashboard": "the web dashboard of a store",
    "demo": "a demo experiment set to explore",
    "monitor": "record this machine's GPUs and host without a training run",
    "sync": "send samples kept while the store was away",
    "import": "dcgmi/nvidia-smi/top logs, or a Slurm cluster's jobs",
    "export": "comparison figures and data for papers",
    "rollup": "build a store's rollups ahead of time",
    "diagnose": "why runs are slow: findings with their numbers and what to do, kept on each run",
    "report": "a plain-text report of runs or jobs to mail: GPUs, activity, energy, findings",
    "retain": "drop raw points of ended runs older than a cutoff, keeping their rollups and summaries",
}


def commands_text() -> str:
    """Every subcommand and what it does, as `radt --help` lists them."""
    return ", ".join(f"'radt {name}' ({what})" for name, what in COMMAND_HELP.items())


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a mistake in one line instead of usage plus message."""

    def error(self, message: str):  # noqa: D401 - argparse's name
        self.exit(2, f"{self.prog}: {message} (see '{self.prog} --help')\n")


NOTHING_TO_DO = (
    "give a training script or an experiment CSV: radt train.py --batch-size 256, radt experiment.csv; "
    f"or a command: {', '.join(f'radt {name}' for name in COMMAND_HELP)} (see 'radt --help')"
)


def version_text() -> str:
    """radt's version with those of what it writes through and runs on (read from the installed packages, nothing imported)."""
    from importlib import metadata

    def installed(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    python = ".".join(map(str, sys.version_info[:3]))
    return f"radt {installed('radt')} (MLflow {installed('mlflow')}, SQLAlchemy {installed('sqlalchemy')}, Python {python} at {sys.executable})"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # was argparse's "the following arguments are required: script, args"
        print(f"radt: {NOTHING_TO_DO}", file=sys.stderr)
        return 2
    if argv[0] in ("--version", "-V"):  # only before a script: after it, every word is the script's
        print(version_text())
        return 0
    logging.basicConfig(level=logging.WARNING, format="radt: %(message)s")
    name = argv[0] if argv and argv[0] in COMMANDS else None
    try:
        check_settings()  # every RADT_* variable, before the command creates anything
        module = importlib.import_module(COMMANDS[name] if name else RUN_COMMAND)
        check_settings()  # and those the command's own modules define (the dashboard's)
        return module.main(argv[1:] if name else argv)
    except UserError as exc:  # every mistake a user fixes; anything else is radt's bug and keeps its traceback
        print(f"radt{' ' + name if name else ''}: {exc}", file=sys.stderr)
        return 2
