"""A run's work per hour alone and collocated: the one rule behind the comparison table's `normalised` and could_share's
measured gain.

- a run's throughput: its own steps (``own_steps``: the highest step its script logged, + 1 where the first is 0) over its
  script's span (``runmodel.script_span``), per hour;
- together: runs of one workload whose script spans overlap (``runmodel.together``); runs of no workload ("ungrouped")
  never ran together;
- a command's alone baseline: the mean throughput of its FINISHED runs that ran alone, in the same experiment (the command:
  radt's script and arguments, or radT's model and params, and the profiler that wrapped it: ``command_key``);
- a together group's gain: the sum of its runs' throughput ÷ their baselines, only where every run has one (above 1: the
  runs together did more work per hour than the same runs one after another);
- a command's measured gain: the mean gain of the together groups that hold one of its runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from radt import catalogue, mlflowdb
from radt.runmodel import PARENT_TAG, PROFILER_TAG, ROLE_TAG, SCRIPT_END_TAG, SCRIPT_START_TAG, UNGROUPED, WORKLOAD_ROLE, script_span, together, workload_of

CHUNK = 250  # run ids per IN list


def command_key(params: Mapping[str, str] | None, tags: Mapping[str, str] | None) -> tuple:
    """What makes two runs the same training: radt's command, or radT's model and params, and the profiler that wrapped it
    (a run under ncu is no baseline for one without)."""
    params, by = params or {}, str((tags or {}).get(PROFILER_TAG) or "")
    if params.get("command"):
        return ("command", params["command"], by)
    return ("radT", params.get("model"), params.get("params"), by)


@dataclass(frozen=True)
class Work:
    """One run as the rule reads it: where it ran, what it ran, when its script ran, and the steps it did."""

    run_id: str
    experiment_id: str
    command: tuple
    workload_id: str
    start_ms: float
    end_ms: float
    finished: bool
    steps: float = math.nan
    seconds: float = math.nan  # its script's duration

    @property
    def per_hour(self) -> float:
        """Steps per hour of its script's duration; NaN where a figure is missing."""
        steps, seconds = self.steps, self.seconds
        return steps / seconds * 3600 if steps == steps and seconds == seconds and seconds > 0 else math.nan


@dataclass(frozen=True)
class Gain:
    """A command's measured collocation gain: the mean over `groups` together groups that held one of its runs."""

    gain: float
    groups: int


def together_groups(runs: Iterable[Work]) -> dict[str, str]:
    """run_id -> its group: the first run id of its cluster of overlapping script spans within its workload (a run alone is
    its own group). Ungrouped runs, and runs without a start, are always alone."""
    by_workload: dict[str, list[tuple[float, float, str]]] = {}
    group: dict[str, str] = {}
    for run in runs:
        if run.workload_id.startswith(UNGROUPED):
            group[run.run_id] = run.run_id
        else:
            by_workload.setdefault(run.workload_id, []).append((run.start_ms, run.end_ms, run.run_id))
    for spans in by_workload.values():
        group.update(together(spans))
    return group


def group_sizes(group: Mapping[str, str]) -> dict[str, int]:
    """run_id -> how many runs its group holds (1: it ran alone)."""
    counts: dict[str, int] = {}
    for g in group.values():
        counts[g] = counts.get(g, 0) + 1
    return {run_id: counts[g] for run_id, g in group.items()}


def alone_baselines(runs: Iterable[Work], sizes: Mapping[str, int]) -> dict[tuple[str, tuple], list[float]]:
    """(experiment, command) -> the throughputs of its FINISHED runs that ran alone."""
    alone: dict[tuple[str, tuple], list[float]] = {}
    for run in runs:
        value = run.per_hour
        if sizes.get(run.run_id, 1) == 1 and run.finished and not math.isnan(value):
            alone.setdefault((run.experiment_id, run.command), []).append(value)
    return alone


def normalised(run: Work, alone: Mapping[tuple[str, tuple], list[float]]) -> float:
    """The run's throughput ÷ its command's alone baseline; NaN without one."""
    partners = alone.get((run.experiment_id, run.command), [])
    baseline = sum(partners) / len(partners) if partners else math.nan
    return run.per_hour / baseline if baseline == baseline and baseline else math.nan


def command_gains(runs: Sequence[Work]) -> dict[tuple[str, tuple], Gain]:
    """(experiment, command) -> its measured gain, for the commands with a run in a together group whose runs all have a
    baseline; a command never measured collocated is not in it."""
    group = together_groups(runs)
    sizes = group_sizes(group)
    alone = alone_baselines(runs, sizes)
    members: dict[str, list[Work]] = {}
    for run in runs:
        if sizes[run.run_id] > 1:
            members.setdefault(group[run.run_id], []).append(run)
    found: dict[tuple[str, tuple], list[float]] = {}
    for runs_together in members.values():
        shares = [normalised(run, alone) for run in runs_together]
        if any(math.isnan(s) for s in shares):
            continue
        for key in dict.fromkeys((run.experiment_id, run.command) for run in runs_together):
            found.setdefault(key, []).append(sum(shares))
    return {key: Gain(sum(gains) / len(gains), len(gains)) for key, gains in found.items()}


# --- from the store --------------------------------------------------------------------------------


