"""`radt monitor --prometheus-port`: radt's latest samples in Prometheus' text format at /metrics.

One family per catalogue metric, labelled with the GPU (index, UUID, MIG slice), the host, the
monitor's own run and the training run(s) RUNNING on that GPU of this host (run_id, run_name,
experiment, workload; "" when none), so a cluster's Grafana can show which run uses which GPU.
The GPU -> run mapping comes from the store's radt.gpus tags, refreshed every REFRESH seconds,
never per scrape. Samples carry their own timestamps, so Prometheus holds the values radt wrote. Names and values follow
Prometheus' conventions (catalogue.exposed): base units (bytes, not the stored megabytes; 0–1 ratios, not percentages;
hertz), counters named _total, HELP and TYPE on every family; `promtool check metrics` finds nothing to say.
Each process on a GPU has its own gauges too (radt_process_sm_utilization_ratio and
radt_process_memory_utilization_ratio: NVML's per-process smUtil and memUtil at its last read, as 0–1), labelled with its
pid and, where radt knows the process is a training run's (the run's process tree as its radt records it), the run's id.
prometheus_client writes the text (escaping, timestamps) and serves it; radt gives it a collector.
"""

from __future__ import annotations

import errno
import math
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from socketserver import ThreadingMixIn
from typing import NamedTuple
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from radt import catalogue
from radt import mlflowdb as db
from radt.collectors._common import UsageError, first_line
from radt.collectors.process.proctree import descendants
from radt.collectors.process.watchdog import is_same, read_record
from radt.collectors.sources.gpushare import ProcessRow
from radt.collectors.store.sqltracking import SqlTracking
from radt.collectors.store.tracking import find_runs
from radt.points import Point
from radt.runmodel import DEVICES_TAG, HOST_TAG, MONITOR_TAG, PID_TAG, ROLE_TAG, RUN_ROLE, WORKLOAD_TAG, gpu_entries, node_statuses, node_tag
from radt.settings import runs_dir

REFRESH = 10.0  # seconds between looks in the store for the training runs on this host's GPUs
PROCESS_GAUGES = (  # name, ProcessRow field (a percentage, served as a 0–1 ratio), help: one process's own share of its GPU
    ("radt_process_sm_utilization_ratio", "sm", "Process SM util: the share of time its kernels ran on the GPU (NVML per-process smUtil) (0–1)"),
    ("radt_process_memory_utilization_ratio", "mem", "Process mem util: its share of the memory controller (NVML per-process memUtil) (0–1)"),
)


class Training(NamedTuple):
    """A RUNNING training run of this host and the GPUs its radt.gpus (else radt.devices) tag names."""

    run_id: str
    run_name: str
    experiment: str
    workload: str
    entries: list[dict]  # radt.gpus entries: {"series", "index", "uuid", "gpu_instance", ...}
    pids: frozenset[int] = frozenset()  # its processes on this host, where radt knows them


def run_pids(run_id: str, tags: dict[str, str], node: str | None = None) -> frozenset[int]:
    """A training run's processes on this host: its process tree as its radt records it in the run folder (this
    RADT_HOME; a pid reused since is not the run's), with the descendants of its radt (radt.pid: the tree's subreaper)."""
    record = read_record(runs_dir() / (f"{run_id}@{node}" if node else run_id)) or {}
    found = {int(pid) for pid, start in record.get("processes", []) if is_same(int(pid), int(start))}
    radt = tags.get(node_tag(node, "pid") if node else PID_TAG, "")
    if radt.isdigit():
        found.update(pid for pid in descendants(int(radt)) if pid != int(radt))
    return frozenset(found)


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
            pids = frozenset().union(*(run_pids(run.info.run_id, tags, node) for node in parts))
        elif tags.get(HOST_TAG) == host and not nodes:
            entries = gpu_entries(tags)
            if not entries:  # recorded without NVML: the indices of -d, as radt.devices says them
                entries = [{"index": int(i)} for i in tags.get(DEVICES_TAG, "").split("+") if i.isdigit()]
            pids = run_pids(run.info.run_id, tags)
        else:
            continue
        experiment = run.info.experiment_id
        if experiment not in names:
            names[experiment] = client.get_experiment(experiment).name
        found.append(Training(run.info.run_id, run.info.run_name or "", names[experiment], tags.get(WORKLOAD_TAG, ""), entries, pids))
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


