"""The experiment CSV: radT's layouts parse, every bad row is refused with its row and the fix, statuses are written back safely.

The machine is asked through the real code path (NVML, then `nvidia-smi`); the driver tools are
the fakes in tests/fakes/gpu_tools, which answer in the real tools' formats.
"""

from __future__ import annotations

import codecs
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from radt.collectors.experiment.csvfile import ExperimentFile, plan, real_machine
from tests.support.paths import FAKE_NVML_DIR, FAKE_TOOLS, REPO
from tests.support.radtproc import fake_gpu_node, run_radt

HEADER = "Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params\n"


@pytest.fixture
def fake_tools(tmp_path, monkeypatch) -> Path:
    """Fake nvidia-smi (4 A100s, GPU 2 in MIG mode), nvidia-cuda-mps-control, nsys and ncu on PATH; the real ones hidden.

    NVML is the fake without a library, whatever this machine has, so the GPUs are nvidia-smi's."""
    return fake_gpu_node(tmp_path, monkeypatch)


def _plan(folder: Path, body: str, header: str = HEADER, rerun: bool = False):
    path = folder / "experiment.csv"
    path.write_text(header + body)
    exp = ExperimentFile.load(path)
    return exp, *plan(exp, real_machine(), rerun=rerun)


def test_radt_example_with_padded_columns_plans_every_workload(fake_tools):
    body = (
        "1,  1, , , 0,  -,       train.py, smi+top+dcgmi, --batch-size 128\n"
        "1,  2, , , 0,  -,       train.py, smi+top,       --batch-size 128\n"
        "1,  2, , , 0,  -,       train.py, smi+top,       --batch-size 128\n"
        "1,  3, , , 0,  MPS,     train.py, smi+top,       --batch-size 128\n"
        "1,  3, , , 0,  mps,     train.py, smi+top,       --batch-size 128\n"
        "1,  4, , , 2,  3g.20gb, train.py, smi+top,       --batch-size 128\n"
        "1,  4, , , 2,  3g.20gb, train.py, smi+top,       --batch-size 128\n"
        "1,  5, , , 1+3, -,      train.py, top+nsys,      --lr 0.1 --fp16\n"
        "1,  6, , , -,  ,        train.py, ,\n"
    )
    _exp, workloads, problems = _plan(fake_tools, body)
    assert problems == []
    assert [w.name for w in workloads] == ["1", "2", "3", "4", "5", "6"]
    assert [len(w.runs) for w in workloads] == [1, 2, 2, 2, 1, 1]
    assert [r.letter for r in workloads[1].runs] == ["A", "B"]
    assert [r.collocation for r in workloads[2].runs] == ["mps", "mps"]
    assert [r.collocation for r in workloads[3].runs] == ["3g.20gb", "3g.20gb"]
    assert workloads[0].runs[0].sources == ["nvml", "host", "dcgm"]
    assert workloads[0].runs[0].params == ["--batch-size", "128"]
    five = workloads[4].runs[0]
    assert (five.devices, five.sources, five.profiler, five.params) == ([1, 3], ["host"], "nsys", ["--lr", "0.1", "--fp16"])
    six = workloads[5].runs[0]
    assert (six.devices, six.collocation, six.sources) == (None, "-", ["nvml", "host"])


