"""Real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright) and a real dashboard
process (`python app.py`) for the browser tests. Every wait is for a condition, never a fixed sleep."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("RADT_TEST_ARTIFACTS", REPO / "test-artifacts"))
CHROMIUM = os.environ.get("RADT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# JavaScript helpers evaluated in the page: the traces Plotly drew on the explore charts.
TRACES_JS = """
(axis) => {
  const g = document.querySelector('#charts .js-plotly-plot');
  if (!g || !g._fullData) { return null; }
  return g._fullData.filter(t => (t.yaxis || 'y') === axis && t.visible !== false)
    .map(t => ({name: t.name, n: t.x ? t.x.length : 0, x: Array.from(t.x || []), showlegend: t.showlegend}));
}
"""


def chromium_path() -> str:
    """Debian's Chromium; under CI its absence fails the run (.ci/run installs it)."""
    path = shutil.which(CHROMIUM) or (CHROMIUM if os.path.exists(CHROMIUM) else None)
    if path is None:
        message = f"Chromium not found at {CHROMIUM}; apt-get install chromium (or set RADT_CHROMIUM)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@contextmanager
def chromium():
    """A Playwright browser on Debian's Chromium with the flags this machine needs."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, process: subprocess.Popen, timeout: float = 60) -> None:
    """Until `url` answers 200 (or the process dies, with its output in the failure)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            out = process.stdout.read() if process.stdout else ""
            raise AssertionError(f"dashboard exited with {process.returncode}:\n{out}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout:.0f} s")


@contextmanager
def dashboard(store: str, env: dict[str, str], *extra: str):
    """`python app.py --store STORE` on a free port, as a user starts it; yields the base URL."""
    port = free_port()
    command = [sys.executable, str(REPO / "app.py"), "--store", store, "--port", str(port), *extra]
    process = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}/"
    try:
        wait_http(base, process)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout:
            process.stdout.close()


def screenshot(page, name: str) -> Path:
    """Keep what the browser showed as a test artifact (test-artifacts/NAME.png)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
