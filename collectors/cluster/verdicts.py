"""A job's GPU efficiency from its GPUs' series, the way cluster tools (jobstats, jobscope) judge it: numbers and flags.

Over the job's own GPUs only: SM activity (SMACT) mean and p95, occupancy, tensor and DRAM activity means, the share of
samples each GPU sat idle, GPUs allocated but never used, peak memory, energy. Flags say what a person would act on,
each with the numbers behind it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from radt.catalogue import Device, MetricName
from radt.runmodel import VERDICT_PREFIX

IDLE_SMACT = 0.01  # a sample below this SM activity is an idle GPU (dcgm-exporter's SMACT is 0..1)
LOW_SMACT = 0.1  # "SMACT < 0.1" flag: the job's GPUs together below this ...
LOW_SHARE = 0.8  # ... for at least this share of its samples
# The MIG slices up to 3g of each GPU that has MIG, by its memory as NVIDIA names it (GB); a slice holds about 95 % of its
# name's GiB (A100 40GB's 1g.5gb: 4,864 MiB). A GPU of another size, or of none known, gets no slice named.
MIG_SLICES: dict[int, tuple[str, ...]] = {
    24: ("1g.6gb", "2g.12gb"),  # A30
    40: ("1g.5gb", "2g.10gb", "3g.20gb"),  # A100 40GB
    80: ("1g.10gb", "2g.20gb", "3g.40gb"),  # A100 80GB, H100 80GB
    94: ("1g.12gb", "2g.24gb", "3g.47gb"),  # H100 NVL
    141: ("1g.18gb", "2g.35gb", "3g.71gb"),  # H200
}
MIG_MODELS = re.compile(r"\b(A30|A100|A800|H100|H800|H20|H200|GH200)\b")  # the GPUs with MIG, by dcgm-exporter's modelName
SLICE_FILL = 0.95  # of a slice's nominal GiB that it holds
SMALL_SHARE = 0.25  # on a GPU without MIG: a peak under this share of its memory is said (MPS could share it)
GIB = 1024**3
_KEY = re.compile(r"^system/(?:([^/]+)/)?gpu_(\d+)_(.+)$")  # system/gpu_0_sm_active, or a node's: system/gpu01/gpu_0_sm_active
Gpu = int | tuple[str, int]  # a GPU of a one-node job by its index; of a job on several nodes, (node, index)


class Verdict(NamedTuple):
    """Flags (one line each, with their numbers) and the numbers, keyed as the run's radt.verdict.* tags."""

    flags: list[str]
    numbers: dict[str, float]

    def tags(self) -> dict[str, str]:
        tags = {f"{VERDICT_PREFIX}{k}": (f"{v:.4g}" if isinstance(v, float) else str(v)) for k, v in self.numbers.items()}
        tags[f"{VERDICT_PREFIX}flags"] = "; ".join(self.flags) or "none"
        return tags


def _p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _energy_kj(points: Sequence[tuple[int, float]]) -> float:
    """Watts over time (ms) to kJ, by the trapezoid rule between samples."""
    ordered = sorted(points)
    return math.fsum((b[0] - a[0]) / 1000 * (a[1] + b[1]) / 2 for a, b in zip(ordered, ordered[1:])) / 1000


def nominal_gb(total_mib: float | None) -> int | None:
    """The GPU's memory as NVIDIA names it (40, 80, 141 GB) from what the driver reports (MiB), or its GiB rounded."""
    if not total_mib or total_mib <= 0:
        return None
    gib = total_mib / 1024
    near = min(MIG_SLICES, key=lambda gb: abs(gb - gib))
    return near if abs(near - gib) <= 0.03 * near else round(gib)


def memory_flag(peak_gb: float, size: int | None, total_mib: float | None, model: str = "") -> str | None:
    """'peak memory 5.5 GB of 80 GB per GPU: fits a 1g.10gb MIG slice' on a GPU with MIG (by its model name); elsewhere a
    peak under a quarter of the GPU; None where the GPU's size is not known or nothing smaller holds the peak."""
    if size is None or not total_mib:
        return None
    head = f"peak memory {peak_gb:.1f} GB of {size} GB per GPU"
    slices = MIG_SLICES.get(size) if MIG_MODELS.search(model or "") else None
    if slices is not None:
        fits = next((name for name in slices if peak_gb * 1e9 <= SLICE_FILL * int(name.split(".")[1][:-2]) * GIB), None)
        return f"{head}: fits a {fits} MIG slice" if fits else None
    share = peak_gb * 1e9 / (total_mib * 1024 * 1024)
    return f"{head} ({share:.0%})" if share < SMALL_SHARE else None


