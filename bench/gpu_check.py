"""radt on a real NVIDIA GPU: a PyTorch workload with known phases under `radt -l nvml+host`, checked against nvidia-smi.

NEEDS A GPU: an NVIDIA driver, PyTorch with CUDA, and radt's runtime (mlflow, SQLAlchemy,
nvidia-ml-py, psutil). It never changes the GPU's settings (clocks, power, MIG, persistence,
compute mode). What `run` does, in one go:

  1. prints nvidia-smi and the GPU's name, driver, memory, power limit; says whether dcgmi is there;
  2. starts, outside radt, an `nvidia-smi --query-gpu=... -l 1` logger (smi.csv, each line
     prefixed with the epoch time), an `nvidia-smi --query-compute-apps` poller every 2 s
     (apps.csv) and an "outsider" process holding 2 GiB of GPU memory (it must NOT count as the
     run's process memory);
  3. runs `python -m radt -e gpu-check -d 0 -l nvml+host --interval 0.5 --store sqlite:///... \
     bench/gpu_check.py workload`, whose workload goes through these phases, each start logged
     as the MLflow metric `gpu_check/phase` (= the phase's index) and printed with its time:
        idle          10 s  the model is on the GPU, nothing runs (a data loader's wait)
        warmup        a few ResNet-50 steps (cuDNN autotuning), not measured
        train         40 s  ResNet-50, bf16 autocast, channels_last, batch 128, SGD, random data
        single_block  20 s  torch.cuda._sleep: one thread of one block spinning (<<<1,1>>>):
                            GRACT and nvidia-smi's utilization high, SMACT about 1/#SMs
        memory        20 s  4 GiB device-to-device copies: DRAMA high, tensor pipes idle
        tail           5 s  idle again after torch.cuda.empty_cache()
     The workload also starts a child process holding 1 GiB of GPU memory for the whole run (it
     MUST count as the run's process memory: the process tree);
  4. copies radt's artifacts gpu-inventory.json and radt-sources.json and the store (gpu.db) to --out;
  5. runs bench/sampler_cost.py (--sampler-seconds, 60 by default) into sampler_cost.json, unless --no-sampler-cost;
  6. prints the per-phase table (`analyse`).

    python3 bench/gpu_check.py run --out OUT_DIR
    python3 bench/gpu_check.py analyse OUT_DIR        # the table again, from the files (no GPU needed)

The table trims 1.5 s after each phase starts and 1 s before it ends (a GPM ratio is the mean
over the 0.5 s before its sample). docs/GPU.md has the numbers of the last run on an H100.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PHASES = [("idle", 10.0), ("warmup", 0.0), ("train", 40.0), ("single_block", 20.0), ("memory", 20.0), ("tail", 5.0)]
SCALE = float(os.environ.get("GPU_CHECK_SCALE", "1"))  # shorter phases for a dry run of this script
PHASE_KEY = "gpu_check/phase"
SMI_QUERY = "utilization.gpu,utilization.memory,memory.used,memory.total,power.draw,clocks.sm,temperature.gpu"
MIB_MB = 1024 * 1024 / 1e6
TRIM_START, TRIM_END = 1.5, 1.0
GPU_METRICS = [
    ("sm_active", "SMACT", 3),
    ("sm_occupancy", "SMOCC", 3),
    ("gr_engine_active", "GRACT", 3),
    ("dram_active", "DRAMA", 3),
    ("tensor_active", "TENSO", 3),
    ("fp16_active", "FP16A", 3),
    ("fp32_active", "FP32A", 3),
    ("integer_active", "INTA", 3),
    ("utilization_percentage", "util %", 1),
    ("memory_utilization_percentage", "mem util %", 1),
    ("memory_usage_megabytes", "memory MB", 0),
    ("process_memory_megabytes", "run memory MB", 0),
    ("power_usage_watts", "power W", 0),
    ("sm_clock_mhz", "SM MHz", 0),
    ("pcie_tx_bytes_per_second", "PCIe TX B/s", 0),
    ("pcie_rx_bytes_per_second", "PCIe RX B/s", 0),
]

HOLD_GPU_MEMORY = """
import sys, torch
x = torch.ones(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("holding", x.numel(), "bytes of GPU memory in pid", __import__("os").getpid(), flush=True)
sys.stdin.read()
"""


# --------------------------------------------------------------------------- the workload (runs under radt)


def workload() -> int:
    import torch

    import radt

    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    child = subprocess.Popen([sys.executable, "-c", HOLD_GPU_MEMORY, str(1 << 30)], stdin=subprocess.PIPE)
    try:
        with radt.run() as run:
            run.log_params({"gpu_check.pid": os.getpid(), "gpu_check.child_pid": child.pid, "gpu_check.device": torch.cuda.get_device_name(0)})
            model, optimizer, batch = _model(torch, device)
            for index, (name, seconds) in enumerate(PHASES):
                print(f"PHASE {index} {name} {time.time():.3f}", flush=True)
                run.log_metric(PHASE_KEY, index)
                started = time.monotonic()
                try:
                    rate = _phase(torch, device, name, seconds * SCALE, model, optimizer, batch)
                except Exception as exc:  # keep the timeline: the other phases still get measured
                    traceback.print_exc()
                    print(f"  {name} failed ({exc}); sleeping out the phase", flush=True)
                    time.sleep(max(0.0, seconds * SCALE - (time.monotonic() - started)))
                    rate = None
                if rate is not None:
                    print(f"  {name}: {rate[0]:.1f} {rate[1]}", flush=True)
                    run.log_metric(f"gpu_check/{name}_{rate[1].replace('/', '_per_')}", rate[0])
                run.log_metric("gpu_check/torch_reserved_megabytes", torch.cuda.memory_reserved() / 1e6)
            print(f"PHASE {len(PHASES)} end {time.time():.3f}", flush=True)
            run.log_metric(PHASE_KEY, len(PHASES))
    finally:
        child.stdin.close()
        child.wait(30)
    return 0


def _model(torch, device):
    try:
        from torchvision.models import resnet50

        model = resnet50(weights=None)
    except ImportError:  # no torchvision: a plain conv net of similar shape
        layers, channels = [], 3
        for width in (64, 128, 256, 512, 1024):
            layers += [torch.nn.Conv2d(channels, width, 3, stride=2, padding=1), torch.nn.BatchNorm2d(width), torch.nn.ReLU()]
            channels = width
        model = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(channels, 1000))
    model = model.to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(128, 3, 224, 224, device=device).to(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (128,), device=device)
    torch.cuda.synchronize()
    return model, optimizer, (images, labels)


def _train_step(torch, model, optimizer, batch) -> None:
    images, labels = batch
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def _phase(torch, device, name, seconds, model, optimizer, batch):
    """Run one phase; returns (rate, unit) for the phases that do work."""
    end = time.monotonic() + seconds
    if name in ("idle", "tail"):
        if name == "tail":
            torch.cuda.empty_cache()
        time.sleep(seconds)
        return None
    if name == "warmup":
        for _ in range(15):
            _train_step(torch, model, optimizer, batch)
        torch.cuda.synchronize()
        return None
    if name == "train":
        steps, started = 0, time.monotonic()
        while time.monotonic() < end:
            for _ in range(5):
                _train_step(torch, model, optimizer, batch)
            torch.cuda.synchronize()
            steps += 5
        return steps * batch[0].shape[0] / (time.monotonic() - started), "images/s"
    if name == "single_block":
        cycles = 20_000_000  # about 10 ms at the H100's 1.98 GHz
        launches, started = 0, time.monotonic()
        while time.monotonic() < end:
            for _ in range(10):
                torch.cuda._sleep(cycles)  # one thread of one block spinning on clock64()
            torch.cuda.synchronize()
            launches += 10
        return launches / (time.monotonic() - started), "launches/s"
    if name == "memory":
        size = 4 << 30
        src = torch.empty(size, dtype=torch.uint8, device=device).fill_(7)
        dst = torch.empty_like(src)
        copies, started = 0, time.monotonic()
        while time.monotonic() < end:
            for _ in range(10):
                dst.copy_(src)
            torch.cuda.synchronize()
            copies += 10
        rate = 2 * size * copies / (time.monotonic() - started) / 1e9
        del src, dst
        return rate, "GB/s"
    raise ValueError(name)


# --------------------------------------------------------------------------- the driver (outside radt)


def _sh(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{command[0]}: {exc}\n"


def _logger(command: list[str], path: Path, stop: threading.Event, every: float | None = None, header: str = "") -> threading.Thread:
    """Write each output line of `command` to path, prefixed with the epoch time; every=None: one
    long-lived process (-l 1), else run the command every `every` seconds."""

    def pump() -> None:
        with open(path, "w") as sink:
            sink.write(header)
            if every is None:
                proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
                threading.Thread(target=lambda: (stop.wait(), proc.terminate()), daemon=True).start()
                for line in proc.stdout:
                    sink.write(f"{time.time():.3f}, {line}")
                    sink.flush()
                proc.wait()
                return
            while not stop.is_set():
                stamp = time.time()
                for line in _sh(command).splitlines():
                    if line.strip():
                        sink.write(f"{stamp:.3f}, {line}\n")
                sink.flush()
                stop.wait(every)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def probe_nvml() -> None:
    """What NVML itself says, beside radt: memory v1 vs v2, the compute processes, GPM support."""
    from importlib.metadata import version

    import pynvml

    print(f"nvidia-ml-py {version('nvidia-ml-py')}")
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
        print(f"memory v1: total {v1.total} used {v1.used} free {v1.free}")
        try:
            v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            print(f"memory v2: total {v2.total} reserved {v2.reserved} used {v2.used} free {v2.free}")
        except Exception as exc:
            print(f"memory v2: {exc!r}")
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            print(f"compute process pid {proc.pid} usedGpuMemory {proc.usedGpuMemory}")
        print(f"GPM supported: {pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice}")
        print(f"power limit {pynvml.nvmlDeviceGetEnforcedPowerLimit(handle)} mW, SM clock {pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)} MHz")
    except Exception as exc:
        print(f"NVML probe failed: {exc!r}")
    finally:
        pynvml.nvmlShutdown()


def drive(out: Path, home: Path, sampler_cost: bool, sampler_seconds: float = 60.0) -> int:
    out.mkdir(parents=True, exist_ok=True)
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    print(_sh(["nvidia-smi"]))
    print(_sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm,mig.mode.current,compute_mode", "--format=csv"]))
    print("dcgmi:", shutil.which("dcgmi"), " nv-hostengine:", shutil.which("nv-hostengine"), flush=True)

    outsider = subprocess.Popen([sys.executable, "-c", HOLD_GPU_MEMORY, str(2 << 30)], stdin=subprocess.PIPE)
    stop = threading.Event()
    apps_query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
    loggers = [
        _logger(["nvidia-smi", f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits", "-l", "1"], out / "smi.csv", stop),
        _logger(apps_query, out / "apps.csv", stop, every=2.0, header=f"# outsider {outsider.pid}\n"),
    ]
    time.sleep(8)  # the outsider's CUDA start-up, and a few smi lines before the run
    probe_nvml()
    store = home / "gpu.db"
    env = dict(os.environ, RADT_HOME=str(home), PYTHONUNBUFFERED="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    command = [sys.executable, "-m", "radt", "-e", "gpu-check", "-n", "gpu-check", "-d", "0", "-l", "nvml+host", "--interval", "0.5"]
    command += ["--store", f"sqlite:///{store}", str(Path(__file__).resolve()), "workload"]
    print("$", " ".join(command), flush=True)
    started = time.time()
    rc = subprocess.call(command, env=env, cwd=REPO)
    print(f"radt exited {rc} after {time.time() - started:.1f} s", flush=True)
    outsider.stdin.close()
    outsider.wait(30)
    stop.set()
    for thread in loggers:
        thread.join(10)

    src, dst = sqlite3.connect(store), sqlite3.connect(out / "gpu.db")
    src.backup(dst)
    dst.execute("PRAGMA journal_mode=DELETE")  # one file, no -wal/-shm beside it
    src.close()
    dst.close()
    for name in ("gpu-inventory.json", "radt-sources.json"):
        found = sorted(home.glob(f"runs/*/logs/{name}"))
        if found:
            shutil.copy(found[-1], out / name)
            print(f"--- {name}\n{found[-1].read_text()}")
    if sampler_cost:
        cost = [sys.executable, str(REPO / "bench" / "sampler_cost.py"), "--seconds", f"{sampler_seconds:g}", "--json", str(out / "sampler_cost.json")]
        print("$", " ".join(cost), flush=True)
        subprocess.call(cost, cwd=REPO, env=dict(os.environ, RADT_HOME=str(home)))
    analyse(out)
    return rc


# --------------------------------------------------------------------------- the analysis (no GPU needed)


def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]

    return {"n": len(values), "mean": statistics.fmean(values), "p5": pct(5), "p50": pct(50), "p95": pct(95)}


def _fmt(value: float | None, digits: int) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1e6:
        return f"{value:.3g}"
    return f"{value:.{digits}f}"


def load_run(db: Path) -> tuple[str, dict[str, list[tuple[float, float]]], dict[str, str]]:
    """The newest gpu-check run: (run id, {key: [(seconds, value), ...]}, params)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        run_id = con.execute(
            "SELECT r.run_uuid FROM runs r JOIN experiments e ON r.experiment_id = e.experiment_id WHERE e.name = 'gpu-check' ORDER BY r.start_time DESC LIMIT 1"
        ).fetchone()[0]
        series: dict[str, list[tuple[float, float]]] = {}
        for k, ts, value in con.execute("SELECT key, timestamp, value FROM metrics WHERE run_uuid = ? ORDER BY timestamp, step", (run_id,)):
            series.setdefault(k, []).append((ts / 1000.0, value))
        params = dict(con.execute("SELECT key, value FROM params WHERE run_uuid = ?", (run_id,)).fetchall())
    finally:
        con.close()
    return run_id, series, params


def phase_windows(series: dict) -> list[tuple[str, float, float]]:
    marks = series.get(PHASE_KEY, [])
    windows = []
    for (start, index), (end, _) in zip(marks, marks[1:]):
        name = PHASES[int(index)][0] if int(index) < len(PHASES) else f"phase{int(index)}"
        windows.append((name, start, end))
    return windows


def _in(points, start: float, end: float, trim: bool = True) -> list[float]:
    lo, hi = (start + TRIM_START, end - TRIM_END) if trim and end - start > TRIM_START + TRIM_END + 0.5 else (start, end)
    return [v for t, v in points if lo <= t <= hi]


def read_smi(path: Path) -> list[tuple[float, list[float | None]]]:
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 2:
            continue
        values = []
        for cell in cells[1:]:
            try:
                values.append(float(cell))
            except ValueError:
                values.append(None)
        rows.append((float(cells[0]), values))
    return rows


def analyse(out: Path) -> None:
    run_id, series, params = load_run(out / "gpu.db")
    windows = phase_windows(series)
    print(f"\nrun {run_id}; params: " + ", ".join(f"{k}={v}" for k, v in sorted(params.items()) if k.startswith("gpu_check")))
    keys = sorted(k for k in series if k.startswith("system/"))
    print(f"{len(keys)} system/ keys: " + ", ".join(f"{k.removeprefix('system/')}({len(series[k])})" for k in keys))
    sm = series.get("system/gpu_0_sm_active", [])
    if len(sm) > 2:
        gaps = [b[0] - a[0] for a, b in zip(sm, sm[1:])]
        print(f"SMACT samples: {len(sm)}, interval median {statistics.median(gaps):.3f} s, max {max(gaps):.3f} s")
    for name, start, end in windows:
        print(f"  phase {name:<13} {end - start:6.1f} s")
    for k, v in sorted(series.items()):
        if k.startswith("gpu_check/") and k != PHASE_KEY:
            print(f"  {k} = {', '.join(f'{x:.1f}' for _, x in v)}")

    print("\nradt (NVML/GPM at 0.5 s): mean [p5 p50 p95] per phase, trimmed")
    header = f"{'metric':<14}" + "".join(f"{name:>36}" for name, _, _ in windows)
    print(header)
    for metric, label, digits in GPU_METRICS:
        points = series.get(f"system/gpu_0_{metric}")
        if not points:
            print(f"{label:<14}" + f"{'(missing)':>36}" * len(windows))
            continue
        cells = []
        for _, start, end in windows:
            s = _stats(_in(points, start, end))
            cell = "n=0" if not s["n"] else f"{_fmt(s['mean'], digits)} [{_fmt(s['p5'], digits)} {_fmt(s['p50'], digits)} {_fmt(s['p95'], digits)}]"
            cells.append(f"{cell:>36}")
        print(f"{label:<14}" + "".join(cells))

    smi = read_smi(out / "smi.csv")
    if smi:
        print("\nnvidia-smi -l 1 beside it: mean per phase (memory converted MiB -> MB)")
        names = SMI_QUERY.split(",")
        print(f"{'column':<22}" + "".join(f"{name:>14}" for name, _, _ in windows))
        for col, name in enumerate(names):
            scale = MIB_MB if name.startswith("memory.") else 1.0
            cells = []
            for _, start, end in windows:
                values = [v[col] * scale for t, v in smi if start + TRIM_START <= t <= end - TRIM_END and col < len(v) and v[col] is not None]
                cells.append(f"{_fmt(statistics.fmean(values), 1) if values else '-':>14}")
            print(f"{name:<22}" + "".join(cells))
        print("radt vs nvidia-smi, per phase: util %-points radt - smi; memory MB radt - smi")
        for _, start, end in windows:
            r_util = _in(series.get("system/gpu_0_utilization_percentage", []), start, end)
            r_mem = _in(series.get("system/gpu_0_memory_usage_megabytes", []), start, end)
            s_util = [v[0] for t, v in smi if start + TRIM_START <= t <= end - TRIM_END and v[0] is not None]
            s_mem = [v[2] * MIB_MB for t, v in smi if start + TRIM_START <= t <= end - TRIM_END and v[2] is not None]
            if r_util and s_util and r_mem and s_mem:
                print(
                    f"  {_phase_name(windows, start):<13} util {statistics.fmean(r_util) - statistics.fmean(s_util):+6.1f}   "
                    f"memory {statistics.fmean(r_mem) - statistics.fmean(s_mem):+8.1f} MB"
                )

    apps = out / "apps.csv"
    if apps.exists():
        pids = {params.get("gpu_check.pid"), params.get("gpu_check.child_pid")}
        lines = apps.read_text().splitlines()
        outsider = lines[0].split()[-1] if lines and lines[0].startswith("# outsider") else None
        print(f"\nnvidia-smi compute apps (MiB -> MB), run tree pids {sorted(p for p in pids if p)}, outsider {outsider}")
        rows: list[tuple[float, str, float]] = []
        for line in lines:
            cells = [c.strip() for c in line.split(",")]
            if len(cells) >= 3 and cells[2].replace(".", "", 1).isdigit():
                rows.append((float(cells[0]), cells[1], float(cells[2]) * MIB_MB))
        run_memory = series.get("system/gpu_0_process_memory_megabytes", [])
        for name, start, end in windows:
            tree = {}
            others = {}
            for t, pid, mb in rows:
                if start + TRIM_START <= t <= end - TRIM_END:
                    (tree if pid in pids else others).setdefault(pid, []).append(mb)
            tree_mb = sum(statistics.fmean(v) for v in tree.values())
            other_mb = sum(statistics.fmean(v) for v in others.values())
            radt_mb = _in(run_memory, start, end)
            radt_txt = f"{statistics.fmean(radt_mb):8.0f}" if radt_mb else "       -"
            print(
                f"  {name:<13} radt run memory {radt_txt} MB   smi tree pids {tree_mb:8.0f} MB   smi other pids {other_mb:8.0f} MB ({', '.join(sorted(others))})"
            )

    for name in ("gpu-inventory.json", "radt-sources.json"):
        path = out / name
        if path.exists():
            print(f"{name}: {json.dumps(json.loads(path.read_text()))}")
    cost = out / "sampler_cost.json"
    if cost.exists():
        results = json.loads(cost.read_text())["results"]
        for name, r in results.items():
            if "cpu_s" in r:
                print(f"sampler cost {name:<16} {100 * r['cpu_s'] / r['wall_s']:.3f} % of one core, {1000 * r['cpu_s'] / max(1, r['samples']):.2f} ms/sample")
            else:
                print(f"sampler cost {name:<16} {r.get('unavailable')}")


def _phase_name(windows, start: float) -> str:
    return next(name for name, s, _ in windows if s == start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="the whole check (needs the GPU)")
    run.add_argument("--out", type=Path, required=True, help="folder for gpu.db, smi.csv, apps.csv, the artifacts and sampler_cost.json")
    run.add_argument("--radt-home", type=Path, default=Path("/tmp/radt-gpu-check"), help="RADT_HOME for the run (default /tmp/radt-gpu-check)")
    run.add_argument("--no-sampler-cost", action="store_true", help="skip bench/sampler_cost.py")
    run.add_argument("--sampler-seconds", type=float, default=60.0,
                     help="bench/sampler_cost.py's window (default 60: a 20 s window of 21 samples read 0.82 %% and 1.16 %% for the same code)")  # fmt: skip
    again = sub.add_parser("analyse", help="print the per-phase table from a run's --out folder")
    again.add_argument("out", type=Path)
    sub.add_parser("workload", help="the phases themselves (radt runs this)")
    args = parser.parse_args()
    if args.what == "workload":
        return workload()
    if args.what == "analyse":
        analyse(args.out)
        return 0
    return drive(args.out, args.radt_home, not args.no_sampler_cost, args.sampler_seconds)


if __name__ == "__main__":
    sys.exit(main())
