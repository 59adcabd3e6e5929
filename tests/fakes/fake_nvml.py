"""A fake NVML driver at the pynvml function boundary.

`FakeNvml` answers the pynvml functions radt calls (nvmlInit, nvmlDeviceGet*, nvmlGpm*, ...) for a
set of simulated GPUs, with the real pynvml's handle types, structs, constants and NVMLError
codes: handles are `c_nvmlDevice_t` pointers, GPM samples `c_nvmlGpmSample_t` pointers, memory
comes back as `c_nvmlMemory_t`, a missing counter raises `NVMLError(NVML_ERROR_NOT_SUPPORTED)`,
no driver raises `NVML_ERROR_LIBRARY_NOT_FOUND` from nvmlInit. Nothing above pynvml is faked.

The GPUs run a simulated load (0..1 per GPU, `set_load`) on a clock (`ManualClock` in unit
tests, the monotonic clock in subprocesses). GPM works like the hardware: a sample snapshots
cumulative activity counters, `nvmlGpmMetricsGet` divides the difference of two samples by the
time between them, so a metric is the load averaged over the interval, in percent (0-100).
The instantaneous basics follow the load too (see `_Gpu` for the exact formulas).

Spec of one GPU (JSON-friendly dict; every key optional except name):
    name, uuid, gpm (default: Hopper/Blackwell names), memory_total (bytes), memory_used (bytes),
    load (0..1), pstate (fixed P-state; 32 = NVML_PSTATE_UNKNOWN), power_limit_mw, idle_power_mw, energy_start_mj, pcie_kbps (at load 1),
    processes ([{"pid": int, "used": bytes or null, "sm": percent, "mem": percent}]: "sm"/"mem" the process's own
    load, see below), unsupported ([pynvml function names that raise NOT_SUPPORTED on this GPU]), gpm_unsupported
    ([GPM metric ids reported NOT_SUPPORTED]),
    process_loads_from (a file of "pid sm mem" lines, read at each query: processes a subprocess test starts, with their
    loads), mps_server (a pid: the processes run as MPS clients and NVML names this server for all of them, as drivers
    that do not split MPS clients do), process_sample_period (seconds between a process's utilization samples, 0.5),
    process_samples_kept (the ring's size, 1024),
    pci_bus_id ("00000000:07:00.0"; default one bus per index in index order, as NVML numbers GPUs),
    compute_capability ([major, minor]; default from the name: 9.0 Hopper, 10.0 Blackwell, 8.0 otherwise),
    cores (CUDA cores, nvmlDeviceGetNumGpuCores), multiprocessors (SMs), max_sm_clock_mhz (defaults
    from the name: H100 SXM and A100 SXM figures; see _MODELS), mig_capable (default: A100/A30/H100/
    H200/H800/B200 names; nvmlDeviceGetMigMode raises NOT_SUPPORTED otherwise),
    mig ([instance specs]: the GPU is in MIG mode with these MIG devices, in this order; [] = MIG mode
    without instances). One instance: gi (GPU instance id, nvidia-smi's "GI ID"), ci (default 0),
    profile ("1g.10gb"), uuid (default derived), load (0..1, the instance's own, for its GPM),
    memory_total, memory_used (bytes), multiprocessors, processes ([{"pid", "used"}] on this instance),
    processes_from (a file of pids, one a line, read at each query: a script writes its own pid there as it opens
    its CUDA context on the instance, since a subprocess test cannot know the pid beforehand),
    clock_reasons (the clock event reasons bitmask, nvmlClocksEventReason*; or [[seconds, bitmask], ...]: each from that
    many seconds after the fake starts; default: GpuIdle at load 0, none otherwise), ecc (ECC enabled; default: the
    MIG-capable datacenter names; off: nvmlDeviceGetTotalEccErrors raises NOT_SUPPORTED, as with ECC disabled),
    ecc_corrected, ecc_uncorrected (volatile counts), ecc_aggregate (added to both for the aggregate counters),
    event_types (the nvmlEventType* mask the GPU supports; default XID, P-state, clock, and ECC where ECC is on),
    xids ([[seconds, code], ...]: XID critical error events at those seconds after the fake starts).
Per-process utilization works as the driver's: each process with a load (`set_process_load`, the spec's "sm"/"mem",
process_loads_from) gets a sample every process_sample_period at its own moment in the period (one of 16, in the order
the processes came: two processes' samples do not share a stamp, as on a real GPU), stamped in microseconds since the epoch on the fake's clock,
in a ring of process_samples_kept. nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp) answers one
c_nvmlProcessUtilizationSample_t per process with samples newer than lastSeenTimeStamp (their mean, at the newest one's
stamp), NVML_ERROR_NOT_FOUND where none is newer; nvmlDeviceGetProcessesUtilizationInfo the same through the v1 struct
(c_nvmlProcessesUtilizationInfo_v1_t, procUtilArray of c_nvmlProcessUtilizationInfo_v1_t), FUNCTION_NOT_FOUND where
`lacks` names it (an older driver). Both raise NOT_SUPPORTED in MIG mode, on a MIG device, and where `unsupported`
names them. The device's utilization is never below the sum of its processes' (`load` rises to it).
Events work as the driver's: nvmlEventSetCreate, nvmlDeviceRegisterEvents (NOT_SUPPORTED for a type the GPU lacks), an
event reaches only the sets registered for it when it happens, nvmlEventSetWait hands one at a time as c_nvmlEventData_t
and raises NVML_ERROR_TIMEOUT when none is pending (at once: the fake's clock is the test's), nvmlEventSetFree.
In MIG mode, as on the hardware, the whole GPU's utilization and device-level GPM samples raise
NOT_SUPPORTED; the MIG devices are reached with nvmlDeviceGetMigDeviceHandleByIndex (NOT_FOUND past
the last one), their handles answer name ("<GPU name> MIG <profile>"), UUID, memory, attributes,
instance ids and their own compute processes (gpuInstanceId/computeInstanceId set; the parent's
handle lists every instance's), and nvmlGpmMigSampleGet(parent handle, gi, sample) snapshots one instance's activity.
Configuration: a list of GPU specs; or {"driver": "550.54.15", "gpus": [...], "lacks": [pynvml function names whose symbol the
driver's library lacks: NVML_ERROR_FUNCTION_NOT_FOUND, as an older driver answers]}; or None / "null"
(no NVML library: nvmlInit raises NVML_ERROR_LIBRARY_NOT_FOUND); or {"error": "driver_not_loaded"}.
"""

