"""`radt import FILE...`: raw dcgmi dmon, nvidia-smi CSV and top -b logs into one MLflow run;
`radt import --prometheus URL --run RUN_ID`: a run's GPU series from the cluster's Prometheus.

The format is detected from the content. Logs with their own timestamps (nvidia-smi's
`timestamp` column, top's clock) keep them; top's clock goes on the date of --start, else of the
first nvidia-smi timestamp, else on the days that end it by the file's modification time. The others are
laid out at --interval from --start, else from the first nvidia-smi timestamp, else so that they end at
the file's modification time. A log dated by its modification time is said in one line naming --start.
Where two logs give the same series, the one with timestamps is kept.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from radt import settings
from radt.collectors._common import UsageError, check_name
from radt.collectors.sources.parsers import _smi_timestamp, detect_format, parse_dcgmi_dmon, parse_nvidia_smi_csv, parse_top_batch
from radt.collectors.sources.toolmetrics import EnergyBaseline, dmon_metrics, smi_metrics, top_metrics
from radt.collectors.store.stores import open_metric_store
from radt.collectors.store.tracking import NewRun, connect, create_run, resolve_experiment, set_tags
from radt.collocation import SHARED
from radt.errors import UserError
from radt.options import store_parent
from radt.points import Point
from radt.runmodel import (
    DEVICES_TAG,
    GPUS_TAG,
    HOST_TAG,
    IMPORTED_TAG,
    INTERVAL_TAG,
    POINTS_TAG,
    PROMETHEUS_GAP_TAG,
    PROMETHEUS_TAG,
    ROLE_TAG,
    RUN_ROLE,
    SCRIPT_END_TAG,
    SCRIPT_START_TAG,
    SLURM_JOB_TAG,
    SLURM_PREFIX,
    gpu_entries,
    node_statuses,
    node_tag,
)
from radt.settings import display_uri, tracking_uri

if TYPE_CHECKING:
    from radt.cli import OneLineParser

CHUNK = 50_000


class BadImport(UserError, ValueError):
    """A log or an option `radt import` cannot use; the message names it and the fix (nothing is imported)."""


class MissingLog(BadImport, FileNotFoundError):
    """A log path that is not a file."""


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


TOP_CLOCK = re.compile(r"^top - (\S+)")


def check_timestamps(path: Path, fmt: str) -> None:
    """Every timestamp of a log reads as a moment (nvidia-smi's timestamp column, top's clock); else ValueError naming the file and line.

    A timestamp that cannot be read would put its sample at a made-up time, so nothing is imported."""
    lines = _lines(path)
    if fmt == "nvidia-smi":
        header: list[str] | None = None
        for number, line in enumerate(lines, start=1):
            cells = [c.strip() for c in line.split(",")]
            if not line.strip():
                continue
            if header is None:
                header = [c.split("[")[0].strip() for c in cells]
                if "timestamp" not in header:
                    return
                column = header.index("timestamp")
                continue
            if len(cells) != len(header) or cells[column] == "timestamp":
                continue  # not a sample line (the parser skips it too), or the header repeated
            stamp = _smi_timestamp(cells[column])
            if stamp is None or stamp < 0:
                raise BadImport(
                    f"{path}:{number}: timestamp '{cells[column][:40]}' is not a time as nvidia-smi writes it (2023/02/21 15:16:55.262); "
                    "fix or delete the line; nothing imported"
                )
    elif fmt == "top":
        for number, line in enumerate(lines, start=1):
            clock = TOP_CLOCK.match(line)
            if clock is None:
                continue
            parts = clock.group(1).split(":")
            ok = len(parts) == 3 and all(p.isdigit() for p in parts) and int(parts[0]) < 24 and int(parts[1]) < 60 and int(parts[2]) < 60
            if not ok:
                raise BadImport(
                    f"{path}:{number}: top's clock '{clock.group(1)[:40]}' is not a time of day (15:16:05); fix or delete the line; nothing imported"
                )


def read_log(
    path: Path, fmt: str, gpus: int | None = None, process: str | None = "python", left_out: list[int] | None = None
) -> list[tuple[int, float | None, dict[str, float]]]:
    """(sample number, epoch seconds or None, {key: value}) for each sample of one log; `left_out` receives the numbers
    of the dmon or nvidia-smi lines that could not be read whole."""
    samples: dict[int, tuple[float | None, dict[str, float]]] = {}
    if fmt == "dcgmi":
        energy = EnergyBaseline()
        for row in parse_dcgmi_dmon(_lines(path), left_out):
            samples.setdefault(row.sample, (None, {}))[1].update(dmon_metrics(row, energy))
    elif fmt == "nvidia-smi":
        for row in parse_nvidia_smi_csv(_lines(path), gpu_count=gpus, left_out=left_out):
            ts, values = samples.setdefault(row.sample, (row.timestamp, {}))
            values.update(smi_metrics(row))
    elif fmt == "top":
        for index, frame in enumerate(parse_top_batch(_lines(path))):
            samples[index] = (frame.clock, top_metrics(frame, process))  # clock placed on a date later
    return [(n, ts, values) for n, (ts, values) in sorted(samples.items())]


def smi_identities(path: Path, gpus: int | None = None) -> list[dict]:
    """Which physical GPU each index of an nvidia-smi log is (name, UUID, PCI bus id where the log has them), for the radt.gpus tag."""
    found: dict[int, dict] = {}
    for row in parse_nvidia_smi_csv(_lines(path), gpu_count=gpus):
        if row.gpu in found:
            continue
        text = row.text
        found[row.gpu] = {
            "series": f"gpu_{row.gpu}",
            "index": row.gpu,
            "name": text.get("name") or text.get("gpu_name"),
            "uuid": text.get("uuid") or text.get("gpu_uuid"),
            "pci_bus_id": text.get("pci.bus_id") or text.get("gpu_bus_id"),
        }
    return [found[i] for i in sorted(found)]


def _place_clock(samples, day: date):
    """top prints only the time of day: put it on `day`, rolling over midnight."""
    placed, offset, last = [], 0, None
    for n, clock, values in samples:
        moment = datetime.combine(day, clock) + timedelta(days=offset)
        if last is not None and moment < last:
            offset += 1
            moment += timedelta(days=1)
        last = moment
        placed.append((n, moment.timestamp(), values))
    return placed


def _shown(moment: float) -> str:
    return datetime.fromtimestamp(moment).strftime("%Y-%m-%d %H:%M:%S")


def _clock_by_mtime(path: Path, samples, notes: list[str] | None):
    """top's clock with no --start and no timestamped log beside it: the days that end the log by the file's modification
    time (a log is written before it is last modified), and the line that says so and names --start."""
    mtime = path.stat().st_mtime
    day = datetime.fromtimestamp(mtime).date()
    placed = _place_clock(samples, day)
    if placed and placed[-1][1] > mtime + 1:  # past midnight into the next day: the log began the day before (or earlier)
        placed = _place_clock(samples, day - timedelta(days=math.ceil((placed[-1][1] - mtime - 1) / 86_400)))
    if placed and notes is not None:
        first = datetime.fromtimestamp(placed[0][1]).strftime("%Y-%m-%dT%H:%M:%S")
        notes.append(
            f"{path.name}: top's clock has no date; dated {_shown(placed[0][1])} to {_shown(placed[-1][1])}, to end by the file's modification "
            f"time {_shown(mtime)}; if it was recorded on another day, give --start with that day, e.g. --start {first}"
        )
    return placed


def _untimed_by_mtime_note(path: Path, samples: int, interval: float) -> str:
    """The line for a log without timestamps laid out to end at its file's modification time."""
    mtime = path.stat().st_mtime
    first = datetime.fromtimestamp(mtime - interval * max(0, samples - 1)).strftime("%Y-%m-%dT%H:%M:%S")
    return (
        f"{path.name} has no timestamps; its {samples} samples, {interval:g} s apart, were placed to end at the file's modification time "
        f"{_shown(mtime)}; if it was recorded at another time, give --start with its first sample's date and time, e.g. --start {first}"
    )


