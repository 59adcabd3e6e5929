"""A small stand-in for NVIDIA's dcgm-exporter: its metric and label names, real hardware's values.

Each scrape of /metrics serves the next sample of a recorded `dcgmi dmon` log (one log sample per
scrape, so one per second at a 1 s scrape interval), parsed with radt's own parser, and remembers
when it served which sample, so a test can say what Prometheus must hold at each scrape's time.

A device shared by pods (`Device.pods`) is served as dcgm-exporter's --kubernetes-virtual-gpus mode does
(internal/pkg/transformation/kubernetes.go, process_metrics.go): GPU_UTIL and FB_USED as the device's series plus one
series per pod with the pod's own value (its processes' smUtil summed; their memory in MiB), every other metric as one
copy per pod with the device's value and no series of the device's own.
"""

from __future__ import annotations

import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple

from radt.collectors.sources.parsers import parse_dcgmi_dmon

# dcgm-exporter's metric name -> the `dcgmi dmon` column of the same DCGM field (etc/default-counters.csv).
COLUMNS = {
    "DCGM_FI_PROF_SM_ACTIVE": "SMACT",
    "DCGM_FI_PROF_SM_OCCUPANCY": "SMOCC",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "GRACT",
    "DCGM_FI_PROF_DRAM_ACTIVE": "DRAMA",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "TENSO",
    "DCGM_FI_DEV_POWER_USAGE": "POWER",
    "DCGM_FI_DEV_FB_USED": "FBUSD",
    "DCGM_FI_DEV_GPU_UTIL": "GPUTL",
}


PER_PROCESS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED")  # dcgm-exporter's isPerProcessMetric


class Pod(NamedTuple):
    """A pod using a time-sliced GPU: its names as the exporter labels them, and its own share of the GPU's utilization and
    memory (a fraction of the device's value, whole numbers as NVML's per-process samples are)."""

    name: str
    share: float
    namespace: str = "default"
    container: str = "train"
    uid: str = ""

    def labels(self, old: bool) -> dict[str, str]:
        """pod, namespace, container (--use-old-namespace: pod_name, pod_namespace, container_name), then pod_uid."""
        names = ("pod_name", "pod_namespace", "container_name") if old else ("pod", "namespace", "container")
        return dict(zip(names, (self.name, self.namespace, self.container), strict=True)) | {"pod_uid": self.uid or f"uid-{self.name}"}


class Device(NamedTuple):
    """One entity the exporter publishes: a GPU (gi None) or a MIG slice of it, on host `hostname`; its values are
    those of GPU `source` in the log."""

    hostname: str
    gpu: int
    source: int
    gi: int | None = None
    profile: str = "1g.10gb"
    labels: tuple[tuple[str, str], ...] = ()  # served after the others, as dcgm-exporter appends its job and pod labels
    gpu_uuid: str | None = None  # the GPU's UUID (a slice's series carry its GPU's); default derived from host and index
    memory_mib: int | None = None  # the GPU's memory as its driver reports it: served as DCGM_FI_DEV_FB_FREE (what FB_USED leaves)
    used_mib: int | None = None  # where the log has no FBUSD column: DCGM_FI_DEV_FB_USED served as this plus the sample's number
    pods: tuple[Pod, ...] = ()  # pods sharing it (time-slicing): served per pod as dcgm-exporter's virtual-GPU mode does

    @property
    def uuid(self) -> str:
        return self.gpu_uuid or f"GPU-{zlib.crc32(self.hostname.encode()):08x}-0000-0000-0000-{self.gpu:012d}"


def load_frames(log: Path) -> list[dict[int, dict[str, float | None]]]:
    """Each sample of the log: {GPU index: {column: value}}."""
    frames: list[dict[int, dict[str, float | None]]] = []
    for row in parse_dcgmi_dmon(log.read_text().splitlines()):
        if row.gpu is None:
            continue
        while len(frames) <= row.sample:
            frames.append({})
        frames[row.sample][row.gpu] = row.values
    return [frame for frame in frames if frame]