from __future__ import annotations

import ctypes
import json
import math
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable

DEFAULT_DRIVER = "550.54.15"
H100 = {"name": "NVIDIA H100 80GB HBM3", "gpm": True, "memory_total": 85899345920}
A100 = {"name": "NVIDIA A100-SXM4-40GB", "gpm": False, "memory_total": 42949672960}
GPM_NAMES = ("H100", "H200", "H800", "H20", "GH200", "B100", "B200", "GB200")
DGX_DISPLAY = {"name": "DGX Display", "gpm": False, "memory_total": 4294967296}


def dgx_station() -> list[dict]:
    """A DGX Station A100: four A100-SXM4-40GB and the "DGX Display" GPU, which NVML numbers 3 by its PCI
    bus id while CUDA, fastest first, numbers the A100s 0-3 (CUDA's 3 is NVML's 4) and the display 4."""
    buses = ("00000000:01:00.0", "00000000:47:00.0", "00000000:81:00.0", "00000000:C1:00.0", "00000000:C2:00.0")
    return [
        {**(DGX_DISPLAY if i == 3 else A100), "pci_bus_id": bus, "uuid": f"GPU-{'d15b1a70' if i == 3 else f'a100{i:04d}'}-5ee6-4c1e-9d1a-0000000000{i:02d}"}
        for i, bus in enumerate(buses)
    ]


def eight_h100() -> list[dict]:
    """An HGX H100 host: eight H100s in PCI order, one UUID prefix per GPU."""
    buses = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
    return [
        {**H100, "pci_bus_id": f"00000000:{bus}:00.0", "uuid": f"GPU-{i}{i}{i}{i}8a1c-0d4e-4f0b-8e6a-00000000000{i}", "load": 0.1 * (i + 1)}
        for i, bus in enumerate(buses)
    ]


def mig_gpu(base: dict, *instances: tuple[int, str, float], **overrides) -> dict:
    """`base` in MIG mode with MIG devices (GPU instance id, profile, load), UUIDs MIG-<gi>…; e.g. mig_gpu(H100, (1, "3g.40gb", 0.8))."""
    mig = [
        {"gi": gi, "profile": profile, "load": load, "uuid": f"MIG-{gi:08d}-{profile[0]}11a-5c3e-9a2b-{0x1000 + gi:012x}"} for gi, profile, load in instances
    ]
    return {**base, **overrides, "mig": mig}


# GPM activity metrics: percent = 100 * (base + slope * load). Attribute names of the real pynvml.
GPM_ACTIVITY = {
    "NVML_GPM_METRIC_GRAPHICS_UTIL": (0.10, 0.90),
    "NVML_GPM_METRIC_SM_UTIL": (0.0, 1.0),
    "NVML_GPM_METRIC_SM_OCCUPANCY": (0.0, 0.5),
    "NVML_GPM_METRIC_INTEGER_UTIL": (0.0, 0.2),
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": (0.0, 0.25),
    "NVML_GPM_METRIC_DFMA_TENSOR_UTIL": (0.0, 0.0),
    "NVML_GPM_METRIC_HMMA_TENSOR_UTIL": (0.0, 0.25),
    "NVML_GPM_METRIC_DMMA_TENSOR_UTIL": (0.0, 0.0),
    "NVML_GPM_METRIC_IMMA_TENSOR_UTIL": (0.0, 0.0),
    "NVML_GPM_METRIC_DRAM_BW_UTIL": (0.0, 0.4),
    "NVML_GPM_METRIC_FP64_UTIL": (0.0, 0.05),
    "NVML_GPM_METRIC_FP32_UTIL": (0.0, 0.3),
    "NVML_GPM_METRIC_FP16_UTIL": (0.0, 0.15),
}
# GPM throughput metrics in MiB/s at load 1 (linear in the load).
GPM_THROUGHPUT = {
    "NVML_GPM_METRIC_PCIE_TX_PER_SEC": 1000.0,
    "NVML_GPM_METRIC_PCIE_RX_PER_SEC": 3000.0,
    "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC": 0.0,
    "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC": 0.0,
}
_HANDLE_BASE = 0x7E57_0000
_MIG_HANDLE_STEP = 0x10  # a MIG device's handle: its GPU's handle + 0x10 * (1 + its MIG device index)
_SAMPLE_BASE = 0x5A3D_0000
_EVENT_SET_BASE = 0xE7E7_0000
NO_INSTANCE = 0xFFFFFFFF  # an event's gpuInstanceId/computeInstanceId when no MIG instance is named
# name fragment -> (compute capability, CUDA cores, SMs, max SM clock MHz); the first match wins
_MODELS = (
    ("H100", ((9, 0), 16896, 132, 1980)),
    ("H200", ((9, 0), 16896, 132, 1980)),
    ("H800", ((9, 0), 16896, 132, 1980)),
    ("GH200", ((9, 0), 16896, 132, 1980)),
    ("B200", ((10, 0), 18944, 148, 1965)),
    ("A100", ((8, 0), 6912, 108, 1410)),
    ("A30", ((8, 0), 3584, 56, 1440)),
    ("RTX 4090", ((8, 9), 16384, 128, 2520)),
    ("DGX Display", ((7, 5), 896, 14, 1725)),
)
_DEFAULT_MODEL = ((8, 0), 8192, 64, 1800)
MIG_CAPABLE = ("A100", "A30", "H100", "H200", "H800", "GH200", "B200")
MAX_MIG_DEVICES = 7