def _owners(logs) -> tuple[dict[str, int], list[str]]:
    """Which log writes each key, so a run holds one series per key.

    Two tools can measure the same thing (dcgmi's GPUTL and nvidia-smi's utilization.gpu are both
    system/gpu_<i>_utilization_percentage): a log with its own timestamps wins (nvidia-smi with a
    timestamp column, top), then the one named first. Returns {key: log index} and one note per
    log that lost keys.
    """

    def untimed(i: int) -> bool:
        return all(ts is None for _, ts, _ in logs[i][2])

    order = sorted(range(len(logs)), key=lambda i: (untimed(i), i))
    owner: dict[str, int] = {}
    notes = []
    for i in order:
        path, fmt, samples = logs[i]
        keys = sorted({k for _, _, values in samples for k in values})
        taken = [k for k in keys if k in owner]
        for k in keys:
            owner.setdefault(k, i)
        if taken:
            winners = ", ".join(sorted({logs[owner[k]][0].name for k in taken}))
            shown = ", ".join(taken[:3]) + (", ..." if len(taken) > 3 else "")
            notes.append(f"{len(taken)} series of {path.name} ({shown}) also in {winners}; kept those of {winners}")
    return owner, notes


def left_out_note(path: Path, numbers: list[int]) -> str:
    """The lines of a log that were not imported, by number: a cut last line, or an error the tool printed between samples."""
    shown = ", ".join(map(str, numbers[:5])) + (f" and {len(numbers) - 5} more" if len(numbers) > 5 else "")
    lines = "line" if len(numbers) == 1 else f"{len(numbers)} lines"
    return f"{path.name}: {lines} {shown} left out: not as many cells as the log's header names (a line cut while written, or a message between samples)"


