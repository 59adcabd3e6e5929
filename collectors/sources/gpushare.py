"""A run's own share of a GPU others use too: NVML's per-process utilization, the run's processes summed.

NVML keeps a ring of utilization samples per process. A read with `lastSeenTimeStamp` (microseconds since the epoch)
answers, for each process that ran since then, one entry over its samples newer than that, stamped with the newest of
them (NVML_ERROR_NOT_FOUND when none ran). Each tick reads what is new since the previous read's newest stamp, so no
sample is read twice; the run's share is the sum of its own processes' entries (its whole process tree, DataLoader
workers with CUDA contexts included; an outsider's pid never), at the newest stamp of the read: NVML's time, not the
tick's. A process without an entry did not run since (NVML lists only those that did): it adds 0. A read covers a second
at least (WINDOW_MS), NVML's longest sample period, so a process that runs has an entry in each.

`nvmlDeviceGetProcessesUtilizationInfo` (newer drivers) is read where the driver has it, else
`nvmlDeviceGetProcessUtilization`. Where NVML has no per-process figure (a GPU or driver without either call, an MPS
server that NVML names instead of its clients) the GPU has no share series and `reason` says why, once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import NamedTuple

import psutil
import pynvml

# Errors that mean "this call will never work on this GPU/driver": remembered, not retried (nvml.py's too).
NEVER = tuple(
    getattr(pynvml, name)
    for name in ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_ARGUMENT_VERSION_MISMATCH")
    if hasattr(pynvml, name)
)
NEWER = "nvmlDeviceGetProcessesUtilizationInfo"
OLDER = "nvmlDeviceGetProcessUtilization"
# NVML samples utilization every 1/6 s to 1 s (by product): a read covering at least 1 s has an entry of each process
# that kept running, so a shorter interval (radt monitor's 0.1 s) reads every second, not a 0 between two samples.
WINDOW_MS = 1000
FOREIGN_READS = 5  # reads (one a second at most) that show only another pid namespace's processes before the run's end says so
MPS_SERVER = "nvidia-cuda-mps"  # the MPS server's process name (nvidia-cuda-mps-server; the kernel's comm keeps 15 characters)


class Entry(NamedTuple):
    """One process's utilization over the samples NVML gave since the last read, at the newest one's time."""

    pid: int
    stamp_us: int
    sm: float
    mem: float


class Share(NamedTuple):
    """The run's share of one GPU from one read: at NVML's stamp (epoch ms); power None where the GPU gave none."""

    stamp_ms: int
    sm: float
    mem: float
    power: float | None


class ProcessRow(NamedTuple):
    """One process on a GPU at the last read (radt monitor's per-process gauges)."""

    gpu: int
    pid: int
    sm: float
    mem: float
    stamp_ms: int


class Seen(NamedTuple):
    """What the tick read of the GPU besides the per-process samples."""

    now_ms: int
    run_pids: frozenset[int]  # the run's whole process tree; empty under radt monitor
    gpu_pids: frozenset[int]  # the processes holding a context on the GPU (nvmlDeviceGetComputeRunningProcesses)
    power_w: float | None
    util: float | None  # the device's utilization.gpu


def read_entries(handle, since_us: int, newer: bool) -> list[Entry]:
    """NVML's per-process entries newer than `since_us`; [] where no process ran since; NVMLError otherwise.

    An entry past 100 % (a driver's garbage entry) or not newer than `since_us` is dropped."""
    call = getattr(pynvml, NEWER if newer else OLDER)
    try:
        found = call(handle, since_us)
    except pynvml.NVMLError as exc:
        if getattr(exc, "value", None) == pynvml.NVML_ERROR_NOT_FOUND:
            return []
        raise
    return [
        Entry(int(s.pid), int(s.timeStamp), float(s.smUtil), float(s.memUtil)) for s in found if s.timeStamp > since_us and s.smUtil <= 100 and s.memUtil <= 100
    ]


def power_estimate(power: float, idle: float, run_sm: float, total_sm: float, owners: int) -> float:
    """The run's power, an estimate: (the device's power - idle) x the run's smUtil / the smUtil of every process on the
    GPU, plus idle / the owners (the run one, each other process one). Nobody ran (total 0): the power above idle is
    split equally too, as nothing says whose it is."""
    above = max(0.0, power - idle)
    active = above * run_sm / total_sm if total_sm > 0 else above / owners
    return active + idle / owners


@dataclass
class IdlePower:
    """The GPU's idle power for the estimate: the lowest power it drew while its utilization was 0 during the
    recording, else (it was never idle) the lowest seen so far. NVML has no idle figure; a GPU at rest in the
    recording is the best one, and the lowest draw never overstates the power above idle that the runs split."""

    at_rest: float | None = None
    lowest: float | None = None

    def see(self, watts: float, util: float | None) -> None:
        self.lowest = watts if self.lowest is None else min(self.lowest, watts)
        if util == 0:
            self.at_rest = watts if self.at_rest is None else min(self.at_rest, watts)

    @property
    def watts(self) -> float | None:
        return self.at_rest if self.at_rest is not None else self.lowest


def _per_pid(entries: list[Entry]) -> dict[int, tuple[float, float]]:
    """(smUtil, memUtil) of each process; a process with several entries (a driver that hands its samples one by one)
    gets their mean, as the driver's own one entry is."""
    values = {e.pid: (e.sm, e.mem) for e in entries}
    if len(values) == len(entries):  # one entry each, as the driver answers
        return values
    grouped: dict[int, list[Entry]] = {}
    for entry in entries:
        grouped.setdefault(entry.pid, []).append(entry)
    return {pid: (sum(e.sm for e in got) / len(got), sum(e.mem for e in got) / len(got)) for pid, got in grouped.items()}


_mps_names: dict[int, bool] = {}


def is_mps_server(pid: int) -> bool:
    """Whether `pid` is this user's MPS server (asked once per pid): NVML names it on drivers that do not split its
    clients, and a user's CUDA processes can be clients of that user's server only."""
    if pid not in _mps_names:
        try:
            server = psutil.Process(pid)
            _mps_names[pid] = server.name().startswith(MPS_SERVER) and server.uids().real == os.getuid()
        except psutil.Error:
            _mps_names[pid] = False
    return _mps_names[pid]


@dataclass
class GpuShare:
    """One GPU's per-process reads: since when, which call, the idle power seen, and why it stopped if it did."""

    gpu: int
    handle: object
    newer: bool
    since_us: int = 0
    used: bool = False  # the run has had a process on this GPU: its share series from then on
    written_ms: int = 0  # the newest stamp of the run's share so far: a 0 (nobody ran) comes after it, never before
    read_ms: int | None = None  # when (radt's clock) the last read was; the first tick only starts the first window
    idle: IdlePower = field(default_factory=IdlePower)
    last: tuple[int, dict[int, tuple[float, float]], frozenset[int]] = (0, {}, frozenset())  # the last read: stamp, values, pids on the GPU
    reason: str | None = None  # why NVML gives this GPU no per-process figure; set once, the reads stop
    foreign: frozenset[int] = frozenset()  # NVML's pids on the GPU while none was the run's and none is in this pid namespace
    foreign_reads: int = 0  # reads that saw only such pids, the run's never (a container's own pid namespace?)

    def read(self, seen: Seen) -> Share | None:
        """The run's share since the last read, or None (no run process here yet, a failed read, or no per-process figure)."""
        if self.reason:
            return None
        if seen.power_w is not None:
            self.idle.see(seen.power_w, seen.util)
        if self.read_ms is None or 0 <= seen.now_ms - self.read_ms < WINDOW_MS:
            self.read_ms = seen.now_ms if self.read_ms is None else self.read_ms  # the first tick starts the first window
            return None  # within NVML's sample period of the last read (a clock stepped back reads at once)
        self.read_ms = seen.now_ms
        try:
            entries = read_entries(self.handle, self.since_us, self.newer)
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) in NEVER:
                self.reason = f"GPU {self.gpu}: NVML stopped giving per-process utilization ({exc})"
            return None  # anything else (a busy driver): the next read asks again from the same stamp
        if entries:
            self.since_us = max(e.stamp_us for e in entries)
        stamp_ms = self.since_us // 1000 if entries else seen.now_ms
        values = _per_pid(entries)
        self.last = (stamp_ms, values, seen.gpu_pids)
        if not seen.run_pids:
            return None
        on_gpu = seen.gpu_pids | values.keys()
        self.used = self.used or bool(seen.run_pids & on_gpu)
        if not self.used and on_gpu and not any(psutil.pid_exists(pid) for pid in on_gpu):
            self.foreign, self.foreign_reads = self.foreign | on_gpu, self.foreign_reads + 1
        if not self.used or self._under_mps(seen, values) or (not entries and stamp_ms <= self.written_ms):
            return None  # nobody ran since a sample stamped after this tick: nothing new to say
        self.written_ms = max(self.written_ms, stamp_ms)
        return self._share(seen, values, stamp_ms)

    @property
    def unmatched(self) -> str | None:
        """Why the run, which never had a process among NVML's on this GPU while NVML listed only pids of another pid
        namespace (FOREIGN_READS reads or more), has no share: said at its end, never guessed while it may still start."""
        if self.used or self.foreign_reads < FOREIGN_READS:
            return None
        pids = ", ".join(map(str, sorted(self.foreign)[:5])) + (" ..." if len(self.foreign) > 5 else "")
        return (
            f"GPU {self.gpu}: none of the run's processes was among NVML's on it (pids {pids}, none of them in this pid "
            "namespace): the run did not use this GPU, or it ran in a container with its own pid namespace (NVML names the "
            "host's pids; run the container with --pid=host for the run's own share)"
        )

    def rows(self) -> list[ProcessRow]:
        """Each process on the GPU at the last read (those without an entry did not run since: 0)."""
        stamp_ms, values, on_gpu = self.last
        return [ProcessRow(self.gpu, pid, *values.get(pid, (0.0, 0.0)), stamp_ms) for pid in sorted(on_gpu | values.keys())]

    def _under_mps(self, seen: Seen, values: dict[int, tuple[float, float]]) -> bool:
        """The run's processes are MPS clients and NVML names their server instead (older drivers): no share of its own."""
        if seen.run_pids & values.keys() or not seen.run_pids & seen.gpu_pids:
            return False
        server = next((pid for pid in sorted(values) if is_mps_server(pid)), None)
        if server is None:
            return False
        self.reason = f"GPU {self.gpu}: the run's processes are MPS clients and NVML names the MPS server (pid {server}), not each client"
        return True

    def _share(self, seen: Seen, values: dict[int, tuple[float, float]], stamp_ms: int) -> Share:
        run_sm = sum(v[0] for pid, v in values.items() if pid in seen.run_pids)
        run_mem = sum(v[1] for pid, v in values.items() if pid in seen.run_pids)
        total_sm = sum(v[0] for v in values.values())
        power = None
        idle = self.idle.watts
        if seen.power_w is not None and idle is not None:
            owners = 1 + len((seen.gpu_pids | values.keys()) - seen.run_pids)
            power = power_estimate(seen.power_w, idle, run_sm, total_sm, owners)
        return Share(stamp_ms, min(100.0, run_sm), min(100.0, run_mem), power)


def open_share(gpu: int, handle, name: str) -> GpuShare | str:
    """The GPU's per-process reads, from now on (the ring's older samples are not the run's), or why NVML has none.

    The newer call where the driver has it, else the older; a call the GPU or driver lacks (NOT_SUPPORTED,
    FUNCTION_NOT_FOUND) is said once, here."""
    said = []
    for newer in (True, False):
        if not hasattr(pynvml, NEWER if newer else OLDER):
            continue
        try:
            found = read_entries(handle, 0, newer)
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) in NEVER:
                said.append(str(exc))
                continue
            found = []  # a passing error: the reads start from the ring's beginning
        return GpuShare(gpu, handle, newer, since_us=max((e.stamp_us for e in found), default=0))
    why = said[-1] if said else "this nvidia-ml-py has neither call"
    return f"GPU {gpu} ({name}): NVML gives no per-process utilization ({why})"
