"""Why is this run slow: every rule that turns a run's (or job's) GPU and CPU series into findings, in one place.

A finding is a code (idle_gpus, input_starved, ...), one sentence with the numbers behind it and what to do, and the time
it covers. Rules read `Evidence` (radt/evidence.py: each series as 10-second rollup buckets) and never guess: a rule
whose metrics a run lacks is not judged, and the diagnosis says once which metrics it lacked. Thresholds are settings
(radt/settings.py), each with the reason for its value. Stored as tags (runmodel.DIAGNOSIS_TAG ...): tracked runs when
they end, imports when imported, `radt diagnose` for the rest; the Cluster page ranks by `idle_gpu_hours` from here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from radt import settings
from radt.catalogue import Device, MetricName
from radt.runmodel import DIAGNOSIS_LACKING_TAG, DIAGNOSIS_SPANS_TAG, DIAGNOSIS_TAG, DIAGNOSIS_VERSION_TAG, diagnosis_tag
from radt.throughput import Gain

VERSION = 1  # part of the tags: `radt diagnose` fills runs diagnosed by an older rule set anew

IDLE_GPUS = "idle_gpus"
INPUT_STARVED = "input_starved"
SMALL_KERNELS = "small_kernels"
LOW_OCCUPANCY = "low_occupancy"
MEMORY_BOUND = "memory_bound"
NO_TENSOR_CORES = "no_tensor_cores"
THROTTLED = "throttled"
HARDWARE_ERRORS = "hardware_errors"
STRAGGLER = "straggler"
FITS_SMALLER = "fits_smaller"
COULD_SHARE = "could_share"
CODES = (
    IDLE_GPUS,
    INPUT_STARVED,
    SMALL_KERNELS,
    LOW_OCCUPANCY,
    MEMORY_BOUND,
    NO_TENSOR_CORES,
    THROTTLED,
    HARDWARE_ERRORS,
    STRAGGLER,
    FITS_SMALLER,
    COULD_SHARE,
)
ACTIONS = {
    IDLE_GPUS: "ask for (or watch with -d) only the GPUs the job uses, or make the script use them all",
    INPUT_STARVED: "more DataLoader workers (num_workers), pin_memory=True, faster storage or pre-processed data",
    SMALL_KERNELS: "a larger batch, fused kernels (torch.compile) or CUDA graphs",
    LOW_OCCUPANCY: "larger thread blocks or fewer registers per thread (profile the top kernels with ncu)",
    MEMORY_BOUND: "fuse element-wise kernels (torch.compile), keep data in lower precision, reuse what is loaded",
    NO_TENSOR_CORES: "mixed precision: torch.autocast with bf16 (or fp16 with a GradScaler)",
    THROTTLED: "the clocks, not the code, set the pace: ask the cluster team about the power cap or the cooling",
    HARDWARE_ERRORS: "report the GPU and node to the cluster team; rerun elsewhere before trusting the results",
    STRAGGLER: "check that GPU's node (clocks, other jobs, its data shard); the others wait for it every step",
    FITS_SMALLER: "run it in the MIG slice named, and leave the rest of the GPU to others",
    COULD_SHARE: "run the two together on one GPU (MPS) and free a GPU",
}
LABELS = {code: code.replace("_", " ") for code in CODES}

# The GPUs with tensor cores, by the name NVML or an exporter's modelName gives (Volta and later; not GTX/Pascal, P100, K80).
TENSOR_CORE_MODELS = re.compile(r"\b(V100|T4|A\d{1,3}|H\d{2,3}|GH200|GB200|B\d{3}|L\d{1,2}S?|RTX|Titan V|Quadro RTX)\b", re.IGNORECASE)
NO_TENSOR_CORE_MODELS = re.compile(r"\b(GTX|P\d{1,3}|K\d{2}|M\d{2})\b")
# The MIG slices up to 3g of each GPU that has MIG, by its memory as NVIDIA names it (GB); a slice holds about 95 % of
# its name's GiB (A100 40GB's 1g.5gb: 4,864 MiB). A GPU of another size, or of none known, gets no slice named.
MIG_SLICES: dict[int, tuple[str, ...]] = {
    24: ("1g.6gb", "2g.12gb"),  # A30
    40: ("1g.5gb", "2g.10gb", "3g.20gb"),  # A100 40GB
    80: ("1g.10gb", "2g.20gb", "3g.40gb"),  # A100 80GB, H100 80GB
    94: ("1g.12gb", "2g.24gb", "3g.47gb"),  # H100 NVL
    141: ("1g.18gb", "2g.35gb", "3g.71gb"),  # H200
}
MIG_MODELS = re.compile(r"\b(A30|A100|A800|H100|H800|H20|H200|GH200)\b")  # the GPUs with MIG
MIG_SEVENTHS = 7  # a MIG GPU's compute slices: a 3g slice has 3/7 of its SMs
SLICE_FILL = 0.95  # of a slice's nominal GiB that it holds
SHARE_SMACT = 1.0  # two runs fit one GPU under MPS when their SMACT p95s add up to at most this ...
SHARE_MEMORY = 0.9  # ... and their memory peaks to at most this share of the GPU's memory
GIB = 1024**3
HOST_CPU_SATURATED = 90.0  # % of all cores: the host's CPU counts as saturated from here (RADT_CPU_BUSY_CORES's help)


@dataclass(frozen=True)
class Stats:
    """One series over the diagnosed span, from its 10-second buckets: mean, peak, p95 of the bucket means, samples."""

    mean: float
    peak: float
    p95: float
    samples: int


@dataclass
class GpuEvidence:
    """One GPU (or MIG slice) of a run: what it is and its series (metric name -> per-bucket arrays, see Window)."""

    device: Device
    model: str = ""
    memory_total_mb: float | None = None
    used: bool | None = None  # the run's processes held memory on it (NVML's per-process lists); None: not known
    series: dict[str, Window] = field(default_factory=dict)


@dataclass(frozen=True)
class Window:
    """A series' 10-second buckets: start ms and per bucket min, max, mean (NaN where the bucket held no reading)."""

    bucket_ms: Sequence[int]
    low: Sequence[float]
    high: Sequence[float]
    mean: Sequence[float]
    count: Sequence[int] = ()  # readings per bucket: the sampling interval is the bucket's width over the fullest one's

    def interval_ms(self, width_ms: int) -> float:
        """The series' sampling interval, from its fullest bucket (0 where the counts are not known)."""
        return width_ms / max(self.count) if self.count and max(self.count) > 0 else 0.0

    def stats(self) -> Stats | None:
        """The series' mean (weighted by bucket), peak and p95 of the bucket means; None without a reading."""
        means = [m for m in self.mean if math.isfinite(m)]
        if not means:
            return None
        ordered = sorted(means)
        p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
        return Stats(math.fsum(means) / len(means), max(h for h in self.high if math.isfinite(h)), p95, len(means))