def build_points(
    paths: list[Path], interval: float, gpus: int | None, process: str | None, start: float | None, notes: list[str] | None = None
) -> tuple[list[Point], dict[str, str]]:
    """The points of all logs; `notes` (if given) receives a line for each key that two logs share and for each log's lines left out."""
    logs = []
    formats = {}
    for path in paths:
        if path.is_dir():
            raise MissingLog(f"'{path}' is a folder; give the dcgmi dmon, nvidia-smi CSV or top -b logs in it, e.g. {path}/*.csv")
        if not path.is_file():
            raise MissingLog(f"'{path}' not found; give paths to dcgmi dmon, nvidia-smi CSV or top -b logs")
        with open(path, encoding="utf-8", errors="replace") as f:
            fmt = detect_format(f.read(4096))
        if fmt is None:
            raise BadImport(f"'{path}' is not a dcgmi dmon, nvidia-smi --format=csv or top -b log; nothing imported")
        formats[path.name] = fmt
        check_timestamps(path, fmt)
        left_out: list[int] = []
        logs.append((path, fmt, read_log(path, fmt, gpus, process, left_out)))
        if left_out and notes is not None:
            notes.append(left_out_note(path, left_out))
    stamped = [ts for _, fmt, samples in logs if fmt == "nvidia-smi" for _, ts, _ in samples[:1] if ts is not None]
    anchor = start if start is not None else (min(stamped) if stamped else None)
    owner, shared = _owners(logs)
    if notes is not None:
        notes.extend(shared)
    points: list[Point] = []
    for index, (path, fmt, samples) in enumerate(logs):
        if fmt == "top":
            samples = _place_clock(samples, datetime.fromtimestamp(anchor).date()) if anchor else _clock_by_mtime(path, samples, notes)
        elif anchor is None and notes is not None and samples and samples[0][1] is None:
            notes.append(_untimed_by_mtime_note(path, len(samples), interval))
        base = anchor if anchor is not None else path.stat().st_mtime - interval * max(0, len(samples) - 1)
        for n, ts, values in samples:
            moment = ts if ts is not None else base + n * interval
            stamp = int(round(moment * 1000))
            points.extend(Point(k, v, stamp, n) for k, v in values.items() if owner[k] == index)
    return points, formats


