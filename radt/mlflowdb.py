"""MLflow's tracking tables as radt writes and reads them, without importing MLflow (five seconds).

SQLAlchemy Core copies of the tables of `mlflow/store/tracking/dbmodels/models.py` (MLflow 3.17.2,
schema revision SCHEMA_REVISION), with MLflow's column types, keys and constraint names, and what the
installed MLflow defines that a write must match (its schema revisions, its random run names), read
from its files. A store is written through these tables at a revision in KNOWN_GOOD, or at any other whose
tables `schema_difference()` finds as radt writes them (collectors/store/sqltracking.py).
"""

from __future__ import annotations

import ast
import importlib.util
import random
import re
from functools import cache
from pathlib import Path

import sqlalchemy as sa

# the alembic revision of MLflow 3.17.2's schema, which the tables below were read from
SCHEMA_REVISION = "dc11669786a5"
# revisions whose migrations since SCHEMA_REVISION leave radt's tables alone (read from MLflow's scripts):
# a store at one of them is written without inspecting it. Any other revision is inspected once per process.
KNOWN_GOOD = frozenset(
    {
        SCHEMA_REVISION,
        "f4a9b2c7d1e6",  # MLflow 3.18.0: its three migrations add skill, issue and MCP tables only
    }
)

# MLflow's limits (mlflow/utils/validation.py): longer param and tag values are truncated, longer keys refused
MAX_KEY_LENGTH = 250
MAX_FLOAT = 1.7976931348623157e308  # what MLflow stores for ±infinity
MAX_PARAM_VALUE_LENGTH = 6000
MAX_TAG_VALUE_LENGTH = 8000
MAX_EXPERIMENT_NAME_LENGTH = 500
MAX_EXPERIMENT_TAG_VALUE_LENGTH = 20000

DEFAULT_WORKSPACE = "default"
ACTIVE, DELETED = "active", "deleted"
RUN_STATUSES = ("SCHEDULED", "FAILED", "FINISHED", "RUNNING", "KILLED")
SOURCE_TYPES = ("NOTEBOOK", "JOB", "LOCAL", "UNKNOWN", "PROJECT")

metadata = sa.MetaData()

experiments = sa.Table(
    "experiments",
    metadata,
    sa.Column("experiment_id", sa.Integer, autoincrement=True),
    sa.Column("name", sa.String(256), nullable=False),
    sa.Column("workspace", sa.String(63), nullable=False, server_default=sa.text(f"'{DEFAULT_WORKSPACE}'")),
    sa.Column("artifact_location", sa.String(256), nullable=True),
    sa.Column("lifecycle_stage", sa.String(32)),
    sa.Column("creation_time", sa.BigInteger),
    sa.Column("last_update_time", sa.BigInteger),
    sa.CheckConstraint(sa.column("lifecycle_stage").in_([ACTIVE, DELETED]), name="experiments_lifecycle_stage"),
    sa.PrimaryKeyConstraint("experiment_id", name="experiment_pk"),
    sa.UniqueConstraint("workspace", "name", name="uq_experiments_workspace_name"),
)

experiment_tags = sa.Table(
    "experiment_tags",
    metadata,
    sa.Column("key", sa.String(250)),
    sa.Column("value", sa.Text, nullable=True),
    sa.Column("experiment_id", sa.Integer, sa.ForeignKey("experiments.experiment_id")),
    sa.PrimaryKeyConstraint("key", "experiment_id", name="experiment_tag_pk"),
)

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("run_uuid", sa.String(32), nullable=False),
    sa.Column("name", sa.String(250)),
    sa.Column("source_type", sa.String(20)),
    sa.Column("source_name", sa.String(500)),
    sa.Column("entry_point_name", sa.String(50)),
    sa.Column("user_id", sa.String(256), nullable=True),
    sa.Column("status", sa.String(20)),
    sa.Column("start_time", sa.BigInteger),
    sa.Column("end_time", sa.BigInteger, nullable=True),
    sa.Column("deleted_time", sa.BigInteger, nullable=True),
    sa.Column("source_version", sa.String(50)),
    sa.Column("lifecycle_stage", sa.String(20)),
    sa.Column("artifact_uri", sa.String(200)),
    sa.Column("experiment_id", sa.Integer, sa.ForeignKey("experiments.experiment_id")),
    sa.CheckConstraint(sa.column("source_type").in_(SOURCE_TYPES), name="source_type"),
    sa.CheckConstraint(sa.column("status").in_(RUN_STATUSES)),
    sa.CheckConstraint(sa.column("lifecycle_stage").in_([ACTIVE, DELETED]), name="runs_lifecycle_stage"),
    sa.PrimaryKeyConstraint("run_uuid", name="run_pk"),
)

