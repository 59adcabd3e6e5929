"""The metric catalogue: every hardware metric radt knows, with its key, unit, range and aliases.

Samplers use it to name what they write, the importer to map tool columns, the dashboard to
label what it draws. Canonical keys follow MLflow's system-metric convention (`system/` prefix,
`gpu_<i>_` per device) and reuse MLflow's exact names where MLflow has one.

Where a series was measured is part of its key (see `Device`):
    system/gpu_0_sm_active              GPU 0 (its NVML index: nvidia-smi's and DCGM's numbering)
    system/gpu_0_mig_3_sm_active        the MIG slice of GPU 0 whose GPU instance id is 3
                                        (nvidia-smi's "GI ID", dcgm-exporter's GPU_I_ID)
    system/node-7/gpu_0_sm_active       GPU 0 of node "node-7" (MLflow's multi-node convention,
                                        MLFLOW_SYSTEM_METRICS_NODE_ID), host metrics likewise
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One kind of measurement; per-GPU metrics get one key per device index."""

    name: str  # key suffix: system/<name> or system/gpu_<i>_<name>
    label: str  # short display name, e.g. "SMACT"
    unit: str  # "ratio", "%", "MB", "W", "J", "°C", "MHz", "B/s", "state", "count"
    per_gpu: bool
    low: float | None = 0.0
    high: float | None = None
    description: str = ""


def _m(name, label, unit, per_gpu, low=0.0, high=None, description=""):
    return Metric(name, label, unit, per_gpu, low, high, description)


_RATIO = dict(low=0.0, high=1.0)
_PCT = dict(low=0.0, high=100.0)

METRICS: dict[str, Metric] = {
    m.name: m
    for m in [
        # GPU activity ratios (DCGM profiling fields 1001-1008, NVML GPM on Hopper+), 0-1.
        _m("gr_engine_active", "GRACT", "ratio", True, **_RATIO, description="graphics/compute engine busy"),
        _m("sm_active", "SMACT", "ratio", True, **_RATIO, description="SMs with at least one warp"),
        _m("sm_occupancy", "SMOCC", "ratio", True, **_RATIO, description="resident warps / max warps"),
        _m("tensor_active", "TENSO", "ratio", True, **_RATIO, description="tensor pipes busy"),
        _m("dram_active", "DRAMA", "ratio", True, **_RATIO, description="memory interface busy"),
        _m("fp64_active", "FP64A", "ratio", True, **_RATIO),
        _m("fp32_active", "FP32A", "ratio", True, **_RATIO),
        _m("fp16_active", "FP16A", "ratio", True, **_RATIO),
        _m("integer_active", "INTA", "ratio", True, **_RATIO),
        # NVML basics; MLflow's own names where MLflow has them.
        _m("utilization_percentage", "GPU util", "%", True, **_PCT, description="nvidia-smi's utilization.gpu"),
        _m("memory_utilization_percentage", "Mem util", "%", True, **_PCT, description="memory controller busy"),
        _m("memory_usage_megabytes", "GPU memory", "MB", True),
        _m("memory_usage_percentage", "GPU memory", "%", True, **_PCT),
        _m("process_memory_megabytes", "Run GPU memory", "MB", True, description="GPU memory of the run's processes"),
        # The run's own share of a GPU it shares (NVML's per-process utilization samples, summed over the run's process tree).
        _m(
            "run_sm_utilization_percentage",
            "Run SM util",
            "%",
            True,
            **_PCT,
            description="the share of time the run's own kernels ran on the GPU (NVML per-process smUtil, its processes summed)",
        ),
        _m(
            "run_memory_utilization_percentage",
            "Run mem util",
            "%",
            True,
            **_PCT,
            description="the run's own share of the memory controller (NVML per-process memUtil, its processes summed)",
        ),
        _m(
            "run_power_watts",
            "Run power (estimate)",
            "W",
            True,
            description="an estimate: the GPU's power above idle split by the processes' SM shares, plus an equal share of idle",
        ),
        _m("power_usage_watts", "Power", "W", True),
        _m("power_usage_percentage", "Power", "%", True, **_PCT, description="of the enforced power limit"),
        _m("energy_joules", "Energy", "J", True, description="consumed since recording began"),
        _m("temperature_celsius", "Temperature", "°C", True),
        _m("sm_clock_mhz", "SM clock", "MHz", True),
        _m("pstate", "P-state", "state", True, high=15.0),
        _m("pcie_tx_bytes_per_second", "PCIe TX", "B/s", True),
        _m("pcie_rx_bytes_per_second", "PCIe RX", "B/s", True),
        _m("nvlink_tx_bytes_per_second", "NVLink TX", "B/s", True),
        _m("nvlink_rx_bytes_per_second", "NVLink RX", "B/s", True),
        # Why the clocks are held down (NVML's clock event reasons, DCGM's clock throttle reasons): 1 while the reason is
        # active at the sample, else 0, so a mean is the share of the time; and the GPU's hardware errors.
        _m("clocks_power_capped", "Power capped", "ratio", True, **_RATIO, description="clocks held down by the power cap or power brake (1 = yes)"),
        _m("clocks_thermal_slowdown", "Thermal slowdown", "ratio", True, **_RATIO, description="clocks held down by temperature (1 = yes)"),
        _m("clocks_hardware_slowdown", "HW slowdown", "ratio", True, **_RATIO, description="clocks held down by the hardware's own slowdown (1 = yes)"),
        _m("xid_error", "XID", "state", True, description="the XID code of an error the driver reported since the last sample; 0: none"),
        _m("ecc_errors_uncorrected", "ECC uncorrected", "count", True, description="uncorrected ECC errors since the driver loaded (volatile)"),
        _m("ecc_errors_corrected", "ECC corrected", "count", True, description="corrected ECC errors since the driver loaded (volatile)"),
        # Host (psutil); MLflow's names for CPU, memory and cumulative network.
        _m("cpu_utilization_percentage", "CPU", "%", False, **_PCT),
        _m("system_memory_usage_megabytes", "Host memory", "MB", False),
        _m("system_memory_usage_percentage", "Host memory", "%", False, **_PCT),
        _m("swap_usage_megabytes", "Swap", "MB", False),
        _m("disk_read_bytes_per_second", "Disk read", "B/s", False),
        _m("disk_write_bytes_per_second", "Disk write", "B/s", False),
        _m("network_receive_bytes_per_second", "Net RX", "B/s", False),
        _m("network_transmit_bytes_per_second", "Net TX", "B/s", False),
        _m("network_receive_megabytes", "Net RX total", "MB", False),
        _m("network_transmit_megabytes", "Net TX total", "MB", False),
        _m("process_cpu_utilization_percentage", "Run CPU", "%", False, description="the run's processes; 100 = one core"),
        _m("process_memory_rss_megabytes", "Run memory", "MB", False),
        # MLflow's disk monitor.
        _m("disk_usage_percentage", "Disk used", "%", False, **_PCT),
        _m("disk_usage_megabytes", "Disk used", "MB", False),
        _m("disk_available_megabytes", "Disk free", "MB", False),
        # radT's nvidia-smi listener logged the tool's own clock as a metric (epoch seconds).
        _m("smi_clock_seconds", "nvidia-smi clock", "s", False, low=None, description="radT's SMI - Timestamp"),
    ]
}


