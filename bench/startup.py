"""radt's own start and end cost per run (issue #13): `python tiny.py` against `radt -l host tiny.py`
and against a two-run CSV workload, alternating, median of several rounds.

tiny.py writes its own start (first line) and end (last line) wall times, so
  start cost = (script start - launch) under radt - the same under bare python (interpreter start),
  end cost   = (exit - script end) under radt - the same under bare python (interpreter exit).
For the CSV workload the bare contender starts both scripts at once (Popen both, wait both) and
the latest start and end count. The first radt run of a store (MLflow's schema, pip freeze) is a
warm-up and not counted. No radt module is imported here: PYTHONPATH picks the radt that runs.

    python bench/startup.py [--rounds 7] [--store postgresql://postgres@127.0.0.1:5432/postgres] [--also DIR]
    PYTHONPATH=/tmp/radt-before python bench/startup.py     # another checkout of radt

--also DIR: a second radt (PYTHONPATH=DIR, e.g. a checkout of an older commit) measured in the same rounds,
alternating with the first, so that both see the same load on a shared machine. Only for a radt whose subpackages
come from DIR: an editable install maps radt.collectors and radt.app to its own checkout whatever PYTHONPATH says, so
another commit's radt needs a venv of its own (`python3 -m venv /tmp/bv && /tmp/bv/bin/pip install -e /tmp/before`),
and this script run by each venv's python in turn.

--store: a PostgreSQL server; a scratch database is created on it and dropped after. Default: a
scratch SQLite file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

TINY = """\
import json, os, sys, time
start = time.time()
name = sys.argv[1] if len(sys.argv) > 1 else "tiny"
with open(os.environ["BENCH_TIMES"], "a") as log:
    log.write(json.dumps({"name": name, "start": start, "end": time.time()}) + "\\n")
"""
HEADER = "Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params\n"


def read_times(path: Path) -> list[dict]:
    lines = path.read_text().splitlines() if path.exists() else []
    path.unlink(missing_ok=True)
    return [json.loads(line) for line in lines]


def timed(commands: list[list[str]], cwd: Path, env: dict, times: Path, scripts: int | None = None) -> tuple[float, float]:
    """(start, end) of one contender: latest script start - launch, exit - latest script end, in seconds."""
    launched = time.time()
    procs = [subprocess.Popen(c, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in commands]
    errors = [p.communicate()[1] for p in procs]
    exited = time.time()
    for proc, err in zip(procs, errors):
        if proc.returncode != 0:
            sys.exit(f"{commands} failed ({proc.returncode}):\n{err.decode(errors='replace')[-3000:]}")
    found = read_times(times)
    if len(found) != (scripts or len(commands)):
        sys.exit(f"expected {scripts or len(commands)} script runs, found {len(found)}: {found}")
    return max(f["start"] for f in found) - launched, exited - max(f["end"] for f in found)


def csv_command(folder: Path, store: str, number: int) -> list[str]:
    """A fresh two-run CSV experiment (radt rewrites it with statuses) and the command that runs it."""
    path = folder / f"experiment-{number}.csv"
    path.write_text(HEADER + f"bench,{number},,,-,-,tiny.py,host,A\nbench,{number},,,-,-,tiny.py,host,B\n")
    return [sys.executable, "-m", "radt", "--store", store, path.name]


def scratch_postgres(server: str) -> tuple[str, Callable[[], None]]:
    """A new database on `server` (a PostgreSQL URI) and the function that drops it."""
    import sqlalchemy as sa

    name = f"radt_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return server.rsplit("/", 1)[0] + "/" + name, drop


def summary(label: str, radt: list[tuple[float, float]], bare: list[tuple[float, float]]) -> list[str]:
    rs, re_ = statistics.median(r[0] for r in radt), statistics.median(r[1] for r in radt)
    bs, be = statistics.median(b[0] for b in bare), statistics.median(b[1] for b in bare)
    return [
        f"{label}:",
        f"  start: bare {bs:6.3f} s, radt {rs:6.3f} s -> radt's own {rs - bs:6.3f} s (ratio {rs / bs:5.1f})",
        f"  end:   bare {be:6.3f} s, radt {re_:6.3f} s -> radt's own {re_ - be:6.3f} s (ratio {re_ / be:5.1f})",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds (default 7)")
    parser.add_argument("--store", help="a PostgreSQL server URI (a scratch database is made on it); default: a scratch SQLite file")
    parser.add_argument("--also", help="a folder with another radt (a checkout) to measure in the same rounds, through PYTHONPATH")
    parser.add_argument("--no-csv", action="store_true", help="skip the two-run CSV workload")
    opts = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="radt-bench-start-"))
    (folder / "tiny.py").write_text(TINY)
    times = folder / "times.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(BENCH_TIMES=str(times), MLFLOW_DISABLE_TELEMETRY="true")
    variants = {os.environ.get("PYTHONPATH") or "installed radt": {**env, "RADT_HOME": str(folder / "home-0")}}
    if opts.also:
        variants[opts.also] = {**env, "RADT_HOME": str(folder / "home-1"), "PYTHONPATH": opts.also}
    drop = None
    if opts.store:
        store, drop = scratch_postgres(opts.store)
    else:
        store = f"sqlite:///{folder / 'store.db'}"
    bare1 = [[sys.executable, "tiny.py"]]
    bare2 = [[sys.executable, "tiny.py", "A"], [sys.executable, "tiny.py", "B"]]
    single = [[sys.executable, "-m", "radt", "--store", store, "-l", "host", "tiny.py"]]
    results: dict[str, list] = {"bare1": [], "bare2": []}
    try:
        for label, variant in variants.items():  # warm-up: the store's schema, the pip freeze cache
            timed(single, folder, variant, times)
            if not opts.no_csv:
                timed([csv_command(folder, store, 0)], folder, variant, times, scripts=2)
            results[f"single {label}"], results[f"csv {label}"] = [], []
        for number in range(1, opts.rounds + 1):
            results["bare1"].append(timed(bare1, folder, env, times))
            for label, variant in variants.items():
                results[f"single {label}"].append(timed(single, folder, variant, times))
            if opts.no_csv:
                continue
            results["bare2"].append(timed(bare2, folder, env, times))
            for index, (label, variant) in enumerate(variants.items()):
                results[f"csv {label}"].append(timed([csv_command(folder, store, number * 10 + index)], folder, variant, times, scripts=2))
    finally:
        if drop:
            drop()
    load = os.getloadavg()
    print(f"store {store.split(':')[0]}, {opts.rounds} rounds, median; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, {os.cpu_count()} CPUs")
    lines = []
    for label in variants:
        lines += summary(f"radt -l host tiny.py vs python tiny.py; radt from {label}", results[f"single {label}"], results["bare1"])
    if not opts.no_csv:
        for label in variants:
            lines += summary(
                f"radt experiment.csv (one workload, 2 runs) vs 2 x python tiny.py at once; radt from {label}", results[f"csv {label}"], results["bare2"]
            )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
