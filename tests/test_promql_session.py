"""radt's Prometheus queries reuse one kept-alive connection: the `prometheus` listener asks every tick, and a new TCP
connection (and, behind TLS, a handshake) per query is load on the cluster's Prometheus for nothing. An HTTP/1.1 server
at the boundary records the client port of each request; the feature tests read a real Prometheus instead
(tests/support/prometheus.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from radt.collectors.sources.promql import PromUrlError, Series, check_label, check_url, query
from radt.errors import UserError

ANSWER = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {"__name__": "up"}, "value": [1780000000.5, "1"]}]}}


class _KeepAlive(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keeps the connection open between requests, as Prometheus' Go server does

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.server.client_ports.append(self.client_address[1])
        body = json.dumps(ANSWER).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        pass


@pytest.fixture
def api() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    server.daemon_threads = True
    server.client_ports = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_queries_reuse_one_connection(api):
    url = f"http://127.0.0.1:{api.server_address[1]}"
    answers = [query(url, "up") for _ in range(5)]
    assert answers == [[Series({"__name__": "up"}, [(1780000000500, 1.0)])]] * 5
    assert len(api.client_ports) == 5 and len(set(api.client_ports)) == 1, api.client_ports  # 5 queries, 1 connection


def test_a_bad_url_or_label_is_a_user_error():
    with pytest.raises(PromUrlError, match="^--prometheus 'ftp://p' is not a Prometheus server's http\\(s\\) URL; give e.g. --prometheus http://"):
        check_url("ftp://p")
    with pytest.raises(UserError, match="^RADT_PROMETHEUS_HOST_LABEL='host-name' is not a Prometheus label name"):
        check_label("host-name")
    assert issubclass(PromUrlError, ValueError)  # the callers that catch bad values with ValueError still do
