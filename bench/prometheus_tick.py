"""Cost of one tick of the `prometheus` listener: asking only since the newest scrape read vs a fixed 60 s window.

A real Prometheus (Debian's `prometheus`) scrapes, every second, a dcgm-exporter stand-in serving the recorded
`dcgmi dmon` log for --gpus GPUs of this host (tests/support/dcgm_exporter.py). Once --history seconds of scrapes
are stored, two PrometheusSource objects read the same series tick by tick, interleaved (so they share the noise):
`radt` asks back from its oldest series' newest scrape (PrometheusSource._span_ms), `window` always asks 60 s (how
the source read before). Both must return the same readings; the table gives client CPU and bytes per tick.

Run:  .venv/bin/python bench/prometheus_tick.py                 (8 GPUs, 65 s of history, 30 ticks)
      .venv/bin/python bench/prometheus_tick.py --quick         (2 GPUs, 15 s, 5 ticks)
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from radt.collectors.sources import promql  # noqa: E402
from radt.collectors.sources.base import SamplingContext  # noqa: E402
from radt.collectors.sources.prometheus import PrometheusSource  # noqa: E402
from tests.support import prometheus as prom  # noqa: E402
from tests.support.dcgm_exporter import Device  # noqa: E402

LOG = REPO / "tests" / "fixtures" / "real-tool-logs" / "mnist_dcgmi_dmon_18fields.txt"


class Counting:
    """promql.query wrapped: the bytes of each answer (its JSON re-encoded length is close to the wire's)."""

    def __init__(self) -> None:
        self.inner = promql.query
        self.samples = 0

    def __call__(self, *args, **kwargs):
        found = self.inner(*args, **kwargs)
        self.samples += sum(len(s.samples) for s in found)
        return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--history", type=float, default=65.0, help="seconds of scrapes stored before measuring")
    parser.add_argument("--ticks", type=int, default=30)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.gpus, args.history, args.ticks = 2, 15.0, 5
    host = socket.gethostname()
    devices = [Device(host, gpu, gpu % 5) for gpu in range(args.gpus)]
    until = f'DCGM_FI_PROF_SM_ACTIVE{{Hostname="{host}",gpu="0"}}[1h]'
    with prom.serving(LOG, devices, until, int(args.history), timeout=args.history * 2 + 30) as (_exporter, server):
        ctx = SamplingContext(interval=1.0, devices=list(range(args.gpus)))
        radt = PrometheusSource(server.url, host=host, report=print, uuids={})
        window = PrometheusSource(server.url, host=host, report=print, uuids={})
        for source in (radt, window):
            source.open(ctx)
            source.since_ms = 0  # both read the history once, then tick
        window._span_ms = lambda now_ms: window.window * 1000  # the fixed window it used before
        import radt.collectors.sources.prometheus as module

        counting = Counting()
        module.query = counting
        cost = {"radt": [0.0, 0, 0], "window": [0.0, 0, 0]}  # cpu s, samples answered, readings
        radt.readings(int(time.time() * 1000))
        window.readings(int(time.time() * 1000))
        got = {"radt": [], "window": []}
        for _ in range(args.ticks):
            time.sleep(1.0)
            for name, source in (("radt", radt), ("window", window)):
                before_cpu, before_samples = time.process_time(), counting.samples
                readings = source.readings(int(time.time() * 1000))
                cost[name][0] += time.process_time() - before_cpu
                cost[name][1] += counting.samples - before_samples
                cost[name][2] += len(readings)
                got[name] += readings
        module.query = counting.inner
    print(f"{args.gpus} GPUs, {args.history:.0f} s of scrapes stored, {args.ticks} ticks at 1 s, one Prometheus scrape a second")
    print(f"{'':8} {'CPU ms/tick':>12} {'samples answered/tick':>22} {'readings/tick':>14}")
    for name, (cpu, samples, readings) in cost.items():
        print(f"{name:8} {cpu / args.ticks * 1000:12.2f} {samples / args.ticks:22.0f} {readings / args.ticks:14.1f}")
    same = sorted(got["radt"]) == sorted(r for r in got["window"] if r.timestamp >= min(x.timestamp for x in got["radt"]))
    print(f"same readings: {same}")
    print(f"RATIO window / radt CPU = {cost['window'][0] / max(cost['radt'][0], 1e-9):.2f}x")
    print(f"RATIO window / radt samples answered = {cost['window'][1] / max(cost['radt'][1], 1):.2f}x")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
