"""`radt demo`: a demo experiment set in the chosen store, so a newcomer sees real-looking plots at once.

Two experiments, both named "demo: ..." and tagged `radt.demo=true` (every run too):

- "demo: resnet50 collocation": the same ResNet-50 training alone on GPU 0 (workload "1 alone"),
  two of it time-sliced on GPU 0 ("2 same GPU", collocation "-"), two under MPS ("3 MPS",
  collocation "mps") and two in MIG instances ("4 MIG 3g.40gb", collocation "3g.40gb").
- "demo: bert fine-tuning": BERT starved by a single data-loader worker ("1 workers 1"), the same
  with eight workers ("2 workers 8"), and a BERT-large run that dies of CUDA out-of-memory
  ("3 bert-large batch 64", status FAILED).

Workloads are radt parent runs (tag `radt.workload`) with their runs as children, tagged and
parametrised as `radt` tags real runs. Every run holds 1 Hz series of the keys a real `nvml+host`
run writes for GPU 0 (SMACT, SMOCC, GRACT, DRAMA, tensor activity, GPU util, memory, power,
cumulative energy, temperature; system CPU and memory, the run's CPU and RSS; a MIG run: its
slice's, below) with an increasing step and real timestamps, plus its loss and accuracy per epoch
(step = epoch). The shapes follow real training: start-up with the GPU idle, warm-up, steady epochs
with noise, an evaluation pause and a checkpoint at each epoch end, data-loader stalls (GPU activity
near zero, CPU up), GPU memory ramping then flat, power and temperature following activity.

Collocated runs record what NVML and DCGM record, which count per device: on a GPU shared by
time-slicing or MPS both runs' SMACT, SMOCC, GRACT, DRAMA, utilisation, memory and power series are
the GPU's totals, the same values at the same moment in both (but each run's own GPU memory, which NVML's per-process
lists give: `process_memory_megabytes`), at or above the run alone's (two runs
leave the GPU idle less than one: MPS, whose kernels run at once, more than time-slicing), capped at
1; while each run's own throughput drops (it takes 1.5 to 1.8 times as long, so its steps/h ÷ the
run alone's is below 1, the pair's sum above 1, MPS's the most). A MIG run records its slice under
the slice's keys (`system/gpu_0_mig_<gi>_...`, GPU instances 1 and 2): its own activity as
fractions of the whole GPU, so a 3g.40gb instance tops out at 3/7 of the SMs, and its own memory of
40 GB; the GPU's power, energy, temperature and memory stay under the GPU's keys (the whole GPU's:
both slices), and it has no GPU utilisation (NVML gives none in MIG mode).

All values come from a seeded generator (`--seed`), so the same seed and `--minutes` give the same
values; only the timestamps move: the workloads run one after another and the last one ends shortly
before now. `--minutes` is the length of the run alone; collocated runs take proportionally longer
(up to twice), so the default 15 gives runs of 8 to 30 minutes, about 200,000 points, written
one bulk statement per run (in the background, several runs at once on PostgreSQL).

Running it again leaves a complete demo alone. `--reset` (or a demo left incomplete, or deleted) first retires
the existing demo experiments: MLflow's delete is a soft delete that keeps the name, so each is
renamed "<name> (replaced <time> <id>)" and then deleted; `mlflow gc` frees their space for good.
"""

from __future__ import annotations

import getpass
import json
import math
import os
import sys
import time
import uuid
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import sqlalchemy as sa

from radt import settings
from radt.catalogue import MIB, MetricName, key
from radt.collectors.diagnose.stored import diagnose_and_store
from radt.collectors.sources.gpushare import power_estimate
from radt.collectors.store.stores import MetricStore, StoreUnavailable, open_metric_store
from radt.collectors.store.tracking import NewRun, connect, create_run, find_runs, redact, resolve_experiment, set_tags
from radt.collocation import MPS, SHARED
from radt.errors import UserError
from radt.options import store_parent
from radt.points import Point
from radt.runmodel import (
    DEMO_TAG,
    EXIT_CODE_TAG,
    GPUS_TAG,
    HOST_TAG,
    INTERVAL_TAG,
    NOTE_TAG,
    PID_TAG,
    POINTS_TAG,
    ROLE_TAG,
    RUN_ROLE,
    USER_TAG,
    WORKLOAD_ROLE,
    WORKLOAD_TAG,
)
from radt.settings import default_store_uri, is_database_uri, tracking_uri

COMPLETE_TAG = "radt.demo.complete"
HOST = "demo-h100-01"
GPU = 0
GPU_TOTAL_MB = 81_559 * MIB  # H100 80GB HBM3 as NVML reports it
GPU_NAME = "NVIDIA H100 80GB HBM3"
DEMO_UUID = "GPU-d3e0d3e0-0000-4000-8000-000000000000"  # made up, as everything here
IDLE_W = 70.0
CONTEXT_W = 28.0  # extra draw of an idle GPU that holds a CUDA context
POWER_CAP_W = 570.0  # the enforced power limit the demo's GPU is held to (an H100 SXM's 700 W capped by its site): MPS runs reach it
HOST_MEMORY_MB = 41_000.0
INTERVAL_S = 1
DEFAULT_MINUTES = 15.0
GAP_S = 75  # between workloads, as an experiment CSV runs them one after another
END_BEFORE_NOW_S = 120
SETTINGS = {INTERVAL_TAG: "1.0", "max_epoch": "None", "max_time": "None", "manual": "False"}

# phases of a run's timeline
STARTUP, WARMUP, TRAIN, STALL, EVAL, CHECKPOINT, TEARDOWN = range(7)