def _run_gpus(tags: dict[str, str], given: str | None, node: str | None = None) -> tuple[list[int] | None, list[tuple[int, int]], dict[str, int]]:
    """(GPU indices or None for all, MIG slices, UUID -> index) from the radt.gpus tag (a node's own), else --gpus 0+1:3, else all."""
    entries = [e for e in gpu_entries(tags, node) if isinstance(e.get("index"), int)]
    if entries:
        gpus = sorted({e["index"] for e in entries})
        slices = [(e["index"], e["gpu_instance"]) for e in entries if isinstance(e.get("gpu_instance"), int)]
        return gpus, slices, {e["uuid"]: e["index"] for e in entries if e.get("uuid")}
    if given:
        return (*parse_gpus(given), {})
    return None, [], {}


def parse_gpus(given: str) -> tuple[list[int], list[tuple[int, int]]]:
    """'0+1:3' -> GPUs [0, 1] and GPU 1's MIG slice with GPU instance id 3 (dcgm-exporter's GPU_I_ID); ValueError names the fix."""
    gpus: set[int] = set()
    slices: list[tuple[int, int]] = []
    for part in (p.strip() for p in given.replace(",", "+").split("+")):
        gpu, _, gi = part.partition(":")
        if not gpu.isdigit() or (gi and not gi.isdigit()) or (_ and not gi):
            raise BadImport(f"--gpus '{given}' is not a list of GPU indices; give e.g. --gpus 0+1, or 1:3 for GPU 1's MIG slice GPU_I_ID 3")
        gpus.add(int(gpu))
        if gi:
            slices.append((int(gpu), int(gi)))
    return sorted(gpus), slices


def _unmapped(tags: dict[str, str], node: str | None) -> tuple[list[int] | None, tuple[str, ...]]:
    """A radt run without a radt.gpus tag (no NVML where it ran): the GPUs of its radt.devices tag (-d, else its
    CUDA_VISIBLE_DEVICES) and the GPU-/MIG- UUIDs among them, which only the exporter's labels place; (None, ()) for every GPU."""
    devices = tags.get(DEVICES_TAG, "") if node is None else ""
    tokens = [t.strip() for t in devices.replace(",", "+").split("+") if t.strip()]
    if not tokens or not all(t.isdigit() or t.upper().startswith(("GPU-", "MIG-")) for t in tokens):
        return None, ()  # "all", "imported", a plain MLflow run
    return sorted({int(t) for t in tokens if t.isdigit()}), tuple(t for t in tokens if not t.isdigit())


def _job_labels(tags: dict[str, str], node: str | None) -> dict[str, str]:
    """The exporter labels naming the run's Slurm job (its radt.slurm.job_id tag; an array task's own id, radt.slurm.raw_id,
    which its prolog gave the exporters as SLURM_JOB_ID): another job's series are never the run's."""
    from radt.collectors.sources.promql import JOB_LABELS

    job = tags.get(f"{SLURM_PREFIX}raw_id", "").strip() or tags.get(node_tag(node, "slurm_job_id") if node else SLURM_JOB_TAG, "").strip()
    return dict.fromkeys(JOB_LABELS, job) if job else {}


class Part(NamedTuple):
    """One host's share of a run to read from Prometheus: the node's id (None: a run of one host), its host, GPUs and time;
    the devices only labels place, the run's Slurm job labels, GPUs whose every MIG slice is the run's (see promql.Wanted)."""

    node: str | None
    host: str
    gpus: list[int] | None
    slices: list[tuple[int, int]]
    uuids: dict[str, int]
    start_ms: int
    end_ms: int
    given: tuple[str, ...] = ()
    owners: dict[str, str] = {}
    mig_gpus: tuple[int, ...] = ()


def _mine(part: Part, tags: dict[str, str], gpus: str | None) -> Part:
    """`part` with what says which series are the run's beyond its GPU indices: --gpus 0 takes GPU 0's MIG slices (a
    GPU in MIG mode is its slices), a run without radt.gpus its radt.devices, the run's Slurm job its own labels."""
    owners = _job_labels(tags, part.node)
    if gpus:
        whole = tuple(g for g in part.gpus or [] if all(gpu != g for gpu, _ in part.slices))
        return part._replace(owners=owners, mig_gpus=whole)
    if part.gpus is None:
        indices, given = _unmapped(tags, part.node)
        return part._replace(gpus=indices, given=given, owners=owners)
    return part._replace(owners=owners)


