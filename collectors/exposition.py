"""`radt monitor --prometheus-port`: radt's latest samples in Prometheus' text format at /metrics.

One gauge per catalogue metric, labelled with the GPU (index, UUID, MIG slice), the host, the
monitor's own run and the training run(s) RUNNING on that GPU of this host (run_id, run_name,
experiment, workload; "" when none), so a cluster's Grafana can show which run uses which GPU.
The GPU -> run mapping comes from the store's radt.gpus tags, refreshed every REFRESH seconds,
never per scrape. Samples carry their own timestamps, so Prometheus holds the values radt wrote.
"""

from __future__ import annotations

import errno
import math
import sys
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple

import sqlalchemy as sa

from radt import catalogue
from radt import mlflowdb as db
from radt.collectors.command import UsageError, first_line
from radt.collectors.sqltracking import SqlTracking
from radt.collectors.tracking import find_runs
from radt.points import Point
from radt.runmodel import DEVICES_TAG, HOST_TAG, MONITOR_TAG, ROLE_TAG, RUN_ROLE, WORKLOAD_TAG, gpu_entries, node_statuses, node_tag

REFRESH = 10.0  # seconds between looks in the store for the training runs on this host's GPUs
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Training(NamedTuple):
    """A RUNNING training run of this host and the GPUs its radt.gpus (else radt.devices) tag names."""

    run_id: str
    run_name: str
    experiment: str
    workload: str
    entries: list[dict]  # radt.gpus entries: {"series", "index", "uuid", "gpu_instance", ...}


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _experiment_ids(client) -> list[str]:
    if isinstance(client, SqlTracking):
        e = db.experiments.c
        with client.engine.connect() as conn:
            return [str(i) for i in conn.scalars(sa.select(e.experiment_id).where(e.lifecycle_stage == db.ACTIVE))]
    return [e.experiment_id for e in client.search_experiments()]


def training_runs(client, host: str, names: dict[str, str] | None = None) -> list[Training]:
    """This host's RUNNING training runs (not monitor runs), with their experiment's name (`names` caches them).

    A run of several nodes counts where one of its RUNNING parts runs on this host (radt.node.<node>/host), with that part's GPUs."""
    names = {} if names is None else names
    found = []
    for run in find_runs(client, _experiment_ids(client), {ROLE_TAG: RUN_ROLE}, status="RUNNING"):
        tags = run.data.tags
        if tags.get(MONITOR_TAG) == "true":
            continue
        nodes = node_statuses(tags)
        parts = [n for n, status in nodes.items() if status == "RUNNING" and tags.get(node_tag(n, "host")) == host]
        if parts:
            entries = [entry for node in parts for entry in gpu_entries(tags, node)]
        elif tags.get(HOST_TAG) == host and not nodes:
            entries = gpu_entries(tags)
            if not entries:  # recorded without NVML: the indices of -d, as radt.devices says them
                entries = [{"index": int(i)} for i in tags.get(DEVICES_TAG, "").split("+") if i.isdigit()]
        else:
            continue
        experiment = run.info.experiment_id
        if experiment not in names:
            names[experiment] = client.get_experiment(experiment).name
        found.append(Training(run.info.run_id, run.info.run_name or "", names[experiment], tags.get(WORKLOAD_TAG, ""), entries))
    return found


def uses(training: Training, gpu: int, mig: int | None, uuid: str | None) -> bool:
    """Whether the run's GPUs include this device: by UUID where both sides know it, else by NVML index (and MIG slice)."""
    for entry in training.entries:
        if uuid and entry.get("uuid"):
            if entry["uuid"] == uuid:
                return True
        elif entry.get("index") == gpu and entry.get("gpu_instance") == mig:
            return True
    return False