GPU_METRICS = [
    MetricName.SM_ACTIVE,
    MetricName.SM_OCCUPANCY,
    MetricName.GR_ENGINE_ACTIVE,
    MetricName.DRAM_ACTIVE,
    MetricName.TENSOR_ACTIVE,
    MetricName.UTILIZATION_PERCENTAGE,
    MetricName.MEMORY_USAGE_MEGABYTES,
    MetricName.MEMORY_USAGE_PERCENTAGE,
    MetricName.PROCESS_MEMORY_MEGABYTES,  # the run's own processes' memory on the GPU (NVML's per-process lists), not the device's
    MetricName.POWER_USAGE_WATTS,
    MetricName.ENERGY_JOULES,
    MetricName.TEMPERATURE_CELSIUS,
    MetricName.CLOCKS_POWER_CAPPED,
    MetricName.RUN_SM_UTILIZATION_PERCENTAGE,  # the run's own share of the GPU (NVML per process), beside the device's
    MetricName.RUN_MEMORY_UTILIZATION_PERCENTAGE,
    MetricName.RUN_POWER_WATTS,
]
HOST_METRICS = [
    MetricName.CPU_UTILIZATION_PERCENTAGE,
    MetricName.SYSTEM_MEMORY_USAGE_MEGABYTES,
    MetricName.PROCESS_CPU_UTILIZATION_PERCENTAGE,
    MetricName.PROCESS_MEMORY_RSS_MEGABYTES,
]
ACTIVITY = [
    MetricName.SM_ACTIVE,
    MetricName.SM_OCCUPANCY,
    MetricName.GR_ENGINE_ACTIVE,
    MetricName.DRAM_ACTIVE,
    MetricName.TENSOR_ACTIVE,
]  # GPM's, per device or per MIG slice
DEVICE_ONLY = [
    MetricName.POWER_USAGE_WATTS,
    MetricName.ENERGY_JOULES,
    MetricName.TEMPERATURE_CELSIUS,
    MetricName.CLOCKS_POWER_CAPPED,
]  # physically the whole GPU's, also under MIG
HARDWARE_KEYS = [key(name, GPU) for name in GPU_METRICS] + [key(name) for name in HOST_METRICS]


def hardware_keys(run: RunSpec) -> list[str]:
    """The hardware keys a run writes: a whole GPU's (HARDWARE_KEYS), or for a MIG run its slice's activity and memory, the
    GPU's power, energy, temperature and memory, and no GPU utilisation (NVML has none in MIG mode)."""
    if run.mig is None:
        return HARDWARE_KEYS
    memory = [MetricName.MEMORY_USAGE_MEGABYTES, MetricName.MEMORY_USAGE_PERCENTAGE]
    own = [key(name, GPU, mig=run.mig) for name in ACTIVITY + memory]
    return own + [key(name, GPU) for name in memory + [MetricName.PROCESS_MEMORY_MEGABYTES] + DEVICE_ONLY] + [key(name) for name in HOST_METRICS]


@dataclass(frozen=True)
class Model:
    """What one training looks like alone on a whole H100 during its steady epochs."""

    name: str
    smact: float
    occupancy: float  # SMOCC as a fraction of SMACT
    gract: float  # GRACT as a multiple of SMACT
    dram: float
    tensor: float
    memory_mb: float
    epochs: int
    loss: tuple[float, float, float]  # first, floor, decay per epoch
    accuracy: tuple[float, float]  # ceiling, rise per epoch


@dataclass(frozen=True)
class RunSpec:
    letter: str
    args: tuple[str, ...]  # the training script's arguments: radt makes them params
    level: float = 1.0  # steady SMACT relative to the model alone on the GPU
    slowdown: float = 1.0  # run length relative to --minutes
    workers: int = 8
    stalls_per_min: float = 0.5
    loader_bound: bool = False
    fail_at: float | None = None  # fraction of the planned length where the run crashes
    delay_s: int = 0  # start after the workload's first run
    model: Model | None = None  # another model than the experiment's
    mig: int | None = None  # the GPU instance id of its MIG slice (nvidia-smi's "GI ID"); None: the whole GPU


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    collocation: str
    note: str
    runs: tuple[RunSpec, ...]
    cap: float = 1.0  # fraction of the GPU the run can use (a MIG instance's SMs)
    memory_cap_mb: float = GPU_TOTAL_MB


@dataclass(frozen=True)
class ExperimentSpec:
    name: str
    note: str
    script: str
    model: Model
    workloads: tuple[WorkloadSpec, ...]


RESNET = Model(
    "resnet50", smact=0.64, occupancy=0.52, gract=1.34, dram=0.40, tensor=0.34, memory_mb=21_800, epochs=10, loss=(6.4, 1.25, 0.42), accuracy=(0.74, 0.33)
)
BERT = Model(
    "bert-base", smact=0.71, occupancy=0.45, gract=1.25, dram=0.50, tensor=0.46, memory_mb=17_400, epochs=3, loss=(0.95, 0.22, 1.1), accuracy=(0.91, 1.3)
)
BERT_LARGE = Model(
    "bert-large", smact=0.78, occupancy=0.48, gract=1.2, dram=0.55, tensor=0.52, memory_mb=74_000, epochs=3, loss=(0.9, 0.2, 1.1), accuracy=(0.92, 1.3)
)


def _resnet_args(**extra) -> tuple[str, ...]:
    args = {"model": "resnet50", "batch-size": "256", "lr": "0.1", "epochs": "10", "workers": "8", "amp": None}
    args.update(extra)
    return tuple(t for name, value in args.items() for t in ([f"--{name}"] if value is None else [f"--{name}", value]))


