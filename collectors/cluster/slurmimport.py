"""`radt import --slurm JOBID[,JOBID...]` / `--slurm-since 1d`: a run for every Slurm job, with nothing of radt in the job.

Each job's facts come from Slurm's accounting (collectors/slurm/slurmacct.py), its GPUs' series from the cluster's
Prometheus (`radt import --prometheus`'s backfill, for the job's node, GPUs and time). One experiment per user
(`slurm-<user>`, or per account with --group-by account), one run per job found again by its radt.slurm.job_id tag,
so importing again adds nothing twice and fills what was not yet scraped; an array's tasks are runs of one workload.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple, Protocol

from radt import jobtable
from radt.catalogue import MIB, ExporterFamily
from radt.collectors.slurm.slurmacct import (
    SCONTROL,
    AccountingError,
    Job,
    NoAccounting,
    node_gpus,
    requested_gpus,
    running_gpus,
    sacct,
    scontrol_jobs,
)
from radt.collectors.sources.exporters import (
    GPU_FAMILIES,
    JOB_FAMILIES,
    GpuMemory,
    JobSpan,
    gpu_memory,
    labelled_gpus,
    node_labels,
    present,
    unlabelled,
)
from radt.collectors.sources.promql import PromError, host_labels
from radt.collectors.store.sqltracking import SqlTracking
from radt.collectors.store.tracking import TAG_LIMIT, connect, find_or_create_workload, find_runs, resolve_experiment, set_tags
from radt.options import store_parent
from radt.runmodel import (
    GPU_MEMORY_TAG,
    GPU_MODEL_TAG,
    GPUS_FROM_TAG,
    HOST_TAG,
    NO_SERIES_TAG,
    PARENT_TAG,
    PROMETHEUS_GAP_TAG,
    PROMETHEUS_TAG,
    ROLE_TAG,
    RUN_ROLE,
    SLURM_EXPERIMENT_PREFIX,
    SLURM_JOB_TAG,
    SLURM_PARTITION_TAG,
    SLURM_PREFIX,
    SLURM_SUMMARY_TAG,
    USER_TAG,
    WORKLOAD_TAG,
    gpus_of_tag,
    gpus_used_tag,
    node_tag,
)
from radt.settings import PROMETHEUS_HOST_LABEL, PROMETHEUS_URL, tracking_uri

if TYPE_CHECKING:
    from radt.cli import OneLineParser

_SINCE = re.compile(r"^(\d+)([dhm])$")
WHOLE_NODE = "whole node"  # radt.slurm.gpus_from of a job that had every GPU of its nodes
UNKNOWN = "unknown"  # radt.slurm.gpus_requested of a job whose GPUs no source counted
INDEXED = 20  # from this many jobs an import reads each experiment's runs once (one query) instead of searching per job
NO_GPU = "the job had no GPU"  # radt.slurm.no_series of a job without GPUs: no later import can fill it
HELD_S = 600  # how long after its end slurmctld may still hold a job (MinJobAge, 300 s by default) and say what it asked for
UNCOUNTED = (
    "Slurm counts no GPU in its jobs' TRES here (AccountingStorageTRES lacks gres/gpu) and neither the job's AdminComment (radt's prolog, "
    "Slurm's GRES, jobstats' summary) nor slurmctld said which GPUs the job had; add gres/gpu to AccountingStorageTRES or install "
    "examples/slurm/radt-gres-prolog.sh as PrologSlurmctld"
)


def parse_since(text: str) -> tuple[str, int]:
    """--slurm-since as sacct takes it and as ms since the epoch (for scontrol's jobs, where sacct is not there to read
    it): '1d' / '6h' / '30m' -> sacct's now-1days / now-6hours / now-30minutes; an ISO time as it is."""
    text = text.strip()
    match = _SINCE.match(text)
    if match:
        unit, seconds = {"d": ("days", 86_400), "h": ("hours", 3_600), "m": ("minutes", 60)}[match.group(2)]
        return f"now-{match.group(1)}{unit}", int((time.time() - int(match.group(1)) * seconds) * 1000)
    if re.match(r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2})?)?$", text):
        iso = text.replace(" ", "T")
        return iso, int(datetime.fromisoformat(iso).timestamp() * 1000)
    raise AccountingError(f"--slurm-since '{text}' is not a span or a time; give e.g. --slurm-since 1d, 6h, 30m or 2026-11-26T08:00")


