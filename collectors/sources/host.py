"""Host metrics through psutil: system CPU and memory, disk and network rates, the run's process tree."""

from __future__ import annotations

import time

import psutil

from radt.catalogue import key
from radt.collectors.sources.base import MetricSource, SamplingContext

MB = 1e6


class HostSource(MetricSource):
    name = "host"
    gives = "host"

    def __init__(self) -> None:
        self._pids = lambda: []
        self._last: tuple[float, object, object] | None = None
        self._net_base = None

    def open(self, ctx: SamplingContext) -> None:
        self._pids = ctx.pids
        psutil.cpu_percent(None)  # primes the interval counter
        self._net_base = psutil.net_io_counters()
        self._last = (time.monotonic(), psutil.disk_io_counters(), self._net_base)

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        cpu = psutil.cpu_percent(None)
        if time.monotonic() - self._last[0] >= 0.05:  # right after priming the figure is noise
            out[key("cpu_utilization_percentage")] = cpu
        memory = psutil.virtual_memory()
        out[key("system_memory_usage_megabytes")] = memory.used / MB
        out[key("system_memory_usage_percentage")] = memory.percent
        out[key("swap_usage_megabytes")] = psutil.swap_memory().used / MB

        now, disk, net = time.monotonic(), psutil.disk_io_counters(), psutil.net_io_counters()
        then, disk0, net0 = self._last
        elapsed = now - then
        if elapsed > 0:
            if disk is not None and disk0 is not None:
                out[key("disk_read_bytes_per_second")] = max(0, disk.read_bytes - disk0.read_bytes) / elapsed
                out[key("disk_write_bytes_per_second")] = max(0, disk.write_bytes - disk0.write_bytes) / elapsed
            if net is not None and net0 is not None:
                out[key("network_receive_bytes_per_second")] = max(0, net.bytes_recv - net0.bytes_recv) / elapsed
                out[key("network_transmit_bytes_per_second")] = max(0, net.bytes_sent - net0.bytes_sent) / elapsed
        if net is not None and self._net_base is not None:
            out[key("network_receive_megabytes")] = (net.bytes_recv - self._net_base.bytes_recv) / MB
            out[key("network_transmit_megabytes")] = (net.bytes_sent - self._net_base.bytes_sent) / MB
        self._last = (now, disk, net)

        procs = self._pids()
        if procs:
            cpu = rss = 0.0
            for proc in procs:
                try:
                    with proc.oneshot():
                        cpu += proc.cpu_percent(None)
                        rss += proc.memory_info().rss
                except psutil.Error:
                    continue
            out[key("process_cpu_utilization_percentage")] = cpu
            out[key("process_memory_rss_megabytes")] = rss / MB
        return out
