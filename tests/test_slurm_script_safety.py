"""The job script `radt --slurm experiment.csv` writes cannot be steered by a name (issue 24).

Old radt wrote the CSV's path and the workload's name into the script's `#` comment unquoted:
`F=$'evil\\ntouch pwned\\n.csv'; radt --slurm "$F"` ran `touch pwned` in the job. Here every value that
goes into the script is tried with `$(...)`, backticks, `;`, `&&`, quotes, spaces and line ends, and
the script is checked by `sh -n` and then run by `sh`, with radt's Python replaced by a program
that records the arguments and folder it was started with. A line end that would reach a job is
refused in one line, exit 2, before anything is submitted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from radt.collectors.experiment.scheduler import ExperimentOptions
from radt.collectors.slurm.jobscript import job_command, job_script
from tests.support import slurm
from tests.support.radtproc import radt_env, run_radt

HEADER = "Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params\n"
MARK = "pwned"  # the file each value below tries to create
HOSTILE = {
    "substitution": f"$(touch {MARK})",
    "backticks": f"`touch {MARK}`",
    "semicolon": f"x; touch {MARK}",
    "and": f"x && touch {MARK}",
    "single-quotes": f"it's'; touch {MARK}; '",
    "double-quotes": f'say "hi"; touch {MARK}; "',
    "spaces": "a  b\tc ",
    "variables": "$HOME ${PWD} $0",
    "glob": "* ?",
    "newline": f"x\ntouch {MARK}\n",
    "newline-sbatch": f"x\n#SBATCH --wrap='touch {MARK}'\n",
    "carriage-return": f"x\rtouch {MARK}\r\n",
    "backslash": f"x\\\ntouch {MARK}",
}
FIELDS = ("csv", "cwd", "python", "store", "label")
RECORDER = """\
#!{python}
import json, os, sys
with open(os.environ["RECORD"], "w") as out:
    json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd()}}, out)
"""


def _folder(parent: Path, name: str) -> Path:
    folder = parent / name
    folder.mkdir(parents=True)
    return folder


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
@pytest.mark.parametrize("field", FIELDS)
def test_each_value_reaches_radt_byte_for_byte_and_runs_nothing(tmp_path, field, value):
    hostile = {field: value}
    python = _folder(tmp_path / "bin", hostile.get("python", "py")) / "python"
    python.write_text(RECORDER.format(python=sys.executable))
    python.chmod(0o755)
    cwd = _folder(tmp_path / "work", hostile.get("cwd", "here"))
    csv = str(tmp_path / f"{hostile.get('csv', 'experiment')}.csv")
    opts = ExperimentOptions(csv=Path(csv), store=hostile.get("store", "postgresql://radt:secret@127.0.0.1:5432/radt"), max_epoch=3, max_time=1.5)
    command = job_command(opts, [2, 3], csv, python=str(python))
    script = job_script(command, str(cwd), hostile.get("label", "exp/1"), [2, 3], csv)
    start = _folder(tmp_path, "start")
    (start / "job.sh").write_text(script)

    syntax = subprocess.run(["sh", "-n", "job.sh"], cwd=start, capture_output=True, text=True, timeout=30)
    ran = subprocess.run(
        ["sh", "job.sh"], cwd=start, capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"], "RECORD": str(tmp_path / "record.json")}
    )

    assert syntax.returncode == 0, f"sh -n: {syntax.stderr}\n{script}"
    assert ran.returncode == 0 and ran.stderr == "", f"{ran.stderr}\n{script}"
    assert list(tmp_path.rglob(MARK)) == [], f"the script ran a command from {field}: {script}"
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["argv"] == command[1:], "every argument reaches radt as it was"
    assert record["cwd"] == str(cwd), "the job runs in the folder radt was started in"
    assert record["argv"][-1] == csv and record["argv"][record["argv"].index("--store") + 1] == opts.store
    lines = script.split("\n")
    assert lines[0] == "#!/bin/sh" and lines[1].startswith("# radt experiment.csv --slurm: workload ") and lines[2].startswith("cd "), (
        "no value starts a line of its own before the first command, where sbatch reads #SBATCH lines"
    )
    if field == "label":
        assert len(lines) == 5 and lines[-1] == "", "the name stays inside the comment"


def _experiment(folder: Path, name: str = "experiment.csv", cells: str = "x,1") -> Path:
    (folder / "train.py").write_text("print('trained')\n")
    csv = folder / name
    csv.write_text(HEADER + f"{cells},,,0,-,train.py,host,\n", newline="")
    return csv


def test_a_newline_in_the_csvs_path_is_one_line_and_nothing_is_planned(tmp_path, radt_home):
    """The issue's reproduction, with --dry-run: old radt printed the script with `touch pwned` on a line of its own, exit 0."""
    csv = _experiment(tmp_path, f"evil\ntouch {MARK}\n.csv")

    result = run_radt(["--slurm", "--dry-run", csv.name], env=radt_env(radt_home), cwd=tmp_path, timeout=120)

    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr == (f"radt: the CSV's path {str(csv)!r} has a newline, which cannot go into a Slurm job; rename the file (or its folder) without it\n")
    assert result.stdout == "" and not (tmp_path / "slurm").exists()