def test_header_in_any_case_with_extra_columns_and_no_status_columns(fake_tools):
    header = " experiment , WORKLOAD ,devices, file ,Notes\n"
    exp, workloads, problems = _plan(fake_tools, "resnet, a, 0, train.py, first try\n", header=header)
    assert problems == [] and workloads[0].experiment == "resnet" and workloads[0].name == "a"
    exp.set(exp.rows[0], "Status", "FINISHED")
    exp.set(exp.rows[0], "Run", "abc")
    exp.save()
    lines = (fake_tools / "experiment.csv").read_text().splitlines()
    assert lines[0] == "experiment ,WORKLOAD ,devices,file ,Notes,Status,Run"
    assert lines[1] == "resnet,a,0,train.py,first try,FINISHED,abc"


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("1,1,,,0,-,train.py,smi+gpuz,", "unknown listener 'gpuz'"),
        ("1,1,,,0,-,missing.py,smi,", "File 'missing.py' not found"),
        ("1,1,,,7,-,train.py,smi,", "GPU 7 does not exist on this machine (GPUs: 0 to 3); fix Devices"),
        ("1,1,,,zero,-,train.py,smi,", "Devices 'zero' is not a GPU index list"),
        ("1,1,,,2,5g.99gb,train.py,smi,", "GPU 2 does not offer MIG profile 5g.99gb; it offers 7g.40gb, 4g.20gb, 3g.20gb"),
        (
            "1,1,,,0,3g.20gb,train.py,smi,",
            "GPU 0 is not in MIG mode (No MIG-enabled devices found.); enable it with 'sudo nvidia-smi -i 0 -mig 1' on an idle GPU",
        ),
        ("1,1,,,2+3,3g.20gb,train.py,smi,", "a MIG instance lives on one GPU"),
        ("1,1,,,-,MPS,train.py,smi,", "Collocation MPS needs a GPU; set Devices"),
        ("1,1,,,0,sharing,train.py,smi,", "Collocation 'sharing' is not -, MPS or a MIG profile"),
        ("1,1,,,0,-,train.py,smi,--name 'unclosed", "Params cannot be split into arguments"),
        ("1,1,,,0,-,train.py,smi+nsys+ncu,", "listeners ncu and nsys both wrap the command; keep one profiler per run"),
        (",1,,,0,-,train.py,smi,", "Experiment is empty"),
        ("x" * 257 + ",1,,,0,-,train.py,smi,", "Experiment is 257 characters long; MLflow keeps at most 256 for an experiment name: shorten it"),
        ("1," + "w" * 242 + ",,,0,-,train.py,smi,", "Workload is 242 characters long; MLflow keeps at most 241 for a workload"),
        ("1,1,,,0,-,models,smi,", "File 'models' is a folder; give the training script in it, e.g. models/train.py"),
        # was "File 'train.py --epochs 1' not found (looked in ...)", the script being right there
        (
            "1,1,,,0,-,train.py --epochs 1,smi,",
            "File 'train.py --epochs 1' holds arguments; put the script (train.py) in File and its arguments (--epochs 1) in Params",
        ),
        ("1,1,,,0,-,nope.py --epochs 1,smi,", "File 'nope.py --epochs 1' not found (looked in "),
    ],
)
def test_each_bad_row_is_one_line_with_its_row_and_fix(fake_tools, row, needle):
    (fake_tools / "models").mkdir()
    _exp, _workloads, problems = _plan(fake_tools, "1,0,,,0,-,train.py,smi,\n" + row + "\n")
    assert len(problems) == 1, problems
    assert problems[0].startswith("experiment.csv row 3: "), problems[0]
    assert needle in problems[0]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            '1,1,,,0,-,train.py,smi,"--name x\n1,2,,,0,-,train.py,smi,\n1,3,,,0,-,train.py,smi,\n',
            'experiment.csv row 2: a quote (") opened on this row is not closed, so rows 3 to 4 are read as part of it; close the quote',
        ),
        ('1,1,,,0,-,train.py,smi,\n1,2,,,0,-,train.py,smi,"--x', 'experiment.csv row 3: a quote (") opened on this row is not closed; close the quote'),
        (
            '1,1,,,0,-,train.py,smi,"--a 1\n--b 2"\n',
            "experiment.csv row 2: a quoted cell runs over lines 2 to 3; a row is one line: remove the line break inside the quotes",
        ),
        ("\n\n", "'{folder}/experiment.csv' has a header but no rows; add one row per run, e.g. exp1,1,,,0,-,train.py,smi+top,--epochs 3"),
        ("1,1,,,0,-,train.py,smi,--tag a\0b\n", "experiment.csv row 2: a NUL byte in a cell; save the file as a UTF-8 CSV without it"),
        (
            '1,1,,,0,-,train.py,smi,"' + "y" * 200_000 + "\n",
            'experiment.csv row 2: a cell runs past 131072 characters, the most a CSV cell may hold; close the quote (") opened on this row, or shorten the cell',
        ),
    ],
    ids=["unclosed-quote", "unclosed-quote-last-row", "line-break-in-quotes", "header-only", "nul", "over-the-csv-limit"],
)
def test_a_csv_that_would_lose_or_mangle_rows_is_refused_whole(tmp_path, body, message):
    """Today an unclosed quote swallowed the rows after it, and the statuses written back rewrote the file without them."""
    from radt.collectors.experiment.csvfile import CsvError

    path = tmp_path / "experiment.csv"
    path.write_text(HEADER + body)
    with pytest.raises(CsvError) as refused:
        ExperimentFile.load(path)
    assert str(refused.value) == message.replace("{folder}", str(tmp_path))


