"""A real Prometheus server (Debian's `prometheus`) scraping given targets twice a second, in a temp folder.

A new Prometheus scrapes nothing for its first ~5 s: its discovery and scrape managers hand targets on at a 5 s tick.
Each test that needs one takes a warm server (`taken`), started earlier in the background on ports nothing listens on
yet; the test binds its exporters there, and they are scraped within a second. Each test still has its own server and
its own TSDB: nothing another test served is in what it reads.
"""

from __future__ import annotations

import atexit
import json
import shutil
import subprocess
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.polling import wait_for, wait_http
from tests.support.ports import free_port, is_free

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


# Every test's Prometheus scrapes twice a second: a test waits for scrapes (a module's first few, a run's), and at
# Prometheus's usual 15 s or the 1 s before, the waits were most of the Prometheus tests' time
SCRAPE_MS = 500


class Prometheus:
    """`prometheus` on 127.0.0.1:<free port>, scrape_interval SCRAPE_MS, its TSDB and log under `folder`."""

    def __init__(self, folder: Path, targets: list[str], job: str = "dcgm-exporter") -> None:
        self.folder = folder
        self.targets = targets
        self.job = job
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    @property
    def ports(self) -> list[int]:
        """The targets' ports (127.0.0.1:PORT each)."""
        return [int(target.rsplit(":", 1)[1]) for target in self.targets]

    def launch(self) -> None:
        """Start the server without waiting for it (ready() waits)."""
        config = self.folder / "prometheus.yml"
        targets = ", ".join(f"'{t}'" for t in self.targets)
        config.write_text(
            f"global:\n  scrape_interval: {SCRAPE_MS}ms\n  scrape_timeout: {SCRAPE_MS}ms\n  evaluation_interval: 1s\n"
            f"scrape_configs:\n  - job_name: '{self.job}'\n    static_configs:\n      - targets: [{targets}]\n"
        )
        command = [shutil.which(EXECUTABLE) or EXECUTABLE, f"--config.file={config}", f"--storage.tsdb.path={self.folder / 'tsdb'}"]
        command += [f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn", f"--web.console.templates={self.folder}"]
        command += [f"--web.console.libraries={self.folder}"]
        with open(self.folder / "prometheus.log", "a") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def ready(self, timeout: float = 30) -> Prometheus:
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


SLOTS = 2  # the ports a warm server scrapes: the most exporters one test serves (test_prometheus_hostname's two)
_warm: list[Prometheus] = []  # this test process's started servers that no test has taken yet


def _launched() -> Prometheus:
    """A Prometheus started, not waited for, on SLOTS free ports, in a folder of its own."""
    server = Prometheus(Path(tempfile.mkdtemp(prefix="radt-test-prometheus-")), [f"127.0.0.1:{free_port()}" for _ in range(SLOTS)])
    server.launch()
    return server


def _discard(server: Prometheus) -> None:
    server.stop()
    shutil.rmtree(server.folder, ignore_errors=True)


def warm_up() -> None:
    """Start a Prometheus in the background on SLOTS free ports, for the next test of this process that takes one."""
    if available() and not _warm:
        _warm.append(_launched())


@atexit.register
def _discard_warm() -> None:
    """The server no test took, at the test process's end."""
    while _warm:
        _discard(_warm.pop())


@contextmanager
def taken() -> Iterator[Prometheus]:
    """A started Prometheus scraping `ports` that nothing listens on yet: bind the test's exporters there. Warm when one
    was started in the background (warm_up: conftest starts one at collection, and each take starts the next); a port
    something else took meanwhile gets a new server, waited for. Stopped, with its TSDB, at the end."""
    assert available(), "Debian's prometheus is not installed (apt-get install prometheus; .ci/run installs it)"
    server = _warm.pop() if _warm else None
    if server is None or server.proc is None or server.proc.poll() is not None or not all(map(is_free, server.ports)):
        if server is not None:
            _discard(server)
        server = _launched()
    warm_up()  # the next test's, while this one runs
    try:
        yield server.ready()
    finally:
        _discard(server)


@contextmanager
def serving(log: Path, devices: list, until: str, scrapes: int, start: int = 5, delay_s: float = 0.0, timeout: float = 30) -> Iterator[tuple]:
    """(exporter, Prometheus): a dcgm-exporter stand-in serving `log` for `devices` (answering after `delay_s`), scraped by a
    real Prometheus, once `until` (a range selector) holds `scrapes` samples."""
    from tests.support.dcgm_exporter import DcgmExporter

    with taken() as server, DcgmExporter(log, devices, start=start, delay_s=delay_s, port=server.ports[0]) as exporter:
        server.wait_samples(until, scrapes, timeout=timeout)
        yield exporter, server