def _bert_args(**extra) -> tuple[str, ...]:
    args = {"model": "bert-base-uncased", "task": "mnli", "batch-size": "32", "lr": "2e-5", "epochs": "3", "workers": "8"}
    args.update(extra)
    return tuple(t for name, value in args.items() for t in (f"--{name}", value))


EXPERIMENTS = (
    ExperimentSpec(
        "demo: resnet50 collocation",
        "Demo data written by `radt demo` (synthetic, not measured): one ResNet-50 training alone on an H100, "
        "then two at once time-sliced on the same GPU, under MPS and in two MIG 3g.40gb instances.",
        "train_imagenet.py",
        RESNET,
        (
            WorkloadSpec("1 alone", SHARED.key, "One run alone on GPU 0: the reference.", (RunSpec("A", _resnet_args()),)),
            WorkloadSpec(
                "2 same GPU",
                SHARED.key,
                "Two runs time-sliced on GPU 0: each gets less, together a little more than one alone.",
                (
                    RunSpec("A", _resnet_args(), level=0.57, slowdown=1.72, stalls_per_min=0.8),
                    RunSpec("B", _resnet_args(), level=0.55, slowdown=1.76, stalls_per_min=0.8, delay_s=2),
                ),
            ),
            WorkloadSpec(
                "3 MPS",
                MPS.key,
                "Two runs under MPS on GPU 0: kernels of both run at once, more than time-slicing.",
                (
                    RunSpec("A", _resnet_args(), level=0.67, slowdown=1.46, stalls_per_min=0.8),
                    RunSpec("B", _resnet_args(), level=0.66, slowdown=1.48, stalls_per_min=0.8, delay_s=1),
                ),
            ),
            WorkloadSpec(
                "4 MIG 3g.40gb",
                "3g.40gb",
                "Two runs in MIG 3g.40gb instances of GPU 0: each capped at 3/7 of the SMs and 40 GB.",
                (
                    RunSpec("A", _resnet_args(), level=0.55, slowdown=1.95, mig=1),
                    RunSpec("B", _resnet_args(), level=0.54, slowdown=2.0, delay_s=2, mig=2),
                ),
                cap=3 / 7,
                memory_cap_mb=40_960 * MIB,
            ),
        ),
    ),
    ExperimentSpec(
        "demo: bert fine-tuning",
        "Demo data written by `radt demo` (synthetic, not measured): BERT fine-tuning starved by one data-loader "
        "worker, the same with eight, and a BERT-large run that runs out of GPU memory.",
        "finetune_bert.py",
        BERT,
        (
            WorkloadSpec(
                "1 workers 1",
                SHARED.key,
                "One data-loader worker: the GPU waits for tokenised batches, CPU pegged.",
                (RunSpec("A", _bert_args(workers="1"), slowdown=2.0, workers=1, loader_bound=True),),
            ),
            WorkloadSpec(
                "2 workers 8", SHARED.key, "Eight data-loader workers: the GPU stays busy.", (RunSpec("A", _bert_args(), slowdown=0.8, stalls_per_min=0.3),)
            ),
            WorkloadSpec(
                "3 bert-large batch 64",
                SHARED.key,
                "BERT-large at batch size 64: GPU memory creeps up until CUDA runs out of memory (FAILED).",
                (RunSpec("A", _bert_args(model="bert-large-uncased", **{"batch-size": "64"}), slowdown=1.2, fail_at=0.45, model=BERT_LARGE),),
            ),
        ),
    ),
)

OOM_LOG = """Traceback (most recent call last):
  File "finetune_bert.py", line 212, in <module>
    loss.backward()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.21 GiB is free.
"""


@dataclass
class RunData:
    spec: RunSpec
    model: Model
    samples: int
    planned: int
    series: dict[str, np.ndarray] = field(default_factory=dict)  # key -> what the run records, one value per sample
    demand: dict[str, np.ndarray] = field(default_factory=dict)  # its own activity and memory on the GPU, as if alone on it
    epochs: list[tuple[int, int, float, float]] = field(default_factory=list)  # (epoch, sample index, loss, accuracy)

    @property
    def failed(self) -> bool:
        return self.spec.fail_at is not None


# --- the generator: every array is one value per 1 Hz sample ---


def _rng(seed: int, *names: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32("/".join(names).encode())])


def _smooth_noise(rng: np.random.Generator, n: int, scale: float, span: int = 24) -> np.ndarray:
    """Slowly wandering noise of standard deviation `scale` (white noise through a decaying kernel)."""
    kernel = np.exp(-np.arange(span) / (span / 4))
    kernel /= np.sqrt((kernel**2).sum())
    return scale * np.convolve(rng.standard_normal(n + span), kernel, "valid")[:n]


def _lag(target: np.ndarray, start: float, tau: float) -> np.ndarray:
    """First-order lag (a GPU heating up towards what its power draw sustains)."""
    out = np.empty_like(target)
    value = start
    for i, goal in enumerate(target.tolist()):
        value += (goal - value) / tau
        out[i] = value
    return out


def _planned_samples(minutes: float, run: RunSpec) -> int:
    return max(40, round(minutes * 60 * run.slowdown / INTERVAL_S))


