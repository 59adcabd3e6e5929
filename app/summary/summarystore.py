"""Run summaries written once per ended run (radt/summarytable.py) and read after: a view of 200 ended runs reads
200 stored rows, not their raw points.

Which row is used, per run:
- a running run (app.db.store.LIVE_STATUSES) is computed from its points, as before, and never stored;
- an ended run's stored row is used while its version is SUMMARY_VERSION and its fingerprint (`fingerprints`) is
  the run's current one; else it is computed again and stored;
- a run `radt retain` cut (older raw points dropped) keeps its stored row whatever its fingerprint: computing
  it again from what is left would give other numbers. A row of an older version that later versions only added
  columns to (ADDED_IN) or defined some columns anew in (CHANGED_IN) still holds, with those columns empty. Without
  such a row it shows as unavailable (no figure, gpus_text UNAVAILABLE), never as figures of part of the run.

The dashboard's engine cannot write (app/db/store.py); rows are written through a second engine on the same store
that only ever writes radt_summaries. A store that will not take them (a read-only user, a read-only file) is
said once in the log, and its summaries are computed on each view, as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import uuid
import weakref
from collections.abc import Sequence

import pandas as pd
import sqlalchemy as sa

from radt import summarytable
from radt.app.db.runs import key_values
from radt.app.db.store import EXPERIMENTS, LATEST, LIVE_STATUSES, RUNS, TAGS, chunks, plain_rows, unique
from radt.app.summary.summaries import ADDED_IN, CHANGED_IN, SUMMARY_COLUMNS, SUMMARY_TAGS, SUMMARY_VERSION, run_summary
from radt.runmodel import NODE_TAG

LOG = logging.getLogger(__name__)
UNAVAILABLE = "unavailable: radt retain dropped raw points before the summary was stored"

_WRITERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # read engine -> the engine that writes its summaries
_REFUSED: set[str] = set()  # stores that would not take summaries (said once per process)


def store_summaries(engine: sa.Engine, run_ids: Sequence[str]) -> pd.DataFrame:
    """run_summary's frame for these runs: stored rows where they hold, the rest computed (and stored for ended runs)."""
    run_ids = unique(run_ids)
    empty = run_summary(engine, [])
    if not run_ids:
        return empty
    with engine.connect() as conn:
        prints = fingerprints(conn, run_ids)
        ended = [r for r in run_ids if r in prints and prints[r][0] not in LIVE_STATUSES]
        stored = summarytable.read(conn, ended)
        rows = {r: stored[r].summary for r in ended if r in stored and _holds(stored[r], prints[r][1])}
        stale = [r for r in ended if r not in rows]
        cut = summarytable.frozen(conn, stale)
    for run_id in cut:
        kept = stored.get(run_id)
        rows[run_id] = kept_row(kept) if readable(kept) else unavailable(run_id)
    todo = [r for r in run_ids if r not in rows]
    keep = {r: prints[r][1] for r in stale if r not in cut}
    token = uuid.uuid4().hex
    writer = _write(engine, lambda conn: summarytable.claim(conn, keep, SUMMARY_VERSION, token)) if keep else None
    computed = {row["run_id"]: row for row in run_summary(engine, todo).to_dict("records")} if todo else {}
    if writer is not None:
        _write(engine, lambda conn: summarytable.fill(conn, {r: computed[r] for r in keep if r in computed}, token))
    rows.update(computed)
    frame = pd.DataFrame([rows[r] for r in run_ids], columns=SUMMARY_COLUMNS)
    return frame.astype({c: t for c, t in empty.dtypes.items() if t.kind != "O"})  # as run_summary types them


def _holds(stored: summarytable.Stored, fingerprint: str) -> bool:
    return stored.summary is not None and stored.version == SUMMARY_VERSION and stored.fingerprint == fingerprint