def run_parts(run, host: str | None, gpus: str | None) -> list[Part]:
    """A run's parts: each node of a multi-node run (its host, GPUs and script times from its radt.node.<node>/ tags), else the run."""
    tags = dict(run.data.tags)
    start_ms = int(run.info.start_time)
    end_ms = int(run.info.end_time) if run.info.end_time and run.info.status != "RUNNING" else int(time.time() * 1000)
    nodes = sorted(node_statuses(tags))
    if not nodes:
        found = tags.get(HOST_TAG) or host
        if not found:
            raise BadImport(f"run {run.info.run_id} does not say its host (no {HOST_TAG} tag); give --host NODE, the exporter's Hostname")
        script = tags.get(SCRIPT_START_TAG, ""), tags.get(SCRIPT_END_TAG, "")
        if script[0].isdigit() and script[1].isdigit():  # radt's run: the script's time, as its prometheus listener read
            start_ms, end_ms = int(script[0]), int(script[1])
        option = None if any(isinstance(e.get("index"), int) for e in gpu_entries(tags)) else gpus  # the tag wins, as in _run_gpus
        return [_mine(Part(None, found, *_run_gpus(tags, gpus), start_ms, end_ms), tags, option)]
    if host or gpus:
        raise BadImport(f"run {run.info.run_id} ran on nodes {', '.join(nodes)}, each tagged with its host and GPUs; drop --host and --gpus")
    parts = []
    for node in nodes:
        own = tags.get(node_tag(node, "script_start_ms"), ""), tags.get(node_tag(node, "script_end_ms"), "")
        span = (int(own[0]), int(own[1])) if own[0].isdigit() and own[1].isdigit() else (start_ms, end_ms)
        part = Part(node, tags.get(node_tag(node, HOST_TAG.removeprefix("radt."))) or node, *_run_gpus(tags, None, node), *span)
        parts.append(_mine(part, tags, None))
    return parts


def _existing(client, run_id: str, keys: set[str]) -> set[tuple[str, int]]:
    """(key, timestamp) of the run's points under `keys`, so a second import adds nothing."""
    engine = getattr(client, "engine", None)
    if engine is not None:  # radt's SQL client: one query
        import sqlalchemy as sa

        from radt import mlflowdb as db

        found: set[tuple[str, int]] = set()
        with engine.connect() as conn:
            for chunk in (sorted(keys)[i : i + 500] for i in range(0, len(keys), 500)):
                query = sa.select(db.metrics.c.key, db.metrics.c.timestamp).where(db.metrics.c.run_uuid == run_id, db.metrics.c.key.in_(chunk))
                found.update((k, int(t)) for k, t in conn.execute(query))
        return found
    return {(k, m.timestamp) for k in keys for m in client.get_metric_history(run_id, k)}


def _missing(points: list[Point], part: Part, url: str, labels: tuple[str, ...], exporter: str = "dcgm-exporter") -> str | None:
    """One line when the part's host or one of its GPUs has no series in Prometheus over the run; it names the exporter
    looked for (the one read, else those Prometheus holds), the node labels tried (the one that matched, where one did)
    and the host looked for."""
    from radt.catalogue import resolve
    from radt.collectors.sources.promql import looked_for

    where = looked_for(part.host, labels) + (f" (node {part.node})" if part.node else "")
    points = [p for p in points if resolve(p.key).gpu is not None]  # the job's own CPU and memory (--job-series) say no GPU
    if not points:
        which = "any GPU" if part.gpus is None else "GPU " + ", ".join(map(str, part.gpus))
        if part.mig_gpus:
            which += " or the MIG slices of GPU " + ", ".join(map(str, part.mig_gpus))
        if part.given:
            which = " or ".join([*([which] if part.gpus else []), f"{', '.join(part.given)} (no label proves a series is it)"])
        return f"no {exporter} series for {which} of {where} at {url} over the run"
    places = {(resolve(p.key).gpu, resolve(p.key).mig) for p in points}
    lost = [f"GPU {g}" for g in sorted(set(part.gpus or []) - {gpu for gpu, _ in places})]
    lost += [f"GPU {gpu} MIG slice {gi} (GPU_I_ID={gi})" for gpu, gi in part.slices if (gpu, gi) not in places]
    return f"no {exporter} series for {', '.join(lost)} of {where} at {url} over the run" if lost else None


