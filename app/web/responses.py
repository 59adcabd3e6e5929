"""Finished views served from the cache as ready gzip bytes, and the dashboard's responses compressed.

The draw callback's whole response (figure, summary, view) for a view whose runs have all ended is kept,
gzip-compressed, under the store and the request's body (which holds the whole view). The next identical
request gets those bytes before Dash, Plotly or the series cache are touched, once one aggregate query says
the view's experiments are as they were: a run finished, started, was deleted or restored, and the view is
drawn again. A view with a running run (or one that ended in the last seconds) is never kept, so a live run
is never served staler than the series cache's poll interval.
"""

from __future__ import annotations

import gzip
import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import flask
import sqlalchemy as sa

from radt.app.db.state import STATE
from radt.app.db.store import ACTIVE, LIVE_STATUSES, RUNS
from radt.app.view import views
from radt.app.view.cache import CACHE, COMPRESS, LISTING_TIMEOUT, RESPONSE_CACHE, RESPONSE_TIMEOUT, RUNNING_TIMEOUT
from radt.settings import FRAME_ANCESTORS

CALLBACK_PATH = "_dash-update-component"
SETTLED_MS = (LISTING_TIMEOUT + RUNNING_TIMEOUT + 3) * 1000  # a run ended this long ago: no cached listing or series still holds it running
GZIP_LEVEL = 6
MIN_SIZE = 1024  # smaller bodies are not worth a Content-Encoding
COMPRESSIBLE = ("application/json", "text/html", "text/css", "application/javascript", "text/javascript", "image/svg+xml")
STATIC_FOLDERS = ("_dash-component-suites/", "assets/")  # Dash's bundles and radt's assets (plotly-radt.min.js is 1.5 MB): compressed once per worker
_static: dict[tuple[str, int, str | None], bytes] = {}


@dataclass
class Entry:
    """A cached draw response: what the store looked like when it was drawn, and the gzip bytes."""

    experiments: list[str]
    fingerprint: str
    body: bytes  # gzip
    mimetype: str


HIT_HEADER = "X-Radt-Cache"  # "hit" on a response served from the cache (the tests and the benchmark read it)
FINGERPRINT_SECONDS = 1.0  # a worker asks the store again at most this often per set of experiments (within the 2 s poll interval)
LOCAL_ENTRIES = 16  # kept responses a worker also holds itself: a hit then costs no Redis read of its ~300 kB
_fingerprints: dict[tuple[str, ...], tuple[float, str]] = {}
_local: OrderedDict[str, Entry] = OrderedDict()
_local_lock = threading.Lock()  # `radt dashboard` serves requests on threads


def render(view: views.View) -> views.Rendered:
    """views.render, and (for a view of ended runs only) a note to the request that its response may be kept."""
    read_at = time.monotonic()
    fingerprint = store_fingerprint(view.experiments) if RESPONSE_CACHE.get() and STATE.engine is not None else None
    rendered = views.render(view)
    if fingerprint is not None and flask.has_request_context() and _settled(rendered):
        flask.g.radt_response = (list(view.experiments), fingerprint)
        _fingerprints[tuple(view.experiments)] = (read_at, fingerprint)  # this worker's hits compare with what it drew
    return rendered


def _settled(rendered: views.Rendered) -> bool:
    """Every drawn run ended (with an end time) long enough ago that no cached piece of it can still be from while it ran."""
    runs = rendered.runs
    if runs.empty:
        return False
    now_ms = time.time() * 1000
    ended = ~runs["status"].isin(LIVE_STATUSES) & runs["end_time"].notna()
    return bool(ended.all()) and bool((runs["end_time"] < now_ms - SETTLED_MS).all())


def current_fingerprint(experiment_ids: list[str]) -> str:
    """store_fingerprint, asked of the store at most every FINGERPRINT_SECONDS per worker and set of experiments."""
    memo = tuple(experiment_ids)
    now = time.monotonic()
    seen = _fingerprints.get(memo)
    if seen is None or now - seen[0] > FINGERPRINT_SECONDS:
        if len(_fingerprints) > 1000:
            _fingerprints.clear()
        seen = _fingerprints[memo] = (now, store_fingerprint(experiment_ids))
    return seen[1]


