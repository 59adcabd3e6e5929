"""The background writer: queues points, writes them in batches, spools to disk while the store is away.

The sampler only appends to an in-memory queue. While the store fails, batches go in order
to a spool file (JSON lines) in the run's local folder; every few seconds the spool is
replayed, oldest first, and new batches queue behind it, so the store ends up with every
point in order. A spool left at exit is replayed later by `radt sync`.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from collectors.command import first_line
from collectors.points import Point
from collectors.stores import MetricStore

log = logging.getLogger("radt")

SPOOL_NAME = "spool.jsonl"


class Spool:
    """An append-only file of point batches; replay sends them in order and trims what was sent."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __bool__(self) -> bool:
        return self.path.exists() and self.path.stat().st_size > 0

    def append(self, points: Sequence[Point]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps([list(p) for p in points]) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def replay(self, write: Callable[[Sequence[Point]], None]) -> int:
        """Send every spooled batch; on failure keep the unsent ones and re-raise. Returns points sent."""
        if not self:
            return 0
        lines = self.path.read_text(encoding="utf-8").splitlines()
        sent = 0
        for index, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                batch = [Point(*item) for item in json.loads(line)]
            except (ValueError, TypeError):  # a torn last line from a crash: nothing to send
                continue
            try:
                write(batch)
            except Exception:
                self._keep(lines[index:])
                raise
            sent += len(batch)
        self.path.unlink(missing_ok=True)
        return sent

    def _keep(self, lines: list[str]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        os.replace(tmp, self.path)


class MetricWriter:
    """Writes queued points for one run from a daemon thread; `close()` drains with a bounded wait."""

    def __init__(
        self,
        store: MetricStore,
        run_id: str,
        spool_path: Path,
        flush_interval: float = 1.0,
        retry_interval: float = 2.0,
        report: Callable[[str], None] = print,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.spool = Spool(spool_path)
        self.flush_interval = flush_interval
        self.retry_interval = retry_interval
        self.report = report
        self.written = 0
        self._queue: queue.SimpleQueue[list[Point] | None] = queue.SimpleQueue()
        self._down_since: float | None = None
        self._next_retry = 0.0
        self._thread = threading.Thread(target=self._run, name="radt-writer", daemon=True)
        self._stopping = False

    def start(self) -> MetricWriter:
        self._thread.start()
        return self

    def put(self, points: list[Point]) -> None:
        """Called by the sampler; never blocks."""
        self._queue.put(points)

    @property
    def healthy(self) -> bool:
        return self._down_since is None

    def _drain(self, wait: float) -> list[Point] | None:
        """Everything queued within `wait` seconds; None once close() was asked for and the queue is empty."""
        batch: list[Point] = []
        deadline = time.monotonic() + wait
        while True:
            timeout = max(0.0, deadline - time.monotonic())
            try:
                item = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
            except queue.Empty:
                return batch
            if item is None:
                self._stopping = True
                while True:  # take what is left without waiting
                    try:
                        rest = self._queue.get_nowait()
                    except queue.Empty:
                        return batch
                    if rest:
                        batch.extend(rest)
            batch.extend(item)
            if len(batch) >= 20000:
                return batch

    def _run(self) -> None:
        while not self._stopping:
            batch = self._drain(self.flush_interval)
            self._deliver(batch)

    def _write(self, points: Sequence[Point]) -> None:
        self.store.write(self.run_id, points)
        self.written += len(points)

    def _deliver(self, batch: list[Point]) -> None:
        if self.spool:
            if batch:
                self.spool.append(batch)
            if time.monotonic() >= self._next_retry:
                self._replay()
            return
        if not batch:
            return
        try:
            self._write(batch)
        except Exception as exc:
            self.spool.append(batch)
            self._went_down(exc)

    def _replay(self) -> bool:
        try:
            sent = self.spool.replay(self._write)
        except Exception as exc:
            self._went_down(exc)
            return False
        if self._down_since is not None:
            self.report(f"radt: store is back after {time.monotonic() - self._down_since:.0f} s; {sent} spooled points written")
            self._down_since = None
        return True

    def _went_down(self, exc: Exception) -> None:
        self._next_retry = time.monotonic() + self.retry_interval
        if self._down_since is None:
            self._down_since = time.monotonic()
            self.report(f"radt: store unreachable ({first_line(exc)}); keeping samples in {self.spool.path} until it is back")

    def close(self, timeout: float = 60.0) -> bool:
        """Write everything still queued or spooled, waiting at most `timeout` s. True if nothing is left."""
        self._queue.put(None)
        self._thread.join()
        if not self.spool:
            return True
        self.report(f"radt: writing spooled samples before exit (up to {timeout:.0f} s; Ctrl-C leaves them for 'radt sync')")
        deadline = time.monotonic() + timeout
        try:
            while self.spool and time.monotonic() < deadline:
                if self._replay():
                    break
                time.sleep(min(self.retry_interval, max(0.0, deadline - time.monotonic())))
        except KeyboardInterrupt:
            pass
        return not self.spool
