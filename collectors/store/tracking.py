"""The run model on MLflow: experiments, workload parent runs, runs with radt's tags and params.

Low-volume calls (create, tag, terminate, artifacts) take the client connect() returns: for a SQLite or
PostgreSQL store, radt's own SQL path on MLflow's tables (sqltracking.py: the same rows MLflow's client
writes, without importing MLflow); for an `mlflow server`, MLflow's client. Metric points take radt's
bulk path (stores.py) either way. Every function here takes either client (tests pass MlflowClient).
"""

from __future__ import annotations

import getpass
import logging
import math
import os
import re
import shlex
import socket
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from radt import __version__, settings
from radt.artifacts import experiment_location
from radt.collectors._common import first_line
from radt.collectors.store import storelock
from radt.collectors.store.nodes import Membership, slurm_tags
from radt.collectors.store.sqltracking import KeyValue, SchemaMismatch, SqlTracking, TrackingError, make_engine, open_sql_tracking, path_not_unique
from radt.errors import UserError
from radt.mlflowdb import schema_revisions
from radt.runmodel import (
    COLLOCATION_TAG,
    COMMAND_TAG,
    DEVICES_TAG,
    HOST_TAG,
    HOSTNAME_TAG,
    LETTER_TAG,
    LISTENERS_TAG,
    PARENT_TAG,
    PID_TAG,
    PROFILER_TAG,
    ROLE_TAG,
    RUN_ROLE,
    SETTLED_TAG,
    SLURM_JOB_TAG,
    SLURM_STEP_TAG,
    SOURCE_NAME_TAG,
    SOURCE_TYPE_TAG,
    USER_TAG,
    VERSION_TAG,
    WORKLOAD_ROLE,
    WORKLOAD_TAG,
    first_free_letter,
    node_tag,
    workload_run_name,
)
from radt.settings import artifact_root, display_uri, is_database_uri

PARAM_LIMIT = 6000  # MLflow's longest param value
TAG_LIMIT = 8000
# the training script's own start (right after it is spawned) and exit, epoch ms; runner.finish_run writes them


class StoreError(UserError, RuntimeError):
    """The tracking store cannot be used; the message says which store and what to do."""


# radt's own MLflow HTTP calls give up quickly (the writer spools instead of waiting minutes);
# these are set in radt's process only and kept out of the training script's environment.
# radt itself sends nothing to MLflow's usage telemetry on the user's behalf.
# The HTTP values are settings.HTTP_RETRIES and STORE_TIMEOUT (their RADT_* variables are read at connect()).
PROCESS_ONLY_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(settings.HTTP_RETRIES.default),
    "MLFLOW_HTTP_REQUEST_TIMEOUT": str(math.ceil(settings.STORE_TIMEOUT.default)),
    "MLFLOW_DISABLE_TELEMETRY": "true",
}
ADDED_ENV: set[str] = set()


