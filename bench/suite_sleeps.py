"""Where the test suite's workers wait (#27): `pytest -q` run once with every main-thread `time.sleep` counted.

The suite is CPU-bound on 2 cores, but a worker that sleeps holds its share of the tests while the cores may have room:
a real server's period (a Prometheus scrape, Slurm's scheduler, a store outage) or a fixed period the tests should have
set short. This says which call site slept how long, in which test module, summed over the xdist workers.

    python bench/suite_sleeps.py [--top 20] [-- PYTEST ARGS]     # e.g. -- -m "not browser and not slurm"

`tests/support/polling.py`'s line is `wait_for` polling a condition (a real wait); any other line of radt or of the
tests is a fixed sleep, the one to question. Threads' sleeps (radt's sampler, a server's loop) are not counted.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# a pytest plugin, written to a temporary folder on PYTHONPATH and loaded with -p: each worker's sleeps at its end
PLUGIN = """
import collections, json, os, sys, threading, time

_sleep = time.sleep
_slept = collections.defaultdict(float)


def _counted(seconds):
    frame = sys._getframe(1)
    start = time.monotonic()
    try:
        _sleep(seconds)
    finally:
        if threading.current_thread() is threading.main_thread():
            site = f"{frame.f_code.co_filename}:{frame.f_lineno}"
            module = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[0]
            _slept[site, module] += time.monotonic() - start


time.sleep = _counted


def pytest_sessionfinish(session):
    with open(os.path.join(os.environ["SUITE_SLEEPS_DIR"], f"sleeps-{os.getpid()}.json"), "w") as out:
        json.dump([[site, module, seconds] for (site, module), seconds in _slept.items()], out)
"""


def report(folder: Path, top: int) -> list[str]:
    """The seconds slept per call site and per (site, module), the largest first."""
    by_site: dict[str, float] = collections.defaultdict(float)
    by_both: dict[tuple[str, str], float] = collections.defaultdict(float)
    for path in folder.glob("sleeps-*.json"):
        for site, module, seconds in json.loads(path.read_text()):
            site = site.replace(f"{REPO}/", "")
            by_site[site] += seconds
            by_both[site, module] += seconds
    lines = [f"slept {sum(by_site.values()):.1f} s on the workers' main threads; by call site:"]
    lines += [f"  {s:8.1f} s  {site}" for site, s in sorted(by_site.items(), key=lambda kv: -kv[1])[:top]]
    lines.append("by call site and test module:")
    lines += [f"  {s:8.1f} s  {site}  {module}" for (site, module), s in sorted(by_both.items(), key=lambda kv: -kv[1])[:top]]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=20, help="rows per table")
    parser.add_argument("pytest_args", nargs="*", help="after --: arguments for pytest")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="suite-sleeps-") as folder:
        (Path(folder) / "radt_suite_sleeps.py").write_text(PLUGIN)
        env = {**os.environ, "SUITE_SLEEPS_DIR": folder, "PYTHONPATH": os.pathsep.join(p for p in (folder, os.environ.get("PYTHONPATH")) if p)}
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "radt_suite_sleeps", *args.pytest_args], cwd=REPO, env=env)
        print(f"\nsuite: {time.monotonic() - start:.0f} s wall, exit {done.returncode}")
        print("\n".join(report(Path(folder), args.top)))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
