"""One diagnosis for every run (issue 54): the real recorded logs give what their numbers say, the fake NVML's runs give
input_starved / throttled / hardware_errors / straggler, a run lacking the fields says so and gets no guessed finding,
and the findings are kept on the run as tags (SQLite and the real PostgreSQL), by `radt diagnose` and by an import.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math

import pytest
from mlflow import MlflowClient

from radt.catalogue import Device, MetricName, key
from radt.collectors.diagnose import command
from radt.collectors.diagnose.stored import diagnose_and_store, diagnoses
from radt.collectors.imports import importer
from radt.collectors.sources.base import SamplingContext
from radt.collectors.sources.nvml import NvmlSource
from radt.collectors.store.stores import open_metric_store
from radt.diagnosis import (
    FITS_SMALLER,
    HARDWARE_ERRORS,
    IDLE_GPUS,
    INPUT_STARVED,
    NO_TENSOR_CORES,
    SMALL_KERNELS,
    STRAGGLER,
    THROTTLED,
    codes_of,
    parse_spans,
)
from radt.points import Point
from radt.runmodel import DIAGNOSIS_LACKING_TAG, DIAGNOSIS_TAG, DIAGNOSIS_VERSION_TAG, diagnosis_tag
from tests.fakes.fake_nvml import H100, FakeNvml
from tests.support.paths import FIXTURES
from tests.support.runs import radt_run

pytestmark = pytest.mark.dialects
START = 1_700_000_000_000
LOGS = {
    "1.1": ["microbench_1.1_dcgmi_dmon.txt", "microbench_1.1_nvidia_smi.csv"],
    "131072.1024": ["microbench_131072.1024_dcgmi_dmon.txt", "microbench_131072.1024_nvidia_smi.csv"],
    "mnist": ["mnist_dcgmi_dmon_18fields.txt", "mnist_nvidia_smi.csv", "mnist_top_batch.txt"],
}


def _import(uri: str, name: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert importer.main([*(str(FIXTURES / f) for f in LOGS[name]), "-e", "logs", "--start", "2023-02-20T12:00:00", "--store", uri]) == 0
    return out.getvalue().split()[-1]


def _tags(uri: str, run_id: str) -> dict[str, str]:
    return dict(MlflowClient(uri).get_run(run_id).data.tags)


def _smi_column(name: str, column: str) -> list[float]:
    """A column of a real nvidia-smi CSV, every GPU's rows, read by csv (not by radt's parser)."""
    with open(FIXTURES / name, newline="") as f:
        rows = list(csv.reader(f, skipinitialspace=True))
    wanted = next(i for i, h in enumerate(rows[0]) if h.strip().startswith(column))
    return [float(r[wanted].split()[0]) for r in rows[1:] if r]


def test_the_real_logs_are_diagnosed_as_their_numbers_say_when_imported(store_uri):
    """The one-thread-block microbenchmark is small_kernels (GRACT high, SMACT ~0) with GPUs 1-4 idle; the full grid is
    not small_kernels; MNIST's 2.5 GB peak on a 40 GB A100 with SMACT p95 below 1/7 fits a 1g.5gb slice."""
    tiny, full, mnist = (_import(store_uri, name) for name in LOGS)
    tags = _tags(store_uri, tiny)
    assert codes_of(tags)[:2] == [IDLE_GPUS, SMALL_KERNELS], tags[DIAGNOSIS_TAG]
    assert "4 of 5 GPUs idle" in tags[diagnosis_tag(IDLE_GPUS)] and all(f"GPU {g} 100%" in tags[diagnosis_tag(IDLE_GPUS)] for g in (1, 2, 3, 4))
    assert "GPU 0 " not in tags[diagnosis_tag(IDLE_GPUS)] + " ", "the busy GPU is not called idle"
    assert "input_starved (no CPU series)" in tags[DIAGNOSIS_LACKING_TAG], "no CPU log: said once, not guessed"
    assert "GPU 0: peak memory 0.4 GB of 40 GB, SMACT p95 0.00: fits a 1g.5gb MIG slice" in tags[diagnosis_tag(FITS_SMALLER)], (
        "the GPU's size from its used MB and % (radt.gpus of an imported log has none): the one rule, a bucket's peaks"
    )

    full_codes = codes_of(_tags(store_uri, full))
    assert SMALL_KERNELS not in full_codes and IDLE_GPUS in full_codes
    assert NO_TENSOR_CORES in full_codes, "an fp32 grid on an A100: tensor pipes idle while the SMs are busy"

    mnist_tags = _tags(store_uri, mnist)
    peak_mib = max(_smi_column(LOGS["mnist"][1], "memory.used"))
    assert peak_mib * 1024 * 1024 < 0.95 * 5 * 1024**3, "the fixture's own peak fits a 1g.5gb slice"
    assert FITS_SMALLER in codes_of(mnist_tags) and "1g.5gb" in mnist_tags[diagnosis_tag(FITS_SMALLER)]
    assert f"{peak_mib * 1024 * 1024 / 1e9:.1f} GB of 40 GB" in mnist_tags[diagnosis_tag(FITS_SMALLER)]
    assert SMALL_KERNELS not in codes_of(mnist_tags) and INPUT_STARVED not in codes_of(mnist_tags)


