"""`radt monitor`: record a whole machine's GPUs and host, without a training run, until stopped.

One run per host per day in the `monitor` experiment (tag `radt.monitor=true`), named
`<hostname> <YYYY-MM-DD>`; at local midnight the day's run ends FINISHED and the next one starts
(`--rollover never` keeps one run). The samplers, sources, writer and run model are the training
run's (recording.py: sampler.py, sources/, writer.py, finish.finish_run; tracking.py), so the points carry the
same catalogue keys, the writer spools while the store is away, and `radt sync` sends what a
stopped monitor left behind. SIGINT/SIGTERM end the current run FINISHED and exit 0. A RUNNING
monitor run of this host whose radt is gone (killed, machine rebooted) is marked KILLED at start.
`--prometheus-port` also serves the latest samples to Prometheus, labelled with each GPU's training run (exposition.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import NamedTuple

from radt.artifacts import configure as configure_artifacts
from radt.cli import OneLineParser
from radt.collectors._common import UsageError, check_host, check_name, check_numbers, first_line
from radt.collectors.monitor.exposition import Exposition, bind, training_runs
from radt.collectors.process.proctree import catch_stops
from radt.collectors.recovery.sync import orphaned, replay_spool
from radt.collectors.run.finish import RunEnd, RunPart, describe_environment, local_run_dir, mark_killed
from radt.collectors.run.recording import Recording
from radt.collectors.run.sampler import open_sources
from radt.collectors.sources import gpus
from radt.collectors.sources.base import SamplingContext
from radt.collectors.sources.listeners import DEFAULT, ListenerError, make_source, parse_listeners, parse_profiler
from radt.collectors.store.tracking import NewRun, StoreError, connect, create_run, find_runs, resolve_experiment, set_tags
from radt.errors import report
from radt.options import recording_parent, store_parent
from radt.rundir import DONE_FILE, LOGS_DIR, META_FILE, claim_run_dir, owner_pid, release_run_dir
from radt.runmodel import GPUS_TAG, HOST_TAG, INTERVAL_TAG, MONITOR_TAG, PID_TAG, STOP_REASON_TAG
from radt.settings import check_radt_home, host_name, runs_dir, tracking_uri

RETRY_NEW_DAY = 60.0  # seconds between tries to start the next day's run while the store is away


def monitor_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="radt monitor",
        description="Record this machine's GPU and host metrics, without a training run, into one run per host per day "
        "of the 'monitor' experiment, until Ctrl-C or SIGTERM.",
        parents=[store_parent(), recording_parent("when a run ends")],  # --store, --interval, --flush-timeout
    )
    parser.add_argument("-e", "--experiment", default="monitor", help="MLflow experiment name or id (created if new; default monitor)")
    parser.add_argument(
        "--artifacts",
        metavar="URI",
        help="where a new experiment keeps its artifacts (a shared folder, mlflow-artifacts://HOST:5000/path, s3://...); see radt --help",
    )
    parser.add_argument("-l", "--listeners", default=DEFAULT, help=f"sources joined with '+': nvml, dcgm, host; default {DEFAULT}")
    parser.add_argument(
        "-d", "--devices", help="GPUs to watch, joined with '+': nvidia-smi's indices (0+1) or UUIDs (GPU-..., MIG-... for a MIG slice); default every GPU"
    )
    parser.add_argument(
        "--rollover", choices=("daily", "never"), default="daily", help="daily (default): a new run at local midnight; never: one run until stopped"
    )
    parser.add_argument(
        "--prometheus-port",
        type=int,
        metavar="N",
        help="also serve the latest samples at http://HOST:N/metrics for Prometheus, labelled with the training run on each GPU",
    )
    parser.add_argument("--prometheus-host", default="127.0.0.1", help="address for --prometheus-port (default 127.0.0.1; 0.0.0.0 for a cluster's Prometheus)")
    parser.add_argument(
        "--host",
        metavar="NAME",
        help="this node's name as Prometheus knows it (the exporter's Hostname or hostname; the served series' Hostname), "
        "also the runs' name and radt.host tag; default RADT_HOST, else this machine's host name",
    )
    return parser


def seconds_to_midnight(now: datetime | None = None) -> float:
    now = now or datetime.now()
    return (datetime.combine(now.date() + timedelta(days=1), datetime.min.time()) - now).total_seconds()


class Day(NamedTuple):
    """A monitor run created for one calendar day, before anything records into it."""

    part: RunPart
    day: date


@dataclass(frozen=True)
class MonitorSetup:
    """What `radt monitor` records: the store and experiment, the listeners, the GPUs (None: all), the interval, the flush timeout, its argv."""

    store: str
    experiment: str | None
    listeners: list[str]
    devices: list[int] | None
    interval: float
    flush_timeout: float
    argv: list[str]


class Monitor:
    """Keeps one recording going; `roll()` swaps in the next day's run, `end()` finishes the current one."""

    def __init__(
        self,
        setup: MonitorSetup,
        *,
        today=date.today,
        plan: gpus.Plan | None = None,
        exposition: Exposition | None = None,
    ) -> None:
        self.store = setup.store
        self.exposition = exposition  # --prometheus-port: every batch goes there too
        self.plan = plan  # -d resolved on this machine (watch_plan): its MIG slices, the radt.gpus tag
        self.experiment = setup.experiment
        self.listeners = setup.listeners
        self.devices = setup.devices
        self.interval = setup.interval
        self.flush_timeout = setup.flush_timeout
        self.argv = setup.argv
        self.today = today
        self.host = host_name()  # --host / RADT_HOST, else this machine's name
        self.client = connect(setup.store)
        self.experiment_id = resolve_experiment(self.client, setup.store, setup.experiment)
        self.current: Recording | None = None
        self.day: date | None = None  # the current run's day
        self._retry_at = 0.0
        self._retry_reported = False

    # -- runs -------------------------------------------------------------------------------

    def _monitor_runs(self, status: str = "RUNNING") -> list:
        return find_runs(self.client, [self.experiment_id], {MONITOR_TAG: "true", HOST_TAG: self.host}, status=status)

    def _radt_alive(self, run) -> int | None:
        """The pid of the radt that records `run` on this host, or None when that radt is gone."""
        meta_file = runs_dir() / run.info.run_id / "meta.json"
        if meta_file.exists():  # its radt holds the folder's lock while it lives (this one now holds it, for _end_stale)
            return (owner_pid(meta_file.parent) or -1) if claim_run_dir(meta_file.parent) is None else None
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, ValueError):  # recorded with another RADT_HOME: the run's own tags say which process
            pid = run.data.tags.get(PID_TAG, "")
            if not pid.isdigit():
                return None
            meta = {"host": self.host, "pid": int(pid), "started": run.info.start_time / 1000}
        if meta.get("pid") == os.getpid() or "pid" not in meta:
            return None
        return None if orphaned(meta) else meta["pid"]

    def end_stale_runs(self) -> None:
        """Mark this host's RUNNING monitor runs whose radt died KILLED; refuse if one is alive."""
        for run in self._monitor_runs():
            pid = self._radt_alive(run)
            if pid is not None:
                raise UsageError(
                    f"another radt monitor (pid {pid}) is recording this host into run {run.info.run_id} of this experiment; stop it first or choose another -e"
                )
            self._end_stale(run)

    def _end_stale(self, run) -> None:
        run_id = run.info.run_id
        run_dir = runs_dir() / run_id
        if (run_dir / META_FILE).exists():  # ours: send what it spooled, attach its logs, as `radt sync` does
            if claim_run_dir(run_dir) is None:
                return  # alive after all (or a `radt sync` on it right now): its owner ends it
            try:
                replay_spool(self.store, run_dir, run_id)
                mark_killed(self.client, run_dir, run_id, None)
                (run_dir / DONE_FILE).touch()
            finally:
                release_run_dir(run_dir)
        else:
            set_tags(self.client, run_id, {STOP_REASON_TAG: "radt_killed"})
            self.client.set_terminated(run_id, status="KILLED", end_time=int(time.time() * 1000))
        report(f"radt monitor: run {run_id} ({run.info.run_name}) lost its radt; marked KILLED")

    def _create_run(self) -> Day:
        day = self.today()
        devices = "+".join(map(str, self.devices)) if self.devices is not None else "all"
        run_id, _ = create_run(
            self.client,
            self.experiment_id,
            NewRun(
                command=["radt", "monitor", *self.argv],
                script="radt monitor",
                script_args=[],
                run_name=f"{self.host} {day.isoformat()}",
                workload=None,
                letter="-",
                devices=devices,
                collocation="-",
                listeners=self.listeners,
                settings={INTERVAL_TAG: str(self.interval)},
            ),
        )
        tags = {MONITOR_TAG: "true"}
        if self.plan is not None and self.plan.watched is not None:
            tags[GPUS_TAG] = gpus.gpus_tag(gpus.series_entries(self.plan.watched))
        set_tags(self.client, run_id, tags)
        run_dir = local_run_dir(self.store, run_id, None, monitor=True)
        describe_environment(run_dir / LOGS_DIR, self.plan)
        return Day(RunPart(run_id, run_dir), day)

    def _open_sources(self) -> list:
        # no training process: the process-tree metrics (CPU, RSS, a run's GPU memory) are skipped
        ctx = SamplingContext(interval=self.interval, devices=self.devices, slices=self.plan.slices if self.plan else [], pids=lambda: [])
        return open_sources([make_source(name) for name in self.listeners], ctx, report)

    def _record(self, new: Day, sources: list) -> None:
        """Record into the day's run: a Recording (writer, sampler over `sources`) that ends the run when closed."""
        recording = Recording(self.flush_timeout, cancel_on_signal=False)  # a second Ctrl-C interrupts the flush (main)
        with recording.opening():
            recording.callback(release_run_dir, new.part.run_dir)  # after the run ended, or waits for `radt sync`, which may take it over
            writer = recording.write(self.client, new.part, self.store)
            recording.sample(sources, self.interval, writer.put if self.exposition is None else self.exposition.tee(writer.put))
        self.current, self.day = recording, new.day
        report(f"radt monitor: recording {self.host} into run {recording.run_id} ('{self.host} {new.day.isoformat()}', experiment {self.experiment_id})")

    @staticmethod
    def _finish(recording: Recording, status: str, stop_reason: str) -> bool:
        """Stop sampling into `recording`, flush its writer (bounded) and end the run; False if something waits for `radt sync`."""
        recording.end = RunEnd(status, 0, stop_reason)
        recording.close()
        return recording.done

    def begin(self) -> None:
        """Open the sources (refused if none works here) and start the first run."""
        sources = self._open_sources()
        if not sources:
            raise UsageError(f"no listener of -l {'+'.join(self.listeners)} works on this machine (see above); choose others with -l")
        self._record(self._create_run(), sources)
        if self.exposition is not None:
            names: dict[str, str] = {}
            devices = {e["series"]: e["uuid"] for e in gpus.series_entries(self.plan.watched)} if self.plan and self.plan.watched else {}
            self.exposition.start(
                lambda: training_runs(self.client, self.host, names), lambda: self.current.run_id if self.current else "", devices, self.process_rows
            )

    def process_rows(self) -> list:
        """Each process on each GPU at the nvml listener's last read, for the exposition's per-process gauges."""
        recording = self.current
        sources = recording.sources if recording is not None else []
        return [row for source in sources if hasattr(source, "process_rows") for row in source.process_rows()]

    def roll(self) -> bool:
        """End the current run FINISHED and record into a new one; while the store is away, keep the current run."""
        try:
            self.client = connect(self.store)  # a one-line StoreError at once, not MLflow's minute of retries
            new = self._create_run()
        except Exception as exc:
            self._retry_at = time.monotonic() + RETRY_NEW_DAY
            if not self._retry_reported:
                report(f"radt monitor: cannot start the next run ({first_line(exc)}); still recording into run {self.current.run_id}, trying every minute")
                self._retry_reported = True
            return False
        self._retry_reported = False
        old = self.current
        old.client = self.client  # the day's run ends through the client that just reached the store
        old.stop_sampling()  # closes the day's sources; the new run gets fresh ones (energy and totals from 0)
        self._record(new, self._open_sources())
        self._finish(old, "FINISHED", "day_end")
        return True

    def run_until(self, stop: threading.Event, rollover: str) -> None:
        """Wait for `stop`; at local midnight (daily) roll over to the next run."""
        while not stop.is_set():
            if rollover == "daily" and self.today() != self.day and time.monotonic() >= self._retry_at:
                self.roll()
            stop.wait(min(1.0, seconds_to_midnight() + 0.01))

    def end(self, stop_reason: str = "stopped") -> bool:
        if self.current is None:
            return True
        recording, self.current = self.current, None
        return self._finish(recording, "FINISHED", stop_reason)


