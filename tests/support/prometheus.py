"""A real Prometheus server (Debian's `prometheus`) scraping given targets every second, in a temp folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.polling import wait_for, wait_http
from tests.support.ports import free_port

EXECUTABLE = "prometheus"
# a training script that waits until the run's live GPU series holds argv[1] points (read from the store: tests/support/stored.py)
LIVE_TRAIN = """
import sys, time
import radt
from tests.support.stored import points

with radt.run() as run:
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        seen = points(run.run_id, "system/gpu_0_sm_active")
        if seen >= int(sys.argv[1]):
            break
        time.sleep(0.1)
print(f"saw {seen} live points", flush=True)
"""


def available() -> bool:
    return shutil.which(EXECUTABLE) is not None


class Prometheus:
    """`prometheus` on 127.0.0.1:<free port>, scrape_interval 1s, its TSDB and log under `folder`."""

    def __init__(self, folder: Path, targets: list[str], job: str = "dcgm-exporter") -> None:
        self.folder = folder
        self.targets = targets
        self.job = job
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> Prometheus:
        config = self.folder / "prometheus.yml"
        targets = ", ".join(f"'{t}'" for t in self.targets)
        config.write_text(
            f"global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            f"scrape_configs:\n  - job_name: '{self.job}'\n    static_configs:\n      - targets: [{targets}]\n"
        )
        command = [shutil.which(EXECUTABLE) or EXECUTABLE, f"--config.file={config}", f"--storage.tsdb.path={self.folder / 'tsdb'}"]
        command += [f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn", f"--web.console.templates={self.folder}"]
        command += [f"--web.console.libraries={self.folder}"]
        with open(self.folder / "prometheus.log", "a") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_http(f"{self.url}/-/ready", self.proc, timeout=timeout, output=self.log)
        return self

    def log(self) -> str:
        path = self.folder / "prometheus.log"
        return path.read_text()[-3000:] if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> Prometheus:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    def api(self, path: str, **params: str) -> dict:
        """One HTTP API call's `data` (the test's own view of what Prometheus holds)."""
        with urllib.request.urlopen(f"{self.url}{path}?{urllib.parse.urlencode(params)}", timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def wait_samples(self, promql: str, count: int, timeout: float = 30) -> dict:
        """Until `count_over_time(promql)` reaches `count` for each series it matches; returns that answer."""

        def enough():
            data = self.api("/api/v1/query", query=f"count_over_time({promql})")
            result = data["result"]
            return data if result and all(float(r["value"][1]) >= count for r in result) else None

        return wait_for(enough, timeout=timeout, what=lambda: f"{count} samples of {promql} in Prometheus ({self.log()})", interval=0.2)


@contextmanager
def serving(folder: Path, log: Path, devices: list, until: str, scrapes: int, start: int = 5, delay_s: float = 0.0, timeout: float = 30) -> Iterator[tuple]:
    """(exporter, Prometheus): a dcgm-exporter stand-in serving `log` for `devices` (answering after `delay_s`), scraped by a
    real Prometheus, once `until` (a range selector) holds `scrapes` samples."""
    from tests.support.dcgm_exporter import DcgmExporter

    assert available(), "Debian's prometheus is not installed (apt-get install prometheus; .ci/run installs it)"
    with DcgmExporter(log, devices, start=start, delay_s=delay_s) as exporter, Prometheus(folder, [exporter.target]) as server:
        server.wait_samples(until, scrapes, timeout=timeout)
        yield exporter, server
