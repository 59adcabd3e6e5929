"""`python -m radt` as a user runs it: the environment a shell gives it, run to the end or live in the background."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.support.paths import FAKE_BIN, FAKE_NVML_DIR, FAKE_TOOLS, REPO
from tests.support.polling import wait_for

# radt's fixed periods (radt/settings.py) that a test would only wait out: short in the tests' own processes
# (tests/conftest.py) and in every process radt_env starts, the dashboard's included. One test per period, given
# DEFAULT_PERIODS, keeps the real defaults.
QUICK_PERIODS = {
    "RADT_SLURM_POLL": "0.2",  # `radt --slurm`'s squeue period (1 s)
    "RADT_PARENT_SETTLE": "0.3",  # two looks at a new workload parent (1 s)
    "RADT_LIVE_REDRAW": "2",  # Explore's redraw of a running run (5 s)
    # not RADT_LIVE_POLL (1 s): a tick that comes before the last one's answer supersedes it, and at 0.5 s under load
    # the Live page never showed a value (three Live tests failed in a full run)
    "RADT_SCRIPT_LOG_POLL": "0.05",  # reads of a script's metrics file (0.2 s)
    "RADT_RETRY_INTERVAL": "0.5",  # the writer's and the script log's next try of a store that failed (2 s)
}
DEFAULT_PERIODS = {name: "" for name in QUICK_PERIODS}  # `extra=DEFAULT_PERIODS`: each period at radt's own default


def radt_env(home: Path, store: str | None = None, fake_gpus: str = "null", fake_bin: bool = False, extra: dict | None = None) -> dict[str, str]:
    """The environment a user's shell would give `radt`, with fakes only at the hardware boundary.

    `fake_gpus`: the GPUs the fake NVML (tests/fakes/fake_nvml.py) answers for, as JSON; the default
    "null" is a machine without the NVIDIA driver, so a developer's real GPU never changes what a test sees.
    The periods are QUICK_PERIODS; a name given "" in `extra` is left out (radt's default).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RADT_", "PYTEST_", "SLURM"))}
    env.update(QUICK_PERIODS)
    env["RADT_HOME"] = str(home)
    # MLflow 3.17's telemetry thread can unset its session variable while a request in the script reads it
    # (KeyError '_MLFLOW_TELEMETRY_SESSION_ID', seen once under load); CI=true turns it off the same way
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    if store:
        env["MLFLOW_TRACKING_URI"] = store
    # a pynvml that answers like a real driver with these GPUs (or like a machine without one)
    env["PYTHONPATH"] = os.pathsep.join([str(FAKE_NVML_DIR), str(REPO)])
    env["RADT_FAKE_NVML"] = fake_gpus
    if fake_bin:
        env["PATH"] = os.pathsep.join([str(FAKE_BIN), env.get("PATH", "")])
    env.update(extra or {})
    return {k: v for k, v in env.items() if not (k in QUICK_PERIODS and v == "")}


def fake_tools_env(folder: Path) -> dict[str, str]:
    """`extra` for radt_env: the fake driver tools first on PATH, recording their calls in FOLDER/tools.log; pynvml
    without a driver (no RADT_FAKE_NVML), whatever this machine has, so the GPUs are nvidia-smi's."""
    return {
        "RADT_FAKE_TOOLS_LOG": str(folder / "tools.log"),
        "RADT_FAKE_TOOLS_STATE": str(folder / "tools-state.json"),
        # the tests' own Python next: the fakes' `#!/usr/bin/env python3` then skips pyenv's bash shim (~0.5 s a call under load)
        "PATH": f"{FAKE_TOOLS}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": f"{FAKE_NVML_DIR}:{REPO}",
    }


def fake_gpu_node(folder: Path, monkeypatch) -> Path:
    """This process on a node of 4 A100s (GPU 2 in MIG mode) as the fake nvidia-smi has it: its tools on PATH with their
    state and log in FOLDER, NVML the fake without a library (whatever this machine has), a train.py there as the cwd."""
    import pynvml

    from tests.fakes.fake_nvml import install_fake

    install_fake(pynvml, None, monkeypatch.setattr)
    monkeypatch.setenv("PATH", f"{FAKE_TOOLS}:/usr/bin:/bin")
    monkeypatch.setenv("RADT_FAKE_TOOLS_STATE", str(folder / "tools-state.json"))
    monkeypatch.setenv("RADT_FAKE_TOOLS_LOG", str(folder / "tools.log"))
    (folder / "train.py").write_text("print('training')\n")
    monkeypatch.chdir(folder)
    return folder


def radt_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "radt", *args]


def run_radt(args: list[str], env: dict, cwd: Path, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """`radt ARGS` to its end; its output captured as text."""
    return subprocess.run(radt_command(*args), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, **kw)


class LiveRadt:
    """`python -m radt ARGS` running in the background; its stderr collected line by line as it comes."""

    def __init__(self, args: list[str], env: dict, cwd: Path) -> None:
        self.proc = subprocess.Popen(radt_command(*args), env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def line(self, needle: str, timeout: float = 60) -> str:
        """The first stderr line containing `needle`, waiting for it."""

        def found():
            hit = next((line for line in self.lines if needle in line), None)
            assert hit or self.proc.poll() is None, f"radt exited ({self.proc.returncode}) without saying '{needle}':\n{self.stderr}"
            return hit

        try:
            return wait_for(found, timeout=timeout, what=f"'{needle}' on radt's stderr")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- radt's stderr ---\n{self.stderr}") from None

    def run_id(self) -> str:
        return re.search(r"radt: run (\w+) in experiment", self.line("radt: run ")).group(1)

    def wait(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(10)
        return code

    def end(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.proc.kill()
        self.wait(30)