def test_mps_and_mig_on_one_gpu_and_too_many_instances_are_refused(fake_tools):
    body = "1,1,,,2,MPS,train.py,smi,\n1,1,,,2,3g.20gb,train.py,smi,\n1,2,,,2,3g.20gb,train.py,smi,\n1,2,,,2,3g.20gb,train.py,smi,\n1,2,,,2,3g.20gb,train.py,smi,\n"
    _exp, _workloads, problems = _plan(fake_tools, body)
    assert problems == [
        "experiment.csv rows 2, 3: workload 1 mixes MPS and MIG on GPU 2; give each its own workload or GPU",
        "experiment.csv row 4: workload 2 wants 3 × 3g.20gb on GPU 2, which has 2 free; use fewer runs or a smaller profile",
    ]


def test_profilers_and_mps_need_their_tools(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no driver tools, no Nsight
    (tmp_path / "train.py").write_text("pass\n")
    _exp, _workloads, problems = _plan(tmp_path, "1,1,,,-,-,train.py,top+ncu,\n1,2,,,-,-,train.py,top+nsys-raw,\n")
    assert problems == [
        "experiment.csv row 2: listener 'ncu' needs 'ncu' on PATH; install Nsight or drop it from Listeners",
        "experiment.csv row 3: listener 'nsys-raw' needs 'nsys' on PATH; install Nsight or drop it from Listeners",
    ]


def test_finished_and_failed_workloads_are_skipped_and_not_checked_against_the_machine(fake_tools):
    body = (
        "1,1,FINISHED (A),run1,9,-,gone.py,smi,\n"  # radT's status spelling; its file and GPU no longer exist
        "1,2,FINISHED,r2,0,-,train.py,smi,\n1,2,FAILED,r3,0,-,train.py,smi,\n"
        "1,3,FINISHED,r4,0,-,train.py,smi,\n1,3,KILLED,r5,0,-,train.py,smi,\n"
        "1,4,RUNNING,r6,0,-,train.py,smi,\n"
    )
    _exp, workloads, problems = _plan(fake_tools, body)
    assert problems == []
    assert [w.state() for w in workloads] == ["finished", "failed", "todo", "todo"]


def test_file_is_found_next_to_the_csv_from_another_folder(fake_tools, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    _exp, workloads, problems = _plan(fake_tools, "1,1,,,0,-,train.py,smi,\n")
    assert problems == [] and workloads[0].runs[0].file == str(fake_tools / "train.py")


def test_save_is_atomic_and_keeps_everything_but_status_and_run(fake_tools):
    original = (
        HEADER.replace("Params", "Params,Notes").replace("\n", "\r\n")
        + '1 , 1 ,,, 0 , - , train.py , smi , "--tag ""a b""" , keep me\r\n\r\n1,2,,,0,-,train.py,smi,,\r\n'
    )
    path = fake_tools / "experiment.csv"
    path.write_bytes(original.encode())
    exp = ExperimentFile.load(path)
    assert [r.line for r in exp.rows] == [2, 4]
    exp.set(exp.rows[0], "Status", "FINISHED")
    exp.set(exp.rows[0], "Run", "0123abcd")
    exp.save()
    data = path.read_bytes().decode()
    reread = ExperimentFile.load(path)
    assert [reread.get(reread.rows[0], c) for c in ("Status", "Run", "Params")] == ["FINISHED", "0123abcd", '--tag "a b"']
    assert reread.rows[0].cells[-1] == "keep me" and [reread.get(reread.rows[1], c) for c in ("Workload", "Status")] == ["2", ""]
    assert data.count("\r\n") == 3 and "\n" not in data.replace("\r\n", ""), "the file keeps its CRLF line ends"
    assert not list(fake_tools.glob(".experiment.csv.radt-tmp")), "the temporary file is renamed over the CSV"


def test_save_keeps_a_spreadsheets_bom_a_symlink_and_the_files_permissions(tmp_path):
    """A spreadsheet's "CSV UTF-8" lost its BOM when radt wrote the statuses back (the spreadsheet then reads the names as
    its locale's code page), a CSV kept as a symlink became a file of its own (the linked file never got its statuses) and
    a group-writable CSV became the umask's 0644."""
    shared = tmp_path / "shared"
    shared.mkdir()
    real = shared / "experiment.csv"
    real.write_bytes(codecs.BOM_UTF8 + (HEADER + "résumé,1,,,0,-,train.py,smi,\n").encode())
    real.chmod(0o664)
    link = tmp_path / "experiment.csv"
    link.symlink_to(real)
    exp = ExperimentFile.load(link)
    exp.set(exp.rows[0], "Status", "FINISHED")
    exp.save()
    assert link.is_symlink() and link.resolve() == real
    assert real.read_bytes().startswith(codecs.BOM_UTF8 + b"Experiment,") and real.read_bytes().count(codecs.BOM_UTF8) == 1
    assert stat.S_IMODE(real.stat().st_mode) == 0o664
    reread = ExperimentFile.load(link)
    assert [reread.get(reread.rows[0], c) for c in ("Experiment", "Status")] == ["résumé", "FINISHED"]
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["experiment.csv", "experiment.csv", "shared"], "no temporary file left"
    plain = tmp_path / "plain.csv"
    plain.write_text(HEADER + "1,1,,,0,-,train.py,smi,\n")
    ExperimentFile.load(plain).save()
    assert plain.read_bytes().startswith(b"Experiment,"), "no BOM where the file had none"


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (
            HEADER.replace(",", ";"),
            "line 1 is separated by ';', not commas; save it as a comma-separated CSV (a spreadsheet's \"CSV UTF-8 (comma delimited)\")",
        ),
        (
            HEADER.replace(",", "\t"),
            'line 1 is separated by a tab, not commas; save it as a comma-separated CSV (a spreadsheet\'s "CSV UTF-8 (comma delimited)")',
        ),
        (HEADER.replace("Status", "experiment"), "line 1: column Experiment appears twice (columns 1 and 3); keep one"),
        (HEADER.replace("Params", "File"), "line 1: column File appears twice (columns 7 and 9); keep one"),
    ],
    ids=["semicolons", "tabs", "experiment-twice", "file-twice"],
)
def test_a_header_radt_would_misread_is_one_line(tmp_path, header, message):
    """A semicolon CSV (a spreadsheet in a comma-decimal locale) was "no column Experiment, Workload, File"; a column named
    twice was read from its first place and the second kept as an extra column, silently."""
    from radt.collectors.experiment.csvfile import CsvError

    path = tmp_path / "experiment.csv"
    row = "1,1,,,0,-,train.py,smi,\n"
    path.write_text(header + (row.replace(",", header[10]) if header[10] in ";\t" else row))
    before = path.read_bytes()
    with pytest.raises(CsvError) as refused:
        ExperimentFile.load(path)
    assert str(refused.value) == f"'{path}' {message}"
    assert path.read_bytes() == before


