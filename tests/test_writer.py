"""The writer never blocks the sampler, spools while the store fails, and replays in order."""

from __future__ import annotations

import threading
import time

from collectors.points import Point
from collectors.writer import MetricWriter, Spool


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


def _wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


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


def test_torn_spool_line_is_skipped(tmp_path):
    spool = Spool(tmp_path / "spool.jsonl")
    spool.append(_tick(1))
    with open(spool.path, "a") as f:
        f.write('[["a", 1.0, 10')  # radt killed mid-write
    got: list[Point] = []
    assert spool.replay(got.extend) == 2
    assert not spool
