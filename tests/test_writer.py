"""The writer never blocks the sampler, spools while the store fails or hangs, replays in order, and says what it could not keep."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from radt.collectors.store.stores import MlflowMetricStore, SqlMetricStore
from radt.collectors.store.writer import MetricWriter, Spool
from radt.points import Point
from radt.rundir import claim_run_dir, owner_pid, release_run_dir
from tests.support.paths import REPO
from tests.support.polling import wait_for


class FlakyStore:
    """A store that refuses writes while `down` is set, recording what it accepted."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.accepted: list[Point] = []
        self.failures = 0

    def write(self, run_id, points):
        if self.down.is_set():
            self.failures += 1
            raise ConnectionError("connection refused")
        self.accepted.extend(points)

    def close(self):
        pass


def _tick(step: int) -> list[Point]:
    return [Point("a", float(step), 1000 * step, step), Point("b", -float(step), 1000 * step, step)]


_wait_for = functools.partial(wait_for, timeout=10.0, interval=0.01)  # tests/support/polling.py, with the writer's short waits


def test_outage_is_spooled_and_replayed_in_order(tmp_path):
    store = FlakyStore()
    messages: list[str] = []
    writer = MetricWriter(store, "run", tmp_path / "spool.jsonl", flush_interval=0.05, retry_interval=0.05, report=messages.append).start()
    for step in range(5):
        writer.put(_tick(step))
    _wait_for(lambda: len(store.accepted) == 10)
    store.down.set()
    for step in range(5, 15):
        writer.put(_tick(step))
    _wait_for(lambda: store.failures > 0 and (tmp_path / "spool.jsonl").exists())
    store.down.clear()
    for step in range(15, 20):
        writer.put(_tick(step))
    assert writer.close(timeout=10)
    steps = [p.step for p in store.accepted if p.key == "a"]
    assert steps == list(range(20)), "every tick written once, in order"
    assert not (tmp_path / "spool.jsonl").exists()
    assert any("unreachable" in m for m in messages) and any("is back" in m for m in messages)


def test_close_with_store_down_keeps_everything_on_disk(tmp_path):
    store = FlakyStore()
    store.down.set()
    writer = MetricWriter(store, "run", tmp_path / "spool.jsonl", flush_interval=0.05, retry_interval=0.05, report=lambda m: None).start()
    for step in range(30):
        writer.put(_tick(step))
    started = time.monotonic()
    assert writer.close(timeout=0.5) is False
    assert time.monotonic() - started < 5, "the exit wait is bounded"
    later = FlakyStore()
    sent = Spool(tmp_path / "spool.jsonl").replay(lambda batch: later.write("run", batch))
    assert sent == 60
    assert [p.step for p in later.accepted if p.key == "b"] == list(range(30))


def test_put_never_waits_for_a_slow_store(tmp_path):
    release = threading.Event()
    entered = threading.Event()

    class SlowStore(FlakyStore):
        def write(self, run_id, points):
            entered.set()
            release.wait(10)
            super().write(run_id, points)

    store = SlowStore()
    writer = MetricWriter(store, "run", tmp_path / "spool.jsonl", flush_interval=0.01, report=lambda m: None).start()
    writer.put(_tick(0))
    assert entered.wait(5)
    started = time.monotonic()
    for step in range(1, 2000):
        writer.put(_tick(step))
    assert time.monotonic() - started < 1.0, "the sampler's put() must not block on the store"
    release.set()
    assert writer.close(timeout=10)
    assert len(store.accepted) == 4000


class SizedStore(FlakyStore):
    """A FlakyStore that names its batch size, as the real stores do, and records each call's size."""

    batch_points = 10_000

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    def write(self, run_id, points):
        super().write(run_id, points)
        self.calls.append(len(points))