def _until_ms(job: Job) -> int:
    """The end of the job's time: its end, or now while it runs."""
    return job.end_ms or int(time.time() * 1000)


def job_tags(job: Job) -> dict[str, str]:
    """The run's tags: the job's Slurm facts under radt.slurm.*, its user as MLflow's, its node as radt's host."""
    tags = {
        SLURM_JOB_TAG: job.job_id,
        f"{SLURM_PREFIX}raw_id": job.raw_id,
        f"{SLURM_PREFIX}user": job.user,
        f"{SLURM_PREFIX}account": job.account,
        SLURM_PARTITION_TAG: job.partition,
        f"{SLURM_PREFIX}state": job.state,
        f"{SLURM_PREFIX}exit_code": f"{job.exit_code}:{job.signal}",
        f"{SLURM_PREFIX}nodes": ",".join(job.nodes),
        f"{SLURM_PREFIX}gpus_requested": UNKNOWN if job.gpus_requested is None else str(job.gpus_requested),
        f"{SLURM_PREFIX}gpus_used": gpus_used_tag(job.gpus),
        ROLE_TAG: RUN_ROLE,
        USER_TAG: job.user,
    }
    if len(job.nodes) == 1:
        tags[HOST_TAG] = job.nodes[0]
    elif job.gpus and all(job.gpus.get(node) for node in job.nodes):  # a run of several nodes, as radt's own multi-node runs are
        for node in job.nodes:
            tags[node_tag(node)] = job.status
            tags[node_tag(node, "host")] = node
            tags[node_tag(node, "slurm_job_id")] = job.job_id
            tags[node_tag(node, "gpus")] = json.dumps([{"series": f"gpu_{i}", "index": i} for i in job.gpus[node]])
    if job.array_job:
        tags[f"{SLURM_PREFIX}array_job"] = job.array_job
    return tags


def _whole_nodes(job: Job) -> dict[str, tuple[int, ...]] | None:
    """Every GPU of the job's nodes where it was given them all (its GPUs requested = its nodes' GPUs, as Slurm configures
    them now); None otherwise: a part of a node's GPUs is never guessed."""
    if not job.gpus_requested or not job.nodes:
        return None
    counts = [node_gpus(node) for node in job.nodes]
    if any(c is None for c in counts) or sum(counts) != job.gpus_requested:  # type: ignore[arg-type]
        return None
    return {node: tuple(range(count)) for node, count in zip(job.nodes, counts, strict=True)}  # type: ignore[arg-type]


def _asked(job: Job) -> Job:
    """The job with the GPUs it asked for, where its accounting did not count them (a Slurm whose TRES count no GPU) and
    slurmctld still holds it: running, or ended within HELD_S."""
    if job.gpus_requested is not None or (job.status != "RUNNING" and _until_ms(job) < (time.time() - HELD_S) * 1000):
        return job
    return job._replace(gpus_requested=requested_gpus(job))


def _counted(job: Job) -> Job:
    """The job with as many GPUs requested as it was found to have, where nothing counted them before."""
    if job.gpus_requested is None and job.gpus and any(job.gpus.values()):
        return job._replace(gpus_requested=sum(len(found) for found in job.gpus.values()))
    return job


def why_no_series(job: Job, looked: Callable[[list[str]], str] | None = None) -> str | None:
    """Why the job's GPU series cannot be taken (None: they can): radt takes a job's own GPUs or none. `looked`: what the
    exporters were asked for and held on the nodes whose GPUs are unknown (': looked for ...; found ...')."""
    if job.gpus_requested == 0 and not any((job.gpus or {}).values()):
        return NO_GPU
    if job.gpus_requested is None and not any((job.gpus or {}).values()):
        return UNCOUNTED
    unknown = [node for node in job.nodes if not (job.gpus or {}).get(node)]
    if unknown:
        where = f" of node {', '.join(unknown)}" if len(job.nodes) > 1 else ""
        held = job.admin_note if job.admin_note and not job.gpus else f"the job's AdminComment names no GPU{where}"
        return (
            f"no exporter series is labelled with the job{looked(unknown) if looked else ' (jobid, hpc_job)'}, Slurm's accounting keeps no GPU index and {held}; "
            "install examples/slurm/radt-gres-prolog.sh as PrologSlurmctld"
        )
    return None