def test_cli_prints_every_problem_and_starts_nothing(fake_tools):
    (fake_tools / "experiment.csv").write_text(HEADER + "1,1,,,0,-,train.py,smi+gpuz,\n1,1,,,9,-,nothere.py,smi,\n")
    env = {
        "PATH": f"{FAKE_TOOLS}:/usr/bin:/bin",
        "RADT_HOME": str(fake_tools / "home"),
        "PYTHONPATH": f"{FAKE_NVML_DIR}:{REPO}",  # pynvml without a driver, whatever this machine has
        "RADT_FAKE_TOOLS_STATE": str(fake_tools / "s.json"),
    }
    result = run_radt(["experiment.csv"], env=env, cwd=fake_tools, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "radt: experiment.csv row 2: unknown listener 'gpuz'; choose from dcgm, dcgmi, free, gpm, host, iostat, ncu, ncu-raw, nsys, nsys-raw, nvidia-smi, nvml, prometheus, ps, psutil, smi, top (join several with '+')",
        f"radt: experiment.csv row 3: File 'nothere.py' not found (looked in {fake_tools.resolve()}); fix the path or create the script",
        "radt: experiment.csv row 3: GPU 9 does not exist on this machine (GPUs: 0 to 3); fix Devices",
        "radt: 3 problem(s) in experiment.csv; nothing was started",
    ]
    assert not (fake_tools / "home" / "mlflow.db").exists()


