"""CPU cost of sampling at 1 Hz: radt's default sources vs radT's `top`/`nvidia-smi` listeners vs MLflow's monitor.

Every contender runs in its own worker process, all at the same time (so they share the same
noise), for --seconds seconds, sampling every --interval seconds while a busy "training" process
(one spinning process with a few idle children, like data-loader workers) runs beside them.
Each worker measures its own CPU time over the window with `time.process_time()` (all its
threads); the subprocess listeners also add their tool's CPU time (`top`, `nvidia-smi`) read
with psutil. The table gives CPU per sample and the average share of one core; the ratio lines
divide each baseline by radt's figure (a ratio of 10 means radt costs a tenth of the baseline).

Contenders:
  radt             radt's default listeners (nvml+host) in a `Sampler` thread; the host source
                   follows the busy process tree (`ProcessTree`, as the runner does). NVML is
                   reported unavailable on a machine without an NVIDIA driver and skipped.
  radt+writer      the same, plus radt's `MetricWriter` writing every second through
                   `SqlMetricStore` into a scratch SQLite store: radt's whole in-process cost.
  radT top -i      radT's `top` listener: `top -i -b -d 1` piped into a line-by-line Python parser
                   (summing the %CPU/%MEM of `python` processes, reading the memory lines).
  radT top         the same with `top -b -d 1` (every process listed, not only the busy ones).
  radT smi         `nvidia-smi --query-gpu=... --format=csv -l 1` parsed line by line (only where
                   nvidia-smi exists; reported as unavailable otherwise).
  mlflow collect   MLflow's system-metrics monitors (CPU, disk, network, GPU where NVML loads),
                   `collect_metrics()` + `aggregate_metrics()` every tick, nothing logged.
  mlflow monitor   MLflow's `SystemMetricsMonitor` thread itself, 1 s interval, logging into a
                   scratch SQLite store (it also reads the run back every tick).

Run:  .venv/bin/python bench/sampler_cost.py            (60 s)
      .venv/bin/python bench/sampler_cost.py --quick    (8 s smoke run)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CONTENDERS = ["radt", "radt+writer", "radT top -i", "radT top", "radT smi", "mlflow collect", "mlflow monitor"]

BUSY_CODE = """
import os, subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10**6)"]) for _ in range(int(sys.argv[1]))]
end = time.monotonic() + float(sys.argv[2])
x = 0
try:
    while time.monotonic() < end:
        for i in range(10000):
            x += i * i
finally:
    for k in kids:
        k.kill()
"""


# --------------------------------------------------------------------------- workers


def _window(seconds: float, sample_once, interval: float) -> tuple[float, float, int]:
    """Call sample_once every interval seconds for `seconds`; returns (cpu s, wall s, samples)."""
    halt = threading.Event()
    cpu0, wall0 = time.process_time(), time.monotonic()
    deadline = wall0
    samples = 0
    while True:
        sample_once()
        samples += 1
        deadline += interval
        if deadline - wall0 >= seconds:
            break
        halt.wait(max(0.0, deadline - time.monotonic()))
    return time.process_time() - cpu0, time.monotonic() - wall0, samples


def _scratch_sqlite(tmp: Path):
    """A fresh MLflow SQLite store with one experiment and one run; returns (uri, run_id)."""
    import mlflow
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    SqlAlchemyStore(uri, (tmp / "artifacts").as_uri()).engine.dispose()
    client = mlflow.MlflowClient(uri)
    run = client.create_run("0")
    return uri, run.info.run_id


def worker_radt(args, with_writer: bool) -> dict:
    from radt.collectors.process.proctree import ProcessTree
    from radt.collectors.run.sampler import Sampler, open_sources
    from radt.collectors.sources.base import SamplingContext
    from radt.collectors.sources.listeners import make_source

    notes: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="radt-bench-"))
    writer = None
    counted = [0]
    if with_writer:
        from radt.collectors.store.stores import SqlMetricStore
        from radt.collectors.store.writer import MetricWriter

        uri, run_id = _scratch_sqlite(tmp)
        writer = MetricWriter(SqlMetricStore(uri), run_id, tmp / "spool.jsonl", report=notes.append).start()

        def sink(points):
            counted[0] += len(points)
            writer.put(points)
    else:

        def sink(points):
            counted[0] += len(points)

    tree = ProcessTree(args.pid)
    ctx = SamplingContext(interval=args.interval, devices=None, pids=tree.processes)
    sources = open_sources([make_source(n) for n in ("nvml", "host")], ctx, notes.append)
    sampler = Sampler(sources, args.interval, sink, report=notes.append)
    cpu0, wall0 = time.process_time(), time.monotonic()
    sampler.start()
    time.sleep(args.seconds)
    sampler.stop()
    if writer is not None:
        writer.close(10)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    shutil.rmtree(tmp, ignore_errors=True)
    written = f", {writer.written} written" if writer is not None else ""
    notes.append(f"sources: {'+'.join(s.name for s in sources)}; {counted[0]} points{written}")
    return {"cpu_s": cpu, "wall_s": wall, "samples": sampler.step, "notes": notes}


def _parse_top(stream, state: dict) -> None:
    """radT's way of reading `top -b`: each line in Python, summing the `python` processes per frame."""
    frame_cpu = frame_mem = 0.0
    for line in stream:
        line = line.lstrip()
        if not line:
            continue
        if line.startswith("top -"):
            state["frames"] += 1
            state["last"] = {"TOP - CPU Utilization": frame_cpu, "TOP - Memory Utilization": frame_mem}
            frame_cpu = frame_mem = 0.0
            continue
        if line.startswith(("Tasks", "%Cpu", "PID")):
            continue
        words = line.split()
        if line.startswith(("KiB", "MiB", "GiB")):
            if len(words) > 7 and words[1] == "Mem":
                state["mem_used"] = float(words[7])
            elif len(words) > 6 and words[1] == "Swap:":
                state["swap_used"] = float(words[6])
            continue
        if len(words) >= 12 and words[11].startswith("python"):
            try:
                frame_cpu += float(words[8])
                frame_mem += float(words[9])
            except ValueError:
                pass