@dataclass
class Evidence:
    """What the rules read of one run or job: its span, GPUs, host series, and the run's own context."""

    run_id: str
    start_ms: int
    end_ms: int
    gpus: list[GpuEvidence] = field(default_factory=list)
    host: dict[str, Window] = field(default_factory=dict)  # cpu_utilization_percentage, process_cpu_utilization_percentage
    bucket_s: int = 10
    name: str = ""  # the run's or job's name, for could_share's sentence
    user: str = ""
    command: str = ""  # the script and its arguments: the same command alone and collocated is measured
    collocation: str = ""  # radt.collocation: '-', 'MPS', a MIG profile

    @property
    def hours(self) -> float:
        return max(0.0, (self.end_ms - self.start_ms) / 3_600_000)


@dataclass(frozen=True)
class Finding:
    """One thing that held a run back: its code, the sentence with its numbers and action, and the span it covers."""

    code: str
    sentence: str
    span: tuple[int, int] | None = None  # epoch ms the finding covers, for the dashboard's zoom link
    numbers: Mapping[str, float] = field(default_factory=dict)


@dataclass
class Diagnosis:
    """A run's findings, the metrics it lacked (said once) and its figures (idle GPU-hours, shares, ...)."""

    findings: list[Finding] = field(default_factory=list)
    lacking: list[str] = field(default_factory=list)
    numbers: dict[str, float] = field(default_factory=dict)

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def tags(self) -> dict[str, str]:
        """The run's tags: radt.diagnosis = the codes ('' when nothing is wrong), one tag per finding, lacking, spans, version."""
        tags = {DIAGNOSIS_TAG: ",".join(self.codes), DIAGNOSIS_VERSION_TAG: str(VERSION), DIAGNOSIS_LACKING_TAG: "; ".join(self.lacking)}
        tags |= {diagnosis_tag(f.code): f.sentence for f in self.findings}
        spans = {f.code: list(f.span) for f in self.findings if f.span}
        tags[DIAGNOSIS_SPANS_TAG] = ",".join(f"{code}:{a}-{b}" for code, (a, b) in spans.items())
        return tags

    def cleared(self) -> list[str]:
        """The per-finding tags of codes not found this time, to delete: a run diagnosed anew keeps no stale finding."""
        return [diagnosis_tag(code) for code in CODES if code not in self.codes]


