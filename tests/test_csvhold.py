"""One radt per experiment CSV (collectors/experiment/csvhold.py): the lock a killed radt left does not block the next one, a held
CSV names its holder, and a CSV written between its plan and the lock is refused."""

from __future__ import annotations

import json
import os
import socket

import pytest

from radt.collectors.experiment.csvhold import CsvBusy, holding, lock_path

CSV = "Experiment,Workload,File\nx,1,train.py\n"


def test_a_lock_file_a_killed_radt_left_is_taken_and_removed_at_the_end(tmp_path):
    csv = tmp_path / "experiment.csv"
    csv.write_text(CSV)
    lock_path(csv).write_text(json.dumps({"pid": 999999, "host": "gone", "since": 0}))  # SIGKILL: the file stays, its flock went
    with holding(csv, csv.read_bytes()):
        assert json.loads(lock_path(csv).read_text())["pid"] == os.getpid()
    assert not lock_path(csv).exists()


def test_a_held_csv_names_its_holder_and_a_symlink_to_it_is_the_same_csv(tmp_path):
    csv = tmp_path / "experiment.csv"
    csv.write_text(CSV)
    link = tmp_path / "link.csv"
    link.symlink_to(csv)
    with holding(csv, csv.read_bytes()), pytest.raises(CsvBusy) as busy, holding(link, link.read_bytes()):
        pass
    assert str(busy.value).startswith(f"{link} is being run by another radt (pid {os.getpid()} on {socket.gethostname()}, since ")
    assert lock_path(link) == lock_path(csv) and not lock_path(csv).exists()


def test_a_csv_written_between_its_plan_and_the_lock_is_refused(tmp_path):
    csv = tmp_path / "experiment.csv"
    csv.write_text(CSV)
    read = csv.read_bytes()
    csv.write_text(CSV.replace("x,1", "x,1,FINISHED"))  # another radt's status, written as this one planned
    with pytest.raises(CsvBusy, match="changed while radt read it"), holding(csv, read):
        pass
    assert not lock_path(csv).exists()
