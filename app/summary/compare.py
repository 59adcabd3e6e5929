"""The comparison table of a view: per run, and per group of runs that ran together against the same runs alone.

Every figure can be recomputed from the columns shown:

- steps: the run's own progress (epochs, iterations), summaries._own_steps: the highest step its script logged, + 1 where
  the first logged step is 0;
- duration_min: the script's own time (radt's script start/exit tags, else the run's start and end;
  ``runmodel.script_span``), not radt's set-up, start gate or pip freeze;
- steps_per_h = steps / duration;
- together: how many runs ran together (1: alone). A workload's runs (a radt parent run: CSV workloads
  and ``-w``; radT's ``workload`` param) ran together where their script times overlap: the runs are
  clustered by overlapping [start, end] intervals, and a cluster of two or more is a together group.
  Plain MLflow runs (the "ungrouped" bucket) are never together. Groups and their sizes come from every
  run of the experiment (the `library`), never from which runs are ticked;
- alone_steps_per_h: the mean steps_per_h of the alone_runs FINISHED runs of the same command (script and
  arguments; radT's model and params) in the same experiment that ran by themselves, wherever they sit
  (ungrouped, a workload of their own, a ``-w`` workload whose runs did not overlap); for a run alone too (the collocation
  figure draws it against the same baseline: the table left it blank while the figure drew it at 1, issue 52);
- normalised = steps_per_h / alone_steps_per_h (1 for the only alone run of its command);
- energy_per_step_j = energy / steps (joules per step of the run's own progress); for a run that ran together with others,
  its own energy (run_energy_kj: its run_power_watts estimate integrated, its share of the GPUs it shared) where it has
  one, since each collocated run's GPU energy is the whole GPU's;
- collocation: how the run shared its GPU (``collocation_method``): alone, same GPU, MPS or MIG.
- command: what the run trained, as a reader names it (``command_text``): the script and its arguments, or radT's
  model and params, after the profiler that wrapped it (``ncu train.py``: a profiled run is never another's alone
  baseline); the comparison figures compare runs of one command (app/export/aggregates.py).
- diagnosis: the run's finding codes as its radt.diagnosis tag holds them ("none": diagnosed, nothing found; blank:
  never diagnosed), and idle_gpu_hours, energy_kwh, co2_kg, cost with footprint_basis (the intensity, PUE and price
  they used), as its radt.footprint.* tags hold them (app/summary/findings.py).

A together group's row ("workload", its run_id the workload's id): steps_per_h and normalised are the sums of its runs' (normalised
only where every run has an alone baseline; above 1 the runs together did more work per hour than the
same runs one after another); duration from the first script start to the last exit; peak memory per
GPU (every process on it) the highest of its runs'; the runs' own peaks are not summed into one (they need not coincide); energy per step the group's energy over its runs' steps summed; energy per physical GPU the largest of the runs that recorded that GPU
(collocated runs read the same GPU's counter), summed over distinct GPUs (``summaries.gpu_identity``:
UUID, else host and index), and only where every run has an energy figure. Steps, alone steps/h and the
activity and CPU means are left empty there: no sum or mean of them would be the group's, nor the diagnosis and the
footprint (collocated runs measured the same GPUs: their energy summed would count a GPU twice).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Iterable

import pandas as pd

from radt.app.summary.caveats import profiled_by
from radt.app.summary.findings import FOOTPRINT_COLUMNS, codes_text, footprint_cells
from radt.collocation import from_tag
from radt.runmodel import COLLOCATION_TAG, SLURM_PARTITION_TAG, SLURM_PREFIX, USER_TAG, script_span
from radt.throughput import Work, alone_baselines, command_key, group_sizes, normalised
from radt.throughput import together_groups as throughput_groups

RUN_COLUMNS = ["kind", "experiment_id", "workload", "run", "command", "letter", "status", "together", "steps", "duration_min", "steps_per_h", "alone_runs",
               "alone_steps_per_h", "normalised", "gpus_text", "smact_mean", "smact_p95", "smact_busiest", "smocc_mean", "smocc_p95", "gract_mean",
               "power_mean_w", "peak_memory_per_gpu_mb", "run_memory_peak_mb", "run_sm_share", "energy_kj", "run_energy_kj", "cpu_mean", "energy_per_step_j", "collocation", "gpus_used", "gpus_watched",
               "gpu_basis", "partition", "user", "diagnosis", *FOOTPRINT_COLUMNS, "footprint_basis", "run_id"]  # fmt: skip
# a run's GPU figures, over the GPUs it used (summaries.run_summary), as the summary gives them; a together group's row has none
GPU_COLUMNS = ("gpus_text", "smact_mean", "smact_p95", "smact_busiest", "smocc_mean", "smocc_p95", "gract_mean", "power_mean_w", "gpus_used", "gpus_watched",
               "gpu_basis")  # fmt: skip
PYTHON = re.compile(r"^python[\d.]*$")  # an interpreter (python, python3.10): not part of what a command is; a launcher


def _params(row) -> dict:
    params = getattr(row, "params", None)
    return params if isinstance(params, dict) else {}


def _command(row) -> tuple:
    """throughput.command_key of a list_runs row."""
    return command_key(_params(row), getattr(row, "tags", None))


def run_command(row) -> str:
    """command_text of a list_runs row: its params and the profiler its tags name."""
    return command_text(_params(row), getattr(row, "tags", None))


def command_text(params: dict | None, tags: dict | None = None) -> str:
    """The run's command as a reader names it: the script and its arguments (the interpreter left out), or radT's model and
    params, after the profiler that wrapped it ("ncu train.py --lr 0.1"); "" for a run that recorded neither (a plain
    MLflow run)."""
    params = params or {}
    if params.get("command"):
        try:
            words = shlex.split(str(params["command"]))
        except ValueError:  # an unbalanced quote in a hand-made param: its words as they are
            words = str(params["command"]).split()
        while words and (PYTHON.match(words[0].rsplit("/", 1)[-1]) or words[0] in ("-u", "-O", "-B")):
            words.pop(0)
        text = shlex.join(words) if words else str(params["command"])
    else:
        text = " ".join(str(params[k]) for k in ("model", "params") if params.get(k))
    by = profiled_by(tags)
    return f"{by} {text}" if by and text else text


def collocation_method(tags: dict | None, params: dict | None, together_with: int) -> str:
    """How a run shared its GPU: MPS or MIG from radt's collocation tag (radT's `collocation` param), else
    "same GPU" when it ran together with others (time-sliced), else "alone"."""
    return from_tag((tags or {}).get(COLLOCATION_TAG) or (params or {}).get("collocation")).method(together_with)


def _span(row) -> tuple[float, float]:
    return script_span(row.start_time, row.duration_s, getattr(row, "tags", None) or {})


def _work(row, stats: pd.DataFrame | None = None) -> Work:
    """A list_runs row as throughput's rule reads it; its steps and script duration from `stats` (run_summary) where given."""
    start, end = _span(row)
    steps, seconds = (_stat(stats, row.run_id, column) for column in ("own_steps", "duration_s")) if stats is not None else (math.nan, math.nan)
    return Work(row.run_id, row.experiment_id, _command(row), str(row.workload_id), start, end, row.status == "FINISHED", steps, seconds)