class MetricName:
    """Every catalogue metric's name as an attribute: code names a metric MetricName.SM_ACTIVE, never as a bare string,
    so a renamed or mistyped metric fails where it is used instead of drawing an empty chart (a test holds the line)."""

    GR_ENGINE_ACTIVE = "gr_engine_active"
    SM_ACTIVE = "sm_active"
    SM_OCCUPANCY = "sm_occupancy"
    TENSOR_ACTIVE = "tensor_active"
    DRAM_ACTIVE = "dram_active"
    FP64_ACTIVE = "fp64_active"
    FP32_ACTIVE = "fp32_active"
    FP16_ACTIVE = "fp16_active"
    INTEGER_ACTIVE = "integer_active"
    UTILIZATION_PERCENTAGE = "utilization_percentage"
    MEMORY_UTILIZATION_PERCENTAGE = "memory_utilization_percentage"
    MEMORY_USAGE_MEGABYTES = "memory_usage_megabytes"
    MEMORY_USAGE_PERCENTAGE = "memory_usage_percentage"
    PROCESS_MEMORY_MEGABYTES = "process_memory_megabytes"
    RUN_SM_UTILIZATION_PERCENTAGE = "run_sm_utilization_percentage"
    RUN_MEMORY_UTILIZATION_PERCENTAGE = "run_memory_utilization_percentage"
    RUN_POWER_WATTS = "run_power_watts"
    POWER_USAGE_WATTS = "power_usage_watts"
    POWER_USAGE_PERCENTAGE = "power_usage_percentage"
    ENERGY_JOULES = "energy_joules"
    TEMPERATURE_CELSIUS = "temperature_celsius"
    SM_CLOCK_MHZ = "sm_clock_mhz"
    PSTATE = "pstate"
    PCIE_TX_BYTES_PER_SECOND = "pcie_tx_bytes_per_second"
    PCIE_RX_BYTES_PER_SECOND = "pcie_rx_bytes_per_second"
    NVLINK_TX_BYTES_PER_SECOND = "nvlink_tx_bytes_per_second"
    NVLINK_RX_BYTES_PER_SECOND = "nvlink_rx_bytes_per_second"
    CLOCKS_POWER_CAPPED = "clocks_power_capped"
    CLOCKS_THERMAL_SLOWDOWN = "clocks_thermal_slowdown"
    CLOCKS_HARDWARE_SLOWDOWN = "clocks_hardware_slowdown"
    XID_ERROR = "xid_error"
    ECC_ERRORS_UNCORRECTED = "ecc_errors_uncorrected"
    ECC_ERRORS_CORRECTED = "ecc_errors_corrected"
    CPU_UTILIZATION_PERCENTAGE = "cpu_utilization_percentage"
    SYSTEM_MEMORY_USAGE_MEGABYTES = "system_memory_usage_megabytes"
    SYSTEM_MEMORY_USAGE_PERCENTAGE = "system_memory_usage_percentage"
    SWAP_USAGE_MEGABYTES = "swap_usage_megabytes"
    DISK_READ_BYTES_PER_SECOND = "disk_read_bytes_per_second"
    DISK_WRITE_BYTES_PER_SECOND = "disk_write_bytes_per_second"
    NETWORK_RECEIVE_BYTES_PER_SECOND = "network_receive_bytes_per_second"
    NETWORK_TRANSMIT_BYTES_PER_SECOND = "network_transmit_bytes_per_second"
    NETWORK_RECEIVE_MEGABYTES = "network_receive_megabytes"
    NETWORK_TRANSMIT_MEGABYTES = "network_transmit_megabytes"
    PROCESS_CPU_UTILIZATION_PERCENTAGE = "process_cpu_utilization_percentage"
    PROCESS_MEMORY_RSS_MEGABYTES = "process_memory_rss_megabytes"
    DISK_USAGE_PERCENTAGE = "disk_usage_percentage"
    DISK_USAGE_MEGABYTES = "disk_usage_megabytes"
    DISK_AVAILABLE_MEGABYTES = "disk_available_megabytes"
    SMI_CLOCK_SECONDS = "smi_clock_seconds"