class Served(NamedTuple):
    at_ms: int  # when the scrape arrived
    frame: int


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """A scrape Prometheus gave up on (its 1 s timeout on a loaded machine) is no error of the exporter's: no traceback
        on the test's stderr, where assertions read radt's own lines."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class DcgmExporter:
    """Serves `devices` on 127.0.0.1:<port>/metrics, one log sample per scrape from `start` on, cycling at the log's end."""

    def __init__(
        self, log: Path, devices: list[Device], start: int = 0, delay_s: float = 0.0, lower_case: bool = False, port: int = 0, old_pod_labels: bool = False
    ) -> None:
        self.frames = load_frames(log)
        self.lower_case = lower_case  # newer exporters' label names: `hostname` (not `Hostname`) and `pci_bus_id`
        self.old_pod_labels = old_pod_labels  # --use-old-namespace: pod_name, pod_namespace, container_name
        self.start = start  # the log sample the first scrape gets
        self.delay_s = delay_s  # a slow exporter: Prometheus stamps the scrape at its start, stores it this much later
        self.devices = devices
        self.served: list[Served] = []
        self._lock = threading.Lock()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                body = exporter._scrape().encode()
                time.sleep(exporter.delay_s)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = _Server(("127.0.0.1", port), Handler)  # a port a warm Prometheus already scrapes (support/prometheus.taken)
        self.port = self.server.server_address[1]
        self.target = f"127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="test-dcgm-exporter", daemon=True)

    def __enter__(self) -> DcgmExporter:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _scrape(self) -> str:
        with self._lock:
            frame = (self.start + len(self.served)) % len(self.frames)
            self.served.append(Served(int(time.time() * 1000), frame))
        return self.text(frame)

    def value(self, device: Device, metric: str, frame: int) -> float | None:
        """What sample `frame` says for `device`'s `metric` (None: N/A, not served, as dcgm-exporter skips blank fields)."""
        value = self.frames[frame].get(device.source, {}).get(COLUMNS[metric])
        if value is None and metric == "DCGM_FI_DEV_FB_USED" and device.used_mib is not None:
            return float(device.used_mib + frame)
        return value

    def pod_value(self, device: Device, pod: Pod, metric: str, frame: int) -> float | None:
        """Pod `pod`'s own value of a per-process metric (PER_PROCESS) at sample `frame`: its share of the device's, whole."""
        value = self.value(device, metric, frame)
        return None if value is None else float(int(value * pod.share))

    def _series(self, device: Device, metric: str, frame: int) -> list[str]:
        """One device's lines of `metric`: its own; with pods, per pod as the virtual-GPU mode writes them."""
        value = self.value(device, metric, frame)
        if value is None:
            return []
        if not device.pods:
            return [f"{metric}{{{self._labels(device)}}} {value!r}"]
        if metric in PER_PROCESS:
            own = [f"{metric}{{{self._labels(device, pod)}}} {self.pod_value(device, pod, metric, frame)!r}" for pod in device.pods]
            return [f"{metric}{{{self._labels(device)}}} {value!r}", *own]
        return [f"{metric}{{{self._labels(device, pod)}}} {value!r}" for pod in device.pods]

    def text(self, frame: int) -> str:
        """Prometheus' text exposition format, as dcgm-exporter writes it."""
        lines = []
        for metric in COLUMNS:
            lines += [f"# HELP {metric} {metric}.", f"# TYPE {metric} gauge"]
            for device in self.devices:
                lines += self._series(device, metric, frame)
        sized = [d for d in self.devices if d.memory_mib is not None and d.gi is None]
        if sized:
            lines += ["# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).", "# TYPE DCGM_FI_DEV_FB_FREE gauge"]
            for device in sized:
                free = float(device.memory_mib - (self.value(device, "DCGM_FI_DEV_FB_USED", frame) or 0.0))
                lines.append(f"DCGM_FI_DEV_FB_FREE{{{self._labels(device)}}} {free!r}")
        return "\n".join(lines) + "\n"

    def _labels(self, device: Device, pod: Pod | None = None) -> str:
        """A device's labels as dcgm-exporter writes them, its job's (or pod's) last; `pod`: that pod's series of it."""
        labels = {"gpu": str(device.gpu), "UUID": device.uuid, "device": f"nvidia{device.gpu}", "modelName": "NVIDIA A100-SXM4-40GB"}
        if device.gi is not None:
            labels |= {"GPU_I_PROFILE": device.profile, "GPU_I_ID": str(device.gi)}
        if self.lower_case:
            labels["pci_bus_id"] = f"00000000:{device.gpu + 7:02X}:00.0"
        labels["hostname" if self.lower_case else "Hostname"] = device.hostname
        labels |= dict(device.labels)
        if pod is not None:
            labels |= pod.labels(self.old_pod_labels)
        return ",".join(f'{k}="{v}"' for k, v in labels.items())

    def frame_at(self, timestamp_ms: int, slack_ms: int = 500) -> int | None:
        """The sample served by the scrape Prometheus stamped `timestamp_ms` (it stamps a scrape when it starts it)."""
        with self._lock:
            after = [s for s in self.served if 0 <= s.at_ms - timestamp_ms <= slack_ms]
        return after[0].frame if after else None
