"""A loopback TCP proxy the tests can stop and restart, to take a real database (or an mlflow server) away mid-run.

Four ways for a store to misbehave: `stop()` refuses new connections and closes open ones (FIN, a
server shut down); `reset()` aborts open ones with RST (a crashed host, a firewall's reject);
`blackhole()` keeps every connection open and accepts new ones but forwards nothing in either
direction, so calls hang without an error (a hung server, a network partition) until `resume()`
lets the held bytes through, as a healed partition would.
"""

from __future__ import annotations

import socket
import struct
import threading


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target; `stop()`, `reset()` and `blackhole()` take it away, `resume()` ends a blackhole."""

    def __init__(self, target_host: str, target_port: int, port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.port = port
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._flowing = threading.Event()  # cleared while blackholed
        self._flowing.set()
        self._aborted: set[int] = set()  # id() of sockets reset() aborts: their pipes close them instead of a FIN

    def start(self) -> TcpProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(client)
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        """Connect upstream once the proxy forwards (a connection made in a blackhole waits, unanswered)."""
        self._flowing.wait()
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        with self._lock:
            self._conns.append(upstream)
        threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self._flowing.wait()  # a blackhole holds what arrived
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    if id(s) in self._aborted:
                        s.close()  # SO_LINGER 0: the last close sends RST
                    else:
                        s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def blackhole(self) -> None:
        """From now on forward nothing and answer no new connection; every socket stays open."""
        self._flowing.clear()

    def resume(self) -> None:
        """End a blackhole: what was held goes through, waiting connections reach the target."""
        self._flowing.set()

    def reset(self) -> None:
        """Abort every open connection with RST (SO_LINGER 0); new connections are still accepted."""
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            self._aborted.add(id(conn))
            try:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.shutdown(socket.SHUT_RD)  # wakes the thread reading it (Linux sends nothing for SHUT_RD)
            except OSError:
                pass
            conn.close()

    def stop(self) -> None:
        self._flowing.set()  # threads held by a blackhole see their sockets closed and end
        if self._listener is not None:
            try:  # wakes the thread blocked in accept(); close() alone leaves the port listening
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
