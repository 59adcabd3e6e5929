"""One error root: every mistake a user fixes is a UserError, the command line catches that one class, names are unique.

A ValueError raised by radt's own bug must keep its traceback (it was printed as a one-line "user mistake" and exit 2);
a user's mistake must never show one.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

from radt import cli
from radt.errors import UserError

# the classes a user's mistake or outage is raised as, by the side that raises it
USER_FACING = [
    ("radt.settings", "StoreUriError"),
    ("radt.settings", "SettingError"),
    ("radt.settings", "RadtHomeError"),
    ("radt.artifacts", "ArtifactUriError"),
    ("radt.collectors.experiment.csvfile", "CsvError"),
    ("radt.collectors.store.nodes", "NodeError"),
    ("radt.collectors.sources.gpus", "DeviceError"),
    ("radt.collectors.sources.listeners", "ListenerError"),
    ("radt.collectors.experiment.collocation", "CollocationError"),
    ("radt.collectors.imports.importer", "BadImport"),
    ("radt.collectors.imports.importer", "MissingLog"),
    ("radt.collectors.demo", "DemoError"),
    ("radt.collectors._common", "UsageError"),
    ("radt.collectors.store.tracking", "StoreError"),
    ("radt.collectors.store.rollup", "RollupError"),
    ("radt.app.export.exportoptions", "ExportError"),
    ("radt.app.view.views", "ViewError"),
    ("radt.app.view.filters", "FilterError"),
    ("radt.app.export.aggregates", "FigureError"),
    ("radt.app.db.store", "StoreUnreadable"),
    ("radt.app.retain", "RetainError"),
]


def _modules() -> list:
    """Every module of radt that imports without a GPU or a running server (all of them)."""
    found = {}
    for package in ("radt", "radt.collectors", "radt.app"):  # the sides are folders of their own, mapped under radt by pyproject
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if not info.name.startswith(("radt.assets", "radt.pages")):  # Dash pages register themselves with an app on import
                found[info.name] = importlib.import_module(info.name)
    assert {"radt.collectors.run.finish", "radt.collectors.sources.base", "radt.app.db.store"} <= set(found)
    return list(found.values())


@pytest.mark.parametrize(("module", "name"), USER_FACING)
def test_each_user_facing_error_is_a_user_error(module, name):
    assert issubclass(getattr(importlib.import_module(module), name), UserError)


def test_exception_and_report_names_are_unique():
    """Two `StoreUnavailable` classes (one for the writer, one for the dashboard) and two `report` functions were one name for two things."""
    classes: dict[str, set[str]] = {}
    reports: set[str] = set()
    for module in _modules():
        for name, value in vars(module).items():
            if getattr(value, "__module__", None) != module.__name__:
                continue  # imported, not defined here
            if inspect.isclass(value) and issubclass(value, BaseException):
                classes.setdefault(name, set()).add(module.__name__)
            if name == "report" and inspect.isfunction(value):
                reports.add(module.__name__)
    twice = {name: sorted(where) for name, where in classes.items() if len(where) > 1}
    assert twice == {}
    assert reports == {"radt.errors"}


def test_the_command_line_catches_user_errors_only(monkeypatch, capsys):
    """A user's mistake: one line, exit 2. radt's own bug (a plain ValueError): not passed off as the user's, traceback kept."""

    class Mistake:
        @staticmethod
        def main(argv):
            raise UserError("--thing 3 is wrong; give 4")

    class Bug:
        @staticmethod
        def main(argv):
            raise ValueError("internal: cannot unpack")

    monkeypatch.setattr(cli.importlib, "import_module", lambda name: Mistake)
    assert cli.main(["train.py"]) == 2
    assert capsys.readouterr().err == "radt: --thing 3 is wrong; give 4\n"
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: Bug)
    with pytest.raises(ValueError, match="internal"):
        cli.main(["train.py"])


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["import", "/nonexistent/dmon.log"], "radt import: '/nonexistent/dmon.log' not found; give paths to dcgmi dmon"),
        (["import", "{notes}"], "radt import: '{notes}' is not a dcgmi dmon, nvidia-smi --format=csv or top -b log"),
        (["-d", "0+x", "{script}"], "radt: bad -d '0+x'"),
    ],
)
def test_user_mistakes_end_in_one_line(tmp_path, argv, expected):
    """Mistakes that were raised as plain ValueError / FileNotFoundError: still one line and exit 2 with only UserError caught."""
    notes = tmp_path / "notes.txt"
    notes.write_text("this is not a log\n")
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    argv = [a.format(notes=notes, script=script) for a in argv]
    expected = expected.format(notes=notes)
    env = {"RADT_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"}
    done = subprocess.run([sys.executable, "-m", "radt", *argv], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), done.stderr


def test_radt_alone_says_what_to_give_and_version_says_what_runs(tmp_path):
    """`radt` alone said "the following arguments are required: script, args" (args are optional), and `radt --version`
    said the same: a user had no way to ask which radt, MLflow and Python a run was recorded with."""
    from importlib import metadata

    env = {"RADT_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    alone = subprocess.run([sys.executable, "-m", "radt"], capture_output=True, text=True, env=env, timeout=60)
    assert alone.returncode == 2 and alone.stderr.splitlines() == [
        "radt: give a training script or an experiment CSV: radt train.py --batch-size 256, radt experiment.csv; "
        "or a command: radt dashboard, radt demo, radt monitor, radt sync, radt import, radt export, radt rollup, radt diagnose, radt report, radt retain "
        "(see 'radt --help')"
    ]
    python = ".".join(map(str, sys.version_info[:3]))
    expected = f"radt {metadata.version('radt')} (MLflow {metadata.version('mlflow')}, SQLAlchemy {metadata.version('sqlalchemy')}, Python {python} at {sys.executable})"
    for flag in ("--version", "-V"):
        shown = subprocess.run([sys.executable, "-m", "radt", flag], capture_output=True, text=True, env=env, timeout=60)
        assert (shown.returncode, shown.stdout.strip(), shown.stderr) == (0, expected, "")
    assert not (tmp_path / "home").exists(), "nothing created"
