"""One recording's whole life on one exit stack: the run's writer, its sources and sampler, and its end.

`radt train.py` (runner.run_script, also each row of a CSV workload and of a Slurm job, which run it)
and `radt monitor` (one Recording per day) open the parts in this order; every exit path (the
script's end, a workload called off before the start, a script that cannot start, an exception,
Ctrl-C) closes them in reverse, once:

    signals        the handlers the recording set (catch_signals): the ones radt had are put back last
    (callbacks)    what a caller adds before the writer closes after it (a CSV run's gate status)
    writer         MetricWriter; its end is one bounded flush (deadline = the teardown's start + flush
                   timeout) and exactly one finish_run with the outcome the caller set in `end`
    sampling       the sources (open_sources), then the Sampler over them (its series owners), then `late`
    (callbacks)    what a caller adds after: the script's process tree, the watchdog, the cgroup

Like MLflow's SystemMetricsMonitor, one object owns start and finish; a new part is one `callback`.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

from radt.collectors.process.proctree import catch_stops
from radt.collectors.run.finish import RunEnd, RunPart, Unwritten, finish_run, freeze
from radt.collectors.run.sampler import Sampler, open_sources
from radt.collectors.run.scriptlog import ScriptLog
from radt.collectors.sources.base import SamplingContext
from radt.collectors.sources.listeners import make_source
from radt.collectors.store.stores import open_metric_store
from radt.collectors.store.writer import MetricWriter
from radt.errors import report
from radt.points import Point
from radt.rundir import DONE_FILE, LOGS_DIR, SPOOL_FILE, write_whole

INTERRUPTED = RunEnd("KILLED", -signal.SIGINT, "interrupted")  # Ctrl-C outside radt's own handlers
RADT_ERROR = RunEnd("FAILED", 1, "radt_error")  # a bug or an unexpected error in radt itself; the traceback follows


class Recording:
    """Owns a run's recording from the writer's start to finish_run; set `end` before it closes.

    Use as a context manager (`with Recording(...) as rec:`), or call `close()` (radt monitor's day runs)."""

    def __init__(self, flush_timeout: float, report: Callable[[str], None] = report, *, cancel_on_signal: bool = True) -> None:
        self.flush_timeout = flush_timeout
        self.report = report
        self.cancel_on_signal = cancel_on_signal  # Ctrl-C during the final flush stops waiting (main thread only)
        self.end: RunEnd | None = None  # the outcome finish_run writes; an exception without one: RADT_ERROR / INTERRUPTED
        self.tags: dict[str, str] = {}  # further run tags for finish_run (a source's gap)
        self.deadline: float | None = None  # monotonic: the bound on everything the teardown waits for
        self.freeze = False  # pip freeze into logs/ at the end (a training script's environment)
        self.client = None
        self.part: RunPart | None = None
        self.writer: MetricWriter | None = None
        self.sources: list = []
        self.sampler: Sampler | None = None
        self.script_log: ScriptLog | None = None
        self.unwritten: Unwritten | None = None  # what the run folder's disk refused, said in one line at the end
        self._late: Callable[[Sampler], dict[str, str]] | None = None
        self._sampling_on_stack = False
        self._sampling_closed = False
        self._saved_signals: dict = {}
        self._stack = ExitStack()
        self._stack.callback(self._restore_signals)  # the first part: put back last

    # -- life ---------------------------------------------------------------------------------

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.deadline is None:
            self.deadline = time.monotonic() + self.flush_timeout  # everything radt still does, the last writes included
        if exc_type is not None and self.end is None and self.part is not None:
            self.end = INTERRUPTED if issubclass(exc_type, KeyboardInterrupt) else RADT_ERROR
        return self._stack.__exit__(exc_type, exc, tb)

    def close(self) -> None:
        self.__exit__(None, None, None)

    @contextmanager
    def opening(self):
        """Close what has opened if opening the rest fails (a Recording kept past one `with`)."""
        try:
            yield self
        except BaseException:
            if not self.__exit__(*sys.exc_info()):
                raise

    def callback(self, fn: Callable, *args) -> None:
        """One more part: `fn(*args)` runs at the end, before the parts added earlier close."""
        self._stack.callback(fn, *args)

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic()) if self.deadline is not None else self.flush_timeout

    @property
    def run_id(self) -> str:
        return self.part.run_id if self.part else ""

    @property
    def done(self) -> bool:
        """The run ended in the store; False if something waits for `radt sync`."""
        return self.part is not None and (self.part.run_dir / DONE_FILE).exists()

    # -- parts --------------------------------------------------------------------------------

    def catch_signals(self, handler) -> None:
        """`handler` for Ctrl-C, SIGTERM and SIGHUP (proctree.catch_stops) until the recording ends; the first handlers come back."""
        for sig, previous in catch_stops(handler).items():
            self._saved_signals.setdefault(sig, previous)

    def _restore_signals(self) -> None:
        for sig, handler in self._saved_signals.items():
            signal.signal(sig, handler)

    def write(self, client, part: RunPart, store: str) -> MetricWriter:
        """Start the run's writer; from here the recording ends with one bounded flush and finish_run."""
        self.client, self.part = client, part
        self.unwritten = Unwritten(part.run_dir)
        self.writer = MetricWriter(open_metric_store(store), part.run_id, part.run_dir / SPOOL_FILE, report=self.report).start()
        self._stack.callback(self._finish)
        return self.writer

    def open_sources(self, listeners: list[str], ctx: SamplingContext) -> list:
        """Open the listeners' sources (those that work here); closed at the end, by the sampler once it runs."""
        self.sources = open_sources([make_source(name) for name in listeners], ctx, self.report)
        self._sampling_part()
        return self.sources

    def _sampling_part(self) -> None:
        if not self._sampling_on_stack:
            self._sampling_on_stack = True
            self._stack.callback(self.stop_sampling)

    def sample(
        self,
        sources: list,
        interval: float,
        put: Callable[[list[Point]], None] | None = None,
        start_gate: Callable[[], bool] | None = None,
        late: Callable[[Sampler], dict[str, str]] | None = None,
    ) -> Sampler:
        """Start sampling `sources` into `put` (the writer's); `late(sampler)` runs once it stopped and returns run tags."""
        if not self._sampling_on_stack:  # sources opened elsewhere (radt monitor refuses to start without one): this recording closes them
            self.sources = sources
            self._sampling_part()
        self._late = late
        self.sampler = Sampler(sources, interval, put or self.writer.put, self.report, start_gate=start_gate)
        self.sampler.start()
        return self.sampler

    def stop_sampling(self) -> None:
        """Stop the sampler (it closes the sources) or close the sources that never sampled; once."""
        if self._sampling_closed:
            return
        self._sampling_closed = True
        if self.sampler is None:
            for source in self.sources:
                source.close()
            return
        self.sampler.stop()
        if self._late is not None:
            self.tags.update(self._late(self.sampler))

    # -- the end ------------------------------------------------------------------------------

    def _finish(self) -> None:
        """The bounded flush and finish_run: logs, the script's last calls, the writer, then the run's status."""
        end = self.end or RADT_ERROR
        with flush_signals(self.report) if self.cancel_on_signal else _no_signals() as cancel:
            self._write_logs()
            if self.script_log is not None:
                self.script_log.close(self.deadline, cancel)  # its last calls into the writer before it closes
            written = self.writer.close(self.left(), cancel)
            self.writer.store.close()
            points = self.writer.written
            if self.script_log is not None:
                written = self.script_log.settle(kept=not self.writer.lost) and written
                points = max(0, points - self.script_log.points)  # radt.points: the system points, as `radt sync` counts them
                if self.script_log.unsaved:
                    self.unwritten.file(self.script_log.unsaved[0], self.script_log.unsaved[1])
            said = self.unwritten.line()
            if said:
                self.report(said)
            end = end._replace(tags={**self.tags, **(end.tags or {})})
            finish_run(self.client, self.part, end, written, points, deadline=self.deadline, cancel=cancel)

    def _write_logs(self) -> None:
        """pip freeze and radt-sources.json into logs/; a file its disk refuses is left out (none cut short), counted in `unwritten`."""
        logs = self.part.run_dir / LOGS_DIR
        if self.freeze:
            self._log_file(logs / "pip-freeze.txt", lambda: freeze(logs))  # the writer keeps sending meanwhile
        if self.sampler is not None:
            sources = json.dumps(self.sampler.describe(), indent=2)
            self._log_file(logs / "radt-sources.json", lambda: write_whole(logs / "radt-sources.json", sources))

    def _log_file(self, path: Path, write: Callable[[], None]) -> None:
        try:
            write()
        except OSError as exc:  # a full disk must not cost the run its status
            self.unwritten.file(path, exc)
            with suppress(OSError):
                path.unlink(missing_ok=True)


@contextmanager
def flush_signals(say: Callable[[str], None] = report):
    """Ctrl-C, SIGTERM or SIGHUP while radt flushes at exit: stop waiting on the store; what is not sent stays for `radt sync`.

    Yields the event they set (the writer's close() and finish_run() watch it); said once afterwards."""
    cancel = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame) -> None:
        received.append(signum)
        cancel.set()

    saved = catch_stops(on_signal)
    try:
        yield cancel
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        if received:
            say(f"radt: {signal.Signals(received[0]).name} received during the final flush; what was not sent waits for 'radt sync'")


@contextmanager
def _no_signals():
    """radt monitor's day runs end on any thread: its own handlers (a second Ctrl-C) interrupt the flush."""
    yield threading.Event()
