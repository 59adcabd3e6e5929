"""Which GPU exporters a cluster's Prometheus holds, and what they say of a Slurm job's GPUs.

A cluster runs dcgm-exporter, Princeton's jobstats exporters (nvidia_gpu_*, cgroup_*) or radt monitor; radt asks
Prometheus which (its index: one label-values call for the families' marker series), never a setting, and looks for a
node's series by the label that exporter names its node with: one of its own (dcgm-exporter's Hostname), or only the
scrape target Prometheus gives it (`instance`, node:9445 as jobstats' set-up names its targets).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from radt.catalogue import (
    DCGM_EXPORTER_FB_FREE,
    DCGM_EXPORTER_NAMES,
    EXPORTER_FAMILIES,
    EXPORTER_METRICS,
    NVIDIA_GPU_EXPORTER_MEMORY_TOTAL,
    NVIDIA_GPU_EXPORTER_METRICS,
    ExporterFamily,
    MetricName,
    exporter_names,
)
from radt.collectors.sources.promql import (
    INSTANCE,
    JOB_LABELS,
    JOBID,
    TIMEOUT,
    duration,
    gpu_index,
    host_matcher,
    label_values,
    looked_for,
    query,
    selector,
    series,
    string_literal,
)

GPU_FAMILIES = tuple(f for f in EXPORTER_FAMILIES if set(f.metrics) <= set(EXPORTER_METRICS))
JOB_FAMILIES = tuple(f for f in EXPORTER_FAMILIES if f not in GPU_FAMILIES)  # a Slurm job's own series (the cgroup exporter's)
MIB_BYTES = 1024 * 1024


def present(url: str, start_ms: int | None = None, end_ms: int | None = None, timeout: float = TIMEOUT) -> tuple[ExporterFamily, ...]:
    """The exporters whose marker series Prometheus holds over [start_ms, end_ms] (all it holds without them)."""
    markers = [m for family in EXPORTER_FAMILIES for m in family.markers]
    names = set(label_values(url, "__name__", selector(None, metrics=markers), start_ms, end_ms, timeout))
    return tuple(family for family in EXPORTER_FAMILIES if names & set(family.markers))


def node_labels(labels: Sequence[str], families: Iterable[ExporterFamily]) -> tuple[str, ...]:
    """`labels`, and `instance` where an exporter present names its node only by its scrape target (jobstats'): after
    them where another names its node itself (dcgm-exporter's Hostname), whose series are preferred; else first."""
    families = tuple(families)
    if INSTANCE in labels or all(f.node_label for f in families):
        return tuple(labels)
    return (*labels, INSTANCE) if any(f.node_label for f in families) else (INSTANCE, *labels)


def exporter_word(names: Sequence[str] | None) -> str:
    """How a "no series" line names what it looked for: the GPU exporters the cluster runs (None: not asked, radt's
    first, dcgm-exporter); where Prometheus holds none, the series that would have said one was there."""
    if names is None:
        return GPU_FAMILIES[0].name
    if names:
        return " or ".join(names)
    return "GPU exporter (Prometheus holds no " + ", ".join(m for f in GPU_FAMILIES for m in f.markers) + ")"


class JobSpan(NamedTuple):
    """A Slurm job as Prometheus is asked about it: the ids its exporters may label it with, its span."""

    ids: tuple[str, ...]
    start_ms: int
    end_ms: int


class Labelled(NamedTuple):
    """The GPUs an exporter labelled with a job, and which label said so (jobid, hpc_job)."""

    label: str
    gpus: tuple[int, ...]


class JobLabelled(NamedTuple):
    """Where an exporter says which Slurm job has a GPU: the series it is looked for on (the first names it in lines)
    and the labels naming the job there."""

    family: ExporterFamily
    metrics: tuple[str, ...]
    labels: tuple[str, ...]


# dcgm-exporter's (any has one of these four; hpc_job from its --hpc-job-mapping-dir, jobid from a prolog), jobstats' NVML
# exporter's (jobid, from its prolog's /run/gpustat)
LABELLED_BY: tuple[JobLabelled, ...] = (
    JobLabelled(GPU_FAMILIES[0], tuple(DCGM_EXPORTER_NAMES[tag] for tag in ("GPUTL", "SMACT", "FBUSD", "POWER")), JOB_LABELS),
    JobLabelled(
        GPU_FAMILIES[1],
        exporter_names(NVIDIA_GPU_EXPORTER_METRICS, MetricName.UTILIZATION_PERCENTAGE, MetricName.MEMORY_USAGE_MEGABYTES, MetricName.POWER_USAGE_WATTS),
        (JOBID,),
    ),
)


def _asked(families: Iterable[ExporterFamily] | None) -> tuple[JobLabelled, ...]:
    """LABELLED_BY's entries for the exporters a cluster runs (None: not known, every one); where it runs none of them, every one."""
    if families is None:
        return LABELLED_BY
    families = tuple(families)
    return tuple(entry for entry in LABELLED_BY if entry.family in families) or LABELLED_BY


_INDEXES = "gpu, ordinal, minor_number"  # promql.GPU_INDEX_LABELS, as a `by` clause keeps them


def labelled_gpus(
    url: str, host: str, host_labels: Iterable[str], job: JobSpan, timeout: float = TIMEOUT, families: Iterable[ExporterFamily] | None = None
) -> Labelled | None:
    """The node's GPUs whose series an exporter labelled with one of the job's ids over its span (dcgm-exporter's
    hpc_job from its HPC job mapping, a prolog's jobid, jobstats' jobid); None where no series carries such a label. A
    MIG slice's series name a slice, not a GPU of the job's own: they are not taken. One query per node label tried: the
    parts are per metric (count_over_time drops the metric's name, and two metrics of one GPU would clash) joined by `or`,
    asked of the exporters in `families` (those the cluster runs: present(); None, every one)."""
    asked = _asked(families)
    wanted = string_literal("|".join(re.escape(j) for j in dict.fromkeys(job.ids) if j))
    span = duration(job.start_ms, job.end_ms)
    for host_label in host_labels:
        where = host_matcher(host, host_label)
        parts = [
            f"count by ({_INDEXES}, GPU_I_ID, {label}) (count_over_time({metric}{{{where}, {label}=~{wanted}}}[{span}]))"
            for entry in asked
            for label in entry.labels
            for metric in entry.metrics
        ]
        found = query(url, " or ".join(parts), at=job.end_ms / 1000, timeout=timeout)
        for label in JOB_LABELS:
            gpus = sorted({gpu_index(s.labels) for s in found if s.labels.get(label) and gpu_index(s.labels) is not None and not s.labels.get("GPU_I_ID")})
            if gpus:
                return Labelled(label, tuple(gpus))  # type: ignore[arg-type]
    return None


def unlabelled(url: str, nodes: Iterable[str], host_labels: Sequence[str], job: JobSpan, timeout: float = TIMEOUT) -> str:
    """': looked for DCGM_FI_DEV_GPU_UTIL{hpc_job|jobid}, nvidia_gpu_duty_cycle{jobid}; found nvidia_gpu_duty_cycle without
    jobid on node1': what a "no exporter series is labelled with the job" line asked Prometheus for, and what the job's
    nodes' series over its time were instead (their label sets, from Prometheus' index); every exporter's labels are named,
    whichever the cluster runs."""
    looked = ", ".join(f"{entry.metrics[0]}{{{'|'.join(sorted(entry.labels))}}}" for entry in LABELLED_BY)
    found = [_found_on(url, node, host_labels, job, timeout) for node in nodes]
    return f": looked for {looked}; found {'; '.join(found)}"


def _found_on(url: str, node: str, host_labels: Sequence[str], job: JobSpan, timeout: float) -> str:
    """What the node's marker series say of jobs over the span: 'nvidia_gpu_duty_cycle without jobid on node1',
    'DCGM_FI_DEV_GPU_UTIL labelled hpc_job=4712 (other jobs) on node1', 'no series of Hostname=node1 or instance=node1'."""
    for host_label in host_labels:
        sets = series(url, selector(node, host_label, [entry.metrics[0] for entry in LABELLED_BY]), job.start_ms, job.end_ms, timeout)
        if not sets:
            continue
        said = []
        for entry in LABELLED_BY:
            metrics, labels = entry.metrics, entry.labels
            mine = [s for s in sets if s.get("__name__") == metrics[0]]
            if not mine:
                continue
            bare = any(not any(s.get(label) for label in labels) for s in mine)
            jobs = sorted({f"{label}={s[label]}" for s in mine for label in labels if s.get(label) and s[label] not in job.ids})
            parts = [f"without {'|'.join(sorted(labels))}"] if bare else []
            parts += [f"labelled {', '.join(jobs[:3])}{' ...' if len(jobs) > 3 else ''} (other jobs)"] if jobs else []
            said.append(f"{metrics[0]} {' and '.join(parts)}")
        return f"{', '.join(said)} on {node}"
    return f"no series of {looked_for(node, host_labels)}"


class GpuMemory(NamedTuple):
    """A GPU's memory as its driver reports it (MiB: dcgm-exporter's FB_FREE + FB_USED, the NVML exporter's memory total),
    and its model name (dcgm-exporter's modelName, the NVML exporter's name)."""

    total_mib: float
    model: str


def gpu_memory(url: str, host: str, host_labels: Iterable[str], gpus: Iterable[int], start_ms: int, end_ms: int, timeout: float = TIMEOUT) -> GpuMemory | None:
    """The memory and model of the node's GPUs `gpus` (the largest of them), from dcgm-exporter's last FB_FREE and FB_USED
    over [start_ms, end_ms], else jobstats' NVML exporter's memory total; None where neither publishes it for them."""
    span = duration(start_ms, end_ms)
    gpus = set(gpus)
    wanted = string_literal("|".join(str(g) for g in sorted(gpus)))
    for host_label in host_labels:
        where = f'{host_matcher(host, host_label)}, gpu=~{wanted}, GPU_I_ID=""'
        free, used = (f"last_over_time({name}{{{where}}}[{span}])" for name in (DCGM_EXPORTER_FB_FREE, DCGM_EXPORTER_NAMES["FBUSD"]))
        found = query(url, f"max by (gpu, modelName) ({free} + {used} or {free})", at=end_ms / 1000, timeout=timeout)
        sizes = [(s.samples[0][1], s.labels.get("modelName", "")) for s in found if s.samples and math.isfinite(s.samples[0][1])]
        if not sizes:  # jobstats' NVML exporter: bytes, by `ordinal` (else minor_number), the model in `name`
            total = f'last_over_time({NVIDIA_GPU_EXPORTER_MEMORY_TOTAL}{{{host_matcher(host, host_label)}, GPU_I_ID=""}}[{span}])'
            found = query(url, f"max by ({_INDEXES}, name) ({total})", at=end_ms / 1000, timeout=timeout)
            sizes = [(s.samples[0][1] / MIB_BYTES, s.labels.get("name", "")) for s in found if s.samples and gpu_index(s.labels) in gpus]
        if sizes:
            return GpuMemory(*max(sizes))
    return None
