"""The run model both sides share: the tags radt writes on MLflow runs and reads back, the roles a
run plays, a workload's run letters, how a run's workload is named, and what "ran together" means.

The writer (collectors/store/tracking.py), the scheduler and the read side (app/db/runs.py, app/summary/compare.py)
spell every one of these here, so a tag renamed is renamed for both.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from string import ascii_uppercase

# MLflow's own system tags (mlflow/utils/mlflow_tags.py), so radt's runs look right in MLflow's UI
PARENT_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
USER_TAG = "mlflow.user"
SOURCE_NAME_TAG = "mlflow.source.name"
SOURCE_TYPE_TAG = "mlflow.source.type"
NOTE_TAG = "mlflow.note.content"

# the role of a run: a training run, or a workload's parent run that groups them
ROLE_TAG = "radt.role"
RUN_ROLE = "run"
WORKLOAD_ROLE = "workload"

# what radt records on a run
WORKLOAD_TAG = "radt.workload"  # the workload's name (CSV Workload column, -w)
LETTER_TAG = "radt.letter"  # A, B, ... within the workload (run_letter)
HOST_TAG = "radt.host"  # the node's name as Prometheus knows it: --host / RADT_HOST, else the machine's host name
HOSTNAME_TAG = "radt.hostname"  # the machine's own host name, where --host / RADT_HOST named the node otherwise (a pod, a container)
PID_TAG = "radt.pid"  # radt's own process, for `radt sync` and the reaper
DEVICES_TAG = "radt.devices"
COLLOCATION_TAG = "radt.collocation"  # "-", "MPS" ("mps" from radt demo), a MIG profile: radt/collocation.py reads and spells it
LISTENERS_TAG = "radt.listeners"  # the sources that sampled: nvml+host, ...
PROFILER_TAG = "radt.profiler"  # ncu, ncu-raw, nsys, nsys-raw: what wrapped the script; its GPU figures and times are profiling's
COMMAND_TAG = "radt.command"
VERSION_TAG = "radt.version"  # the radt that recorded the run: which sampler code a published number came from
INTERVAL_TAG = "radt.interval"  # seconds between samples
POINTS_TAG = "radt.points"  # points written, and lost where any were
STOP_REASON_TAG = "radt.stop_reason"  # max_epoch, max_time, killed, ...
EXIT_CODE_TAG = "radt.exit_code"
SCRIPT_START_TAG = "radt.script_start_ms"  # the script's own start (epoch ms): after radt's set-up and start gate
SCRIPT_END_TAG = "radt.script_end_ms"  # the script's exit (epoch ms): before radt's flush, logs and pip freeze
GPUS_TAG = "radt.gpus"  # JSON list, one entry per GPU series: {"series": "gpu_0" | "gpu_0_mig_3", "index", "name", "uuid", "pci_bus_id", ...}
GPU_SHARE_TAG = "radt.gpu_share"  # why a run has no share series of its own (NVML gives no per-process figure there): "device only"
MIG_ACTIVITY_TAG = "radt.mig_activity"  # why a MIG run's slice activity could not be read (its GPU series are the whole GPU's)
EXPERIMENT_FILE_TAG = "radt.experiment_file"  # a CSV workload's parent: the CSV it came from
RUNS_TAG = "radt.runs"  # a CSV workload's parent: how many runs it has
IMPORTED_TAG = "radt.imported"  # `radt import`: the files a run was made from
MONITOR_TAG = "radt.monitor"  # `radt monitor`: a run without a training script
DEMO_TAG = "radt.demo"  # `radt demo`: made-up data, marked as such
SETTLED_TAG = "radt.settled"  # a parent run its creator took after its looks agreed: later creators join it, whatever their clocks say
PROMETHEUS_TAG = "radt.prometheus"  # `radt import --prometheus`: "<url> <n> points" read from the cluster's Prometheus
PROMETHEUS_GAP_TAG = "radt.prometheus_gap"  # the one-line reason Prometheus series are missing (unreachable, refused, no series)

# a run across nodes (MLflow's MLFLOW_SYSTEM_METRICS_NODE_ID): one tag per node says its part's status, others its host, GPUs, ...
NODE_TAG = "radt.node."  # radt.node.<node> = RUNNING | FINISHED | FAILED | KILLED; radt.node.<node>/<what> = the node's own tags
SLURM_JOB_TAG = "radt.slurm.job_id"
SLURM_STEP_TAG = "radt.slurm.step"  # <job id>.<step id>: the radts of one multi-node step share one run
SLURM_NODE_TAG = "radt.slurm.node"
SLURM_PARTITION_TAG = "radt.slurm.partition"
# `radt import --slurm` (collectors/cluster/slurmimport.py) writes these; the Cluster page (app/db/jobs.py) reads them
SLURM_PREFIX = "radt.slurm."  # radt.slurm.<fact>: user, account, state, exit_code, nodes, gpus_requested, gpus_used ...
SLURM_EXPERIMENT_PREFIX = "slurm-"  # its experiments: slurm-<user> or slurm-<account>
GPUS_FROM_TAG = "radt.slurm.gpus_from"  # where a job's GPU indices came from: "exporter label hpc_job" (or jobid), "AdminComment"
NO_SERIES_TAG = "radt.slurm.no_gpu_series"  # why a job's run has no GPU series: never another job's GPU instead
# a job's summary another tool kept (jobstats' AdminComment, JS1:): this tag says where from and that its figures are one
# per GPU and node over the whole job, not series; radt.slurm.summary.<node> = that node's figures (JSON). Never metrics.
SLURM_SUMMARY_TAG = "radt.slurm.summary"
# the diagnosis (radt/diagnosis.py): radt.diagnosis = its codes, comma-separated ('' when nothing is wrong); one
# radt.diagnosis.<code> per finding with its sentence; the metrics it lacked, the spans findings cover, its rules' version
DIAGNOSIS_TAG = "radt.diagnosis"
DIAGNOSIS_PREFIX = "radt.diagnosis."
DIAGNOSIS_LACKING_TAG = "radt.diagnosis.lacking"
DIAGNOSIS_SPANS_TAG = "radt.diagnosis.spans"
DIAGNOSIS_VERSION_TAG = "radt.diagnosis.version"
# the figures behind the diagnosis and the footprint (radt/footprint.py): radt.footprint.<figure>
FOOTPRINT_PREFIX = "radt.footprint."
GPU_MODEL_TAG = "radt.gpu_model"  # an imported job's GPU model (an exporter's modelName), where no radt.gpus entry names it
GPU_MEMORY_TAG = "radt.gpu_memory_mb"  # an imported job's GPU memory size (MB), likewise


def diagnosis_tag(code: str) -> str:
    """radt.diagnosis.<code>: the finding's sentence."""
    return f"{DIAGNOSIS_PREFIX}{code}"


