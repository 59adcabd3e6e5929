"""A large real-world experiment CSV, built from its shape: ~200 workloads, 600 rows, on a 4-GPU A100 40GB node.

GPUs 0 and 1 take runs alone, several runs on the same GPU and MPS; GPUs 2 and 3 are in MIG mode
and take MIG runs packed as the A100 40GB allows (`A100_40GB_PLACEMENTS`, NVIDIA's MIG user guide),
so every workload's instances fit on its GPU together. The file is the same for the same seed.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

HEADER = "Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params"
SHARED_GPUS = (0, 1)  # alone, same GPU, MPS
MIG_GPUS = (2, 3)  # in MIG mode (the fake nvidia-smi's RADT_FAKE_MIG_GPUS)
MODES = ("alone", "same", "mps", "mig")
MODELS = {  # model -> the Params a user gives its training script
    "resnet50": "--model resnet50 --batch-size {batch} --epochs 1",
    "vgg16": "--model vgg16 --batch-size {batch} --epochs 1",
    "mobilenet_v2": "--model mobilenet_v2 --batch-size {batch} --lr 0.05",
    "bert": "--model bert-base-uncased --seq-len 128 --batch-size {batch}",
    "distilbert": "--model distilbert-base-uncased --seq-len 256 --batch-size {batch}",
    "gpt2": '--model gpt2 --block-size 512 --batch-size {batch} --tag "gpt2 small"',
}
BATCHES = (16, 32, 64, 128, 256)
LISTENERS = ("smi+top", "top", "smi+top+iostat")
# A100 40GB: profile -> (first memory slices a GPU instance may start at, memory slices it takes) of 8
A100_40GB_PLACEMENTS = {
    "1g.5gb": ((0, 1, 2, 3, 4, 5, 6), 1),
    "2g.10gb": ((0, 2, 4), 2),
    "3g.20gb": ((0, 4), 4),
    "4g.20gb": ((0,), 4),
    "7g.40gb": ((0,), 8),
}
# what one MIG GPU of a workload holds, largest instance first (the order the runs create them in)
MIG_PACKINGS = (
    ("7g.40gb",),
    ("4g.20gb",),
    ("3g.20gb",),
    ("2g.10gb",),
    ("1g.5gb",),
    ("4g.20gb", "3g.20gb"),
    ("3g.20gb", "3g.20gb"),
    ("4g.20gb", "2g.10gb", "1g.5gb"),
    ("4g.20gb", "1g.5gb", "1g.5gb", "1g.5gb"),
    ("3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"),
    ("3g.20gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb"),
    ("2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"),
    ("2g.10gb", "2g.10gb", "1g.5gb", "1g.5gb", "1g.5gb"),
    ("1g.5gb",) * 2,
    ("1g.5gb",) * 3,
    ("1g.5gb",) * 4,
    ("1g.5gb",) * 7,
)


@dataclass(frozen=True)
class Run:
    devices: str
    collocation: str
    model: str
    params: str
    listeners: str


@dataclass(frozen=True)
class Workload:
    experiment: str
    name: str
    mode: str
    runs: tuple[Run, ...]

    @property
    def label(self) -> str:
        """As radt names the workload: experiment/workload."""
        return f"{self.experiment}/{self.name}"

    @property
    def mig_gres(self) -> dict[str, int]:
        """The MIG slices by profile the workload needs: what its Slurm job asks as GRES types."""
        counts: dict[str, int] = {}
        for run in self.runs:
            if run.collocation not in ("-", "MPS"):
                counts[run.collocation] = counts.get(run.collocation, 0) + 1
        return counts


def fits(profiles: tuple[str, ...] | list[str]) -> bool:
    """The MIG instances, created in this order, find a placement on one empty A100 40GB (the free placement
    that starts last, as the fake nvidia-smi takes it: a 3g.20gb first leaves the left half to smaller ones)."""
    used: set[int] = set()
    for profile in profiles:
        starts, size = A100_40GB_PLACEMENTS[profile]
        start = next((s for s in reversed(starts) if not used & set(range(s, s + size))), None)
        if start is None:
            return False
        used |= set(range(start, start + size))
    return True


def _runs(rng: random.Random, count: int, devices: list[str], collocations: list[str], listeners: str) -> tuple[Run, ...]:
    runs = []
    for number in range(count):
        model = rng.choice(sorted(MODELS))
        params = MODELS[model].format(batch=rng.choice(BATCHES))
        runs.append(Run(devices[number], collocations[number], model, params, listeners))
    return tuple(runs)


def _workload(rng: random.Random, mode: str, experiment: str, name: str, count: int) -> Workload:
    listeners = rng.choice(LISTENERS)
    gpu = str(rng.choice(SHARED_GPUS))
    if mode == "alone":
        devices = rng.choice([gpu, gpu, gpu, "0+1"])  # a data-parallel run on both GPUs now and then
        return Workload(experiment, name, mode, _runs(rng, 1, [devices], ["-"], listeners))
    if mode == "same":
        return Workload(experiment, name, mode, _runs(rng, count, [gpu] * count, ["-"] * count, listeners))
    if mode == "mps":
        devices = [gpu] * count if count < 4 or rng.random() < 0.7 else [str(n % 2) for n in range(count)]  # one daemon for both GPUs
        return Workload(experiment, name, mode, _runs(rng, count, devices, ["MPS"] * count, listeners))
    packings = [p for p in MIG_PACKINGS if len(p) == count]
    if packings:
        packing, gpus = rng.choice(packings), [str(rng.choice(MIG_GPUS))] * count
    else:  # no one-GPU packing of this many runs: two GPUs, one packing each
        first = rng.choice([p for p in MIG_PACKINGS if 0 < count - len(p) <= 7 and any(len(q) == count - len(p) for q in MIG_PACKINGS)])
        second = rng.choice([q for q in MIG_PACKINGS if len(q) == count - len(first)])
        packing, gpus = first + second, [str(MIG_GPUS[0])] * len(first) + [str(MIG_GPUS[1])] * len(second)
    return Workload(experiment, name, mode, _runs(rng, count, gpus, list(packing), listeners))


def _counts(rng: random.Random, modes: list[str], rows: int) -> list[int]:
    """Runs per workload (1 to 7; alone is 1), nudged until they add up to `rows`."""
    bounds = {"alone": (1, 1), "same": (2, 4), "mps": (2, 7), "mig": (1, 7)}
    counts = [rng.randint(*bounds[m]) for m in modes]
    while sum(counts) != rows:
        n = rng.randrange(len(modes))
        low, high = bounds[modes[n]]
        step = 1 if sum(counts) < rows else -1
        if low <= counts[n] + step <= high:
            counts[n] += step
    return counts


def build(workloads: int = 200, rows: int = 600, seed: int = 25) -> list[Workload]:
    """The experiment's workloads in file order: every mode, every MIG profile, 1 and 7 runs, several models."""
    rng = random.Random(seed)
    modes = [MODES[n % len(MODES)] for n in range(workloads)]
    rng.shuffle(modes)
    counts = _counts(rng, modes, rows)
    plan = []
    for number, (mode, count) in enumerate(zip(modes, counts, strict=True), start=1):
        experiment = "a100-mig" if mode == "mig" else "a100-shared"
        plan.append(_workload(rng, mode, experiment, str(number), count))
    return plan