def timeline(rng: np.random.Generator, n: int, epochs: int, run: RunSpec) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(activity 0..~1 relative to steady training, phase per sample, last sample of each epoch)."""
    act = np.ones(n)
    phase = np.full(n, TRAIN, dtype=np.int8)
    startup, warm, tail = max(3, round(0.025 * n)), max(4, round(0.04 * n)), max(2, round(0.006 * n))
    act[:startup], phase[:startup] = 0.0, STARTUP
    # cuDNN autotuning and the first iterations: bursts that settle into the steady level
    act[startup : startup + warm] = np.linspace(0.25, 1.0, warm) * rng.uniform(0.55, 1.1, warm)
    phase[startup : startup + warm] = WARMUP
    bounds = np.linspace(startup + warm, n - tail, epochs + 1).round().astype(int)
    ends = []
    for begin, end in zip(bounds[:-1], bounds[1:]):
        length = end - begin
        ckpt = max(1, round(0.012 * length))
        evaluation = max(2, round(0.08 * length))
        train_end = end - evaluation - ckpt
        act[train_end : end - ckpt] = 0.42 * rng.uniform(0.9, 1.1, evaluation)
        phase[train_end : end - ckpt] = EVAL
        act[end - ckpt : end], phase[end - ckpt : end] = 0.02, CHECKPOINT
        ends.append(int(end - 1))
        _stalls(rng, act, phase, begin, train_end, run)
    act[n - tail :], phase[n - tail :] = 0.0, TEARDOWN
    return act, phase, ends


def _stalls(rng: np.random.Generator, act: np.ndarray, phase: np.ndarray, begin: int, end: int, run: RunSpec) -> None:
    """Data-loader stalls inside one epoch's training: the GPU waits, the workers' CPU is busy."""
    if run.loader_bound:  # bursts on whatever batches the single worker managed, then waiting
        i = begin
        while i < end:
            burst, gap = int(rng.integers(2, 5)), int(rng.integers(3, 7))
            stop = min(i + burst + gap, end)
            if i + burst < stop:
                act[i + burst : stop] = rng.uniform(0.0, 0.06, stop - i - burst)
                phase[i + burst : stop] = STALL
            i += burst + gap
        return
    length = end - begin
    count = rng.poisson(run.stalls_per_min * length * INTERVAL_S / 60)
    if length >= 8:
        count = max(1, count)  # every epoch shows at least one
    for _ in range(count):
        duration = min(int(rng.integers(2, 7)), max(1, length // 3))
        if end - duration - (begin + 1) <= 0:
            break
        at = int(rng.integers(begin + 1, end - duration))
        act[at : at + duration] = rng.uniform(0.0, 0.05, duration)
        phase[at : at + duration] = STALL


def generate_run(seed: int, experiment: ExperimentSpec, workload: WorkloadSpec, run: RunSpec, minutes: float) -> RunData:
    """One run's own part, deterministic for (seed, names, minutes): what it asks of the GPU alone (`demand`: its activity
    and memory) and its host series; what its GPU records (`record_gpu`) depends on the runs beside it."""
    rng = _rng(seed, experiment.name, workload.name, run.letter)
    model = run.model or experiment.model
    planned = _planned_samples(minutes, run)
    act, phase, ends = timeline(rng, planned, model.epochs, run)
    n = planned if run.fail_at is None else max(10, round(planned * run.fail_at))
    act, phase = act[:n], phase[:n]
    others = len(workload.runs)  # runs sharing the host
    cap = workload.cap

    # its own work on the GPU: `level` is how much of its work alone it gets done per second beside the others
    busy = act * run.level
    wobble = 1 + _smooth_noise(rng, n, 0.035) + 0.025 * rng.standard_normal(n)
    sm = np.clip(model.smact * busy * wobble, 0.0, cap)
    occupancy = np.minimum(sm * model.occupancy * (1 + 0.04 * rng.standard_normal(n)), sm * 0.97)
    gract = np.clip(sm * model.gract * (1 + 0.02 * rng.standard_normal(n)) + 0.004 * (act > 0), sm, cap)
    dram = np.clip(model.dram * busy * (wobble + 0.03 * rng.standard_normal(n)), 0.0, cap)
    tensor = np.clip(model.tensor * busy * (wobble + 0.03 * rng.standard_normal(n)), 0.0, sm)

    # GPU memory: the CUDA context, the model and the allocator's cache during warm-up, then flat;
    # a little more at the first evaluation (its buffers); the failing run creeps to the limit.
    peak = min(model.memory_mb * (1 + 0.01 * rng.standard_normal()), workload.memory_cap_mb * 0.96)
    memory = np.zeros(n)
    startup = max(1, int((phase == STARTUP).sum()))
    context_at = startup // 2  # the CUDA context appears halfway through start-up
    warm = np.flatnonzero(phase == WARMUP)
    memory[context_at:] = 530.0
    if warm.size:
        memory[warm] = np.linspace(1_800.0, peak, warm.size)
        memory[warm[-1] + 1 :] = peak
        first_eval = np.flatnonzero(phase == EVAL)
        if first_eval.size:
            memory[first_eval[0] :] += peak * 0.03
    if run.fail_at is not None and warm.size:
        after = np.arange(n) > warm[-1]
        memory[after] = np.linspace(peak, GPU_TOTAL_MB * 0.985, int(after.sum()))
    memory[phase == TEARDOWN] = 0.0
    memory = np.round(memory / MIB) * MIB  # NVML counts bytes; these are whole MiB

    # host: the data loader's CPU work, more while the GPU waits for it
    cpu_level = np.select(
        [phase == STARTUP, phase == WARMUP, phase == STALL, phase == EVAL, phase == CHECKPOINT, phase == TEARDOWN],
        [9.0, 16.0, 30.0, 9.0, 6.0, 4.0],
        default=14.0 + run.workers * 0.5,
    )
    if run.loader_bound:
        cpu_level = np.where(np.isin(phase, (TRAIN, STALL)), 6.5, cpu_level)  # two busy cores of 32
    cpu = np.clip(3 + cpu_level * (1 + 0.8 * (others - 1)) + 1.5 * rng.standard_normal(n), 0, 100)
    if run.loader_bound:
        proc_level = np.select([phase == STARTUP, phase == EVAL, phase == CHECKPOINT, phase == TEARDOWN], [100.0, 130.0, 60.0, 20.0], default=196.0)
    else:
        proc_level = np.select(
            [phase == STARTUP, phase == WARMUP, phase == STALL, phase == EVAL, phase == CHECKPOINT, phase == TEARDOWN],
            [100.0, 90 + run.workers * 55.0, 90 + run.workers * 95.0, 95 + run.workers * 20.0, 60.0, 20.0],
            default=90 + run.workers * 70.0,
        )
    proc_cpu = np.clip(proc_level * (1 + 0.05 * rng.standard_normal(n)), 0, None)
    rss = np.full(n, 3_400.0)
    rss[:startup] = np.linspace(900.0, 3_400.0, startup)
    if warm.size:  # workers start, then their copy-on-access pages grow slowly
        workers_rss = run.workers * 1_050.0
        rss[warm] += np.linspace(0.0, workers_rss, warm.size)
        rss[warm[-1] + 1 :] += workers_rss * (1 + 0.04 * np.linspace(0, 1, n - warm[-1] - 1))
    rss += 20 * rng.standard_normal(n)
    rss[phase == TEARDOWN] *= 0.3
    system_memory = HOST_MEMORY_MB + rss * others + _smooth_noise(rng, n, 120.0)

    data = RunData(run, model, n, planned)
    data.demand = dict(zip(ACTIVITY + [MetricName.MEMORY_USAGE_MEGABYTES], [sm, occupancy, gract, dram, tensor, memory]))
    data.demand["working"] = (act > 0.01).astype(float)
    data.series = dict(zip([key(name) for name in HOST_METRICS], [cpu, system_memory, proc_cpu, rss]))
    first, floor, decay = model.loss
    ceiling, rise = model.accuracy
    for epoch, index in enumerate(ends, start=1):
        if index >= n:
            break
        loss = (floor + (first - floor) * math.exp(-decay * epoch)) * (1 + 0.02 * rng.standard_normal())
        accuracy = ceiling * (1 - math.exp(-rise * epoch)) + 0.004 * rng.standard_normal()
        data.epochs.append((epoch, index, loss, accuracy))
    return data


def generate_workload(seed: int, experiment: ExperimentSpec, workload: WorkloadSpec, minutes: float) -> list[RunData]:
    """Every run of a workload, each with the GPU series it records (record_gpu); deterministic for (seed, names, minutes)."""
    runs = [generate_run(seed, experiment, workload, run, minutes) for run in workload.runs]
    record_gpu(_rng(seed, experiment.name, workload.name, "gpu"), workload, runs)
    return runs


def record_gpu(rng: np.random.Generator, workload: WorkloadSpec, runs: list[RunData]) -> None:
    """What NVML and DCGM record for each run: they count per device, so every run on a shared GPU (time-slicing, MPS)
    records the device's totals over its own seconds (the sum of the runs' work then, capped at a whole GPU); a MIG run
    records its slice's own activity and memory, and the whole GPU's power, energy, temperature and memory."""
    offsets = [run.spec.delay_s // INTERVAL_S for run in runs]  # sample i of a run is device second offset + i
    length = max(offset + run.samples for offset, run in zip(offsets, runs))

    def total(name: str) -> np.ndarray:
        out = np.zeros(length)
        for offset, run in zip(offsets, runs):
            out[offset : offset + run.samples] += run.demand[name]
        return out

    sm = np.clip(total(MetricName.SM_ACTIVE), 0.0, 1.0)
    dram = np.clip(total(MetricName.DRAM_ACTIVE), 0.0, 1.0)
    memory = np.minimum(total(MetricName.MEMORY_USAGE_MEGABYTES), GPU_TOTAL_MB)
    contexts = np.zeros(length)
    for offset, run in zip(offsets, runs):
        contexts[offset : offset + run.samples] += run.demand[MetricName.MEMORY_USAGE_MEGABYTES] > 0
    power = IDLE_W + CONTEXT_W * (contexts > 0) + 660 * (0.55 * sm + 0.45 * dram)
    power = power * (1 + 0.015 * rng.standard_normal(length))
    capped = (power >= POWER_CAP_W).astype(float)  # NVML's SW power cap reason: the clocks drop to hold the limit
    power = np.clip(power, IDLE_W * 0.9, POWER_CAP_W)
    temperature = np.round(_lag(30 + 0.075 * power, 33 + rng.uniform(0, 3), 90 / INTERVAL_S))
    device = {MetricName.POWER_USAGE_WATTS: power, MetricName.CLOCKS_POWER_CAPPED: capped, MetricName.TEMPERATURE_CELSIUS: temperature, MetricName.MEMORY_USAGE_MEGABYTES: memory,
              MetricName.MEMORY_USAGE_PERCENTAGE: 100 * memory / GPU_TOTAL_MB}  # fmt: skip
    if workload.cap >= 1:  # the whole GPU: the device's own activity, the same for every run on it
        gract = np.clip(total(MetricName.GR_ENGINE_ACTIVE), sm, 1.0)
        device |= {MetricName.SM_ACTIVE: sm, MetricName.SM_OCCUPANCY: np.minimum(total(MetricName.SM_OCCUPANCY), sm * 0.97), MetricName.GR_ENGINE_ACTIVE: gract, MetricName.DRAM_ACTIVE: dram,
                   MetricName.TENSOR_ACTIVE: np.minimum(total(MetricName.TENSOR_ACTIVE), sm),
                   MetricName.UTILIZATION_PERCENTAGE: np.round(np.clip(100 * (gract * 1.06 + 0.02 * (total("working") > 0)), 0, 100))}  # fmt: skip
    for offset, run in zip(offsets, runs):
        mine = slice(offset, offset + run.samples)
        recorded = {key(name, GPU): values[mine] for name, values in device.items()}
        if workload.cap >= 1:
            recorded |= _own_share(run, device, (total(MetricName.GR_ENGINE_ACTIVE)[mine], total(MetricName.DRAM_ACTIVE)[mine], contexts[mine]), mine)
        recorded[key(MetricName.ENERGY_JOULES, GPU)] = np.concatenate([[0.0], np.cumsum(power[mine][:-1] * INTERVAL_S)])  # since the run began
        recorded[key(MetricName.PROCESS_MEMORY_MEGABYTES, GPU)] = run.demand[MetricName.MEMORY_USAGE_MEGABYTES]  # its own processes' alone, shared GPU or not
        if run.spec.mig is not None:  # its slice: its own work and memory, as fractions of the whole GPU; 100 % = the slice's memory
            recorded |= {key(name, GPU, mig=run.spec.mig): run.demand[name] for name in ACTIVITY}
            own = run.demand[MetricName.MEMORY_USAGE_MEGABYTES]
            recorded[key(MetricName.MEMORY_USAGE_MEGABYTES, GPU, mig=run.spec.mig)] = own
            recorded[key(MetricName.MEMORY_USAGE_PERCENTAGE, GPU, mig=run.spec.mig)] = 100 * own / workload.memory_cap_mb
        run.series = {k: recorded[k] if k in recorded else run.series[k] for k in hardware_keys(run.spec)}


def _own_share(run: RunData, device: dict[str, np.ndarray], totals: tuple[np.ndarray, np.ndarray, np.ndarray], mine: slice) -> dict[str, np.ndarray]:
    """What NVML's per-process samples give a run on a whole GPU: its part of the device's utilization and memory-controller
    time by its own work's share, and the power estimate radt makes of it (gpushare.power_estimate, second by second)."""
    gract, dram, owners = totals
    share = np.divide(run.demand[MetricName.GR_ENGINE_ACTIVE], gract, out=np.zeros(len(gract)), where=gract > 0)
    util = device[MetricName.UTILIZATION_PERCENTAGE][mine]
    own_dram = np.divide(run.demand[MetricName.DRAM_ACTIVE], np.maximum(dram, 1.0))  # a whole memory controller at most
    power = device[MetricName.POWER_USAGE_WATTS][mine]
    held = run.demand[MetricName.MEMORY_USAGE_MEGABYTES] > 0  # a run without its CUDA context yet (or any more) owns nothing
    watts = [power_estimate(p, IDLE_W, s, 1.0 if g > 0 else 0.0, max(1, int(o))) if h else 0.0 for p, s, g, o, h in zip(power, share, gract, owners, held)]
    return {
        key(MetricName.RUN_SM_UTILIZATION_PERCENTAGE, GPU): np.round(util * share),
        key(MetricName.RUN_MEMORY_UTILIZATION_PERCENTAGE, GPU): np.round(100 * own_dram),
        key(MetricName.RUN_POWER_WATTS, GPU): np.asarray(watts),
    }