def gpus_used_tag(gpus: Mapping[str, Sequence[int]] | None) -> str:
    """radt.slurm.gpus_used: 'node:0,1;node2:3' for {node: GPU indices}; '' where they are not known."""
    return "" if gpus is None else ";".join(f"{node}:{','.join(map(str, idx))}" for node, idx in sorted(gpus.items()) if idx)


def gpus_of_tag(text: str) -> dict[str, tuple[int, ...]]:
    """{node: GPU indices} of a radt.slurm.gpus_used tag (gpus_used_tag's inverse); a part it cannot read is left out."""
    out: dict[str, tuple[int, ...]] = {}
    for part in filter(None, (text or "").split(";")):
        node, _, indices = part.partition(":")
        found = [int(g) for g in indices.split(",") if g.strip().isdigit()]
        if node and found:
            out[node] = tuple(found)
    return out


def gpus_in_tag(text: str) -> int:
    """How many GPUs a radt.slurm.gpus_used tag names."""
    return sum(len(indices) for indices in gpus_of_tag(text).values())


def node_tag(node: str, what: str = "") -> str:
    """radt.node.<node> (the node's status) or radt.node.<node>/<what> (exit_code, host, gpus, ...); a node id has no '/'."""
    return f"{NODE_TAG}{node}/{what}" if what else f"{NODE_TAG}{node}"


def gpu_entries(tags: Mapping[str, str], node: str | None = None) -> list[dict]:
    """The radt.gpus entries ({"series": "gpu_0", "uuid": ...}) of the run, or of one node's part (radt.node.<node>/gpus)."""
    try:
        listed = json.loads(tags.get(node_tag(node, "gpus") if node else GPUS_TAG) or "[]")
    except ValueError:
        return []
    return [entry for entry in listed if isinstance(entry, dict)] if isinstance(listed, list) else []


