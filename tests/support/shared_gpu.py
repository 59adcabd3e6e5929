"""Stores of runs that shared a GPU, for the dashboard's GPU-share tests (issue #55): each run's own share series and the
device's utilization written by radt's own writer, the runs' host in their radt.host tag as the tracker sets it."""

from __future__ import annotations

from radt.catalogue import MetricName
from radt.collectors.store import tracking
from radt.collectors.store.stores import SqlMetricStore
from radt.runmodel import GPU_SHARE_TAG, HOST_TAG
from tests.support.diagnosed import MINUTE, write_series
from tests.support.runs import radt_run

SHARES = {"left": 30.0, "right": 50.0}  # each run's own SM share of GPU 0 while both ran
DEVICE = 90.0  # GPU 0's utilization while both ran: 10 % more than the shares (an outsider, or NVML's rounding)


def shared_store(uri: str, start: int, device: bool = True) -> dict[str, str]:
    """Experiment 'shared': 'left' and 'right' on node-a's GPU 0 for 10 minutes together (with the device's utilization
    when `device`), 'apart' on node-b's GPU 0 at the same time, 'old' on an older GPU that gave no per-process figure
    (radt.gpu_share, device utilization only). Returns the experiment's id and the runs' ids by name."""
    client = tracking.connect(uri)
    experiment = tracking.resolve_experiment(client, uri, "shared")
    writer = SqlMetricStore(uri)
    runs = {name: radt_run(client, experiment, name, start_time=start, workload=None) for name in ("left", "right", "apart", "old")}
    for name, host in (("left", "node-a"), ("right", "node-a"), ("apart", "node-b"), ("old", "node-c")):
        client.set_tag(runs[name], HOST_TAG, host)
    client.set_tag(runs["old"], GPU_SHARE_TAG, "NVML_ERROR_NOT_SUPPORTED: this GPU gives no per-process utilization")
    for name, share in SHARES.items():
        write_series(writer, runs[name], MetricName.RUN_SM_UTILIZATION_PERCENTAGE, 0, start, 10, lambda m, v=share: v)
        write_series(writer, runs[name], MetricName.RUN_POWER_WATTS, 0, start, 10, lambda m, v=share: 2 * v)
        if device:
            write_series(writer, runs[name], MetricName.UTILIZATION_PERCENTAGE, 0, start, 10, lambda m: DEVICE)
    write_series(writer, runs["apart"], MetricName.RUN_SM_UTILIZATION_PERCENTAGE, 0, start, 10, lambda m: 70.0)
    write_series(writer, runs["old"], MetricName.UTILIZATION_PERCENTAGE, 0, start, 10, lambda m: 60.0)
    writer.close()
    for name in runs.values():
        client.set_terminated(name, "FINISHED", end_time=start + 10 * MINUTE)
    return {"experiment": experiment, **runs}