def test_dry_run_prints_the_plan_and_touches_nothing(fake_tools):
    body = "exp,1,,,0,-,train.py,smi+top,--epochs 1\nexp,2,,,0,MPS,train.py,smi,\nexp,2,,,0,MPS,train.py,smi,\nexp,3,,,2,1g.5gb,train.py,smi+ncu,\nexp,9,FINISHED,r,0,-,train.py,smi,\n"
    (fake_tools / "experiment.csv").write_text(HEADER + body)
    before = (fake_tools / "experiment.csv").read_text()
    env = {"PATH": f"{FAKE_TOOLS}:/usr/bin:/bin", "RADT_HOME": str(fake_tools / "home"), "PYTHONPATH": f"{FAKE_NVML_DIR}:{REPO}"}
    env |= {"RADT_FAKE_TOOLS_STATE": str(fake_tools / "s.json"), "RADT_FAKE_TOOLS_LOG": str(fake_tools / "tools.log")}
    result = run_radt(["--dry-run", "experiment.csv"], env=env, cwd=fake_tools, timeout=60)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "experiment.csv: 4 workloads, 5 runs" in out
    assert "  set-up: start an MPS control daemon for GPU 0, quit it after" in out
    assert "  set-up: create MIG 1g.5gb on GPU 2 for run A at memory slice 0 (nvidia-smi mig -i 2 -cgi 1g.5gb:0 -C), destroy it after" in out
    assert f"  A: GPU 2, collocation 1g.5gb, listeners nvml, wrapped by ncu: {fake_tools / 'train.py'}" in out
    assert "workload exp/9: FINISHED, skipped" in out
    assert out.index("workload exp/1") < out.index("workload exp/2") < out.index("workload exp/3")
    assert (fake_tools / "experiment.csv").read_text() == before
    calls = (fake_tools / "tools.log").read_text()
    assert "-cgi" not in calls and "nvidia-cuda-mps-control" not in calls, "a dry run only asks, it sets nothing up"
    assert not (fake_tools / "home" / "mlflow.db").exists()


def _fake_state(folder: Path) -> dict:
    import json

    return json.loads((folder / "tools-state.json").read_text())


def test_a_failed_set_up_step_undoes_the_steps_before_it(fake_tools, radt_home, monkeypatch):
    from radt.collectors.experiment.collocation import CollocationError, Setup

    monkeypatch.setenv("RADT_FAKE_MIG_FAIL", "1g.5gb")
    said: list[str] = []
    with pytest.raises(CollocationError, match="Insufficient Resources"), Setup(said.append) as setup:
        setup.mps([0, 1])
        setup.mig(2, "3g.20gb")
        setup.mig(2, "1g.5gb")
    assert _fake_state(fake_tools) == {"mig": [], "mps": []}
    assert (radt_home / "collocation-journal.json").read_text() == "[]"
    assert said[:2] == ["radt: MPS control daemon started for GPU 0+1", said[1]] and said[1].startswith(
        "radt: MIG 3g.20gb created on GPU 2 (GPU instance 1, MIG-"
    )


def test_set_up_left_by_a_killed_experiment_is_undone_at_the_next_start(fake_tools, radt_home):
    import json

    from radt.collectors.experiment.collocation import Setup, undo_leftovers

    setup = Setup(lambda _line: None)
    setup.mig(2, "3g.20gb")
    setup.mps([0])  # radt is SIGKILLed here: nothing undone, the journal remembers
    journal = radt_home / "collocation-journal.json"
    entries = json.loads(journal.read_text())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    journal.write_text(json.dumps([{**e, "pid": int(dead)} for e in entries]))
    said: list[str] = []
    undo_leftovers(said.append)
    assert _fake_state(fake_tools) == {"mig": [], "mps": []}
    assert json.loads(journal.read_text()) == []
    assert said == [
        f"radt: removed the MIG 3g.20gb on GPU 2 that an experiment killed before its tear-down (radt pid {dead}) left behind",
        f"radt: removed the MPS daemon for GPU 0 that an experiment killed before its tear-down (radt pid {dead}) left behind",
    ]