# a device metric -> the run's own share of it, where NVML splits it per process: on a GPU runs shared, the dashboard draws
# each run's own share in the device metric's chart (the device's line, the same for every run, once on demand)
OWN_SHARE = {
    MetricName.UTILIZATION_PERCENTAGE: MetricName.RUN_SM_UTILIZATION_PERCENTAGE,
    MetricName.MEMORY_UTILIZATION_PERCENTAGE: MetricName.RUN_MEMORY_UTILIZATION_PERCENTAGE,
    MetricName.POWER_USAGE_WATTS: MetricName.RUN_POWER_WATTS,
}

PREFIX = "system/"
# system/[<node>/][gpu_<i>_[mig_<gi>_]]<name>; a node id is anything without a slash
_SYSTEM_KEY = re.compile(r"^system/(?:(?P<node>[^/]+)/)?(?:gpu_(?P<gpu>\d+)_(?:mig_(?P<mig>\d+)_)?)?(?P<name>[^/]+)$")


@dataclass(frozen=True, order=True)
class Device:
    """Where a series was measured: a node (None: the run's own host), a GPU's NVML index, a MIG slice.

    The host's own metrics have gpu None; a whole GPU has mig None.
    """

    node: str | None = None
    gpu: int | None = None
    mig: int | None = None  # GPU instance id on `gpu`

    @property
    def label(self) -> str:
        """'GPU 0', 'GPU 0 · MIG 3', 'node-7 · GPU 0', 'node-7', or '' for the host."""
        parts = [self.node] if self.node else []
        if self.gpu is not None:
            parts.append(f"GPU {self.gpu}")
        if self.mig is not None:
            parts.append(f"MIG {self.mig}")
        return " · ".join(parts)

    def sort_key(self) -> tuple:
        return (self.node or "", -1 if self.gpu is None else self.gpu, -1 if self.mig is None else self.mig)


HOST = Device()

ONE_CORE = "% of one core"  # a process tree's CPU: 100 = one core busy, 400 on four cores
ALL_CORES = "% of all cores"  # the host's CPU (psutil.cpu_percent, MLflow's cpu_utilization_percentage): 100 = every core busy


def unit_text(metric: Metric) -> str:
    """The one name of a metric's unit, the same in axis titles, tooltips, table headers, filter help, README and exports.

    Ratios are '0–1', CPU says which hundred it counts (ONE_CORE or ALL_CORES), a P-state is a 'P-state'."""
    if metric.unit == "ratio":
        return "0–1"
    if metric.unit == "state":
        return "P-state" if metric.name == MetricName.PSTATE else "code"
    if metric.unit == "%" and "cpu" in metric.name:
        return ALL_CORES if metric.high is not None else ONE_CORE
    return metric.unit


# --- radt monitor's exposition (`radt monitor --prometheus-port`, collectors/monitor/exposition.py) ---

# A catalogue unit Prometheus names otherwise -> (its suffix in the catalogue's name, Prometheus' base unit's suffix, the
# scale from one to the other): Prometheus' convention is base units, bytes (MLflow's megabytes are 10^6 bytes, not MiB),
# 0–1 ratios and hertz (`promtool check metrics` refuses megabytes).
BASE_UNITS: dict[str, tuple[str, str, float]] = {
    "MB": ("_megabytes", "_bytes", 1e6),
    "%": ("_percentage", "_ratio", 0.01),
    "MHz": ("_mhz", "_hertz", 1e6),
}
# Metrics that only grow while their source runs (since the recording began, or since the driver loaded): Prometheus
# counters, named _total, so that rate() and increase() apply (a restart is a counter reset, which both allow for).
EXPOSED_COUNTERS = frozenset(
    {
        MetricName.ENERGY_JOULES,
        MetricName.NETWORK_RECEIVE_MEGABYTES,
        MetricName.NETWORK_TRANSMIT_MEGABYTES,
        MetricName.ECC_ERRORS_CORRECTED,
        MetricName.ECC_ERRORS_UNCORRECTED,
    }
)
_UNIT_WORDS = {"W": "watts", "J": "joules", "°C": "degrees Celsius", "B/s": "bytes per second", "s": "seconds"}