def _order(gpu: Gpu) -> tuple[str, int]:
    return gpu if isinstance(gpu, tuple) else ("", gpu)


def _names(gpus: Sequence[Gpu]) -> str:
    """'GPU 1, 3' on one node; on several, as the dashboard names them: 'gpu01 · GPU 1, gpu02 · GPU 0' ('GPU gpu01 1' before)."""
    if all(isinstance(g, int) for g in gpus):
        return "GPU " + ", ".join(map(str, gpus))
    return ", ".join(Device(node=g[0], gpu=g[1]).label if isinstance(g, tuple) else Device(gpu=g).label for g in gpus)


def _where(gpu: Gpu) -> str:
    """A GPU's part of a verdict number's name: gpu_1, or a node's gpu01/gpu_1."""
    return f"{gpu[0]}/gpu_{gpu[1]}" if isinstance(gpu, tuple) else f"gpu_{gpu}"


def judge(series: Mapping[str, Sequence[tuple[int, float]]], gpus: Sequence[Gpu], memory_total_mib: float | None = None, model: str = "") -> Verdict:
    """The verdict of a job whose GPUs `gpus` gave `series` ({'system/gpu_<i>_<metric>': [(ms, value)]}; a job on several
    nodes: GPUs (node, i) and keys 'system/<node>/gpu_<i>_<metric>'); other GPUs' keys are ignored. `memory_total_mib`: the memory of each of its GPUs, as the driver reports it (the exporter's FB_FREE +
    FB_USED) and `model` its name (the exporter's modelName), which a MIG slice that could hold the job is said against;
    without them no slice is named."""
    by_gpu = _by_gpu(series, gpus)
    numbers: dict[str, float] = {"gpus": len(gpus)}
    flags: list[str] = []
    smact = {g: [v for _, v in m.get(MetricName.SM_ACTIVE, [])] for g, m in by_gpu.items() if m.get(MetricName.SM_ACTIVE)}
    if smact:
        _judge_activity(by_gpu, smact, len(gpus), numbers, flags)
    _judge_memory(by_gpu, memory_total_mib, model, numbers, flags)
    power = [m[MetricName.POWER_USAGE_WATTS] for m in by_gpu.values() if m.get(MetricName.POWER_USAGE_WATTS)]
    if power:
        numbers["energy_kj"] = math.fsum(_energy_kj(p) for p in power)
    if not smact:
        flags.append("no SM activity series for the job's GPUs: no verdict on its use")
    return Verdict(flags, numbers)


def _by_gpu(series: Mapping[str, Sequence[tuple[int, float]]], gpus: Sequence[Gpu]) -> dict[Gpu, dict[str, list[tuple[int, float]]]]:
    """GPU -> metric -> its finite points, for the job's own GPUs only."""
    by_gpu: dict[Gpu, dict[str, list[tuple[int, float]]]] = {g: {} for g in gpus}
    for key, points in series.items():
        match = _KEY.match(key)
        if not match:
            continue
        gpu: Gpu = (match.group(1), int(match.group(2))) if match.group(1) else int(match.group(2))
        if gpu in by_gpu:
            by_gpu[gpu][match.group(3)] = [p for p in points if math.isfinite(p[1])]
    return by_gpu