def store_fingerprint(experiment_ids: list[str]) -> str:
    """One row summing up the experiments' runs (how many, how many live, their end and start times): any run that
    starts, ends, is deleted or restored in them changes it. Also the summary's "alone" baselines depend on them."""
    ids = [int(e) for e in experiment_ids if str(e).isdigit()]
    if not ids:
        return "none"
    r = RUNS
    live = sa.func.sum(sa.case((r.c.status.in_(LIVE_STATUSES), 1), else_=0))
    stmt = sa.select(
        sa.func.count(r.c.run_uuid), live, sa.func.sum(sa.func.coalesce(r.c.end_time, 0)), sa.func.max(r.c.start_time), sa.func.max(r.c.end_time)
    ).where(r.c.experiment_id.in_(ids), r.c.lifecycle_stage == ACTIVE)
    with STATE.engine.connect() as conn:
        row = conn.execute(stmt).one()
    return "|".join(str(v) for v in row)


# the draw response's shape (2: #23's table legend and trace meta; 3: #52's colours by the view's order); a shared Redis never serves an older one
RESPONSE_FORMAT = 3


def _key() -> str:
    digest = hashlib.sha1(STATE.store_uri.encode() + b"\0" + flask.request.get_data(cache=True)).hexdigest()
    return f"response:{RESPONSE_FORMAT}:{digest}"


def _accepts_gzip() -> bool:
    return "gzip" in flask.request.headers.get("Accept-Encoding", "").lower()


def serve_cached():
    """before_request: the kept response of this exact callback request, if its experiments have not changed since."""
    if flask.request.method != "POST" or not flask.request.path.endswith(CALLBACK_PATH) or not RESPONSE_CACHE.get() or STATE.engine is None:
        return None
    key = _key()
    entry = _local.get(key)
    if entry is None:
        entry = CACHE.get(key)
        if not isinstance(entry, Entry):
            return None
        _remember(key, entry)
    try:
        if current_fingerprint(entry.experiments) != entry.fingerprint:
            _local.pop(key, None)
            return None
    except sa.exc.SQLAlchemyError:
        return None  # the store is away: let the callback say so
    if _accepts_gzip() and COMPRESS.get():
        response = flask.Response(entry.body, mimetype=entry.mimetype)
        response.headers["Content-Encoding"] = "gzip"
    else:
        response = flask.Response(gzip.decompress(entry.body), mimetype=entry.mimetype)
    response.headers["Vary"] = "Accept-Encoding"
    response.headers[HIT_HEADER] = "hit"
    return response


def keep_and_compress(response: flask.Response) -> flask.Response:
    """after_request: keep a draw response marked by render(), and gzip what is worth it for a client that accepts it."""
    marked = flask.g.pop("radt_response", None)
    static = flask.request.path.startswith(flask.current_app.config["RADT_STATIC_PREFIXES"])
    if static and response.direct_passthrough and response.status_code == 200 and response.mimetype in COMPRESSIBLE:
        response.direct_passthrough = False  # an asset file (Flask's send_from_directory): read, then kept gzipped below
        response.make_sequence()
    if response.status_code != 200 or response.direct_passthrough or response.headers.get("Content-Encoding") or response.is_streamed:
        return response
    compressible = response.mimetype in COMPRESSIBLE
    if marked is not None and compressible:
        packed = gzip.compress(response.get_data(), GZIP_LEVEL)
        experiments, fingerprint = marked
        entry = Entry(experiments, fingerprint, packed, response.mimetype)
        CACHE.set(_key(), entry, timeout=RESPONSE_TIMEOUT)
        _remember(_key(), entry)
        response.headers[HIT_HEADER] = "miss"
        return _encoded(response, packed)
    if not compressible or not COMPRESS.get() or not _accepts_gzip():
        return response
    body = response.get_data()
    if len(body) < MIN_SIZE:
        return response
    if static:
        # the file as served (path, size, validator), never the query string: a client choosing ?m=1, ?m=2, ... gets the one entry
        memo = (flask.request.path, len(body), response.get_etag()[0])
        if memo not in _static:
            _static[memo] = gzip.compress(body, GZIP_LEVEL)
        response = _encoded(response, _static[memo])
        if response.headers.get("Content-Encoding") == "gzip":
            response.headers.pop("Accept-Ranges", None)  # a range would count the file's bytes, not these
            tag, weak = response.get_etag()
            if tag and not weak:
                response.set_etag(tag, weak=True)  # the file's validator, weak: the same asset in another encoding (304s still match)
        return response
    return _encoded(response, gzip.compress(body, GZIP_LEVEL))