def summary_tags(job: Job) -> dict[str, str]:
    """jobstats' summary of the job (its AdminComment) as run tags: SLURM_SUMMARY_TAG says where the figures come from and
    that each is one value over the whole job; radt.slurm.summary.<node> holds the node's (JSON). Never metrics: a
    series' reader would take one mean for a whole series."""
    summary = job.summary
    if summary is None:
        return {}
    seconds = f" of {summary.seconds:g} s" if summary.seconds is not None else ""
    tags = {SLURM_SUMMARY_TAG: f"jobstats' AdminComment summary (JS1:), not series: one figure per GPU and node over the job's run{seconds}"}
    for node, figures in summary.nodes.items():
        gpus = {str(g): f._asdict() for g, f in figures.gpus.items()}
        entry = {"cpus": figures.cpus, "cpu_seconds": figures.cpu_seconds, "cpu_utilization_pct": summary.cpu_utilization_pct(node)}
        entry |= {"memory_used_bytes": figures.memory_used_bytes, "memory_total_bytes": figures.memory_total_bytes, "gpus": gpus}
        tags[f"{SLURM_SUMMARY_TAG}.{node}"] = json.dumps(entry, sort_keys=True)
    return tags


Fill = Callable[[list[str]], int]  # `radt import --prometheus`'s main (importer.prometheus_main), passed in: no import cycle


class Batch(Protocol):
    """Many jobs' series read a node's window at a time (collectors/imports/batchfill.BatchFill, passed in as Fill is)."""

    queries: int

    def plan(self, jobs: list[Job]) -> None: ...
    def nothing_labelled(self, job: Job, labels: tuple[str, ...]) -> bool: ...
    def fill(self, run_id: str, created: bool, tags: dict[str, str], job: Job, labels: tuple[str, ...]) -> bool: ...
    def done(self, job: Job) -> None: ...
    def close(self) -> None: ...


MakeBatch = Callable[[object, str, str], Batch]  # (client, store URI, Prometheus URL) -> a Batch


def _fill(fill: Fill, uri: str, run_id: str, job: Job, url: str, labels: tuple[str, ...], job_series: bool) -> int:
    """The job's GPU series from Prometheus into its run (radt import --prometheus's backfill), its node found by `labels`,
    and with `job_series` its own CPU and memory (jobstats' cgroup exporter); its exit code."""
    argv = ["--prometheus", url, "--run", run_id, "--store", uri, "--no-diagnosis", "--host-label", ",".join(labels)]
    argv += ["--job-series"] if job_series else []
    if len(job.nodes) == 1:  # several nodes: each node's host and GPUs are in the run's radt.node.<node>/ tags
        argv += ["--gpus", "+".join(map(str, job.gpus[job.nodes[0]]))]  # type: ignore[index]
    with contextlib.redirect_stdout(io.StringIO()):  # it prints the run id; this command prints a line per job
        return fill(argv)


class Imported(NamedTuple):
    """What importing one job did: its run, whether it was made now, why it has no GPU series (None: it has), whether
    the series were read (False: Prometheus failed; the run has a gap tag and the next import fills it), whether the
    run already held all of it (nothing written, nothing asked of Prometheus)."""

    run_id: str
    created: bool
    reason: str | None
    filled: bool
    unchanged: bool = False


def _gap(tags: dict[str, str]) -> bool:
    """Whether an earlier import left a gap to fill: the run's, or one node's radt.node.<node>/prometheus_gap."""
    node_gap = "/" + PROMETHEUS_GAP_TAG.removeprefix("radt.")
    return any(key == PROMETHEUS_GAP_TAG or key.endswith(node_gap) for key in tags)


