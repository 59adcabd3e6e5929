"""Which node of which run this radt is: MLflow's MLFLOW_SYSTEM_METRICS_NODE_ID with MLFLOW_RUN_ID, or a multi-node Slurm step.

A node's series are written as `system/<node>/...` (MLflow's multi-node convention, read by radt.catalogue),
its status as the run's radt.node.<node> tag; the run ends with the worst status once no node runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import NamedTuple

from radt.errors import UserError
from radt.points import Point
from radt.runmodel import SLURM_JOB_TAG, SLURM_NODE_TAG, SLURM_PARTITION_TAG, SLURM_STEP_TAG, node_tag

NODE_ENV = "MLFLOW_SYSTEM_METRICS_NODE_ID"  # MLflow's own variable
RUN_ENV = "MLFLOW_RUN_ID"
_NODE_ID = re.compile(r"^[A-Za-z0-9_.\-: ]{1,100}\Z")  # what an MLflow metric/tag key may hold, no '/'


class Membership(NamedTuple):
    """This radt's part of a run: its node id (None: a run of one host), the run it joins, the Slurm step it shares."""

    node: str | None = None
    run_id: str | None = None  # explicit: MLFLOW_RUN_ID with MLFLOW_SYSTEM_METRICS_NODE_ID
    slurm_step: str | None = None  # automatic: '<job>.<step>' of a step over several nodes
    nodes: int | None = None  # how many nodes the Slurm step has


class NodeError(UserError, ValueError):
    """A node id MLflow cannot take as part of a key."""


def check_node(node: str) -> str:
    if not _NODE_ID.match(node):
        raise NodeError(f"node id {node!r} ({NODE_ENV}) may hold letters, digits, '_', '-', '.', ':' and spaces (no '/'), at most 100; set another")
    return node


def membership(environ: Mapping[str, str]) -> Membership:
    """From the environment: explicit (MLFLOW_SYSTEM_METRICS_NODE_ID, with MLFLOW_RUN_ID to join), else a Slurm step over nodes."""
    node = environ.get(NODE_ENV, "").strip()
    if node:
        return Membership(check_node(node), environ.get(RUN_ENV, "").strip() or None)
    nodes = _int(environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_NNODES"))
    job, step, name = environ.get("SLURM_JOB_ID"), environ.get("SLURM_STEP_ID"), environ.get("SLURMD_NODENAME")
    if job and step is not None and name and nodes and nodes > 1:
        local = environ.get("SLURM_LOCALID", "0")
        node = name if local in ("", "0") else f"{name}.{local}"  # a second task on one node samples as its own part
        return Membership(check_node(node), None, f"{job}.{step}", nodes)
    return Membership()


def ignored_run_id(environ: Mapping[str, str]) -> str | None:
    """The line radt says where MLFLOW_RUN_ID is set but names no run to join: without MLFLOW_SYSTEM_METRICS_NODE_ID radt
    records a run of its own (it joins a run only as one of its nodes), and a user who named a run must hear it."""
    run_id = environ.get(RUN_ENV, "").strip()
    if not run_id or environ.get(NODE_ENV, "").strip():
        return None
    return (
        f"radt: {RUN_ENV}={run_id} is set without {NODE_ENV}, so radt records a run of its own; "
        f"to record into {run_id} as one node of it, set {NODE_ENV} too (e.g. $(hostname -s)), or unset {RUN_ENV}"
    )


def slurm_tags(environ: Mapping[str, str]) -> dict[str, str]:
    """The Slurm job, node and partition of a radt started inside any Slurm job (sbatch, srun, salloc)."""
    if not environ.get("SLURM_JOB_ID"):
        return {}
    found = {
        SLURM_JOB_TAG: environ.get("SLURM_JOB_ID"),
        SLURM_NODE_TAG: environ.get("SLURMD_NODENAME"),
        SLURM_PARTITION_TAG: environ.get("SLURM_JOB_PARTITION"),
    }
    if environ.get("SLURM_STEP_ID") is not None:
        found[SLURM_STEP_TAG] = f"{environ['SLURM_JOB_ID']}.{environ['SLURM_STEP_ID']}"
    return {k: v for k, v in found.items() if v}


def node_key(key: str, node: str) -> str:
    """system/gpu_0_sm_active -> system/<node>/gpu_0_sm_active; a key already naming a node, or not a system key, as it is."""
    if not key.startswith("system/") or key.count("/") > 1:
        return key
    return f"system/{node}/{key[len('system/') :]}"


def on_node(put: Callable[[list[Point]], None], node: str | None) -> Callable[[list[Point]], None]:
    """The sampler's sink with every system key under the node (the sink itself when there is no node)."""
    if not node:
        return put
    return lambda points: put([p._replace(key=node_key(p.key, node)) for p in points])


def node_scoped(tags: Mapping[str, str], node: str | None) -> dict[str, str]:
    """A node's own radt tags (radt.gpus, radt.exit_code, ...) as radt.node.<node>/gpus, ...; the tags as they are without a node."""
    if not node:
        return dict(tags)
    return {node_tag(node, key.removeprefix("radt.")): value for key, value in tags.items()}


def worst(statuses: list[str]) -> str:
    """A run's status from its parts': FAILED > KILLED > FINISHED (RUNNING while any part runs)."""
    for status in ("RUNNING", "FAILED", "KILLED"):
        if status in statuses:
            return status
    return "FINISHED"


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None