def _limit_http_retries() -> None:
    PROCESS_ONLY_ENV["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(settings.HTTP_RETRIES.get())
    PROCESS_ONLY_ENV["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, math.ceil(settings.STORE_TIMEOUT.get())))
    for name, value in PROCESS_ONLY_ENV.items():
        if name not in os.environ:
            os.environ[name] = value
            ADDED_ENV.add(name)


def _unreachable(uri: str, exc: Exception) -> StoreError:
    if "file is not a database" in str(exc):  # SQLite on a file of something else (a typo in --store)
        return StoreError(f"the tracking store {redact(uri)} is not a SQLite database; give a new file name or the store's own file")
    missing = re.search(r'database "([^"]+)" does not exist', str(exc))
    if missing and uri.startswith(("postgresql", "postgres:")):  # radt makes a new database's tables, never the database (a typo would get one)
        return StoreError(
            f"the PostgreSQL server of {redact(uri)} has no database '{missing.group(1)}'; create it ({_createdb(uri)}) or fix its name in the URI"
        )
    return StoreError(f"cannot reach the tracking store {redact(uri)} ({first_line(exc, 300)}); start it or point MLFLOW_TRACKING_URI at a running one")


def _createdb(uri: str) -> str:
    """The `createdb` command that makes the URI's database on its server, as its user."""
    url = sa.make_url("postgresql" + uri[uri.index(":") :])
    options = [f"-h {url.host}" if url.host else "", f"-p {url.port}" if url.port else "", f"-U {url.username}" if url.username else ""]
    return " ".join(["createdb", *filter(None, options), shlex.quote(url.database or "")])


def connect(uri: str):
    """A client whose store answers, or StoreError with a one-line reason (no minutes of retries).

    SqlTracking for a SQLite or PostgreSQL store at the schema radt writes (a new store gets MLflow's
    schema from MLflow first, importing it once); MlflowClient for servers and any other database."""
    _limit_http_retries()
    if is_database_uri(uri):
        client = _sql_client(uri)
        if client is not None:
            return client
    return _mlflow_client(uri)


def _sql_client(uri: str) -> SqlTracking | None:
    """radt's SQL client, or None where MLflow's client must write (a store whose tables radt's do not describe)."""
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = make_engine(uri)  # switches a SQLite file to WAL now, while nothing else writes to it
    try:
        try:
            return open_sql_tracking(uri, engine)
        except SchemaMismatch as exc:
            mismatch = exc
        timeout = settings.STORE_CREATE_TIMEOUT.get()
        with storelock.creating(engine, timeout) as held:  # radts started together on a new store: one creates it, the others wait
            client, mismatch = _open_or_create(uri, engine, held, timeout)
        if client is not None:
            return client
        _refuse(uri, mismatch)
    except StoreError:
        engine.dispose()
        raise
    except Exception as exc:
        engine.dispose()
        raise _unreachable(uri, exc) from exc
    engine.dispose()  # the installed MLflow's schema, which radt's tables do not describe: MLflow's client writes it
    if mismatch.difference and uri not in _SAID:
        _SAID.add(uri)
        print(
            f"radt: the tracking store {redact(uri)} differs from the tables radt writes ({mismatch.difference}); radt uses MLflow's client for it",
            file=sys.stderr,
        )
    return None


_SAID: set[str] = set()  # stores whose difference this process has said


def _open_or_create(uri: str, engine, held: bool, timeout: float) -> tuple[SqlTracking | None, SchemaMismatch | None]:
    """The store looked at again under the creation lock (another radt may have made or migrated it meanwhile), and
    MLflow's schema made where there is none. `held`: whether the lock was had within `timeout` seconds."""
    try:
        return open_sql_tracking(uri, engine), None
    except SchemaMismatch as exc:
        mismatch = exc
    if not held and _unfinished(mismatch):
        where = f" (it holds {storelock.lock_path(engine)})" if engine.dialect.name == "sqlite" else ""
        raise StoreError(
            f"the tracking store {redact(uri)} is still being created by another process after {timeout:g} s{where}; "
            "let it finish, or raise RADT_STORE_CREATE_TIMEOUT"
        )
    if mismatch.revision is None:  # no MLflow tables yet: MLflow creates them, once per store
        _init_store(uri)
        try:
            return open_sql_tracking(uri, engine), None
        except SchemaMismatch as exc:
            mismatch = exc
    return None, mismatch


def _unfinished(mismatch: SchemaMismatch) -> bool:
    """A schema that may be one another process is creating or migrating right now: none yet, or an older MLflow revision."""
    head, known = schema_revisions()
    return mismatch.revision is None or (mismatch.revision in known and mismatch.revision != head)


def _refuse(uri: str, mismatch: SchemaMismatch) -> None:
    """StoreError where neither radt's SQL nor the installed MLflow can write the store: an older schema, or a newer one whose tables changed."""
    head, known = schema_revisions()
    if mismatch.revision not in known:
        why = f", and its {mismatch.difference}" if mismatch.difference else ""
        raise StoreError(
            f"the tracking store {redact(uri)} has MLflow schema {mismatch.revision}, newer than the installed MLflow knows{why}; "
            "upgrade MLflow in radt's environment (pip install -U mlflow)"
        )
    if mismatch.revision != head:
        raise StoreError(
            f"the tracking store {redact(uri)} has an older MLflow schema ({mismatch.revision}, this MLflow writes {head}); "
            f"back it up, then run: mlflow db upgrade '{redact(uri)}'"
        )


def _quiet_mlflow() -> None:
    """MLflow sets its logger to INFO when imported; radt's users need its warnings, not its schema INFO lines."""
    logging.getLogger("mlflow").setLevel(logging.WARNING)


def _mlflow_client(uri: str):
    from mlflow import MlflowClient

    _quiet_mlflow()
    try:
        client = MlflowClient(tracking_uri=uri)  # MLflow opens a database store here: a file that is no database fails now
        client.search_experiments(max_results=1)
    except Exception as exc:  # connection refused, auth, bad URI: one line for the user
        raise _unreachable(uri, exc) from exc
    return client


def _init_store(uri: str) -> None:
    """MLflow's schema in a new database store, with its artifacts under RADT_HOME rather than the current folder."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    _quiet_mlflow()
    SqlAlchemyStore(uri, settings.ARTIFACT_URI.get() or artifact_root().as_uri()).engine.dispose()  # experiment 0's location


def _entities(client) -> tuple[type, type]:
    """The Param and RunTag classes `client.log_batch` takes: radt's plain pairs for SqlTracking, MLflow's for its client."""
    if isinstance(client, SqlTracking):
        return KeyValue, KeyValue
    from mlflow.entities import Param, RunTag

    return Param, RunTag


def _lookup_errors(client) -> tuple[type[Exception], ...]:
    """What `client` raises for a missing experiment or a name already taken."""
    if isinstance(client, SqlTracking):
        return (TrackingError,)
    from mlflow.exceptions import MlflowException

    return (MlflowException,)


def redact(uri: str) -> str:
    """The URI without its password, for messages."""
    return display_uri(uri)


def resolve_experiment(client, uri: str, name_or_id: str | None) -> str:
    """An experiment id for a name or id; a new name is created with its artifacts under RADT_ARTIFACT_URI
    (--artifacts), else RADT_HOME for databases (an mlflow server picks its own). An existing one keeps its location."""
    root = settings.ARTIFACT_URI.get()  # checked by the command line (artifacts.configure)
    if not name_or_id:
        if root:
            _location_wins(client.get_experiment("0"), root, uri)
        return "0"
    if name_or_id.isdigit():
        try:
            found = client.get_experiment(name_or_id)
            _location_wins(found, root, uri)
            return found.experiment_id
        except _lookup_errors(client):
            pass  # a numeric *name*
    found = client.get_experiment_by_name(name_or_id)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            raise StoreError(f"experiment '{name_or_id}' is deleted; restore it in MLflow or choose another -e")
        _location_wins(found, root, uri)
        return found.experiment_id
    location = None
    if root:
        location = experiment_location(root, name_or_id)
    elif is_database_uri(uri):
        location = experiment_location(artifact_root().as_uri(), name_or_id)
    try:
        return client.create_experiment(name_or_id, artifact_location=location)
    except _lookup_errors(client):  # created meanwhile by a collocated run
        return client.get_experiment_by_name(name_or_id).experiment_id


_TOLD_LOCATION: set[tuple[str, str]] = set()  # (store, experiment id) said once


def _location_wins(experiment, root: str, store: str) -> None:
    """MLflow's rule: an experiment keeps the artifact location it was created with; said once per experiment when the user asked for another."""
    location = (experiment.artifact_location or "").rstrip("/")
    if not root or not location or location.startswith(root.rstrip("/") + "/") or (store, experiment.experiment_id) in _TOLD_LOCATION:
        return
    _TOLD_LOCATION.add((store, experiment.experiment_id))
    print(
        f"radt: experiment '{experiment.name}' keeps its artifact location {redact(location)} (MLflow's rule); "
        f"{redact(root)} applies to new experiments: give a new -e name to use it",
        file=sys.stderr,
    )


def script_params(args: list[str]) -> dict[str, str]:
    """radT's way: '--batch-size 256' -> {'batch-size': '256'}; '--fp16' -> 'True'; '--lr=0.1' too.

    A flag MLflow cannot take as a param key is stored under param_key's escaped name (`--w[0] 1` -> `w:5B0:5D`);
    the command param keeps it as typed."""
    params: dict[str, str] = {}
    i = 0
    positional = 0
    while i < len(args):
        token = args[i]
        if token.startswith("-") and not _is_number(token) and token.strip("-") and not token.lstrip("-").startswith("="):
            name = token.lstrip("-")
            if "=" in name:
                name, value = name.split("=", 1)
            elif i + 1 < len(args) and (not args[i + 1].startswith("-") or _is_number(args[i + 1])):
                value = args[i + 1]
                i += 1
            else:
                value = "True"
            params[param_key(name)] = value
        else:
            params[f"arg{positional}"] = token
            positional += 1
        i += 1
    return params


# MLflow's characters for a param key (mlflow.utils.validation), but the colon: radt's escape, as '%' is a URL's
PARAM_KEY_CHAR = re.compile(r"[/\w.\- ]")
ESCAPE = ":"
# a script's flag named like one of radt's own params (--command, --max_epoch) is kept under this prefix, not overwritten;
# ':' then 's' is never an escape (':' is followed by two hex digits there), so no other flag can take the name
SCRIPT_PARAM_PREFIX = "script:"


def param_key(name: str) -> str:
    """A script's flag name as an MLflow param key: as typed where MLflow takes it, else escaped like a URL with ':' for '%'.

    Each character MLflow refuses, and ':' itself, becomes ':' and its UTF-8 bytes in hex (`w[0]` -> `w:5B0:5D`,
    `a,b` -> `a:2Cb`); '/' and '.' too where MLflow would read the key as a path (`a/`, `..`). Two names never share a key."""
    key = "".join(char if PARAM_KEY_CHAR.fullmatch(char) else _escaped(char) for char in name)
    if path_not_unique(key):
        key = "".join(_escaped(char) if char in "/." else char for char in key)
    return key


def _escaped(char: str) -> str:
    return "".join(f"{ESCAPE}{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def create_workload(client, experiment_id: str, workload: str, tags: dict[str, str]) -> str:
    """A new workload parent run (one per execution of a CSV workload, so a rerun gets its own)."""
    all_tags = {WORKLOAD_TAG: workload, ROLE_TAG: WORKLOAD_ROLE, USER_TAG: getpass.getuser(), SETTLED_TAG: "true", **tags}
    return client.create_run(experiment_id, run_name=workload_run_name(workload), tags=all_tags).info.run_id


def find_or_create_workload(client, experiment_id: str, workload: str) -> str:
    """The parent run of a workload (tag radt.workload), created RUNNING if none exists yet; RUNNING again if it had ended."""
    identity = {WORKLOAD_TAG: workload, ROLE_TAG: WORKLOAD_ROLE}
    parent, created = find_or_create(client, experiment_id, identity, {USER_TAG: getpass.getuser()}, workload_run_name(workload))
    if not created:  # a new run joins an ended workload: it runs again until its runs are done
        run_again(client, parent)
    return parent.info.run_id


def run_again(client, run) -> None:
    """An ended run RUNNING again, because a new part joins it (a workload's run, a node); it ends again with its last part."""
    if run.info.status != "RUNNING":
        client.update_run(run.info.run_id, status="RUNNING")


def find_or_create(client, experiment_id: str, identity: dict[str, str], tags: dict[str, str], run_name: str | None) -> tuple:
    """The first active run with the `identity` tags, or a new one with them and `tags`: (run, created).

    On a database store the lookup and the creation are one locked transaction. Through an MLflow server,
    radts started together may each create one: each creator deletes its own once an earlier one (start time,
    then id) shows, and takes the earliest once two looks RADT_PARENT_SETTLE apart (longer on a slow server) agree.
    The one taken is marked settled (SETTLED_TAG) and comes first from then on: a creator that was slower than
    those looks (a loaded store) joins it even where its clock lags and its own run is dated earlier."""
    if isinstance(client, SqlTracking):
        return client.find_or_create_run(experiment_id, {**identity, **tags, SETTLED_TAG: "true"}, run_name=run_name, identity=list(identity))

    def first():
        return min(find_runs(client, [experiment_id], identity, max_results=100), key=_order, default=None)

    found = first()
    pause, wait = settings.PARENT_SETTLE.get(), settings.SETTLE_WAIT.get()
    deadline = time.monotonic() + wait
    while found is not None and _contested(found) and time.monotonic() < deadline:
        time.sleep(pause)  # another radt's new run: taken once its creator settled it (or its creator is gone)
        found = first()
    if found is not None:
        return found, False
    began = time.monotonic()
    mine = client.create_run(experiment_id, run_name=run_name, tags={**identity, **tags})
    settle = max(pause, 2 * (time.monotonic() - began))  # a loaded server creates slowly for the others too
    deadline = time.monotonic() + wait
    winner, mine_deleted = None, False
    while True:
        time.sleep(settle)
        now = first() or mine
        if now.info.run_id != mine.info.run_id:
            if not mine_deleted:
                client.delete_run(mine.info.run_id)
                mine_deleted = True
            if _settled(now) or time.monotonic() > deadline:  # only its creator settles a run: another's is taken once settled
                return now, False
        elif winner is not None and winner.info.run_id == mine.info.run_id:  # two looks agree: mine is the earliest
            client.set_tag(mine.info.run_id, SETTLED_TAG, "true")
            return mine, True
        winner = now


def _settled(run) -> bool:
    return run.data.tags.get(SETTLED_TAG) == "true"


def _contested(run) -> bool:
    """A run that may yet lose to another radt's: not settled, RUNNING, and started in the last minute or in the future by
    this host's clock (a lagging clock dates a new run in the past, a leading one in the future). An ended workload, or
    one an older radt made long ago, is taken at once."""
    age_ms = time.time() * 1000 - (run.info.start_time or 0)
    return not _settled(run) and run.info.status == "RUNNING" and age_ms < 60_000


def _order(run) -> tuple[int, int, str]:
    """A settled run first, then in the order they started (the id breaks a tie): the same order for every radt that asks."""
    return (0 if _settled(run) else 1, run.info.start_time or 0, run.info.run_id)


def search_literal(value: str) -> str | None:
    """`value` as a string literal of MLflow's search filter, which takes the text between the quotes as it is
    (no escapes); None where no literal says it (both quote kinds, or a backslash, which can end a literal early)."""
    if "\\" in value:
        return None
    if "'" not in value:
        return f"'{value}'"
    return f'"{value}"' if '"' not in value else None


def find_runs(client, experiment_ids: Iterable[str], tags: dict[str, str], status: str | None = None, max_results: int = 1000) -> list:
    """Active runs of the experiments with these tag values (and status): SQL on MLflow's tables, or MLflow's search filter.

    A value no filter literal can say is left out of MLflow's filter and checked here instead."""
    if isinstance(client, SqlTracking):
        return client.find_runs(experiment_ids, tags=tags, status=status, max_results=max_results)
    conditions = [(f"tags.`{key}`", search_literal(value)) for key, value in tags.items()]
    if status:
        conditions.append(("attributes.status", search_literal(status)))
    text = " and ".join(f"{name} = {literal}" for name, literal in conditions if literal is not None)
    found = client.search_runs(list(experiment_ids), filter_string=text, max_results=max_results)
    return [r for r in found if all(r.data.tags.get(k) == v for k, v in tags.items()) and status in (None, r.info.status)]


@dataclass(frozen=True)
class NewRun:
    """What a new run is: its command and script, its place in a workload, its devices, listeners and settings."""

    command: list[str]
    script: str
    script_args: list[str]
    run_name: str | None
    workload: str | None
    letter: str
    devices: str
    collocation: str
    listeners: list[str]
    settings: dict[str, str]
    profiler: str | None = None
    start_time: int | None = None
    parent_id: str | None = None


def create_run(
    client,
    experiment_id: str,
    new: NewRun,
    *,
    member: Membership | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[str, str | None]:
    """Create the run with radt's tags and the script's params; returns (run id, parent id).

    The parent is `parent_id` when given (a CSV workload's), else the workload's, found or created.
    An empty `letter` takes the workload's next free letter (see claim_letter); without a workload it is A.
    A radt of a multi-node Slurm step (`member`) joins the run another node of the step created, if one did."""
    member = member or Membership()
    parent_id = new.parent_id
    environ = os.environ if environ is None else environ
    if new.workload and parent_id is None:
        parent_id = find_or_create_workload(client, experiment_id, new.workload)
    letter = new.letter or ("" if parent_id else "A")
    tags = {
        USER_TAG: getpass.getuser(),
        SOURCE_NAME_TAG: new.script,
        SOURCE_TYPE_TAG: "LOCAL",
        ROLE_TAG: RUN_ROLE,
        LETTER_TAG: letter,
        DEVICES_TAG: new.devices,
        COLLOCATION_TAG: new.collocation,
        LISTENERS_TAG: "+".join(new.listeners),
        COMMAND_TAG: shlex.join(new.command)[:TAG_LIMIT],
        VERSION_TAG: __version__,
        **host_tags(),
        PID_TAG: str(os.getpid()),
    }
    if new.profiler:
        tags[PROFILER_TAG] = new.profiler
    if new.workload:
        tags[WORKLOAD_TAG] = new.workload
    if parent_id:
        tags[PARENT_TAG] = parent_id
    if not letter:
        del tags[LETTER_TAG]  # claimed below, once the run exists and its siblings can see it
    tags.update(slurm_tags(environ))
    if member.node:
        tags.update(node_part_tags(member.node, environ))
    if member.slurm_step:  # one run per step: the first radt of the step creates it, the others join it as their nodes
        identity = {SLURM_STEP_TAG: member.slurm_step, ROLE_TAG: RUN_ROLE}
        run, created = find_or_create(client, experiment_id, identity, tags, new.run_name or None)
        if not created:
            join_run(client, run.info.run_id, member.node, environ)
            return run.info.run_id, run.data.tags.get(PARENT_TAG)
    else:
        run = client.create_run(experiment_id, start_time=new.start_time, run_name=new.run_name or None, tags=tags)
    run_id = run.info.run_id
    if not letter:
        claim_letter(client, experiment_id, parent_id, run_id)
    own = {"command": shlex.join(new.command), **new.settings}
    params = {(f"{SCRIPT_PARAM_PREFIX}{key}" if key in own else key): value for key, value in script_params(new.script_args).items()}
    params.update(own)
    log_params(client, run_id, {k[:250]: v for k, v in params.items()})  # one value per key where two long names share 250 characters
    return run_id, parent_id


def host_tags() -> dict[str, str]:
    """radt.host: the node's name (--host / RADT_HOST, else this machine's); radt.hostname: the machine's own, where it differs."""
    node, machine = settings.host_name(), socket.gethostname()
    return {HOST_TAG: node} | ({HOSTNAME_TAG: machine} if node != machine else {})


def node_part_tags(node: str, environ: Mapping[str, str]) -> dict[str, str]:
    """A node's part of a run: RUNNING, and where it runs (its radt's host and pid, its Slurm node)."""
    tags = {node_tag(node): "RUNNING", node_tag(node, "host"): settings.host_name(), node_tag(node, "pid"): str(os.getpid())}
    if environ.get("SLURM_JOB_ID"):
        tags[node_tag(node, "slurm_job_id")] = environ["SLURM_JOB_ID"]
    return tags


def join_run(client, run_id: str, node: str, environ: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """Join an existing run as `node` (MLFLOW_RUN_ID + MLFLOW_SYSTEM_METRICS_NODE_ID): (experiment id, parent id).

    An ended run runs again until this node's part ends too; a run of another store is refused in one line."""
    environ = os.environ if environ is None else environ
    try:
        run = client.get_run(run_id)
    except _lookup_errors(client) as exc:
        raise StoreError(
            f"MLFLOW_RUN_ID={run_id} names no run in this store ({first_line(exc)}); give the id of a run in this store, or unset MLFLOW_RUN_ID"
        ) from exc
    if run.info.lifecycle_stage != "active":
        raise StoreError(f"MLFLOW_RUN_ID={run_id} names a deleted run; restore it in MLflow or unset MLFLOW_RUN_ID")
    tags = node_part_tags(node, environ)
    if SLURM_JOB_TAG not in run.data.tags:  # the run's own Slurm tags are the first node's
        tags.update(slurm_tags(environ))
    set_tags(client, run_id, tags)
    run_again(client, run)
    return run.info.experiment_id, run.data.tags.get(PARENT_TAG)


def check_parent(client, parent_id: str, experiment: str | None) -> None:
    """--parent-run (the CSV scheduler's workload run) names a live run of the run's experiment (-e, a name or id;
    MLflow's Default without it): StoreError before anything is made, never a run pointing at a parent the store lacks."""
    scheduler_only = "--parent-run is the CSV scheduler's own option: run the workload from its CSV (radt experiment.csv)"
    try:
        parent = client.get_run(parent_id)
    except _lookup_errors(client):
        raise StoreError(f"--parent-run {parent_id} names no run in this store; {scheduler_only}") from None
    if parent.info.lifecycle_stage != "active":
        raise StoreError(f"--parent-run {parent_id} names a deleted run; {scheduler_only}")
    home = client.get_experiment(parent.info.experiment_id)
    if (experiment or "0") not in (home.experiment_id, home.name):
        raise StoreError(f"--parent-run {parent_id} is a run of experiment '{home.name}', not of -e {experiment or '0'}; {scheduler_only}")


def claim_letter(client, experiment_id: str, parent_id: str, run_id: str) -> str:
    """The first letter (A, B, ..., Z, AA, ...) that no run of the workload started before this one has, tagged on `run_id`.

    An earlier run without a letter yet (started in the same second) is counted with the letter it
    will take by the same rule, so runs started together each pick a different one without a lock.
    The pick is checked once more after tagging: a run that was not yet visible is seen then."""
    letter = ""
    for _attempt in range(3):
        siblings = find_runs(client, [experiment_id], {PARENT_TAG: parent_id}, max_results=1000)
        held: list[str] = []
        for run in sorted(siblings, key=_order):
            if run.info.run_id == run_id:
                break
            held.append(run.data.tags.get(LETTER_TAG) or first_free_letter(held))
        wanted = first_free_letter(held)
        if wanted == letter:
            break
        letter = wanted
        set_tags(client, run_id, {LETTER_TAG: letter})
    return letter


def log_params(client, run_id: str, params: dict[str, object]) -> None:
    """Params in batches of 100 (MLflow's limit for one log_batch), each value cut at PARAM_LIMIT characters."""
    param = _entities(client)[0]
    batch = [param(k, str(v)[:PARAM_LIMIT]) for k, v in params.items()]
    for start in range(0, len(batch), 100):
        client.log_batch(run_id, params=batch[start : start + 100])


def set_tags(client, run_id: str, tags: dict[str, str]) -> None:
    tag = _entities(client)[1]
    client.log_batch(run_id, tags=[tag(k, str(v)[:TAG_LIMIT]) for k, v in tags.items()])
