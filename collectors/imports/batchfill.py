"""`radt import --slurm-since`'s GPU series read per node and time window instead of per job.

The jobs of one node whose spans fall in one window (WINDOW_S) share one read of the node's raw samples (the query
`radt import --prometheus` sends per job, over the whole window) and one question whether any exporter labelled their
GPUs with them; each job's run gets the window's samples within its own span, split by its GPUs and job labels exactly as
the per-job backfill splits its own answer (the same series, cut to the same span, through the same keyed_samples). A job
the window cannot serve in full (no points under the first label, a GPU missing, a job on several nodes, its cgroup's
series, a run with its own interval) is left to the per-job backfill, which says what is missing and leaves its gap tag.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import NamedTuple

from radt.catalogue import EXPORTER_METRICS
from radt.collectors.slurm.slurmacct import Job
from radt.collectors.sources.exporters import GPU_FAMILIES, LABELLED_BY, exporter_word
from radt.collectors.sources.promql import (
    PromError,
    Series,
    Wanted,
    duration,
    host_matcher,
    keyed_samples,
    query,
    selector,
    series_key,
    string_literal,
)
from radt.collectors.store.stores import open_metric_store
from radt.collectors.store.tracking import set_tags
from radt.points import Point
from radt.runmodel import INTERVAL_TAG, PROMETHEUS_GAP_TAG, PROMETHEUS_TAG

WINDOW_S = 900  # the longest window one read serves: its raw samples are held until its last job is written
CHUNK_S = 3600  # the per-job backfill's chunk (promql.CHUNK_S): a window is read in one query


class Window:
    """One node's jobs whose spans lie in [start_ms, end_ms]: its raw samples per node label (read once, dropped once its
    last job is written), and whether any exporter labelled a GPU with one of its jobs (None: not asked yet)."""

    def __init__(self, node: str, job: Job) -> None:
        self.node, self.start_ms, self.end_ms = node, job.start_ms, job.end_ms
        self.jobs: list[Job] = [job]
        self.left = 1
        self.series: dict[str, list[Series]] = {}
        self.labelled: bool | None = None

    def takes(self, job: Job) -> bool:
        """Whether the job fits in the window without stretching it past WINDOW_S."""
        return max(self.end_ms, job.end_ms) - self.start_ms <= WINDOW_S * 1000  # type: ignore[operator]

    def add(self, job: Job) -> None:
        self.jobs.append(job)
        self.end_ms = max(self.end_ms, job.end_ms)  # type: ignore[type-var]
        self.left += 1


class Backfilled(NamedTuple):
    """What `radt import --prometheus` (importer.py) names a run's parts, finds missing and finds stored by, passed in by
    importer.batch_fill (importer imports this module, not the other way round)."""

    run_parts: Callable
    missing: Callable
    existing: Callable


def _batched(job: Job) -> bool:
    """Whether the job can be served by a window: ended, on one node, with its GPUs known."""
    return job.start_ms is not None and job.end_ms is not None and job.status != "RUNNING" and len(job.nodes) == 1


class BatchFill:
    """The series of many jobs, a node's window at a time; `radt import --slurm`'s JobImporter asks it before the per-job backfill."""

    def __init__(self, client, uri: str, url: str, backfilled: Backfilled) -> None:
        self.client, self.uri, self.url, self.backfilled = client, uri, url, backfilled
        self.windows: dict[str, Window] = {}  # job id -> its window
        self.queries = 0
        self._store = None
        self._pending: dict[str, tuple[list[Point], int, bool]] = {}  # run id -> (its new points, all it was given, a gap tag to drop)
        self._queued = 0  # points in _pending

    def plan(self, jobs: list[Job]) -> None:
        """Each batchable job's window: per node, by start, a window grown while it stays within WINDOW_S."""
        by_node: dict[str, list[Job]] = {}
        for job in filter(_batched, jobs):
            by_node.setdefault(job.nodes[0], []).append(job)
        for node, mine in by_node.items():
            window = None
            for job in sorted(mine, key=lambda j: (j.start_ms, j.end_ms)):
                if window is not None and window.takes(job):
                    window.add(job)
                else:
                    window = Window(node, job)
                self.windows[job.job_id] = window

    def nothing_labelled(self, job: Job, labels: tuple[str, ...]) -> bool:
        """Whether no exporter series of the job's node labels a GPU with any job of its window over the window (then none
        with this job over its own span: exporters.labelled_gpus would find nothing). One query per node label a window."""
        window = self.windows.get(job.job_id)
        if window is None:
            return False
        if window.labelled is None:
            ids = dict.fromkeys(i for j in window.jobs for i in (j.job_id, j.raw_id) if i)
            wanted = string_literal("|".join(re.escape(i) for i in ids))
            span = duration(window.start_ms, window.end_ms)
            try:
                window.labelled = any(self._labelled(window, label, wanted, span) for label in labels)
            except PromError:
                window.labelled = True  # each job asks on its own, and meets it there
        return not window.labelled

    def _labelled(self, window: Window, label: str, wanted: str, span: str) -> bool:
        where = host_matcher(window.node, label)
        parts = [
            f"count(count_over_time({metric}{{{where}, {job}=~{wanted}}}[{span}]))" for entry in LABELLED_BY for job in entry.labels for metric in entry.metrics
        ]
        self.queries += 1
        return bool(query(self.url, " or ".join(parts), at=window.end_ms / 1000))

    def fill(self, run_id: str, created: bool, tags: dict[str, str], job: Job, labels: tuple[str, ...]) -> bool:
        """The job's GPU series from its window into its run, as `radt import --prometheus --run` would write them; False
        where the window cannot serve it in full (the per-job backfill then reads it)."""
        window = self.windows.get(job.job_id)
        if window is None or INTERVAL_TAG in tags or not (job.gpus or {}).get(job.nodes[0]):
            return False
        view = SimpleNamespace(
            info=SimpleNamespace(run_id=run_id, start_time=job.start_ms, end_time=job.end_ms, status=job.status), data=SimpleNamespace(tags=tags)
        )
        part = self.backfilled.run_parts(view, None, "+".join(map(str, job.gpus[job.nodes[0]])))[0]  # type: ignore[index]
        if part.start_ms < window.start_ms or part.end_ms > window.end_ms:
            return False
        wanted = Wanted(part.gpus, list(part.slices), part.uuids, tuple(part.given), part.owners, tuple(part.mig_gpus))
        try:
            for label in labels:
                points, names = self._cut(window, label, wanted, part.start_ms, part.end_ms)
                if points:
                    break
            else:
                return False
        except PromError:
            return False
        exporters = [f.name for f in GPU_FAMILIES if names & set(f.metrics)]
        one_a_key = list({p.key: p for p in points}.values())  # _missing looks at the keys only: one point each says the same
        if self.backfilled.missing(one_a_key, part, self.url, (label,), exporter_word(exporters)):
            return False  # the per-job backfill says what is missing, and leaves its gap tag
        self._write(run_id, created, points, tags)
        return True

    def _cut(self, window: Window, label: str, wanted: Wanted, start_ms: int, end_ms: int) -> tuple[list[Point], set[str]]:
        """The window's samples within [start_ms, end_ms] named as the per-job read names them (prometheus._read)."""
        if label not in window.series:
            window.series[label] = self._read(window, label)
        whole = []
        for found in window.series[label]:
            samples = [s for s in found.samples if start_ms <= s[0] <= end_ms]
            if samples:
                whole.append(Series(found.labels, samples))
        points: dict[tuple[str, int], Point] = {}
        for where, samples in keyed_samples(whole, wanted, None).items():
            for stamp, value in samples:
                if start_ms <= stamp <= end_ms:
                    points[(where, stamp)] = Point(where, value, stamp, round((stamp - start_ms) / 1000))
        names = {s.labels.get("__name__", "") for s in whole if series_key(s.labels, wanted) is not None} if points else set()
        return sorted(points.values(), key=lambda p: (p.timestamp, p.key)), names

    def _read(self, window: Window, label: str) -> list[Series]:
        """The node's raw samples over the window, CHUNK_S at a time, joined per series (as prometheus._read)."""
        sel = selector(window.node, label, EXPORTER_METRICS)
        joined: dict[tuple[tuple[str, str], ...], Series] = {}
        chunk_end = window.end_ms
        while chunk_end >= window.start_ms:
            span_ms = min(CHUNK_S * 1000, chunk_end - window.start_ms + 1)
            self.queries += 1
            for found in query(self.url, f"{sel}[{span_ms}ms]", at=chunk_end / 1000):
                joined.setdefault(tuple(sorted(found.labels.items())), Series(found.labels, [])).samples.extend(found.samples)
            chunk_end -= span_ms
        return [Series(s.labels, sorted(s.samples)) for s in joined.values()]

    def _write(self, run_id: str, created: bool, points: list[Point], tags: dict[str, str]) -> None:
        """The points the run lacks, queued to go in with other runs' (flush), and the tags `radt import --prometheus`
        leaves (its count; no gap), set only once its points are stored."""
        have = set() if created else self.backfilled.existing(self.client, run_id, {p.key for p in points})
        new = [p for p in points if (p.key, p.timestamp) not in have]
        self._pending[run_id] = (new, len(points), PROMETHEUS_GAP_TAG in tags)
        self._queued += len(new)
        if self._store is None:
            self._store = open_metric_store(self.uri)
        if self._queued >= self._store.batch_points:
            self.flush()

    def flush(self) -> None:
        """The queued runs' points in one store call (one transaction on a SQL store), then each run's tags: a run whose
        import stopped before its points were stored holds no count tag, and the next import reads it again."""
        pending, self._pending, self._queued = self._pending, {}, 0
        if not pending:
            return
        assert self._store is not None
        self._store.write_runs({run_id: new for run_id, (new, _n, _gap) in pending.items()})  # one transaction on a SQL store
        for run_id, (_new, count, gap) in pending.items():
            set_tags(self.client, run_id, {PROMETHEUS_TAG: f"{self.url} {count} points"})
            if gap:
                self.client.delete_tag(run_id, PROMETHEUS_GAP_TAG)

    def done(self, job: Job) -> None:
        """The job is imported: its window's samples go once its last job is."""
        window = self.windows.pop(job.job_id, None)
        if window is not None:
            window.left -= 1
            if window.left == 0:
                window.series.clear()

    def close(self) -> None:
        """The queued runs written, and the store closed."""
        self.flush()
        if self._store is not None:
            self._store.close()
            self._store = None
