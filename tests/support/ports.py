"""A free TCP port on 127.0.0.1 (for a server to listen on, or as one nobody listens on)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def is_free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:PORT now (a port handed out earlier may have been taken since)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
