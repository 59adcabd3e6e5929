"""Where the test suite's time goes (#27): `pytest -q` run once, with the machine's CPU counted around it.

The suite is CPU-bound on 2 cores, so the figure that moves its wall time is CPU, and this says whose:
- the whole machine's busy core-seconds (/proc/stat before and after) against the wall time;
- each test module's CPU: the pytest worker's own (os.times() around each test) and that of the processes below it
  (children: those it reaped, and every live descendant's own and reaped CPU, so Chromium's work counts in the test
  that made it; a daemon that outlives its parent is missed);
- as root with Debian's `acct` installed: BSD process accounting per command (Chromium, Python, PostgreSQL...).

    python bench/suite_cost.py [--top 25] [--repo DIR] [--save FILE] [-- PYTEST ARGS]        # e.g. -- -m "not browser"

Two suites side by side: `git worktree add /tmp/before REV`, then this with `--repo /tmp/before` and without, one after
the other in the same hour, and compare the busy core-seconds, which other people's load moves less than the wall time.
(--repo runs that checkout's tests with this interpreter's radt: like for like where REV's radt is this one.)
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# a pytest plugin, written to a temporary folder on PYTHONPATH and loaded with -p: one JSON line per test
PLUGIN = """
import json, os, time
import pytest

_out = None
_TICK = os.sysconf("SC_CLK_TCK")


def _tree_cpu():
    # CPU of every live process below this worker (Chromium, servers, radt runs), with what each has reaped;
    # a process reaped by this worker counts in os.times()'s children instead
    parents, cpu = {}, {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(name)] = int(stat[1])
            cpu[int(name)] = sum(int(x) for x in stat[11:15]) / _TICK
    me, total = os.getpid(), 0.0
    for pid in cpu:
        p = parents.get(pid)
        while p and p != me and p in parents:
            p = parents[p]
        if p == me:
            total += cpu[pid]
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _out
    if _out is None:
        _out = open(os.path.join(os.environ["SUITE_COST_DIR"], f"tests-{os.getpid()}.jsonl"), "a")
    before, wall, tree = os.times(), time.time(), _tree_cpu()
    yield
    after = os.times()
    _out.write(json.dumps({"id": item.nodeid, "start": wall, "wall": time.time() - wall, "worker": os.getpid(),
                           "self": after.user - before.user + after.system - before.system,
                           "children": after.children_user - before.children_user + after.children_system - before.children_system
                           + _tree_cpu() - tree}) + "\\n")
    _out.flush()
"""


def busy_idle() -> tuple[float, float]:
    """The machine's busy and idle core-seconds since boot (/proc/stat's first line; iowait counts as idle)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / ticks, idle / ticks


def accounting(path: Path) -> bool:
    """Process accounting into PATH, where this is root and `accton` is installed."""
    if os.geteuid() != 0 or not shutil.which("accton"):
        return False
    path.touch()
    return subprocess.run(["accton", str(path)], capture_output=True).returncode == 0


def by_command(path: Path, top: int) -> list[str]:
    """`sa`'s table of CPU per command name, the largest first."""
    subprocess.run(["accton", "off"], capture_output=True)
    out = subprocess.run(["sa", "-a", "-c", str(path)], capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[4].endswith("cp"):  # sa's cp: user + system CPU in minutes
            rows.append((float(parts[4][:-2]) * 60, int(parts[0]), parts[8] if len(parts) > 8 else "(all)"))
    rows.sort(reverse=True)
    return [f"  {cpu:8.1f} s  {count:6d} processes  {name}" for cpu, count, name in rows[:top]]


def by_module(folder: Path, top: int) -> list[str]:
    tests = [json.loads(line) for path in folder.glob("tests-*.jsonl") for line in path.read_text().splitlines()]
    modules: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for t in tests:
        m = modules[t["id"].split("::")[0]]
        m[0] += 1
        m[1] += t["wall"]
        m[2] += t["self"]
        m[3] += t["children"]
    lines = [
        f"  tests {len(tests)}: pytest workers' own CPU {sum(t['self'] for t in tests):.0f} s, waited-for processes {sum(t['children'] for t in tests):.0f} s"
    ]
    lines.append(f"  {'module':48s} {'tests':>5s} {'wall':>7s} {'own':>7s} {'children':>8s}")
    for name, (n, wall, own, children) in sorted(modules.items(), key=lambda kv: -(kv[1][2] + kv[1][3]))[:top]:
        lines.append(f"  {name:48s} {n:5d} {wall:7.1f} {own:7.1f} {children:8.1f}")
    lines.append("CPU by test (own + children), the largest:")
    for t in sorted(tests, key=lambda t: -(t["self"] + t["children"]))[:top]:
        lines.append(f"  {t['self'] + t['children']:7.1f} s  {t['wall']:6.1f} s wall  {t['id']}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=25, help="rows per table")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose tests run (default: this one)")
    parser.add_argument("--save", type=Path, help="also write each test's wall and CPU here, a JSON line per test")
    parser.add_argument("pytest_args", nargs="*", help="after --: what pytest gets besides -q")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        (folder / "suite_cost_plugin.py").write_text(PLUGIN)
        env = {**os.environ, "SUITE_COST_DIR": scratch, "PYTHONPATH": os.pathsep.join(filter(None, [scratch, os.environ.get("PYTHONPATH")]))}
        counted = accounting(folder / "pacct")
        busy0, idle0 = busy_idle()
        start = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "suite_cost_plugin", *args.pytest_args], cwd=args.repo, env=env)
        wall = time.monotonic() - start
        busy1, idle1 = busy_idle()
        busy, idle = busy1 - busy0, idle1 - idle0
        print(f"\nsuite: {wall:.0f} s wall ({wall / 60:.1f} min), exit {result.returncode}; "
              f"the machine {busy:.0f} busy core-seconds of {busy + idle:.0f} ({busy / (busy + idle):.0%})")  # fmt: skip
        if counted:
            print("CPU by command (process accounting):")
            print("\n".join(by_command(folder / "pacct", args.top)))
        if args.save:
            args.save.write_text("".join(path.read_text() for path in folder.glob("tests-*.jsonl")))
        print("CPU by test module:")
        print("\n".join(by_module(folder, args.top)))
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
