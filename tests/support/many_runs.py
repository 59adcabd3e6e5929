"""An experiment of 500 runs (50 radt workloads of 10), written straight into MLflow's tables in a few bulk inserts:
the run filter's browser tests (tests/test_filter_browser.py) and the picker's benchmark (bench/filter_picker.py)."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from mlflow import MlflowClient

from radt import mlflowdb

WORKLOADS, PER_WORKLOAD = 50, 10
BASE = 1_760_000_000_000
BATCHES = ("64", "128", "256", "512")
COLLOCATIONS = ("-", "mps", "3g.40gb")
EXAMPLE = "params.batch_size = '128' and tags.radt.collocation = 'mps' and attributes.status = 'FINISHED'"  # the issue's, with radt's stored 'mps'


def run_fields(w: int, i: int) -> dict:
    """The 500 runs' fields, from their workload and index alone (the tests count their matches from here)."""
    letter = chr(ord("A") + i)
    return {
        "name": f"{'resnet50' if w % 2 else 'bert'} {w:02d}{letter}",
        "letter": letter,
        "batch_size": BATCHES[i % 4],
        "collocation": COLLOCATIONS[w % 3],
        "status": "FAILED" if (w * PER_WORKLOAD + i) % 17 == 0 else "FINISHED",
        "start": BASE + w * 3_600_000,
        "minutes": 5 + (w * PER_WORKLOAD + i) % 40,
        "smact": 0.05 + 0.1 * (i % 10),
    }


def expected(predicate) -> int:
    return sum(1 for w in range(WORKLOADS) for i in range(PER_WORKLOAD) if predicate(run_fields(w, i)))


def fill_500(uri: str) -> str:
    """An experiment of 50 radt workloads of 10 runs each: parents, tags, params, 30 SMACT points and a loss per run, in a few bulk inserts."""
    return fill_runs(uri, WORKLOADS)


def fill_runs(uri: str, workloads: int) -> str:
    """An experiment of `workloads` radt workloads of 10 runs each, as fill_500's (bench/filter_picker.py --runs 5000)."""
    experiment = MlflowClient(uri).create_experiment(f"{workloads * PER_WORKLOAD} runs")
    runs, tags, params, points, latest = [], [], [], [], []

    def run_row(run_id: str, name: str, status: str, start: int, end: int) -> dict:
        return {
            "run_uuid": run_id,
            "name": name,
            "source_type": "LOCAL",
            "source_name": "",
            "entry_point_name": "",
            "user_id": "radt",
            "status": status,
            "start_time": start,
            "end_time": end,
            "source_version": "",
            "lifecycle_stage": "active",
            "artifact_uri": f"/tmp/artifacts/{run_id}",
            "experiment_id": int(experiment),
        }

    for w in range(workloads):
        parent = uuid.uuid4().hex
        first = run_fields(w, 0)
        runs.append(run_row(parent, f"workload w{w:02d}", "FINISHED", first["start"], first["start"] + 50 * 60_000))
        tags += [
            {"run_uuid": parent, "key": k, "value": v}
            for k, v in {"radt.role": "workload", "radt.workload": f"w{w:02d}", "mlflow.runName": f"workload w{w:02d}"}.items()
        ]
        for i in range(PER_WORKLOAD):
            r, run_id = run_fields(w, i), uuid.uuid4().hex
            runs.append(run_row(run_id, r["name"], r["status"], r["start"], r["start"] + r["minutes"] * 60_000))
            run_tags = {"mlflow.runName": r["name"], "mlflow.parentRunId": parent, "radt.role": "run", "radt.letter": r["letter"]}
            tags += [{"run_uuid": run_id, "key": k, "value": v} for k, v in (run_tags | {"radt.collocation": r["collocation"]}).items()]
            params += [
                {"run_uuid": run_id, "key": k, "value": v} for k, v in {"batch_size": r["batch_size"], "lr": "0.1", "model": r["name"].split()[0]}.items()
            ]
            for s in range(30):
                points.append(
                    {"run_uuid": run_id, "key": "system/gpu_0_sm_active", "value": r["smact"], "timestamp": r["start"] + s * 1000, "step": s, "is_nan": False}
                )
            latest.append(
                {"run_uuid": run_id, "key": "system/gpu_0_sm_active", "value": r["smact"], "timestamp": r["start"] + 29_000, "step": 29, "is_nan": False}
            )
            latest.append({"run_uuid": run_id, "key": "loss", "value": 1.0 / (1 + i), "timestamp": r["start"] + 29_000, "step": 9, "is_nan": False})
    engine = sa.create_engine(uri)
    with engine.begin() as conn:
        for table, rows in (
            (mlflowdb.runs, runs),
            (mlflowdb.tags, tags),
            (mlflowdb.params, params),
            (mlflowdb.metrics, points),
            (mlflowdb.latest_metrics, latest),
        ):
            for start in range(0, len(rows), 20_000):  # bounded statements (5,000 runs: 150,000 points)
                conn.execute(table.insert(), rows[start : start + 20_000])
    engine.dispose()
    return str(experiment)