def _diagnose(client, run_id: str) -> None:
    """An imported run's diagnosis, kept on it and said in one line."""
    from radt.collectors.diagnose.stored import diagnose_ended, said

    line = said(run_id, diagnose_ended(client, run_id))
    if line:
        print(f"radt import: {line}", file=sys.stderr)


def prometheus_main(argv: list[str]) -> int:
    """`radt import --prometheus URL --run RUN_ID`: a finished (or running) run's GPU series from the cluster's Prometheus.

    Each node of a multi-node run is read for its own host and GPUs into its system/<node>/ keys; a point already in
    the run is not added again, and a gap tag an earlier import left goes once the series are all there."""
    from radt.collectors.sources.prometheus import Backfill, Looked, backfill
    from radt.collectors.sources.promql import POD_LABELS, PromError, check_url, host_labels
    from radt.collectors.store.nodes import node_key
    from radt.settings import POD_NAME, PROMETHEUS_HOST_LABEL

    parser = _prometheus_parser()
    args = parser.parse_args(argv)
    try:
        url = check_url(args.prometheus)
        labels = host_labels(args.host_label if args.host_label is not None else PROMETHEUS_HOST_LABEL.get(), "--host-label")
    except ValueError as exc:
        parser.error(str(exc))
    if args.pod is not None and not POD_NAME.fullmatch(args.pod):
        parser.error(f"--pod {args.pod!r} is not a Kubernetes pod's name; give the run's pod as dcgm-exporter labels it, e.g. --pod train-7f9c-x2x4z")
    uri = tracking_uri(args.store)
    client = connect(uri)
    try:
        run = client.get_run(args.run)
    except Exception:
        raise BadImport(f"run '{args.run}' not found in {display_uri(uri)}; give a run id of that store (or --store)") from None
    parts = run_parts(run, args.host, args.gpus)
    if args.pod:  # dcgm-exporter's per-pod series of a time-shared GPU: that pod's own are the run's share
        parts = [part._replace(owners=part.owners | dict.fromkeys(POD_LABELS, args.pod)) for part in parts]
    try:
        step_s = float(run.data.tags.get(INTERVAL_TAG) or 1.0)
    except ValueError:
        step_s = 1.0
    points: list[Point] = []
    gaps: dict[str | None, str] = {}
    for part in parts:
        matched: list[str] = []
        looked = Looked()
        try:
            job = Backfill(url, part.host, part.gpus, part.start_ms, part.end_ms, step_s if step_s > 0 else 1.0,
                           slices=part.slices, uuids=part.uuids, host_label=labels,
                           given=part.given, owners=part.owners, mig_gpus=part.mig_gpus, job_series=args.job_series)  # fmt: skip
            found = backfill(job, matched=matched, looked=looked)
        except PromError as exc:
            set_tags(client, args.run, {PROMETHEUS_GAP_TAG: str(exc)})
            print(f"radt import: {exc}; check --prometheus and that the server runs, then import again", file=sys.stderr)
            return 1
        gap = _missing(found, part, url, tuple(matched) or tuple(looked.labels) or labels, looked.exporter)
        if gap:
            gaps[part.node] = gap
            print(f"radt import: {gap}", file=sys.stderr)
        points += [p._replace(key=node_key(p.key, part.node)) for p in found] if part.node else found
    have = _existing(client, args.run, {p.key for p in points})
    new = [p for p in points if (p.key, p.timestamp) not in have]
    _write(uri, args.run, new)
    tags, stale = _gap_tags(parts, gaps)
    set_tags(client, args.run, {PROMETHEUS_TAG: f"{url} {len(points)} points"} | tags)
    for key in sorted(stale & set(run.data.tags)):  # an earlier import's (or the run's own) gap, now filled
        client.delete_tag(args.run, key)
    if not args.no_diagnosis:  # `radt import --slurm` diagnoses its jobs together, to pair them for could_share
        _diagnose(client, args.run)
    keys = len({p.key for p in points})
    print(f"radt import: run {args.run}: {len(new)} new points ({len(points) - len(new)} already there), {keys} series from {url}", file=sys.stderr)
    print(args.run)
    return 0