def _gpu_entries(run: RunSpec, workload: WorkloadSpec) -> list[dict]:
    """The run's radt.gpus entries as the nvml listener writes them: the H100, and its MIG slice where it ran in one."""
    gpu = {"series": f"gpu_{GPU}", "index": GPU, "name": GPU_NAME, "uuid": DEMO_UUID, "pci_bus_id": "00000000:18:00.0", "mig_profile": None,
           "gpu_instance": None, "cuda": None if run.mig is not None else 0, "memory_total_mb": round(GPU_TOTAL_MB)}  # fmt: skip
    if run.mig is None:
        return [gpu]
    profile = workload.collocation
    mig = gpu | {"series": f"gpu_{GPU}_mig_{run.mig}", "uuid": f"MIG-{DEMO_UUID[4:]}-{run.mig}", "mig_profile": profile, "gpu_instance": run.mig, "cuda": 0}
    return [gpu, mig | {"memory_total_mb": round(workload.memory_cap_mb)}]


def run_points(data: RunData, first_ms: int, rng: np.random.Generator) -> tuple[list[Point], list[int]]:
    """The run's points (steps 0.., a few ms of sampling jitter) and the sample timestamps."""
    stamps = (first_ms + np.arange(data.samples) * INTERVAL_S * 1000 + rng.integers(0, 15, data.samples)).tolist()
    steps = range(data.samples)
    points = [Point(k, v, t, i) for k, series in data.series.items() for v, t, i in zip(series.tolist(), stamps, steps)]
    for epoch, index, loss, accuracy in data.epochs:
        points.append(Point("loss", loss, stamps[index], epoch))
        points.append(Point("accuracy", accuracy, stamps[index], epoch))
    return points, stamps