tags = sa.Table(
    "tags",
    metadata,
    sa.Column("key", sa.String(250)),
    sa.Column("value", sa.String(8000), nullable=True),
    sa.Column("run_uuid", sa.String(32), sa.ForeignKey("runs.run_uuid")),
    sa.PrimaryKeyConstraint("key", "run_uuid", name="tag_pk"),
    sa.Index("index_tags_run_uuid", "run_uuid"),
)

params = sa.Table(
    "params",
    metadata,
    sa.Column("key", sa.String(250)),
    sa.Column("value", sa.String(8000), nullable=False),
    sa.Column("run_uuid", sa.String(32), sa.ForeignKey("runs.run_uuid")),
    sa.PrimaryKeyConstraint("key", "run_uuid", name="param_pk"),
    sa.Index("index_params_run_uuid", "run_uuid"),
)

metrics = sa.Table(
    "metrics",
    metadata,
    sa.Column("key", sa.String(250)),
    sa.Column("value", sa.Float(precision=53), nullable=False),
    sa.Column("timestamp", sa.BigInteger),
    sa.Column("step", sa.BigInteger, nullable=False),
    sa.Column("is_nan", sa.Boolean(create_constraint=True), nullable=False),
    sa.Column("run_uuid", sa.String(32), sa.ForeignKey("runs.run_uuid")),
    sa.PrimaryKeyConstraint("key", "timestamp", "step", "run_uuid", "value", "is_nan", name="metric_pk"),
    sa.Index("index_metrics_run_uuid", "run_uuid"),
    sa.Index("index_metrics_run_uuid_key_step", "run_uuid", "key", "step"),
)

latest_metrics = sa.Table(
    "latest_metrics",
    metadata,
    sa.Column("key", sa.String(250)),
    sa.Column("value", sa.Float(precision=53), nullable=False),
    sa.Column("timestamp", sa.BigInteger),
    sa.Column("step", sa.BigInteger, nullable=False),
    sa.Column("is_nan", sa.Boolean(create_constraint=True), nullable=False),
    sa.Column("run_uuid", sa.String(32), sa.ForeignKey("runs.run_uuid")),
    sa.PrimaryKeyConstraint("key", "run_uuid", name="latest_metric_pk"),
    sa.Index("index_latest_metrics_run_uuid", "run_uuid"),
)

alembic_version = sa.Table(
    "alembic_version",
    metadata,
    sa.Column("version_num", sa.String(32), nullable=False),
    sa.PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
)


# MLflow's tables that radt reads and writes (alembic_version is only read)
TOUCHED = (experiments, experiment_tags, runs, tags, params, metrics, latest_metrics)


# --- whether a store's tables are radt's --------------------------------------------------------


def _kind(column_type: sa.types.TypeEngine) -> str:
    """A column type as what radt's values need of it; lengths are left out (MLflow widens them, and its own
    migrations made runs.status VARCHAR(9) where its model says 20)."""
    for kind, family in (("bool", sa.Boolean), ("bigint", sa.BigInteger), ("int", sa.Integer), ("float", sa.Float), ("text", sa.String)):
        if isinstance(column_type, family):
            return kind
    return type(column_type).__name__


def _fits(mine: str, theirs: str) -> bool:
    return mine == theirs or (mine, theirs) == ("int", "bigint")


