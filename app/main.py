"""`radt dashboard [--store URI] [--host 127.0.0.1] [--port 8050]` (also `python app.py` in a checkout).

For several users: `gunicorn -w 4 -b 0.0.0.0:8050 'radt.app:server'` with RADT_CACHE=redis://127.0.0.1:6379/0: the workers
share the series and the kept chart responses of ended runs (app/web/responses.py; 50 users at p95 0.23 s, docs/PERFORMANCE.md).
"""

from __future__ import annotations

import os
import socket
import sys

from radt.cli import OneLineParser
from radt.options import store_parent
from radt.settings import URL_PREFIX, check_settings, display_uri, is_url_prefix, url_prefix


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(parents=[store_parent()], prog="radt dashboard", description="radt dashboard")  # a mistake in one line, like radt's commands
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8050)
    parser.add_argument("--cache", help="simple (default), null, or a redis:// URL")
    parser.add_argument(
        "--url-prefix", metavar="PATH", help="serve under this path, for a reverse proxy that passes it on (/radt/ for https://host/radt/; RADT_URL_PREFIX)"
    )
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    if args.url_prefix is not None:
        if not is_url_prefix(args.url_prefix):
            print(f"radt dashboard: --url-prefix {args.url_prefix!r} is not {URL_PREFIX.accepted}", file=sys.stderr)
            return 2
        os.environ["RADT_URL_PREFIX"] = args.url_prefix  # as gunicorn's workers read it; checked with the other settings below
    problem = port_problem(args.host, args.port)
    if problem:
        print(f"radt dashboard: {problem}", file=sys.stderr)
        return 2
    # the dashboard's modules (Dash, Plotly, pandas: ~1 s) only once the arguments are good: a typo is answered at once
    from radt.app.db.state import STATE
    from radt.app.web.dashboard import create_app

    try:
        check_settings()  # every RADT_* variable, as `radt dashboard` does; `python app.py` comes here directly
        dashboard = create_app(args.store, args.cache)
    except ValueError as exc:  # a bad --cache / RADT_CACHE, or a store radt cannot use (app/config.store_uri)
        print(f"radt dashboard: {exc}", file=sys.stderr)
        return 2
    where = display_uri(STATE.store_uri)
    print(f"radt dashboard on http://{args.host}:{args.port}{url_prefix()} (store {where})", file=sys.stderr)
    if STATE.error:
        print(f"radt dashboard: {STATE.error} (the page says so until it can read the store)", file=sys.stderr)
    try:
        dashboard.run(host=args.host, port=args.port, debug=args.debug)
    except OSError as exc:  # the port is taken, or the address is not this machine's
        print(f"radt dashboard: cannot listen on {args.host}:{args.port} ({exc.strerror or exc}); pick another with --port", file=sys.stderr)
        return 1
    return 0


def port_problem(host: str, port: int) -> str | None:
    """Why the dashboard cannot listen on host:port (out of range, taken, not this machine's), asked before
    anything starts: Dash asserts on a bad port, and werkzeug prints several lines and exits for a taken one."""
    if not 1 <= port <= 65535:
        return f"--port {port} is not a TCP port; give one from 1 to 65535 (default 8050)"
    if "WERKZEUG_SERVER_FD" in os.environ:  # --debug's reloaded process: its parent holds the port and hands it over
        return None
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as werkzeug binds: a port in TIME_WAIT is free
            probe.bind(address)
    except OSError as exc:  # socket.gaierror too: a --host that does not resolve
        return f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick another with --port, or a --host of this machine"
    return None


if __name__ == "__main__":
    sys.exit(main())