@dataclass(frozen=True)
class Exposed:
    """A catalogue metric as radt monitor serves it to Prometheus: a gauge or a counter, in Prometheus' base unit."""

    name: str  # its samples' name: radt_sm_active, radt_gpu_memory_usage_bytes, radt_gpu_energy_joules_total
    counter: bool
    scale: float  # the served value: the stored value times this
    unit: str  # the served unit in words: "bytes", "0–1", "1 = one core"
    help: str  # HELP: "GPU memory (bytes)", "SMACT: SMs with at least one warp (0–1)"

    def serve(self, value: float) -> float:
        """A stored value in the served unit: a scale below 1 divides (35 / 100 is 0.35, where 35 * 0.01 is not)."""
        return value * self.scale if self.scale >= 1 else value / (1 / self.scale)

    @property
    def family(self) -> str:
        """The family's name as prometheus_client takes it: a counter's without its _total."""
        return self.name.removesuffix("_total") if self.counter else self.name


def _radt_name(metric: Metric, name: str) -> str:
    """radt_<name>, a per-GPU metric whose name does not say so itself with gpu_ (radt_sm_active, radt_gpu_power_usage_watts)."""
    gpu = metric.per_gpu and not metric.name.endswith(("_active", "_occupancy")) and not metric.name.startswith("gpu_")
    return "radt_" + ("gpu_" if gpu else "") + name


def exposed(metric: Metric) -> Exposed:
    """How `radt monitor --prometheus-port` serves a metric: the catalogue's name with Prometheus' base unit."""
    suffix, base, scale = BASE_UNITS.get(metric.unit, ("", "", 1.0))
    counter = metric.name in EXPOSED_COUNTERS
    name = _radt_name(metric, metric.name.removesuffix(suffix) + base) + ("_total" if counter else "")
    unit = _served_unit(metric)
    # a percentage's description may say what 100 is ("100 = one core"): served as a ratio, its unit says what 1 is
    description = re.sub(r"[;,]? *100 = [^;,]*", "", metric.description) if metric.unit == "%" else metric.description
    return Exposed(name, counter, scale, unit, metric.label + (f": {description}" if description else "") + f" ({unit})")


def _served_unit(metric: Metric) -> str:
    """The served unit in words: 'bytes', '0–1' (a percentage served as a ratio: '1 = one core' for a process tree's CPU)."""
    text = unit_text(metric)
    if metric.unit == "%":
        return {ONE_CORE: "1 = one core", ALL_CORES: "1 = every core"}.get(text, "0–1")
    if metric.unit in BASE_UNITS:
        return BASE_UNITS[metric.unit][1].removeprefix("_")
    return _UNIT_WORDS.get(text, text)


def exposition_name(metric: Metric) -> str:
    """Its samples' name in Prometheus (`radt monitor --prometheus-port`); the prometheus listener reads these back too."""
    return exposed(metric).name


def former_exposition_name(metric: Metric) -> str:
    """Its name in radt's exposition before it took Prometheus' base units (#56: radt_gpu_memory_usage_megabytes, in MB):
    a Prometheus may hold series scraped under it, which the prometheus listener and `radt import` still read."""
    return _radt_name(metric, metric.name)


def key(name: str, gpu: int | None = None, *, mig: int | None = None, node: str | None = None) -> str:
    """The MLflow metric key for a catalogue metric, e.g. key('sm_active', 0), key('sm_active', 0, mig=3)."""
    metric = METRICS[name]
    where = f"{node}/" if node else ""
    if "/" in (node or ""):
        raise ValueError(f"node id {node!r} may not contain '/'")
    if metric.per_gpu:
        if gpu is None:
            raise ValueError(f"metric {name!r} needs a GPU index")
        slice_ = f"mig_{mig}_" if mig is not None else ""
        return f"{PREFIX}{where}gpu_{gpu}_{slice_}{name}"
    return f"{PREFIX}{where}{name}"


# --- aliases: tool columns and legacy keys -> (metric name, scale to the catalogue unit) ---

MIB = 1024 * 1024 / 1e6  # one MiB in MB (MLflow's megabytes are 10^6 bytes)