def csv_text(workloads: list[Workload], file: str = "train.py", extra_params: str = "", finished: Collection[str] = ()) -> str:
    """The CSV a user would write: one row per run, Status and Run empty but for the `finished` workloads (by name),
    which hold FINISHED and a run id as an earlier radt left them."""
    lines = [HEADER]
    for workload in workloads:
        for run in workload.runs:
            params = f"{run.params} {extra_params}".strip()
            quoted = '"' + params.replace('"', '""') + '"'
            status, run_id = ("FINISHED", f"{len(lines):032x}") if workload.name in finished else ("", "")
            lines.append(",".join([workload.experiment, workload.name, status, run_id, run.devices, run.collocation, file, run.listeners, quoted]))
    return "\n".join(lines) + "\n"


def write(
    path: Path, workloads: list[Workload] | None = None, file: str = "train.py", extra_params: str = "", finished: Collection[str] = ()
) -> list[Workload]:
    """Write the experiment (the default one unless `workloads` are given) to `path`; its workloads."""
    workloads = build() if workloads is None else workloads
    path.write_text(csv_text(workloads, file, extra_params, finished))
    return workloads


def slice_covering(workloads: list[Workload]) -> list[Workload]:
    """A small slice, in file order, that still holds every mode, every MIG profile, a MIG and an MPS workload
    on two GPUs, a 7-run workload and a data-parallel run (greedy: most kinds not yet held per run added, then those the others make up for dropped)."""
    kinds = [lambda w, m=m: w.mode == m for m in MODES]
    kinds += [lambda w, p=p: p in w.mig_gres for p in A100_40GB_PLACEMENTS]
    kinds += [
        lambda w: len(w.runs) == 7,
        lambda w: w.mode == "mig" and len({r.devices for r in w.runs}) == 2,
        lambda w: w.mode == "mps" and len({r.devices for r in w.runs}) == 2,
        lambda w: any("+" in r.devices for r in w.runs),
    ]
    chosen: list[Workload] = []
    missing = list(kinds)
    while missing:
        best = max(workloads, key=lambda w: (sum(k(w) for k in missing) / len(w.runs), -workloads.index(w)))
        chosen.append(best)
        missing = [k for k in missing if not k(best)]
    for extra in sorted(chosen, key=lambda w: -len(w.runs)):  # then drop those the others make up for
        if all(any(k(w) for w in chosen if w is not extra) for k in kinds):
            chosen.remove(extra)
    return [w for w in workloads if w in chosen]