def test_a_backlog_goes_in_calls_of_the_stores_own_batch_size(tmp_path):
    # a SQL store's fixed cost per call (lock, reads, the rollups' merge) was ~20 % of a 2,000-point catch-up call
    store = SizedStore()
    store.down.set()
    writer = MetricWriter(store, "run", tmp_path / "spool.jsonl", flush_interval=0.02, retry_interval=0.05, report=lambda m: None).start()
    for step in range(0, 25_000, 1000):
        writer.put([Point("a", 1.0, 1000 * (step + i), step + i) for i in range(1000)])
    _wait_for(lambda: Spool(tmp_path / "spool.jsonl").points() == 25_000)
    store.down.clear()
    assert writer.close(timeout=10)
    assert [p.step for p in store.accepted] == list(range(25_000))
    assert max(store.calls) <= SizedStore.batch_points and len(store.calls) <= 4, store.calls


def test_the_sql_stores_batch_is_larger_than_the_servers():
    assert SqlMetricStore.batch_points >= 5000 > MlflowMetricStore.batch_points, "bench/ingest.py: rollups cost < 10 % from 5,000-point calls"


def test_torn_spool_line_is_skipped(tmp_path):
    spool = Spool(tmp_path / "spool.jsonl")
    spool.append(_tick(1))
    with open(spool.path, "a") as f:
        f.write('[["a", 1.0, 10')  # radt killed mid-write
    got: list[Point] = []
    assert spool.replay(got.extend) == 2
    assert not spool


class HangingStore(FlakyStore):
    """A store that, while `hang` is set, takes a write and never answers (a frozen server, a partition) until `release`."""

    def __init__(self) -> None:
        super().__init__()
        self.hang = threading.Event()
        self.release = threading.Event()
        self.taken: dict[tuple[str, int], int] = {}  # (key, step) -> times stored: a real store keeps a point once
        self.resets = 0

    def write(self, run_id, points):
        if self.hang.is_set():
            self.release.wait()
        super().write(run_id, points)
        for p in points:
            self.taken[(p.key, p.step)] = 1

    def reset(self):
        self.resets += 1


def test_a_store_that_stops_answering_is_an_outage_within_the_deadline(tmp_path):
    store = HangingStore()
    messages: list[str] = []
    spool = tmp_path / "spool.jsonl"
    writer = MetricWriter(store, "run", spool, flush_interval=0.05, retry_interval=0.1, store_timeout=0.3, report=messages.append).start()
    for step in range(5):
        writer.put(_tick(step))
    _wait_for(lambda: len(store.taken) == 10)
    store.hang.set()
    started = time.monotonic()
    for step in range(5, 15):
        writer.put(_tick(step))
        time.sleep(0.02)
    assert time.monotonic() - started < 1.0, "put() never waits on a hung store"
    _wait_for(lambda: spool.exists() and any("not answering" in m for m in messages), timeout=3)
    assert time.monotonic() - started < 2.0, "the batch is spooled once the deadline passes, not when the store answers"
    assert [m for m in messages if "not answering" in m] == [m for m in messages if "store" in m], "one line for the outage"
    assert "no reply within 0.3 s" in messages[0] and str(spool) in messages[0]
    assert store.resets >= 1, "the next call gets fresh connections"
    for step in range(15, 25):
        writer.put(_tick(step))
    _wait_for(lambda: Spool(spool).points() == 40, timeout=3)  # the writer carried on, into the spool
    store.hang.clear()
    store.release.set()
    assert writer.close(timeout=10)
    assert sorted(store.taken) == sorted((k, s) for s in range(25) for k in ("a", "b")), "every point reached the store"
    assert any("store is back" in m for m in messages)
    assert not spool.exists()


def test_close_is_bounded_by_its_timeout_when_the_store_hangs(tmp_path):
    store = HangingStore()
    store.hang.set()
    writer = MetricWriter(store, "run", tmp_path / "spool.jsonl", flush_interval=0.05, retry_interval=0.05, store_timeout=5, report=lambda m: None).start()
    for step in range(30):
        writer.put(_tick(step))
    started = time.monotonic()
    assert writer.close(timeout=0.5) is False
    assert time.monotonic() - started < 1.0, "--flush-timeout holds even inside a store call"
    later = FlakyStore()
    assert Spool(tmp_path / "spool.jsonl").replay(lambda batch: later.write("run", batch)) == 60, "what was not sent is on disk"
    store.release.set()