def _chunks(items: Sequence, size: int = CHUNK) -> Iterable[Sequence]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def own_steps(conn: sa.Connection, run_ids: Sequence[str]) -> dict[str, float]:
    """run id -> its progress in its own units, from the metrics its script logged (not system/..., not radT's hardware
    keys): its highest step + 1 where its first logged step is 0 (`for epoch in range(n)` logs 0..n-1), its highest step
    where the first is 1 or more (a count of steps done: epoch + 1, Hugging Face's global_step; the demo's epochs 1..n)."""
    latest, metrics = mlflowdb.latest_metrics.c, mlflowdb.metrics.c
    highest: dict[str, float] = {}
    keys: set[str] = set()
    for chunk in _chunks(list(run_ids)):
        stmt = sa.select(latest.run_uuid, latest.key, latest.step).where(latest.run_uuid.in_(chunk), sa.not_(latest.key.startswith("system/", autoescape=True)))
        for run_id, key, step in conn.execute(stmt):
            if catalogue.resolve(key) is None and step is not None:  # radT's hardware keys are not progress
                highest[run_id] = max(float(step), highest.get(run_id, -math.inf))
                keys.add(key)
    lowest: dict[str, float] = {}
    for chunk in _chunks(list(highest)):
        for key_chunk in _chunks(sorted(keys)):  # one index range per run and key (index_metrics_run_uuid_key_step)
            stmt = (
                sa.select(metrics.run_uuid, sa.func.min(metrics.step)).where(metrics.run_uuid.in_(chunk), metrics.key.in_(key_chunk)).group_by(metrics.run_uuid)
            )
            for run_id, step in conn.execute(stmt):
                if step is not None:
                    lowest[run_id] = min(float(step), lowest.get(run_id, math.inf))
    return {run_id: max(top, 0.0) + (1.0 if lowest.get(run_id, 0.0) <= 0 else 0.0) for run_id, top in highest.items()}


WORK_TAGS = (PARENT_TAG, ROLE_TAG, SCRIPT_START_TAG, SCRIPT_END_TAG, PROFILER_TAG)
WORK_PARAMS = ("command", "model", "params", "workload")


def read_work(engine: sa.Engine, experiment_ids: Iterable[str]) -> list[Work]:
    """Every ended run of the experiments (not deleted, not a workload's parent run) as the rule reads it; steps (the one
    read of MLflow's metrics table) only for the runs of a command the store holds both alone and together (``measurable``)."""
    r, t, p = mlflowdb.runs.c, mlflowdb.tags.c, mlflowdb.params.c
    experiments = sorted({int(e) for e in experiment_ids})
    if not experiments:
        return []
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(r.run_uuid, r.experiment_id, r.status, r.start_time, r.end_time).where(r.experiment_id.in_(experiments), r.lifecycle_stage != "deleted")
        ).all()
        ids = [row.run_uuid for row in rows]
        tags: dict[str, dict[str, str]] = {}
        params: dict[str, dict[str, str]] = {}
        for chunk in _chunks(ids):
            for run_id, key, value in conn.execute(sa.select(t.run_uuid, t.key, t.value).where(t.run_uuid.in_(chunk), t.key.in_(WORK_TAGS))):
                tags.setdefault(run_id, {})[key] = value or ""
            for run_id, key, value in conn.execute(sa.select(p.run_uuid, p.key, p.value).where(p.run_uuid.in_(chunk), p.key.in_(WORK_PARAMS))):
                params.setdefault(run_id, {})[key] = value or ""
    out = []
    for row in rows:
        held, given = tags.get(row.run_uuid, {}), params.get(row.run_uuid, {})
        if held.get(ROLE_TAG) == WORKLOAD_ROLE or row.end_time is None:
            continue
        parent = held.get(PARENT_TAG)
        workload, _label = workload_of(row.run_uuid, str(row.experiment_id), held, given, tags.get(parent, {}) if parent else None, None)
        start, end = script_span(row.start_time, (row.end_time - row.start_time) / 1000 if row.start_time is not None else None, held)
        out.append(
            Work(
                row.run_uuid,
                str(row.experiment_id),
                command_key(given, held),
                workload,
                start,
                end,
                row.status == "FINISHED",
                math.nan,
                (end - start) / 1000,
            )
        )
    wanted = measurable(out)
    with engine.connect() as conn:
        steps = own_steps(conn, [w.run_id for w in out if w.run_id in wanted]) if wanted else {}
    return [dataclasses.replace(w, steps=steps.get(w.run_id, math.nan)) if w.run_id in wanted else w for w in out]


def measurable(runs: Sequence[Work]) -> set[str]:
    """The run ids whose steps a gain needs: the runs of each (experiment, command) that has a FINISHED run alone and a run in
    a together group, and every run of those groups."""
    group = together_groups(runs)
    sizes = group_sizes(group)
    alone = {(w.experiment_id, w.command) for w in runs if sizes[w.run_id] == 1 and w.finished}
    groups = {group[w.run_id] for w in runs if sizes[w.run_id] > 1 and (w.experiment_id, w.command) in alone}
    return {w.run_id for w in runs if group[w.run_id] in groups or ((w.experiment_id, w.command) in alone and sizes[w.run_id] == 1 and w.finished)}