# --- runs recorded through the fake NVML ---------------------------------------------------------------------------------


def _record(fake: FakeNvml, loads, seconds: int, extra=lambda t: {}) -> list[Point]:
    """`seconds` one-second samples of the NVML source on the fake driver, loads(t) -> {gpu: load} set before each tick,
    plus extra(t) -> {key: value} written beside them (the host's CPU)."""
    source = NvmlSource()
    source.open(SamplingContext(interval=1.0, devices=None, slices=[], pids=lambda: []))
    source.sample()
    points = []
    for t in range(seconds):
        for gpu, load in loads(t).items():
            fake.set_load(gpu, load)
        fake.clock.advance(1.0)
        ms = START + 1000 * t
        points += [Point(k, v, ms, t) for k, v in {**source.sample(), **extra(t)}.items() if isinstance(v, float) and math.isfinite(v)]
    source.close()
    return points


def _stored(uri: str, name: str, points: list[Point], seconds: int) -> str:
    client = MlflowClient(uri)
    experiment = client.create_experiment(name)
    run_id = radt_run(client, experiment, name, start_time=START)
    writer = open_metric_store(uri)
    writer.write(run_id, points)
    writer.close()
    client.set_terminated(run_id, "FINISHED", end_time=START + seconds * 1000)
    return run_id


def _stall(t: int) -> bool:
    return t % 10 >= 7  # 3 s of every 10 the GPU waits


def test_recurring_gaps_with_a_saturated_cpu_are_input_starved_and_with_an_idle_cpu_are_not(store_uri, nvml):
    seconds = 300
    found = {}
    for label, cpu in (("saturated", 100.0), ("idle", 3.0)):
        fake = nvml([H100])
        busy_cpu = lambda t, cpu=cpu: {key(MetricName.PROCESS_CPU_UTILIZATION_PERCENTAGE): cpu if _stall(t) else 40.0}  # noqa: E731
        points = _record(fake, lambda t: {0: 0.0 if _stall(t) else 0.8}, seconds, busy_cpu)
        found[label] = _stored(store_uri, label, points, seconds)
    client = MlflowClient(store_uri)
    result = diagnose_and_store(client, list(found.values()))
    starved = result[found["saturated"]]
    assert starved.codes == [INPUT_STARVED]
    sentence = _tags(store_uri, found["saturated"])[diagnosis_tag(INPUT_STARVED)]
    assert "GPU 0" in sentence and "1.0 cores" in sentence and "DataLoader workers" in sentence
    lost = next(f for f in starved.findings if f.code == INPUT_STARVED).numbers["lost_share"]
    assert lost == pytest.approx(0.3, abs=0.08), "3 s of every 10 lost"
    assert parse_spans(_tags(store_uri, found["saturated"])["radt.diagnosis.spans"])[INPUT_STARVED][0] >= START
    assert INPUT_STARVED not in result[found["idle"]].codes, "the same gaps with an idle CPU: not the data loader"


def test_power_capped_clocks_and_an_xid_event_reach_their_findings(store_uri, nvml):
    seconds = 120
    fake = nvml([H100])

    def extra(t: int) -> dict[str, float]:
        return {key(MetricName.CLOCKS_POWER_CAPPED, 0): 1.0 if t >= 60 else 0.0, key(MetricName.XID_ERROR, 0): 79.0 if t == 90 else 0.0}

    run_id = _stored(store_uri, "capped", _record(fake, lambda t: {0: 0.9}, seconds, extra), seconds)
    result = diagnose_and_store(MlflowClient(store_uri), [run_id])[run_id]
    assert THROTTLED in result.codes and HARDWARE_ERRORS in result.codes
    tags = _tags(store_uri, run_id)
    assert "GPU 0 by the power cap 50% of the time" in tags[diagnosis_tag(THROTTLED)]
    assert "XID 79" in tags[diagnosis_tag(HARDWARE_ERRORS)]


