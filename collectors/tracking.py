"""The run model on MLflow: experiments, workload parent runs, runs with radt's tags and params.

Low-volume calls (create, tag, terminate, artifacts) go through MLflow's own client, so the
runs look right in MLflow's UI; only metric points take radt's bulk path.
"""

from __future__ import annotations

import getpass
import hashlib
import itertools
import logging
import math
import os
import re
import shlex
import socket
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Param, RunTag
from mlflow.exceptions import MlflowException

from app.config import artifact_root, display_uri, is_database_uri
from collectors import settings
from collectors.command import WORKLOAD_PREFIX, first_line
from collectors.experiment import run_letter

# MLflow configures its logger at import; radt's users need its warnings, not its schema INFO lines
logging.getLogger("mlflow").setLevel(logging.WARNING)

PARAM_LIMIT = 6000  # MLflow's longest param value
TAG_LIMIT = 8000
# the training script's own start (right after it is spawned) and exit, epoch ms; runner.finish_run writes them
from app.catalogue import SCRIPT_END_TAG, SCRIPT_START_TAG  # noqa: E402, F401 - re-exported for the runner


class StoreError(RuntimeError):
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
    return StoreError(f"cannot reach the tracking store {redact(uri)} ({first_line(exc, 300)}); start it or point MLFLOW_TRACKING_URI at a running one")


def connect(uri: str) -> MlflowClient:
    """A client whose store answers, or StoreError with a one-line reason (no minutes of retries)."""
    _limit_http_retries()
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///") :]).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            _init_sqlite(uri)
        from collectors.stores import make_engine

        engine = make_engine(uri)  # switches the file to WAL now, while nothing else writes to it
        try:
            with engine.connect():
                pass
        except Exception as exc:
            raise _unreachable(uri, exc) from exc
        finally:
            engine.dispose()
    elif is_database_uri(uri):  # MLflow retries a dead database for a minute; ask once first
        from collectors.stores import make_engine

        engine = make_engine(uri)
        try:
            with engine.connect():
                pass
        except Exception as exc:
            raise _unreachable(uri, exc) from exc
        finally:
            engine.dispose()
    try:
        client = MlflowClient(tracking_uri=uri)  # MLflow opens a database store here: a file that is no database fails now
        client.search_experiments(max_results=1)
    except Exception as exc:  # connection refused, auth, bad URI: one line for the user
        raise _unreachable(uri, exc) from exc
    return client


def _init_sqlite(uri: str) -> None:
    """Create a new SQLite store with its artifacts under RADT_HOME rather than the current folder."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    SqlAlchemyStore(uri, artifact_root().as_uri())


def redact(uri: str) -> str:
    """The URI without its password, for messages."""
    return display_uri(uri)


def resolve_experiment(client: MlflowClient, uri: str, name_or_id: str | None) -> str:
    """An experiment id for a name or id; a new name is created (artifacts under RADT_HOME for databases)."""
    if not name_or_id:
        return "0"
    if name_or_id.isdigit():
        try:
            return client.get_experiment(name_or_id).experiment_id
        except MlflowException:
            pass  # a numeric *name*
    found = client.get_experiment_by_name(name_or_id)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            raise StoreError(f"experiment '{name_or_id}' is deleted; restore it in MLflow or choose another -e")
        return found.experiment_id
    location = None
    if is_database_uri(uri):
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name_or_id)
        if len(safe) > 120:  # a folder name has at most 255 bytes; a long experiment name keeps its start and a digest
            safe = f"{safe[:100]}-{hashlib.sha1(name_or_id.encode()).hexdigest()[:12]}"
        location = (artifact_root() / safe).as_uri()
    try:
        return client.create_experiment(name_or_id, artifact_location=location)
    except MlflowException:  # created meanwhile by a collocated run
        return client.get_experiment_by_name(name_or_id).experiment_id


def script_params(args: list[str]) -> dict[str, str]:
    """radT's way: '--batch-size 256' -> {'batch-size': '256'}; '--fp16' -> 'True'; '--lr=0.1' too."""
    params: dict[str, str] = {}
    i = 0
    positional = 0
    while i < len(args):
        token = args[i]
        if token.startswith("-") and not _is_number(token) and token.strip("-"):
            name = token.lstrip("-")
            if "=" in name:
                name, value = name.split("=", 1)
            elif i + 1 < len(args) and (not args[i + 1].startswith("-") or _is_number(args[i + 1])):
                value = args[i + 1]
                i += 1
            else:
                value = "True"
            params[name] = value
        else:
            params[f"arg{positional}"] = token
            positional += 1
        i += 1
    return params


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def create_workload(client: MlflowClient, experiment_id: str, workload: str, tags: dict[str, str]) -> str:
    """A new workload parent run (one per execution of a CSV workload, so a rerun gets its own)."""
    all_tags = {"radt.workload": workload, "radt.role": "workload", "mlflow.user": getpass.getuser(), **tags}
    return client.create_run(experiment_id, run_name=f"{WORKLOAD_PREFIX}{workload}", tags=all_tags).info.run_id


