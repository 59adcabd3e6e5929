"""A real `mlflow server` (one worker, a SQLite backend) that a test can stop, restart on the same port,
freeze with SIGSTOP and continue: the ways a tracking server goes away under a training run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.support.polling import wait_for
from tests.support.ports import free_port


class MlflowServer:
    """`mlflow server --backend-store-uri sqlite:///<folder>/server.db --workers 1` on 127.0.0.1."""

    def __init__(self, folder: Path, sqlite_template: Path) -> None:
        self.folder = folder
        self.db = folder / "server.db"
        shutil.copy(sqlite_template, self.db)
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    @property
    def backend(self) -> str:
        """The server's own database, for counting what it stored."""
        return f"sqlite:///{self.db}"

    def start(self, timeout: float = 120) -> MlflowServer:
        command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.backend, "--artifacts-destination", str(self.folder / "artifacts")]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        with open(self.folder / "server.log", "a") as log:
            # no job runner: its seven huey consumer processes (half a minute of CPU on a 2-core machine) serve MLflow's
            # server-side jobs (trace rollups, scorers), which no tracking call uses
            env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        wait_for(self._healthy, timeout=timeout, what=f"mlflow server on port {self.port}", interval=0.1)
        return self

    def __enter__(self) -> MlflowServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _healthy(self) -> bool:
        try:
            return urllib.request.urlopen(f"{self.uri}/health", timeout=1).status == 200
        except OSError:
            assert self.proc.poll() is None, (self.folder / "server.log").read_text()[-3000:]
            return False

    def stop(self) -> None:
        """Shut the server down (its port refuses connections until start())."""
        if self.proc is not None and self.proc.poll() is None:
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(30)
        self.proc = None

    def freeze(self) -> None:
        """SIGSTOP: connections stay open and new ones are accepted by the kernel, but nothing answers."""
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
