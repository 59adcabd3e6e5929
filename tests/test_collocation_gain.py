"""could_share from the store's measured alone-vs-collocated throughput of the same command (issue #54): where the store
holds a command's runs alone and together, the gain the comparison table shows decides the finding and the sentence says
"measured"; where it holds none, the two runs' own figures do and the sentence says "estimated"."""

from __future__ import annotations

import json
import math

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric

from radt.catalogue import MetricName
from radt.collectors.diagnose.stored import diagnoses
from radt.collectors.sources.base import SamplingContext
from radt.collectors.sources.nvml import NvmlSource
from radt.collectors.store.stores import open_metric_store
from radt.collectors.store.tracking import connect
from radt.diagnosis import COULD_SHARE
from radt.points import Point
from radt.runmodel import GPUS_TAG
from radt.throughput import Work, command_gains
from tests.fakes.fake_nvml import H100
from tests.support.runs import radt_run

pytestmark = pytest.mark.dialects
START = 1_700_000_000_000
SECONDS = 60  # of GPU samples each run holds


def _work(run_id: str, workload: str, end_s: float, steps: float = 10, command: str = "train.py", finished: bool = True) -> Work:
    return Work(run_id, "1", ("command", command, ""), workload, START, START + end_s * 1000, finished, steps, end_s)


def test_a_commands_gain_is_the_mean_of_its_groups_sums_of_throughput_over_the_alone_baseline():
    runs = [
        _work("solo", "ungrouped:1", 60),  # 600 steps/h alone
        _work("a", "w1", 100),  # 360/h together: 0.6 of alone
        _work("b", "w1", 100),
        _work("c", "w2", 75),  # 480/h: 0.8; with d, 1.6
        _work("d", "w2", 75),
        _work("e", "w3", 100, command="other.py"),  # no alone run of other.py: the group of e and f has no gain
        _work("f", "w3", 100),
    ]
    gains = command_gains(runs)
    assert gains[("1", ("command", "train.py", ""))].groups == 2
    assert math.isclose(gains[("1", ("command", "train.py", ""))].gain, (1.2 + 1.6) / 2)
    assert ("1", ("command", "other.py", "")) not in gains
    assert command_gains([_work("solo", "ungrouped:1", 60), _work("a", "w1", 100, finished=False)]) == {}, "no group, no gain"


def _gpu_points(fake, load: float) -> list[Point]:
    """SECONDS one-second NVML samples of GPU 0 at `load` (the run's own figures: a low SMACT, little memory)."""
    source = NvmlSource()
    source.open(SamplingContext(interval=1.0, devices=None, slices=[], pids=lambda: []))
    source.sample()
    fake.set_load(0, load)
    points = []
    for t in range(SECONDS):
        fake.clock.advance(1.0)
        points += [Point(k, v, START + 1000 * t, t) for k, v in source.sample().items() if isinstance(v, float) and math.isfinite(v)]
    source.close()
    return points


def _run(uri: str, experiment: str, name: str, points: list[Point], end_s: int, workload: str | None = None, letter: str = "A") -> str:
    """A radt run of `python train.py --small` with its GPU samples and 10 steps of its own loss, ended after end_s."""
    client = MlflowClient(uri)
    run_id = radt_run(client, experiment, name, start_time=START, workload=workload, letter=letter, script_args=["--small"])
    client.set_tag(run_id, GPUS_TAG, json.dumps([{"series": "gpu_0", "name": H100["name"], "memory_total_mb": 81559}]))
    client.log_batch(run_id, metrics=[Metric("loss", 1.0 / (s + 1), START + 1000 * s, s) for s in range(10)])
    writer = open_metric_store(uri)
    writer.write(run_id, points)
    writer.close()
    client.set_terminated(run_id, "FINISHED", end_time=START + end_s * 1000)
    return run_id


@pytest.mark.parametrize(("together_s", "gain"), [(100, 1.2), (150, 0.8)])
def test_could_share_says_measured_where_the_store_measured_the_command_together(store_uri, nvml, together_s, gain):
    """Alone: 10 steps in 60 s. Two runs together: 10 steps each in `together_s`; the pair's gain 2 × 60 / together_s."""
    points = _gpu_points(nvml([H100]), 0.2)
    experiment = MlflowClient(store_uri).create_experiment(f"measured {together_s}")
    _run(store_uri, experiment, "solo", points, 60)
    a = _run(store_uri, experiment, "pair A", points, together_s, workload="pair", letter="A")
    b = _run(store_uri, experiment, "pair B", points, together_s, workload="pair", letter="B")
    found, _ = diagnoses(connect(store_uri), [a, b])
    for run_id in (a, b):
        shares = [f for f in found[run_id].findings if f.code == COULD_SHARE]
        if gain > 1:
            assert (
                len(shares) == 1
                and f"measured: runs of this command did {gain:.2f}× the work per hour together as alone (1 collocated group" in shares[0].sentence
            )
        else:
            assert shares == [], "measured at or below 1: together did not pay, whatever the figures say"


def test_could_share_says_estimated_where_the_command_never_ran_together(store_uri, nvml):
    points = _gpu_points(nvml([H100]), 0.2)
    experiment = MlflowClient(store_uri).create_experiment("estimated")
    a = _run(store_uri, experiment, "first", points, 60)
    b = _run(store_uri, experiment, "second", points, 60)
    found, _ = diagnoses(connect(store_uri), [a, b])
    shares = [f for f in found[a].findings if f.code == COULD_SHARE]
    assert len(shares) == 1 and "could share one GPU with second" in shares[0].sentence
    assert "estimated from the two runs' own figures; no collocated run of this command is measured" in shares[0].sentence
    assert f"system/gpu_0_{MetricName.SM_ACTIVE}" in {p.key for p in points}
    through_a_server, _ = diagnoses(MlflowClient(store_uri), [a, b])
    said = [f.sentence for f in through_a_server[a].findings if f.code == COULD_SHARE]
    assert said and "measured figures are read where radt reads the store itself, not through a server" in said[0]
