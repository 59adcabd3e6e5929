"""The page shown in place of a page whose store cannot be read, the same on every page: unreachable when it loads, or
past the request's deadline while its layout reads the store (a frozen database, a locked table), with why and what to do.

A frozen PostgreSQL made Explore, Live and Cluster blank: their layout's read ended at the deadline as an HTTP 503 that
the browser does not show (tests/test_request_deadline.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable

from dash import html

from radt.app.db import deadline
from radt.app.db.state import store_error
from radt.pages.parts import ids

UNREACHABLE = "Start the database (or fix the URI: python app.py --store URI), then reload this page."


def page(reason: str, fix: str = UNREACHABLE) -> html.Div:
    """The reason and what to do about it: start the store, or (a store that is there but did not answer) wait for it."""
    return html.Div(
        [
            html.H2("The tracking store cannot be read"),
            html.P(reason, id=ids.STORE_ERROR_REASON),
            html.P(fix),
        ],
        className="store-error",
    )


def reads_store(layout: Callable) -> Callable:
    """A page's layout function that reads the store: the unreadable page in its place when the store cannot be read."""

    @functools.wraps(layout)
    def guarded(*args, **kwargs):
        error = store_error()
        if error:
            return page(error)
        try:
            return layout(*args, **kwargs)
        except Exception as exc:
            if not deadline.timed_out(exc):
                raise
            return page(deadline.store_message(exc), f"{deadline.RELOAD}.")

    return guarded
