"""`radt demo` run as a user runs it, on SQLite (the first test on the real PostgreSQL too), read back with MLflow's client.

The demo must give the dashboard what real radt runs give it (experiments, workload parents with
their runs as children, radt's tags and params, 1 Hz hardware series with steps and timestamps,
loss per epoch, latest_metrics) and tell the collocation story it is there for with the physics of
the tools: NVML and DCGM count per device, so runs sharing a GPU (time-slicing, MPS) both record the
GPU's totals, at or above the run alone's (MPS above time-slicing), while each run's own throughput
drops; a MIG run records its slice under the slice's keys. Data-loader stalls visible. Running it
again must not duplicate anything.
"""

from __future__ import annotations

import sqlite3
import time

import mlflow
import numpy as np
import pytest
from mlflow.entities import ViewType

from radt.catalogue import key
from radt.collectors import demo
from tests.support.radtproc import radt_env, run_radt

MINUTES = "3"
RESNET = "demo: resnet50 collocation"
BERT = "demo: bert fine-tuning"
WORKLOADS = {
    RESNET: {"1 alone": ("-", "A"), "2 same GPU": ("-", "AB"), "3 MPS": ("mps", "AB"), "4 MIG 3g.40gb": ("3g.40gb", "AB")},
    BERT: {"1 workers 1": ("-", "A"), "2 workers 8": ("-", "A"), "3 bert-large batch 64": ("-", "A")},
}
RATIOS = ["sm_active", "sm_occupancy", "gr_engine_active", "dram_active", "tensor_active"]
CHECKED = RATIOS + ["memory_usage_megabytes", "power_usage_watts", "energy_joules", "temperature_celsius"]
HOST_CHECKED = ["cpu_utilization_percentage", "process_cpu_utilization_percentage", "system_memory_usage_megabytes"]


def _demo(home, store, cwd, *args: str, minutes: str = MINUTES):
    return run_radt(["demo", "--minutes", minutes, *args], env=radt_env(home, store), cwd=cwd)


def _experiments(client) -> dict:
    return {e.name: e for e in client.search_experiments(view_type=ViewType.ALL) if e.name.startswith("demo")}


def _runs(client, experiments) -> list:
    return client.search_runs([e.experiment_id for e in experiments], max_results=1000)


def _history(client, run_id: str, metric_key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, timestamps, values) of one series as MLflow reads it back, in step order."""
    points = sorted(client.get_metric_history(run_id, metric_key), key=lambda m: m.step)
    return np.array([m.step for m in points]), np.array([m.timestamp for m in points]), np.array([m.value for m in points])


def _spec(experiment: str, workload: str, letter: str) -> demo.RunSpec:
    spec = next(e for e in demo.EXPERIMENTS if e.name == experiment)
    return next(r for w in spec.workloads if w.name == workload for r in w.runs if r.letter == letter)


def _key(metric: str, spec: demo.RunSpec) -> str:
    """Where the run recorded a GPU metric: its MIG slice's activity and memory under the slice's keys, the rest under GPU 0's."""
    own = spec.mig is not None and metric in (*RATIOS, "memory_usage_megabytes")
    return key(metric, 0, mig=spec.mig if own else None)


def _steady(values: np.ndarray) -> float:
    """The level of the steady epochs: stalls, evaluations, start-up and teardown sit below it."""
    return float(np.percentile(values, 75))


