"""A stand-in for the two exporters Princeton's jobstats runs on every node, with their metric names, label names and
units as their sources write them:

- plazonic/nvidia_gpu_prometheus_exporter (main.go; port 9445): per GPU `nvidia_gpu_duty_cycle` (NVML's utilization
  rate, %), `nvidia_gpu_memory_used_bytes` / `_total_bytes`, `nvidia_gpu_power_usage_milliwatts`,
  `nvidia_gpu_temperature_celsius`, `nvidia_gpu_clock{type}`, `nvidia_gpu_clock_event_reason{reason}`, and on Hopper and
  newer the GPM series (`nvidia_gpu_sm_util_percent`, ..., NVML's percent / 100: a 0-1 ratio, none at a GPU's first
  scrape: GPM needs two samples), labelled `ordinal` (NVML's index), `minor_number`, `uuid`, `name`, `GPU_I_ID`, and
  `jobid`, `userid` from what jobstats' prolog wrote in /run/gpustat (empty while no job has the GPU; exporters before
  September 2025 publish no `jobid` label: `job_labels=False`). A GPU whose power NVML cannot read publishes
  `nvidia_gpu_last_error` only, as the exporter skips the rest.
- plazonic/cgroup_exporter (cgroup_exporter.go; port 9306): per Slurm job on the node `cgroup_cpu_total_seconds` (the
  job's CPU seconds so far), `cgroup_memory_rss_bytes`, ..., labelled `jobid`, `step`, `task` (both "" for the whole
  job; with --collect.fullslurm, as jobstats runs it, each step's besides).

The GPU values are a recorded `dcgmi dmon` log's (real hardware's), one sample per scrape of a node, in the exporter's
units. One HTTP server serves every node's two exporters at /<node>/gpu and /<node>/cgroup; `scraped` points a real
Prometheus at them with each target's `instance` as jobstats' Prometheus set-up has it (`<node>:9445`, `<node>:9306`).
"""

from __future__ import annotations

import signal
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import NamedTuple

from tests.support import prometheus as prom
from tests.support.dcgm_exporter import _Server, load_frames

GPU_PORT, CGROUP_PORT = 9445, 9306  # the exporters' default ports: the `instance` label's port
MODEL = "NVIDIA H100 80GB HBM3"
MEMORY_TOTAL = 85_520_809_984  # bytes, as NVML reports an H100 80GB's
# GPM series (main.go's gpmMetric) -> the `dcgmi dmon` column of the same quantity: both 0-1 (the exporter divides by 100)
GPM_COLUMNS = {
    "nvidia_gpu_graphics_util_percent": "GRACT",
    "nvidia_gpu_sm_util_percent": "SMACT",
    "nvidia_gpu_sm_occupancy_percent": "SMOCC",
    "nvidia_gpu_any_tensor_util_percent": "TENSO",
    "nvidia_gpu_dram_bw_util_percent": "DRAMA",
    "nvidia_gpu_fp64_util_percent": "FP64A",
    "nvidia_gpu_fp32_util_percent": "FP32A",
    "nvidia_gpu_fp16_util_percent": "FP16A",
    "nvidia_gpu_pcie_tx_per_sec": "PCITX",  # bytes/s
    "nvidia_gpu_pcie_rx_per_sec": "PCIRX",
    "nvidia_gpu_nvlink_total_tx_per_sec": "NVLTX",
    "nvidia_gpu_nvlink_total_rx_per_sec": "NVLRX",
}
GPU_LABELS = ("ordinal", "minor_number", "uuid", "name", "GPU_I_ID")
JOB_LABELS = ("jobid", "userid")


class Gpu(NamedTuple):
    """One GPU the NVML exporter publishes on `node`, NVML index `ordinal`, serving the values of GPU `source` in the log."""

    node: str
    ordinal: int
    source: int
    minor: int | None = None  # /dev/nvidia<minor>: the ordinal unless given
    gpm: bool = True  # a Hopper: its GPM series too

    @property
    def uuid(self) -> str:
        return f"GPU-{zlib.crc32(self.node.encode()):08x}-0000-0000-0000-{self.ordinal:012d}"

    @property
    def minor_number(self) -> int:
        return self.ordinal if self.minor is None else self.minor


class CgroupJob(NamedTuple):
    """A Slurm job's cgroup on a node: since when (s), how many cores it keeps busy, its RSS."""

    started_s: float
    cores: float = 1.5
    rss_bytes: float = 3.5e9


class Served(NamedTuple):
    at_ms: int
    frame: int


def _line(name: str, labels: dict[str, str], value: float) -> str:
    """One sample as client_golang writes it: labels sorted by name, an empty value written (Prometheus drops it)."""
    return f"{name}{{{','.join(f'{k}={chr(34)}{v}{chr(34)}' for k, v in sorted(labels.items()))}}} {value!r}"