def find_or_create_workload(client: MlflowClient, experiment_id: str, workload: str) -> str:
    """The parent run of a workload (tag radt.workload), created RUNNING if none exists yet; RUNNING again if it had ended.

    Runs started together may each create one: the first (start time, then id) is the workload's,
    and a run that created another deletes its own at once."""

    def parents() -> list:
        found = client.search_runs(
            [experiment_id], filter_string=f"tags.`radt.workload` = '{_quote(workload)}' and tags.`radt.role` = 'workload'", max_results=100
        )
        return sorted(found, key=_order)

    found = parents()
    if not found:
        tags = {"radt.workload": workload, "radt.role": "workload", "mlflow.user": getpass.getuser()}
        mine = client.create_run(experiment_id, run_name=f"{WORKLOAD_PREFIX}{workload}", tags=tags).info.run_id
        winner = next(iter(parents()), None)
        if winner is not None and winner.info.run_id != mine:
            client.delete_run(mine)
            return winner.info.run_id
        return mine
    if found[0].info.status != "RUNNING":  # a new run joins an ended workload: it runs again until its runs are done
        client.update_run(found[0].info.run_id, status="RUNNING")
    return found[0].info.run_id


def _order(run) -> tuple[int, str]:
    """Runs in the order they started (the id breaks a tie): the same order for every radt that asks."""
    return (run.info.start_time or 0, run.info.run_id)


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def create_run(
    client: MlflowClient,
    experiment_id: str,
    *,
    command: list[str],
    script: str,
    script_args: list[str],
    run_name: str | None,
    workload: str | None,
    letter: str,
    devices: str,
    collocation: str,
    listeners: list[str],
    settings: dict[str, str],
    start_time: int | None = None,
    parent_id: str | None = None,
) -> tuple[str, str | None]:
    """Create the run with radt's tags and the script's params; returns (run id, parent id).

    The parent is `parent_id` when given (a CSV workload's), else the workload's, found or created.
    An empty `letter` takes the workload's next free letter (see claim_letter); without a workload it is A."""
    if workload and parent_id is None:
        parent_id = find_or_create_workload(client, experiment_id, workload)
    letter = letter or ("" if parent_id else "A")
    tags = {
        "mlflow.user": getpass.getuser(),
        "mlflow.source.name": script,
        "mlflow.source.type": "LOCAL",
        "radt.role": "run",
        "radt.letter": letter,
        "radt.devices": devices,
        "radt.collocation": collocation,
        "radt.listeners": "+".join(listeners),
        "radt.command": shlex.join(command)[:TAG_LIMIT],
        "radt.host": socket.gethostname(),
        "radt.pid": str(os.getpid()),
    }
    if workload:
        tags["radt.workload"] = workload
    if parent_id:
        tags["mlflow.parentRunId"] = parent_id
    if not letter:
        del tags["radt.letter"]  # claimed below, once the run exists and its siblings can see it
    run = client.create_run(experiment_id, start_time=start_time, run_name=run_name or None, tags=tags)
    run_id = run.info.run_id
    if not letter:
        claim_letter(client, experiment_id, parent_id, run_id)
    params = script_params(script_args)
    params["command"] = shlex.join(command)
    params.update(settings)
    batch = [Param(k[:250], str(v)[:PARAM_LIMIT]) for k, v in params.items()]
    for start in range(0, len(batch), 100):
        client.log_batch(run_id, params=batch[start : start + 100])
    return run_id, parent_id


def claim_letter(client: MlflowClient, experiment_id: str, parent_id: str, run_id: str) -> str:
    """The first letter (A, B, ..., Z, AA, ...) that no run of the workload started before this one has, tagged on `run_id`.

    An earlier run without a letter yet (started in the same second) is counted with the letter it
    will take by the same rule, so runs started together each pick a different one without a lock.
    The pick is checked once more after tagging: a run that was not yet visible is seen then."""
    letter = ""
    for _attempt in range(3):
        siblings = client.search_runs([experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{_quote(parent_id)}'", max_results=1000)
        held: list[str] = []
        for run in sorted(siblings, key=_order):
            if run.info.run_id == run_id:
                break
            held.append(run.data.tags.get("radt.letter") or _first_free(held))
        wanted = _first_free(held)
        if wanted == letter:
            break
        letter = wanted
        set_tags(client, run_id, {"radt.letter": letter})
    return letter


def _first_free(held: list[str]) -> str:
    return next(letter for letter in map(run_letter, itertools.count()) if letter not in held)


def set_tags(client: MlflowClient, run_id: str, tags: dict[str, str]) -> None:
    client.log_batch(run_id, tags=[RunTag(k, str(v)[:TAG_LIMIT]) for k, v in tags.items()])
