"""A run as `radt train.py` creates it, for the tests and benchmarks that write its points themselves."""

from __future__ import annotations

from collections.abc import Sequence

from mlflow import MlflowClient

from radt.collectors.store import tracking


def radt_run(
    client: MlflowClient,
    experiment_id: str,
    name: str,
    *,
    start_time: int,
    workload: str | None = None,
    letter: str = "A",
    interval: str = "1",
    script_args: Sequence[str] = (),
) -> str:
    """Create the run with radt's tags and params (tracking.create_run); returns its id."""
    run_id, _parent = tracking.create_run(
        client,
        experiment_id,
        tracking.NewRun(
            command=["python", "train.py", *script_args],
            script="train.py",
            script_args=list(script_args),
            run_name=name,
            workload=workload,
            letter=letter,
            devices="0",
            collocation="-",
            listeners=["nvml", "host"],
            settings={"radt.interval": interval},
            start_time=start_time,
        ),
    )
    return run_id