def _stat(stats: pd.DataFrame, run_id: str, column: str) -> float:
    value = stats.at[run_id, column] if run_id in stats.index else math.nan
    return math.nan if value is None else value


def together_groups(library: pd.DataFrame) -> dict[str, str]:
    """run_id -> its group (throughput.together_groups) for the runs of a list_runs frame."""
    return throughput_groups(_work(row) for row in library.itertuples())


def _with(library: pd.DataFrame | None, runs: pd.DataFrame) -> pd.DataFrame:
    if library is None or library.empty:
        return runs
    return pd.concat([library, runs]).drop_duplicates("run_id").reset_index(drop=True)


def related_runs(runs: pd.DataFrame, library: pd.DataFrame) -> pd.DataFrame:
    """The runs of `library` the table of `runs` needs figures of besides `runs` themselves: the other runs
    of their together groups, and the alone runs of the same commands (finished, in the same experiment)."""
    library = _with(library, runs)
    if runs.empty:
        return library.iloc[0:0]
    group = together_groups(library)
    sizes = group_sizes(group)
    chosen = set(runs["run_id"])
    mates = {group[r] for r in chosen if sizes.get(r, 1) > 1}
    wanted = {(row.experiment_id, _command(row)) for row in runs.itertuples()}
    keep = [
        row.run_id not in chosen
        and (group[row.run_id] in mates or (sizes[row.run_id] == 1 and row.status == "FINISHED" and (row.experiment_id, _command(row)) in wanted))
        for row in library.itertuples()
    ]
    return library[keep]


