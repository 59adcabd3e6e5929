"""The comparison table of a view: per run, and per collocated workload against the same runs alone.

Throughput is the run's own progress (the highest step it logged, + 1: epochs or iterations) per
hour. A collocated workload's runs are matched to runs of the same command (script and
arguments; radT's model and params) in a workload of one run; where every run has such a
partner, the table gives the workload's combined throughput and its normalised throughput
(sum of each run's throughput over its partner's; above 1 the collocation did more work per
hour than the same runs one after another).
"""

from __future__ import annotations

import math

import pandas as pd

RUN_COLUMNS = ["kind", "experiment_id", "workload", "run", "letter", "status", "duration_min", "smact_mean", "smact_p95", "smocc_mean", "smocc_p95",
               "gpu_memory_peak_mb", "energy_kj", "cpu_mean", "steps", "throughput_per_h", "alone_throughput_per_h", "normalised_throughput"]  # fmt: skip


def _command(params: dict) -> tuple:
    """What makes two runs the same training: radt's command, or radT's model and params."""
    params = params or {}
    if params.get("command"):
        return ("command", params["command"])
    return ("radT", params.get("model"), params.get("params"))


def comparison(runs: pd.DataFrame, summary: pd.DataFrame, library: pd.DataFrame | None = None, library_summary: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per run, then one per collocated workload; `library` (runs of the same experiments, with
    their summary) is where the runs-alone partners are looked for (default: the chosen runs)."""
    library = runs if library is None else library
    library_summary = summary if library_summary is None else library_summary
    stats = pd.concat([summary, library_summary]).drop_duplicates("run_id").set_index("run_id")

    def throughput(run_id: str) -> float:
        if run_id not in stats.index:
            return math.nan
        steps, seconds = stats.at[run_id, "own_steps"], stats.at[run_id, "duration_s"]
        return steps / seconds * 3600 if steps == steps and seconds and seconds == seconds and seconds > 0 else math.nan

    sizes = library.groupby("workload_id")["run_id"].transform("size")
    alone: dict[tuple, list[float]] = {}
    for row, size in zip(library.itertuples(), sizes, strict=False):
        value = throughput(row.run_id)
        if size == 1 and not math.isnan(value) and row.status == "FINISHED":
            alone.setdefault((row.experiment_id, _command(row.params)), []).append(value)

    rows = []
    for row in runs.itertuples():
        s = stats.loc[row.run_id] if row.run_id in stats.index else pd.Series(dtype="float64")
        mine = throughput(row.run_id)
        partners = alone.get((row.experiment_id, _command(row.params)), [])
        collocated = (runs["workload_id"] == row.workload_id).sum() > 1 or (library["workload_id"] == row.workload_id).sum() > 1
        partner = sum(partners) / len(partners) if partners and collocated else math.nan
        rows.append(
            {
                "kind": "run",
                "experiment_id": row.experiment_id,
                "workload": row.workload_label,
                "run": row.run_name,
                "letter": row.letter,
                "status": row.status,
                "duration_min": s.get("duration_s", math.nan) / 60,
                **{c: s.get(c, math.nan) for c in ("smact_mean", "smact_p95", "smocc_mean", "smocc_p95", "gpu_memory_peak_mb", "cpu_mean")},
                "energy_kj": s.get("energy_j", math.nan) / 1000,
                "steps": s.get("own_steps", math.nan),
                "throughput_per_h": mine,
                "alone_throughput_per_h": partner,
                "normalised_throughput": mine / partner if partner == partner and partner else math.nan,
                "_workload_id": row.workload_id,
            }
        )
    table = pd.DataFrame(rows, columns=[*RUN_COLUMNS, "_workload_id"])
    for workload_id, members in table.groupby("_workload_id", sort=False):
        if len(members) < 2:
            continue
        complete = members["normalised_throughput"].notna().all()
        rows.append(
            {
                "kind": "workload",
                "experiment_id": members["experiment_id"].iloc[0],
                "workload": members["workload"].iloc[0],
                "run": f"{len(members)} runs together",
                "duration_min": members["duration_min"].max(),
                "smact_mean": members["smact_mean"].mean(),
                # collocated runs read the same GPU's memory and energy: the workload's is the largest, not the sum
                "gpu_memory_peak_mb": members["gpu_memory_peak_mb"].max(),
                "energy_kj": members["energy_kj"].max(),
                "steps": members["steps"].sum(min_count=1),
                "throughput_per_h": members["throughput_per_h"].sum(min_count=1),
                "alone_throughput_per_h": members["alone_throughput_per_h"].sum(min_count=1) if complete else math.nan,
                "normalised_throughput": members["normalised_throughput"].sum() if complete else math.nan,
                "_workload_id": workload_id,
            }
        )
    return pd.DataFrame(rows, columns=[*RUN_COLUMNS, "_workload_id"]).drop(columns="_workload_id")


def alone_candidates(runs: pd.DataFrame, library: pd.DataFrame) -> pd.DataFrame:
    """Runs of `library` that may be a chosen run's partner: alone in their workload, same command."""
    if library.empty:
        return library
    wanted = {(row.experiment_id, _command(row.params)) for row in runs.itertuples()}
    sizes = library.groupby("workload_id")["run_id"].transform("size")
    keep = [size == 1 and (row.experiment_id, _command(row.params)) in wanted for row, size in zip(library.itertuples(), sizes, strict=False)]
    return library[keep]