# `dcgmi dmon` column tags (and their DCGM field ids) -> (metric, scale).
DCGM_TAGS: dict[str, tuple[str, float]] = {
    "GRACT": ("gr_engine_active", 1.0),
    "SMACT": ("sm_active", 1.0),
    "SMOCC": ("sm_occupancy", 1.0),
    "TENSO": ("tensor_active", 1.0),
    "DRAMA": ("dram_active", 1.0),
    "FP64A": ("fp64_active", 1.0),
    "FP32A": ("fp32_active", 1.0),
    "FP16A": ("fp16_active", 1.0),
    "PCITX": ("pcie_tx_bytes_per_second", 1.0),
    "PCIRX": ("pcie_rx_bytes_per_second", 1.0),
    "NVLTX": ("nvlink_tx_bytes_per_second", 1.0),
    "NVLRX": ("nvlink_rx_bytes_per_second", 1.0),
    "GPUTL": ("utilization_percentage", 1.0),
    "MCUTL": ("memory_utilization_percentage", 1.0),
    "POWER": ("power_usage_watts", 1.0),
    "TOTEC": ("energy_joules", 1e-3),  # mJ since driver load; made relative by the reader
    "TXTPT": ("pcie_tx_bytes_per_second", 1024.0),  # KB/s
    "RXTPT": ("pcie_rx_bytes_per_second", 1024.0),
    "TMPTR": ("temperature_celsius", 1.0),
    "SMCLK": ("sm_clock_mhz", 1.0),
    "FBUSD": ("memory_usage_megabytes", MIB),
    # field 112's clock event reasons: a bitmask, split by clock_reason_series into the three clocks_* series (DCGM_CLOCK_REASON_TAGS)
    "DVCCTR": (MetricName.CLOCKS_POWER_CAPPED, 1.0),
    # the last XID DCGM saw, repeated in every row (and by dcgm-exporter at every scrape) until the next: the readers keep
    # the row where it changes and write 0 where it repeats
    "XIDER": (MetricName.XID_ERROR, 1.0),
    "ESVTL": (MetricName.ECC_ERRORS_CORRECTED, 1.0),  # single-bit (corrected) volatile total
    "EDVTL": (MetricName.ECC_ERRORS_UNCORRECTED, 1.0),  # double-bit (uncorrected) volatile total
}
DCGM_CLOCK_REASON_TAGS = frozenset({"DVCCTR"})  # dmon tags whose value is a clock event reasons bitmask, never stored as it is
DCGM_FIELD_IDS: dict[int, str] = {
    150: "TMPTR",
    155: "POWER",
    156: "TOTEC",
    100: "SMCLK",
    200: "TXTPT",
    201: "RXTPT",
    203: "GPUTL",
    204: "MCUTL",
    252: "FBUSD",
    1001: "GRACT",
    1002: "SMACT",
    1003: "SMOCC",
    1004: "TENSO",
    1005: "DRAMA",
    1006: "FP64A",
    1007: "FP32A",
    1008: "FP16A",
    1009: "PCITX",
    1010: "PCIRX",
    1011: "NVLTX",
    1012: "NVLRX",
    112: "DVCCTR",  # DCGM_FI_DEV_CLOCKS_EVENT_REASONS (older DCGM: DCGM_FI_DEV_CLOCK_THROTTLE_REASONS)
    230: "XIDER",  # DCGM_FI_DEV_XID_ERRORS
    310: "ESVTL",  # DCGM_FI_DEV_ECC_SBE_VOL_TOTAL
    311: "EDVTL",  # DCGM_FI_DEV_ECC_DBE_VOL_TOTAL
}
# dcgm-exporter metric -> the `dcgmi dmon` tag of the same DCGM field (DCGM's field names), whose
# catalogue entry gives the metric and scale (FB_USED comes in MiB, as dmon's FBUSD does).
DCGM_EXPORTER_TAGS: dict[str, str] = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "GRACT",
    "DCGM_FI_PROF_SM_ACTIVE": "SMACT",
    "DCGM_FI_PROF_SM_OCCUPANCY": "SMOCC",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "TENSO",
    "DCGM_FI_PROF_DRAM_ACTIVE": "DRAMA",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": "FP64A",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": "FP32A",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": "FP16A",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "PCITX",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "PCIRX",
    "DCGM_FI_PROF_NVLINK_TX_BYTES": "NVLTX",
    "DCGM_FI_PROF_NVLINK_RX_BYTES": "NVLRX",
    "DCGM_FI_DEV_GPU_UTIL": "GPUTL",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "MCUTL",
    "DCGM_FI_DEV_POWER_USAGE": "POWER",
    "DCGM_FI_DEV_GPU_TEMP": "TMPTR",
    "DCGM_FI_DEV_SM_CLOCK": "SMCLK",
    "DCGM_FI_DEV_FB_USED": "FBUSD",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DVCCTR",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "DVCCTR",  # newer exporters' name of the same field
    "DCGM_FI_DEV_XID_ERRORS": "XIDER",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ESVTL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "EDVTL",
}
DCGM_EXPORTER_NAMES: dict[str, str] = {tag: name for name, tag in DCGM_EXPORTER_TAGS.items()}  # dmon tag -> exporter name
DCGM_EXPORTER_FB_FREE = "DCGM_FI_DEV_FB_FREE"  # free framebuffer (MiB), read with FB_USED for a GPU's memory size, not stored
DCGM_EXPORTER_METRICS: dict[str, tuple[str, float]] = {metric: DCGM_TAGS[tag] for metric, tag in DCGM_EXPORTER_TAGS.items()}
# dcgm-exporter's Kubernetes labels (internal/pkg/transformation/const.go): the pod using a device, and more that name
# it (--use-old-namespace's pod_name, pod_namespace, container_name); a scrape of a pod renames one to exported_<name>
DCGM_EXPORTER_POD_LABELS = ("pod", "pod_name")
DCGM_EXPORTER_POD_DETAIL_LABELS = ("namespace", "container", "pod_namespace", "container_name", "pod_uid", "vgpu")
# --kubernetes-virtual-gpus (time-slicing): these two come as the device's series plus one per pod with the pod's own
# value (its processes' NVML smUtil summed; their memory in MiB): the run's own share where the pod is the run's
DCGM_EXPORTER_POD_SHARES: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": (MetricName.RUN_SM_UTILIZATION_PERCENTAGE, 1.0),
    "DCGM_FI_DEV_FB_USED": (MetricName.PROCESS_MEMORY_MEGABYTES, MIB),
}