def test_statuses_a_full_disk_refused_go_with_the_next_save_that_works(fake_tools, tmp_path):
    """A CSV on a disk that fills and is freed again mid-experiment: the refusal is one line, no temporary file is left,
    the old file stays whole, and the next save brings every status it missed."""
    from tests.support.disks import fill, tmpfs

    said: list[str] = []
    with tmpfs(tmp_path / "disk", size="64k") as disk:
        path = disk / "experiment.csv"
        path.write_text(HEADER + "1,1,,,0,-,train.py,smi,\n1,2,,,0,-,train.py,smi,\n")
        before = path.read_text()
        exp = ExperimentFile.load(path)
        fill(disk)
        exp.set(exp.rows[0], "Status", "FINISHED")
        assert exp.save_or_say(said.append) is False
        exp.set(exp.rows[1], "Status", "RUNNING")
        assert exp.save_or_say(said.append) is False
        assert path.read_text() == before and not list(disk.glob(".*radt-tmp"))
        assert exp.notes() == [
            f"radt: {path} lacks what radt wrote of row 2 (Status FINISHED), row 3 (Status RUNNING) (No space left on device); "
            "write these into it, or the next 'radt " + str(path) + "' runs those rows again"
        ]
        (disk / "filler").unlink()
        exp.set(exp.rows[1], "Status", "FINISHED")
        assert exp.save_or_say(said.append) is True
        reread = ExperimentFile.load(path)
        assert [reread.get(r, "Status") for r in reread.rows] == ["FINISHED", "FINISHED"]
        assert exp.notes() == []
    assert said == [
        f"radt: cannot write the statuses to {path} (No space left on device); the runs go on, and the next status written brings them",
        f"radt: {path} took the statuses it lacked; it is up to date again",
    ]


def test_statuses_find_their_rows_after_the_file_was_reordered_and_identical_rows_keep_their_order(tmp_path):
    """Two identical rows (a collocated pair), a row inserted above them and the columns reordered in a spreadsheet:
    each status lands on the row it belongs to, by the row's cells (radt's own cells aside), in the order they came."""
    path = tmp_path / "experiment.csv"
    path.write_text(HEADER + "x,1,,,0,MPS,train.py,smi,\nx,1,,,0,MPS,train.py,smi,\nx,2,,,1,-,train.py,smi,--lr 1\n")
    exp = ExperimentFile.load(path)
    path.write_text("Params,File,Workload,Experiment,Devices,Collocation,Listeners,Status,Run,Notes\n"
                    "--new,train.py,0,x,3,-,smi,,,added\n,train.py,1,x,0,MPS,smi,,,\n,train.py,1,x,0,MPS,smi,,,\n--lr 1,train.py,2,x,1,-,smi,,,\n")  # fmt: skip
    for row, run in zip(exp.rows[:2], ("aaaa", "bbbb"), strict=True):
        exp.set(row, "Status", "FINISHED")
        exp.set(row, "Run", run)
    said: list[str] = []
    assert exp.save_or_say(said.append)
    now = ExperimentFile.load(path)
    assert [(now.get(r, "Workload"), now.get(r, "Status"), now.get(r, "Run"), r.cells[-1]) for r in now.rows] == [
        ("0", "", "", "added"),
        ("1", "FINISHED", "aaaa", ""),
        ("1", "FINISHED", "bbbb", ""),
        ("2", "", "", ""),
    ]
    assert now.header[0] == "Params", "the user's column order is kept"
    assert said == [
        f"radt: {path} changed on disk since radt read it; radt writes its statuses into it as it is now and keeps your edits "
        f"(rows you added or changed run with the next 'radt {path}')"
    ]
    assert exp.notes() == []
