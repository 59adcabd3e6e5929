"""Host metrics through psutil: system CPU and memory, disk and network rates, the run's process tree.

CPU shares are measured between this source's own readings of the cumulative CPU times, never with
psutil's cpu_percent(None): that keeps its last reading per thread and per Process object, so the sampler's
first tick (its thread's first call, a process's first look) read 0.0 that nobody measured."""

from __future__ import annotations

import time
from typing import NamedTuple

import psutil

from radt.catalogue import MetricName, key
from radt.collectors.sources.base import MetricSource, SamplingContext

MB = 1e6
MIN_SPAN = 0.05  # seconds: CPU times move in clock ticks (10 ms), so a share over a shorter span is noise, not a measurement


class CpuClock(NamedTuple):
    """Cumulative CPU time read at a moment (time.monotonic): the host's psutil.cpu_times(), or a process's seconds."""

    at: float
    times: tuple | float


def busy_percent(before: tuple, after: tuple) -> float:
    """The share of all cores busy between two psutil.cpu_times() readings, as psutil.cpu_percent computes it
    (guest time is already in user and nice on Linux; idle and iowait are not busy)."""
    deltas = {name: max(0.0, b - a) for name, a, b in zip(after._fields, before, after)}
    total = sum(deltas.values()) - deltas.get("guest", 0.0) - deltas.get("guest_nice", 0.0)
    idle = deltas.get("idle", 0.0) + deltas.get("iowait", 0.0)
    return round(100.0 * (total - idle) / total, 1) if total > 0 else 0.0


def process_seconds(proc: psutil.Process) -> float:
    """CPU seconds the process has used itself (user + system; its children count as processes of their own)."""
    times = proc.cpu_times()
    return times.user + times.system


class HostSource(MetricSource):
    name = "host"
    gives = "host"

    def __init__(self) -> None:
        self._pids = lambda: []
        self._last: tuple[float, object, object] | None = None
        self._net_base = None
        self._cpu: CpuClock | None = None  # the host's CPU times at the start of the interval being measured
        self._proc_cpu: dict[tuple[int, float], CpuClock] = {}  # (pid, create time) -> its CPU seconds at its interval's start

    def open(self, ctx: SamplingContext) -> None:
        self._pids = ctx.pids
        self._cpu = CpuClock(time.monotonic(), psutil.cpu_times())
        self._net_base = psutil.net_io_counters()
        self._last = (time.monotonic(), psutil.disk_io_counters(), self._net_base)
        self._process_cpu(self._pids())  # the tree's processes already there are measured from now

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        now, times = time.monotonic(), psutil.cpu_times()
        if now - self._cpu.at >= MIN_SPAN:  # else the interval goes on to the next tick: no value rather than noise
            out[key(MetricName.CPU_UTILIZATION_PERCENTAGE)] = busy_percent(self._cpu.times, times)
            self._cpu = CpuClock(now, times)
        memory = psutil.virtual_memory()
        out[key(MetricName.SYSTEM_MEMORY_USAGE_MEGABYTES)] = memory.used / MB
        out[key(MetricName.SYSTEM_MEMORY_USAGE_PERCENTAGE)] = memory.percent
        out[key(MetricName.SWAP_USAGE_MEGABYTES)] = psutil.swap_memory().used / MB

        now, disk, net = time.monotonic(), psutil.disk_io_counters(), psutil.net_io_counters()
        then, disk0, net0 = self._last
        elapsed = now - then
        if elapsed > 0:
            if disk is not None and disk0 is not None:
                out[key(MetricName.DISK_READ_BYTES_PER_SECOND)] = max(0, disk.read_bytes - disk0.read_bytes) / elapsed
                out[key(MetricName.DISK_WRITE_BYTES_PER_SECOND)] = max(0, disk.write_bytes - disk0.write_bytes) / elapsed
            if net is not None and net0 is not None:
                out[key(MetricName.NETWORK_RECEIVE_BYTES_PER_SECOND)] = max(0, net.bytes_recv - net0.bytes_recv) / elapsed
                out[key(MetricName.NETWORK_TRANSMIT_BYTES_PER_SECOND)] = max(0, net.bytes_sent - net0.bytes_sent) / elapsed
        if net is not None and self._net_base is not None:
            out[key(MetricName.NETWORK_RECEIVE_MEGABYTES)] = (net.bytes_recv - self._net_base.bytes_recv) / MB
            out[key(MetricName.NETWORK_TRANSMIT_MEGABYTES)] = (net.bytes_sent - self._net_base.bytes_sent) / MB
        self._last = (now, disk, net)

        procs = self._pids()
        if procs:
            cpu, rss = self._process_cpu(procs)
            if cpu is not None:
                out[key(MetricName.PROCESS_CPU_UTILIZATION_PERCENTAGE)] = cpu
            out[key(MetricName.PROCESS_MEMORY_RSS_MEGABYTES)] = rss / MB
        return out

    def _process_cpu(self, procs: list[psutil.Process]) -> tuple[float | None, float]:
        """The tree's CPU in % of one core since each process's last reading, and its RSS in bytes.

        A process first seen now is measured from now on (its share of this interval is not known); None where
        no process of the tree had been measured over MIN_SPAN or more, so a run's first tick stores no 0.0."""
        now, total, measured, rss = time.monotonic(), 0.0, False, 0.0
        seen: dict[tuple[int, float], CpuClock] = {}
        for proc in procs:
            try:
                with proc.oneshot():
                    ident, used = (proc.pid, proc.create_time()), process_seconds(proc)
                    rss += proc.memory_info().rss
            except psutil.Error:
                continue
            before = self._proc_cpu.get(ident)
            if before is not None and now - before.at < MIN_SPAN:
                seen[ident] = before  # too short to say: measured over a longer span next tick
            elif before is not None:
                total, measured = total + 100.0 * max(0.0, used - before.times) / (now - before.at), True
                seen[ident] = CpuClock(now, used)
            else:
                seen[ident] = CpuClock(now, used)
        self._proc_cpu = seen
        return (round(total, 1) if measured else None), rss