def unchanged(job: Job, run, url: str | None) -> bool:
    """Whether the job's run already holds everything an import would write: the job ended as the run says (state, end,
    exit code, nodes, GPUs, summary), no gap is left to fill, and its series were read (or it had no GPU, or no
    Prometheus is given now to read them). A running job is never unchanged: its series grow."""
    tags = run.data.tags
    if job.status == "RUNNING" or run.info.status != job.status or run.info.end_time != job.end_ms or _gap(tags):
        return False
    facts = job_tags(job) | summary_tags(job)
    used = facts.pop(f"{SLURM_PREFIX}gpus_used")
    if job.gpus_requested is None:  # counted from the GPUs found by an import (_counted)
        facts.pop(f"{SLURM_PREFIX}gpus_requested")
    if job.gpus and any(job.gpus.values()) and not tags.get(GPUS_FROM_TAG, "").startswith("exporter label"):
        facts[f"{SLURM_PREFIX}gpus_used"] = used  # the exporter's labels win over the AdminComment's (_gpus_of)
    if any(tags.get(key) != value[:TAG_LIMIT] for key, value in facts.items()):  # as set_tags kept them
        return False
    if not url:  # '' where neither --prometheus nor RADT_PROMETHEUS_URL gives one
        return NO_SERIES_TAG in tags or PROMETHEUS_TAG in tags
    if tags.get(NO_SERIES_TAG) == NO_GPU:
        return True
    return NO_SERIES_TAG not in tags and tags.get(PROMETHEUS_TAG, "").startswith(f"{url} ")


