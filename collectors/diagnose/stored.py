"""Diagnose stored runs and keep the result on them: radt.diagnosis* and radt.footprint.* tags, written in one batch per run.

The rules are radt/diagnosis.py's and the evidence radt/evidence.py's (rollups, not raw points); this module reads the
runs a batch at a time (each run's series read once), picks partners for could_share among all of them at the end, and
writes. A run diagnosed anew loses the findings it no longer has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import sqlalchemy as sa

from radt import jobtable, mlflowdb
from radt.collectors._common import first_line
from radt.collectors.store.tracking import set_tags
from radt.diagnosis import COULD_SHARE, Diagnosis, Evidence, Sharer, diagnose, share_partners, sharer
from radt.errors import report
from radt.evidence import gather, gather_from_client
from radt.footprint import footprint
from radt.runmodel import DIAGNOSIS_TAG, diagnosis_tag
from radt.throughput import Gain, command_gains, read_work

BATCH = 250  # runs read at a time (evidence.CHUNK: one query per batch): memory stays bounded on any store, and a long fill keeps what it did


def evidence_of(source, run_ids: Sequence[str]) -> dict[str, Evidence]:
    """The runs' evidence from an engine (rollups) or a client: radt's SQL client's engine, else MLflow's client (a server)."""
    if isinstance(source, sa.Engine):
        return gather(source, run_ids)
    engine = getattr(source, "engine", None)
    return gather(engine, run_ids) if engine is not None else gather_from_client(source, run_ids)


def diagnoses(
    source, run_ids: Sequence[str], each: Callable[[str, Diagnosis, dict[str, str]], None] | None = None
) -> tuple[dict[str, Diagnosis], dict[str, dict[str, str]]]:
    """(run id -> its diagnosis, run id -> its footprint tags), `BATCH` runs read at a time from `source` (an engine or a
    client); `each` is called with every run's diagnosis and footprint as its batch is done, before could_share is known."""
    ids = list(dict.fromkeys(run_ids))
    batches = (evidence_of(source, ids[start : start + BATCH]) for start in range(0, len(ids), BATCH))
    return judge(batches, each, measured_gains(source, ids))


def measured_gains(source, run_ids: Sequence[str]) -> dict[str, Gain] | None:
    """run id -> the collocation gain the store measured for its command in its experiment (throughput.command_gains), read
    with SQL where radt reads the store so (an MLflow server's client: None, and could_share estimates, saying so)."""
    engine = getattr(source, "engine", None)
    if engine is None:
        return None
    r = mlflowdb.runs.c
    experiments: dict[str, str] = {}
    with engine.connect() as conn:
        for start in range(0, len(run_ids), BATCH):
            query = sa.select(r.run_uuid, r.experiment_id).where(r.run_uuid.in_(run_ids[start : start + BATCH]))
            experiments.update({run_id: str(experiment) for run_id, experiment in conn.execute(query)})
    works = read_work(engine, set(experiments.values()))
    gains = command_gains(works)
    return {w.run_id: gains[(w.experiment_id, w.command)] for w in works if w.run_id in experiments and (w.experiment_id, w.command) in gains}


def judge(
    batches: Iterable[Mapping[str, Evidence]],
    each: Callable[[str, Diagnosis, dict[str, str]], None] | None = None,
    measured: Mapping[str, Gain] | None = None,
) -> tuple[dict[str, Diagnosis], dict[str, dict[str, str]]]:
    """The diagnoses and footprint tags of evidence already read, a batch at a time; could_share pairs among all of them,
    decided by `measured` (run id -> its command's measured collocation gain) where known."""
    found: dict[str, Diagnosis] = {}
    figures: dict[str, dict[str, str]] = {}
    sharers: list[Sharer] = []
    for evidence in batches:
        for run_id, ev in evidence.items():
            found[run_id], figures[run_id] = diagnose(ev), footprint(ev).tags()
            if (candidate := sharer(ev)) is not None:
                sharers.append(candidate)
            if each is not None:
                each(run_id, found[run_id], figures[run_id])
    for run_id, finding in share_partners(sharers, measured).items():
        found[run_id].findings.append(finding)
    return found, figures


def store(client, run_id: str, diagnosis: Diagnosis, figures: dict[str, str]) -> None:
    """Write a run's diagnosis and footprint tags, and delete the findings it had before and has no longer."""
    set_tags(client, run_id, diagnosis.tags() | figures)
    engine = getattr(client, "engine", None)
    if engine is not None:  # radt's SQL client: one DELETE, no read of the run (half of a fill's time went to get_run)
        t = mlflowdb.tags.c
        with engine.begin() as conn:
            conn.execute(sa.delete(mlflowdb.tags).where(t.run_uuid == run_id, t.key.in_(diagnosis.cleared())))
        return
    held = client.get_run(run_id).data.tags
    for key in diagnosis.cleared():
        if key in held:
            client.delete_tag(run_id, key)


def diagnose_and_store(client, run_ids: Sequence[str]) -> dict[str, Diagnosis]:
    """Diagnose the runs and keep each result on its run as its batch is done; could_share, known at the end, is added then,
    and the Cluster page's rows of those that are Slurm jobs (radt/jobtable.py) are made again from their tags."""
    found, _ = diagnoses(client, run_ids, lambda run_id, diagnosis, figures: store(client, run_id, diagnosis, figures))
    for run_id, diagnosis in found.items():
        shared = next((f for f in diagnosis.findings if f.code == COULD_SHARE), None)
        if shared is not None:
            set_tags(client, run_id, {DIAGNOSIS_TAG: diagnosis.tags()[DIAGNOSIS_TAG], diagnosis_tag(COULD_SHARE): shared.sentence})
    engine = getattr(client, "engine", None)
    if engine is not None:  # radt's SQL client; an MLflow server's store holds no table of radt's
        jobtable.refresh(engine, list(found))
    return found


def diagnose_ended(client, run_id: str) -> Diagnosis | None:
    """A run's diagnosis as it ends (None where it failed); a failure never fails the run: it says how to diagnose it later."""
    try:
        return diagnose_and_store(client, [run_id]).get(run_id)
    except Exception as exc:  # the run has ended and its points are stored: only its diagnosis waits
        report(f"radt: run {run_id} ended, but it could not be diagnosed ({first_line(exc)}); run 'radt diagnose {run_id}' to try again")
        return None


def said(run_id: str, diagnosis: Diagnosis | None) -> str | None:
    """The one line a command prints of a run's diagnosis, pointing at the sentences; None without one."""
    if diagnosis is None:
        return None
    codes = ", ".join(diagnosis.codes) or "nothing found"
    return f"diagnosis of run {run_id}: {codes}" + (f" ('radt report {run_id}' says why and what to do)" if diagnosis.codes else "")
