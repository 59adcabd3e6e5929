"""Turn parsed tool rows (dcgmi dmon, nvidia-smi, top) into catalogue keys and values.

Shared by the live `dcgm` source and by `radt import`, so a log file and a live run of the
same tool produce the same series.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from radt.catalogue import DCGM_CLOCK_REASON_TAGS, DCGM_TAGS, SMI_COLUMNS, MetricName, clock_reason_series, key
from radt.collectors.sources.parsers import DmonRow, SmiRow, TopFrame


class EnergyBaseline:
    """Makes cumulative energy counters relative to the first reading of each device (a GPU index, or (GPU, GPU instance id) for a MIG slice),
    and DCGM's repeated last XID into the new ones."""

    def __init__(self) -> None:
        self._first: dict[int | tuple[int, int], float] = {}
        self._xid: dict[int | tuple[int, int], float] = {}

    def relative(self, device: int | tuple[int, int], joules: float) -> float:
        return joules - self._first.setdefault(device, joules)

    def new_xid(self, device: int | tuple[int, int], code: float | None) -> float | None:
        """DCGM repeats the last XID in every row (N/A before the first): the code where it changes, 0 where it repeats.

        A code already there in the device's first row came before the recording: 0. N/A is no reading (None)."""
        before = self._xid.setdefault(device, 0.0 if code is None else code)
        if code is None:
            return None
        self._xid[device] = code
        return code if code != before else 0.0


# Tags that name the same metric as a better field: the profiling PCIe byte rates (1009/1010,
# bytes/s) win over the older throughput fields (200/201, KB/s) whatever the column order.
SUPERSEDED_BY = {"TXTPT": "PCITX", "RXTPT": "PCIRX"}


def dmon_metrics(row: DmonRow, energy: EnergyBaseline, gpu: int | None = None, instances: Mapping[int, tuple[int, int]] | None = None) -> dict[str, float]:
    """Catalogue keys for one `dcgmi dmon` entity line; N/A cells are left out.

    `instances` maps DCGM GPU-instance entity ids (what `dcgmi discovery -c` lists, and dmon prints
    as "GPU-I <id>") to (NVML GPU index, GPU instance id): those lines become the slice's own keys,
    `key(name, gpu, mig=gi)`. A "GPU-I" line of an instance not in it has no GPU index and is dropped,
    as in `radt import` of a dmon log, which has no hierarchy to map it.
    """
    kind, _, ident = row.entity.partition(" ")
    mig: int | None = None
    if kind == "GPU-I" and ident.isdigit() and int(ident) in (instances or {}):
        index, mig = instances[int(ident)]
    else:
        index = row.gpu if gpu is None else gpu
    if index is None:
        return {}
    out: dict[str, float] = {}
    for tag, value in row.values.items():
        if tag not in DCGM_TAGS:
            continue
        name, scale = DCGM_TAGS[tag]
        if name == MetricName.XID_ERROR:
            value = energy.new_xid(index if mig is None else (index, mig), value)  # an N/A row counts: "no XID yet"
        if value is None:
            continue
        if tag in SUPERSEDED_BY and row.values.get(SUPERSEDED_BY[tag]) is not None:
            continue
        if tag in DCGM_CLOCK_REASON_TAGS:
            out.update({key(reason, index, mig=mig): on for reason, on in clock_reason_series(value).items()})
            continue
        value *= scale
        if name == MetricName.ENERGY_JOULES:
            value = energy.relative(index if mig is None else (index, mig), value)
        out[key(name, index, mig=mig)] = value
    return out


def smi_metrics(row: SmiRow) -> dict[str, float]:
    """Catalogue keys for one nvidia-smi CSV row (units converted to the catalogue's)."""
    out: dict[str, float] = {}
    for column, value in row.values.items():
        if value is None or column not in SMI_COLUMNS:
            continue
        name, scale = SMI_COLUMNS[column]
        out[key(name, row.gpu)] = value * scale
    used, total = row.values.get("memory.used"), row.values.get("memory.total")
    if used is not None and total:
        out[key(MetricName.MEMORY_USAGE_PERCENTAGE, row.gpu)] = 100.0 * used / total
    return out


def top_metrics(frame: TopFrame, process: str | None = "python") -> dict[str, float]:
    """Host keys for one `top -b` screen; the named process's lines summed as the run's."""
    out: dict[str, float] = {}
    if frame.cpu_percent is not None:
        out[key(MetricName.CPU_UTILIZATION_PERCENTAGE)] = frame.cpu_percent
    if frame.mem_used_mb is not None:
        out[key(MetricName.SYSTEM_MEMORY_USAGE_MEGABYTES)] = frame.mem_used_mb
        if frame.mem_total_mb:
            out[key(MetricName.SYSTEM_MEMORY_USAGE_PERCENTAGE)] = 100.0 * frame.mem_used_mb / frame.mem_total_mb
    if frame.swap_used_mb is not None:
        out[key(MetricName.SWAP_USAGE_MEGABYTES)] = frame.swap_used_mb
    if process:
        mine = [p for p in frame.processes if is_process(p.command, process)]
        out[key(MetricName.PROCESS_CPU_UTILIZATION_PERCENTAGE)] = sum(p.cpu_percent for p in mine)
        out[key(MetricName.PROCESS_MEMORY_RSS_MEGABYTES)] = sum(p.rss_bytes for p in mine) / 1e6
    return out


def is_process(command: str, process: str) -> bool:
    """Whether a top COMMAND cell is `process`: 'python' matches python, python3, python3.11 and,
    under `top -c`, '/usr/bin/python3 train.py'; any other name must match exactly."""
    if command == process:
        return True
    words = command.split()
    name = words[0].rsplit("/", 1)[-1] if words else ""
    return re.fullmatch(re.escape(process) + r"[\d.]*", name) is not None