class ManualClock:
    """A clock the test moves: `clock.advance(1.5)`."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class _Gpu:
    """One simulated GPU: its spec, its load, and counters integrated over the clock."""

    def __init__(self, index: int, spec: dict, now: float) -> None:
        name = spec["name"]
        self.index = index
        self.name = name
        self.uuid = spec.get("uuid", f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'radt-fake-gpu/{index}/{name}')}")
        self.gpm = bool(spec.get("gpm", any(tag in name for tag in GPM_NAMES)))
        self.memory_total = int(spec.get("memory_total", 85899345920 if self.gpm else 42949672960))
        self.memory_used = spec.get("memory_used")  # None: 512 MiB plus the processes' memory
        self.load = self.base_load = float(spec.get("load", 0.5))  # load: never below its processes' sum (sync_load)
        self.power_limit_mw = int(spec.get("power_limit_mw", 700000 if self.gpm else 400000))
        self.idle_power_mw = int(spec.get("idle_power_mw", 60000))
        self.pcie_kbps = float(spec.get("pcie_kbps", 2_000_000.0))
        self.pstate = spec.get("pstate")  # None: P0 under load, P8 idle
        self.processes = [(int(p["pid"]), p.get("used")) for p in spec.get("processes", [])]
        self.unsupported = set(spec.get("unsupported", []))
        self.gpm_unsupported = {int(m) for m in spec.get("gpm_unsupported", [])}
        self.pci_bus_id = spec.get("pci_bus_id", f"00000000:{0x07 + 0x08 * index:02X}:00.0")
        model = next((m for fragment, m in _MODELS if fragment in name), _DEFAULT_MODEL)
        self.compute_capability = tuple(spec.get("compute_capability", model[0]))
        self.cores = int(spec.get("cores", model[1]))
        self.multiprocessors = int(spec.get("multiprocessors", model[2]))
        self.max_sm_clock_mhz = int(spec.get("max_sm_clock_mhz", model[3]))
        self.mig_capable = bool(spec.get("mig_capable", any(tag in name for tag in MIG_CAPABLE)))
        self.mig_mode = "mig" in spec
        self.start = now
        self.clock_reasons = spec.get("clock_reasons")  # None: GpuIdle at load 0, none otherwise
        self.ecc = bool(spec.get("ecc", self.mig_capable))
        self.ecc_counts = {"corrected": int(spec.get("ecc_corrected", 0)), "uncorrected": int(spec.get("ecc_uncorrected", 0))}
        self.ecc_aggregate = int(spec.get("ecc_aggregate", 0))
        self.event_types = spec.get("event_types")  # None: FakeNvml fills the default in from pynvml's constants
        self.xids = sorted((now + float(at), int(code)) for at, code in spec.get("xids", []))  # (when, XID) not happened yet
        self.t = now
        self.mig = [_MigInstance(index, slot, self, instance, now) for slot, instance in enumerate(spec.get("mig") or [])]
        self.load_seconds = 0.0  # integral of load over time
        self.energy_mj = float(spec.get("energy_start_mj", 1_265_183_027 + 1_000_000 * index))
        loaded = [p for p in spec.get("processes", []) if "sm" in p or "mem" in p]
        self.process_loads = {int(p["pid"]): (float(p.get("sm", 0)), float(p.get("mem", 0))) for p in loaded}
        self.process_loads_from = spec.get("process_loads_from")
        self.mps_server = spec.get("mps_server")
        self.sample_period = float(spec.get("process_sample_period", 0.5))
        self.ring: deque[tuple[int, int, int, int]] = deque(maxlen=int(spec.get("process_samples_kept", 1024)))  # (stamp us, pid, sm, mem)
        self.ring_to = now  # the ring holds every sample up to this time
        self.epoch = time.time() - now  # the fake's clock + epoch = seconds since the epoch, NVML's stamps
        self.handed: Counter = Counter()  # (stamp us, pid) of a ring sample -> the answers it was in
        self.phases: dict[int, int] = {}  # pid -> its slot in the sample period, in the order the processes came
        self.sync_load()

    def advance(self, now: float) -> None:
        dt = now - self.t
        if dt > 0:
            self.load_seconds += self.load * dt
            self.energy_mj += self.power_mw() * dt  # mW * s = mJ
            self.t = now
        for instance in self.mig:
            instance.advance(now)

    def reasons(self, now: float) -> int:
        """The clock event reasons bitmask at `now`: a fixed one, the step of a timeline, or GpuIdle while idle."""
        if isinstance(self.clock_reasons, list):
            steps = [int(mask) for at, mask in self.clock_reasons if self.start + float(at) <= now]
            return steps[-1] if steps else 0
        if self.clock_reasons is not None:
            return int(self.clock_reasons)
        return 0x1 if self.load == 0 else 0  # nvmlClocksEventReasonGpuIdle

    def power_mw(self) -> float:
        return self.idle_power_mw + (self.power_limit_mw * 0.8 - self.idle_power_mw) * self.load

    def used_bytes(self) -> int:
        if self.memory_used is not None:
            return int(self.memory_used)
        return 512 * 1024 * 1024 + sum(int(used or 0) for _, used in self.processes)

    def loads(self) -> dict[int, tuple[float, float]]:
        """Each process's (smUtil, memUtil): the spec's and set_process_load's, then process_loads_from's lines."""
        found = dict(self.process_loads)
        try:
            with open(self.process_loads_from or "", encoding="utf-8") as lines:
                for line in lines.read().splitlines():
                    parts = line.split()
                    if len(parts) == 3 and parts[0].isdigit():
                        found[int(parts[0])] = (float(parts[1]), float(parts[2]))
        except OSError:
            pass
        return found

    def running(self) -> list[tuple[int, int | None]]:
        """Its processes: the spec's, and those process_loads_from names."""
        listed = {pid for pid, _ in self.processes}
        return list(self.processes) + [(pid, None) for pid in self.loads() if pid not in listed]

    def sync_load(self) -> None:
        """The GPU is at least as busy as its processes together (a process's smUtil is its share of the GPU's time)."""
        total = sum(sm for sm, _ in self.loads().values())
        self.load = max(self.base_load, min(1.0, total / 100.0))

    def fill(self, now: float) -> None:
        """Each process's samples from the ring's end up to `now`, one a period at its own moment in it; under MPS one
        sample a period for the server, the clients' loads summed."""
        loads = self.loads()
        if self.mps_server is not None and loads:
            loads = {int(self.mps_server): (sum(v[0] for v in loads.values()), sum(v[1] for v in loads.values()))}
        new = []
        for pid, (sm, mem) in loads.items():
            if sm <= 0 and mem <= 0:  # NVML lists only processes that ran
                continue
            slot = self.phases.setdefault(pid, len(self.phases))  # the process's own moment in the period, kept for good
            phase = self.sample_period * (slot % 16 + 1) / 17
            t = (math.floor((self.ring_to - phase) / self.sample_period) + 1) * self.sample_period + phase
            while t <= now:
                new.append((round((t + self.epoch) * 1e6), pid, round(min(sm, 100)), round(min(mem, 100))))
                t += self.sample_period
        self.ring.extend(sorted(new))
        self.ring_to = max(self.ring_to, now)

    def process_entries(self, since_us: int) -> list[tuple[int, int, int, int]]:
        """(pid, stamp us, smUtil, memUtil) per process over its samples newer than `since_us`, as the driver answers."""
        grouped: dict[int, list[tuple[int, int, int, int]]] = {}
        for sample in reversed(self.ring):  # the ring is in time order: the newer samples at its end
            if sample[0] <= since_us:
                break
            grouped.setdefault(sample[1], []).append(sample)
            self.handed[(sample[0], sample[1])] += 1
        return [
            (pid, max(s[0] for s in got), round(sum(s[2] for s in got) / len(got)), round(sum(s[3] for s in got) / len(got)))
            for pid, got in sorted(grouped.items())
        ]


