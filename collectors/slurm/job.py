"""On the node the job runs `radt --slurm-rows LINES experiment.csv`: exactly that workload, through
scheduler.WorkloadRunner (start gate, MPS set-up and tear-down, parent run) on the GPUs and MIG slices Slurm
assigned; it never creates or destroys a MIG instance. Its statuses go to slurm/<job id>.json next to the
CSV; only the submitter writes the CSV itself. Devices is not a physical index under Slurm.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from radt.collectors._common import UsageError
from radt.collectors.experiment.collocation import MigInstance, MpsDaemon, Setup
from radt.collectors.experiment.csvfile import ExperimentFile, Machine, Row, parse_devices_cell, plan
from radt.collectors.experiment.scheduler import ExperimentOptions, WorkloadRunner
from radt.collectors.slurm.commands import AnyProfiles, slurm
from radt.collectors.slurm.jobscript import FOLDER
from radt.collocation import Mode, from_key
from radt.errors import report
from radt.rundir import write_whole

if TYPE_CHECKING:
    from radt.collectors.sources import gpus

MPS_PIPE_DIRECTORY, MPS_LOG_DIRECTORY = "/tmp/nvidia-mps", "/var/log/nvidia-mps"  # NVIDIA's defaults: a site's daemon where it set none


@dataclass
class JobRows(ExperimentFile):
    """The CSV as the job sees it: the statuses WorkloadRunner saves go to the job's result file, which the submitter reads."""

    result: Path = Path()

    def save(self) -> None:
        rows = {str(r.line): {"Status": self.get(r, "Status"), "Run": self.get(r, "Run")} for r in self.rows}
        write_whole(self.result, json.dumps(rows))
        self.unwritten.clear()


def allocated_gpus(environ: dict[str, str] | os._Environ, job: str) -> list[int]:
    """The node's GPUs (NVML indices) Slurm gave this job: SLURM_JOB_GPUS, else `scontrol show job -d`'s GRES IDX."""
    given = environ.get("SLURM_JOB_GPUS", "")
    if given and all(p.strip().isdigit() for p in given.split(",")):
        return [int(p) for p in given.split(",")]
    done = slurm(["scontrol", "show", "job", "-d", job])
    match = re.search(r"GRES=\S*?\(IDX:([0-9,\-]+)\)", done.stdout)
    if not match:
        return []
    found = []
    for part in match.group(1).split(","):
        low, _, high = part.partition("-")
        found += range(int(low), int(high or low) + 1)
    return found


def job_file(exp: ExperimentFile, lines: list[int], result: Path) -> tuple[JobRows, str]:
    """The job's rows as their own file (problems elsewhere in the CSV are not this job's), and why they cannot run."""
    rows = [r for r in exp.rows if r.line in lines]
    keys = {(exp.get(r, "Experiment"), exp.get(r, "Workload")) for r in rows}
    whole = [r for r in exp.rows if (exp.get(r, "Experiment"), exp.get(r, "Workload")) in keys]
    sub = JobRows(exp.path, exp.header, rows, exp.newline, dict(exp.index), bom=exp.bom, result=result)
    if len(rows) != len(lines) or len(keys) != 1 or len(whole) != len(rows):
        return sub, f"rows {', '.join(map(str, lines))} of {exp.path.name} are no longer one workload (the file changed after the job was submitted)"
    return sub, ""


def run_job(opts: ExperimentOptions, lines: list[int]) -> int:
    """Inside the Slurm job: run the workload of these rows with WorkloadRunner, on the GPUs Slurm gave the job."""
    from radt.collectors.experiment.collocation import undo_leftovers
    from radt.collectors.experiment.csvfile import real_machine
    from radt.collectors.experiment.scheduler import open_experiment
    from radt.collectors.process.proctree import restore_interrupts
    from radt.collectors.recovery.reaper import reap
    from radt.collectors.store.tracking import connect

    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        raise UsageError("--slurm-rows is what a job of 'radt experiment.csv --slurm' runs; submit with: radt experiment.csv --slurm")
    exp = ExperimentFile.load(opts.csv)
    folder = opts.csv.resolve().parent / FOLDER
    folder.mkdir(exist_ok=True)
    rows, problem = job_file(exp, lines, folder / f"{job}.json")
    machine = real_machine()
    slices: list[MigInstance] = []
    if not problem:
        slices, problem = place_rows(rows, os.environ, job, machine)
    workloads, problems = plan(rows, slice_machine(machine), rerun=True) if not problem else ([], [problem])
    if problems:
        for line in problems:
            report(f"radt: {line}")
        for row in rows.rows:
            rows.set(row, "Status", "FAILED")
        rows.save()
        return 2
    restore_interrupts()
    reap(report, store=opts.store, wait=False)
    undo_leftovers(report)
    client = connect(opts.store)
    workload = workloads[0]
    report(f"radt: Slurm job {job}: workload {workload.label}, {len(workload.runs)} run(s) on {os.environ.get('SLURMD_NODENAME', 'this node')}")
    site_mps = bool(workload.mps_devices) and on_mps_gres(job)
    runner = SlurmWorkloadRunner(opts, rows, workload, client, open_experiment(client, opts.store, workload), slices=slices, site_mps=site_mps)
    status = runner.execute()
    report(f"radt: workload {workload.label} {status}")
    return {"FINISHED": 0, "KILLED": 130}.get(status, 1)