def batch_fill(client, uri: str, url: str):
    """`radt import --slurm-since`'s reader of many jobs' series a node's window at a time (batchfill.BatchFill), with
    this module's way of naming a run's parts, finding what is missing and what is stored."""
    from radt.collectors.imports.batchfill import Backfilled, BatchFill

    return BatchFill(client, uri, url, Backfilled(run_parts, _missing, _existing))


def main(argv: list[str]) -> int:
    if any(a in ("--slurm", "--slurm-since") or a.startswith(("--slurm=", "--slurm-since=")) for a in argv):
        from radt.collectors.cluster.slurmimport import main as slurm_main

        return slurm_main(argv, fill=prometheus_main, batch=batch_fill)
    if any(a == "--prometheus" or a.startswith("--prometheus=") for a in argv):
        return prometheus_main(argv)
    parser = _logs_parser()
    args = parser.parse_args(argv)
    start = _checked_start(parser, args)
    notes: list[str] = []
    points, formats = build_points(args.files, args.interval, args.gpus, args.process, start, notes)
    for note in notes:
        print(f"radt import: {note}", file=sys.stderr)
    if not points:
        raise BadImport("the files hold no samples; nothing imported")
    uri = tracking_uri(args.store)
    client = connect(uri)
    experiment_id = resolve_experiment(client, uri, args.experiment)
    first, last = min(p.timestamp for p in points), max(p.timestamp for p in points)
    run_id, _ = create_run(
        client,
        experiment_id,
        NewRun(
            command=["radt", "import", *map(str, args.files)],
            script=str(args.files[0]),
            script_args=[],
            run_name=args.name or args.files[0].stem,
            workload=None,
            letter="A",
            devices="imported",
            collocation=SHARED.cell,
            listeners=sorted(set(formats.values())),
            settings={IMPORTED_TAG: ",".join(f"{name}:{fmt}" for name, fmt in formats.items())},
            start_time=first,
        ),
    )
    _write(uri, run_id, points)
    for path in args.files:
        client.log_artifact(run_id, str(path), artifact_path="imported")
    tags = {POINTS_TAG: str(len(points)), ROLE_TAG: RUN_ROLE}
    identities = [entry for path in args.files if formats[path.name] == "nvidia-smi" for entry in smi_identities(path, args.gpus)]
    if identities:
        tags[GPUS_TAG] = json.dumps(list({e["series"]: e for e in reversed(identities)}.values())[::-1])
    set_tags(client, run_id, tags)
    client.set_terminated(run_id, status="FINISHED", end_time=last)
    keys = len({p.key for p in points})
    print(f"radt import: run {run_id}: {len(points)} points, {keys} series from {', '.join(f'{n} ({f})' for n, f in formats.items())}", file=sys.stderr)
    _diagnose(client, run_id)
    print(run_id)
    return 0


def _prometheus_parser() -> OneLineParser:
    """`radt import --prometheus URL --run RUN_ID`'s options."""
    from radt.cli import OneLineParser

    parser = OneLineParser(parents=[store_parent()], prog="radt import", description="Fill a run with its GPUs' dcgm-exporter series from Prometheus.")
    parser.add_argument("--prometheus", required=True, help="Prometheus server URL, e.g. http://prometheus:9090")
    parser.add_argument("--run", required=True, help="the run's id")
    parser.add_argument("--host", help="the node the run ran on (its exporter's Hostname or hostname), where the run has no radt.host tag")
    parser.add_argument(
        "--gpus", help="GPU indices, e.g. 0+1 (1:3 for GPU 1's MIG slice GPU_I_ID 3), where the run has no radt.gpus tag (default: every GPU of the host)"
    )
    parser.add_argument(
        "--host-label",
        help="the exporter's node label, or several joined with ',' tried in turn (default RADT_PROMETHEUS_HOST_LABEL, else Hostname,hostname; "
        "instance: the scrape target)",
    )
    parser.add_argument(
        "--pod",
        help="the Kubernetes pod the run ran in: where dcgm-exporter splits a time-shared GPU per pod, that pod's own GPU "
        "utilization and memory become the run's share (run_sm_utilization_percentage, process_memory_megabytes)",
    )
    parser.add_argument("--no-diagnosis", action="store_true", help=argparse.SUPPRESS)  # `radt import --slurm` diagnoses its jobs together
    # `radt import --slurm`: the job's own CPU and memory from its cgroup too (jobstats' cgroup exporter), in a run radt did not record
    parser.add_argument("--job-series", action="store_true", help=argparse.SUPPRESS)
    return parser