def test_close_stops_at_once_when_cancelled(tmp_path):
    store = HangingStore()
    store.hang.set()
    writer = MetricWriter(store, "run", tmp_path / "spool.jsonl", flush_interval=0.05, store_timeout=30, report=lambda m: None).start()
    for step in range(10):
        writer.put(_tick(step))
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()  # Ctrl-C during the final flush
    started = time.monotonic()
    assert writer.close(timeout=60, cancel=cancel) is False
    assert time.monotonic() - started < 1.5
    assert Spool(tmp_path / "spool.jsonl").points() == 20
    store.release.set()


def _full_device() -> Path:
    full = Path("/dev/full")  # a real device whose every write fails with ENOSPC
    if not full.exists():
        pytest.skip("/dev/full is not available here")
    return full


@pytest.mark.parametrize("store_back_before_exit", [False, True])
def test_a_spool_that_cannot_be_written_is_loud_and_counts_what_is_lost(tmp_path, store_back_before_exit):
    store = FlakyStore()
    store.down.set()
    messages: list[str] = []
    writer = MetricWriter(store, "run", _full_device(), flush_interval=0.02, retry_interval=0.05, memory_points=50, report=messages.append).start()
    for step in range(40):  # 80 points: 50 kept in memory, 30 dropped
        writer.put(_tick(step))
        time.sleep(0.005)
    _wait_for(lambda: writer.lost == 30)
    warning = next(m for m in messages if "cannot write the spool" in m)
    assert "/dev/full" in warning and "No space left on device" in warning and "50 points in memory" in warning
    if store_back_before_exit:
        store.down.clear()
        _wait_for(lambda: len(store.accepted) == 50)
    assert writer.close(timeout=0.5) is True, "nothing waits for radt sync: what is not in the store is lost"
    expected = 30 if store_back_before_exit else 80
    assert writer.lost == expected
    assert f"radt: {expected} points were not kept" in messages[-1] and "No space left on device" in messages[-1]
    if store_back_before_exit:  # the oldest points were kept, the newest dropped
        assert sorted({p.step for p in store.accepted}) == list(range(25))


def test_replay_keeps_what_the_owner_appended_meanwhile(tmp_path):
    spool = Spool(tmp_path / "spool.jsonl")
    for step in range(3):
        spool.append(_tick(step))
    got: list[Point] = []

    def write(batch):
        got.extend(batch)
        spool.append(_tick(99))  # the writer spools a new batch while its replay is under way

    assert spool.replay(write) == 6
    assert [p.step for p in got] == [0, 0, 1, 1, 2, 2]
    assert [p.step for batch in Spool._batches(spool._lines()) for p in batch[2]] == [99, 99], "the new batch is still there"


def test_spool_append_on_a_full_disk_leaves_no_torn_line(tmp_path):
    spool = Spool(tmp_path / "spool.jsonl")
    spool.append(_tick(0))
    before = spool.path.read_bytes()
    with pytest.raises(OSError):
        Spool(_full_device()).append(_tick(1))
    assert spool.path.read_bytes() == before


def test_one_owner_per_run_folder(tmp_path):
    run_dir = tmp_path / "run"
    probe = "import sys; from radt.rundir import claim_run_dir; print(claim_run_dir(sys.argv[1]) is None)"

    def taken_elsewhere() -> bool:
        out = subprocess.run([sys.executable, "-c", probe, str(run_dir)], capture_output=True, text=True, timeout=60, cwd=REPO)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip() == "True"

    lock = claim_run_dir(run_dir)
    assert lock is not None and owner_pid(run_dir) == os.getpid()
    assert taken_elsewhere(), "a second process cannot own a live run's folder"
    release_run_dir(run_dir)
    assert not taken_elsewhere(), "once the owner lets go (or dies) another process takes over"