class Exposition:
    """The latest value of each key the sampler gave, served at /metrics; `tee` puts a batch here and into the writer."""

    def __init__(self, server: ThreadingHTTPServer, hostname: str, report: Callable[[str], None]) -> None:
        self.server = server
        server.exposition = self  # for the handler
        self.hostname = hostname
        self.report = report
        self.devices: dict[str, str] = {}  # series ("gpu_0", "gpu_0_mig_3") -> UUID, from the monitor's plan
        self.monitor_run: Callable[[], str] = lambda: ""
        self._latest: dict[str, tuple[float, int]] = {}
        self._runs: list[Training] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- the sink --------------------------------------------------------------------------------

    def put(self, points: Sequence[Point]) -> None:
        with self._lock:
            for point in points:
                self._latest[point.key] = (point.value, point.timestamp)

    def tee(self, put: Callable[[list[Point]], None]) -> Callable[[list[Point]], None]:
        def both(points: list[Point]) -> None:
            put(points)
            self.put(points)

        return both

    # -- serving -------------------------------------------------------------------------------

    def start(self, find: Callable[[], list[Training]], monitor_run: Callable[[], str], devices: dict[str, str]) -> Exposition:
        """Serve /metrics and refresh the GPU -> training run mapping with `find` every REFRESH seconds."""
        self.monitor_run = monitor_run
        self.devices = devices
        self._refresh(find)
        for target, args in ((self.server.serve_forever, ()), (self._refresh_loop, (find,))):
            thread = threading.Thread(target=target, args=args, daemon=True, name="radt-exposition")
            thread.start()
            self._threads.append(thread)
        host, port = self.server.server_address[:2]
        self.report(f"radt monitor: serving Prometheus metrics at http://{host}:{port}/metrics")
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._threads:
            self.server.shutdown()
        self.server.server_close()

    def _refresh_loop(self, find: Callable[[], list[Training]]) -> None:
        while not self._stop.wait(REFRESH):
            self._refresh(find)

    def _refresh(self, find: Callable[[], list[Training]]) -> None:
        try:
            runs = find()
        except Exception as exc:  # the store away: keep the last mapping, the samples still flow
            self.report(f"radt monitor: cannot read the training runs of this host for /metrics ({first_line(exc)}); keeping the last ones")
            return
        with self._lock:
            self._runs = runs

    def render(self) -> str:
        """The exposition text: HELP and TYPE once per metric, then one sample per device and training run on it."""
        with self._lock:
            latest = dict(self._latest)
            runs = list(self._runs)
        monitor_run = self.monitor_run()
        families: dict[str, tuple[catalogue.Metric, list[str]]] = {}
        rows = []
        for key, (value, timestamp) in latest.items():
            resolved = catalogue.resolve(key)
            if resolved is None:
                continue
            rows.append((catalogue.exposition_name(resolved.metric), resolved.device.sort_key(), resolved, value * resolved.scale, timestamp))
        for name, _order, resolved, value, timestamp in sorted(rows, key=lambda row: row[:2]):
            lines = families.setdefault(name, (resolved.metric, []))[1]
            for labels in self._label_sets(resolved, runs, monitor_run):
                text = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
                lines.append(f"{name}{{{text}}} {format_value(value)} {timestamp}")
        out = []
        for name, (metric, lines) in families.items():
            help_text = f"{metric.label}" + (f": {metric.description}" if metric.description else "") + f" ({metric.unit})"
            out += [f"# HELP {name} {help_text.replace(chr(92), chr(92) * 2).replace(chr(10), ' ')}", f"# TYPE {name} gauge", *lines]
        return "\n".join(out) + "\n" if out else ""

    def _label_sets(self, resolved: catalogue.Resolved, runs: list[Training], monitor_run: str) -> list[dict[str, str]]:
        base = {"Hostname": self.hostname, "monitor_run": monitor_run}
        if resolved.node:
            base["node"] = resolved.node
        device = resolved.device
        if device.gpu is None:
            return [base]
        series = f"gpu_{device.gpu}" + (f"_mig_{device.mig}" if device.mig is not None else "")
        uuid = self.devices.get(series)
        base["gpu"] = str(device.gpu)
        if device.mig is not None:
            base["GPU_I_ID"] = str(device.mig)
        base["UUID"] = uuid or ""
        on_it = [t for t in runs if uses(t, device.gpu, device.mig, uuid)] if not resolved.node else []
        if not on_it:
            return [{**base, "run_id": "", "run_name": "", "experiment": "", "workload": ""}]
        return [{**base, "run_id": t.run_id, "run_name": t.run_name, "experiment": t.experiment, "workload": t.workload} for t in on_it]


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404, "radt serves /metrics")
            return
        body = self.server.exposition.render().encode()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # a scrape a second: nothing on stderr
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """A scrape its client gave up on (Prometheus's scrape timeout on a loaded node) is no error of radt's: no
        traceback in the middle of `radt monitor`'s output; anything else is reported as socketserver does."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def bind(host: str, port: int, hostname: str, report: Callable[[str], None]) -> Exposition:
    """Take the port now, before the monitor starts anything; in use or refused: a UsageError."""
    if not 1 <= port <= 65535:
        raise UsageError(f"--prometheus-port {port} is not a port; choose one from 1 to 65535")
    try:
        server = _Server((host, port), _Handler)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(f"port {port} is in use; choose another --prometheus-port") from None
        raise UsageError(f"cannot serve on {host}:{port} ({exc.strerror or first_line(exc)}); choose another --prometheus-host or --prometheus-port") from None
    return Exposition(server, hostname, report)
