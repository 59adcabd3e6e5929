"""GPU metrics the cluster's exporter already records (dcgm-exporter, jobstats' NVML exporter, radt monitor), read
back from its Prometheus server.

Where a second DCGM client is unwelcome, the node's own exporter is the source: each tick reads the
raw samples of this node's series for the run's GPUs (and MIG slices) scraped since the last tick,
at the scrapes' own timestamps, and names them with the catalogue keys radt's nvml/dcgm sources
write. Prometheus away, a query refused, a GPU's series missing: one line each, the values simply
missing; `final_backfill` reads at the run's end what was scraped after the last tick. Which exporter the
cluster runs is asked of Prometheus where the node's own labels find nothing (exporters.present).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from radt import settings
from radt.catalogue import CGROUP_EXPORTER_METRICS, DCGM_EXPORTER_METRICS, EXPORTER_METRICS, ExporterFamily, resolve
from radt.collectors.sources.base import MetricSource, Reading, SamplingContext, SourceUnavailable
from radt.collectors.sources.exporters import GPU_FAMILIES, exporter_word, node_labels, present
from radt.collectors.sources.promql import (
    CHUNK_S,
    DEFAULT_HOST_LABELS,
    INSTANCE,
    JOBID,
    STEP_LABELS,
    TIMEOUT,
    PromError,
    Series,
    Wanted,
    check_url,
    host_labels,
    keyed_samples,
    looked_for,
    owners,
    query,
    selector,
    series_key,
    string_literal,
)
from radt.points import Point

WINDOW_S = 60  # at most this many seconds of raw samples per tick: several scrapes at any usual scrape interval
MARGIN_S = 5.0  # a tick asks back to this long before the newest scrape it has (clock skew between radt's host and Prometheus)
SCRAPE_WAIT_S = 10.0  # at a run's end, the longest wait for a scrape begun before the end: Prometheus's default scrape_timeout
# after a scrape's own end (its timeout, at most the interval), the time Prometheus may take to store what the exporter
# answered: milliseconds on an idle server, over a second where the node's CPUs are busy (0.5 s lost a scrape in a full suite)
STORE_SLACK_S = 2.0
JITTER = 0.25  # a scrape may begin this share of the interval before the newest + the interval (the newest began late)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _uuids() -> dict[str, int]:
    """This machine's GPU and MIG UUIDs -> NVML index (dcgm-exporter's `UUID` label); empty without NVML."""
    try:
        from radt.collectors.sources.gpus import machine

        mach = machine()
    except Exception:  # no driver, no pynvml: the exporter's `gpu` label (also NVML's index) serves
        return {}
    found = {gpu.uuid: gpu.index for gpu in mach.gpus}
    return found | {mig.uuid: mig.gpu for mig in mach.migs}


def _mig_mode_gpus() -> list[int]:
    """NVML indices of this machine's GPUs in MIG mode, whose series are their slices'; empty without NVML."""
    try:
        from radt.collectors.sources.gpus import machine

        return [gpu.index for gpu in machine().gpus if gpu.mig_mode]
    except Exception:
        return []


class PrometheusSource(MetricSource):
    name = "prometheus"
    gives = "gpu"

    def __init__(
        self,
        url: str | None = None,
        host: str | None = None,
        host_label: str | None = None,
        report: Callable[[str], None] = _stderr,
        timeout: float = TIMEOUT,
        uuids: dict[str, int] | None = None,
    ) -> None:
        if url is None:
            from radt.settings import PROMETHEUS_URL

            url = PROMETHEUS_URL.get()
        if host_label is None:
            from radt.settings import PROMETHEUS_HOST_LABEL

            host_label = PROMETHEUS_HOST_LABEL.get()
        if not host:
            from radt.settings import host_name

            host = host_name()  # --host / RADT_HOST, else this machine's name
        self.url = url.strip().rstrip("/")
        self.host = host
        self._labels_given = host_label  # "Hostname,hostname": checked at open
        self.host_labels: tuple[str, ...] = DEFAULT_HOST_LABELS
        self.host_label = host_label.split(",")[0].strip() or DEFAULT_HOST_LABELS[0]  # the label read: the first until one matched
        self.matched = False  # a label of host_labels has named this node's series: only it is asked from then on
        self.families: tuple[ExporterFamily, ...] | None = None  # the exporters Prometheus holds, asked where no label matched
        self.report = report
        self.timeout = timeout
        self._uuids = uuids
        self.wanted = Wanted()
        self._pids: Callable[[], list] = lambda: []
        self.open_migs: list[int] = []  # the run's GPUs in MIG mode, given whole: the slices its processes use are its
        self.window = WINDOW_S
        self.interval = settings.INTERVAL.default  # the sampler's (open() sets it), for the steps of final_backfill's points
        self.selector = selector(self.host, host_label)
        self.problems: dict[str, str] = {}  # kind -> the line reported once for it
        self.read: set[str] = set()  # exporter metrics seen for the run's GPUs
        self.keys: set[str] = set()
        self._last: dict[str, int] = {}  # key -> timestamp of the newest sample already returned
        self.since_ms = 0  # scrapes before the run (open) are not its
        # key -> [first, last] scrape timestamps of stretches returned with nothing skipped between (few: one per outage
        # longer than the window), for final_backfill; a set of every timestamp would grow by 56 a second for 8 GPUs
        self.returned: dict[str, list[list[int]]] = {}
        self.scrape_ms: int | None = None  # the shortest spacing of two scrapes of one series seen: the scrape interval
        self._due_ms = 0  # no tick asks before then: no series can have a new scrape yet (at 15 s scrapes, 1 query in 15)

    def open(self, ctx: SamplingContext) -> None:
        if not self.url:
            raise SourceUnavailable("no Prometheus URL; give --prometheus http://<server>:9090 (or RADT_PROMETHEUS_URL), or drop 'prometheus' from -l")
        try:
            check_url(self.url, "RADT_PROMETHEUS_URL")
            self.host_labels = host_labels(self._labels_given)
        except ValueError as exc:
            raise SourceUnavailable(str(exc)) from None
        uuids = self._uuids if self._uuids is not None else _uuids()
        self.wanted = Wanted(ctx.devices, list(ctx.slices), uuids, tuple(ctx.given), owners(os.environ))
        self._pids = ctx.pids
        given = {gpu for gpu, _ in ctx.slices}  # a GPU the run was given a slice of: its other slices are not the run's
        machine_gpus = _mig_mode_gpus() if self._uuids is None else []  # uuids given: the caller knows the machine, NVML is not asked
        self.open_migs = [g for g in machine_gpus if ctx.devices is not None and g in ctx.devices and g not in given]
        self.window = max(WINDOW_S, int(ctx.interval * 3))
        self.interval = ctx.interval
        self.host_label = self.host_labels[0]
        self.selector = selector(self.host, self.host_label)
        self.since_ms = int(time.time() * 1000)

    def _once(self, kind: str, line: str) -> None:
        if kind not in self.problems:
            self.problems[kind] = line
            self.report(line)

    def _query(self, span_ms: int) -> list[Series]:
        """This node's raw samples of the last `span_ms`; until a label has named its series, each of host_labels in turn
        (Hostname, then hostname, and `instance` where the cluster's exporter names its node only so), and the one that
        did is kept."""
        for label in self._tried():
            found = query(self.url, f"{selector(self.host, label)}[{span_ms}ms]", timeout=self.timeout)
            if found:
                self.host_label, self.selector, self.matched = label, selector(self.host, label), True
                return found
        return self._query(span_ms) if self._widened() else []

    def _widened(self) -> bool:
        """Ask Prometheus which exporters it holds (until it holds one) and add `instance` to the labels tried where one
        names its node only by its scrape target (jobstats'); whether labels were added."""
        if self.matched or self.families:
            return False
        now_ms = int(time.time() * 1000)
        self.families = present(self.url, now_ms - self.window * 1000, now_ms, timeout=self.timeout)
        labels = node_labels(self.host_labels, (f for f in self.families if f in GPU_FAMILIES))
        widened, self.host_labels = labels != self.host_labels, labels
        return widened

    def _tried(self) -> tuple[str, ...]:
        """The labels asked for this node: the one that matched, else every one of host_labels."""
        return (self.host_label,) if self.matched else self.host_labels

    def _find_slices(self) -> None:
        """Add the slices of the run's GPUs in MIG mode that its processes now use (NVML's per-instance process lists)."""
        if not self.open_migs:
            return
        from radt.collectors.sources.gpus import slices_in_use

        try:
            pids = {p.pid for p in self._pids()}
        except Exception:  # a process gone between listing and reading
            return
        new = sorted(slices_in_use(pids, self.open_migs) - set(self.wanted.slices))
        if new:
            self.wanted = self.wanted._replace(slices=[*self.wanted.slices, *new])

    def _span_ms(self, now_ms: int) -> int:
        """How far back this tick asks: from the oldest series' newest scrape already read (less a margin), at most the
        window; a series silent for longer (a GPU gone from the exporter) does not hold every tick at the window."""
        window = self.window * 1000
        oldest = min((t for t in self._last.values() if now_ms - t < window), default=self.since_ms)
        margin = max(MARGIN_S, 2 * self.interval) * 1000
        return int(min(max(now_ms - oldest + margin, margin), window))

    def sample(self) -> dict[str, float]:
        """The newest of the new scrapes of each series (readings() gives them all, at their own times)."""
        return {where: value for where, value, _ in self.readings(int(time.time() * 1000))}

    def readings(self, now_ms: int) -> list[Reading]:
        """Every scrape of the run's series stored since the last tick, at the scrape's timestamp; none twice."""
        if now_ms < self._due_ms:
            return []
        span = self._span_ms(now_ms)
        self._find_slices()
        try:
            found = self._query(span)  # on the server's clock
        except PromError as exc:
            self._once(exc.kind, f"radt: listener 'prometheus': {exc}; its GPU series are missing until it answers")
            return []
        except Exception as exc:  # never into the sampler
            self._once("error", f"radt: listener 'prometheus': {type(exc).__name__}: {exc}")
            return []
        for series in found:
            if self.wanted.place(series.labels) is not None and series.labels.get("__name__") in EXPORTER_METRICS:
                self.read.add(series.labels["__name__"])
        out: list[Reading] = []
        conflicts: list[str] = []
        for where, samples in keyed_samples(found, self.wanted, conflicts).items():
            self.keys.add(where)
            last = max(self._last.get(where, -1), self.since_ms - 1)
            new = [(stamp, value) for stamp, value in samples if stamp > last]
            stamps = ([self._last[where]] if where in self._last else []) + [stamp for stamp, _ in new]
            spacings = [b - a for a, b in zip(stamps, stamps[1:], strict=False) if b > a]
            if spacings:
                self.scrape_ms = min([*spacings, self.scrape_ms or spacings[0]])
            if new:
                stretches = self.returned.setdefault(where, [])
                if stretches and self._last.get(where, -1) >= now_ms - span:  # asked back past its last scrape: none skipped
                    stretches[-1][1] = new[-1][0]
                else:
                    stretches.append([new[0][0], new[-1][0]])
                self._last[where] = new[-1][0]
                out.extend(Reading(where, value, stamp) for stamp, value in new)
        recent = [t for t in self._last.values() if now_ms - t < self.window * 1000]
        self._due_ms = min(recent) + self.scrape_ms if recent and self.scrape_ms else 0
        if not out and self.scrape_ms and self._due_ms <= now_ms:  # due, not stored yet (a scrape takes a while): ask 8 times a scrape
            self._due_ms = now_ms + self.scrape_ms // 8
        if conflicts:
            self._once(
                "conflict",
                f"radt: listener 'prometheus': several series for one GPU ({conflicts[0]}); the first is read, narrow the host with {self.host_label}",
            )
        self._check_missing()
        return out

    def _check_missing(self) -> None:
        """One line when a watched GPU or MIG slice, or a device only the labels can place, has no series at all on this node.

        A GPU in MIG mode given whole is left out: its slices are the run's only once its processes use one."""
        gpus = set(self.wanted.gpus or []) - set(self.open_migs)
        places = {(resolve(k).gpu, resolve(k).mig) for k in self.keys}
        seen = {gpu for gpu, _ in places}
        lost_slices = [f"GPU {gpu} MIG slice {gi} (GPU_I_ID={gi})" for gpu, gi in self.wanted.slices if (gpu, gi) not in places]
        if self.wanted.given and not self.keys:
            self._once("missing", f"radt: listener 'prometheus': {unproved(self.wanted, self.host)}")
        elif not gpus and not self.wanted.slices and self.wanted.gpus is not None and not self.wanted.given:
            return  # nothing to look for yet (GPUs in MIG mode whose slices the run does not use yet)
        elif not self.keys:
            self._once(
                "missing",
                f"radt: listener 'prometheus': no {self._exporter()} series for {self._where()} at {self.url}; "
                "give the node's name as the exporter labels it with --host NAME (or RADT_HOST), the label with RADT_PROMETHEUS_HOST_LABEL",
            )
        elif gpus - seen:
            missing = ", ".join(str(g) for g in sorted(gpus - seen))
            self._once("missing", f"radt: listener 'prometheus': no {self._exporter()} series for GPU {missing} on {self.host} at {self.url}")
        elif lost_slices:
            self._once("missing", f"radt: listener 'prometheus': no {self._exporter()} series for {', '.join(lost_slices)} on {self.host} at {self.url}")

    def _exporter(self) -> str:
        """The exporters a "no series" line names: those read for the run, else those Prometheus holds (where asked)."""
        read = [f.name for f in GPU_FAMILIES if self.read & set(f.metrics)]
        return exporter_word(read or (None if self.families is None else [f.name for f in self.families if f in GPU_FAMILIES]))

    def _where(self) -> str:
        gpus = "every GPU" if self.wanted.gpus is None else "GPU " + ", ".join(map(str, self.wanted.gpus))
        if self.wanted.slices:
            gpus += " (MIG slices " + ", ".join(f"{gpu}:{gi}" for gpu, gi in self.wanted.slices) + ")"
        return f"{gpus} of {looked_for(self.host, self._tried())}"

    def _family(self) -> dict[str, tuple[str, float]]:
        """The exporter this node runs, by what was read: the one most names read are of, dcgm-exporter's where none came."""
        best = max(GPU_FAMILIES, key=lambda f: len(self.read & set(f.metrics)))
        return best.metrics if self.read & set(best.metrics) else DCGM_EXPORTER_METRICS

    def describe(self) -> dict:
        return {
            "url": self.url,
            "host": dict.fromkeys(self._tried(), self.host),
            "read": sorted(self.read),
            "not_found": sorted(set(self._family()) - self.read),
            "keys": len(self.keys),
            "scrape_interval_s": self.scrape_ms / 1000 if self.scrape_ms else None,
            "errors": list(self.problems.values()),
        }


@dataclass(frozen=True)
class Backfill:
    """What a backfill reads: the server, the node and its GPUs (as in Wanted), the span and the step of the run."""

    url: str
    host: str | None
    gpus: list[int] | None
    start_ms: int
    end_ms: int
    step_s: float
    slices: list[tuple[int, int]] | None = None
    uuids: dict[str, int] | None = None
    host_label: str | tuple[str, ...] = DEFAULT_HOST_LABELS
    timeout: float = 30.0
    given: tuple[str, ...] = ()
    owners: dict[str, str] | None = None
    mig_gpus: tuple[int, ...] = ()
    job_series: bool = False  # also the run's Slurm job's own CPU and memory from its cgroup (a run radt did not record)


@dataclass
class Looked:
    """What a backfill asked Prometheus: the node labels tried, in turn, and the GPU exporters it read (having read
    nothing: those Prometheus holds; None where it was not asked), for the lines that say what is missing."""

    labels: list[str] = field(default_factory=list)
    exporters: list[str] | None = None

    @property
    def exporter(self) -> str:
        """How a "no series" line names what was looked for: 'dcgm-exporter', 'nvidia_gpu_prometheus_exporter', ..."""
        return exporter_word(self.exporters)


def backfill(job: Backfill, *, conflicts: list[str] | None = None, matched: list[str] | None = None, looked: Looked | None = None) -> list[Point]:
    """Every raw sample of the run's series in [start_ms, end_ms], at the scrapes' own timestamps.

    `step` counts `step_s` from the start, as the sampler's ticks do; two series for one key go to
    `conflicts` (the first is kept). Node labels are tried in turn (Hostname, hostname; `instance` besides where none
    gives points and Prometheus holds an exporter that names its node only by its scrape target): the first that gives
    points is read, and goes to `matched`; what was tried and read goes to `looked`. `given`, `owners` and `mig_gpus`
    as in Wanted: what only labels place, the run's job or pod, GPUs whose every slice is the run's. With `job_series`,
    the run's Slurm job's cgroup series too. Raises PromError (one line) when Prometheus does not answer or refuses."""
    wanted = Wanted(job.gpus, list(job.slices or []), job.uuids or {}, tuple(job.given), job.owners or {}, tuple(job.mig_gpus))
    looked = Looked() if looked is None else looked
    labels = (job.host_label,) if isinstance(job.host_label, str) else tuple(job.host_label)
    found = _read(job, wanted, Ask(labels, EXPORTER_METRICS), conflicts, looked)
    if not found.points and INSTANCE not in labels:  # no label of the node's own found it: an exporter that names it only by its target?
        families = [f for f in present(job.url, job.start_ms, job.end_ms, job.timeout) if f in GPU_FAMILIES]
        looked.exporters = [f.name for f in families]
        more = tuple(label for label in node_labels(labels, families) if label not in labels)
        found = _read(job, wanted, Ask(more, EXPORTER_METRICS), conflicts, looked) if more else found
    if found.names:
        looked.exporters = [f.name for f in GPU_FAMILIES if found.names & set(f.metrics)]
    if matched is not None and found.label:
        matched.append(found.label)
    points = found.points
    job_id = wanted.owners.get(JOBID)
    if job.job_series and job_id:  # the cgroup exporter names its node only by its scrape target, and every job of it
        also = (f"{JOBID}={string_literal(job_id)}", *(f'{name}=""' for name in STEP_LABELS))
        cgroup_labels = (INSTANCE, *(label for label in labels if label != INSTANCE))
        points |= _read(job, wanted, Ask(cgroup_labels, CGROUP_EXPORTER_METRICS, also), conflicts).points
    return sorted(points.values(), key=lambda p: (p.timestamp, p.key))


class Ask(NamedTuple):
    """One read's question: the node labels tried in turn, the exporter metrics, more matchers (a job's)."""

    labels: tuple[str, ...]
    metrics: Iterable[str]
    also: tuple[str, ...] = ()


class Read(NamedTuple):
    """One read's answer: the points, the exporter names they came from, the node label that found them ('' for none)."""

    points: dict[tuple[str, int], Point]
    names: set[str]
    label: str


def _read(job: Backfill, wanted: Wanted, ask: Ask, conflicts: list[str] | None, looked: Looked | None = None) -> Read:
    """The points of the first of the asked labels that gives any: the node's series of the asked metrics over the job's
    span, read CHUNK_S at a time and joined per series (so a counter's rises span the chunks) before they are named."""
    for label in ask.labels:
        if looked is not None:
            looked.labels.append(label)
        sel = selector(job.host, label, ask.metrics, ask.also)
        joined: dict[tuple[tuple[str, str], ...], Series] = {}
        chunk_end = job.end_ms
        while chunk_end >= job.start_ms:
            span_ms = min(CHUNK_S * 1000, chunk_end - job.start_ms + 1)
            # a range selector at time t holds the samples in (t - span, t]
            for found in query(job.url, f"{sel}[{span_ms}ms]", at=chunk_end / 1000, timeout=job.timeout):
                joined.setdefault(tuple(sorted(found.labels.items())), Series(found.labels, [])).samples.extend(found.samples)
            chunk_end -= span_ms
        whole = [Series(s.labels, sorted(s.samples)) for s in joined.values()]
        points: dict[tuple[str, int], Point] = {}
        for where, samples in keyed_samples(whole, wanted, conflicts).items():
            for stamp, value in samples:
                if job.start_ms <= stamp <= job.end_ms:
                    step = round((stamp - job.start_ms) / (job.step_s * 1000)) if job.step_s > 0 else 0
                    points[(where, stamp)] = Point(where, value, stamp, step)
        if points:
            return Read(points, {s.labels.get("__name__", "") for s in whole if series_key(s.labels, wanted) is not None}, label)
    return Read({}, set(), "")


def final_backfill(source: PrometheusSource, run_start_ms: int, run_end_ms: int) -> list[Point]:
    """The run's scrapes the live source never returned (between two ticks, or stored after the last one).

    Their own timestamps are kept; a problem is added to `source.problems` (see `gap`), never raised."""
    await_due_scrape(source, run_end_ms)
    try:
        points = backfill(
            Backfill(
                source.url,
                source.host,
                source.wanted.gpus,
                run_start_ms,
                run_end_ms,
                source.interval,
                slices=list(source.wanted.slices),
                uuids=dict(source.wanted.uuids),
                given=source.wanted.given,
                owners=dict(source.wanted.owners),
                host_label=source._tried(),
                timeout=source.timeout,
            )
        )
    except PromError as exc:
        source._once(exc.kind, f"radt: listener 'prometheus': {exc}; the run's last scrapes are missing")
        return []
    except Exception as exc:  # never into the run's end
        source._once("error", f"radt: listener 'prometheus': {type(exc).__name__}: {exc}")
        return []
    return [p for p in points if not any(first <= p.timestamp <= last for first, last in source.returned.get(p.key, ()))]


def await_due_scrape(source: PrometheusSource, end_ms: int, wait_s: float = SCRAPE_WAIT_S) -> None:
    """Wait until Prometheus holds the scrape due before the run's end, if one is due and not stored yet.

    Prometheus stamps a scrape when it begins it and stores it once the exporter has answered, so the run's last scrape
    can be in flight when the run ends. A target's scrapes are in turn: once one newer than the newest read is stored, all
    before it are. Bounded by the scrape's own end (its timeout is at most the interval) and STORE_SLACK_S, at most `wait_s`; never raises."""
    newest = max(source._last.values(), default=None)
    if newest is None or not source.scrape_ms or newest + source.scrape_ms * (1 - JITTER) > end_ms:
        return  # nothing read yet (the backfill reads all), or no scrape begun between the newest and the end
    due = newest + source.scrape_ms
    deadline = time.monotonic() + min(max(due - time.time() * 1000, 0) / 1000 + source.scrape_ms / 1000 + STORE_SLACK_S, wait_s)
    pause = min(max(source.scrape_ms / 8000, 0.05), 1.0)
    span = int(time.time() * 1000 - newest) + int(MARGIN_S * 1000)
    while True:
        try:
            stored = keyed_samples(source._query(min(span, source.window * 1000)), source.wanted)
        except Exception:
            return  # Prometheus away: the backfill says so
        if any(stamp > newest for samples in stored.values() for stamp, _ in samples) or time.monotonic() >= deadline:
            return
        time.sleep(pause)


def unproved(wanted: Wanted, host: str) -> str:
    """The one line for devices given as UUIDs NVML could not map whose series no label proves: what was not watched, and why."""
    job = next((f", nor {name}={value}" for name, value in wanted.owners.items()), "")
    return (
        f"no dcgm-exporter series of {host} is proved to be {', '.join(wanted.given)} (no label names it{job}); "
        "not watched, its GPU series are missing (run radt where NVML works, or give -d with GPU indices)"
    )


def gap(source: PrometheusSource) -> str | None:
    """The `radt.prometheus_gap` tag's value: the first problem the source met, None when it met none."""
    return next(iter(source.problems.values()), None)