def map_devices(rows: JobRows, gpus: list[int], visible: int | None, skip: frozenset[int] | set[int] = frozenset()) -> str:
    """Each row's Devices (but the `skip` lines') renumbered onto the job's GPUs (the workload's distinct indices in order); why not, or ''.

    Where Slurm confines the job to its GPUs (cgroups), NVML sees only those, numbered from 0."""
    if visible is not None and len(gpus) == visible and gpus and max(gpus) >= visible:
        gpus = list(range(visible))
    cells = {}
    for row in rows.rows:
        if row.line in skip:
            continue
        try:
            cells[row.line] = parse_devices_cell(rows.get(row, "Devices")) or []
        except ValueError:
            return ""  # plan says what is wrong with the cell
    wanted = sorted({d for devices in cells.values() for d in devices if isinstance(d, int)})
    if len(wanted) > len(gpus):
        return f"the workload uses {len(wanted)} GPUs but Slurm gave job {os.environ.get('SLURM_JOB_ID')} {len(gpus)} ({gpus}); submit it with --gres=gpu:{len(wanted)}"
    place = {d: gpus[n] for n, d in enumerate(wanted)}
    for row in rows.rows:
        if cells.get(row.line):
            rows.set(row, "Devices", "+".join(str(place[d]) if isinstance(d, int) else d for d in cells[row.line]))
    return ""


def row_profile(rows: JobRows, row: Row) -> str | None:
    """The row's MIG profile, or None (no MIG, or a cell plan refuses)."""
    from radt.collectors.experiment.csvfile import parse_collocation

    try:
        collocation = parse_collocation(rows.get(row, "Collocation"))
    except ValueError:
        return None
    return collocation if from_key(collocation).mode is Mode.MIG else None


def place_rows(rows: JobRows, environ: dict[str, str] | os._Environ, job: str, machine: Machine) -> tuple[list[MigInstance], str]:
    """Each MIG row on a slice of its profile that Slurm gave the job (its Devices: the slice's GPU), the others' Devices
    renumbered onto the job's GPUs; the slices the rows use, and why the rows cannot run, or ''."""
    from radt.collectors.sources.gpus import NvmlUnavailable
    from radt.collectors.sources.gpus import machine as nvml_machine

    profiles = {r.line: p for r in rows.rows if (p := row_profile(rows, r))}
    given = allocated_gpus(environ, job)
    if not profiles:
        return [], map_devices(rows, given, machine.gpu_count())
    try:
        node = nvml_machine()
    except NvmlUnavailable as exc:
        return [], f"cannot find the MIG slices Slurm gave job {job}: NVML is unavailable ({exc}); run the job on a node with the NVIDIA driver"
    whole, free = given_devices(node, given, environ.get("CUDA_VISIBLE_DEVICES"))
    used = []
    for row in rows.rows:
        if row.line not in profiles:
            continue
        found = next((m for m in free if m.profile == profiles[row.line]), None)
        if found is None:
            have = ", ".join(f"{m.profile} ({m.uuid})" for m in free) or "no free MIG slice"
            return [], (
                f"row {row.line} wants a MIG {profiles[row.line]} slice, but Slurm gave job {job} {have}; "
                f"submit it with radt experiment.csv --slurm (it asks --gres=gpu:{profiles[row.line]}:N)"
            )
        free.remove(found)
        rows.set(row, "Devices", str(found.gpu))
        used.append(MigInstance(found.gpu, found.profile, found.gpu_instance, found.compute_instance, found.uuid))
    return used, map_devices(rows, whole, len(node.gpus), skip=set(profiles))


