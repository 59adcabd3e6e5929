"""`nohup radt train.py &`, then the terminal closes: SIGHUP, which nohup ignores, must not stop the training.
radt keeps it ignored (its own handler would have turned the hang-up into an interrupt of the script)."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.support.radtproc import radt_command, radt_env

TRAIN = textwrap.dedent(
    """
    import pathlib, sys, time
    flag = pathlib.Path(sys.argv[1])
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    print("trained" if flag.exists() else "gave up", flush=True)
    """
)


def _ignored(pid: int) -> set[int]:
    """The signals a process ignores (its SigIgn mask in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask & (1 << (n - 1))}
    return set()


def _as_nohup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


@pytest.mark.parametrize("store_uri", ["sqlite"], indirect=True)  # signal handling does not depend on the store
def test_a_hang_up_under_nohup_leaves_the_training_running(store_uri, radt_home, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    flag = tmp_path / "go-on"
    proc = subprocess.Popen(
        radt_command("-e", "nohup", "-l", "host", "train.py", str(flag)),
        env=radt_env(radt_home, store_uri),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_nohup,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"  # the script runs, radt's handlers are in place
        assert signal.SIGHUP in _ignored(proc.pid), "radt replaced nohup's ignored SIGHUP with a handler"
        os.kill(proc.pid, signal.SIGHUP)  # the terminal closes
        flag.touch()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and out.strip() == "trained", err
    client = MlflowClient(store_uri)
    run = client.search_runs([client.get_experiment_by_name("nohup").experiment_id])[0]
    assert run.info.status == "FINISHED" and "radt.stop_reason" not in run.data.tags