class Exposition(Collector):
    """The latest value of each key the sampler gave, collected into gauges at each scrape of /metrics; `tee` puts a
    batch here and into the writer."""

    def __init__(self, server: _Server, hostname: str, report: Callable[[str], None]) -> None:
        self.server = server
        self.hostname = hostname
        self.report = report
        self.devices: dict[str, str] = {}  # series ("gpu_0", "gpu_0_mig_3") -> UUID, from the monitor's plan
        self.monitor_run: Callable[[], str] = lambda: ""
        self.processes: Callable[[], list[ProcessRow]] = list  # each process on a GPU at the last read (the nvml listener's)
        self._latest: dict[str, tuple[float, int]] = {}
        self._runs: list[Training] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.registry = CollectorRegistry()  # its own, not the global one: radt's gauges only, none of the process's
        self.registry.register(self)
        server.set_app(_metrics_only(make_wsgi_app(self.registry)))

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

    def start(
        self,
        find: Callable[[], list[Training]],
        monitor_run: Callable[[], str],
        devices: dict[str, str],
        processes: Callable[[], list[ProcessRow]] = list,
    ) -> Exposition:
        """Serve /metrics and refresh the GPU -> training run mapping with `find` every REFRESH seconds; `processes`
        gives each GPU's processes for their own gauges."""
        self.monitor_run = monitor_run
        self.devices = devices
        self.processes = processes
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

    def collect(self) -> Iterator[Metric]:
        """prometheus_client calls this per scrape: one family per metric (a gauge, or a counter where it only grows), one
        sample per device and training run on it, each at its own timestamp (the mapping to runs is the last refresh's,
        never looked up here), in Prometheus' base unit."""
        with self._lock:
            latest = dict(self._latest)
            runs = list(self._runs)
        monitor_run = self.monitor_run()
        rows = []
        for key, (value, timestamp) in latest.items():
            resolved = catalogue.resolve(key)
            if resolved is None:
                continue
            served = catalogue.exposed(resolved.metric)
            rows.append((served.name, resolved.device.sort_key(), resolved, served, served.serve(value * resolved.scale), timestamp))
        families: dict[str, Metric] = {}
        for name, _order, resolved, served, value, timestamp in sorted(rows, key=lambda row: row[:2]):
            family = families.get(name)
            if family is None:
                kind = CounterMetricFamily if served.counter else GaugeMetricFamily
                family = families[name] = kind(served.family, served.help)
            for labels in self._label_sets(resolved, runs, monitor_run):
                # add_sample, not add_metric: one family's samples carry different label names (GPU_I_ID on a slice, node)
                family.add_sample(name, labels, value, _seconds(timestamp))
        yield from families.values()
        yield from self._process_families(runs, monitor_run)

    def _process_families(self, runs: list[Training], monitor_run: str) -> Iterator[GaugeMetricFamily]:
        """One gauge per process on a GPU, labelled with its pid and the training run it belongs to ("" where radt knows none)."""
        rows = self.processes()
        if not rows:
            return
        owner = {pid: t.run_id for t in runs for pid in t.pids}
        for name, field, help_text in PROCESS_GAUGES:
            family = GaugeMetricFamily(name, help_text)
            for row in rows:
                labels = {
                    "Hostname": self.hostname,
                    "monitor_run": monitor_run,
                    "gpu": str(row.gpu),
                    "UUID": self.devices.get(f"gpu_{row.gpu}", ""),
                    "pid": str(row.pid),
                    "run_id": owner.get(row.pid, ""),
                }
                family.add_sample(name, labels, getattr(row, field) / 100, _seconds(row.stamp_ms))  # a percentage as a ratio
            yield family

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


def _seconds(ms: int) -> float:
    """A millisecond stamp as prometheus_client takes it, in seconds one float step up: it writes int(seconds * 1000),
    and ms / 1000 * 1000 falls a hair short of ms for a quarter of the stamps from 2038-01-19 (2**31 s) on."""
    return math.nextafter(ms / 1000, math.inf)


def _metrics_only(app: WSGIApplication) -> WSGIApplication:
    """prometheus_client's app at /metrics only (it answers any path), in the 0.0.4 text format whatever the scraper
    asks: its timestamps are whole milliseconds, where OpenMetrics' float seconds may come back a millisecond short."""

    def serve(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"radt serves /metrics\n"]
        return app({**environ, "HTTP_ACCEPT": ""}, start_response)

    return serve


class _Handler(WSGIRequestHandler):
    def log_message(self, format: str, *args) -> None:  # a scrape a second: nothing on stderr
        pass


class _Server(ThreadingMixIn, WSGIServer):
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
