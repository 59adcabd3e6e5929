"""Two runs on one real GPU at once: is each run's own peak memory its own (needs a GPU and PyTorch).

A CSV workload of two runs sharing GPU 0 (Collocation '-'), each holding a different amount of memory while it
multiplies matrices, with an outsider process holding more on the same GPU. `nvidia-smi --query-compute-apps` is
polled beside radt; afterwards the summary radt's dashboard shows (app.summary.summaries.run_summary) is printed per run next
to nvidia-smi's peak for that run's pids: `run_memory_peak_mb` must be the run's own, `gpu_memory_peak_mb` the GPU's
with every process on it.

    python3 bench/gpu_collocated_memory.py run --out DIR          # on the GPU machine (~1 min)
    python3 bench/gpu_collocated_memory.py analyse DIR            # the table, where the dashboard's packages are
    python3 bench/gpu_collocated_memory.py hold GB SECONDS PIDFILE  # one run's script (radt starts it)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOLD = {"A": 3, "B": 6}  # GB each run holds
OUTSIDER_GB = 2
SECONDS = 25


def hold(gb: float, seconds: float, pidfile: Path) -> int:
    """Hold `gb` of GPU memory and keep the GPU busy for `seconds`; write this process's pid first."""
    import torch

    pidfile.write_text(str(os.getpid()))
    block = torch.empty(int(gb * 1e9), dtype=torch.uint8, device="cuda")
    x = torch.randn(4096, 4096, device="cuda")
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            x = torch.tanh(x @ x)
        torch.cuda.synchronize()
    del block
    return 0


def _poll_apps(path: Path, stop: threading.Event) -> None:
    with path.open("w") as out:
        while not stop.is_set():
            text = subprocess.run(
                ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], capture_output=True, text=True
            ).stdout
            out.write(json.dumps({"t": time.time(), "apps": text}) + "\n")
            out.flush()
            stop.wait(0.5)


def _peaks(path: Path) -> dict[int, float]:
    """pid -> the highest used_memory nvidia-smi listed for it, in MB (it prints MiB)."""
    peaks: dict[int, float] = {}
    for line in path.read_text().splitlines():
        for row in json.loads(line)["apps"].splitlines():
            pid, mib = (p.strip() for p in row.split(","))
            if mib.isdigit():
                peaks[int(pid)] = max(peaks.get(int(pid), 0.0), int(mib) * 1.048576)
    return peaks


def run(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    store = out / "colloc.db"
    csv = out / "experiment.csv"
    rows = [f"colloc,1,,,0,-,{Path(__file__).resolve()},nvml+host,hold {gb} {SECONDS} {out / f'pid-{name}'}" for name, gb in HOLD.items()]
    csv.write_text("Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params\n" + "\n".join(rows) + "\n")
    outsider = subprocess.Popen(
        [sys.executable, "-c", f"import torch, time; x = torch.empty(int({OUTSIDER_GB} * 1e9), dtype=torch.uint8, device='cuda'); time.sleep(600)"]
    )
    stop = threading.Event()
    poller = threading.Thread(target=_poll_apps, args=(out / "apps.jsonl", stop), daemon=True)
    poller.start()
    time.sleep(8)  # the outsider holds its memory before the runs start
    env = dict(os.environ, RADT_HOME=str(out / "home"))
    command = [sys.executable, "-m", "radt", "--interval", "0.5", "--store", f"sqlite:///{store}", str(csv)]
    print("$", " ".join(command), flush=True)
    code = subprocess.call(command, env=env, cwd=REPO)
    stop.set()
    poller.join()
    outsider.terminate()
    print(f"radt exited {code}")
    print(csv.read_text())
    try:
        return analyse(out) or code
    except ImportError as exc:  # the lent GPU machines carry radt's tracker, not the dashboard's packages (Flask, Dash)
        print(f"analysis needs the dashboard's packages ({exc}); run `{Path(__file__).name} analyse DIR` where radt is installed")
        return code


def analyse(out: Path) -> int:
    sys.path.insert(0, str(REPO))  # radt from this checkout, as `python -m radt` found it from REPO
    import sqlalchemy as sa

    from radt.app.db.store import make_read_engine
    from radt.app.summary.summaries import run_summary
    from radt.runmodel import LETTER_TAG

    engine = make_read_engine(f"sqlite:///{out / 'colloc.db'}")
    with engine.connect() as conn:  # the runs by their letter (radt.letter: A, B in the CSV's order)
        runs = dict(conn.execute(sa.text("select value, run_uuid from tags where key = :k"), {"k": LETTER_TAG}).all())
    summary = run_summary(engine, list(runs.values())).set_index("run_id")
    peaks = _peaks(out / "apps.jsonl")
    pids = {name: int((out / f"pid-{name}").read_text()) for name in HOLD if (out / f"pid-{name}").exists()}
    print("nvidia-smi compute-apps peaks (MB):", {p: round(v) for p, v in sorted(peaks.items())}, "runs' pids:", pids)
    print(f"{'run':4s} {'held GB':>8s} {'smi peak of its pid':>20s} {'run mem. MB':>12s} {'GPU mem. MB':>12s}")
    for letter, run_id in sorted(runs.items()):
        row = summary.loc[run_id]
        smi = peaks.get(pids.get(letter, -1), float("nan"))
        print(f"{letter:4s} {HOLD.get(letter, float('nan')):8.1f} {smi:20.0f} {row.run_memory_peak_mb:12.0f} {row.gpu_memory_peak_mb:12.0f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("run").add_argument("--out", type=Path, required=True)
    sub.add_parser("analyse").add_argument("out", type=Path)
    held = sub.add_parser("hold")
    held.add_argument("gb", type=float)
    held.add_argument("seconds", type=float)
    held.add_argument("pidfile", type=Path)
    args = parser.parse_args()
    if args.what == "hold":
        return hold(args.gb, args.seconds, args.pidfile)
    return run(args.out) if args.what == "run" else analyse(args.out)


if __name__ == "__main__":
    sys.exit(main())
