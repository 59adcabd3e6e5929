"""`radt dashboard [--store URI] [--host 127.0.0.1] [--port 8050]` (also `python app.py` in a checkout).

For several users: `gunicorn -w 4 -b 0.0.0.0:8050 'radt.app:server'` with RADT_CACHE=redis://127.0.0.1:6379/0: the workers
share the series and the kept chart responses of ended runs (app/responses.py; 50 users at p95 0.23 s, docs/PERFORMANCE.md).
"""

from __future__ import annotations

import sys

from radt.app.dashboard import create_app
from radt.app.state import STATE
from radt.cli import OneLineParser
from radt.settings import display_uri


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="radt dashboard", description="radt dashboard")  # a mistake in one line, like radt's commands
    parser.add_argument("--store", help="tracking URI (default: MLFLOW_TRACKING_URI, else ~/.radt/mlflow.db)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8050)
    parser.add_argument("--cache", help="simple (default), null, or a redis:// URL")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    try:
        dashboard = create_app(args.store, args.cache)
    except ValueError as exc:  # a bad --cache / RADT_CACHE, or a store radt cannot use (app/config.store_uri)
        print(f"radt dashboard: {exc}", file=sys.stderr)
        return 2
    where = display_uri(STATE.store_uri)
    print(f"radt dashboard on http://{args.host}:{args.port}/ (store {where})", file=sys.stderr)
    if STATE.error:
        print(f"radt dashboard: {STATE.error} (the page says so until it can read the store)", file=sys.stderr)
    try:
        dashboard.run(host=args.host, port=args.port, debug=args.debug)
    except OSError as exc:  # the port is taken, or the address is not this machine's
        print(f"radt dashboard: cannot listen on {args.host}:{args.port} ({exc.strerror or exc}); pick another with --port", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