def schema_difference(conn: sa.Connection) -> str | None:
    """The first way the store's tables differ from what radt reads and writes (None: radt's rows fit), as one
    phrase naming the table and column; one inspection (a few catalogue queries) of TOUCHED."""
    inspector = sa.inspect(conn)
    names = [table.name for table in TOUCHED]
    found = {name: columns for (_schema, name), columns in inspector.get_multi_columns(filter_names=names).items()}
    keys = {name: pk for (_schema, name), pk in inspector.get_multi_pk_constraint(filter_names=names).items()}
    for table in TOUCHED:
        if table.name not in found:
            return f"table {table.name} is missing"
        live = {column["name"]: column for column in found[table.name]}
        for column in table.c:
            theirs = live.get(column.name)
            if theirs is None:
                return f"column {table.name}.{column.name} is missing"
            if not _fits(_kind(column.type), _kind(theirs["type"])):
                return f"column {table.name}.{column.name} is {theirs['type']}, radt writes {column.type}"
            if column.nullable and not column.primary_key and not theirs["nullable"]:
                return f"column {table.name}.{column.name} is NOT NULL, radt may leave it empty"
        for name, theirs in live.items():
            if name not in table.c and not theirs["nullable"] and theirs.get("default") is None and theirs.get("autoincrement") is not True:
                return f"column {table.name}.{name} is new and NOT NULL without a default, radt does not write it"
        key = sorted(keys.get(table.name, {}).get("constrained_columns") or [])
        if key != sorted(table.primary_key.columns.keys()):
            return f"the primary key of {table.name} is ({', '.join(key)}), radt's is ({', '.join(table.primary_key.columns.keys())})"
    return None


# --- what the installed MLflow defines, read from its files ---------------------------------------


def mlflow_dir() -> Path:
    """The installed MLflow package's folder (found, not imported)."""
    spec = importlib.util.find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("MLflow is not installed in radt's environment; pip install mlflow")
    return Path(next(iter(spec.submodule_search_locations)))


@cache
def schema_revisions() -> tuple[str, frozenset[str]]:
    """The installed MLflow's newest schema revision and all of its revisions, from its alembic scripts."""
    known: dict[str, set[str]] = {}
    for script in (mlflow_dir() / "store" / "db_migrations" / "versions").glob("*.py"):
        text = script.read_text(encoding="utf-8")
        revision = re.search(r"^revision\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
        down = re.search(r"^down_revision\s*=\s*(.+)$", text, re.M)
        if revision:
            known[revision.group(1)] = set(re.findall(r"['\"]([^'\"]+)['\"]", down.group(1))) if down else set()
    parents = set().union(*known.values()) if known else set()
    heads = sorted(set(known) - parents)
    if len(heads) != 1:
        raise RuntimeError(f"the installed MLflow's migration scripts have {len(heads)} heads ({', '.join(heads)}); reinstall mlflow")
    return heads[0], frozenset(known)


@cache
def _run_name_words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """MLflow's adjectives and nouns for run names (mlflow/utils/name_utils.py)."""
    tree = ast.parse((mlflow_dir() / "utils" / "name_utils.py").read_text(encoding="utf-8"))
    lists = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id in ("_GENERATOR_PREDICATES", "_GENERATOR_NOUNS"):
            lists[target.id] = tuple(ast.literal_eval(node.value))
    return lists["_GENERATOR_PREDICATES"], lists["_GENERATOR_NOUNS"]


def random_run_name() -> str:
    """A run name as MLflow gives a run created without one: 'adjective-noun-NNN', at most 20 characters."""
    predicates, nouns = _run_name_words()
    name = ""
    for _ in range(10):
        name = f"{random.choice(predicates).lower()}-{random.choice(nouns).lower()}-{random.randint(0, 10**3)}"
        if len(name) <= 20:
            return name
    return name[:20]


def check_store(engine: sa.Engine, shown: str, error: type[Exception]) -> sa.Engine:
    """The engine, once it answers and holds MLflow's runs table; else `error`, one line naming the store (`shown`,
    its URI without password) and the fix, and the engine disposed. For radt's maintenance commands."""
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table(runs.name):
                raise error(f"{shown} holds no MLflow store; give the store's URI (--store)")
    except sa.exc.SQLAlchemyError as exc:
        engine.dispose()
        text = str(getattr(exc, "orig", None) or exc).strip()
        cause = text.splitlines()[0] if text else type(exc).__name__
        raise error(f"store {shown} unreachable ({cause}); check the URI (--store) and that the database is up") from None
    except error:
        engine.dispose()
        raise
    return engine


def dialect_insert(dialect: str, what: str):
    """The dialect's INSERT (its ON CONFLICT clauses): radt's own tables are on PostgreSQL and SQLite stores only; `what`
    names the table for the error."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        raise ValueError(f"{what} support PostgreSQL and SQLite stores, not {dialect}")
    return insert
