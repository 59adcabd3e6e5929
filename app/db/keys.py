"""Which stored key holds a catalogue metric for each device of a run (radt's, MLflow's and radT's legacy keys alike).

``sm_active`` on GPU 0 may be ``system/gpu_0_sm_active`` in one run and radT's ``DCGMI - SM Active``
in another; legacy units come with the scale to the catalogue's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import sqlalchemy as sa

from radt import catalogue
from radt.app.db.runs import keys_by_run
from radt.app.db.store import unique
from radt.catalogue import MetricName


def device_keys(run_keys: Iterable[str], metric_name: str) -> dict[catalogue.Device, tuple[str, catalogue.Resolved]]:
    """Every series of one catalogue metric a run stored, one key per device (node, GPU, MIG slice), devices sorted.

    Where two keys measure the same device (radt's ``system/gpu_0_sm_active`` and radT's
    ``DCGMI - SM Active``, which counts as GPU 0), radt's and MLflow's ``system/`` keys win over
    radT's, then radT's keys in catalogue order.
    """
    legacy_rank = {k: i for i, k in enumerate(catalogue.LEGACY_KEYS)}
    best: dict[catalogue.Device, tuple[tuple, str, catalogue.Resolved]] = {}
    for key in run_keys:
        resolved = catalogue.resolve(key)
        if resolved is None or resolved.metric.name != metric_name:
            continue
        rank = (resolved.legacy, legacy_rank.get(catalogue.legacy_name(key) or "", 0), key)
        device = resolved.device
        if device not in best or rank < best[device][0]:
            best[device] = (rank, key, resolved)
    return {device: (best[device][1], best[device][2]) for device in sorted(best, key=catalogue.Device.sort_key)}


def resolve_scaled(
    engine: sa.Engine, run_ids: Sequence[str], metric_name: str, gpu: int | None = None, *, keys: Mapping[str, set[str]] | None = None
) -> dict[str, tuple[str, float]]:
    """run_id -> (stored key, scale to the catalogue unit) for a catalogue metric on one device; see resolve_keys."""
    if metric_name not in catalogue.METRICS:
        raise KeyError(f"unknown catalogue metric {metric_name!r}")
    keys = keys_by_run(engine, run_ids) if keys is None else keys
    out = {}
    for run_id in unique(run_ids):
        for device, (key, resolved) in device_keys(keys.get(run_id, ()), metric_name).items():
            if gpu is None or (device.gpu == gpu and device.mig is None and device.node is None):
                out[run_id] = (key, resolved.scale)
                break
    return out


def resolve_keys(
    engine: sa.Engine, run_ids: list[str], metric_name: str, gpu: int | None = None, *, keys: Mapping[str, set[str]] | None = None
) -> dict[str, str]:
    """run_id -> the key that holds catalogue metric ``metric_name`` on GPU ``gpu`` of the run's own host.

    ``system/...`` keys (radt's and MLflow's own) come before radT's legacy keys, which carry no
    GPU index and count as GPU 0. ``gpu=None`` takes the run's first device (see ``device_keys``);
    every device of a run is ``load_devices``'. Runs without the metric are absent. Legacy values
    need ``resolve_scaled``'s scale (``load_metric`` applies it).
    """
    return {run_id: key for run_id, (key, _scale) in resolve_scaled(engine, run_ids, metric_name, gpu, keys=keys).items()}


def matching(keys: Iterable[str], metric_name: str) -> list[tuple[str, catalogue.Resolved]]:
    """Every key meaning this metric, one per device (see device_keys)."""
    return list(device_keys(keys, metric_name).values())


def whole_gpus(run_keys: Iterable[str], metric_name: str) -> dict[catalogue.Device, tuple[str, catalogue.Resolved]]:
    """device_keys of whole GPUs only (energy and power are a GPU's, not a MIG slice's)."""
    return {d: kr for d, kr in device_keys(run_keys, metric_name).items() if d.gpu is not None and d.mig is None}


def own_devices(run_keys: Iterable[str], metric_name: str) -> dict[catalogue.Device, tuple[str, catalogue.Resolved]]:
    """device_keys of the run's own devices: its GPUs, a GPU's MIG slices instead of the whole GPU where it has them."""
    found = device_keys(run_keys, metric_name)
    return {d: found[d] for d in _sliced(found)}


def gpu_devices(run_keys: Iterable[str]) -> list[catalogue.Device]:
    """Every GPU (or MIG slice, in place of its GPU) the run recorded any per-GPU metric of: the devices radt watched, sorted."""
    found = set()
    for key in run_keys:
        resolved = catalogue.resolve(key)
        if resolved is not None and resolved.metric.per_gpu:
            found.add(resolved.device)
    return sorted(_sliced(found), key=catalogue.Device.sort_key)


def _sliced(devices: Iterable[catalogue.Device]) -> list[catalogue.Device]:
    """The devices, a GPU left out where its MIG slices are among them (the slices stand for it)."""
    devices = list(devices)
    sliced = {(d.node, d.gpu) for d in devices if d.mig is not None}
    return [d for d in devices if d.mig is not None or (d.node, d.gpu) not in sliced]


def cumulative_legacy(key: str) -> bool:
    """radT keys whose values are counters since the driver loaded (DCGM's TOTEC)."""
    name = catalogue.legacy_name(key)
    return name is not None and catalogue.LEGACY_KEYS[name][0] == MetricName.ENERGY_JOULES
