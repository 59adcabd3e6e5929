"""The background writer: queues points, writes them in batches, spools to disk while the store is away.

The sampler only appends to an in-memory queue. While the store fails, batches go in order
to a spool file (JSON lines) in the run's local folder; every few seconds the spool is
replayed, oldest first, and new batches queue behind it, so the store ends up with every
point in order. A spool left at exit is replayed later by `radt sync`.

Every store call has a deadline (settings.STORE_TIMEOUT): a call that does not return in time
counts as an outage, its batch goes to the spool and the writer carries on, so a hung server or
a partitioned network never stalls the writer, `--flush-timeout` or Ctrl-C. While a call waits
longer than the flush interval, its batch and what the sampler queues meanwhile go to the spool
every interval (the batch's line is trimmed again if the call then succeeds), so a SIGKILL, even
in the first seconds of a stall, loses at most about the last second of samples.
If the spool cannot be written (disk full, I/O error), points stay in memory up to
settings.MEMORY_POINTS, and `lost` counts what was neither written nor kept.

A run folder has one owner: the radt that records it holds `owner.lock` (flock) for its lifetime,
and only the owner appends to or trims the spool. `radt sync` takes over a folder only when it
gets the lock, i.e. when the owner is gone.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from radt import settings
from radt.collectors._common import first_line
from radt.collectors.store.stores import MetricStore, StoreNotAnswering
from radt.points import Point
from radt.rundir import write_whole

log = logging.getLogger("radt")

CHUNK = 2000  # points per store call where the store names no batch_points of its own
MAX_ABANDONED = 4  # store calls left hanging past their deadline; while this many hang, no new one starts


# -- store calls with a deadline ------------------------------------------------------------


class StoreTimeout(TimeoutError):
    """A store call did not return within its deadline; it is left to finish (or fail) on its own thread."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no reply within {seconds:g} s")
        self.seconds = seconds


def call_with_deadline(fn: Callable[[], object], timeout: float, expired: Callable[[], bool] = lambda: False, idle: Callable[[], None] | None = None):
    """fn()'s result, from a daemon thread; StoreTimeout after `timeout` s or once `expired()` is true.

    `idle` runs about every 0.1 s while the call is waiting (the writer spools its queue there).
    A call that overruns is abandoned: its thread ends when its socket does."""
    box: list[tuple[bool, object]] = []
    done = threading.Event()

    def target() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # handed to the caller
            box.append((False, exc))
        finally:
            done.set()

    if expired():
        raise StoreTimeout(0)
    thread = threading.Thread(target=target, name="radt-store-call", daemon=True)
    thread.start()
    end = time.monotonic() + timeout
    while not done.wait(max(0.0, min(0.1, end - time.monotonic()))):
        if time.monotonic() >= end or expired():
            raise StoreTimeout(timeout)
        if idle is not None:
            idle()
    ok, value = box[0]
    if ok:
        return value
    raise value


# -- the spool ------------------------------------------------------------------------------


