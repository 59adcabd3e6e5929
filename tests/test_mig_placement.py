"""Issue #52, item 8: a workload's MIG slices are placed together on their GPU before anything starts.

Three workloads of a real 618-row CSV asked an A100 40GB for MIG profiles that each had a free instance but did
not fit together; the dry run planned them and the real run failed at set-up ("Insufficient Resources") after
the workloads before it had run. The plan now places each workload's slices on memory slices by the GPU's
placement table (`nvidia-smi mig -lgipp`) beside the GPU instances already there (`-lgi`), refuses a set that
cannot fit with its rows and a fix, and set-up creates each slice where it was placed (`-cgi PROFILE:START`).
The driver is the fake nvidia-smi (tests/fakes/gpu_tools), answering as NVIDIA's MIG user guide prints it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from radt.collectors.experiment.csvfile import ExperimentFile, plan, real_machine
from radt.collectors.experiment.migplacement import Slot
from tests.support.radtproc import fake_gpu_node, fake_tools_env, radt_env, run_radt

HEADER = "Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params\n"
TOO_MUCH = (
    "experiment.csv rows 3, 4, 5: workload 2's MIG slices 4g.20gb + 2g.10gb + 2g.10gb cannot be placed together on GPU 2 "
    "(they need 8 of its 7 compute slices; nvidia-smi mig -lgipp, memory slices 0-7: 4g.20gb at 0-3; 2g.10gb at 0-1, 2-3 or 4-5); "
    "make row 3 3g.20gb, or move row 5 to another workload or GPU"
)


@pytest.fixture
def machine(tmp_path, monkeypatch, radt_home) -> Path:
    """A 4-GPU A100 40GB node whose GPU 2 is in MIG mode: the fake nvidia-smi on PATH, NVML without a driver."""
    return fake_gpu_node(tmp_path, monkeypatch)


def _plan(folder: Path, profiles: list[str], gpu: int = 2):
    """One workload (after a plain one) asking GPU `gpu` for these MIG profiles, a row each; rows 3, 4, ..."""
    rows = "e,1,,,0,-,train.py,smi,\n" + "".join(f"e,2,,,{gpu},{p},train.py,smi,\n" for p in profiles)
    (folder / "experiment.csv").write_text(HEADER + rows)
    return plan(ExperimentFile.load(folder / "experiment.csv"), real_machine())


def _someone_holds(folder: Path, profile: str, start: int, gi: int = 1) -> None:
    """A GPU instance on GPU 2 that is not radt's (another user made it), as the fake driver keeps it."""
    instance = {"gpu": 2, "gi": gi, "ci": 0, "profile": profile, "uuid": f"MIG-0000000{gi}-aaaa-bbbb-cccc-000000000000", "start": start}
    (folder / "tools-state.json").write_text(json.dumps({"mig": [instance], "mps": []}))


@pytest.mark.parametrize(
    ("profiles", "starts"),
    [
        (["4g.20gb", "3g.20gb"], [Slot(0, 4), Slot(4, 4)]),
        (["1g.5gb"] * 7, [Slot(s, 1) for s in range(7)]),
        (["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"], [Slot(4, 4), Slot(0, 2), Slot(2, 1), Slot(3, 1)]),
        (["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"], [Slot(2, 1), Slot(3, 1), Slot(0, 2), Slot(4, 4)]),  # the MIG user guide's "3-2-1-1" order
        (["2g.10gb", "2g.10gb", "2g.10gb", "1g.10gb"], [Slot(0, 2), Slot(2, 2), Slot(4, 2), Slot(6, 2)]),
    ],
    ids=["4g+3g", "7x1g", "3g+2g+1g+1g", "1g+1g+2g+3g", "2g+2g+2g+1g.10gb"],
)
def test_slices_that_fit_together_are_planned_at_their_memory_slices(machine, profiles, starts):
    workloads, problems = _plan(machine, profiles)
    assert problems == []
    assert [run.mig_slot for run in workloads[1].runs] == starts


def test_slices_that_each_have_room_but_not_together_are_refused_with_the_rows_and_a_fix(machine):
    """Was: planned (each profile had a free instance), then 'Insufficient Resources' at set-up."""
    _workloads, problems = _plan(machine, ["4g.20gb", "2g.10gb", "2g.10gb"])
    assert problems == [TOO_MUCH]


