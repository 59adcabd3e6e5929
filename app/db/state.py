"""What the pages share at run time: the store URI, its read engine, and why it cannot be read."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

RETRY_SECONDS = 5.0  # an unreachable store is tried again at most this often, on a page load


@dataclass
class DashboardState:
    store_uri: str = ""
    engine: sa.Engine | None = None
    error: str | None = None  # why the store cannot be read, shown as a page instead of a traceback
    checked_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    extra: dict = field(default_factory=dict)


STATE = DashboardState()


def connect_store(uri: str) -> None:
    """Point the dashboard at `uri`: a read-only engine, or the one-line reason it cannot read it."""
    from radt.app.db.store import StoreUnreadable, check_store, make_read_engine
    from radt.settings import display_uri

    if STATE.engine is not None:
        STATE.engine.dispose()  # a retry, or another store: the old pool's connections go
    STATE.engine = None
    STATE.store_uri = uri
    STATE.checked_at = time.monotonic()
    missing = _missing_sqlite_file(uri)
    if missing:
        STATE.engine, STATE.error = None, f"no store at {missing} yet: fill it with `radt demo`, or track a run with `radt train.py`"
        return
    try:
        engine = make_read_engine(uri)
    except Exception as exc:  # a malformed URI, a missing driver: the user's to fix, shown on the page
        STATE.engine, STATE.error = None, f"cannot open the tracking store {display_uri(uri)}: {(str(exc).splitlines() or [type(exc).__name__])[0][:300]}"
        return
    try:
        check_store(engine)
    except StoreUnreadable as exc:
        STATE.engine, STATE.error = engine, str(exc)
        return
    STATE.engine, STATE.error = engine, None


def _missing_sqlite_file(uri: str) -> str | None:
    """The path of a sqlite:/// store whose file does not exist (the reader never creates one)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = Path(uri[len("sqlite:///") :].split("?", 1)[0]).expanduser()
    return None if path.exists() or str(path) == ":memory:" else str(path)


def store_error() -> str | None:
    """None when the store can be read; else the reason, after trying again (the database may be back)."""
    if STATE.error is None and STATE.engine is not None:
        return None
    with STATE.lock:
        if STATE.error is not None and time.monotonic() - STATE.checked_at >= RETRY_SECONDS:
            connect_store(STATE.store_uri)
    return STATE.error