# Princeton's jobstats runs two exporters of its own on each node. plazonic/nvidia_gpu_prometheus_exporter (NVML; port
# 9445) publishes one series per GPU and MIG slice, labelled ordinal (NVML's index), minor_number (/dev/nvidia<N>), uuid,
# name (the model), GPU_I_ID (a slice's GPU instance id), and jobid, userid (the Slurm job its prolog wrote in
# /run/gpustat; since September 2025). Its GPM series (Hopper and newer) hold NVML's percent / 100: 0-1 despite _percent.
NVIDIA_GPU_EXPORTER_METRICS: dict[str, tuple[str, float]] = {
    "nvidia_gpu_duty_cycle": (MetricName.UTILIZATION_PERCENTAGE, 1.0),  # nvmlDeviceGetUtilizationRates().gpu: nvidia-smi's, not SMACT
    "nvidia_gpu_memory_used_bytes": (MetricName.MEMORY_USAGE_MEGABYTES, 1e-6),
    "nvidia_gpu_power_usage_milliwatts": (MetricName.POWER_USAGE_WATTS, 1e-3),
    "nvidia_gpu_temperature_celsius": (MetricName.TEMPERATURE_CELSIUS, 1.0),
    "nvidia_gpu_graphics_util_percent": (MetricName.GR_ENGINE_ACTIVE, 1.0),
    "nvidia_gpu_sm_util_percent": (MetricName.SM_ACTIVE, 1.0),
    "nvidia_gpu_sm_occupancy_percent": (MetricName.SM_OCCUPANCY, 1.0),
    "nvidia_gpu_integer_util": (MetricName.INTEGER_ACTIVE, 1.0),
    "nvidia_gpu_any_tensor_util_percent": (MetricName.TENSOR_ACTIVE, 1.0),
    "nvidia_gpu_dram_bw_util_percent": (MetricName.DRAM_ACTIVE, 1.0),
    "nvidia_gpu_fp64_util_percent": (MetricName.FP64_ACTIVE, 1.0),
    "nvidia_gpu_fp32_util_percent": (MetricName.FP32_ACTIVE, 1.0),
    "nvidia_gpu_fp16_util_percent": (MetricName.FP16_ACTIVE, 1.0),
    "nvidia_gpu_pcie_tx_per_sec": (MetricName.PCIE_TX_BYTES_PER_SECOND, 1.0),  # bytes/s (GPM's MiB/s times 2^20)
    "nvidia_gpu_pcie_rx_per_sec": (MetricName.PCIE_RX_BYTES_PER_SECOND, 1.0),
    "nvidia_gpu_nvlink_total_tx_per_sec": (MetricName.NVLINK_TX_BYTES_PER_SECOND, 1.0),
    "nvidia_gpu_nvlink_total_rx_per_sec": (MetricName.NVLINK_RX_BYTES_PER_SECOND, 1.0),
}
NVIDIA_GPU_EXPORTER_MEMORY_TOTAL = "nvidia_gpu_memory_total_bytes"  # a GPU's memory (bytes), read with its `name` for its size, not stored
# plazonic/cgroup_exporter (port 9306): a Slurm job's cgroup on a node, labelled jobid, step and task ("" and "": the whole
# job; each step's besides with --collect.fullslurm). Its CPU seconds grow while the job runs: read as their rate.
CGROUP_EXPORTER_METRICS: dict[str, tuple[str, float]] = {
    "cgroup_cpu_total_seconds": (MetricName.PROCESS_CPU_UTILIZATION_PERCENTAGE, 100.0),  # CPU seconds a second, x100: % of one core
    "cgroup_memory_rss_bytes": (MetricName.PROCESS_MEMORY_RSS_MEGABYTES, 1e-6),
}
EXPORTER_COUNTERS = frozenset({"cgroup_cpu_total_seconds"})  # cumulative: stored as its rise per second between two scrapes, times the scale
# radT's field sets: the full profiling set, and the basic set it falls back to.
DCGM_PROFILING_FIELDS = [155, 156, 200, 201, 203, 204, 252, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009, 1010, 1011, 1012, 112, 230, 310, 311]
DCGM_BASIC_FIELDS = [155, 156, 200, 201, 203, 204, 252, 112, 230, 310, 311]

# The clock event reasons bitmask (NVML's nvmlClocksEventReason*, DCGM's DCGM_CLOCKS_EVENT_REASON_*: the same bits) -> the
# catalogue's 0/1 series. Idle 0x1, applications clocks 0x2, sync boost 0x10 and display clocks 0x100 are settings, not slowdowns.
CLOCK_REASON_SW_POWER_CAP = 0x4
CLOCK_REASON_HW_SLOWDOWN = 0x8
CLOCK_REASON_SW_THERMAL = 0x20
CLOCK_REASON_HW_THERMAL = 0x40
CLOCK_REASON_HW_POWER_BRAKE = 0x80
CLOCK_REASON_BITS: dict[str, int] = {
    MetricName.CLOCKS_POWER_CAPPED: CLOCK_REASON_SW_POWER_CAP | CLOCK_REASON_HW_POWER_BRAKE,
    MetricName.CLOCKS_THERMAL_SLOWDOWN: CLOCK_REASON_SW_THERMAL | CLOCK_REASON_HW_THERMAL,
    MetricName.CLOCKS_HARDWARE_SLOWDOWN: CLOCK_REASON_HW_SLOWDOWN,
}


def clock_reason_series(bitmask: float) -> dict[str, float]:
    """One clock event reasons bitmask (NVML, dcgmi dmon, dcgm-exporter) as the three series: 1.0 while a reason holds, else 0.0."""
    bits = int(bitmask)
    return {name: 1.0 if bits & mask else 0.0 for name, mask in CLOCK_REASON_BITS.items()}