def _judge_activity(by_gpu: Mapping[Gpu, Mapping[str, list]], smact: Mapping[Gpu, list[float]], gpus: int, numbers: dict, flags: list) -> None:
    """SMACT mean and p95, the other activity means, each GPU's idle share, the GPUs never used and the low-SMACT share."""
    every = [v for values in smact.values() for v in values]
    numbers["smact_mean"], numbers["smact_p95"] = _mean(every), _p95(every)
    for name, metric in (("smocc_mean", MetricName.SM_OCCUPANCY), ("tensor_mean", MetricName.TENSOR_ACTIVE), ("drama_mean", MetricName.DRAM_ACTIVE)):
        values = [v for m in by_gpu.values() for _, v in m.get(metric, [])]
        if values:
            numbers[name] = _mean(values)
    idle = {g: sum(v < IDLE_SMACT for v in values) / len(values) for g, values in smact.items()}
    for g, share in sorted(idle.items(), key=lambda item: _order(item[0])):
        numbers[f"{_where(g)}_idle_share"] = share
    unused = sorted((g for g, values in smact.items() if max(values) < IDLE_SMACT), key=_order)
    numbers["gpus_unused"] = len(unused)
    if unused:
        flags.append(f"{len(unused)} of {gpus} GPUs idle ({_names(unused)}: SMACT never reached {IDLE_SMACT})")
    by_time: dict[int, list[float]] = {}
    for values in (m.get(MetricName.SM_ACTIVE, []) for m in by_gpu.values()):
        for ms, v in values:
            by_time.setdefault(ms, []).append(v)
    low = sum(_mean(v) < LOW_SMACT for v in by_time.values()) / len(by_time)
    numbers["smact_low_share"] = low
    if low >= LOW_SHARE:
        flags.append(f"SMACT < {LOW_SMACT} for {low:.0%} of the time (mean {numbers['smact_mean']:.3f}, p95 {numbers['smact_p95']:.3f})")


def _judge_memory(by_gpu: Mapping[Gpu, Mapping[str, list]], memory_total_mib: float | None, model: str, numbers: dict, flags: list) -> None:
    """The GPUs' nominal size and the job's memory peak, with the flag naming what would hold it."""
    memory = [v for m in by_gpu.values() for _, v in m.get(MetricName.MEMORY_USAGE_MEGABYTES, [])]
    size = nominal_gb(memory_total_mib)
    if size is not None:
        numbers["memory_total_gb"] = size
    if memory:
        peak_gb = max(memory) / 1000
        numbers["memory_peak_gb"] = peak_gb
        said = memory_flag(peak_gb, size, memory_total_mib, model)
        if said:
            flags.append(said)


# --- which jobs could share one GPU under MPS -------------------------------------------------------------------------

SHARE_BELOW = 0.5  # a job is worth sharing a GPU with when its SMACT mean is below this
SHARE_SMACT = 1.0  # two jobs fit one GPU when their SMACT p95s add up to at most this (MPS runs their kernels side by side) ...
SHARE_MEMORY = 0.9  # ... and their memory peaks to at most this share of the GPU's memory


class Judged(NamedTuple):
    """A one-GPU job's verdict with what names it: the facts the sharing flag says."""

    job_id: str
    name: str
    user: str
    numbers: Mapping[str, float]


def share_partners(jobs: Sequence[Judged]) -> dict[str, tuple[Judged, str]]:
    """job id -> (the job it could share one GPU with under MPS, the flag saying so with the numbers), for each
    one-GPU job whose SMACT mean is under SHARE_BELOW and that has a partner of the same GPU size whose SMACT p95 and
    memory peak fit beside its own (SHARE_SMACT, SHARE_MEMORY); of those, the partner that would keep the GPU busiest."""
    usable = [j for j in jobs if j.numbers.get("gpus") == 1 and {"smact_mean", "smact_p95", "memory_peak_gb", "memory_total_gb"} <= set(j.numbers)]
    found: dict[str, tuple[Judged, str]] = {}
    for job in usable:
        n = job.numbers
        if n["smact_mean"] >= SHARE_BELOW:
            continue
        fits = [
            other
            for other in usable
            if other.job_id != job.job_id
            and other.numbers["memory_total_gb"] == n["memory_total_gb"]
            and n["smact_p95"] + other.numbers["smact_p95"] <= SHARE_SMACT
            and n["memory_peak_gb"] + other.numbers["memory_peak_gb"] <= SHARE_MEMORY * n["memory_total_gb"]
        ]
        if not fits:
            continue
        best = max(fits, key=lambda o: (o.numbers["smact_mean"], o.job_id))
        m = best.numbers
        found[job.job_id] = (
            best,
            f"could share a GPU under MPS with a job like {best.job_id} ({best.name}, {best.user}): SMACT p95 {n['smact_p95']:.2f} + "
            f"{m['smact_p95']:.2f}, memory {n['memory_peak_gb']:.1f} + {m['memory_peak_gb']:.1f} GB of {n['memory_total_gb']:.0f} GB",
        )
    return found
