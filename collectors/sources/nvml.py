"""GPU metrics through NVML, in-process (pynvml): the basics on every GPU, GPM on Hopper and newer.

GPM (GPU Performance Monitoring) gives the same SM activity/occupancy and engine ratios as
DCGM's profiling fields, without a daemon: two snapshots, a metric computed between them.

A MIG slice the run uses (`SamplingContext.slices`) is its own series, `system/gpu_0_mig_3_...`:
its memory through its MIG device handle, its activity through GPM per MIG instance
(nvmlGpmMigSampleGet). The GPU's basics (power, temperature, clocks) stay under the GPU's own keys:
they are physically the whole GPU's. Where a slice's own activity cannot be read (no GPM, as on
A100), `describe()` says why under "mig_activity" instead of passing the GPU's off as the slice's.

The run's own share of each whole GPU it uses (run_sm_utilization_percentage, run_memory_utilization_percentage and
run_power_watts, an estimate) comes from NVML's per-process utilization samples, read since the last read's newest and
written at their own timestamps (gpushare.py). On a MIG slice the slice is the run's: its share series are the slice's
own activity (GPM per instance: the graphics engine's busy time as run_sm_utilization_percentage, as NVML's smUtil is
the time a process's kernels ran; DRAM activity as run_memory_utilization_percentage), without a power estimate, as a
slice's share of the GPU's power would need every other slice's activity. Where there is no per-process figure,
`describe()` says why under "gpu_share" (the runner's radt.gpu_share tag: "device only").

Why the clocks are held down (the clock event reasons, split into the catalogue's three 0/1 series), the XID errors the
driver reports (an event set polled each tick without waiting) and the volatile ECC counts are the whole GPU's too. A
call the GPU does not support leaves its series out: never a 0 that looks like a reading.
"""

from __future__ import annotations

import ctypes
import functools

import pynvml

from radt.catalogue import GPM_METRICS, MetricName, clock_reason_series, key
from radt.collectors.sources.base import MetricSource, Reading, SamplingContext, SourceUnavailable
from radt.collectors.sources.gpus import Machine, NvmlUnavailable, gpm_supported, machine, mig_handle
from radt.collectors.sources.gpushare import NEVER, GpuShare, ProcessRow, Seen, open_share