def _parse_smi(stream, state: dict) -> None:
    for line in stream:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 2 or not cells[0][:1].isdigit():
            continue
        state["frames"] += 1
        state["last"] = {f"SMI - col{i}": float(c) for i, c in enumerate(cells[1:]) if c.replace(".", "", 1).isdigit()}


def worker_tool(args, command: list[str], parser) -> dict:
    import psutil

    if shutil.which(command[0]) is None:
        return {"unavailable": f"{command[0]} not found on this machine"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
    state = {"frames": 0, "last": {}}
    reader = threading.Thread(target=parser, args=(proc.stdout, state), daemon=True)
    reader.start()
    tool = psutil.Process(proc.pid)
    first = time.monotonic() + 5
    while state["frames"] == 0 and time.monotonic() < first:  # skip the tool's start-up
        time.sleep(0.05)
    if state["frames"] == 0:
        proc.kill()
        return {"unavailable": f"{' '.join(command[:2])} printed nothing in 5 s"}
    frames0 = state["frames"]
    t0 = tool.cpu_times()
    cpu0, wall0 = time.process_time(), time.monotonic()
    time.sleep(args.seconds)
    t1 = tool.cpu_times()
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    proc.kill()
    proc.wait()
    tool_cpu = (t1.user - t0.user) + (t1.system - t0.system)
    parser_cpu = cpu
    return {
        "cpu_s": tool_cpu + parser_cpu,
        "wall_s": wall,
        "samples": state["frames"] - frames0,
        "notes": [f"tool {tool_cpu:.3f} s + parser {parser_cpu:.3f} s"],
    }


def worker_mlflow_collect(args) -> dict:
    from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
    from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
    from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitors = [CPUMonitor(), DiskMonitor(), NetworkMonitor()]
    gpu = SystemMetricsMonitor._initialize_gpu_monitor(None)
    notes = ["GPU monitor: " + ("yes" if gpu else "unavailable (no NVML)")]
    if gpu:
        monitors.append(gpu)

    def tick():
        for m in monitors:
            m.collect_metrics()
        for m in monitors:
            m.aggregate_metrics()
            m.clear_metrics()

    cpu, wall, samples = _window(args.seconds, tick, args.interval)
    return {"cpu_s": cpu, "wall_s": wall, "samples": samples, "notes": notes}


def worker_mlflow_monitor(args) -> dict:
    import logging

    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    logging.getLogger("mlflow").setLevel(logging.ERROR)
    tmp = Path(tempfile.mkdtemp(prefix="radt-bench-"))
    uri, run_id = _scratch_sqlite(tmp)
    monitor = SystemMetricsMonitor(run_id, sampling_interval=args.interval, samples_before_logging=1, tracking_uri=uri)
    calls = [0]
    collect = monitor.collect_metrics

    def counted():
        calls[0] += 1
        return collect()

    monitor.collect_metrics = counted
    cpu0, wall0 = time.process_time(), time.monotonic()
    monitor.start()
    time.sleep(args.seconds)
    monitor.finish()
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    shutil.rmtree(tmp, ignore_errors=True)
    return {"cpu_s": cpu, "wall_s": wall, "samples": calls[0], "notes": ["logs through BatchMetricsLogger, get_run every tick"]}


def run_worker(args) -> dict:
    name = args.worker
    if name == "radt":
        return worker_radt(args, with_writer=False)
    if name == "radt+writer":
        return worker_radt(args, with_writer=True)
    if name == "radT top -i":
        return worker_tool(args, ["top", "-i", "-b", "-d", str(args.interval)], _parse_top)
    if name == "radT top":
        return worker_tool(args, ["top", "-b", "-d", str(args.interval)], _parse_top)
    if name == "radT smi":
        query = "timestamp,index,utilization.gpu,utilization.memory,memory.used,power.draw,temperature.gpu,clocks.sm"
        ms = str(max(1, int(args.interval * 1000)))
        return worker_tool(args, ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-lms", ms], _parse_smi)
    if name == "mlflow collect":
        return worker_mlflow_collect(args)
    if name == "mlflow monitor":
        return worker_mlflow_monitor(args)
    raise SystemExit(f"unknown worker {name}")


# --------------------------------------------------------------------------- breakdown


def breakdown(pid: int, rounds: int) -> list[tuple[str, float]]:
    """CPU ms per call of each piece of radt's tick, in a tight loop (the tree refreshed every call)."""
    from radt.collectors.process.proctree import ProcessTree
    from radt.collectors.sources.base import SamplingContext
    from radt.collectors.sources.host import HostSource

    tree = ProcessTree(pid)
    host = HostSource()
    host.open(SamplingContext(pids=lambda: list(tree._current)))
    tree.processes()

    def measure(fn) -> float:
        fn()
        t0 = time.thread_time()
        for _ in range(rounds):
            fn()
        return (time.thread_time() - t0) / rounds * 1000

    def refresh():
        tree._stamp = 0.0
        tree.processes()

    import psutil

    procs = list(tree._current)

    def per_process():
        for proc in procs:
            with proc.oneshot():
                proc.cpu_percent(None)
                proc.memory_info()

    full = HostSource()
    full.open(SamplingContext(pids=tree.processes))

    def tick():
        tree._stamp = 0.0  # at 1 Hz every tick refreshes the tree (max_age 0.5 s)
        full.sample()

    rows = [
        ("radt tick at 1 Hz: tree refresh + HostSource", measure(tick)),
        (f"ProcessTree refresh, {len(procs)} procs in tree", measure(refresh)),
        (f"  of which psutil ppid_map() over {len(psutil.pids())} pids", measure(psutil._pslinux.ppid_map) if sys.platform == "linux" else float("nan")),
        ("HostSource.sample() (tree cached)", measure(host.sample)),
        ("  of which psutil.cpu_percent()", measure(lambda: psutil.cpu_percent(None))),
        ("  of which psutil.virtual_memory()", measure(psutil.virtual_memory)),
        ("  of which psutil.swap_memory()", measure(psutil.swap_memory)),
        ("  of which psutil.disk_io_counters()", measure(psutil.disk_io_counters)),
        ("  of which psutil.net_io_counters()", measure(psutil.net_io_counters)),
        (f"  of which per-process cpu+rss x{len(procs)}", measure(per_process)),
    ]
    return rows + nvml_breakdown(tree, measure)


def nvml_breakdown(tree, measure) -> list[tuple[str, float]]:
    """CPU ms per call of NvmlSource.sample() and of each NVML call in it, on GPU 0; none without a driver."""
    import pynvml

    from radt.collectors.sources.base import SamplingContext
    from radt.collectors.sources.nvml import NvmlSource

    source = NvmlSource()
    try:
        source.open(SamplingContext(pids=tree.processes))
    except Exception as exc:  # no driver, no GPU: the host rows stand alone
        return [(f"NvmlSource unavailable ({str(exc)[:60]})", float("nan"))]
    try:
        if not source.handles:
            return [("NvmlSource: no GPU", float("nan"))]
        gpu, handle = next(iter(source.handles.items()))
        rows = [(f"NvmlSource.sample(), {len(source.handles)} GPU(s), GPM {bool(source.gpm.get(gpu))}", measure(source.sample))]
        calls = [
            ("nvmlDeviceGetUtilizationRates", lambda: pynvml.nvmlDeviceGetUtilizationRates(handle)),
            ("nvmlDeviceGetMemoryInfo v2", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle, pynvml.nvmlMemory_v2)),
            ("nvmlDeviceGetPowerUsage", lambda: pynvml.nvmlDeviceGetPowerUsage(handle)),
            ("nvmlDeviceGetEnforcedPowerLimit", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle)),
            ("nvmlDeviceGetTotalEnergyConsumption", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)),
            ("nvmlDeviceGetTemperature", lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
            ("nvmlDeviceGetClockInfo (SM)", lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
            ("nvmlDeviceGetPerformanceState", lambda: pynvml.nvmlDeviceGetPerformanceState(handle)),
            ("nvmlDeviceGetComputeRunningProcesses", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle)),
        ]
        if source.gpm.get(gpu):
            calls.append(("GPM sample alloc + get + free", lambda: _gpm_round(pynvml, handle)))
        for name, call in calls:
            try:
                rows.append((f"  of which {name}", measure(call)))
            except pynvml.NVMLError as exc:
                rows.append((f"  of which {name} ({exc})", float("nan")))
        return rows
    finally:
        source.close()