def parse_spans(text: str) -> dict[str, tuple[int, int]]:
    """radt.diagnosis.spans ('input_starved:1700000000000-1700000600000,...') back into {code: (start ms, end ms)}."""
    out: dict[str, tuple[int, int]] = {}
    for part in filter(None, (text or "").split(",")):
        code, _, span = part.partition(":")
        start, _, end = span.partition("-")
        if start.isdigit() and end.isdigit():
            out[code] = (int(start), int(end))
    return out


def codes_of(tags: Mapping[str, str]) -> list[str]:
    """The codes a run's radt.diagnosis tag names, in the catalogue's order."""
    named = set(filter(None, (tags.get(DIAGNOSIS_TAG) or "").split(",")))
    return [code for code in CODES if code in named]


# --- the rules ---------------------------------------------------------------------------------------------------------


def diagnose(evidence: Evidence) -> Diagnosis:
    """Every rule over one run's evidence; could_share, which needs other runs, is `share_partners`."""
    result = Diagnosis()
    for rule in (_idle_gpus, _input_starved, _activity, _throttled, _hardware_errors, _straggler, _fits_smaller):
        rule(evidence, result)
    result.numbers |= idle_numbers(evidence)
    result.lacking = list(dict.fromkeys(result.lacking))
    return result


def _activity_of(gpu: GpuEvidence) -> tuple[Window | None, float]:
    """The series that says whether a GPU works, and its scale to 0-1: GRACT, else SMACT, else GPU util (%)."""
    for name, scale in ((MetricName.GR_ENGINE_ACTIVE, 1.0), (MetricName.SM_ACTIVE, 1.0), (MetricName.UTILIZATION_PERCENTAGE, 0.01)):
        if name in gpu.series and gpu.series[name].stats() is not None:
            return gpu.series[name], scale
    return None, 1.0


def idle_share(gpu: GpuEvidence) -> float | None:
    """The share of a GPU's buckets in which its engine stayed idle (peak below RADT_IDLE_LEVEL); None without a series."""
    window, scale = _activity_of(gpu)
    if window is None:
        return None
    level = settings.IDLE_LEVEL.get()
    counted = [h * scale < level for h in window.high if math.isfinite(h)]
    return sum(counted) / len(counted) if counted else None


def idle_numbers(evidence: Evidence) -> dict[str, float]:
    """GPU-hours held, and those spent idle (each GPU's idle share × the span): the Cluster page's ranking, worst first."""
    shares = [idle_share(g) for g in evidence.gpus]
    known = [s for s in shares if s is not None]
    if not known:
        return {}
    held = len(evidence.gpus) * evidence.hours
    return {"gpu_hours": held, "idle_gpu_hours": math.fsum(known) * evidence.hours, "idle_share": math.fsum(known) / len(known)}


def _idle_gpus(evidence: Evidence, result: Diagnosis) -> None:
    shares = {g.device: idle_share(g) for g in evidence.gpus}
    if evidence.gpus and all(s is None for s in shares.values()):
        result.lacking.append("idle_gpus (no GRACT, SMACT or GPU util series)")
        return
    threshold = settings.IDLE_SHARE.get()
    idle = sorted(((d, s) for d, s in shares.items() if s is not None and s >= threshold), key=lambda item: item[0].sort_key())
    if not idle:
        return
    names = ", ".join(f"{d.label} {s:.0%}" for d, s in idle)
    sentence = (
        f"{len(idle)} of {len(evidence.gpus)} GPUs idle for most of the run (share of the run with activity below "
        f"{settings.IDLE_LEVEL.get():g}: {names}); {ACTIONS[IDLE_GPUS]}"
    )
    result.findings.append(Finding(IDLE_GPUS, sentence, (evidence.start_ms, evidence.end_ms), {"gpus_idle": len(idle)}))