def test_one_slow_gpu_of_four_is_named_a_straggler(store_uri, nvml):
    seconds = 60
    fake = nvml([H100] * 4)
    run_id = _stored(store_uri, "ddp", _record(fake, lambda t: {0: 0.9, 1: 0.88, 2: 0.5, 3: 0.9}, seconds), seconds)
    result = diagnose_and_store(MlflowClient(store_uri), [run_id])[run_id]
    assert result.codes == [STRAGGLER]
    sentence = _tags(store_uri, run_id)[diagnosis_tag(STRAGGLER)]
    assert "GPU 2 SMACT 0.50 against a median of 0.90 on the other 3" in sentence and "GPU 1" not in sentence


def test_a_run_lacking_the_fields_says_so_and_gets_no_guessed_finding(store_uri):
    """A run with GPU util alone (no GPM, no DCGM): busy or not, no activity finding is guessed; what it lacked is said once."""
    points = [Point(key(MetricName.UTILIZATION_PERCENTAGE, 0), 95.0, START + 1000 * t, t) for t in range(60)]
    run_id = _stored(store_uri, "util only", points, 60)
    result = diagnose_and_store(MlflowClient(store_uri), [run_id])[run_id]
    assert result.codes == []
    lacking = _tags(store_uri, run_id)[DIAGNOSIS_LACKING_TAG]
    assert lacking.count("no SMACT series") == 2 and "small_kernels" in lacking and "throttled" in lacking
    assert _tags(store_uri, run_id)[DIAGNOSIS_TAG] == ""


def test_a_run_diagnosed_anew_keeps_no_stale_finding_and_radt_diagnose_fills_older_runs(store_uri, capsys):
    points = [Point(key(MetricName.GR_ENGINE_ACTIVE, g), 0.0, START + 1000 * t, t) for g in (0, 1) for t in range(40)]
    points += [Point(key(MetricName.GR_ENGINE_ACTIVE, 0), 0.9, START + 1000 * t, t) for t in range(40, 120)]
    points += [Point(key(MetricName.GR_ENGINE_ACTIVE, 1), 0.0, START + 1000 * t, t) for t in range(40, 120)]
    run_id = _stored(store_uri, "older", points, 120)
    assert DIAGNOSIS_TAG not in _tags(store_uri, run_id), "recorded before the diagnosis existed"
    assert command.main(["--store", store_uri]) == 0
    out = capsys.readouterr()
    assert f"{run_id}: idle_gpus" in out.out and "1 runs, 1 with findings" in out.err
    tags = _tags(store_uri, run_id)
    assert tags[DIAGNOSIS_VERSION_TAG] == "1" and "1 of 2 GPUs idle" in tags[diagnosis_tag(IDLE_GPUS)]
    assert float(tags["radt.footprint.idle_gpu_hours"]) == pytest.approx((1 + 1 / 3) * 120 / 3600, rel=0.1)
    assert command.main(["--store", store_uri]) == 0 and "already has a current diagnosis" in capsys.readouterr().err

    client = MlflowClient(store_uri)
    client.set_tag(run_id, diagnosis_tag(THROTTLED), "an older rule's finding")
    assert command.main([run_id, "--store", store_uri]) == 0
    assert diagnosis_tag(THROTTLED) not in _tags(store_uri, run_id), "not found this time: deleted"


def test_radt_diagnose_refuses_a_wrong_selection_in_one_line(store_uri, capsys):
    from radt.cli import main as radt_main

    assert radt_main(["diagnose", "no-such-run", "--store", store_uri]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    assert radt_main(["diagnose", "--since", "soon", "--store", store_uri]) == 2
    assert "--since 'soon' is not a span of time" in capsys.readouterr().err
    assert radt_main(["diagnose", "--experiment", "nope", "--store", store_uri]) == 2


def test_diagnosing_reads_rollups_not_raw_points(store_uri, nvml):
    """Evidence comes from the 10-second rollups: a run's raw points gone (radt retain) still diagnose the same."""
    seconds = 120
    fake = nvml([H100])
    run_id = _stored(store_uri, "kept", _record(fake, lambda t: {0: 0.9}, seconds), seconds)
    before, _ = diagnoses(MlflowClient(store_uri), [run_id])
    from radt.collectors.store.tracking import connect

    engine = connect(store_uri).engine
    import sqlalchemy as sa

    from radt import mlflowdb

    with engine.begin() as conn:
        conn.execute(sa.delete(mlflowdb.metrics).where(mlflowdb.metrics.c.run_uuid == run_id))
    after, _ = diagnoses(engine, [run_id])
    assert after[run_id].codes == before[run_id].codes and after[run_id].lacking == before[run_id].lacking
    assert Device(gpu=0).label == "GPU 0"
