"""`radt --dry-run` of a large real-world experiment CSV (issue #25): 200 workloads, 600 rows, alone, same GPU,
MPS and MIG on a 4-GPU A100 40GB node (tests/support/big_experiment.py builds it; the driver's tools are the fakes
in tests/fakes/gpu_tools, GPUs 2 and 3 in MIG mode, run by this interpreter rather than a python3 shim).

Three figures, median of several rounds:
  planning   radt's own work in this process (read the CSV, check every row, describe the plan), the driver's
             answers asked once beforehand; per row, and at 10x the rows (linear work stays at ~10x);
  command    `python -m radt --dry-run big.csv` wall time, start to exit, driver calls included;
  baseline   `python -c pass` (the interpreter's start) and `python -m radt --help` (radt's import and CLI).

    python bench/big_experiment.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from radt.collectors.experiment.collocation import mig_profiles, smi_gpu_count  # noqa: E402
from radt.collectors.experiment.csvfile import ExperimentFile, Machine, plan  # noqa: E402
from radt.collectors.experiment.scheduler import describe  # noqa: E402
from tests.support import big_experiment  # noqa: E402
from tests.support.paths import FAKE_NVML_DIR, FAKE_TOOLS  # noqa: E402


def planning(csv: Path, machine: Machine) -> float:
    """Seconds radt takes to read, check and describe the CSV."""
    start = time.perf_counter()
    exp = ExperimentFile.load(csv)
    workloads, problems = plan(exp, machine)
    describe(exp, workloads, rerun=False)
    assert not problems, problems[:3]
    return time.perf_counter() - start


def wall(args: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(args, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    folder = Path(tempfile.mkdtemp(prefix="radt-big-"))
    (folder / "train.py").write_text("pass\n")
    csv, ten = folder / "big.csv", folder / "ten-times.csv"
    big_experiment.write(csv)
    big_experiment.write(ten, big_experiment.build(2000, 6000))
    os.environ.update(
        {
            "PATH": f"{FAKE_TOOLS}:{Path(sys.executable).parent}:{os.environ['PATH']}",
            "RADT_FAKE_MIG_GPUS": "2,3",
            "RADT_FAKE_TOOLS_STATE": str(folder / "state.json"),
        }
    )
    env = {**os.environ, "RADT_HOME": str(folder / "home"), "PYTHONPATH": f"{FAKE_NVML_DIR}:{REPO}", "RADT_FAKE_NVML": "null"}
    machine = Machine(functools.cache(smi_gpu_count), functools.cache(mig_profiles), functools.cache(lambda exe: shutil.which(exe) is not None))
    planning(csv, machine)  # the driver's answers, once
    figures: dict[str, list[float]] = {"plan": [], "plan10": [], "command": [], "python": [], "help": []}
    for _ in range(rounds):
        figures["plan"].append(planning(csv, machine))
        figures["plan10"].append(planning(ten, machine))
        figures["command"].append(wall([sys.executable, "-m", "radt", "--dry-run", "big.csv"], env, folder))
        figures["python"].append(wall([sys.executable, "-c", "pass"], env, folder))
        figures["help"].append(wall([sys.executable, "-m", "radt", "--help"], env, folder))
    med = {k: statistics.median(v) for k, v in figures.items()}
    print(f"big.csv: 200 workloads, 600 rows; median of {rounds} rounds, load {os.getloadavg()[0]:.1f}")
    print(f"planning (in process)          {med['plan'] * 1000:8.1f} ms   {med['plan'] / 600 * 1e6:6.1f} us/row")
    print(
        f"planning, 10x rows             {med['plan10'] * 1000:8.1f} ms   {med['plan10'] / 6000 * 1e6:6.1f} us/row   ratio {med['plan10'] / med['plan']:.1f}x"
    )
    print(f"radt --dry-run big.csv (wall)  {med['command'] * 1000:8.1f} ms")
    print(f"python -c pass                 {med['python'] * 1000:8.1f} ms   RATIO dry-run / python start = {med['command'] / med['python']:.1f}x")
    print(f"radt --help                    {med['help'] * 1000:8.1f} ms   dry-run beyond radt's start = {(med['command'] - med['help']) * 1000:.0f} ms")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