def _remember(key: str, entry: Entry) -> None:
    """Keep the entry in this worker too (the newest LOCAL_ENTRIES); each use still checks its fingerprint."""
    with _local_lock:
        _local[key] = entry
        _local.move_to_end(key)
        while len(_local) > LOCAL_ENTRIES:
            _local.popitem(last=False)


def _encoded(response: flask.Response, packed: bytes) -> flask.Response:
    """The response with the gzip body, where the client takes gzip (else as it was)."""
    response.headers["Vary"] = "Accept-Encoding"
    if not COMPRESS.get() or not _accepts_gzip():
        return response
    response.set_data(packed)
    response.headers["Content-Encoding"] = "gzip"
    return response


SAFE_HEADERS = {
    "X-Content-Type-Options": "nosniff",  # a run's log served as text/plain is never read as HTML, whatever it holds
    "Referrer-Policy": "same-origin",  # a link in a run's artifacts page does not tell another site the dashboard's addresses
}


def frame_headers(ancestors: str) -> dict[str, str]:
    """Who may frame the dashboard (RADT_FRAME_ANCESTORS): a page of another site framing it could lay its own buttons
    over the dashboard's and take a user's clicks. CSP for today's browsers; X-Frame-Options for old ones, where it can say
    the same (it names no other origin). object-src and base-uri: no plugin, and no <base> that moves the page's scripts."""
    ancestors = " ".join(ancestors.split())
    headers = {"Content-Security-Policy": f"frame-ancestors {ancestors}; object-src 'none'; base-uri 'self'"}
    if ancestors in ("'self'", "'none'"):
        headers["X-Frame-Options"] = "SAMEORIGIN" if ancestors == "'self'" else "DENY"
    return headers


def script_headers(headers: dict[str, str], inline_scripts: Sequence[str]) -> dict[str, str]:
    """HEADERS with CSP's script-src: scripts from the dashboard's own origin, and of the inline ones only those Dash
    wrote (its renderer's start and the pages' clientside callbacks, by their hashes). A script that a run's name, a
    param or a log smuggled into the page as HTML is then never run, even where a component renders it as markup."""
    policy = f"{headers['Content-Security-Policy']}; script-src 'self' {' '.join(inline_scripts)}".rstrip()
    return {**headers, "Content-Security-Policy": policy}


def safe_headers(headers: Callable[[], dict[str, str]]) -> Callable[[flask.Response], flask.Response]:
    """An after_request hook giving every response, cached and compressed ones included, `headers()` (SAFE_HEADERS and the
    framing and script rules of the server it is installed on)."""

    def add(response: flask.Response) -> flask.Response:
        for name, value in headers().items():
            response.headers.setdefault(name, value)
        return response

    return add


def install(server: flask.Flask, inline_scripts: Callable[[], Sequence[str]], prefix: str = "/") -> None:
    """Hook the cache, the compression and the safe headers into the dashboard's Flask server (RADT_FRAME_ANCESTORS read
    now: the dashboard checked the settings before it built the server). INLINE_SCRIPTS: the CSP hashes of the inline
    scripts Dash writes into its page (dash.Dash.csp_hashes), asked at each response (nine hashes of a few lines, ~20
    µs): Dash adds one of its own (the pages' title) when it sets itself up, at its first request. PREFIX: the path the
    dashboard is served under (RADT_URL_PREFIX), where its static files are."""
    server.config["RADT_STATIC_PREFIXES"] = tuple(prefix + folder for folder in STATIC_FOLDERS)
    server.before_request(serve_cached)
    server.after_request(keep_and_compress)
    framing = SAFE_HEADERS | frame_headers(FRAME_ANCESTORS.get())
    server.after_request(safe_headers(lambda: script_headers(framing, inline_scripts())))