class JobImporter:
    """Imports jobs into one store: each experiment (and array workload) is looked up once per import, not once per job."""

    def __init__(self, client, uri: str, group_by: str = "user", url: str | None = None, fill: Fill | None = None, batch: MakeBatch | None = None) -> None:
        self.client, self.uri, self.group_by, self.url, self.fill = client, uri, group_by, url, fill
        self.batch = batch(client, uri, url) if batch is not None and url else None
        self._tags: dict[str, str] = {}  # the tags _put wrote last
        self._experiments: dict[str, str] = {}
        self._workloads: dict[tuple[str, str], str] = {}
        self.host_labels = host_labels(PROMETHEUS_HOST_LABEL.get())
        self.asked = False  # whether Prometheus was asked which exporters it holds (labels())
        self.families: tuple[ExporterFamily, ...] = ()  # those it holds
        self.filled: list[str] = []  # this import's runs with GPU series, diagnosed together at the end (could_share pairs them)
        self.written: list[str] = []  # this import's runs whose tags it wrote: their Cluster rows are made again at the end
        self._runs: dict[str, dict[str, object]] = {}  # experiment -> {job id: its run}, where read at once (index())

    def index(self, jobs: list[Job]) -> None:
        """Each of the jobs' experiments' job runs read in one query, so that no job is searched for on its own (an
        unchanged day imported again asks the store once an experiment); below INDEXED jobs each is searched for. The
        jobs their runs do not hold yet are planned into the batch's windows."""
        if len(jobs) < INDEXED:
            return
        self._index(jobs)
        if self.batch is not None:
            self.batch.plan([job for job in jobs if not self._unchanged(job)])

    def _unchanged(self, job: Job) -> bool:
        found = self._find(job)[1]
        return found is not None and unchanged(job, found, self.url)

    def _index(self, jobs: list[Job]) -> None:
        limit = 0 if isinstance(self.client, SqlTracking) else 50_000  # radt's SQL client: 0 is no limit; MLflow's most
        for name in {self._name(job) for job in jobs}:
            experiment = self._experiment(name)
            if experiment in self._runs:
                continue
            found: dict[str, object] = {}
            for run in find_runs(self.client, [experiment], {ROLE_TAG: RUN_ROLE}, max_results=limit):  # newest first
                found.setdefault(run.data.tags.get(SLURM_JOB_TAG, ""), run)
            self._runs[experiment] = found

    def job(self, job: Job) -> Imported:
        """One started job into its run: facts, status and end, then its GPUs' series where they can be known."""
        try:
            return self._one(job)
        finally:
            if self.batch is not None:
                self.batch.done(job)

    def _one(self, job: Job) -> Imported:
        client = self.client
        experiment, found = self._find(job)
        if found is not None and unchanged(job, found, self.url):
            return Imported(found.info.run_id, False, found.data.tags.get(NO_SERIES_TAG), True, unchanged=True)
        before = dict(found.data.tags) if found is not None else {}
        job = _counted(self._gpus_of(_asked(job), before))
        run_id, created = self._put(job, experiment, found)
        self.written.append(run_id)
        if job.status != "RUNNING":  # before the series: the backfill reads the run's own span
            client.set_terminated(run_id, status=job.status, end_time=job.end_ms)
        reason = why_no_series(job, self._looked(job) if self.url else None)
        reason = reason or (None if self.url else "no Prometheus given (--prometheus or RADT_PROMETHEUS_URL)")
        if reason:
            set_tags(client, run_id, {NO_SERIES_TAG: reason})
            return Imported(run_id, created, reason, True)
        if NO_SERIES_TAG in before:  # an earlier import had no Prometheus to ask (or could not tell the GPUs)
            client.delete_tag(run_id, NO_SERIES_TAG)
        assert self.fill is not None, "a Prometheus URL needs the backfill"
        job_series = bool(set(self.families) & set(JOB_FAMILIES))
        tags = {k: v for k, v in (before | self._tags).items() if k != NO_SERIES_TAG}
        batched = self.batch is not None and not job_series and self.batch.fill(run_id, created, tags, job, self.labels())
        filled = batched or _fill(self.fill, self.uri, run_id, job, self.url, self.labels(), job_series) == 0
        memory = self._memory(job)
        if memory is not None:  # what fits_smaller says a MIG slice against: the exporter's modelName and FB_FREE + FB_USED
            set_tags(client, run_id, {GPU_MODEL_TAG: memory.model, GPU_MEMORY_TAG: f"{memory.total_mib * MIB:.0f}"})
        self.filled.append(run_id)
        return Imported(run_id, created, None, filled)

    def _gpus_of(self, job: Job, before: dict[str, str]) -> Job:
        """The job with the GPUs it had and where they come from (gpus_from), in this order: the GPUs its exporter
        labelled with its id (jobid, hpc_job) over its time; its AdminComment's (radt's prolog, Slurm's GRES text a site's
        prolog copied, jobstats' summary: admincomment.read); scontrol's while it runs;
        what an import took from scontrol while it ran (the run's gpus_used tag); every GPU of its nodes where it had them
        all. gpus_from '' where none says."""
        unlabelled_ = self.batch is not None and len(job.nodes) == 1 and self.batch.nothing_labelled(job, self.labels())
        if self.url and job.nodes and job.start_ms is not None and not unlabelled_:
            end_ms = _until_ms(job)
            labelled = {}
            try:
                for node in job.nodes:
                    span = JobSpan((job.job_id, job.raw_id), job.start_ms, end_ms)
                    found = labelled_gpus(self.url, node, self.labels(), span, families=self.families or None)
                    if found is None:
                        break
                    labelled[node] = found
            except PromError:
                labelled = {}  # the backfill meets it too, and leaves the gap tag
            if len(labelled) == len(job.nodes):  # every node's GPUs said by the exporter, or none taken from it
                label = next(iter(labelled.values())).label
                return job._replace(gpus={node: found.gpus for node, found in labelled.items()}, gpus_from=f"exporter label {label}")
        if job.gpus is not None and any(job.gpus.values()):
            return job
        if job.state == "RUNNING" and job.gpus_requested != 0:
            running = running_gpus(job)
            if running:
                return job._replace(gpus=running, gpus_from=SCONTROL)
        taken = gpus_of_tag(before.get(f"{SLURM_PREFIX}gpus_used", "")) if before.get(GPUS_FROM_TAG, "").startswith(SCONTROL) else {}
        if taken:
            return job._replace(gpus=taken, gpus_from=f"{SCONTROL}, while it ran")
        whole = _whole_nodes(job)
        if whole:
            return job._replace(gpus=whole, gpus_from=WHOLE_NODE)
        return job._replace(gpus_from="")

    def labels(self) -> tuple[str, ...]:
        """The labels a node's series are found by: RADT_PROMETHEUS_HOST_LABEL's, and `instance` where Prometheus holds an
        exporter that names its node only by its scrape target (jobstats'; first where no other names it). Which exporters
        it holds (self.families) is asked once an import, over all it holds; not again where it did not answer (each
        job's backfill says so)."""
        if not self.asked and self.url:
            self.asked = True
            try:
                self.families = present(self.url)
            except PromError:
                self.families = ()
            self.host_labels = node_labels(self.host_labels, (f for f in self.families if f in GPU_FAMILIES))
        return self.host_labels

    def _looked(self, job: Job) -> Callable[[list[str]], str]:
        """What the exporters were asked for and held on `nodes` over the job's time, for why_no_series' line."""

        def said(nodes: list[str]) -> str:
            if job.start_ms is None:
                return " (jobid, hpc_job)"
            try:
                return unlabelled(self.url, nodes, self.labels(), JobSpan((job.job_id, job.raw_id), job.start_ms, _until_ms(job)))
            except PromError:
                return " (jobid, hpc_job)"

        return said

    def close(self) -> None:
        """The batch's metric store closed."""
        if self.batch is not None:
            self.batch.close()

    def diagnose(self) -> int:
        """Diagnose this import's jobs with GPU series (radt/diagnosis.py, the rules every run gets) and keep the findings on
        their runs; how many could share a GPU with another of them."""
        from radt.collectors.diagnose.stored import diagnose_and_store
        from radt.diagnosis import COULD_SHARE

        found = diagnose_and_store(self.client, self.filled)  # also makes the diagnosed runs' Cluster rows again
        engine = getattr(self.client, "engine", None)
        if engine is not None:  # radt's SQL client: the other runs' rows and the arrays' workload parents' (radt/jobtable.py)
            jobtable.refresh(engine, [r for r in self.written if r not in found] + list(self._workloads.values()))
        return sum(COULD_SHARE in diagnosis.codes for diagnosis in found.values())

    def _memory(self, job: Job) -> GpuMemory | None:
        """The size and model of the job's GPUs, the largest over all its nodes, which its memory verdict is said against
        (None: not known). The first node's alone gave no size where its exporter published none, or the smaller one."""
        sizes = []
        for node, gpus in (job.gpus or {}).items():
            try:
                found = gpu_memory(self.url, node, self.labels(), gpus, job.start_ms, _until_ms(job)) if gpus else None  # type: ignore[arg-type]
            except PromError:
                return None
            if found is not None:
                sizes.append(found)
        return max(sizes) if sizes else None

    def _name(self, job: Job) -> str:
        """The job's experiment's name: slurm-<user>, or slurm-<account> with --group-by account."""
        return f"{SLURM_EXPERIMENT_PREFIX}{job.user if self.group_by == 'user' else job.account}"

    def _experiment(self, name: str) -> str:
        """The experiment's id, made where it is new; looked up once an import."""
        if name not in self._experiments:
            self._experiments[name] = resolve_experiment(self.client, self.uri, name)
        return self._experiments[name]

    def _find(self, job: Job) -> tuple[str, object | None]:
        """The job's experiment (made where it is new) and its run there, found by its job id (None: not imported yet)."""
        experiment = self._experiment(self._name(job))
        if experiment in self._runs:
            return experiment, self._runs[experiment].get(job.job_id)
        found = find_runs(self.client, [experiment], {SLURM_JOB_TAG: job.job_id, ROLE_TAG: RUN_ROLE}, max_results=10)
        return experiment, (found[0] if found else None)

    def _put(self, job: Job, experiment: str, found) -> tuple[str, bool]:
        """The job's facts on its run (`found`), or a new run of them at the job's start; (run id, created)."""
        tags = job_tags(job) | summary_tags(job)
        if job.gpus_from:
            tags[GPUS_FROM_TAG] = job.gpus_from
        self._tags = tags
        if job.array_job:
            workload = f"{job.name} (array {job.array_job})"
            if (experiment, workload) not in self._workloads:
                self._workloads[(experiment, workload)] = find_or_create_workload(self.client, experiment, workload)
            tags[WORKLOAD_TAG], tags[PARENT_TAG] = workload, self._workloads[(experiment, workload)]
        if found is not None:
            set_tags(self.client, found.info.run_id, tags)
            return found.info.run_id, False
        run = self.client.create_run(experiment, start_time=job.start_ms, run_name=job.name or f"job {job.job_id}", tags=tags)
        return run.info.run_id, True