def test_instances_already_on_the_gpu_keep_their_placements(machine):
    _someone_holds(machine, "3g.20gb", start=4)
    workloads, problems = _plan(machine, ["4g.20gb"])
    assert problems == [] and workloads[1].runs[0].mig_slot == Slot(0, 4)
    _workloads, problems = _plan(machine, ["4g.20gb", "1g.5gb"])
    assert problems == [
        "experiment.csv rows 3, 4: workload 2's MIG slices 4g.20gb + 1g.5gb cannot be placed together on GPU 2 "
        "(it already holds 3g.20gb at 4-7 (GPU instance 1); with it they need 8 of its 7 compute slices; "
        "nvidia-smi mig -lgipp, memory slices 0-7: 4g.20gb at 0-3; 1g.5gb at 0, 1, 2, 3, 4, 5 or 6); "
        "make row 3 2g.10gb, or move row 4 to another workload or GPU"
    ]


def test_instances_a_killed_radt_left_do_not_count_they_are_removed_before_anything_starts(machine, radt_home):
    _someone_holds(machine, "3g.20gb", start=4)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    entry = {"kind": "mig", "gpu": 2, "profile": "3g.20gb", "gi": 1, "ci": 0, "uuid": "MIG-00000001-aaaa-bbbb-cccc-000000000000", "pid": int(dead)}
    (radt_home / "collocation-journal.json").write_text(json.dumps([entry]))
    workloads, problems = _plan(machine, ["4g.20gb", "3g.20gb"])
    assert problems == [] and [run.mig_slot for run in workloads[1].runs] == [Slot(0, 4), Slot(4, 4)]


def test_set_up_places_the_slices_again_on_the_gpu_as_it_is_now(machine):
    """Hours may pass between the plan and a workload's set-up: another user's instance is not run over."""
    from radt.collectors.experiment.collocation import CollocationError, placed_slices

    said: list[str] = []
    assert placed_slices(2, ["1g.5gb", "3g.20gb"], said.append) == [4, 0] and said == []
    _someone_holds(machine, "2g.10gb", start=0)
    assert placed_slices(2, ["1g.5gb", "3g.20gb"], said.append) == [2, 4]
    _someone_holds(machine, "4g.20gb", start=0)
    with pytest.raises(CollocationError) as refused:
        placed_slices(2, ["1g.5gb", "3g.20gb"], said.append)
    assert str(refused.value) == (
        "GPU 2 cannot hold MIG 1g.5gb + 3g.20gb together now (it already holds 4g.20gb at 0-3 (GPU instance 1); with it they need "
        "8 of its 7 compute slices; nvidia-smi mig -lgipp, memory slices 0-7: 1g.5gb at 0, 1, 2, 3, 4, 5 or 6; 3g.20gb at 0-3 or 4-7); "
        "its GPU instances changed since the plan: remove the new ones or give the workload another GPU, then run the same command with --rerun"
    )