def _host_cpu(evidence: Evidence) -> tuple[Window | None, Window | None]:
    return evidence.host.get(MetricName.PROCESS_CPU_UTILIZATION_PERCENTAGE), evidence.host.get(MetricName.CPU_UTILIZATION_PERCENTAGE)


@dataclass(frozen=True)
class Starved:
    """One GPU's input gaps: the windows that hold one, their share, the GPU time lost, the run's cores busy meanwhile."""

    gpu: GpuEvidence
    gaps: list[int]
    share: float
    lost: float
    cores: float


def _working(evidence: Evidence) -> list[GpuEvidence]:
    """The GPUs that work: idle less than RADT_IDLE_SHARE of the run (or with no activity series to tell)."""
    return [g for g in evidence.gpus if (idle_share(g) or 0.0) < settings.IDLE_SHARE.get()]


def _working_with(evidence: Evidence, name: str) -> list[GpuEvidence]:
    """The GPUs that work and have the series `name`."""
    return [g for g in _working(evidence) if name in g.series]


def _input_starved(evidence: Evidence, result: Diagnosis) -> None:
    """Recurring SMACT gaps on a GPU that works in between, while the run's CPU (or the host's) is saturated."""
    run_cpu, host_cpu = _host_cpu(evidence)
    if evidence.gpus and not any(MetricName.SM_ACTIVE in g.series for g in evidence.gpus):
        result.lacking.append("input_starved (no SMACT series)")
        return
    busy = _working_with(evidence, MetricName.SM_ACTIVE)
    if busy and run_cpu is None and host_cpu is None:
        result.lacking.append("input_starved (no CPU series)")
        return
    cpu_at = _cpu_by_bucket(run_cpu, host_cpu)
    found = [starved for gpu in busy if (starved := _starved(gpu, cpu_at)) is not None]
    if not found:
        return
    worst = max(found, key=lambda s: s.lost)
    window = worst.gpu.series[MetricName.SM_ACTIVE]
    sentence = (
        f"the GPU waits for input: SMACT of {worst.gpu.device.label} drops below {settings.GAP_LEVEL.get():g} in {worst.share:.0%} of the "
        f"run's {evidence.bucket_s}-second windows while the run's processes use {worst.cores:.1f} cores; about {worst.lost:.0%} of the "
        f"GPU's time is lost; {ACTIONS[INPUT_STARVED]}"
    )
    span = (int(window.bucket_ms[worst.gaps[0]]), int(window.bucket_ms[worst.gaps[-1]]) + evidence.bucket_s * 1000)
    result.findings.append(Finding(INPUT_STARVED, sentence, span, {"lost_share": worst.lost, "gap_share": worst.share, "cpu_cores": worst.cores}))


def _gaps(window: Window) -> list[int]:
    """The windows in which SMACT fell below RADT_GAP_LEVEL while the GPU also worked (its peak at least twice that)."""
    level = settings.GAP_LEVEL.get()
    return [i for i, (lo, hi) in enumerate(zip(window.low, window.high)) if math.isfinite(lo) and lo < level and hi >= 2 * level]