REFUSED = {
    "csv-carriage-return": ({"csv": "exp\r.csv"}, [], "radt: the CSV's path "),
    "csv-backslash": ({"csv": "exp\\1.csv"}, [], "radt: the CSV's path "),
    "cwd-newline": ({"cwd": "a\nb"}, [], "radt: the current folder "),
    "store-newline": (
        {},
        ["--store", "postgresql://radt:secret@127.0.0.1:5432/radt\n#x"],
        "radt: the tracking URI (--store or MLFLOW_TRACKING_URI) has a newline",
    ),
    "partition-newline": ({}, ["--slurm-partition", "gpu\n#SBATCH --x"], "radt: --slurm-partition 'gpu\\n#SBATCH --x' has a newline"),
    "account-carriage-return": ({}, ["--slurm-account", "lab\r"], "radt: --slurm-account 'lab\\r' has a carriage return"),
    "time-newline": ({}, ["--slurm-time", "1:00\n"], "radt: --slurm-time '1:00\\n' has a newline"),
    "sbatch-newline": ({}, ["--sbatch=--qos='high\nx'"], "radt: the --sbatch option '--qos=high\\nx' has a newline"),
    "experiment-cell-cr": ({"cells": '"x\rtouch pwned",1'}, [], "radt: experiment.csv rows 2: Experiment 'x\\rtouch pwned' has a carriage return"),
    "workload-cell-cr": ({"cells": 'x,"1\r;touch pwned"'}, [], "radt: experiment.csv rows 2: Workload '1\\r;touch pwned' has a carriage return"),
}


@pytest.mark.parametrize("case", REFUSED.values(), ids=REFUSED.keys())
def test_a_line_end_in_any_value_of_the_job_is_refused_in_one_line(tmp_path, radt_home, case):
    where, args, message = case
    csv = _experiment(_folder(tmp_path, "csvs"), where.get("csv", "experiment.csv"), where.get("cells", "x,1"))
    before = csv.read_bytes()

    result = run_radt(["--slurm", "--dry-run", *args, str(csv)], env=radt_env(radt_home), cwd=_folder(tmp_path, where.get("cwd", "here")), timeout=120)

    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr
    assert "which cannot go into a Slurm job; " in result.stderr and "secret" not in result.stderr
    assert result.stdout == "" and csv.read_bytes() == before and not (csv.parent / "slurm").exists()


def test_the_issues_path_submits_nothing_to_a_real_cluster(tmp_path, radt_home):
    """`radt --slurm $'evil\\ntouch pwned\\n.csv'` against the real one-node cluster: old radt submitted the job, which ran `touch pwned`."""
    env = radt_env(radt_home, extra=slurm.cluster())
    csv = _experiment(tmp_path, f"evil\ntouch {MARK}\n.csv", cells="evil,1")

    result = run_radt(["--slurm", csv.name], env=env, cwd=tmp_path, timeout=120)

    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("radt: the CSV's path ") and "rename the file" in result.stderr
    assert slurm.jobs("radt-evil") == [], "no job was submitted"
    assert not (tmp_path / "slurm").exists() and not (tmp_path / MARK).exists()


def test_a_percent_in_the_csvs_folder_is_a_folder_name_not_a_slurm_pattern(tmp_path, radt_home, empty_sqlite):
    """sbatch's --output expands %j, %u, %x: old radt gave it the folder `runs%j%u` as it was, so Slurm wrote the job's
    output into `runs1234root/...`, a folder that does not exist, and the output the message pointed at never appeared."""
    folder = _folder(tmp_path, "runs%j%u%%x")
    csv = _experiment(folder, cells="pct,1")
    env = radt_env(radt_home, empty_sqlite(tmp_path / "store.db"), extra=slurm.cluster())

    result = run_radt(["--slurm", "--interval", "0.5", csv.name], env=env, cwd=folder, timeout=180)

    assert result.returncode == 0, result.stderr[-3000:]
    outputs = list((folder / "slurm").glob("pct-1-*.out"))
    assert len(outputs) == 1 and "trained" in outputs[0].read_text(), (outputs, sorted(p.name for p in tmp_path.iterdir()))
    assert f"output in slurm/{outputs[0].name}" in result.stderr
