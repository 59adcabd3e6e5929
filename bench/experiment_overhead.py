"""What `radt experiment.csv` costs per workload, and how together collocated runs start.

Side by side in one script: the baseline starts each workload's scripts itself with
`python train.py` (Popen all, wait all), then radt runs the same workloads from a CSV. The
"training" sleeps, so the difference is radt's own work (MLflow import, run creation, sampler
start, the start gate, the end: logs, artifacts, status), not CPU contention.

    python bench/experiment_overhead.py [--workloads 3] [--runs 2] [--seconds 10] [--store URI]
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAIN = """\
import json, os, sys, time
start = time.time()
time.sleep(float(sys.argv[sys.argv.index("--seconds") + 1]))
with open(os.environ["BENCH_LOG"], "a") as log:
    log.write(json.dumps({"name": sys.argv[sys.argv.index("--name") + 1], "start": start}) + "\\n")
"""


def skews(log: Path, workloads: int) -> list[float]:
    """Per workload: the spread of its scripts' start times, in ms."""
    starts: dict[str, list[float]] = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        starts.setdefault(entry["name"].split("-")[0], []).append(entry["start"])
    return [(max(v) - min(v)) * 1000 for _, v in sorted(starts.items())][:workloads]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2, help="collocated runs per workload")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each run's training")
    parser.add_argument("--store", help="tracking URI for radt (default: a fresh SQLite file)")
    opts = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="radt-bench-exp-"))
    (folder / "train.py").write_text(TRAIN)
    env = {**os.environ, "RADT_HOME": str(folder / "home"), "PYTHONPATH": str(REPO), "MLFLOW_DISABLE_TELEMETRY": "true"}
    names = [[f"w{w}-{chr(65 + r)}" for r in range(opts.runs)] for w in range(opts.workloads)]

    env["BENCH_LOG"] = str(folder / "baseline.jsonl")
    began = time.perf_counter()
    for workload in names:
        procs = [subprocess.Popen([sys.executable, "train.py", "--name", n, "--seconds", str(opts.seconds)], cwd=folder, env=env) for n in workload]
        for proc in procs:
            proc.wait()
    baseline = time.perf_counter() - began

    env["BENCH_LOG"] = str(folder / "radt.jsonl")
    rows = "".join(f"bench,{w},,,-,-,train.py,host,--name {n} --seconds {opts.seconds}\n" for w, workload in enumerate(names) for n in workload)
    (folder / "experiment.csv").write_text("Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params\n" + rows)
    store = opts.store or f"sqlite:///{folder / 'store.db'}"
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "radt", "--store", store, "experiment.csv"], cwd=folder, env=env, capture_output=True, text=True)
    radt = time.perf_counter() - began
    if done.returncode != 0:
        sys.exit(f"radt experiment failed:\n{done.stderr[-3000:]}")

    base_skew, radt_skew = skews(folder / "baseline.jsonl", opts.workloads), skews(folder / "radt.jsonl", opts.workloads)
    print(f"{opts.workloads} workloads × {opts.runs} runs × {opts.seconds:g} s, store {store.split(':')[0]}")
    print(f"baseline (python train.py, Popen per workload): {baseline:7.1f} s")
    print(f"radt experiment.csv:                            {radt:7.1f} s   ratio {radt / baseline:.2f}")
    print(f"radt's cost per workload:                       {(radt - baseline) / opts.workloads:7.1f} s")
    print(f"start spread within a workload, median (max):   baseline {statistics.median(base_skew):.0f} ms ({max(base_skew):.0f}),"
          f" radt {statistics.median(radt_skew):.0f} ms ({max(radt_skew):.0f})")  # fmt: skip


if __name__ == "__main__":
    main()