# `nvidia-smi --query-gpu=... --format=csv` columns -> (metric, scale); values come in the
# column's own unit (MiB, %, W) which the scale converts.
SMI_COLUMNS: dict[str, tuple[str, float]] = {
    "utilization.gpu": ("utilization_percentage", 1.0),
    "utilization.memory": ("memory_utilization_percentage", 1.0),
    "memory.used": ("memory_usage_megabytes", MIB),
    "power.draw": ("power_usage_watts", 1.0),
    "temperature.gpu": ("temperature_celsius", 1.0),
    "clocks.sm": ("sm_clock_mhz", 1.0),
    "clocks.current.sm": ("sm_clock_mhz", 1.0),
    "pstate": ("pstate", 1.0),
}

# NVML GPM metric ids (pynvml.NVML_GPM_METRIC_*) -> (metric, scale); GPM reports percent
# for activities (stored as DCGM-style 0-1 ratios) and MiB/s for throughput.
GPM_METRICS: dict[int, tuple[str, float]] = {
    1: ("gr_engine_active", 0.01),  # GRAPHICS_UTIL
    2: ("sm_active", 0.01),  # SM_UTIL
    3: ("sm_occupancy", 0.01),  # SM_OCCUPANCY
    4: ("integer_active", 0.01),  # INTEGER_UTIL
    5: ("tensor_active", 0.01),  # ANY_TENSOR_UTIL
    10: ("dram_active", 0.01),  # DRAM_BW_UTIL
    11: ("fp64_active", 0.01),
    12: ("fp32_active", 0.01),
    13: ("fp16_active", 0.01),
    20: ("pcie_tx_bytes_per_second", 1024.0 * 1024.0),  # MiB/s
    21: ("pcie_rx_bytes_per_second", 1024.0 * 1024.0),
    60: ("nvlink_rx_bytes_per_second", 1024.0 * 1024.0),  # NVLINK_TOTAL_RX_PER_SEC
    61: ("nvlink_tx_bytes_per_second", 1024.0 * 1024.0),
}

# Other names MLflow's own monitors (or other MLflow versions) use for a catalogue metric -> (metric, scale).
MLFLOW_ALIASES: dict[str, tuple[str, float]] = {
    "process_cpu_percentage": ("process_cpu_utilization_percentage", 1.0),
    "memory_usage_gigabytes": ("memory_usage_megabytes", 1000.0),  # MLflow's ROCm monitor, per GPU
}

# Keys written by the original radT (no GPU index in the key; newer radT versions prefix them with
# "system/") -> (metric, scale).
LEGACY_KEYS: dict[str, tuple[str, float]] = {
    "DCGMI - Power Usage": ("power_usage_watts", 1.0),
    "DCGMI - Total Energy Consumption": ("energy_joules", 1e-3),
    "DCGMI - PCIE TX Throughput": ("pcie_tx_bytes_per_second", 1024.0),
    "DCGMI - PCIE RX Throughput": ("pcie_rx_bytes_per_second", 1024.0),
    "DCGMI - GPU Utilization": ("utilization_percentage", 1.0),
    "DCGMI - Memory Copy Utilization": ("memory_utilization_percentage", 1.0),
    "DCGMI - GR Engine Active": ("gr_engine_active", 1.0),
    "DCGMI - SN Active": ("sm_active", 1.0),  # radT's misspelling
    "DCGMI - SM Active": ("sm_active", 1.0),
    "DCGMI - SM Occupancy": ("sm_occupancy", 1.0),
    "DCGMI - Tensor Active": ("tensor_active", 1.0),
    "DCGMI - DRAM Active": ("dram_active", 1.0),
    "DCGMI - FP64 Active": ("fp64_active", 1.0),
    "DCGMI - FP32 Active": ("fp32_active", 1.0),
    "DCGMI - FP16 Active": ("fp16_active", 1.0),
    "DCGMI - PCIE TX Bytes": ("pcie_tx_bytes_per_second", 1.0),
    "DCGMI - PCIE RX Bytes": ("pcie_rx_bytes_per_second", 1.0),
    "DCGMI - NVlink TX Bytes": ("nvlink_tx_bytes_per_second", 1.0),
    "DCGMI - NVlink RX Bytes": ("nvlink_rx_bytes_per_second", 1.0),
    "SMI - Power Draw": ("power_usage_watts", 1.0),
    "SMI - GPU Util": ("utilization_percentage", 100.0),  # radT stored 0-1
    "SMI - Mem Util": ("memory_utilization_percentage", 100.0),
    "SMI - Mem Used": ("memory_usage_megabytes", MIB),
    "SMI - Performance State": ("pstate", 1.0),
    "TOP - CPU Utilization": ("process_cpu_utilization_percentage", 1.0),
    "TOP - Memory Usage GB": ("system_memory_usage_megabytes", 1000.0),
    "TOP - Swap Memory GB": ("swap_usage_megabytes", 1000.0),
    "TOP - Memory Utilization": ("system_memory_usage_percentage", 1.0),
    "SMI - Timestamp": ("smi_clock_seconds", 1.0),
}
# radT wrote -1 where nvidia-smi printed N/A, and DCGM's N/A power and energy came out as 0 (a
# powered GPU never draws 0 W): stored values that mean "no reading", not data.
LEGACY_MISSING_VALUES: dict[str, tuple[float, ...]] = {k: (-1.0,) for k in LEGACY_KEYS} | {
    "DCGMI - Power Usage": (-1.0, 0.0),
    "DCGMI - Total Energy Consumption": (-1.0, 0.0),
    "SMI - Power Draw": (-1.0, 0.0),
}