def node_statuses(tags: Mapping[str, str]) -> dict[str, str]:
    """{node: status} of a multi-node run, from its radt.node.<node> tags."""
    return {key[len(NODE_TAG) :]: value for key, value in tags.items() if key.startswith(NODE_TAG) and "/" not in key}


WORKLOAD_PREFIX = "workload "  # a workload's parent run is named "workload <name>"
UNGROUPED = "ungrouped:"  # the read side's workload id prefix of runs that belong to no workload


def workload_run_name(workload: str) -> str:
    """The name of a workload's parent run in MLflow's UI."""
    return f"{WORKLOAD_PREFIX}{workload}"


def run_letter(number: int) -> str:
    """A, B, ..., Z, AA, AB, ... for the runs of a workload."""
    letters = ""
    number += 1
    while number:
        number, rest = divmod(number - 1, 26)
        letters = ascii_uppercase[rest] + letters
    return letters


def first_free_letter(held: Iterable[str]) -> str:
    """The first letter no run in `held` has: how a -w run started by hand picks its own."""
    taken = set(held)
    return next(letter for letter in map(run_letter, itertools.count()) if letter not in taken)


def workload_of(
    run_id: str, experiment_id: str, tags: Mapping[str, str], params: Mapping[str, str], parent_tags: Mapping[str, str] | None, parent_name: str | None
) -> tuple[str, str]:
    """(workload id, label) of a run: its radt parent run (tag radt.role=workload), else radT's `workload`
    param, else the experiment's ungrouped bucket (plain MLflow runs, which never ran "together")."""
    parent = tags.get(PARENT_TAG)
    if parent and parent_tags is not None and parent_tags.get(ROLE_TAG) == WORKLOAD_ROLE:
        name = parent_tags.get(WORKLOAD_TAG) or tags.get(WORKLOAD_TAG) or parent_tags.get(RUN_NAME_TAG) or parent_name or parent[:8]
        return parent, f"{WORKLOAD_PREFIX}{name}"
    if params.get("workload") not in (None, ""):
        value = params["workload"]
        return f"param:{experiment_id}:{value}", f"{WORKLOAD_PREFIX}{value}"
    return f"{UNGROUPED}{experiment_id}", "ungrouped"


def script_span(start_time: float | None, duration_s: float | None, tags: Mapping[str, str]) -> tuple[float, float]:
    """[start, end] of the training script itself, epoch ms (NaN where unknown).

    radt's tags SCRIPT_START_TAG (right after the script was spawned, so after radt's set-up and a CSV
    workload's start gate) and SCRIPT_END_TAG (its exit, before radt's own pip freeze and uploads) where
    the run has them; else the run's start, and its end (`duration_s` after its start: now for a running
    run, its last metric for one ended without an end time; the run list's rule).
    """
    run_start = float(start_time) if start_time is not None and start_time == start_time else math.nan
    run_end = run_start + float(duration_s) * 1000.0 if duration_s is not None else math.nan
    return _tag_ms(tags.get(SCRIPT_START_TAG), run_start), _tag_ms(tags.get(SCRIPT_END_TAG), run_end)


def _tag_ms(value: str | None, default: float) -> float:
    try:
        ms = float(value) if value not in (None, "") else math.nan
    except ValueError:
        ms = math.nan
    return ms if math.isfinite(ms) else default


def together(spans: Iterable[tuple[float, float, str]]) -> dict[str, str]:
    """run_id -> its group, for the (start, end, run_id) script spans of one workload's runs: runs whose
    spans overlap (transitively) ran together and share the group of the first of them; touching ends are
    one after another, not together; a run without a start is alone (its own group)."""
    group: dict[str, str] = {}
    ordered = sorted(spans, key=lambda s: (math.inf if math.isnan(s[0]) else s[0], s[2]))
    first, reach = None, -math.inf
    for start, end, run_id in ordered:
        if math.isnan(start):
            group[run_id] = run_id
            continue
        if first is None or not start < reach:
            first, reach = run_id, -math.inf
        group[run_id] = first
        reach = max(reach, start if math.isnan(end) else end)
    return group