def _gpm_round(pynvml, handle) -> None:
    sample = pynvml.nvmlGpmSampleAlloc()
    try:
        pynvml.nvmlGpmSampleGet(handle, sample)
    finally:
        pynvml.nvmlGpmSampleFree(sample)


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="measurement window per contender (default 60)")
    parser.add_argument("--interval", type=float, default=1.0, help="sampling interval in seconds (default 1)")
    parser.add_argument("--busy-children", type=int, default=4, help="idle children of the busy process (default 4)")
    parser.add_argument("--extra-procs", type=int, default=0, help="idle `sleep` processes outside the tree, to mimic a busy node (default 0)")
    parser.add_argument("--only", help="comma-separated subset of contenders")
    parser.add_argument("--quick", action="store_true", help="8 s smoke run")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.seconds = min(args.seconds, 8.0)

    if args.worker:
        print(json.dumps(run_worker(args)))
        return 0

    import psutil

    names = [n.strip() for n in args.only.split(",")] if args.only else CONTENDERS
    busy_seconds = args.seconds + 60
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "start_new_session": True}
    busy = subprocess.Popen([sys.executable, "-c", BUSY_CODE, str(args.busy_children), str(busy_seconds)], **quiet)
    extra = [subprocess.Popen(["sleep", str(int(busy_seconds))], **quiet) for _ in range(args.extra_procs)]
    try:
        time.sleep(1.0)
        print(
            f"sampler cost at {1 / args.interval:g} Hz over {args.seconds:g} s, all contenders at once, beside a busy process tree "
            f"(pid {busy.pid}, 1 spinning + {args.busy_children} idle children), {len(psutil.pids())} processes on the host; "
            f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        workers = {}
        for name in names:
            cmd = [sys.executable, __file__, "--worker", name, "--pid", str(busy.pid), "--seconds", str(args.seconds), "--interval", str(args.interval)]
            workers[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        results = {}
        for name, proc in workers.items():
            out, err = proc.communicate(timeout=args.seconds + 180)
            try:
                results[name] = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                results[name] = {"unavailable": f"worker failed (rc {proc.returncode}): {err.strip()[-300:]}"}
        parts = breakdown(busy.pid, 50 if args.quick else 300)
    finally:
        os.killpg(busy.pid, signal.SIGKILL)  # the busy process and its idle children (own session)
        busy.wait()
        for proc in extra:
            proc.kill()
            proc.wait()

    print()
    print(f"{'contender':<16} {'samples':>7} {'CPU s':>8} {'ms/sample':>10} {'% of 1 core':>12}  notes")
    print("-" * 100)
    for name in names:
        r = results[name]
        if "unavailable" in r:
            print(f"{name:<16} {'-':>7} {'-':>8} {'-':>10} {'-':>12}  unavailable: {r['unavailable']}")
            continue
        r["ms_per_sample"] = 1000 * r["cpu_s"] / max(1, r["samples"])
        r["core_pct"] = 100 * r["cpu_s"] / r["wall_s"]
        print(f"{name:<16} {r['samples']:>7} {r['cpu_s']:>8.3f} {r['ms_per_sample']:>10.2f} {r['core_pct']:>11.3f}%  {'; '.join(r.get('notes', []))}")
    print()
    print("breakdown of radt's tick (tight loop, CPU ms per call):")
    for label, ms in parts:
        print(f"  {label:<48} {ms:7.3f} ms")
    print()
    base = results.get("radt", {})
    if "core_pct" in base:
        target = "MET" if base["core_pct"] < 1.0 else "NOT MET"
        print(f"target: radt < 1 % of one core at 1 Hz -> {base['core_pct']:.3f} % ({target})")
        for name in names:
            r = results[name]
            if name != "radt" and "core_pct" in r and base["core_pct"] > 0:
                print(f"RATIO {name} / radt = {r['core_pct'] / base['core_pct']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results, "breakdown": parts}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