class Spool:
    """An append-only file of point batches; replay sends them in order and trims what was sent.

    Only the run folder's owner appends or replays (the trim rewrites the file): see claim_run_dir."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sent = 0  # points the last replay() sent, also when it failed part way

    def __bool__(self) -> bool:
        try:
            return self.path.stat().st_size > 0
        except OSError:
            return False

    def append(self, points: Sequence[Point]) -> None:
        """One line, on disk (fsync) when this returns; OSError (disk full...) leaves the file as it was."""
        data = (json.dumps([list(p) for p in points]) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError:
                try:  # no torn line for the next append to glue itself to
                    os.ftruncate(fd, size)
                except OSError:
                    pass
                raise
        finally:
            os.close(fd)

    def points(self) -> int:
        """How many points the file holds (for messages)."""
        return len(self.read())

    def read(self) -> list[Point]:
        """Every spooled point, oldest first (a torn last line holds none)."""
        return [point for _, _, batch in self._batches(self._lines()) for point in batch]

    def _lines(self) -> list[str]:
        try:
            return self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []

    @staticmethod
    def _batches(lines: list[str], chunk: int = CHUNK) -> Iterator[tuple[int, int, list[Point]]]:
        """(first line, line after the last, points) of consecutive lines holding up to `chunk` points."""
        start, batch = 0, []
        for index, line in enumerate(lines):
            try:
                points = [Point(*item) for item in json.loads(line)] if line.strip() else []
            except (ValueError, TypeError):  # a torn last line from a crash: nothing to send
                points = []
            if batch and len(batch) + len(points) > chunk:
                yield start, index, batch
                start, batch = index, []
            batch.extend(points)
        if batch or start < len(lines):
            yield start, len(lines), batch

    def replay(self, write: Callable[[Sequence[Point]], None], chunk: int = CHUNK) -> int:
        """Send every spooled batch, up to `chunk` points a call; on failure keep the unsent ones and re-raise. Returns points sent.

        Lines appended while it runs (by the owner's own thread) are kept: the trim drops only the
        lines it sent, counted from the start of the file."""
        self.sent = 0
        lines = self._lines()
        for start, _end, batch in self._batches(lines, chunk):
            try:
                if batch:
                    write(batch)
            except BaseException:
                self.trim(start)
                raise
            self.sent += len(batch)
        self.trim(len(lines))
        return self.sent

    def trim(self, count: int) -> None:
        """Drop the first `count` lines. If the rewrite fails (disk full), they are sent again later: the stores take a point twice as once."""
        if count <= 0:
            return
        try:
            rest = self._lines()[count:]
            if not rest:
                self.path.unlink(missing_ok=True)
                return
            write_whole(self.path, "".join(line + "\n" for line in rest))
        except OSError:
            pass


# -- the writer -----------------------------------------------------------------------------


class MetricWriter:
    """Writes queued points for one run from a daemon thread; `close()` drains with a bounded wait."""

    def __init__(
        self,
        store: MetricStore,
        run_id: str,
        spool_path: Path,
        flush_interval: float = 1.0,
        retry_interval: float | None = None,
        report: Callable[[str], None] = print,
        store_timeout: float | None = None,
        memory_points: int | None = None,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.spool = Spool(spool_path)
        self.flush_interval = flush_interval
        self.retry_interval = settings.RETRY_INTERVAL.get() if retry_interval is None else retry_interval
        self.store_timeout = settings.STORE_TIMEOUT.get() if store_timeout is None else store_timeout
        self.memory_points = settings.MEMORY_POINTS.get() if memory_points is None else memory_points
        self.chunk = getattr(store, "batch_points", CHUNK)  # points per store call when more are queued
        self.report = report
        self.written = 0  # points the store took from this writer
        self.lost = 0  # points neither written nor kept (spool unwritable and memory full, or left at exit)
        self._held: list[list[Point]] = []  # batches the spool could not take, oldest first
        self._held_points = 0
        self._spool_error: str | None = None
        self._queue: queue.SimpleQueue[list[Point] | None] = queue.SimpleQueue()
        self._down_since: float | None = None
        self._next_retry = 0.0
        self._resent = [0, 0]  # points sent from the spool and from memory since the store went down
        self._last_spooled = 0.0
        self._abandoned = 0
        self._abandoned_lock = threading.Lock()
        self._deadline: float | None = None  # close()'s, monotonic
        self._cancel = threading.Event()
        self._failed: BaseException | None = None
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

    def _backlog(self) -> bool:
        return bool(self._held) or bool(self.spool)

    def _drain(self, wait: float) -> list[Point]:
        """Everything queued within `wait` seconds (at most `chunk` points); sets _stopping once close() asked and the queue is empty."""
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
            if len(batch) >= self.chunk:
                return batch

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._deliver(self._drain(self.flush_interval))
            self._final()
        except BaseException as exc:  # a bug must not end the writer silently: close() counts what is left as lost
            self._failed = exc
            self.report(f"radt: the metric writer stopped ({type(exc).__name__}: {first_line(exc)}); samples from now on are not kept")

    # -- store calls

    def _expired(self) -> bool:
        return self._cancel.is_set() or (self._deadline is not None and time.monotonic() >= self._deadline)

    def _write(self, points: Sequence[Point], direct: bool = False) -> bool:
        """One store call with a deadline; StoreTimeout when it overran (the store is reset for the next call).

        While the call waits, what the sampler queues goes to the spool every flush interval, and so does
        a `direct` batch itself (one not read from the spool) once it has waited that long: a SIGKILL in a
        stall then loses at most the last interval. Returns whether the batch is in the spool (written ahead)."""
        if self._abandoned >= MAX_ABANDONED:
            raise StoreTimeout(self.store_timeout)  # still hanging on earlier calls: do not pile up more
        finished = threading.Event()
        abandoned = [False]
        ahead = [False]
        started = time.monotonic()

        def call() -> None:
            try:
                self.store.write(self.run_id, points)
            finally:
                with self._abandoned_lock:
                    finished.set()
                    if abandoned[0]:
                        self._abandoned -= 1

        def waiting() -> None:
            if time.monotonic() - started < self.flush_interval:
                return
            if direct and not ahead[0] and not self._backlog():
                try:
                    self.spool.append(points)  # line 0 of an empty spool: trimmed again if the call succeeds
                    ahead[0] = True
                except OSError:
                    pass  # kept in memory if the call fails
            if ahead[0] or self._down_since is not None:
                self._spool_queue()

        try:
            call_with_deadline(call, self.store_timeout, self._expired, waiting)
        except StoreTimeout as exc:
            exc.kept = ahead[0]
            with self._abandoned_lock:
                if not finished.is_set():
                    abandoned[0] = True
                    self._abandoned += 1
            reset = getattr(self.store, "reset", None)
            if reset is not None:
                try:
                    reset()
                except Exception as error:  # the next call says what is wrong
                    log.debug("store reset: %s", error)
            raise
        except BaseException as exc:
            exc.kept = ahead[0]
            raise
        if ahead[0]:
            self.spool.trim(1)
        self.written += len(points)
        return ahead[0]

    def _write_all(self, points: list[Point]) -> None:
        """`points` in calls of at most `chunk`; on failure the unwritten rest is kept and the error raised."""
        chunk = self.chunk
        for start in range(0, len(points), chunk):
            try:
                self._write(points[start : start + chunk], direct=True)
            except BaseException as exc:
                self._keep(points[start + (chunk if getattr(exc, "kept", False) else 0) :])
                raise

    def _spool_queue(self) -> None:
        """What the sampler queued, to the spool, at most every flush interval."""
        if time.monotonic() - self._last_spooled < self.flush_interval:
            return
        batch = self._drain(0)
        if batch:
            self._keep(batch)
        else:
            self._last_spooled = time.monotonic()

    # -- delivery

    def _deliver(self, batch: list[Point]) -> None:
        if self._backlog():
            if batch:
                self._keep(batch)
            if time.monotonic() >= self._next_retry:
                self._retry()
            return
        if not batch:
            return
        try:
            self._write_all(batch)
        except Exception as exc:
            self._went_down(exc)

    def _keep(self, points: list[Point]) -> None:
        """Put points behind the backlog: in the spool, else in memory up to the bound, else count them lost."""
        self._last_spooled = time.monotonic()
        if not points:
            return
        try:
            while self._held:  # the spool took nothing for a while: the older points go first
                self.spool.append(self._held[0])
                self._held_points -= len(self._held.pop(0))
            self.spool.append(points)
            if self._spool_error is not None:
                self.report(f"radt: the spool {self.spool.path} can be written again; samples are kept there")
                self._spool_error = None
            return
        except OSError as exc:
            if self._spool_error is None:
                self.report(
                    f"radt: cannot write the spool {self.spool.path} ({type(exc).__name__}: {exc.strerror or exc}); "
                    f"keeping up to {self.memory_points:,} points in memory ({settings.MEMORY_POINTS.name}) until the store or the disk is back"
                )
            self._spool_error = f"{exc.strerror or exc}"
        room = self.memory_points - self._held_points
        if room < len(points) and self.lost == 0:
            self.report(f"radt: {self.memory_points:,} points held in memory, the limit; newer samples are dropped (counted at exit)")
        kept = points[: max(0, room)]
        self.lost += len(points) - len(kept)
        if kept:
            self._held.append(kept)
            self._held_points += len(kept)

    def _retry(self) -> bool:
        """Send the backlog (spool, then what is held in memory), oldest first; False if the store failed again."""
        try:
            try:
                if self.spool:
                    self.spool.replay(self._write, self.chunk)
            finally:
                self._resent[0] += self.spool.sent
                self.spool.sent = 0
            while self._held:
                batch = self._held[0]
                self._write(batch)
                self._held.pop(0)
                self._held_points -= len(batch)
                self._resent[1] += len(batch)
        except Exception as exc:
            self._went_down(exc)
            return False
        if self._down_since is not None:
            spooled, held = self._resent
            what = " and ".join(f"{n:,} {where}" for n, where in ((spooled, "spooled"), (held, "kept in memory")) if n) or "no"
            self.report(f"radt: store is back after {time.monotonic() - self._down_since:.0f} s; {what} points written")
            self._down_since = None
            self._resent = [0, 0]
        return True

    def _went_down(self, exc: Exception) -> None:
        self._next_retry = time.monotonic() + self.retry_interval
        if self._down_since is not None or (self._deadline is not None and self._expired()):
            return
        self._down_since = time.monotonic()
        where = f"spooled to {self.spool.path}" if self._spool_error is None else "held in memory (the spool cannot be written)"
        if isinstance(exc, (StoreTimeout, StoreNotAnswering)):
            what = f"store not answering ({exc})"
        else:
            what = f"store unreachable ({first_line(exc)})"
        kept = self._held_points + (self.spool.points() if self.spool else 0)
        self.report(f"radt: {what}; {kept:,} points {where}, more follow until it is back")

    # -- exit

    def _final(self) -> None:
        """After close(): send the backlog until the deadline, then keep what is left on disk."""
        if self._backlog() and not self._expired():
            left = max(0.0, self._deadline - time.monotonic()) if self._deadline is not None else 0.0
            self.report(f"radt: writing spooled samples before exit (up to {left:.0f} s; Ctrl-C leaves them for 'radt sync')")
            while self._backlog() and not self._expired():
                if time.monotonic() >= self._next_retry and self._retry():
                    break
                wait = min(self._next_retry - time.monotonic(), (self._deadline or time.monotonic()) - time.monotonic())
                self._cancel.wait(max(0.01, min(wait, 0.5)))
        if self._held:  # one more try to put them on disk
            held, self._held, self._held_points = self._held, [], 0
            lost_before = self.lost
            for batch in held:
                self._keep(batch)
            if self._held:
                self.lost = lost_before + self._held_points
                self._held, self._held_points = [], 0

    def close(self, timeout: float = 60.0, cancel: threading.Event | None = None) -> bool:
        """Write everything still queued or spooled, waiting at most `timeout` s (or until `cancel` is set, or Ctrl-C).

        True if nothing waits for `radt sync`. What is left stays in the spool for it; `lost` counts what
        could not be kept at all (said in one line here)."""
        self._deadline = time.monotonic() + max(0.0, timeout)
        if cancel is not None:
            self._cancel = cancel
        self._queue.put(None)
        while self._thread.is_alive():
            try:
                self._thread.join(0.1)
            except KeyboardInterrupt:  # Ctrl-C at exit: stop waiting, keep the rest on disk
                self._cancel.set()
            if time.monotonic() > self._deadline + self.store_timeout + 5 and self._thread.is_alive():
                break  # only a spool write hanging on a dead disk gets here
        if self._failed is not None or self._thread.is_alive():
            leftover = 0
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                leftover += len(item or [])
            self.lost += leftover + self._held_points
        if self.lost:
            reason = f"the spool {self.spool.path} could not be written ({self._spool_error})" if self._spool_error else "the writer failed"
            self.report(f"radt: {self.lost:,} points were not kept: the store did not take them and {reason}")
        return not self.spool and not self._held
