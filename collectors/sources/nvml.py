"""GPU metrics through NVML, in-process (pynvml): the basics on every GPU, GPM on Hopper and newer.

GPM (GPU Performance Monitoring) gives the same SM activity/occupancy and engine ratios as
DCGM's profiling fields, without a daemon: two snapshots, a metric computed between them.
"""

from __future__ import annotations

import pynvml

from app.catalogue import GPM_METRICS, key
from collectors.sources.base import MetricSource, SamplingContext, SourceUnavailable

MB = 1e6
# Errors that mean "this call will never work on this GPU/driver": remembered, not retried every tick.
_NEVER = tuple(
    getattr(pynvml, name)
    for name in ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_ARGUMENT_VERSION_MISMATCH")
    if hasattr(pynvml, name)
)


def gpu_inventory() -> dict:
    """Driver and per-GPU facts (name, UUID, memory) for the run's artifacts; never raises."""
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no library
        return {"available": False, "reason": str(exc)}
    try:
        info = {"available": True, "driver": _text(pynvml.nvmlSystemGetDriverVersion()), "gpus": []}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            info["gpus"].append(
                {
                    "index": index,
                    "name": _text(pynvml.nvmlDeviceGetName(handle)),
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                    "memory_total_bytes": int(memory.total),
                    "gpm_supported": _gpm_supported(handle),
                }
            )
        return info
    except pynvml.NVMLError as exc:
        return {"available": False, "reason": str(exc)}
    finally:
        _shutdown()


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


def _gpm_supported(handle) -> bool:
    try:
        return bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except Exception:  # older driver or pynvml without GPM: treat as absent
        return False


class NvmlSource(MetricSource):
    name = "nvml"

    def __init__(self) -> None:
        self.handles: dict[int, object] = {}
        self.gpm: dict[int, bool] = {}
        self._gpm_prev: dict[int, object] = {}
        self._energy_base: dict[int, float] = {}
        self._unsupported: set[tuple[int, str]] = set()
        self._pids = lambda: []

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
        self.gpm = {i: _gpm_supported(h) for i, h in self.handles.items()}
        self._pids = ctx.pids

    def describe(self) -> dict:
        return {"gpm": {str(i): ok for i, ok in self.gpm.items()}}

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

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        pids = None
        for gpu, handle in self.handles.items():
            util = self._read(gpu, "util", pynvml.nvmlDeviceGetUtilizationRates, handle)
            if util is not None:
                out[key("utilization_percentage", gpu)] = float(util.gpu)
                out[key("memory_utilization_percentage", gpu)] = float(util.memory)
            memory = self._memory(gpu, handle)
            if memory is not None:
                out[key("memory_usage_megabytes", gpu)] = memory.used / MB
                if memory.total:
                    out[key("memory_usage_percentage", gpu)] = 100.0 * memory.used / memory.total
            power = self._read(gpu, "power", pynvml.nvmlDeviceGetPowerUsage, handle)
            if power is not None:
                out[key("power_usage_watts", gpu)] = power / 1000.0
                limit = self._read(gpu, "power_limit", pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
                if limit:
                    out[key("power_usage_percentage", gpu)] = 100.0 * power / limit
            energy = self._read(gpu, "energy", pynvml.nvmlDeviceGetTotalEnergyConsumption, handle)
            if energy is not None:
                base = self._energy_base.setdefault(gpu, float(energy))
                out[key("energy_joules", gpu)] = (energy - base) / 1000.0
            temp = self._read(gpu, "temp", pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
            if temp is not None:
                out[key("temperature_celsius", gpu)] = float(temp)
            clock = self._read(gpu, "sm_clock", pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
            if clock is not None:
                out[key("sm_clock_mhz", gpu)] = float(clock)
            pstate = self._read(gpu, "pstate", pynvml.nvmlDeviceGetPerformanceState, handle)
            if pstate is not None and pstate != pynvml.NVML_PSTATE_UNKNOWN:
                out[key("pstate", gpu)] = float(pstate)
            procs = self._read(gpu, "procs", pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
            if procs is not None:
                if pids is None:
                    pids = {p.pid for p in self._pids()}
                if pids:  # no run processes (radt monitor): nothing to attribute, no series of zeros
                    used = sum((p.usedGpuMemory or 0) for p in procs if p.pid in pids)
                    out[key("process_memory_megabytes", gpu)] = used / MB
            if self.gpm.get(gpu):
                out.update(self._sample_gpm(gpu, handle))
            else:  # GPM gives PCIe bytes itself; this call costs 20 ms of driver time per direction
                for direction, counter in (("tx", pynvml.NVML_PCIE_UTIL_TX_BYTES), ("rx", pynvml.NVML_PCIE_UTIL_RX_BYTES)):
                    kbps = self._read(gpu, f"pcie_{direction}", pynvml.nvmlDeviceGetPcieThroughput, handle, counter)
                    if kbps is not None:
                        out[key(f"pcie_{direction}_bytes_per_second", gpu)] = kbps * 1024.0
        return out

    def _sample_gpm(self, gpu: int, handle) -> dict[str, float]:
        """Take a GPM snapshot and compute every catalogue GPM metric against the previous one."""
        try:
            current = pynvml.nvmlGpmSampleAlloc()
        except pynvml.NVMLError:
            self._stop_gpm(gpu)
            return {}
        try:
            pynvml.nvmlGpmSampleGet(handle, current)
        except pynvml.NVMLError:  # e.g. MIG mode, where only per-instance samples work: fall back to the basics
            _free_sample(current)
            self._stop_gpm(gpu)
            return {}
        previous = self._gpm_prev.get(gpu)
        self._gpm_prev[gpu] = current
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
                    out[key(name, gpu)] = float(entry.value) * scale
        except pynvml.NVMLError:
            pass
        finally:
            pynvml.nvmlGpmSampleFree(previous)
        return out

    def _stop_gpm(self, gpu: int) -> None:
        """GPM failed on this GPU: sample the basics (PCIe included) from now on, and free its snapshot."""
        self.gpm[gpu] = False
        previous = self._gpm_prev.pop(gpu, None)
        if previous is not None:
            _free_sample(previous)

    def close(self) -> None:
        for sample in self._gpm_prev.values():
            _free_sample(sample)
        self._gpm_prev.clear()
        if self.handles:
            _shutdown()
        self.handles = {}