def test_without_the_drivers_placements_radts_table_for_the_model_is_used_and_said(machine, monkeypatch):
    monkeypatch.setenv("RADT_FAKE_MIG_NO_PLACEMENTS", "1")
    workloads, problems = _plan(machine, ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"])
    assert problems == [] and [run.mig_slot for run in workloads[1].runs] == [Slot(4, 4), Slot(0, 2), Slot(2, 1), Slot(3, 1)]
    assert workloads[1].notes == [
        "MIG placements on GPU 2 from radt's table for the A100 40GB instead of nvidia-smi mig -lgipp "
        "('nvidia-smi mig -i 2 -lgipp' failed: Unable to list GPU instance possible placements: Insufficient Permissions)"
    ]
    _workloads, problems = _plan(machine, ["4g.20gb", "2g.10gb", "2g.10gb"])
    assert problems == [TOO_MUCH.replace("nvidia-smi mig -lgipp,", "radt's table for the A100 40GB,")]


def _env(folder: Path, home: Path, store: str | None = None) -> dict[str, str]:
    return radt_env(home, store, extra=fake_tools_env(folder))


def test_the_dry_run_and_the_real_run_refuse_before_the_first_workload_starts(machine, radt_home):
    csv = HEADER + "e,1,,,0,-,train.py,smi,\n" + "".join(f"e,2,,,2,{p},train.py,smi,\n" for p in ("4g.20gb", "2g.10gb", "2g.10gb"))
    (machine / "experiment.csv").write_text(csv)
    for dry in (["--dry-run"], []):
        result = run_radt([*dry, "experiment.csv"], env=_env(machine, radt_home), cwd=machine, timeout=60)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr.splitlines() == [f"radt: {TOO_MUCH}", "radt: 1 problem(s) in experiment.csv; nothing was started"]
    assert (machine / "experiment.csv").read_text() == csv, "no workload ran: no status written"
    calls = [json.loads(line)["args"] for line in (machine / "tools.log").read_text().splitlines()]
    assert ["mig", "-i", "2", "-lgipp"] in calls and not any("-cgi" in args for args in calls)
    assert not (radt_home / "mlflow.db").exists()


def test_the_dry_run_shows_where_each_slice_goes(machine, radt_home):
    (machine / "experiment.csv").write_text(HEADER + "e,1,,,2,1g.5gb,train.py,smi,\ne,1,,,2,3g.20gb,train.py,smi,\n")
    result = run_radt(["--dry-run", "experiment.csv"], env=_env(machine, radt_home), cwd=machine, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "  set-up: create MIG 1g.5gb on GPU 2 for run A at memory slice 4 (nvidia-smi mig -i 2 -cgi 1g.5gb:4 -C), destroy it after" in result.stdout
    assert "  set-up: create MIG 3g.20gb on GPU 2 for run B at memory slices 0-3 (nvidia-smi mig -i 2 -cgi 3g.20gb:0 -C), destroy it after" in result.stdout


def test_the_real_run_creates_each_slice_where_it_was_placed(machine, radt_home, empty_sqlite):
    """Was: created in row order, the driver put the 1g and 2g slices where the 3g.20gb had to go: set-up failed."""
    rows = "".join(f"e,1,,,2,{p},train.py,smi,\n" for p in ("1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"))
    (machine / "experiment.csv").write_text(HEADER + rows)
    store = empty_sqlite(machine / "store.db")
    result = run_radt(["--interval", "0.5", "experiment.csv"], env=_env(machine, radt_home, store), cwd=machine, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    exp = ExperimentFile.load(machine / "experiment.csv")
    assert [exp.get(r, "Status") for r in exp.rows] == ["FINISHED"] * 4
    calls = [json.loads(line)["args"] for line in (machine / "tools.log").read_text().splitlines()]
    created = [args[args.index("-cgi") + 1] for args in calls if "-cgi" in args]
    assert created == ["1g.5gb:2", "1g.5gb:3", "2g.10gb:0", "3g.20gb:4"]
    assert json.loads((machine / "tools-state.json").read_text()) == {"mig": [], "mps": []}, "every slice undone"


@pytest.mark.parametrize(
    ("profiles", "model", "fits", "refused"),
    [
        (
            ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
            "A100 40GB",
            ["4g.20gb", "3g.20gb"],
            ["4g.20gb", "2g.10gb", "2g.10gb"],
        ),
        (
            ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
            "A100 80GB or H100 80GB",
            ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
            ["1g.20gb"] * 5,
        ),
        (
            ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
            "H200",
            ["2g.35gb"] * 3 + ["1g.18gb"],
            ["4g.71gb", "2g.35gb", "2g.35gb"],
        ),
        (["1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"], "A30", ["2g.12gb", "1g.6gb", "1g.6gb"], ["2g.12gb", "2g.12gb", "1g.6gb"]),
    ],
    ids=["a100-40gb", "a100-80gb", "h200", "a30"],
)
def test_radts_own_tables_place_as_nvidia_documents(profiles, model, fits, refused):
    from radt.collectors.experiment.migplacement import model_layout, place

    found = model_layout(profiles)
    assert found is not None and found[0] == model
    assert place(found[1], fits) is not None
    assert place(found[1], refused) is None