def _starved(gpu: GpuEvidence, cpu_at: Mapping[int, tuple[float, float]]) -> Starved | None:
    """The GPU's gaps where they recur (RADT_GAP_SHARE), the CPU is saturated in most of them and they cost RADT_STARVED_LOSS."""
    window = gpu.series[MetricName.SM_ACTIVE]
    gaps, counted = _gaps(window), sum(math.isfinite(m) for m in window.mean)
    if not counted or len(gaps) < 3 or len(gaps) / counted < settings.GAP_SHARE.get():
        return None
    cpu = [c for c in (cpu_at.get(int(window.bucket_ms[i])) for i in gaps) if c is not None]
    saturated = [c for c in cpu if c[0] >= settings.CPU_BUSY_CORES.get() * 100 or c[1] >= HOST_CPU_SATURATED]
    if not cpu or len(saturated) < 0.5 * len(cpu):
        return None
    highs = sorted(h for h in window.high if math.isfinite(h))
    busy_level = highs[len(highs) // 2]  # the GPU's busy level: the median of its windows' peaks
    lost = math.fsum(max(0.0, 1 - window.mean[i] / busy_level) for i in gaps) / counted if busy_level > 0 else 0.0
    if lost < settings.STARVED_LOSS.get():
        return None
    return Starved(gpu, gaps, len(gaps) / counted, lost, math.fsum(c[0] for c in cpu) / len(cpu) / 100)


def _cpu_by_bucket(run_cpu: Window | None, host_cpu: Window | None) -> dict[int, tuple[float, float]]:
    """bucket ms -> (the run's CPU in % of one core, the host's in % of all cores), the peak of each bucket (0 where absent)."""
    out: dict[int, tuple[float, float]] = {}
    for which, window in enumerate((run_cpu, host_cpu)):
        if window is None:
            continue
        for ms, high in zip(window.bucket_ms, window.high):
            if math.isfinite(high):
                pair = list(out.get(int(ms), (0.0, 0.0)))
                pair[which] = high
                out[int(ms)] = (pair[0], pair[1])
    return out


def _means(gpu: GpuEvidence, *names: str) -> list[float | None]:
    stats = [gpu.series[n].stats() if n in gpu.series else None for n in names]
    return [s.mean if s else None for s in stats]


ACTIVITY_NEEDS = {
    SMALL_KERNELS: MetricName.GR_ENGINE_ACTIVE,
    LOW_OCCUPANCY: MetricName.SM_OCCUPANCY,
    MEMORY_BOUND: MetricName.DRAM_ACTIVE,
    NO_TENSOR_CORES: MetricName.TENSOR_ACTIVE,
}  # each activity rule and the series it reads beside SMACT
ACTIVITY_WHAT = {
    SMALL_KERNELS: "kernels run but keep few SMs busy",
    LOW_OCCUPANCY: "the SMs are busy with few warps each",
    MEMORY_BOUND: "the SMs wait on memory",
    NO_TENSOR_CORES: "the tensor cores stay idle while the SMs work",
}


def _activity(evidence: Evidence, result: Diagnosis) -> None:
    """small_kernels, low_occupancy, memory_bound and no_tensor_cores, from each working GPU's activity means."""
    working = _working(evidence)
    if not working:
        return
    if not any(MetricName.SM_ACTIVE in g.series for g in working):
        result.lacking.append(f"{', '.join(ACTIVITY_NEEDS)} (no SMACT series: DCGM profiling or NVML GPM)")
        return
    result.lacking += [f"{code} (no {needs} series)" for code, needs in ACTIVITY_NEEDS.items() if not any(needs in g.series for g in working)]
    found: dict[str, list[str]] = {}
    for gpu in working:
        for code, said in _activity_of_gpu(gpu, result).items():
            found.setdefault(code, []).append(said)
    for code in ACTIVITY_NEEDS:
        if code in found:
            sentence = f"{ACTIVITY_WHAT[code]} ({'; '.join(found[code])}); {ACTIONS[code]}"
            result.findings.append(Finding(code, sentence, (evidence.start_ms, evidence.end_ms)))


def _activity_of_gpu(gpu: GpuEvidence, result: Diagnosis) -> dict[str, str]:
    """The activity findings of one GPU, code -> what it showed ('GPU 0: GRACT 0.68 but SMACT 0.002')."""
    smact, gract, smocc, dram, tensor = _means(gpu, MetricName.SM_ACTIVE, *ACTIVITY_NEEDS.values())
    if smact is None:
        return {}
    where, out = gpu.device.label, {}
    if gract is not None and gract >= settings.SMALL_KERNEL_GRACT.get() and smact < settings.SMALL_KERNEL_SMACT.get():
        out[SMALL_KERNELS] = f"{where}: GRACT {gract:.2f} but SMACT {smact:.3f}"
    if smocc is not None and smact >= settings.LOW_OCCUPANCY_SMACT.get() and smocc < settings.LOW_OCCUPANCY_SMOCC.get():
        out[LOW_OCCUPANCY] = f"{where}: SMACT {smact:.2f} but SMOCC {smocc:.2f}"
    if dram is not None and dram >= settings.MEMORY_BOUND_DRAM.get() and smact < settings.MEMORY_BOUND_SMACT.get():
        out[MEMORY_BOUND] = f"{where}: DRAM activity {dram:.2f} with SMACT {smact:.2f}"
    if tensor is not None and smact >= settings.TENSOR_SMACT.get() and tensor < settings.TENSOR_LEVEL.get():
        if has_tensor_cores(gpu.model):
            out[NO_TENSOR_CORES] = f"{where}: tensor activity {tensor:.3f} with SMACT {smact:.2f} on a {gpu.model}"
        else:
            result.lacking.append(f"{NO_TENSOR_CORES} ({gpu.model or 'GPU model unknown'}: no known tensor cores)")
    return out


def has_tensor_cores(model: str) -> bool:
    """Whether a GPU of this name (NVML's, an exporter's modelName) has tensor cores: Volta and later; unknown: no."""
    return bool(TENSOR_CORE_MODELS.search(model or "")) and not NO_TENSOR_CORE_MODELS.search(model or "")


THROTTLE_REASONS = (
    (MetricName.CLOCKS_POWER_CAPPED, "the power cap"),
    (MetricName.CLOCKS_THERMAL_SLOWDOWN, "temperature"),
    (MetricName.CLOCKS_HARDWARE_SLOWDOWN, "a hardware slowdown"),
)


def _throttled(evidence: Evidence, result: Diagnosis) -> None:
    """Clocks held down by power, temperature or the hardware for at least RADT_THROTTLE_SHARE of the run."""
    if evidence.gpus and not any(name in g.series for g in evidence.gpus for name, _ in THROTTLE_REASONS):
        result.lacking.append("throttled (no clock event reason series)")
        return
    said, spans = [], []
    for gpu in evidence.gpus:
        for name, why in THROTTLE_REASONS:
            window = gpu.series.get(name)
            stats = window.stats() if window else None
            if stats and stats.mean >= settings.THROTTLE_SHARE.get():
                said.append(f"{gpu.device.label} by {why} {stats.mean:.0%} of the time")
                spans += [int(ms) for ms, m in zip(window.bucket_ms, window.mean) if math.isfinite(m) and m > 0]
    if said:
        span = (min(spans), max(spans) + evidence.bucket_s * 1000) if spans else None
        result.findings.append(Finding(THROTTLED, f"clocks held down ({'; '.join(said)}); {ACTIONS[THROTTLED]}", span))


def _hardware_errors(evidence: Evidence, result: Diagnosis) -> None:
    """XID events, and uncorrected ECC errors that rose during the run."""
    names = (MetricName.XID_ERROR, MetricName.ECC_ERRORS_UNCORRECTED)
    if evidence.gpus and not any(n in g.series for g in evidence.gpus for n in names):
        result.lacking.append("hardware_errors (no XID or ECC series)")
        return
    found = [said for gpu in evidence.gpus for said in (_xids(gpu), _ecc(gpu)) if said is not None]
    if found:
        text = "; ".join(said for said, _ in found)
        span = (min(first for _, first in found), evidence.end_ms)
        result.findings.append(Finding(HARDWARE_ERRORS, f"hardware errors ({text}); {ACTIONS[HARDWARE_ERRORS]}", span))


def _xids(gpu: GpuEvidence) -> tuple[str, int] | None:
    """('GPU 0: XID 79 (1 windows)', the first window's ms) where the GPU reported XID events; else None."""
    xid = gpu.series.get(MetricName.XID_ERROR)
    hits = [(int(ms), int(h)) for ms, h in zip(xid.bucket_ms, xid.high) if math.isfinite(h) and h > 0] if xid else []
    if not hits:
        return None
    codes = ", ".join(str(c) for c in sorted({c for _, c in hits}))
    return f"{gpu.device.label}: XID {codes} ({len(hits)} windows)", hits[0][0]


def _ecc(gpu: GpuEvidence) -> tuple[str, int] | None:
    """('GPU 0: 2 uncorrected ECC errors', the series' first ms) where the volatile count rose during the run; else None."""
    ecc = gpu.series.get(MetricName.ECC_ERRORS_UNCORRECTED)
    highs = [v for v in ecc.high if math.isfinite(v)] if ecc else []
    lows = [v for v in ecc.low if math.isfinite(v)] if ecc else []
    if not highs or not lows or max(highs) <= min(lows):
        return None
    return f"{gpu.device.label}: {max(highs) - min(lows):.0f} uncorrected ECC errors", int(ecc.bucket_ms[0])


def _straggler(evidence: Evidence, result: Diagnosis) -> None:
    """In a run of several working GPUs, the one whose SMACT lags the median of the others by RADT_STRAGGLER_LAG or more."""
    working = [g for g in _working(evidence) if g.used is not False]
    means = {g.device: m for g in working if (m := _means(g, MetricName.SM_ACTIVE)[0]) is not None}
    if len(means) < 2:
        return
    lag = settings.STRAGGLER_LAG.get()
    said = []
    for device, mean in sorted(means.items(), key=lambda item: item[0].sort_key()):
        others = sorted(m for d, m in means.items() if d != device)
        median = others[len(others) // 2] if len(others) % 2 else (others[len(others) // 2 - 1] + others[len(others) // 2]) / 2
        if median > 0 and mean < (1 - lag) * median:
            said.append(f"{device.label} SMACT {mean:.2f} against a median of {median:.2f} on the other {len(others)}")
    if said:
        result.findings.append(Finding(STRAGGLER, f"a straggler ({'; '.join(said)}); {ACTIONS[STRAGGLER]}", (evidence.start_ms, evidence.end_ms)))


def nominal_gb(total_mb: float | None) -> int | None:
    """The GPU's memory as NVIDIA names it (40, 80, 141 GB) from what the driver reports (MB of 10^6 bytes), or its GiB rounded."""
    if not total_mb or total_mb <= 0:
        return None
    gib = total_mb * 1e6 / GIB
    near = min(MIG_SLICES, key=lambda gb: abs(gb - gib))
    return near if abs(near - gib) <= 0.03 * near else round(gib)


def smaller_slice(peak_mb: float, smact_p95: float | None, model: str, total_mb: float | None) -> str | None:
    """The smallest MIG slice of this GPU model that holds the peak memory and (where known) the SM activity's p95."""
    size = nominal_gb(total_mb)
    if size is None or not MIG_MODELS.search(model or "") or size not in MIG_SLICES:
        return None
    for name in MIG_SLICES[size]:
        sevenths = int(name.split("g.")[0])
        holds_memory = peak_mb * 1e6 <= SLICE_FILL * int(name.split(".")[1][:-2]) * GIB
        holds_work = smact_p95 is None or smact_p95 <= sevenths / MIG_SEVENTHS
        if holds_memory and holds_work:
            return name
    return None


def _peak_memory(gpu: GpuEvidence) -> float | None:
    for name in (MetricName.PROCESS_MEMORY_MEGABYTES, MetricName.MEMORY_USAGE_MEGABYTES):
        stats = gpu.series[name].stats() if name in gpu.series else None
        if stats:
            return stats.peak
    return None


def _fits_smaller(evidence: Evidence, result: Diagnosis) -> None:
    """Every working GPU's peak memory and SM activity fit a smaller MIG slice of that GPU model."""
    if any(g.device.mig is not None for g in evidence.gpus):
        return  # already in a slice
    working = _working(evidence)
    said = []
    for gpu in working:
        peak = _peak_memory(gpu)
        if peak is None:
            continue
        smact = gpu.series[MetricName.SM_ACTIVE].stats() if MetricName.SM_ACTIVE in gpu.series else None
        fits = smaller_slice(peak, smact.p95 if smact else None, gpu.model, gpu.memory_total_mb)
        if fits is None:
            return  # one GPU that needs the whole of it: no finding
        activity = f", SMACT p95 {smact.p95:.2f}" if smact else ""
        said.append(f"{gpu.device.label}: peak memory {peak / 1000:.1f} GB of {nominal_gb(gpu.memory_total_mb)} GB{activity}: fits a {fits} MIG slice")
    if said:
        result.findings.append(Finding(FITS_SMALLER, f"{'; '.join(said)}; {ACTIONS[FITS_SMALLER]}", (evidence.start_ms, evidence.end_ms)))


# --- could_share: pairs of runs ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sharer:
    """A one-GPU run's figures for could_share: its SMACT mean and p95, memory peak and GPU size."""

    run_id: str
    name: str
    user: str
    smact_mean: float
    smact_p95: float
    memory_peak_mb: float
    memory_total_mb: float
    command: str = ""


def sharer(evidence: Evidence) -> Sharer | None:
    """The run as a could_share candidate: one working GPU with SMACT, memory and its size known; else None."""
    if len(evidence.gpus) != 1:
        return None
    gpu = evidence.gpus[0]
    smact = gpu.series[MetricName.SM_ACTIVE].stats() if MetricName.SM_ACTIVE in gpu.series else None
    peak = _peak_memory(gpu)
    if smact is None or peak is None or not gpu.memory_total_mb:
        return None
    return Sharer(evidence.run_id, evidence.name, evidence.user, smact.mean, smact.p95, peak, gpu.memory_total_mb, evidence.command)


def share_partners(runs: Sequence[Sharer], measured: Mapping[str, Gain] | None = None) -> dict[str, Finding]:
    """run id -> its could_share finding, for each one-GPU run under RADT_SHARE_BELOW. `measured`: run id -> the collocation
    gain the store measured for its command (throughput.command_gains): where there is one it decides (above 1: the runs
    did more work per hour together than one after another; at or below 1 no finding), else the estimate does (a partner
    whose SMACT p95 and memory peak fit beside its own on the same size of GPU). The partner named is the one that fits
    and keeps the GPU busiest."""
    below = settings.SHARE_BELOW.get()
    found: dict[str, Finding] = {}
    for run in runs:
        if run.smact_mean >= below:
            continue
        fits = [
            o
            for o in runs
            if o.run_id != run.run_id
            and abs(o.memory_total_mb - run.memory_total_mb) <= 0.03 * run.memory_total_mb
            and run.smact_p95 + o.smact_p95 <= SHARE_SMACT
            and run.memory_peak_mb + o.memory_peak_mb <= SHARE_MEMORY * run.memory_total_mb
        ]
        gain = (measured or {}).get(run.run_id)
        if gain.gain <= 1 if gain is not None else not fits:
            continue
        best = max(fits, key=lambda o: (o.smact_mean, o.run_id)) if fits else None
        found[run.run_id] = Finding(
            COULD_SHARE, _share_sentence(run, best, gain, looked=measured is not None), None, {"partner_smact_mean": best.smact_mean} if best else {}
        )
    return found


def _share_sentence(run: Sharer, best: Sharer | None, gain: Gain | None, looked: bool) -> str:
    """could_share's sentence: with whom and the figures that fit, and whether the store measured it or radt estimated it
    (`looked`: whether the store's measured figures were read at all; through an MLflow server they are not)."""
    groups = f"{gain.groups} collocated group{'s' if gain.groups != 1 else ''}" if gain else ""
    basis = (
        f"measured: runs of this command did {gain.gain:.2f}× the work per hour together as alone ({groups} in this store)"
        if gain is not None
        else "estimated from the two runs' own figures; "
        + (
            "no collocated run of this command is measured in this store"
            if looked
            else "measured figures are read where radt reads the store itself, not through a server"
        )
    )
    if best is None:
        return (
            f"could share its GPU: SMACT p95 {run.smact_p95:.2f}, memory {run.memory_peak_mb / 1000:.1f} GB of {run.memory_total_mb / 1000:.0f} GB "
            f"({basis}); run it beside another run of this command on one GPU (MPS) and free a GPU"
        )
    return (
        f"could share one GPU with {best.name or best.run_id} ({best.user or 'unknown user'}): SMACT p95 {run.smact_p95:.2f} + {best.smact_p95:.2f}, "
        f"memory {run.memory_peak_mb / 1000:.1f} + {best.memory_peak_mb / 1000:.1f} GB of {run.memory_total_mb / 1000:.0f} GB ({basis}); "
        f"{ACTIONS[COULD_SHARE]}"
    )