def main(argv: list[str], fill: Fill, batch: MakeBatch | None = None) -> int:
    """The command; `fill`: importer.prometheus_main, which reads a run's series from Prometheus; `batch`: batchfill's
    BatchFill, which reads many jobs' series a node's window at a time."""
    args = _parser().parse_args(argv)
    ids = [j.strip() for j in (args.slurm or "").split(",") if j.strip()]
    if args.slurm is not None and (not ids or not all(re.fullmatch(r"\d+(_\d+)?", j) for j in ids)):
        raise AccountingError(f"--slurm '{args.slurm}' is not a list of job ids; give e.g. --slurm 1234,1235_3")
    jobs = _asked_jobs(args, ids)
    url = args.prometheus if args.prometheus is not None else PROMETHEUS_URL.get()
    uri = tracking_uri(args.store)
    importer = JobImporter(connect(uri), uri, args.group_by, url, fill, batch)
    made = failed = kept = 0
    importer.index([job for job in jobs if job.start_ms is not None])
    try:  # a stopped import still stores the series it queued (batchfill.BatchFill.flush)
        for job in jobs:
            if job.unread:
                print(
                    f"radt import: job {job.job_id}: scontrol's record of it cannot be read for its GPUs ({job.unread}); none are taken from it",
                    file=sys.stderr,
                )
            if job.start_ms is None:
                print(f"radt import: job {job.job_id}: {job.state}, not started yet; import it again once it runs", file=sys.stderr)
                continue
            done = importer.job(job)
            made += done.created
            failed += not done.filled
            kept += done.unchanged
            note = f"no GPU series: {done.reason}" if done.reason else "GPU series from Prometheus"
            note = f"unchanged since the last import ({note})" if done.unchanged else note
            print(
                f"radt import: job {job.job_id} ({job.user}, {job.partition}, {job.state}) -> run {done.run_id}{' (new)' if done.created else ''}; {note}",
                file=sys.stderr,
            )
    finally:
        importer.close()
    shared = importer.diagnose()
    print(f"radt import: {len(jobs)} jobs, {made} new runs, {kept} unchanged" + (f"; {shared} could share a GPU under MPS" if shared else ""), file=sys.stderr)
    return 1 if failed or (ids and len(jobs) < len(ids)) else 0


