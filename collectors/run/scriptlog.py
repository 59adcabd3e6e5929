"""The training script's own calls (`radt.run()`: log_metric, log_param, set_tag, log_artifact), in radt's process.

The script appends each call as one JSON line to its run folder's script.jsonl and never waits (radt/__init__.py).
This reader tails the file: metrics go into the run's MetricWriter as points (the key as the script gave it,
the script's timestamp and step), so they share its queue, spool and deadlines; params, tags and artifacts go
to the store on this reader's thread, each call with a deadline and retried while the store is away.

script.offset records how far the file is safe: every line before it is in the store or the spool. A line's
metrics count once the writer has been healthy for CHECKPOINT_LAG s since they were handed over (it has
written or spooled them by then); a param, tag or artifact once the store took it. `radt sync` sends the
rest of a dead radt's file (`replay`): the stores take a point twice as once, params and tags are idempotent.
An invalid key is said once on radt's stderr and its values skipped; the training never sees it.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from radt import settings
from radt.collectors._common import first_line
from radt.collectors.store.sqltracking import TrackingError, check_key
from radt.collectors.store.tracking import log_params, set_tags
from radt.collectors.store.writer import CHUNK, StoreTimeout, call_with_deadline
from radt.points import Point
from radt.rundir import SCRIPT_ARTIFACTS_DIR, SCRIPT_LOG_FILE, SCRIPT_OFFSET_FILE, write_whole

READ_BYTES = 4 << 20  # one read of the file at most
CHECKPOINT_LAG = 10.0  # seconds (plus the store deadline) after which the healthy writer has written or spooled a point
MAX_STEP = 2**63 - 1
PERMANENT = ("INVALID_PARAMETER_VALUE", "BAD_REQUEST", "RESOURCE_DOES_NOT_EXIST", "INVALID_STATE")  # MLflow's refusals


def read_offset(run_dir: Path) -> int:
    try:
        return int((run_dir / SCRIPT_OFFSET_FILE).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def unsent(run_dir: Path) -> bool:
    """The script logged more than radt handed on (a radt killed mid-run): `radt sync` has work here."""
    try:
        return (run_dir / SCRIPT_LOG_FILE).stat().st_size > read_offset(run_dir)
    except OSError:
        return False


def permanent(exc: BaseException) -> bool:
    """A call the store refuses for what it holds (a changed param, a deleted run), not for being away: retrying cannot help."""
    return isinstance(exc, TrackingError) or getattr(exc, "error_code", None) in PERMANENT


class ScriptLog:
    """Reads one run's script.jsonl from `offset`; metrics to `put`, other calls to `client` with deadlines."""

    def __init__(self, run_dir: Path, run_id: str, client, put: Callable[[list[Point]], None], report: Callable[[str], None]) -> None:
        self.run_dir = run_dir
        self.run_id = run_id
        self.client = client
        self.put = put
        self.report = report
        self.path = run_dir / SCRIPT_LOG_FILE
        self.offset = read_offset(run_dir)  # the next byte to read
        self.saved = self.offset  # what script.offset says
        self._saved_at = 0.0
        self.points = 0  # metric points handed to `put`
        self.calls: deque[tuple[int, int, dict]] = deque()  # (line start, line end, record) of params/tags/artifacts not in the store yet
        self.timeout = settings.STORE_TIMEOUT.get()
        self._marks: deque[tuple[float, int]] = deque()  # (monotonic time, offset) of metrics handed to a healthy writer
        self._next_try = 0.0
        self.failure: Exception | None = None  # the last store error that left calls waiting
        self._busy: threading.Event | None = None  # set when the last call that overran its deadline has ended
        self.unsaved: tuple[Path, OSError] | None = None  # script.offset and why its disk refused it, while it does
        self._said: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="radt-script-log", daemon=True)

    # -- reading

    def read(self, final: bool = False, once: bool = False) -> int:
        """Hand on every complete line past `offset` (`once`: one READ_BYTES part); `final`: the script is gone, a torn
        last line is skipped. Returns the lines read."""
        lines = 0
        while True:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self.offset)
                    data = f.read(READ_BYTES)
            except FileNotFoundError:
                return lines
            except OSError as exc:
                self.say("read", f"radt: cannot read the script's calls in {self.path} ({exc.strerror or exc}); 'radt sync' sends them later")
                return lines
            end = data.rfind(b"\n") + 1
            if end == 0 and final and data and len(data) < READ_BYTES:
                end = len(data)  # a line the script never finished (a short write on a full disk)
            if end == 0 and len(data) == READ_BYTES:
                if not self._skip_long_line(final):
                    return lines
                continue
            if end == 0:
                return lines
            start = self.offset
            points: list[Point] = []
            for raw in data[:end].splitlines(keepends=True):
                record = self._parse(raw)
                if record is not None and "metrics" in record:
                    points.extend(self._points(record["metrics"]))
                elif record is not None:
                    self.calls.append((start, start + len(raw), record))
                start += len(raw)
                lines += 1
            if points:
                self.put(points)
                self.points += len(points)
            self.offset += end
            if once:
                return lines

    def _skip_long_line(self, final: bool) -> bool:
        """A line longer than READ_BYTES (a param of megabytes): skipped, said once; False while its end is not written yet."""
        with open(self.path, "rb") as f:
            f.seek(self.offset + READ_BYTES)
            skipped = READ_BYTES
            while chunk := f.read(READ_BYTES):
                newline = chunk.find(b"\n")
                if newline >= 0:
                    skipped += newline + 1
                    break
                skipped += len(chunk)
            else:
                if not final:
                    return False
        self.say("long", f"radt: skipped a call of {skipped:,} bytes in {self.path}: over {READ_BYTES:,}, more than MLflow keeps")
        self.offset += skipped
        return True

    def _parse(self, raw: bytes) -> dict | None:
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        if not isinstance(record, dict) or not ({"metrics", "params", "tags", "artifact"} & record.keys()):
            if raw.strip():
                self.say("torn", f"radt: skipped a line of {self.path} that is not a whole call (a write cut short)")
            return None
        return record

    def _points(self, rows) -> list[Point]:
        points = []
        for row in rows if isinstance(rows, list) else []:
            try:
                key, value, timestamp, step = row
                point = Point(key, float(value), int(timestamp), int(step))
                if not isinstance(key, str) or abs(point.step) > MAX_STEP:
                    raise ValueError(f"metric {key!r}: step {step} out of range")
                check_key(key, "metric")
            except (TrackingError, TypeError, ValueError) as exc:
                self.say(f"metric:{row[0] if isinstance(row, list) and row else row!r}", f"radt: the script's {first_line(exc)}; its values are not recorded")
                continue
            points.append(point)
        return points

    # -- params, tags, artifacts

    def send(self, timeout: float | None = None, cancel: Callable[[], bool] = lambda: False) -> bool:
        """The waiting calls, oldest first, each within `timeout` s; False when the store failed (retried after RETRY_INTERVAL)."""
        while self.calls:
            if self._busy is not None and not self._busy.is_set():
                return False  # a call past its deadline still hangs: no second connection into the same stall
            _, _, record = self.calls[0]
            done = threading.Event()
            limit = timeout or (max(self.timeout, settings.FINISH_TIMEOUT.get()) if "artifact" in record else self.timeout)  # an upload takes longer
            try:
                call_with_deadline(lambda r=record, d=done: self._call(r, d), limit, cancel)
            except Exception as exc:
                if not permanent(exc):
                    self.failure = exc
                    self._busy = None if done.is_set() else done
                    self._next_try = time.monotonic() + settings.RETRY_INTERVAL.get()
                    if "artifact" in record:
                        self.say(
                            f"upload:{record['artifact']}", f"radt: the script's artifact {record['artifact']} not uploaded yet ({first_line(exc)}); retrying"
                        )
                    return False
                self.say(f"refused:{first_line(exc)}", f"radt: the script's {_what(record)} not recorded ({first_line(exc)})")
            self.calls.popleft()
        return True

    def _call(self, record: dict, done: threading.Event) -> None:
        try:
            if "params" in record:
                log_params(self.client, self.run_id, {check_key(k, "param"): v for k, v in record["params"].items()})
            elif "tags" in record:
                set_tags(self.client, self.run_id, {check_key(k, "tag"): v for k, v in record["tags"].items()})
            else:
                self._upload(record)
        finally:
            done.set()

    def _upload(self, record: dict) -> None:
        local = self.run_dir / record["artifact"]
        if local.resolve().parent.parent != (self.run_dir / SCRIPT_ARTIFACTS_DIR).resolve():
            raise TrackingError(f"artifact {record['artifact']!r} is not a copy radt.run() made")  # removed below: never anything else
        if not local.exists():
            return  # uploaded and removed by an earlier radt of this folder
        self.client.log_artifact(self.run_id, str(local), record.get("artifact_path"))
        shutil.rmtree(local.parent, ignore_errors=True)

    # -- the checkpoint

    def checkpoint(self, healthy: bool, final: bool = False) -> None:
        """Move script.offset to where every earlier line is in the store or the spool.

        `final`: the writer has closed with nothing lost, so every metric read is kept; else a metric counts
        CHECKPOINT_LAG (+ the store deadline) s after it was handed to a writer that stayed healthy since."""
        now = time.monotonic()
        if final:
            safe = self.offset
        else:
            if not healthy:
                self._marks.clear()  # points handed over now may wait in memory behind a replay: not yet safe
            else:
                self._marks.append((now, self.offset))
            safe = self.saved
            while self._marks and now - self._marks[0][0] >= CHECKPOINT_LAG + self.timeout:
                safe = max(safe, self._marks.popleft()[1])
        if self.calls:
            safe = min(safe, self.calls[0][0])
        if safe > self.saved and (final or now - self._saved_at >= 1.0):
            self._save(safe)
            self._saved_at = now

    def _save(self, offset: int) -> None:
        path = self.run_dir / SCRIPT_OFFSET_FILE
        try:
            write_whole(path, str(offset))
            self.saved, self.unsaved = offset, None
        except OSError as exc:
            self.unsaved = (path, exc)  # `radt sync` sends more again: the stores take a point twice as once

    # -- while the script runs

    def start(self, healthy: Callable[[], bool]) -> ScriptLog:
        self._healthy = healthy
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(settings.SCRIPT_LOG_POLL.get()):
            try:
                self.read()
                if self.calls and time.monotonic() >= self._next_try:
                    self.send()
                self.checkpoint(self._healthy())
            except Exception as exc:  # a bug must not end the reading silently: the file stays for the end and `radt sync`
                self.say("bug", f"radt: reading the script's calls failed ({type(exc).__name__}: {first_line(exc)}); they are sent at the end")

    def close(self, deadline: float, cancel: threading.Event) -> None:
        """After the script: read the rest (before the writer closes), then send the waiting calls until `deadline` (monotonic)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(max(0.1, min(self.timeout + 1, deadline - time.monotonic())))
        if self._thread.is_alive():
            return  # stuck in a read on a dead disk: what it did not hand on stays for `radt sync`
        self.read(final=True)
        while self.calls and not cancel.is_set() and time.monotonic() < deadline:
            if self.send(deadline - time.monotonic(), cancel.is_set):
                break
            cancel.wait(min(max(0.1, self._next_try - time.monotonic()), max(0.0, deadline - time.monotonic())))

    def settle(self, kept: bool) -> bool:
        """At the run's end, after the writer closed (`kept`: it lost nothing): the final checkpoint; True if nothing waits for `radt sync`.

        A script.offset its disk refuses (a full disk) is no reason to wait: every line is in the store or the spool, so
        script.jsonl goes instead (freeing room), and `radt sync` does not take the file for one a killed radt left."""
        if self._thread.is_alive():
            return False
        if kept:
            self.checkpoint(True, final=True)
        if self.calls:
            return False
        if self.saved >= self.offset:
            return True
        return kept and self._all_read() and self._drop()

    def _all_read(self) -> bool:
        try:
            return self.path.stat().st_size <= self.offset
        except FileNotFoundError:
            return True
        except OSError:
            return False

    def _drop(self) -> bool:
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            return False
        return True

    def say(self, what: str, message: str) -> None:
        if what not in self._said:
            self._said.add(what)
            self.report(message)


def _what(record: dict) -> str:
    if "params" in record:
        return f"param(s) {', '.join(map(repr, record['params']))}"
    if "tags" in record:
        return f"tag(s) {', '.join(map(repr, record['tags']))}"
    return f"artifact {record.get('artifact')!r}"


def replay(run_dir: Path, run_id: str, client, write: Callable[[list[Point]], None], report: Callable[[str], None]) -> int:
    """`radt sync`: what a dead radt did not hand on, from script.offset to the end, each store call within FINISH_TIMEOUT s.

    script.offset moves after each part the store took; a failure raises and leaves the rest. Returns the points sent."""
    batch: list[Point] = []
    log = ScriptLog(run_dir, run_id, client, batch.extend, report)
    log.timeout = settings.FINISH_TIMEOUT.get()
    sent = 0
    while log.read(final=True, once=True):
        for start in range(0, len(batch), CHUNK):
            part = batch[start : start + CHUNK]
            call_with_deadline(lambda p=part: write(p), log.timeout)
            sent += len(part)
        batch.clear()
        if not log.send():
            raise log.failure or StoreTimeout(log.timeout)  # a call still hanging from this sync
        log.checkpoint(True, final=True)
    return sent


def sync(store_uri: str, client, run_dir: Path, run_id: str, report: Callable[[str], None]) -> int:
    """`radt sync`'s part: replay() into the run's store, when the script logged more than its radt handed on."""
    if not unsent(run_dir):
        return 0
    from radt.collectors.store.stores import open_metric_store

    store = open_metric_store(store_uri)
    try:
        return replay(run_dir, run_id, client, lambda points: store.write(run_id, points), report)
    finally:
        store.close()