# --- writing ---


@dataclass
class Summary:
    experiments: int = 0
    workloads: int = 0
    runs: int = 0
    points: int = 0
    skipped: bool = False
    retired: list[str] = field(default_factory=list)


def _retire(client, experiment) -> str:
    """Soft-delete a demo experiment under a new name, so its name is free for the new demo."""
    if experiment.lifecycle_stage == "deleted":  # MLflow renames active experiments only
        client.restore_experiment(experiment.experiment_id)
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    new_name = f"{experiment.name} (replaced {stamp} {uuid.uuid4().hex[:6]})"
    client.rename_experiment(experiment.experiment_id, new_name)
    client.delete_experiment(experiment.experiment_id)
    return new_name


class DemoError(UserError, ValueError):
    """A store the demo cannot be written into as it is; the message says what to change."""


def _make_room(client, summary: Summary, reset: bool, report: Callable[[str], None]) -> bool:
    """Whether to write the demo: False where a complete one is there and `reset` is not asked; else the demo
    experiments there are retired (noted in `summary`). DemoError where an experiment of a demo name is somebody's."""
    found = {spec.name: client.get_experiment_by_name(spec.name) for spec in EXPERIMENTS}
    for name, experiment in found.items():
        if experiment is not None and experiment.tags.get(DEMO_TAG) != "true":
            raise DemoError(f"an experiment named '{name}' exists and is not radt demo data; rename it (or delete it for good with 'mlflow gc') first")
    complete = all(e is not None and e.lifecycle_stage == "active" and e.tags.get(COMPLETE_TAG) == "true" for e in found.values())
    if complete and not reset:
        summary.skipped = True
        report("radt demo: the demo experiments are already in this store; 'radt demo --reset' writes them again")
        return False
    summary.retired += [_retire(client, experiment) for experiment in found.values() if experiment is not None]
    if summary.retired and not reset:
        report("radt demo: writing the demo again (the one in this store was incomplete or deleted)")
    return True