MB = 1e6
MAX_EVENTS = 64  # events taken from the set in one tick at most: a storm of them never holds the tick up
ECC_COUNTS = (
    (MetricName.ECC_ERRORS_UNCORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
    (MetricName.ECC_ERRORS_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
)
_NEVER = NEVER  # errors that mean "this call will never work on this GPU/driver": remembered, not retried every tick


def gpu_inventory(found: Machine | None = None, watched: list[dict] | None = None) -> dict:
    """Driver, per-GPU facts (name, UUID, PCI bus id, memory, MIG devices) and the run's series ("watched") for its artifacts; never raises."""
    if found is None:
        try:
            found = machine()
        except NvmlUnavailable as exc:
            return {"available": False, "reason": str(exc)}
    gpus = []
    for gpu in found.gpus:
        migs = [m for m in found.migs if m.gpu == gpu.index]
        gpus.append(
            {
                "index": gpu.index,
                "name": gpu.name,
                "uuid": gpu.uuid,
                "pci_bus_id": gpu.pci_bus_id,
                "memory_total_bytes": gpu.memory_total_bytes,
                "gpm_supported": gpu.gpm_supported,
                "compute_capability": ".".join(map(str, gpu.compute_capability)) if gpu.compute_capability else None,
                "mig_mode": gpu.mig_mode,
                "mig_devices": [
                    {
                        "uuid": m.uuid,
                        "name": m.name,
                        "profile": m.profile,
                        "gpu_instance": m.gpu_instance,
                        "compute_instance": m.compute_instance,
                        "memory_total_bytes": m.memory_total_bytes,
                    }
                    for m in migs
                ],
            }
        )
    info = {"available": True, "driver": found.driver, "gpus": gpus}
    if watched is not None:
        info["watched"] = watched
    return info


def gpu_count() -> int | None:
    """How many GPUs NVML sees, or None where NVML cannot be loaded."""
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:  # a driver that loads but cannot enumerate: as good as none
        return None
    finally:
        _shutdown()


def _shutdown() -> None:
    try:
        pynvml.nvmlShutdown()
    except Exception:
        pass


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _free_sample(sample) -> None:
    try:
        pynvml.nvmlGpmSampleFree(sample)
    except Exception:
        pass


def _address(pointer) -> int | None:
    """A device handle's (or an event's device's) address: the same GPU whichever pointer object carries it."""
    return ctypes.cast(pointer, ctypes.c_void_p).value


@functools.cache
def _share_keys(gpu: int) -> tuple[str, str, str]:
    """The run's share series of a whole GPU (made once: every tick writes them)."""
    names = (MetricName.RUN_SM_UTILIZATION_PERCENTAGE, MetricName.RUN_MEMORY_UTILIZATION_PERCENTAGE, MetricName.RUN_POWER_WATTS)
    return tuple(key(name, gpu) for name in names)


def _slice_share(out: dict[str, float], gpu: int, gi: int) -> dict[str, float]:
    """A MIG slice's share series: the slice is the run's, so they are its own activity, in percent."""
    found = {}
    for share, activity in (
        (MetricName.RUN_SM_UTILIZATION_PERCENTAGE, MetricName.GR_ENGINE_ACTIVE),
        (MetricName.RUN_MEMORY_UTILIZATION_PERCENTAGE, MetricName.DRAM_ACTIVE),
    ):
        value = out.get(key(activity, gpu, mig=gi))
        if value is not None:
            found[key(share, gpu, mig=gi)] = 100.0 * value
    return found


def _free_events(events) -> None:
    try:
        pynvml.nvmlEventSetFree(events)
    except Exception:
        pass


class NvmlSource(MetricSource):
    name = "nvml"
    gives = "gpu"

    def __init__(self) -> None:
        self.handles: dict[int, object] = {}
        self.gpm: dict[int, bool] = {}
        self.slices: dict[tuple[int, int], object] = {}  # (GPU, GPU instance id) -> MIG device handle
        self.mig_gpm: dict[tuple[int, int], bool] = {}
        self.mig_activity: str | None = None  # why a slice's own activity is not recorded
        self._gpm_prev: dict[int | tuple[int, int], object] = {}
        self._energy_base: dict[int, float] = {}
        self._unsupported: set[tuple[int, str]] = set()
        self._pids = lambda: []
        self._events = None  # the event set the GPUs' XID errors come to
        self._xid_gpus: dict[int | None, int] = {}  # device handle address -> GPU, for the GPUs registered with it
        self.shares: dict[int, GpuShare] = {}  # per whole GPU: its per-process reads (gpushare.py)
        self._share_reasons: dict[str, str] = {}  # GPU (or GPU/slice) -> why it has no share series of the run's own
        self._reasons_at_open: frozenset[str] = frozenset()
        self._seen: dict[int, tuple[float | None, float | None, frozenset[int]]] = {}  # GPU -> this tick's power, util, pids on it
        self._run_pids: frozenset[int] = frozenset()

    def open(self, ctx: SamplingContext) -> None:
        try:
            pynvml.nvmlInit()
        except Exception as exc:
            raise SourceUnavailable(f"NVML cannot be loaded ({exc}); install the NVIDIA driver or drop 'nvml' from -l") from exc
        try:
            count = pynvml.nvmlDeviceGetCount()
            if count == 0:
                raise SourceUnavailable("NVML sees no GPU on this machine; drop 'nvml' from -l")
            indices = ctx.devices if ctx.devices is not None else list(range(count))
            indices = list(dict.fromkeys([*indices, *(gpu for gpu, _ in ctx.slices)]))  # a slice's GPU: its power, clocks
            missing = [i for i in indices if i >= count]
            if missing:
                raise SourceUnavailable(f"GPU {missing[0]} does not exist (this machine has {count}); pick -d from 0 to {count - 1}")
            self.handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices}
        except pynvml.NVMLError as exc:
            _shutdown()
            raise SourceUnavailable(f"NVML cannot list the GPUs ({exc}); check the driver with nvidia-smi") from exc
        except SourceUnavailable:
            _shutdown()
            raise
        self.gpm = {i: gpm_supported(h) for i, h in self.handles.items()}
        self._pids = ctx.pids
        for gpu, gi in ctx.slices:
            self._open_slice(gpu, gi)
        self._open_shares(ctx.slices)
        self._open_events()

    def _open_shares(self, slices: list[tuple[int, int]]) -> None:
        """Each whole GPU's per-process reads, or why it has none (said once); a GPU whose slices are watched has its
        slices' own activity instead (in MIG mode NVML has no per-process utilization)."""
        for gpu, gi in slices:
            if (gpu, gi) not in self.slices:
                self._share_reasons[f"{gpu}/{gi}"] = f"GPU {gpu} MIG slice {gi}: NVML has no such slice (radt.mig_activity says why)"
        for gpu, handle in self.handles.items():
            if gpu in {g for g, _ in slices}:
                continue
            name = _text(self._read(gpu, "name", pynvml.nvmlDeviceGetName, handle) or f"GPU {gpu}")
            opened = open_share(gpu, handle, name)
            if isinstance(opened, str):
                self._share_reasons[str(gpu)] = opened
            else:
                self.shares[gpu] = opened
        self.share_reason()  # a slice without its own activity too
        self._reasons_at_open = frozenset(self._share_reasons)

    def _open_events(self) -> None:
        """One event set for the GPUs' XID errors; a GPU that cannot register (NOT_SUPPORTED, no permission) has no xid_error series."""
        try:
            events = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError:
            return
        for gpu, handle in self.handles.items():
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, events)
            except pynvml.NVMLError:
                continue
            self._xid_gpus[_address(handle)] = gpu
        if self._xid_gpus:
            self._events = events
        else:
            _free_events(events)

    def _open_slice(self, gpu: int, gi: int) -> None:
        """Find the slice's MIG device and try a GPM snapshot of it; say why where its activity cannot be read."""
        parent = self.handles[gpu]
        name = _text(self._read(gpu, "name", pynvml.nvmlDeviceGetName, parent) or f"GPU {gpu}")
        whole = "the GPU-level series are the whole GPU's"
        handle = mig_handle(parent, gi)
        if handle is None:
            self.mig_activity = f"unavailable: GPU {gpu} ({name}) has no MIG instance {gi}; {whole}"
            return
        self.slices[(gpu, gi)] = handle
        self.mig_gpm[(gpu, gi)] = False
        if not self.gpm.get(gpu):
            self.mig_activity = f"unavailable: GPM per MIG instance not supported on {name}; {whole}"
            return
        try:
            sample = pynvml.nvmlGpmSampleAlloc()
        except pynvml.NVMLError as exc:
            self.mig_activity = f"unavailable: GPM per MIG instance failed on {name} ({exc}); {whole}"
            return
        try:
            pynvml.nvmlGpmMigSampleGet(parent, gi, sample)
        except pynvml.NVMLError as exc:
            _free_sample(sample)
            self.mig_activity = f"unavailable: GPM per MIG instance not supported on {name} ({exc}); {whole}"
            return
        _free_sample(sample)  # a probe: sampling starts at the first tick, as on a whole GPU
        self.mig_gpm[(gpu, gi)] = True

    def describe(self) -> dict:
        facts: dict = {"gpm": {str(i): ok for i, ok in self.gpm.items()}}
        if self.slices or self.mig_activity:
            facts["mig_gpm"] = {f"{gpu}/{gi}": ok for (gpu, gi), ok in self.mig_gpm.items()}
        if self.mig_activity:
            facts["mig_activity"] = self.mig_activity
        if self.share_reason():
            facts["gpu_share"] = self.share_reason()
        return facts

    def share_reason(self) -> str | None:
        """Why the run has no share series of its own on some GPU (the radt.gpu_share tag), or None."""
        for gpu, share in self.shares.items():
            if share.reason or share.unmatched:
                self._share_reasons.setdefault(str(gpu), share.reason or share.unmatched)
        for (gpu, gi), readable in self.mig_gpm.items():
            if not readable:
                why = f"GPU {gpu} MIG slice {gi}: the slice's own activity cannot be read (radt.mig_activity says why)"
                self._share_reasons.setdefault(f"{gpu}/{gi}", why)
        if not self._share_reasons:
            return None
        return "device only: " + "; ".join(self._share_reasons[where] for where in sorted(self._share_reasons))

    @property
    def share_found_later(self) -> bool:
        """A reason turned up while sampling (an MPS server NVML names, a call that stopped working): the tag is said again."""
        self.share_reason()
        return bool(set(self._share_reasons) - self._reasons_at_open)

    def process_rows(self) -> list[ProcessRow]:
        """Each process on each whole GPU at the last read, with its smUtil and memUtil (radt monitor's per-process gauges)."""
        return [row for share in self.shares.values() for row in share.rows()]

    def _read(self, gpu: int, what: str, call, *args):
        """One NVML call; a call the device does not support is remembered and not retried."""
        if (gpu, what) in self._unsupported:
            return None
        try:
            return call(*args)
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) in _NEVER:
                self._unsupported.add((gpu, what))
            return None

    def _memory(self, gpu: int, handle):
        """Memory in use as nvidia-smi's memory.used counts it.

        nvmlDeviceGetMemoryInfo v1's `used` is the allocated plus the driver/firmware-reserved
        memory, hundreds of MB more than nvidia-smi shows even on an idle GPU; v2 gives the reserved
        memory apart. v1 only where the driver has no v2 (older drivers).
        """
        version = getattr(pynvml, "nvmlMemory_v2", None)
        if version is not None and (gpu, "memory_v2") not in self._unsupported:
            memory = self._read(gpu, "memory_v2", pynvml.nvmlDeviceGetMemoryInfo, handle, version)
            if memory is not None or (gpu, "memory_v2") not in self._unsupported:
                return memory
        return self._read(gpu, "memory", pynvml.nvmlDeviceGetMemoryInfo, handle)

    def _clock_reasons(self, gpu: int, handle) -> int | None:
        """The clock event reasons bitmask; an older driver, without the newer call, answers the older one."""
        newer = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if newer is not None and (gpu, "clock_events") not in self._unsupported:
            reasons = self._read(gpu, "clock_events", newer, handle)
            if reasons is not None or (gpu, "clock_events") not in self._unsupported:
                return reasons
        return self._read(gpu, "clock_throttle", pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)

    def _new_xids(self) -> dict[int, float]:
        """The XID of the first error each registered GPU reported since the last tick, 0 where none; never waits (timeout 0)."""
        found = dict.fromkeys(self._xid_gpus.values(), 0.0)
        for _ in range(MAX_EVENTS if self._events is not None else 0):
            try:
                event = pynvml.nvmlEventSetWait(self._events, 0)
            except pynvml.NVMLError as exc:
                if getattr(exc, "value", None) in _NEVER:  # the set itself stopped working: no XID series from now on
                    _free_events(self._events)
                    self._events, self._xid_gpus = None, {}
                    return {}
                break  # NVML_ERROR_TIMEOUT: nothing (more) happened
            gpu = self._xid_gpus.get(_address(event.device))
            if gpu is not None and event.eventType & pynvml.nvmlEventTypeXidCriticalError and not found[gpu]:
                found[gpu] = float(event.eventData)
        return found

    def _health(self, gpu: int, handle) -> dict[str, float]:
        """Why the clocks are held down (three 0/1 series) and the volatile ECC counts, where the GPU answers."""
        out: dict[str, float] = {}
        reasons = self._clock_reasons(gpu, handle)
        if reasons is not None:
            out.update({key(name, gpu): on for name, on in clock_reason_series(reasons).items()})
        for name, kind in ECC_COUNTS:
            count = self._read(gpu, name, pynvml.nvmlDeviceGetTotalEccErrors, handle, kind, pynvml.NVML_VOLATILE_ECC)
            if count is not None:
                out[key(name, gpu)] = float(count)
        return out

    def readings(self, now_ms: int) -> list[Reading]:
        """The tick's values at the tick's time, and the run's share of each GPU at the times NVML sampled it."""
        out = super().readings(now_ms)
        for gpu, share in self.shares.items():
            power, util, on_gpu = self._seen.get(gpu, (None, None, frozenset()))
            try:
                got = share.read(Seen(now_ms, self._run_pids, on_gpu, power, util))
            except Exception as exc:  # the GPU's device series go on whatever the per-process reads do
                share.reason = f"GPU {gpu}: reading per-process utilization failed ({type(exc).__name__}: {exc})"
                got = None
            if share.reason:
                self._share_reasons.setdefault(str(gpu), share.reason)
            if got is None:
                continue
            sm_key, mem_key, power_key = _share_keys(gpu)
            out.append(Reading(sm_key, got.sm, got.stamp_ms))
            out.append(Reading(mem_key, got.mem, got.stamp_ms))
            if got.power is not None:
                out.append(Reading(power_key, got.power, got.stamp_ms))
        return out

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {key(MetricName.XID_ERROR, gpu): code for gpu, code in self._new_xids().items()}
        pids = self._run_pids = frozenset(p.pid for p in self._pids())
        self._seen = {}
        for gpu, handle in self.handles.items():
            util = self._read(gpu, "util", pynvml.nvmlDeviceGetUtilizationRates, handle)
            watts = None
            if util is not None:
                out[key(MetricName.UTILIZATION_PERCENTAGE, gpu)] = float(util.gpu)
                out[key(MetricName.MEMORY_UTILIZATION_PERCENTAGE, gpu)] = float(util.memory)
            memory = self._memory(gpu, handle)
            if memory is not None:
                out[key(MetricName.MEMORY_USAGE_MEGABYTES, gpu)] = memory.used / MB
                if memory.total:
                    out[key(MetricName.MEMORY_USAGE_PERCENTAGE, gpu)] = 100.0 * memory.used / memory.total
            power = self._read(gpu, "power", pynvml.nvmlDeviceGetPowerUsage, handle)
            if power is not None:
                watts = out[key(MetricName.POWER_USAGE_WATTS, gpu)] = power / 1000.0
                limit = self._read(gpu, "power_limit", pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
                if limit:
                    out[key(MetricName.POWER_USAGE_PERCENTAGE, gpu)] = 100.0 * power / limit
            energy = self._read(gpu, "energy", pynvml.nvmlDeviceGetTotalEnergyConsumption, handle)
            if energy is not None:
                base = self._energy_base.setdefault(gpu, float(energy))
                out[key(MetricName.ENERGY_JOULES, gpu)] = (energy - base) / 1000.0
            temp = self._read(gpu, "temp", pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
            if temp is not None:
                out[key(MetricName.TEMPERATURE_CELSIUS, gpu)] = float(temp)
            clock = self._read(gpu, "sm_clock", pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
            if clock is not None:
                out[key(MetricName.SM_CLOCK_MHZ, gpu)] = float(clock)
            pstate = self._read(gpu, MetricName.PSTATE, pynvml.nvmlDeviceGetPerformanceState, handle)
            if pstate is not None and pstate != pynvml.NVML_PSTATE_UNKNOWN:
                out[key(MetricName.PSTATE, gpu)] = float(pstate)
            out.update(self._health(gpu, handle))
            procs = self._read(gpu, "procs", pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
            if procs is not None and pids:  # no run processes (radt monitor): nothing to attribute, no series of zeros
                used = sum((p.usedGpuMemory or 0) for p in procs if p.pid in pids)
                out[key(MetricName.PROCESS_MEMORY_MEGABYTES, gpu)] = used / MB
            self._seen[gpu] = (watts, float(util.gpu) if util is not None else None, frozenset(p.pid for p in procs or ()))
            if self.gpm.get(gpu):
                out.update(self._sample_gpm(gpu, lambda sample, handle=handle: pynvml.nvmlGpmSampleGet(handle, sample), gpu))
            else:  # GPM gives PCIe bytes itself; this call costs 20 ms of driver time per direction
                for direction, counter in (("tx", pynvml.NVML_PCIE_UTIL_TX_BYTES), ("rx", pynvml.NVML_PCIE_UTIL_RX_BYTES)):
                    kbps = self._read(gpu, f"pcie_{direction}", pynvml.nvmlDeviceGetPcieThroughput, handle, counter)
                    if kbps is not None:
                        out[key(f"pcie_{direction}_bytes_per_second", gpu)] = kbps * 1024.0
        for (gpu, gi), handle in self.slices.items():
            out.update(self._sample_slice(gpu, gi, handle))
        return out

    def _sample_slice(self, gpu: int, gi: int, handle) -> dict[str, float]:
        """A MIG slice's own memory (its MIG device) and activity (GPM per instance), under its `mig=` keys."""
        out: dict[str, float] = {}
        memory = self._memory((gpu, gi), handle)
        if memory is not None:
            out[key(MetricName.MEMORY_USAGE_MEGABYTES, gpu, mig=gi)] = memory.used / MB
            if memory.total:
                out[key(MetricName.MEMORY_USAGE_PERCENTAGE, gpu, mig=gi)] = 100.0 * memory.used / memory.total
        if self.mig_gpm.get((gpu, gi)):
            parent = self.handles[gpu]
            out.update(self._sample_gpm((gpu, gi), lambda sample: pynvml.nvmlGpmMigSampleGet(parent, gi, sample), gpu, gi))
            if self._run_pids:
                out.update(_slice_share(out, gpu, gi))
        return out

    def _sample_gpm(self, slot: int | tuple[int, int], take, gpu: int, mig: int | None = None) -> dict[str, float]:
        """Take a GPM snapshot (`take(sample)`) and compute every catalogue GPM metric against the previous one."""
        try:
            current = pynvml.nvmlGpmSampleAlloc()
        except pynvml.NVMLError:
            self._stop_gpm(slot)
            return {}
        try:
            take(current)
        except pynvml.NVMLError:  # e.g. MIG mode, where only per-instance samples work: fall back to the basics
            _free_sample(current)
            self._stop_gpm(slot)
            return {}
        previous = self._gpm_prev.get(slot)
        self._gpm_prev[slot] = current
        if previous is None:
            return {}
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1 = previous
        request.sample2 = current
        for slot, metric_id in enumerate(GPM_METRICS):
            request.metrics[slot].metricId = metric_id
        out = {}
        try:
            pynvml.nvmlGpmMetricsGet(request)
            for slot, (name, scale) in enumerate(GPM_METRICS.values()):
                entry = request.metrics[slot]
                if entry.nvmlReturn == pynvml.NVML_SUCCESS:
                    out[key(name, gpu, mig=mig)] = float(entry.value) * scale
        except pynvml.NVMLError:
            pass
        finally:
            pynvml.nvmlGpmSampleFree(previous)
        return out

    def _stop_gpm(self, slot: int | tuple[int, int]) -> None:
        """GPM failed on this GPU (or MIG slice): sample the basics (PCIe included) from now on, and free its snapshot."""
        if isinstance(slot, tuple):
            self.mig_gpm[slot] = False
            self.mig_activity = (
                self.mig_activity or f"unavailable: GPM per MIG instance stopped working on GPU {slot[0]}; the GPU-level series are the whole GPU's"
            )
        else:
            self.gpm[slot] = False
        previous = self._gpm_prev.pop(slot, None)
        if previous is not None:
            _free_sample(previous)

    def close(self) -> None:
        self.share_reason()  # what the reads found, kept for the run's tag at its end
        for sample in self._gpm_prev.values():
            _free_sample(sample)
        self._gpm_prev.clear()
        if self._events is not None:  # before nvmlShutdown, while the library still knows the set
            _free_events(self._events)
        self._events, self._xid_gpus = None, {}
        if self.handles:
            _shutdown()
        self.handles = {}
        self.slices = {}
        self.shares = {}