class JobstatsExporters:
    """Serves each node's NVML and cgroup exporter on 127.0.0.1:<port>/<node>/gpu and /<node>/cgroup."""

    def __init__(self, log: Path, gpus: list[Gpu], start: int = 5, job_labels: bool = True, port: int = 0) -> None:
        self.frames = load_frames(log)
        self.gpus = gpus
        self.start = start
        self.job_labels = job_labels  # False: an exporter from before September 2025 (jobs only in nvidia_gpu_jobId)
        self.jobs: dict[tuple[str, int], tuple[str, str]] = {}  # (node, ordinal) -> (jobid, uid), as the prolog wrote it
        self.cgroups: dict[str, dict[str, CgroupJob]] = {}  # node -> jobid -> its cgroup
        self.served: dict[str, list[Served]] = {}  # node -> its GPU exporter's scrapes
        self._lock = threading.Lock()
        exporters = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                _, node, kind = (self.path.split("/") + ["", "", ""])[:3]
                if kind not in ("gpu", "cgroup") or node not in exporters.nodes:
                    self.send_error(404)
                    return
                body = (exporters._gpu_scrape(node) if kind == "gpu" else exporters.cgroup_text(node, time.time())).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = _Server(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="test-jobstats-exporters", daemon=True)

    @property
    def nodes(self) -> list[str]:
        return list(dict.fromkeys(g.node for g in self.gpus))

    def __enter__(self) -> JobstatsExporters:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def start_job(self, node: str, ordinals, job: str, uid: str = "0", cores: float = 1.5) -> None:
        """What jobstats' prolog does at a job's start: its GPUs' /run/gpustat files (the exporter's jobid), its cgroup."""
        with self._lock:
            for ordinal in ordinals:
                self.jobs[(node, ordinal)] = (job, uid)
            self.cgroups.setdefault(node, {})[job] = CgroupJob(time.time(), cores)

    def end_job(self, job: str) -> None:
        """The epilog: the job's GPUs carry no job, its cgroup is gone."""
        with self._lock:
            self.jobs = {k: v for k, v in self.jobs.items() if v[0] != job}
            for jobs in self.cgroups.values():
                jobs.pop(job, None)

    def _gpu_scrape(self, node: str) -> str:
        with self._lock:
            served = self.served.setdefault(node, [])
            frame = (self.start + len(served)) % len(self.frames)
            first = not served
            served.append(Served(int(time.time() * 1000), frame))
            jobs = dict(self.jobs)
        return self.gpu_text(node, frame, jobs, gpm=not first)

    def value(self, gpu: Gpu, column: str, frame: int) -> float | None:
        return self.frames[frame].get(gpu.source, {}).get(column)

    def gpu_text(self, node: str, frame: int, jobs: dict[tuple[str, int], tuple[str, str]], gpm: bool = True) -> str:
        """The NVML exporter's /metrics for `node` at log sample `frame` (GPM series only from a GPU's second scrape on)."""
        samples: dict[str, list[str]] = {}
        mine = [g for g in self.gpus if g.node == node]
        samples["nvidia_gpu_num_devices"] = [f"nvidia_gpu_num_devices {float(len(mine))!r}"]
        for gpu in mine:
            ids = {"ordinal": str(gpu.ordinal), "minor_number": str(gpu.minor_number), "uuid": gpu.uuid, "name": MODEL, "GPU_I_ID": ""}
            power = self.value(gpu, "POWER", frame)
            if power is None:  # main.go: PowerUsage() failed -> lastError, and `continue`: nothing else of this GPU
                samples.setdefault("nvidia_gpu_last_error", []).append(_line("nvidia_gpu_last_error", ids, 999.0))
                continue
            job, uid = jobs.get((node, gpu.ordinal), ("", ""))
            labels = ids | ({"jobid": job, "userid": uid} if self.job_labels else {})
            for name, value in self._gpu_values(gpu, frame, power).items():
                samples.setdefault(name, []).append(_line(name, labels, value))
            samples.setdefault("nvidia_gpu_clock", []).append(_line("nvidia_gpu_clock", labels | {"type": "sm"}, 1980.0))
            reason = _line("nvidia_gpu_clock_event_reason", labels | {"reason": "none"}, 0.0)
            samples.setdefault("nvidia_gpu_clock_event_reason", []).append(reason)
            if job:  # nvidia_gpu_jobId / jobUid: the old way to tell a GPU's job, still published
                samples.setdefault("nvidia_gpu_jobId", []).append(_line("nvidia_gpu_jobId", labels, float(job)))
                samples.setdefault("nvidia_gpu_jobUid", []).append(_line("nvidia_gpu_jobUid", labels, float(uid or 0)))
            if gpu.gpm and gpm:
                for name, column in GPM_COLUMNS.items():
                    value = self.value(gpu, column, frame)
                    if value is not None:
                        samples.setdefault(name, []).append(_line(name, labels, value))
        lines = []
        for name, rows in samples.items():
            lines += [f"# HELP {name} {name}.", f"# TYPE {name} gauge", *rows]
        return "\n".join(lines) + "\n"

    def _gpu_values(self, gpu: Gpu, frame: int, power_w: float) -> dict[str, float]:
        """A GPU's NVML readings in the exporter's units: utilization %, bytes, milliwatts (NVML's integer), °C."""
        util = self.value(gpu, "GPUTL", frame) or 0.0
        return {
            "nvidia_gpu_memory_used_bytes": float((2_000 + 613 * (frame % 40)) * 1024 * 1024),
            "nvidia_gpu_memory_total_bytes": float(MEMORY_TOTAL),
            "nvidia_gpu_duty_cycle": float(util),
            "nvidia_gpu_power_usage_milliwatts": float(round(power_w * 1000)),
            "nvidia_gpu_temperature_celsius": float(30 + int(power_w) // 4),
        }

    def cgroup_text(self, node: str, now_s: float) -> str:
        """The cgroup exporter's /metrics for `node`: each job's cgroup, the whole job's (step="", task="") and its batch step's."""
        samples: dict[str, list[str]] = {}
        with self._lock:
            jobs = dict(self.cgroups.get(node, {}))
        for job, cgroup in jobs.items():
            elapsed = max(now_s - cgroup.started_s, 0.0)
            samples.setdefault("cgroup_uid", []).append(_line("cgroup_uid", {"jobid": job}, 0.0))
            for step, share in (("", 1.0), ("batch", 0.9)):
                labels = {"jobid": job, "step": step, "task": ""}
                values = {
                    "cgroup_cpu_user_seconds": cgroup.cores * elapsed * share * 0.8,
                    "cgroup_cpu_system_seconds": cgroup.cores * elapsed * share * 0.2,
                    "cgroup_cpu_total_seconds": cgroup.cores * elapsed * share,
                    "cgroup_cpus": 4.0,
                    "cgroup_memory_rss_bytes": cgroup.rss_bytes * share + 1e6 * (int(elapsed * 10) % 50),
                    "cgroup_memory_cache_bytes": 2.5e8,
                    "cgroup_memory_used_bytes": cgroup.rss_bytes * share + 2.5e8,
                    "cgroup_memory_total_bytes": 1.6e10,
                    "cgroup_memory_fail_count": 0.0,
                }
                for name, value in values.items():
                    samples.setdefault(name, []).append(_line(name, labels, value))
        lines = []
        for name, rows in samples.items():
            lines += [f"# HELP {name} {name}.", f"# TYPE {name} gauge", *rows]
        return "\n".join(lines) + "\n"


def _config(exporters: JobstatsExporters) -> str:
    """Prometheus' configuration as jobstats' documentation sets it up (one job for the GPU nodes' exporters), every
    node's exporters behind the stand-in's one port, each target's `instance` the node's <name>:<exporter's port>."""
    targets = "".join(
        f"      - targets: ['127.0.0.1:{exporters.port}']\n"
        f"        labels: {{instance: '{node}:{port}', __metrics_path__: '/{node}/{kind}', cluster: 'radtacct'}}\n"
        for node in exporters.nodes
        for kind, port in (("gpu", GPU_PORT), ("cgroup", CGROUP_PORT))
    )
    return (
        f"global:\n  scrape_interval: {prom.SCRAPE_MS}ms\n  scrape_timeout: {prom.SCRAPE_MS}ms\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: 'Jobstats GPU Nodes'\n    static_configs:\n{targets}"
    )


@contextmanager
def scraped(log: Path, gpus: list[Gpu], scrapes: int = 3, job_labels: bool = True, timeout: float = 40) -> Iterator[tuple[JobstatsExporters, prom.Prometheus]]:
    """(exporters, Prometheus): the stand-in scraped by a real Prometheus as jobstats configures one, once each node's
    duty cycle holds `scrapes` samples."""
    with prom.taken() as server, JobstatsExporters(log, gpus, job_labels=job_labels, port=server.ports[0]) as exporters:
        (server.folder / "prometheus.yml").write_text(_config(exporters))
        assert server.proc is not None
        server.proc.send_signal(signal.SIGHUP)  # Prometheus reloads its configuration: the jobstats targets replace the warm ones
        for node in exporters.nodes:
            server.wait_samples(f'nvidia_gpu_duty_cycle{{instance="{node}:{GPU_PORT}"}}[1h]', scrapes, timeout=timeout)
        yield exporters, server