def _workload_line(experiment: str, workload: WorkloadSpec, runs: list[RunData], points: int) -> str:
    """What `radt demo` says of a workload it wrote: its runs, collocation, length and points, and which runs failed."""
    longest = max(run.samples for run in runs) * INTERVAL_S / 60
    failed = [run.spec.letter for run in runs if run.failed]
    return (
        f"radt demo: {experiment} / workload {workload.name}: {len(runs)} run{'s' if len(runs) > 1 else ''} "
        f"({', '.join(run.spec.letter for run in runs)}; collocation {workload.collocation}), {longest:.0f} min, {points:,} points"
        + (f"; {', '.join(failed)} FAILED" if failed else "")
    )


def write_demo(
    uri: str, minutes: float = DEFAULT_MINUTES, seed: int = 0, reset: bool = False, report: Callable[[str], None] = print, now_ms: int | None = None
) -> Summary:
    """The demo experiments written into the store at `uri`, their runs ending just before `now_ms`; nothing written
    where a complete demo is there already and `reset` is not asked (a demo that is not complete is written again)."""
    summary = Summary()
    client = connect(uri)
    if not _make_room(client, summary, reset, report):
        return summary

    # generate first (deterministic), then lay the workloads out back to back, ending before now
    generated = [[generate_workload(seed, exp, wl, minutes) for wl in exp.workloads] for exp in EXPERIMENTS]
    spans = [max(run.spec.delay_s + run.samples * INTERVAL_S + 6 for run in runs) for workloads in generated for runs in workloads]
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    start_ms = now_ms - 1000 * (END_BEFORE_NOW_S + sum(spans) + GAP_S * (len(spans) - 1))

    store = open_metric_store(uri)
    # one bulk statement per run; on PostgreSQL (and a server) in the background, several runs at
    # once, while the tracking client writes the next runs' tags and params. SQLite takes one writer at a
    # time (and its first connection switches the file to WAL, which a concurrent writer would refuse).
    pool = None if uri.startswith("sqlite") else ThreadPoolExecutor(max_workers=3, thread_name_prefix="radt-demo")
    try:
        for spec, workloads in zip(EXPERIMENTS, generated):
            experiment_id = resolve_experiment(client, uri, spec.name)
            client.set_experiment_tag(experiment_id, DEMO_TAG, "true")
            client.set_experiment_tag(experiment_id, NOTE_TAG, spec.note)
            writes = []
            for workload, runs in zip(spec.workloads, workloads):
                points, futures = _write_workload(Sinks(client, store, pool), experiment_id, spec, workload, runs, start_ms, seed)
                writes += futures
                span = max(run.spec.delay_s + run.samples * INTERVAL_S + 6 for run in runs)
                start_ms += 1000 * (span + GAP_S)
                summary.workloads += 1
                summary.runs += len(runs)
                summary.points += points
                report(_workload_line(spec.name, workload, runs, points))
            for future in writes:
                future.result()  # a failed write ends here, and the experiment stays incomplete
            diagnose_and_store(client, [run.info.run_id for run in find_runs(client, [experiment_id], {ROLE_TAG: RUN_ROLE})])
            summary.experiments += 1
            client.set_experiment_tag(experiment_id, COMPLETE_TAG, "true")
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        store.close()
    return summary


@dataclass(frozen=True)
class Sinks:
    """Where the demo writes: the tracking client (tags, params), the metric store and the pool its bulk writes run in (None: inline)."""

    client: Any  # what tracking.connect gives: MlflowClient or SqlTracking
    store: MetricStore
    pool: ThreadPoolExecutor | None