@pytest.mark.dialects  # the demo writes through radt's SQL path, per dialect
def test_demo_writes_workloads_runs_and_realistic_series(store_uri, radt_home, tmp_path):
    result = _demo(radt_home, store_uri, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert sum("/ workload" in line for line in lines) == 7, result.stdout
    assert "radt dashboard" in lines[-1] and "mlflow ui --backend-store-uri" in lines[-1], lines[-1]

    client = mlflow.MlflowClient(store_uri)
    experiments = _experiments(client)
    assert set(experiments) == {RESNET, BERT}
    for experiment in experiments.values():
        assert experiment.lifecycle_stage == "active"
        assert experiment.tags[demo.DEMO_TAG] == "true" and experiment.tags[demo.COMPLETE_TAG] == "true"
        assert "radt demo" in experiment.tags["mlflow.note.content"]

    runs = _runs(client, experiments.values())
    assert all(run.data.tags.get("radt.demo") == "true" for run in runs)
    parents = {run.info.run_id: run for run in runs if run.data.tags.get("radt.role") == "workload"}
    children = [run for run in runs if run.data.tags.get("radt.role") == "run"]
    assert len(parents) + len(children) == len(runs)
    by_name = {e.experiment_id: name for name, e in experiments.items()}

    # structure: one parent per workload, its runs as children with radt's tags and the script's params
    found: dict[str, dict[str, dict]] = {name: {} for name in WORKLOADS}
    for parent in parents.values():
        workload = parent.data.tags["radt.workload"]
        found[by_name[parent.info.experiment_id]][workload] = {"parent": parent, "runs": {}}
    for run in children:
        tags, params = run.data.tags, run.data.params
        entry = found[by_name[run.info.experiment_id]][tags["radt.workload"]]
        assert tags["mlflow.parentRunId"] == entry["parent"].info.run_id
        entry["runs"][tags["radt.letter"]] = run
        assert tags["radt.devices"] == "0" and tags["radt.listeners"] == "nvml+host" and tags["radt.host"] == demo.HOST
        assert tags["radt.command"].startswith("python ") and tags["radt.points"].isdigit()
        assert {"model", "batch-size", "lr", "epochs", "workers", "command", "radt.interval"} <= set(params)
    for experiment, workloads in WORKLOADS.items():
        assert set(found[experiment]) == set(workloads)
        for workload, (collocation, letters) in workloads.items():
            entry = found[experiment][workload]
            assert "".join(sorted(entry["runs"])) == letters
            assert {run.data.tags["radt.collocation"] for run in entry["runs"].values()} == {collocation}

    # statuses: everything FINISHED but the BERT-large run that runs out of memory, and its workload
    failed = found[BERT]["3 bert-large batch 64"]
    assert failed["runs"]["A"].info.status == "FAILED" and failed["parent"].info.status == "FAILED"
    assert failed["runs"]["A"].data.tags["radt.exit_code"] == "1"
    others = [run for run in runs if run.info.run_id not in (failed["runs"]["A"].info.run_id, failed["parent"].info.run_id)]
    assert {run.info.status for run in others} == {"FINISHED"}

    # times: workloads one after another, children inside their parent, the last one ending before now
    now = time.time() * 1000
    ordered = [found[e][w]["parent"] for e in WORKLOADS for w in WORKLOADS[e]]
    for before, after in zip(ordered, ordered[1:]):
        assert before.info.end_time < after.info.start_time
    assert now - 3_600_000 < ordered[-1].info.end_time < now
    for entry in (found[e][w] for e in WORKLOADS for w in WORKLOADS[e]):
        for run in entry["runs"].values():
            assert entry["parent"].info.start_time <= run.info.start_time < run.info.end_time <= entry["parent"].info.end_time

    # series as MLflow reads them back: every hardware key, steps 0.., increasing real timestamps
    levels: dict[tuple[str, str], float] = {}
    series: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    for run in children:
        name = (run.data.tags["radt.workload"], run.data.tags["radt.letter"])
        spec = _spec(by_name[run.info.experiment_id], *name)
        assert set(run.data.metrics) == set(demo.hardware_keys(spec)) | {"loss", "accuracy"}, name
        values = {}
        for metric in CHECKED + HOST_CHECKED:
            metric_key = _key(metric, spec) if metric in CHECKED else key(metric)
            steps, stamps, values[metric] = _history(client, run.info.run_id, metric_key)
            assert list(steps) == list(range(len(steps))) and len(steps) >= 60, (name, metric)
            assert (np.diff(stamps) > 0).all() and run.info.start_time <= stamps[0] and stamps[-1] <= run.info.end_time
            # latest_metrics (what MLflow's UI and search show) is the last point
            assert run.data.metrics[metric_key] == pytest.approx(values[metric][-1])
        for ratio in RATIOS:
            assert ((values[ratio] >= 0) & (values[ratio] <= 1)).all(), (name, ratio)
        sm, occupancy, gract = values["sm_active"], values["sm_occupancy"], values["gr_engine_active"]
        assert (gract >= sm).all() and (occupancy <= sm).all() and (occupancy[sm > 0.01] < sm[sm > 0.01]).all()
        assert (np.diff(values["energy_joules"]) >= 0).all() and values["energy_joules"][0] == 0
        assert ((values["power_usage_watts"] > 20) & (values["power_usage_watts"] <= demo.POWER_CAP_W)).all()
        assert ((values["temperature_celsius"] > 25) & (values["temperature_celsius"] < 90)).all()
        assert values["memory_usage_megabytes"].max() <= demo.GPU_TOTAL_MB
        levels[name] = _steady(sm)
        series[name] = values

        # the run's own metrics: one point per finished epoch, step = epoch, loss down, accuracy up
        epochs, _, loss = _history(client, run.info.run_id, "loss")
        _, _, accuracy = _history(client, run.info.run_id, "accuracy")
        assert len(epochs) >= 1 and list(epochs) == list(range(1, len(epochs) + 1))
        if len(epochs) > 1:
            assert loss[-1] < loss[0] and accuracy[-1] > accuracy[0]

    # shapes of real training: warm-up from idle, memory ramping then flat, power following activity
    alone = series[("1 alone", "A")]
    sm = alone["sm_active"]
    assert sm[:3].max() < 0.05 and sm.max() > 0.5
    memory = alone["memory_usage_megabytes"]
    peak = memory.max()
    assert memory[0] < 0.1 * peak and np.ptp(memory[len(memory) // 3 : -10]) < 0.05 * peak
    assert np.corrcoef(sm, alone["power_usage_watts"])[0, 1] > 0.9
    # data-loader stalls: dips to near zero in the middle of training while the run's CPU goes up
    middle = slice(len(sm) // 5, -len(sm) // 10)
    cpu = alone["process_cpu_utilization_percentage"]
    stalls = (sm[middle] < 0.1 * levels[("1 alone", "A")]) & (cpu[middle] > np.median(cpu[middle]))
    assert stalls.sum() >= 2

    # the collocation story, as the tools record it: a shared GPU's totals in both runs, at or above the run alone's
    one = levels[("1 alone", "A")]
    for workload in ("2 same GPU", "3 MPS"):
        assert min(levels[(workload, "A")], levels[(workload, "B")]) >= one, (workload, levels, one)
    assert min(levels[("3 MPS", letter)] for letter in "AB") > max(levels[("2 same GPU", letter)] for letter in "AB")
    for letter in "AB":  # a MIG run: its slice's own activity, in fractions of the whole GPU
        mig = series[("4 MIG 3g.40gb", letter)]
        assert mig["sm_active"].max() <= 3 / 7 + 1e-9 and mig["gr_engine_active"].max() <= 3 / 7 + 1e-9
    # collocated runs take longer than the run alone; MPS less than time-slicing
    length = {name: len(values["sm_active"]) for name, values in series.items()}
    assert length[("1 alone", "A")] < length[("3 MPS", "A")] < length[("2 same GPU", "A")]

    # BERT: one data-loader worker starves the GPU and pegs two cores; the OOM run fills the GPU
    starved, fed = series[("1 workers 1", "A")], series[("2 workers 8", "A")]
    assert starved["sm_active"].mean() < 0.75 * fed["sm_active"].mean()
    assert 150 < np.median(starved["process_cpu_utilization_percentage"]) < 250
    assert series[("3 bert-large batch 64", "A")]["memory_usage_megabytes"].max() > 0.95 * demo.GPU_TOTAL_MB


def test_demo_again_skips_and_reset_replaces_with_the_same_values(store_uri, radt_home, tmp_path):
    # skipping and replacing do not depend on the length of the runs: the shortest demo keeps this quick
    first = _demo(radt_home, store_uri, tmp_path, minutes="1")
    assert first.returncode == 0, first.stderr
    client = mlflow.MlflowClient(store_uri)
    before = _experiments(client)
    runs_before = _runs(client, before.values())
    alone = next(r for r in runs_before if r.data.tags.get("radt.workload") == "1 alone" and r.data.tags["radt.role"] == "run")
    _, stamps_before, values_before = _history(client, alone.info.run_id, key("sm_active", 0))

    again = _demo(radt_home, store_uri, tmp_path, minutes="1")
    assert again.returncode == 0, again.stderr
    assert "already" in again.stdout and "--reset" in again.stdout
    assert {n: e.experiment_id for n, e in _experiments(client).items()} == {n: e.experiment_id for n, e in before.items()}
    assert len(_runs(client, before.values())) == len(runs_before)

    reset = _demo(radt_home, store_uri, tmp_path, "--reset", minutes="1")
    assert reset.returncode == 0, reset.stderr
    assert "soft-deleted" in reset.stdout
    after = _experiments(client)
    active = {name: e for name, e in after.items() if e.lifecycle_stage == "active"}
    retired = {name: e for name, e in after.items() if e.lifecycle_stage == "deleted"}
    assert set(active) == {RESNET, BERT}
    assert {e.experiment_id for e in retired.values()} == {e.experiment_id for e in before.values()}
    assert all("(replaced " in name for name in retired)
    runs_after = _runs(client, active.values())
    assert len(runs_after) == len(runs_before)
    # the same seed gives the same values; only the timestamps moved
    alone = next(r for r in runs_after if r.data.tags.get("radt.workload") == "1 alone" and r.data.tags["radt.role"] == "run")
    _, stamps_after, values_after = _history(client, alone.info.run_id, key("sm_active", 0))
    assert np.array_equal(values_after, values_before)
    assert stamps_after[0] > stamps_before[0]

    # a demo deleted in MLflow's UI (name kept by the soft delete) is written again without --reset
    client.delete_experiment(active[BERT].experiment_id)
    rewrite = _demo(radt_home, store_uri, tmp_path)
    assert rewrite.returncode == 0, rewrite.stderr
    assert "writing the demo again" in rewrite.stdout
    final = {name: e for name, e in _experiments(client).items() if e.lifecycle_stage == "active"}
    assert set(final) == {RESNET, BERT}
    assert len(_runs(client, final.values())) == len(runs_before)


def test_demo_into_the_default_store_and_its_refusals(radt_home, tmp_path, sqlite_template):
    # no MLFLOW_TRACKING_URI, no --store: the embedded store under RADT_HOME, which the dashboard finds by itself
    result = _demo(radt_home, None, tmp_path, minutes="1")
    assert result.returncode == 0, result.stderr
    database = radt_home / "mlflow.db"
    assert f"mlflow ui --backend-store-uri 'sqlite:///{database}'" in result.stdout
    assert "`radt dashboard`" in result.stdout
    with sqlite3.connect(database) as conn:
        names = {row[0] for row in conn.execute("select name from experiments where lifecycle_stage = 'active'")}
    assert {RESNET, BERT} <= names

    bad = _demo(radt_home, None, tmp_path, minutes="0")
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.strip().splitlines()) == 1 and "--minutes" in bad.stderr

    # an experiment of the user's that happens to carry a demo name is never touched
    other = tmp_path / "other.db"
    other.write_bytes(sqlite_template.read_bytes())
    uri = f"sqlite:///{other}"
    mlflow.MlflowClient(uri).create_experiment(BERT)
    refused = run_radt(["demo", "--minutes", "1", "--reset", "--store", uri], env=radt_env(radt_home), cwd=tmp_path)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1 and "not radt demo data" in refused.stderr
    assert {e.name for e in mlflow.MlflowClient(uri).search_experiments()} == {"Default", BERT}


def test_generator_is_deterministic_per_seed():
    experiment = demo.EXPERIMENTS[0]
    workload = experiment.workloads[1]
    one, sibling = demo.generate_workload(0, experiment, workload, 5)
    same = demo.generate_workload(0, experiment, workload, 5)[0]
    other = demo.generate_workload(1, experiment, workload, 5)[0]
    sm = key("sm_active", 0)
    assert np.array_equal(one.series[sm], same.series[sm]) and one.epochs == same.epochs
    assert not np.array_equal(one.series[sm], other.series[sm][: one.samples])
    assert not np.array_equal(one.demand["sm_active"][: sibling.samples], sibling.demand["sm_active"][: one.samples]), "each run its own work"


def _steady_of(run: demo.RunData, metric: str = "sm_active") -> float:
    found = [values for name, values in run.series.items() if name.endswith(f"_{metric}")]
    assert len(found) == 1, (run.spec.letter, metric, sorted(run.series))
    return _steady(found[0])


def test_runs_sharing_a_gpu_record_its_totals_and_each_trains_slower():
    """NVML and DCGM count per device: time-sliced or under MPS, both runs record the GPU's own SMACT, GRACT, power, at or
    above the run alone's (MPS above time-slicing, never above 1), while each run takes longer than alone; a MIG run
    records its slice under the slice's keys, and the GPU's power under the GPU's."""
    experiment = demo.EXPERIMENTS[0]
    made = {w.name: demo.generate_workload(0, experiment, w, 5) for w in experiment.workloads}
    (alone,) = made["1 alone"]
    steady = {name: [_steady_of(run) for run in runs] for name, runs in made.items()}
    for name in ("2 same GPU", "3 MPS"):
        a, b = made[name]
        assert min(steady[name]) >= steady["1 alone"][0], (name, steady)
        shift = b.spec.delay_s - a.spec.delay_s  # B's sample i is the device's second shift + i, as A's sample shift + i
        both = min(a.samples - shift, b.samples)
        for metric in ("sm_active", "gr_engine_active", "dram_active", "utilization_percentage", "power_usage_watts", "memory_usage_megabytes"):
            series = key(metric, 0)
            assert np.array_equal(a.series[series][shift : shift + both], b.series[series][:both]), f"{name}: both runs record the GPU's {metric}"
            assert (a.series[series] <= (1 if metric.endswith("_active") else np.inf)).all()
        assert _steady_of(a, "power_usage_watts") > _steady_of(alone, "power_usage_watts"), name
        own, device = key("process_memory_megabytes", 0), key("memory_usage_megabytes", 0)
        for run in (a, b):  # each run's own memory (NVML's per-process lists): its part of the GPU's, as much as alone
            assert run.series[own].max() < run.series[device].max() and run.series[own].max() == pytest.approx(alone.series[own].max(), rel=0.05), name
        # each run's own throughput drops (the same epochs take longer); the pair's together is more than one alone
        assert all(run.samples > alone.samples for run in (a, b)), name
        assert sum(alone.samples / run.samples for run in (a, b)) > 1, name
    assert min(steady["3 MPS"]) > max(steady["2 same GPU"]), steady
    assert sum(alone.samples / r.samples for r in made["3 MPS"]) > sum(alone.samples / r.samples for r in made["2 same GPU"])

    for run in made["4 MIG 3g.40gb"]:
        assert key("sm_active", 0) not in run.series and key("utilization_percentage", 0) not in run.series, "no whole-GPU activity under MIG"
        assert run.series[key("sm_active", 0, mig=run.spec.mig)].max() <= 3 / 7 + 1e-9, "a 3g.40gb slice: 3/7 of the SMs at most"
        assert key("power_usage_watts", 0) in run.series and set(run.series) == set(demo.hardware_keys(run.spec))
    assert {run.spec.mig for run in made["4 MIG 3g.40gb"]} == {1, 2}, "two slices, two GPU instances"


def test_runs_sharing_a_gpu_record_their_own_share_of_it_beside_the_devices():
    """The newcomer's complaint (issue #55): the demo's collocated runs drew one device line each, hiding each other. Each
    run records its own share too (as NVML's per-process samples give radt): alone the device's utilization, together two
    different lines that never sum past it, and a power estimate that splits the GPU's power between them."""
    experiment = demo.EXPERIMENTS[0]
    made = {w.name: demo.generate_workload(0, experiment, w, 5) for w in experiment.workloads}
    sm, util = key("run_sm_utilization_percentage", 0), key("utilization_percentage", 0)
    watts, device_watts = key("run_power_watts", 0), key("power_usage_watts", 0)
    (alone,) = made["1 alone"]
    working = alone.series[util] > 0
    assert np.allclose(alone.series[sm][working], alone.series[util][working], atol=1), "alone: its share is the GPU's"
    for name in ("2 same GPU", "3 MPS"):
        a, b = made[name]
        shift = b.spec.delay_s - a.spec.delay_s
        both = min(a.samples - shift, b.samples)
        mine, theirs = a.series[sm][shift : shift + both], b.series[sm][:both]
        assert not np.array_equal(mine, theirs), f"{name}: two lines, not one"
        assert (mine + theirs <= a.series[util][shift : shift + both] + 1).all(), f"{name}: the shares never sum past the device"
        power = a.series[watts][shift : shift + both] + b.series[watts][:both]
        own = key("process_memory_megabytes", 0)
        held = (a.series[own][shift : shift + both] > 0) | (b.series[own][:both] > 0)  # before any CUDA context the idle GPU is nobody's
        assert held.sum() > 0.9 * both
        assert np.allclose(power[held], a.series[device_watts][shift : shift + both][held], rtol=1e-6), f"{name}: the estimates split the GPU's power"
    for run in made["4 MIG 3g.40gb"]:
        assert sm not in run.series, "a MIG slice: its own activity is the slice's series"


def _hold_metrics(pg_uri: str):
    """Another connection holding MLflow's metrics table (a long transaction, a migration): every bulk write waits on it."""
    import psycopg2

    blocker = psycopg2.connect(pg_uri)
    blocker.cursor().execute("LOCK TABLE metrics IN ACCESS EXCLUSIVE MODE")  # held until rollback
    return blocker


def test_a_store_too_busy_to_answer_in_time_is_one_line_and_the_demo_tries_again(pg_uri, radt_home, tmp_path):
    """On a loaded machine `radt demo --store postgresql://...` ended in a 65-line traceback (a statement timeout); the
    second try worked. The demo says it in one line and tries again itself; the store answering again, it completes."""
    from tests.support.radtproc import LiveRadt

    blocker = _hold_metrics(pg_uri)
    try:
        demo_run = LiveRadt(["demo", "--minutes", "1"], env=radt_env(radt_home, pg_uri, extra={"RADT_STORE_TIMEOUT": "1"}), cwd=tmp_path)
        said = demo_run.line("trying again", timeout=120)
    finally:
        blocker.rollback()
        blocker.close()
    assert demo_run.wait(180) == 0, demo_run.stderr
    assert "Traceback" not in demo_run.stderr and said.startswith("radt demo: the store did not answer within RADT_STORE_TIMEOUT=1 s"), demo_run.stderr
    client = mlflow.MlflowClient(pg_uri)
    active = {name: e for name, e in _experiments(client).items() if e.lifecycle_stage == "active"}
    assert set(active) == {RESNET, BERT} and all(e.tags.get("radt.demo.complete") == "true" for e in active.values())


def test_a_store_that_never_answers_in_time_ends_the_demo_in_one_line_saying_how_to_retry(pg_uri, radt_home, tmp_path):
    blocker = _hold_metrics(pg_uri)
    try:
        done = run_radt(["demo", "--minutes", "1"], env=radt_env(radt_home, pg_uri, extra={"RADT_STORE_TIMEOUT": "1"}), cwd=tmp_path, timeout=300)
    finally:
        blocker.rollback()
        blocker.close()
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert lines[-1].startswith("radt demo: the store did not answer within RADT_STORE_TIMEOUT=1 s") and "radt demo" in lines[-1][20:], lines
    assert "RADT_STORE_TIMEOUT=30" in lines[-1], "how to give a loaded store more time"


def test_the_demos_runs_show_several_findings_and_its_stalled_bert_run_is_input_starved(store_uri):
    """The demo is diagnosed as it is written (issue 54): the one-worker bert run waits for its data loader, the MPS pair
    runs into the power cap; every run carries a current diagnosis."""
    from mlflow import MlflowClient

    demo.write_demo(store_uri, minutes=3, report=lambda line: None)
    client = MlflowClient(store_uri)
    found = {}
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id], filter_string="tags.`radt.role` = 'run'"):
            found[(experiment.name, run.info.run_name)] = run.data.tags
    assert found and all("radt.diagnosis.version" in tags for tags in found.values())
    assert found[("demo: bert fine-tuning", "bert-base 1A")]["radt.diagnosis"].split(",")[0] == "input_starved"  # (and it fits a slice)
    codes = {code for tags in found.values() for code in tags["radt.diagnosis"].split(",") if code}
    assert {"input_starved", "throttled"} <= codes
    assert "throttled" in found[("demo: resnet50 collocation", "resnet50 3A")]["radt.diagnosis"]