def given_devices(node: gpus.Machine, indices: list[int], visible: str | None) -> tuple[list[int], list[gpus.MigDevice]]:
    """The whole GPUs (NVML indices) and the MIG slices Slurm gave the job: the slices named in the job's
    CUDA_VISIBLE_DEVICES (AutoDetect=nvml sets their MIG UUIDs), else its GRES indices in Slurm's numbering of the node:
    each GPU, or each slice of a GPU in MIG mode, in NVML order (as AutoDetect=nvml and a gres.conf in that order number them)."""
    from radt.collectors.sources.gpus import MigDevice

    named = {t.strip() for t in (visible or "").split(",") if t.strip().startswith("MIG-")}
    gpu_uuid = {g.index: g.uuid for g in node.gpus}
    listed = [d for g in node.gpus for d in ([m for m in node.migs if m.gpu == g.index] if g.mig_mode else [g])]
    picked = [listed[i] for i in indices if i < len(listed)]
    if named:
        slices = [m for m in node.migs if m.uuid in named or f"MIG-{gpu_uuid[m.gpu]}/{m.gpu_instance}/{m.compute_instance}" in named]
    else:
        slices = [d for d in picked if isinstance(d, MigDevice)]
    if not node.migs:
        return indices, slices  # no GPU in MIG mode: Slurm's indices are NVML's (map_devices knows cgroups' renumbering)
    return [d.index for d in picked if not isinstance(d, MigDevice)], slices


def slice_machine(machine: Machine) -> Machine:
    """The node as a job's plan checks it: MIG rows run on slices that exist (Slurm's), so no profile needs room to be created."""
    return Machine(machine.gpu_count, lambda gpu: AnyProfiles(), machine.has, machine.gpu_uuids)


def on_mps_gres(job: str) -> bool:
    """The job was given Slurm's mps GRES (`--gres=mps:N`): the site's prolog runs the MPS daemon of its GPU."""
    return "gres:mps:" in slurm(["scontrol", "show", "job", "-d", job]).stdout  # TresPerNode=gres:mps:100


class AssignedSlices:
    """A job's Setup: a MIG row gets a slice Slurm assigned, used as it is, never created or destroyed; MPS rows get
    radt's own daemon, or on Slurm's mps GRES the site's (its prolog starts it), which radt neither starts nor stops."""

    def __init__(self, setup: Setup, slices: list[MigInstance], site_mps: bool = False) -> None:
        self.setup = setup
        self.free = list(slices)
        self.site_mps = site_mps

    def mps(self, devices: list[int]) -> MpsDaemon:
        if not self.site_mps:
            return self.setup.mps(devices)
        pipe, log = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", MPS_PIPE_DIRECTORY), os.environ.get("CUDA_MPS_LOG_DIRECTORY", MPS_LOG_DIRECTORY)
        share = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "as Slurm set it")
        report(f"radt: MPS on GPU {'+'.join(map(str, devices))} from Slurm's mps GRES (the site's daemon, {pipe}; thread share {share}); radt starts none")
        return MpsDaemon(tuple(sorted(devices)), Path(pipe), Path(log))

    def mig(self, gpu: int, profile: str, start: int | None = None) -> MigInstance:
        instance = next(i for i in self.free if i.gpu == gpu and i.profile == profile)  # place_rows set the row's Devices to its GPU
        self.free.remove(instance)
        report(f"radt: MIG {profile} slice {instance.uuid} (GPU {gpu}, GPU instance {instance.gpu_instance}) assigned by Slurm; nothing is created")
        return instance


class SlurmWorkloadRunner(WorkloadRunner):
    """WorkloadRunner inside a Slurm job: its MIG rows run on the slices Slurm assigned the job."""

    def __init__(self, *args, slices: list[MigInstance], site_mps: bool = False) -> None:
        super().__init__(*args)
        self.slices = slices
        self.site_mps = site_mps

    def set_up(self, setup: Setup) -> dict[str, tuple[str | None, dict[str, str]]]:
        return super().set_up(AssignedSlices(setup, self.slices, self.site_mps))

    def mig_starts(self) -> dict[str, int | None]:
        """None: the slices Slurm assigned exist already, where the site made them; none is placed or created."""
        return {}