def _write_workload(
    sinks: Sinks,
    experiment_id: str,
    spec: ExperimentSpec,
    workload: WorkloadSpec,
    runs: list[RunData],
    start_ms: int,
    seed: int,
) -> tuple[int, list[Future]]:
    """The workload's parent run, then each run: tags and params through the tracking client (tracking.connect), points in bulk (in `pool` if any)."""
    client, store, pool = sinks.client, sinks.store, sinks.pool
    first_sample_ms = start_ms + 3000  # radt creates the run, then its sampler starts
    status = "FAILED" if any(run.failed for run in runs) else "FINISHED"
    # the parent is created the way tracking.find_or_create_workload creates it, but dated to the demo
    parent = client.create_run(
        experiment_id,
        start_time=start_ms,
        run_name=f"workload {workload.name}",
        tags={WORKLOAD_TAG: workload.name, ROLE_TAG: WORKLOAD_ROLE, USER_TAG: getpass.getuser(), DEMO_TAG: "true", NOTE_TAG: workload.note},
    )
    total, end_ms, futures = 0, start_ms, []
    for data in runs:
        run = data.spec
        command = ["python", spec.script, *run.args]
        run_start = start_ms + 1000 * run.delay_s
        run_id, parent_id = create_run(
            client,
            experiment_id,
            NewRun(
                command=command,
                script=spec.script,
                script_args=list(run.args),
                run_name=f"{data.model.name} {workload.name.split()[0]}{run.letter}",
                workload=workload.name,
                letter=run.letter,
                devices=str(GPU),
                collocation=workload.collocation,
                listeners=["nvml", "host"],
                settings=SETTINGS,
                start_time=run_start,
            ),
        )
        assert parent_id == parent.info.run_id
        points, stamps = run_points(data, first_sample_ms + 1000 * run.delay_s, _rng(seed, spec.name, workload.name, run.letter, "stamps"))
        if pool is None:
            store.write(run_id, points)
        else:
            futures.append(pool.submit(store.write, run_id, points))
        total += len(points)
        run_end = stamps[-1] + 1500
        end_ms = max(end_ms, run_end)
        tags = {DEMO_TAG: "true", HOST_TAG: HOST, PID_TAG: str(20_000 + zlib.crc32(run_id.encode()) % 40_000), POINTS_TAG: str(len(points))}
        tags[EXIT_CODE_TAG] = "1" if data.failed else "0"
        tags[GPUS_TAG] = json.dumps(_gpu_entries(run, workload))
        set_tags(client, run_id, tags)
        if data.failed:
            client.log_text(run_id, OOM_LOG, "radt/stderr.log")
        client.set_terminated(run_id, status="FAILED" if data.failed else "FINISHED", end_time=run_end)
    client.set_terminated(parent.info.run_id, status=status, end_time=end_ms)
    return total, futures


def main(argv: list[str]) -> int:
    from radt.cli import OneLineParser

    parser = OneLineParser(
        parents=[store_parent()], prog="radt demo", description="Write a demo experiment set (clearly named 'demo: ...') into the tracking store."
    )
    parser.add_argument(
        "--minutes", type=float, default=DEFAULT_MINUTES, help=f"length of the run alone; collocated runs take up to ~2x (default {DEFAULT_MINUTES:g})"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated values (default 0)")
    parser.add_argument("--reset", action="store_true", help="delete the demo experiments first and write them again")
    args = parser.parse_args(argv)
    if not 1 <= args.minutes <= 240:
        parser.error(f"--minutes {args.minutes:g} is out of range; give 1 to 240")
    uri = tracking_uri(args.store)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # no "View run" line per run (servers)
    began = time.monotonic()
    summary = _write_trying_again(uri, args)
    if not summary.skipped:
        print(
            f"radt demo: {summary.experiments} experiments, {summary.workloads} workloads, {summary.runs} runs, {summary.points:,} points "
            f"written to {redact(uri)} in {time.monotonic() - began:.1f} s"
            + (f"; the previous demo was soft-deleted as {len(summary.retired)} renamed experiments ('mlflow gc' frees them)" if summary.retired else "")
        )
    print(_open_hint(uri, args.store))
    return 0


ATTEMPTS = 3  # tries of a store too busy to answer in time (a loaded machine): each writes the incomplete demo anew


def _write_trying_again(uri: str, args) -> Summary:
    """write_demo, tried again where the store did not answer in time (each try replaces the incomplete demo the last left);
    past ATTEMPTS, DemoError in one line saying how to try again: a statement timeout ended the demo in a 65-line traceback."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return write_demo(uri, args.minutes, args.seed, args.reset)
        except (sa.exc.OperationalError, StoreUnavailable) as exc:
            problem = _store_problem(exc)
            if attempt == ATTEMPTS:
                raise DemoError(
                    f"{problem} {ATTEMPTS} times; the demo is incomplete: run 'radt demo' again when the store is less busy "
                    f"(it writes an incomplete demo anew), or give each store call more time: RADT_STORE_TIMEOUT=30 radt demo"
                ) from None
            print(f"radt demo: {problem}; trying again ({attempt + 1} of {ATTEMPTS})", file=sys.stderr, flush=True)
            time.sleep(settings.RETRY_INTERVAL.get())
    raise AssertionError("ATTEMPTS is at least 1")


def _store_problem(exc: Exception) -> str:
    """What went wrong with the store, in words: a call past RADT_STORE_TIMEOUT (PostgreSQL's statement timeout, SQLite's
    busy timeout) or the database's own first line."""
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "timeout" in reason.lower() or "locked" in reason.lower():
        return f"the store did not answer within RADT_STORE_TIMEOUT={settings.STORE_TIMEOUT.get():g} s ({reason})"
    return f"the store failed ({reason})"


def _open_hint(uri: str, explicit: str | None) -> str:
    shown = redact(uri)
    if not is_database_uri(uri):  # an MLflow server: the dashboard reads the database behind it
        return f"radt demo: open MLflow's UI at {shown}, or the dashboard with `radt dashboard --store <the server's database URI>`"
    dashboard = "radt dashboard" + (f" --store '{shown}'" if explicit and uri != default_store_uri() else "")
    return f"radt demo: open the dashboard with `{dashboard}` (http://127.0.0.1:8050), or MLflow's UI with `mlflow ui --backend-store-uri '{shown}'`"