def _parser() -> OneLineParser:
    """`radt import --slurm/--slurm-since`'s options."""
    from radt.cli import OneLineParser

    parser = OneLineParser(
        parents=[store_parent()], prog="radt import", description="A run for every Slurm job, from Slurm's accounting and the cluster's Prometheus."
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--slurm", help="job ids, e.g. 1234,1235_3 (an array's task)")
    which.add_argument("--slurm-since", help="every job started since: a span (1d, 6h, 30m) or a time (2026-11-26T08:00)")
    parser.add_argument("--user", help="only this user's jobs")
    parser.add_argument("--partition", help="only this partition's jobs")
    parser.add_argument("--account", help="only this account's jobs")
    parser.add_argument("--group-by", choices=("user", "account"), default="user", help="one experiment per user (default) or per account")
    parser.add_argument(
        "--prometheus", default=None, help="the cluster's Prometheus URL (default RADT_PROMETHEUS_URL); without one, the runs get the jobs' facts only"
    )
    return parser


def _asked_jobs(args: argparse.Namespace, ids: list[str]) -> list[Job]:
    """The jobs asked for, from Slurm's accounting, or from slurmctld where there is none (said in a line); a line for
    each asked-for id that neither holds."""
    since, floor = parse_since(args.slurm_since) if args.slurm_since else (None, None)
    try:
        jobs, holder = sacct(ids or None, since, args.user, args.partition, args.account), "Slurm's accounting"
    except NoAccounting as exc:
        print(f"radt import: {exc}; importing the jobs slurmctld still holds (running, or ended within its MinJobAge) from scontrol", file=sys.stderr)
        jobs, holder = scontrol_jobs(ids or None, args.user, args.partition, args.account), "slurmctld"
        if floor is not None:
            jobs = [j for j in jobs if j.start_ms is None or j.start_ms >= floor]
    for missing in [j for j in ids if j not in {job.job_id for job in jobs} and j not in {job.raw_id for job in jobs}]:
        check = f"sacct -j {missing}" if holder != "slurmctld" else f"scontrol show job {missing}"
        print(f"radt import: job {missing}: {holder} has no such job; check the id ({check})", file=sys.stderr)
    return jobs