def _gap_tags(parts: list[Part], gaps: dict[str | None, str]) -> tuple[dict[str, str], set[str]]:
    """The gap tags of an import from Prometheus (each node's own and the run's, joined) and the gap tags an earlier
    import left that this one filled (to delete where the run has them)."""
    from radt.collectors.store.nodes import node_scoped

    tags: dict[str, str] = {}
    for part in parts:
        if part.node and part.node in gaps:
            tags |= node_scoped({PROMETHEUS_GAP_TAG: gaps[part.node]}, part.node)
    if gaps:
        tags[PROMETHEUS_GAP_TAG] = "; ".join(f"{node}: {gap}" if node else gap for node, gap in gaps.items())
    stale = {PROMETHEUS_GAP_TAG} if not gaps else set()
    stale |= {node_tag(part.node, PROMETHEUS_GAP_TAG.removeprefix("radt.")) for part in parts if part.node and part.node not in gaps}
    return tags, stale


def _logs_parser() -> OneLineParser:
    """`radt import FILE...`'s options (mistakes in one line, like the rest of radt)."""
    from radt.cli import OneLineParser

    parser = OneLineParser(
        parents=[store_parent()],
        prog="radt import",
        description="Import raw dcgmi dmon / nvidia-smi CSV / top -b logs as one run. "
        "Also: radt import --prometheus URL --run RUN_ID (a run's GPU series from Prometheus); "
        "radt import --slurm JOBID[,...] or --slurm-since 1d (a run per Slurm job, see radt import --slurm 0 --help).",
    )
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("-e", "--experiment", help="experiment name or id (created if new)")
    parser.add_argument("-n", "--name", help="run name (default: the first file's name)")
    parser.add_argument(
        "--interval", type=float, default=settings.INTERVAL.get(), help="seconds between samples for logs without timestamps (default RADT_INTERVAL, 1)"
    )
    parser.add_argument("--start", help="ISO time of the first sample for logs without timestamps")
    parser.add_argument("--gpus", type=int, help="GPUs per sample in an nvidia-smi log without an index column")
    parser.add_argument("--process", default="python", help="top: the command whose lines are the run's (default python)")
    return parser


def _checked_start(parser: OneLineParser, args: argparse.Namespace) -> float | None:
    """The names, interval and GPU count checked (a mistake ends in one line); the ISO --start as epoch seconds."""
    for kind, value, label in (("experiment", args.experiment, "-e"), ("run", args.name, "-n")):
        try:
            check_name(kind, value, label)
        except UsageError as exc:
            parser.error(str(exc))
    if not math.isfinite(args.interval):
        parser.error(f"--interval {args.interval} is not a finite number of seconds; give e.g. --interval 1")
    if not args.interval > 0:
        parser.error(f"--interval {args.interval} must be more than 0 seconds")
    if args.gpus is not None and args.gpus < 1:
        parser.error(f"--gpus {args.gpus} must be 1 or more: the GPUs of each sample in the nvidia-smi log")
    try:
        return datetime.fromisoformat(args.start).timestamp() if args.start else None
    except ValueError:
        parser.error(f"--start '{args.start}' is not an ISO time; give e.g. --start 2023-02-21T15:16:55")


def _write(uri: str, run_id: str, points: list[Point]) -> None:
    """Points into a run, CHUNK at a time."""
    store = open_metric_store(uri)
    for offset in range(0, len(points), CHUNK):
        store.write(run_id, points[offset : offset + CHUNK])
    store.close()
