"""Builds the Dash app: multi-page (pages/), one read engine on the store, flask-caching, kept and compressed responses."""

from __future__ import annotations

from pathlib import Path

import dash

from radt.app.db import deadline
from radt.app.db.state import STATE, connect_store
from radt.app.view.cache import CACHE, cache_config
from radt.app.web import artifacts, callbacks, health, responses
from radt.settings import display_uri, tracking_uri, url_prefix

ROOT = Path(__file__).resolve().parents[2]  # the checkout (or radt/ once installed): pages/ and assets/ beside app/


def create_app(store: str | None = None, cache: str | None = None) -> dash.Dash:
    """The dashboard on `store` (default: MLFLOW_TRACKING_URI, else the embedded SQLite file), served under RADT_URL_PREFIX."""
    prefix = url_prefix()  # before anything is built: a bad one is one line
    connect_store(tracking_uri(store))  # an unreachable store becomes a page, retried on reload
    app = dash.Dash(
        __name__,
        url_base_pathname=prefix,  # pages, assets, Dash's bundles and callbacks under it (a reverse proxy at https://host/radt/)
        use_pages=True,
        pages_folder=str(ROOT / "pages"),
        assets_folder=str(ROOT / "assets"),
        title="radt",
        suppress_callback_exceptions=True,
    )
    CACHE.init_app(app.server, config=cache_config(cache))
    deadline.install(app.server)  # first: every request's store reads end at RADT_REQUEST_TIMEOUT
    responses.install(app.server, app.csp_hashes, prefix)  # finished views from the cache as gzip bytes; large responses gzipped
    artifacts.install(app.server, prefix)  # /runs/<id>/artifacts: a run's logs and reports, wherever the run keeps them
    health.install(app.server, prefix)  # -/healthy and -/ready for a load balancer or Kubernetes
    callbacks.install(app.server, app)  # a callback request no browser sends: 400 with what is wrong, not a 500 inside Dash
    app.layout = dash.html.Div(
        [
            dash.html.Header(
                [
                    dash.html.Span("radt", className="brand"),
                    dash.html.Nav([dash.dcc.Link(page["name"], href=page["relative_path"], className="nav-link") for page in dash.page_registry.values()]),
                    dash.html.Span(display_uri(STATE.store_uri).split("@")[-1], className="store", title="tracking store"),  # never a password, nor the user
                ],
                className="topbar",
            ),
            dash.page_container,
        ]
    )
    return app