class _MigInstance:
    """One MIG device (a GPU instance with its compute instance) of a GPU in MIG mode, with its own load."""

    def __init__(self, gpu_index: int, slot: int, gpu: _Gpu, spec: dict, now: float) -> None:
        self.gpu_index = gpu_index
        self.slot = slot  # its MIG device index (nvmlDeviceGetMigDeviceHandleByIndex)
        self.gi = int(spec["gi"])
        self.ci = int(spec.get("ci", 0))
        self.profile = spec.get("profile", "1g.10gb")
        self.name = f"{gpu.name} MIG {self.profile}"
        self.uuid = spec.get("uuid", f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'radt-fake-mig/{gpu_index}/{gpu.name}/{self.gi}/{self.ci}')}")
        self.load = float(spec.get("load", 0.5))
        self.memory_total = int(spec.get("memory_total", 10 * 1024**3))
        self.memory_used = int(spec.get("memory_used", 64 * 1024 * 1024))
        self.multiprocessors = int(spec.get("multiprocessors", 16))
        self.processes = [(int(p["pid"]), p.get("used")) for p in spec.get("processes", [])]
        self.processes_from = spec.get("processes_from")
        self.t = now
        self.load_seconds = 0.0

    def running(self) -> list[tuple[int, int | None]]:
        """Its processes: the spec's, and the pids written to `processes_from` so far."""
        found = list(self.processes)
        try:
            with open(self.processes_from or "", encoding="utf-8") as pids:
                found += [(int(line), None) for line in pids.read().split() if line.isdigit()]
        except OSError:
            pass
        return found

    def advance(self, now: float) -> None:
        dt = now - self.t
        if dt > 0:
            self.load_seconds += self.load * dt
            self.t = now


class _EventSet:
    """One nvmlEventSet_t: the GPUs registered with it (index -> (event type mask, when)), and its pending events."""

    def __init__(self) -> None:
        self.registered: dict[int, tuple[int, float]] = {}
        self.pending: deque[tuple[int, int, int]] = deque()  # (GPU index, event type, event data)

    def offer(self, index: int, event_type: int, data: int, when: float) -> None:
        """An event that happened at `when`: kept where this set was registered for its type by then."""
        mask, since = self.registered.get(index, (0, when))
        if mask & event_type and since <= when:
            self.pending.append((index, event_type, data))