def watch_plan(devices: list[int | str] | None) -> gpus.Plan:
    """-d resolved on this machine by UUID and PCI bus id (every GPU without it); a -d entry it lacks is a UsageError.

    No script sees these GPUs, so no CUDA ordinals; without NVML the nvml listener says why it is skipped."""
    try:
        found = gpus.machine()
    except gpus.NvmlUnavailable as exc:
        return gpus.plan_without_nvml(devices, None, {}, str(exc))._replace(notes=[])
    try:
        watched = gpus.resolve_tokens(devices, found) if devices is not None else [gpus.Watched(g) for g in found.gpus]
    except gpus.DeviceError as exc:
        raise UsageError(str(exc)) from exc
    return gpus.Plan(found, watched, None, None, [])


def main(argv: list[str]) -> int:
    opts = monitor_parser().parse_args(argv)
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame) -> None:
        received.append(signum)
        stop.set()  # reported by the main loop: printing here could re-enter a write to stderr
        # a second Ctrl-C interrupts the final flush (the writer leaves the rest for `radt sync`)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    # as a training run's radt: Ctrl-C, SIGTERM, and the SIGHUP of a closed terminal or ssh session end the day's run with
    # every sample (SIGHUP's default killed radt mid-run, the run left RUNNING); under `nohup radt monitor &` SIGHUP stays ignored
    previous = catch_stops(on_signal)
    exposition = None
    try:
        try:
            check_numbers(opts.interval, None, None, opts.flush_timeout)  # NaN and inf too, as for a training run
            check_name("experiment", opts.experiment, "-e", left_out="the 'monitor' experiment")
            check_radt_home()  # a full or read-only RADT_HOME: one line, before any run exists
            if opts.host is not None:
                os.environ["RADT_HOST"] = check_host(opts.host)  # as the prometheus listener and the run's tags read it
            if opts.prometheus_port is not None:  # the port first: taken, nothing else has started
                exposition = bind(opts.prometheus_host, opts.prometheus_port, host_name(), report)
            listeners = parse_listeners(opts.listeners)
            if parse_profiler(opts.listeners):
                raise UsageError(f"profiler listener '{parse_profiler(opts.listeners)}' wraps a training command; radt monitor has none, drop it from -l")
            devices = gpus.device_tokens(opts.devices)
            if devices is not None and not {"nvml", "dcgm", "prometheus"} & set(listeners):
                raise UsageError(f"-d {opts.devices} names GPUs, but -l {'+'.join(listeners) or '-'} records none; add nvml or dcgm to -l, or drop -d")
            plan = watch_plan(devices)
            watched = plan.indices if devices is not None else None  # radt.devices says "all" without -d
            store = tracking_uri(opts.store)
            configure_artifacts(opts.artifacts, store)
            setup = MonitorSetup(store, opts.experiment, listeners, watched, opts.interval, opts.flush_timeout, argv)
            monitor = Monitor(setup, plan=plan, exposition=exposition)
            monitor.end_stale_runs()
            monitor.begin()
        except (UsageError, ListenerError, StoreError, ValueError) as exc:
            print(f"radt monitor: {exc}", file=sys.stderr)
            return 2
        monitor.run_until(stop, opts.rollover)
        name = signal.Signals(received[0]).name if received else "stop"
        report(f"radt monitor: {name} received, ending the run (again to force)")
        name = name.lower()
        if not monitor.end(name):
            report("radt monitor: stopped; some samples wait for 'radt sync'")
        return 0
    except KeyboardInterrupt:  # a second Ctrl-C outside the writer's flush
        report("radt monitor: forced to stop; run 'radt sync' to send what was left")
        return 130
    finally:
        if exposition is not None:
            exposition.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