def readable(stored: summarytable.Stored | None) -> bool:
    """Whether a stored row holds for a run `radt retain` cut: one with figures, of this version or of an older one whose
    successors only added columns (ADDED_IN) or defined some anew (CHANGED_IN), which it shows empty. Its figures are the
    whole run's, as no recomputation after the cut could give them. A newer radt's row is not: its definitions are not
    this one's."""
    if stored is None or stored.summary is None:
        return False
    later = range(stored.version + 1, SUMMARY_VERSION + 1)
    return stored.version <= SUMMARY_VERSION and all(v in ADDED_IN or v in CHANGED_IN for v in later)


def kept_row(stored: summarytable.Stored) -> dict:
    """A stored row with every column, those its version did not have yet, or defined otherwise, empty (NaN)."""
    stale = {c for v in range(stored.version + 1, SUMMARY_VERSION + 1) for c in CHANGED_IN.get(v, ())}
    return dict.fromkeys(SUMMARY_COLUMNS, math.nan) | {c: v for c, v in stored.summary.items() if c not in stale}


def unavailable(run_id: str) -> dict:
    """The row of a run whose summary cannot be computed any more: no figure, and why in gpus_text."""
    row = dict.fromkeys(SUMMARY_COLUMNS, math.nan)
    return row | {"run_id": run_id, "gpus_used": 0, "gpus_watched": 0, "gpu_basis": "", "gpus_text": UNAVAILABLE, "gpu_energy_j": {}}


def fingerprints(conn: sa.Connection, run_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
    """run_id -> (status, fingerprint) of the runs that exist: what their summary is computed from, but the raw points.

    Status, lifecycle (the run's and its experiment's), start and end; count, greatest and sum of timestamps and steps of
    its latest_metrics rows (any point MLflow's client adds past a series' latest changes them); the tags run_summary
    reads. One statement for the runs and one for the tags per chunk of runs, neither reading raw points."""
    r, e, lm = RUNS.c, EXPERIMENTS.c, LATEST.c
    out: dict[str, tuple[str, str]] = {}
    for part in chunks(run_ids, summarytable.CHUNK):
        latest = (
            sa.select(lm.run_uuid, sa.func.count().label("n"), sa.func.max(lm.timestamp), sa.func.max(lm.step), sa.func.sum(lm.timestamp), sa.func.sum(lm.step))
            .where(lm.run_uuid.in_(part))
            .group_by(lm.run_uuid)
            .subquery()
        )
        c = list(latest.c)
        stmt = (
            sa.select(r.run_uuid, r.status, r.lifecycle_stage, e.lifecycle_stage, r.start_time, r.end_time, *c[1:])
            .select_from(RUNS.join(EXPERIMENTS, e.experiment_id == r.experiment_id).outerjoin(latest, c[0] == r.run_uuid))
            .where(r.run_uuid.in_(part))
        )
        tags = key_values(conn, TAGS, part, keys=list(SUMMARY_TAGS), prefix=NODE_TAG)
        for run_id, status, *rest in plain_rows(conn, stmt):
            plain = [status, *(v if v is None or isinstance(v, str) else int(v) for v in rest), sorted(tags.get(run_id, {}).items())]
            out[run_id] = (status or "", hashlib.sha1(json.dumps(plain).encode()).hexdigest())
    return out


def _write(engine: sa.Engine, work) -> bool:
    """work(conn) in a transaction of the store's summary writer; False (said once) where the store refuses it."""
    writer = _writer(engine)
    try:
        summarytable.ensure_table(writer)
        with writer.begin() as conn:
            work(conn)
        return True
    except sa.exc.DBAPIError as exc:
        where = engine.url.render_as_string(hide_password=True)
        if where not in _REFUSED:
            _REFUSED.add(where)
            reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            LOG.warning("radt: cannot store run summaries in %s (%s); they are computed on each view", where, reason)
        return False


def _writer(engine: sa.Engine) -> sa.Engine:
    """An engine on the read engine's store that may write (no pool: it writes only when a summary is computed)."""
    if engine not in _WRITERS:
        args = {"connect_args": {"connect_timeout": 5, "application_name": "radt-dashboard"}} if engine.dialect.name == "postgresql" else {}
        _WRITERS[engine] = sa.create_engine(engine.url, poolclass=sa.pool.NullPool, **args)
    return _WRITERS[engine]