def comparison(runs: pd.DataFrame, summary: pd.DataFrame, library: pd.DataFrame | None = None, library_summary: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per run of `runs`, then one per together group one of them belongs to.

    `library`: every run of the experiments (list_runs), where the groups and the alone runs are found
    (default: `runs` alone); `library_summary`: run_summary of the related runs (``related_runs``).
    A figure whose inputs are missing is NaN, never a figure over fewer runs.
    """
    library = _with(library, runs)
    stats = pd.concat([s for s in (summary, library_summary) if s is not None and not s.empty] or [summary])
    stats = stats.drop_duplicates("run_id").set_index("run_id")
    works = {row.run_id: _work(row, stats) for row in library.itertuples()}
    group = throughput_groups(works.values())
    sizes = group_sizes(group)
    rows_by_id = {row.run_id: row for row in library.itertuples()}
    alone = alone_baselines(works.values(), sizes)

    def stat(run_id: str, column: str) -> float:
        return _stat(stats, run_id, column)

    def run_row(row) -> dict:
        work = works[row.run_id]
        partners = alone.get((row.experiment_id, work.command), [])  # a run alone is set against them too: 1 where it is the only one
        baseline = sum(partners) / len(partners) if partners else math.nan
        steps, energy, own = stat(row.run_id, "own_steps"), stat(row.run_id, "energy_j"), stat(row.run_id, "run_energy_j")
        per_step = own if sizes[row.run_id] > 1 and own == own else energy  # together: its own share, not the GPU's whole
        return {
            "kind": "run",
            "experiment_id": row.experiment_id,
            "workload": row.workload_label,
            "run": row.run_name,
            "command": run_command(row),
            "letter": row.letter,
            "status": row.status,
            "together": sizes[row.run_id],
            "steps": stat(row.run_id, "own_steps"),
            "duration_min": stat(row.run_id, "duration_s") / 60,
            "steps_per_h": work.per_hour,
            "alone_runs": len(partners),
            "alone_steps_per_h": baseline,
            "normalised": normalised(work, alone),
            **{c: stat(row.run_id, c) for c in GPU_COLUMNS + ("cpu_mean",)},
            "peak_memory_per_gpu_mb": stat(row.run_id, "gpu_memory_peak_mb"),
            "run_memory_peak_mb": stat(row.run_id, "run_memory_peak_mb"),
            "run_sm_share": stat(row.run_id, "run_sm_share"),
            "energy_kj": energy / 1000,
            "run_energy_kj": own / 1000,
            "energy_per_step_j": per_step / steps if steps == steps and steps > 0 else math.nan,
            "collocation": collocation_method(getattr(row, "tags", None), row.params, sizes[row.run_id]),
            **_job_of(getattr(row, "tags", None) or {}),
            "diagnosis": codes_text(getattr(row, "tags", None)),
            **footprint_cells(getattr(row, "tags", None)),
            "run_id": row.run_id,
        }

    rows = [run_row(row) for row in runs.itertuples()]
    groups = dict.fromkeys(group[r] for r in runs["run_id"] if sizes.get(r, 1) > 1)
    for first in groups:
        members = [rows_by_id[r] for r, g in group.items() if g == first]
        members.sort(key=lambda row: (_span(row)[0], row.letter, row.run_name))
        rows.append(_group_row(members, [run_row(m) for m in members], stats))
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


def _job_of(tags: dict) -> dict[str, str]:
    """A Slurm job's partition and user (radt import --slurm's tags); the user is MLflow's for any other run."""
    return {"partition": tags.get(SLURM_PARTITION_TAG, ""), "user": tags.get(f"{SLURM_PREFIX}user") or tags.get(USER_TAG, "")}


def _group_row(members: list, figures: list[dict], stats: pd.DataFrame) -> dict:
    spans = [_span(m) for m in members]
    starts, ends = [s for s, _e in spans], [e for _s, e in spans]
    known = all(x == x for x in starts + ends)
    complete = all(f["normalised"] == f["normalised"] for f in figures)
    energy_j = _shared_energy_j([m.run_id for m in members], stats)
    steps = _sum(f["steps"] for f in figures)
    return {
        "kind": "workload",
        "experiment_id": members[0].experiment_id,
        "workload": members[0].workload_label,
        "run": _group_name(members),
        "command": " + ".join(dict.fromkeys(f["command"] for f in figures)),
        "together": len(members),
        "duration_min": (max(ends) - min(starts)) / 60_000 if known else math.nan,
        "steps_per_h": _sum(f["steps_per_h"] for f in figures),
        "normalised": _sum(f["normalised"] for f in figures) if complete else math.nan,
        "peak_memory_per_gpu_mb": _max(f["peak_memory_per_gpu_mb"] for f in figures),
        "energy_kj": energy_j / 1000,
        "energy_per_step_j": energy_j / steps if steps == steps and steps > 0 else math.nan,
        "collocation": figures[0]["collocation"],
        "run_id": members[0].workload_id,
    }


def _group_name(members: list) -> str:
    """A together row's name, its workload's first: three such rows (same GPU, MPS, MIG) each said "2 runs together (A+B)"
    and the table, cut at its run column's width, did not say which pair each was."""
    names, label = "+".join(_names(members)), members[0].workload_label
    return f"{label}: {names} together" if label else f"{len(members)} runs together ({names})"


def _names(members: list) -> list[str]:
    """The runs' letters (A, B) when they tell them apart, else their names."""
    letters = [m.letter for m in members]
    return letters if all(letters) and len(set(letters)) == len(letters) else [m.run_name for m in members]


def _sum(values: Iterable[float]) -> float:
    """The sum, NaN as soon as one term is (never a sum over fewer runs)."""
    values = list(values)
    return math.nan if not values or any(v != v for v in values) else float(sum(values))


def _max(values: Iterable[float]) -> float:
    values = list(values)
    return math.nan if not values or any(v != v for v in values) else float(max(values))


def _shared_energy_j(run_ids: list[str], stats: pd.DataFrame) -> float:
    """Per physical GPU the largest energy of the runs that recorded it, summed over the distinct GPUs."""
    per_gpu: dict[str, float] = {}
    for run_id in run_ids:
        gpus = stats.at[run_id, "gpu_energy_j"] if run_id in stats.index and "gpu_energy_j" in stats.columns else None
        if not isinstance(gpus, dict) or not gpus:
            return math.nan
        for gpu, joules in gpus.items():
            per_gpu[gpu] = max(per_gpu.get(gpu, -math.inf), float(joules))
    return float(sum(per_gpu.values()))
