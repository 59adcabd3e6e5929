"""Process-wide state a test may change for the tests after it, put back as it was.

os.environ (radt's connect() sets MLflow's HTTP limits, an export BROWSER_PATH), the working directory,
signal handlers, logging levels, radt's record of the variables it added, the dashboard's store and cache
(radt.app.db.state.STATE, radt.app.view.cache.CACHE), Dash's page registry. conftest.py wraps every test in kept().
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def kept_environ():
    """os.environ as it was, whatever the code inside sets (radt's connect() adds MLflow's HTTP limits)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for name in (set(os.environ) | set(saved)) - {"PYTEST_CURRENT_TEST"}:  # pytest's own, which it sets per phase
            if name not in saved:
                del os.environ[name]
            elif os.environ.get(name) != saved[name]:
                os.environ[name] = saved[name]


@contextmanager
def sqlite_home(home: Path, sqlite_template: Path) -> Iterator[str]:
    """A store a module's tests share, written in this process: RADT_HOME=`home` holding a copy of the SQLite template
    (MLflow's schema), no MLFLOW_TRACKING_URI; yields its URI. The environment is put back on leaving."""
    import pytest

    with kept_environ(), pytest.MonkeyPatch.context() as mp:
        mp.setenv("RADT_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        shutil.copy(sqlite_template, home / "store.db")
        yield f"sqlite:///{home / 'store.db'}"


SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]


def _dashboard_state() -> dict[str, dict | None]:
    """The dashboard's read engine and store (radt.app.db.state.STATE) and its cache (radt.app.view.cache.CACHE), where imported."""
    state, cache = sys.modules.get("radt.app.db.state"), sys.modules.get("radt.app.view.cache")
    return {
        "state": {k: dict(v) if isinstance(v, dict) else v for k, v in vars(state.STATE).items()} if state else None,
        "cache": dict(vars(cache.CACHE)) if cache else None,
    }


def _restore_dashboard_state(saved: dict[str, dict | None]) -> None:
    """As saved; what the test imported first goes back to how it was made (a dashboard pointed at no store)."""
    state, cache = sys.modules.get("radt.app.db.state"), sys.modules.get("radt.app.view.cache")
    if state is not None:
        before = saved["state"] if saved["state"] is not None else vars(type(state.STATE)())
        engine = state.STATE.engine
        if engine is not None and engine is not before.get("engine"):
            engine.dispose()  # the test's connections go with it
        vars(state.STATE).clear()
        vars(state.STATE).update(before)
    if cache is not None:
        before = saved["cache"] if saved["cache"] is not None else vars(type(cache.CACHE)())
        vars(cache.CACHE).clear()
        vars(cache.CACHE).update(before)


def _logging_levels() -> dict[str, int]:
    loggers = [(name, logger) for name, logger in logging.Logger.manager.loggerDict.items() if isinstance(logger, logging.Logger)]
    return {"": logging.getLogger().level, **{name: logger.level for name, logger in loggers}}


def _added_env() -> set | None:
    tracking = sys.modules.get("radt.collectors.store.tracking")
    return set(tracking.ADDED_ENV) if tracking is not None and hasattr(tracking, "ADDED_ENV") else None


@contextmanager
def kept() -> Iterator[None]:
    """Everything above as it was before the block, whatever the block changed."""
    cwd = os.getcwd()
    handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}
    levels, added = _logging_levels(), _added_env()
    dashboard_state = _dashboard_state()
    dash = sys.modules.get("dash")
    pages = dict(dash.page_registry) if dash is not None else None
    try:
        with kept_environ():
            yield
    finally:
        if os.getcwd() != cwd:
            os.chdir(cwd)
        for sig, handler in handlers.items():
            if signal.getsignal(sig) is not handler and handler is not None:
                signal.signal(sig, handler)
        for name, level in _logging_levels().items():
            if level != levels.get(name, logging.NOTSET):
                logging.getLogger(name or None).setLevel(levels.get(name, logging.NOTSET))
        tracking = sys.modules.get("radt.collectors.store.tracking")
        if tracking is not None and hasattr(tracking, "ADDED_ENV"):
            tracking.ADDED_ENV.clear()
            tracking.ADDED_ENV.update(added or ())
        _restore_dashboard_state(dashboard_state)
        dash = sys.modules.get("dash")
        if dash is not None and dict(dash.page_registry) != (pages or {}):
            dash.page_registry.clear()
            dash.page_registry.update(pages or {})


@contextmanager
def dashboard_reads(uri: str, monkeypatch) -> Iterator[object]:
    """The dashboard's reads (radt.app.db.state.STATE) pointed at `uri` through a fresh simple cache, as `python app.py` would
    have them; yields the read engine, disposed at the end (kept() puts STATE and CACHE back after the test)."""
    from flask import Flask

    from radt.app.db.state import STATE
    from radt.app.db.store import make_read_engine
    from radt.app.view.cache import CACHE, cache_config

    CACHE.init_app(Flask(__name__), config=cache_config("simple"))
    CACHE.clear()
    engine = make_read_engine(uri)
    monkeypatch.setattr(STATE, "engine", engine)
    monkeypatch.setattr(STATE, "store_uri", uri)
    try:
        yield engine
    finally:
        engine.dispose()