def legacy_name(stored_key: str) -> str | None:
    """radT's key without the "system/" prefix newer radT versions added, if it is one of radT's."""
    bare = stored_key[len(PREFIX) :] if stored_key.startswith(PREFIX) else stored_key
    return bare if bare in LEGACY_KEYS else None


def missing_values(stored_key: str) -> tuple[float, ...]:
    """Stored values of this key that mean "no reading" (radT's sentinels); empty for radt's own keys."""
    name = legacy_name(stored_key)
    return LEGACY_MISSING_VALUES.get(name, ()) if name else ()


@dataclass(frozen=True)
class Resolved:
    """What a stored key means: the metric, where it was measured, the scale to the catalogue unit."""

    metric: Metric
    gpu: int | None
    scale: float = 1.0
    node: str | None = None
    mig: int | None = None
    legacy: bool = False  # radT's key: no GPU index in it (it counts as GPU 0)

    @property
    def device(self) -> Device:
        if self.legacy and self.metric.per_gpu:
            return Device(None, 0, None)
        return Device(self.node, self.gpu, self.mig)


def resolve(stored_key: str) -> Resolved | None:
    """Map any stored key (radt/MLflow `system/...`, per node and MIG slice, radT legacy) onto the catalogue."""
    legacy = legacy_name(stored_key)
    if legacy is not None:
        name, scale = LEGACY_KEYS[legacy]
        return Resolved(METRICS[name], None, scale, legacy=True)
    match = _SYSTEM_KEY.match(stored_key)
    if not match:
        return None
    name, scale = match.group("name"), 1.0
    if name not in METRICS and name in MLFLOW_ALIASES:
        name, scale = MLFLOW_ALIASES[name]
    metric = METRICS.get(name)
    if metric is None:
        return None
    gpu = match.group("gpu")
    if metric.per_gpu != (gpu is not None):
        return None
    mig = match.group("mig")
    return Resolved(metric, int(gpu) if gpu is not None else None, scale, match.group("node"), int(mig) if mig is not None else None)


def display_name(stored_key: str) -> str:
    """'SMACT (GPU 0)' for system/gpu_0_sm_active, 'SMACT (node-7 · GPU 0 · MIG 3)'; the key itself when unknown."""
    resolved = resolve(stored_key)
    if resolved is None:
        return stored_key
    where = resolved.device.label
    return f"{resolved.metric.label} ({where})" if where else resolved.metric.label


# radt monitor's own exposition (collectors/monitor/exposition.py), an NVML/GPM exporter: per-GPU catalogue metrics, back
# from Prometheus' base units to the catalogue's; and under their former names (#56), in the catalogue's units as they were
RADT_EXPORTER_METRICS: dict[str, tuple[str, float]] = {former_exposition_name(m): (m.name, 1.0) for m in METRICS.values() if m.per_gpu} | {
    exposed(m).name: (m.name, 1.0 / exposed(m).scale) for m in METRICS.values() if m.per_gpu
}
# every exporter metric name radt reads from a Prometheus for a GPU -> (catalogue metric, scale)
EXPORTER_METRICS: dict[str, tuple[str, float]] = DCGM_EXPORTER_METRICS | NVIDIA_GPU_EXPORTER_METRICS | RADT_EXPORTER_METRICS


@dataclass(frozen=True, eq=False)  # one of each: compared and hashed as itself
class ExporterFamily:
    """An exporter radt reads from a Prometheus: its name in radt's lines, its metrics, the series whose presence says a
    cluster runs it (asked of Prometheus, never configured), and whether its series name their node in a label of their
    own (dcgm-exporter's Hostname) or only by their scrape target (`instance`, node:port)."""

    name: str
    metrics: dict[str, tuple[str, float]]
    markers: tuple[str, ...]
    node_label: bool


def exporter_names(metrics: dict[str, tuple[str, float]], *names: str) -> tuple[str, ...]:
    """An exporter's names (`metrics`: one of its tables) of the catalogue metrics `names`, in their order."""
    return tuple(exported for name in names for exported, (metric, _) in metrics.items() if metric == name)


EXPORTER_FAMILIES: tuple[ExporterFamily, ...] = (  # in the order preferred where a node has two: DCGM's fields first
    ExporterFamily("dcgm-exporter", DCGM_EXPORTER_METRICS, exporter_names(DCGM_EXPORTER_METRICS, MetricName.UTILIZATION_PERCENTAGE), True),
    ExporterFamily(
        "nvidia_gpu_prometheus_exporter", NVIDIA_GPU_EXPORTER_METRICS, exporter_names(NVIDIA_GPU_EXPORTER_METRICS, MetricName.UTILIZATION_PERCENTAGE), False
    ),
    ExporterFamily("radt monitor", RADT_EXPORTER_METRICS, exporter_names(RADT_EXPORTER_METRICS, MetricName.UTILIZATION_PERCENTAGE), True),
    ExporterFamily("cgroup_exporter", CGROUP_EXPORTER_METRICS, exporter_names(CGROUP_EXPORTER_METRICS, MetricName.PROCESS_CPU_UTILIZATION_PERCENTAGE), False),
)