class FakeNvml:
    """Simulated GPUs behind pynvml's function entry points; `functions()` gives them by name."""

    def __init__(
        self, gpus: list[dict] | None, nvml=None, driver: str = DEFAULT_DRIVER, clock: Callable[[], float] = time.monotonic, error: int | None = None
    ) -> None:
        if nvml is None:
            import pynvml as nvml
        self.nvml = nvml
        self.clock = clock
        self.driver = driver
        self.library = gpus is not None  # False: libnvidia-ml.so.1 cannot be loaded
        self.init_error = error
        now = clock()
        self.gpus = [_Gpu(i, spec, now) for i, spec in enumerate(gpus or [])]
        self.refcount = 0
        self.calls: Counter = Counter()  # (function name, gpu index or None) -> calls
        self.samples: dict[int, tuple[int, float, float] | None] = {}  # live GPM samples by address
        self._next_sample = _SAMPLE_BASE
        self._lock = threading.RLock()
        self._gpm_ids = {getattr(nvml, name): coef for name, coef in GPM_ACTIVITY.items()}
        self._gpm_rates = {getattr(nvml, name): rate for name, rate in GPM_THROUGHPUT.items()}
        self.lacks: set[str] = set()  # functions the driver's library has no symbol for
        self.event_sets: dict[int, _EventSet] = {}  # live event sets by address
        self._next_event_set = _EVENT_SET_BASE
        self.wait_timeouts: list[int] = []  # the timeout (ms) of every nvmlEventSetWait call
        for gpu in self.gpus:
            if gpu.event_types is None:
                ecc = nvml.nvmlEventTypeSingleBitEccError | nvml.nvmlEventTypeDoubleBitEccError if gpu.ecc else 0
                gpu.event_types = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypePState | nvml.nvmlEventTypeClock | ecc

    # --- configuration -------------------------------------------------------------------

    @classmethod
    def from_config(cls, config, nvml=None, clock: Callable[[], float] = time.monotonic) -> FakeNvml:
        """Build from JSON text or its parsed value (see the module docstring)."""
        if isinstance(config, str):
            config = json.loads(config) if config.strip() else None
        if config is None:
            return cls(None, nvml=nvml, clock=clock)
        if isinstance(config, list):
            return cls(config, nvml=nvml, clock=clock)
        nvml_module = nvml
        if nvml_module is None:
            import pynvml as nvml_module
        error = config.get("error")
        code = getattr(nvml_module, f"NVML_ERROR_{error.upper()}") if error else None
        fake = cls(config.get("gpus", []), nvml=nvml, clock=clock, driver=config.get("driver", DEFAULT_DRIVER), error=code)
        fake.lack(*config.get("lacks", []))
        return fake

    def set_load(self, index: int, load: float, gi: int | None = None) -> None:
        """The load of GPU `index` (never below its processes' sum), or of its MIG instance with GPU instance id `gi`."""
        with self._lock:
            gpu = self.gpus[index]
            gpu.advance(self.clock())
            if gi is None:
                gpu.base_load = float(load)
                gpu.sync_load()
            else:
                next(i for i in gpu.mig if i.gi == gi).load = float(load)

    def set_processes(self, index: int, processes: list[tuple[int, int | None]]) -> None:
        with self._lock:
            self.gpus[index].processes = list(processes)

    def set_process_load(self, index: int, pid: int, sm: float, mem: float = 0.0) -> None:
        """Process `pid` on GPU `index` from now on runs kernels `sm` % of the time and keeps the memory controller busy
        `mem` % (0, 0: it stops running); it holds a context there (listed by nvmlDeviceGetComputeRunningProcesses)."""
        with self._lock:
            gpu = self.gpus[index]
            now = self.clock()
            gpu.advance(now)
            gpu.fill(now)  # the samples so far at the loads so far
            gpu.process_loads[int(pid)] = (float(sm), float(mem))
            if all(p != int(pid) for p, _ in gpu.processes):
                gpu.processes.append((int(pid), None))
            gpu.sync_load()

    def process_samples(self, index: int) -> list[tuple[int, int, int, int]]:
        """GPU `index`'s ring up to now: (stamp us, pid, smUtil, memUtil), oldest first."""
        with self._lock:
            gpu = self.gpus[index]
            gpu.fill(self.clock())
            return list(gpu.ring)

    def set_unsupported(self, index: int, *functions: str) -> None:
        with self._lock:
            self.gpus[index].unsupported.update(functions)

    def lack(self, *functions: str) -> None:
        """The driver's library has no symbol for these functions (an older driver): NVML_ERROR_FUNCTION_NOT_FOUND."""
        with self._lock:
            self.lacks.update(functions)

    def set_clock_reasons(self, index: int, bitmask: int) -> None:
        """GPU `index`'s clock event reasons from now on (nvmlClocksEventReason* bits)."""
        with self._lock:
            self.gpus[index].clock_reasons = int(bitmask)

    def inject_xid(self, index: int, code: int) -> None:
        """An XID critical error on GPU `index` now, delivered to the event sets registered for it."""
        with self._lock:
            self._happen(index, self.nvml.nvmlEventTypeXidCriticalError, int(code), self.clock())

    def add_ecc_errors(self, index: int, corrected: int = 0, uncorrected: int = 0) -> None:
        """More ECC errors on GPU `index`: its volatile (and aggregate) counts rise."""
        with self._lock:
            counts = self.gpus[index].ecc_counts
            counts["corrected"] += int(corrected)
            counts["uncorrected"] += int(uncorrected)

    def count(self, function: str, index: int | None = None) -> int:
        """How often `function` was called (for one GPU, or in all)."""
        if index is not None:
            return self.calls[(function, index)]
        return sum(n for (name, _), n in self.calls.items() if name == function)

    # --- plumbing ------------------------------------------------------------------------

    def functions(self) -> dict[str, Callable]:
        """Every pynvml entry point this fake answers, by its pynvml name."""
        return {name: getattr(self, name) for name in dir(self) if name.startswith("nvml") and callable(getattr(self, name))}

    def install(self, module, setattr_: Callable = setattr) -> None:
        """Replace the entry points on `module` (pass monkeypatch.setattr in tests)."""
        for name, function in self.functions().items():
            if not hasattr(self.nvml, name):
                raise AttributeError(f"the real pynvml has no {name}; the fake must not invent entry points")
            setattr_(module, name, function)

    def _error(self, code: int):
        return self.nvml.NVMLError(code)

    def _enter(self, function: str, index: int | None = None) -> None:
        self.calls[(function, index)] += 1
        if self.refcount <= 0:
            raise self._error(self.nvml.NVML_ERROR_UNINITIALIZED)
        if function in self.lacks:
            raise self._error(self.nvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def _device(self, function: str, handle) -> tuple[_Gpu, _MigInstance | None]:
        """The GPU behind a GPU or MIG device handle (and the MIG device), advanced to now; NOT_SUPPORTED where its spec says so."""
        if not isinstance(handle, self.nvml.c_nvmlDevice_t):
            self._enter(function)
            raise self._error(self.nvml.NVML_ERROR_INVALID_ARGUMENT)
        address = ctypes.cast(handle, ctypes.c_void_p).value or 0
        index, offset = divmod(address - _HANDLE_BASE, 0x100)
        slot, rest = divmod(offset, _MIG_HANDLE_STEP)
        gpu = self.gpus[index] if 0 <= index < len(self.gpus) and address >= _HANDLE_BASE else None
        if gpu is None or rest or (slot and slot > len(gpu.mig)):
            self._enter(function)
            raise self._error(self.nvml.NVML_ERROR_INVALID_ARGUMENT)
        self._enter(function, index)
        if function in gpu.unsupported:
            raise self._error(self.nvml.NVML_ERROR_NOT_SUPPORTED)
        gpu.advance(self.clock())
        if gpu.process_loads_from:  # a subprocess test's processes come and go: the load follows them
            gpu.sync_load()
        return gpu, gpu.mig[slot - 1] if slot else None

    def _gpu(self, function: str, handle) -> _Gpu:
        """The GPU behind a GPU handle; a MIG device handle gets NOT_SUPPORTED (the call is about the whole GPU)."""
        gpu, instance = self._device(function, handle)
        if instance is not None:
            raise self._error(self.nvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _handle(self, index: int, slot: int | None = None):
        offset = 0 if slot is None else _MIG_HANDLE_STEP * (slot + 1)
        return ctypes.cast(ctypes.c_void_p(_HANDLE_BASE + index * 0x100 + offset), self.nvml.c_nvmlDevice_t)

    # --- library -------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
        with self._lock:
            self.calls[("nvmlInit", None)] += 1
            if not self.library:
                raise self._error(self.nvml.NVML_ERROR_LIBRARY_NOT_FOUND)
            if self.init_error is not None:
                raise self._error(self.init_error)
            self.refcount += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            self.calls[("nvmlShutdown", None)] += 1
            if not self.library:
                raise self._error(self.nvml.NVML_ERROR_UNINITIALIZED)
            if self.refcount <= 0:
                raise self._error(self.nvml.NVML_ERROR_UNINITIALIZED)
            self.refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        with self._lock:
            self._enter("nvmlSystemGetDriverVersion")
            return self.driver

    def nvmlDeviceGetCount(self) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetCount")
            return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int):
        with self._lock:
            self._enter("nvmlDeviceGetHandleByIndex")
            if not 0 <= int(index) < len(self.gpus):
                raise self._error(self.nvml.NVML_ERROR_INVALID_ARGUMENT)
            return self._handle(int(index))

    # --- device facts and basics ---------------------------------------------------------

    def nvmlDeviceGetName(self, handle) -> str:
        with self._lock:
            gpu, instance = self._device("nvmlDeviceGetName", handle)
            return (instance or gpu).name

    def nvmlDeviceGetUUID(self, handle) -> str:
        with self._lock:
            gpu, instance = self._device("nvmlDeviceGetUUID", handle)
            return (instance or gpu).uuid

    def nvmlDeviceGetPciInfo_v3(self, handle):
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetPciInfo_v3", handle)
            domain, bus, rest = gpu.pci_bus_id.split(":")
            info = self.nvml.nvmlPciInfo_t()
            info.busId = gpu.pci_bus_id.encode()
            info.busIdLegacy = gpu.pci_bus_id[-16:].encode()
            info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
            info.pciDeviceId = 0x233010DE if gpu.gpm else 0x20B010DE
            return info

    def nvmlDeviceGetPciInfo(self, handle):
        return self.nvmlDeviceGetPciInfo_v3(handle)  # as the real pynvml does

    def nvmlDeviceGetCudaComputeCapability(self, handle) -> tuple[int, int]:
        with self._lock:
            gpu, _ = self._device("nvmlDeviceGetCudaComputeCapability", handle)
            return (int(gpu.compute_capability[0]), int(gpu.compute_capability[1]))

    def nvmlDeviceGetNumGpuCores(self, handle) -> int:
        with self._lock:
            return self._gpu("nvmlDeviceGetNumGpuCores", handle).cores

    def nvmlDeviceGetMaxClockInfo(self, handle, clock_type: int) -> int:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetMaxClockInfo", handle)
            if clock_type in (self.nvml.NVML_CLOCK_SM, self.nvml.NVML_CLOCK_GRAPHICS):
                return gpu.max_sm_clock_mhz
            if clock_type == self.nvml.NVML_CLOCK_MEM:
                return 2619
            raise self._error(self.nvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetAttributes_v2(self, handle):
        """NVML says: this API currently only supports MIG device handles."""
        with self._lock:
            gpu, instance = self._device("nvmlDeviceGetAttributes_v2", handle)
            if instance is None:
                raise self._error(self.nvml.NVML_ERROR_NOT_SUPPORTED)
            attrs = self.nvml.c_nvmlDeviceAttributes()
            attrs.multiprocessorCount = instance.multiprocessors
            attrs.gpuInstanceSliceCount = attrs.computeInstanceSliceCount = int(instance.profile.split("g")[0])
            attrs.memorySizeMB = instance.memory_total // (1024 * 1024)
            return attrs

    def nvmlDeviceGetAttributes(self, handle):
        return self.nvmlDeviceGetAttributes_v2(handle)  # as the real pynvml does

    # --- MIG ----------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle) -> list[int]:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetMigMode", handle)
            if not gpu.mig_capable:
                raise self._error(self.nvml.NVML_ERROR_NOT_SUPPORTED)
            mode = self.nvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_mode else self.nvml.NVML_DEVICE_MIG_DISABLE
            return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle) -> int:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetMaxMigDeviceCount", handle)
            return MAX_MIG_DEVICES if gpu.mig_capable else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index: int):
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", handle)
            if not gpu.mig_mode:
                raise self._error(self.nvml.NVML_ERROR_NOT_SUPPORTED if not gpu.mig_capable else self.nvml.NVML_ERROR_INVALID_ARGUMENT)
            if not 0 <= int(index) < MAX_MIG_DEVICES:
                raise self._error(self.nvml.NVML_ERROR_INVALID_ARGUMENT)
            if int(index) >= len(gpu.mig):
                raise self._error(self.nvml.NVML_ERROR_NOT_FOUND)
            return self._handle(gpu.index, int(index))

    def nvmlDeviceIsMigDeviceHandle(self, handle):
        with self._lock:
            _, instance = self._device("nvmlDeviceIsMigDeviceHandle", handle)
            return ctypes.c_uint(1 if instance is not None else 0)  # the real pynvml returns the c_uint itself

    def _instance(self, function: str, handle) -> _MigInstance:
        _, instance = self._device(function, handle)
        if instance is None:
            raise self._error(self.nvml.NVML_ERROR_NOT_SUPPORTED)
        return instance

    def nvmlDeviceGetGpuInstanceId(self, handle) -> int:
        with self._lock:
            return self._instance("nvmlDeviceGetGpuInstanceId", handle).gi

    def nvmlDeviceGetComputeInstanceId(self, handle) -> int:
        with self._lock:
            return self._instance("nvmlDeviceGetComputeInstanceId", handle).ci

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle):
        with self._lock:
            instance = self._instance("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
            return self._handle(instance.gpu_index)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        with self._lock:
            gpu, instance = self._device("nvmlDeviceGetMemoryInfo", handle)
            if instance is not None:
                total, used = instance.memory_total, min(instance.memory_used, instance.memory_total)
            else:
                total, used = gpu.memory_total, min(gpu.used_bytes(), gpu.memory_total)
            if version:
                info = self.nvml.c_nvmlMemory_v2_t()
                info.version = version
                info.reserved = 0
            else:
                info = self.nvml.c_nvmlMemory_t()
            info.total, info.used, info.free = total, used, total - used
            return info

    def nvmlDeviceGetUtilizationRates(self, handle):
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
            if gpu.mig_mode:  # nvidia-smi shows N/A: a GPU in MIG mode has no whole-GPU utilization
                raise self._error(self.nvml.NVML_ERROR_NOT_SUPPORTED)
            util = self.nvml.c_nvmlUtilization_t()
            util.gpu = round(100 * gpu.load)
            util.memory = round(min(100.0, max(40 * gpu.load, sum(mem for _, mem in gpu.loads().values()))))
            return util

    def nvmlDeviceGetPowerUsage(self, handle) -> int:
        with self._lock:
            return int(round(self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw()))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle) -> int:
        with self._lock:
            return self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle) -> int:
        with self._lock:
            return int(self._gpu("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj)

    def nvmlDeviceGetTemperature(self, handle, sensor: int) -> int:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetTemperature", handle)
            if sensor != self.nvml.NVML_TEMPERATURE_GPU:
                raise self._error(self.nvml.NVML_ERROR_INVALID_ARGUMENT)
            return int(round(30 + 40 * gpu.load))

    def nvmlDeviceGetClockInfo(self, handle, clock_type: int) -> int:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
            nvml = self.nvml
            if clock_type in (nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_GRAPHICS):
                return int(round(345 + (1980 - 345) * gpu.load))
            if clock_type == nvml.NVML_CLOCK_MEM:
                return 2619
            if clock_type == nvml.NVML_CLOCK_VIDEO:
                return 1155
            raise self._error(nvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetPerformanceState(self, handle) -> int:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetPerformanceState", handle)
            if gpu.pstate is not None:
                return int(gpu.pstate)
            return self.nvml.NVML_PSTATE_0 if gpu.load > 0 else self.nvml.NVML_PSTATE_8

    def nvmlDeviceGetComputeRunningProcesses(self, handle) -> list:
        with self._lock:
            gpu, instance = self._device("nvmlDeviceGetComputeRunningProcesses", handle)
            listed = [(pid, used, None) for pid, used in gpu.running()] if instance is None else []
            for mig in [instance] if instance is not None else gpu.mig:  # a MIG device's own; the parent's: every instance's
                listed += [(pid, used, mig) for pid, used in mig.running()]
            out = []
            for pid, used, mig in listed:
                info = self.nvml.c_nvmlProcessInfo_t()
                info.pid = pid
                info.usedGpuMemory = self.nvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value if used is None else int(used)
                info.gpuInstanceId, info.computeInstanceId = (mig.gi, mig.ci) if mig is not None else (0xFFFFFFFF, 0xFFFFFFFF)
                obj = self.nvml.nvmlStructToFriendlyObject(info)
                if obj.usedGpuMemory == self.nvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                    obj.usedGpuMemory = None  # what pynvml does for WDDM and MIG without permission
                out.append(obj)
            return out

    def nvmlDeviceGetPcieThroughput(self, handle, counter: int) -> int:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetPcieThroughput", handle)
            if counter == self.nvml.NVML_PCIE_UTIL_TX_BYTES:
                return int(round(gpu.pcie_kbps * gpu.load))
            if counter == self.nvml.NVML_PCIE_UTIL_RX_BYTES:
                return int(round(2 * gpu.pcie_kbps * gpu.load))
            raise self._error(self.nvml.NVML_ERROR_INVALID_ARGUMENT)

    # --- per-process utilization ---------------------------------------------------------

    def _per_process(self, function: str, handle, since_us: int) -> list[tuple[int, int, int, int]]:
        """The entries newer than `since_us`; NOT_SUPPORTED in MIG mode and on a MIG device, NOT_FOUND where none."""
        gpu, instance = self._device(function, handle)
        if instance is not None or gpu.mig_mode:
            raise self._error(self.nvml.NVML_ERROR_NOT_SUPPORTED)
        gpu.fill(self.clock())
        entries = gpu.process_entries(int(since_us))
        if not entries:
            raise self._error(self.nvml.NVML_ERROR_NOT_FOUND)
        return entries

    def nvmlDeviceGetProcessUtilization(self, handle, timeStamp: int) -> list:
        with self._lock:
            entries = self._per_process("nvmlDeviceGetProcessUtilization", handle, timeStamp)
            samples = (self.nvml.c_nvmlProcessUtilizationSample_t * len(entries))()
            for sample, (pid, stamp, sm, mem) in zip(samples, entries, strict=True):
                sample.pid, sample.timeStamp, sample.smUtil, sample.memUtil, sample.encUtil, sample.decUtil = pid, stamp, sm, mem, 0, 0
            return samples[0 : len(entries)]  # as the real pynvml slices its array

    def nvmlDeviceGetProcessesUtilizationInfo(self, handle, timeStamp: int) -> list:
        with self._lock:
            nvml = self.nvml
            info = nvml.c_nvmlProcessesUtilizationInfo_v1_t(0)  # as the real pynvml fills it in
            info.version = nvml.ProcessesUtilizationInfo_v1
            info.lastSeenTimeStamp = int(timeStamp)
            entries = self._per_process("nvmlDeviceGetProcessesUtilizationInfo", handle, info.lastSeenTimeStamp)
            if info.version != nvml.ProcessesUtilizationInfo_v1:
                raise self._error(nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
            samples = (nvml.c_nvmlProcessUtilizationInfo_v1_t * len(entries))()
            for sample, (pid, stamp, sm, mem) in zip(samples, entries, strict=True):
                sample.timeStamp, sample.pid, sample.smUtil, sample.memUtil = stamp, pid, sm, mem
                sample.encUtil = sample.decUtil = sample.jpgUtil = sample.ofaUtil = 0
            info.processSamplesCount = len(entries)
            info.procUtilArray = samples
            return samples[0 : info.processSamplesCount]

    # --- GPM -----------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle):
        with self._lock:
            gpu = self._gpu("nvmlGpmQueryDeviceSupport", handle)
            support = self.nvml.c_nvmlGpmSupport_t()
            support.version = self.nvml.NVML_GPM_SUPPORT_VERSION
            support.isSupportedDevice = 1 if gpu.gpm else 0
            return support

    def nvmlGpmSampleAlloc(self):
        with self._lock:
            self._enter("nvmlGpmSampleAlloc")
            address = self._next_sample
            self._next_sample += 0x40
            self.samples[address] = None
            return ctypes.cast(ctypes.c_void_p(address), self.nvml.c_nvmlGpmSample_t)

    def _sample_address(self, sample) -> int:
        address = ctypes.cast(sample, ctypes.c_void_p).value if sample else None
        if address is None or address not in self.samples:
            raise self._error(self.nvml.NVML_ERROR_INVALID_ARGUMENT)
        return address

    def nvmlGpmSampleGet(self, handle, sample):
        with self._lock:
            gpu = self._gpu("nvmlGpmSampleGet", handle)
            address = self._sample_address(sample)
            if not gpu.gpm or gpu.mig_mode:  # in MIG mode only per-instance samples work
                raise self._error(self.nvml.NVML_ERROR_NOT_SUPPORTED)
            self.samples[address] = (gpu.index, gpu.t, gpu.load_seconds)
            return sample

    def nvmlGpmMigSampleGet(self, handle, gpu_instance_id: int, sample):
        with self._lock:
            gpu = self._gpu("nvmlGpmMigSampleGet", handle)
            address = self._sample_address(sample)
            if not gpu.gpm:
                raise self._error(self.nvml.NVML_ERROR_NOT_SUPPORTED)
            instance = next((i for i in gpu.mig if i.gi == int(gpu_instance_id)), None)
            if not gpu.mig_mode or instance is None:
                raise self._error(self.nvml.NVML_ERROR_INVALID_ARGUMENT)
            self.samples[address] = ((gpu.index, instance.gi), instance.t, instance.load_seconds)
            return sample

    def nvmlGpmSampleFree(self, sample) -> None:
        with self._lock:
            self._enter("nvmlGpmSampleFree")
            del self.samples[self._sample_address(sample)]

    def nvmlGpmMetricsGet(self, request):
        with self._lock:
            self._enter("nvmlGpmMetricsGet")
            nvml = self.nvml
            if request.version != nvml.NVML_GPM_METRICS_GET_VERSION:
                raise self._error(nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
            first = self.samples.get(self._sample_address(request.sample1))
            second = self.samples.get(self._sample_address(request.sample2))
            if first is None or second is None or first[0] != second[0] or not 0 < request.numMetrics <= nvml.NVML_GPM_METRIC_MAX:
                raise self._error(nvml.NVML_ERROR_INVALID_ARGUMENT)
            gpu = self.gpus[first[0][0] if isinstance(first[0], tuple) else first[0]]  # a MIG instance's samples: (gpu, gi)
            elapsed = second[1] - first[1]
            if elapsed < 0:
                raise self._error(nvml.NVML_ERROR_INVALID_ARGUMENT)
            mean_load = (second[2] - first[2]) / elapsed if elapsed > 0 else 0.0
            for slot in range(request.numMetrics):
                entry = request.metrics[slot]
                metric = entry.metricId
                if metric in gpu.gpm_unsupported or (metric not in self._gpm_ids and metric not in self._gpm_rates):
                    entry.nvmlReturn, entry.value = nvml.NVML_ERROR_NOT_SUPPORTED, 0.0
                elif metric in self._gpm_ids:
                    base, slope = self._gpm_ids[metric]
                    entry.nvmlReturn, entry.value = nvml.NVML_SUCCESS, 100.0 * (base + slope * mean_load)
                else:
                    entry.nvmlReturn, entry.value = nvml.NVML_SUCCESS, self._gpm_rates[metric] * mean_load
            return request

    # --- clock event reasons and ECC ------------------------------------------------------

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle) -> int:
        with self._lock:
            return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).reasons(self.clock())

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle) -> int:
        """The older name of the same call (drivers before the clock event reasons were renamed)."""
        with self._lock:
            return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle).reasons(self.clock())

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type: int, counter_type: int) -> int:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetTotalEccErrors", handle)
            nvml = self.nvml
            if not gpu.ecc:  # ECC disabled, or a GPU without it
                raise self._error(nvml.NVML_ERROR_NOT_SUPPORTED)
            kinds = {nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: "corrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: "uncorrected"}
            if error_type not in kinds or counter_type not in (nvml.NVML_VOLATILE_ECC, nvml.NVML_AGGREGATE_ECC):
                raise self._error(nvml.NVML_ERROR_INVALID_ARGUMENT)
            count = gpu.ecc_counts[kinds[error_type]]
            return count + (gpu.ecc_aggregate if counter_type == nvml.NVML_AGGREGATE_ECC else 0)

    # --- events --------------------------------------------------------------------------

    def _happen(self, index: int, event_type: int, data: int, when: float) -> None:
        for events in self.event_sets.values():
            events.offer(index, event_type, data, when)

    def _event_set(self, event_set) -> _EventSet:
        address = ctypes.cast(event_set, ctypes.c_void_p).value if event_set else None
        if address not in self.event_sets:
            raise self._error(self.nvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.event_sets[address]

    def nvmlEventSetCreate(self):
        with self._lock:
            self._enter("nvmlEventSetCreate")
            address = self._next_event_set
            self._next_event_set += 0x40
            self.event_sets[address] = _EventSet()
            return ctypes.cast(ctypes.c_void_p(address), self.nvml.c_nvmlEventSet_t)

    def nvmlDeviceGetSupportedEventTypes(self, handle) -> int:
        with self._lock:
            return int(self._gpu("nvmlDeviceGetSupportedEventTypes", handle).event_types)

    def nvmlDeviceRegisterEvents(self, handle, event_types: int, event_set) -> None:
        with self._lock:
            gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
            events = self._event_set(event_set)
            if int(event_types) & ~int(gpu.event_types):  # "some of the requested event types" are not supported
                raise self._error(self.nvml.NVML_ERROR_NOT_SUPPORTED)
            mask, _ = events.registered.get(gpu.index, (0, 0.0))
            events.registered[gpu.index] = (mask | int(event_types), self.clock())

    def nvmlEventSetWait_v2(self, event_set, timeout_ms: int):
        with self._lock:
            self._enter("nvmlEventSetWait")
            self.wait_timeouts.append(int(timeout_ms))
            events = self._event_set(event_set)
            now = self.clock()
            for gpu in self.gpus:  # the spec's scheduled XIDs that have happened by now
                while gpu.xids and gpu.xids[0][0] <= now:
                    when, code = gpu.xids.pop(0)
                    self._happen(gpu.index, self.nvml.nvmlEventTypeXidCriticalError, code, when)
            if not events.pending:
                raise self._error(self.nvml.NVML_ERROR_TIMEOUT)
            index, event_type, data = events.pending.popleft()
            event = self.nvml.c_nvmlEventData_t()
            event.device = self._handle(index)
            event.eventType, event.eventData = event_type, data
            event.gpuInstanceId = event.computeInstanceId = NO_INSTANCE
            return event

    def nvmlEventSetWait(self, event_set, timeout_ms: int):
        return self.nvmlEventSetWait_v2(event_set, timeout_ms)  # as the real pynvml does

    def nvmlEventSetFree(self, event_set) -> None:
        with self._lock:
            self._enter("nvmlEventSetFree")
            self._event_set(event_set)
            del self.event_sets[ctypes.cast(event_set, ctypes.c_void_p).value]


def install_fake(module, config, setattr_: Callable = setattr, **kwargs) -> FakeNvml:
    """Build a FakeNvml from `config` and put its entry points on `module`."""
    fake = FakeNvml.from_config(config, **kwargs)
    fake.install(module, setattr_)
    return fake
