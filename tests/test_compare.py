"""The comparison table (app/summary/compare.py through app.export.paper.comparison_table, as the explore page and
`radt export --table` show it) on SQLite and the real PostgreSQL: every figure against a hand computation.

One experiment holds every shape the table must tell apart, all of one command unless said:
- solo1, solo2: plain runs (no workload), overlapping in time, yet each ran by itself; solo2's script
  ran 30 of its run's 70 minutes (radt's script start/exit tags);
- crashed: a plain run that FAILED (never a baseline);
- seq: a `-w` workload whose two runs ran one after another (no overlap: both alone);
- pair: a `-w` workload of two overlapping runs on the same GPU (together), energy from one counter;
- split: two overlapping runs of another command on two different GPUs (radt.gpus UUIDs);
- duo: a 2-GPU run of a third command, alone;
- profiled: a plain run of the first command under ncu (tag radt.profiler), alone and ten times slower: never a baseline.
"""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from radt.app.db.store import make_read_engine
from radt.app.export.aggregates import normalised
from radt.app.export.paper import comparison_table
from radt.app.exportcli import _open_store
from radt.app.summary.summaries import run_summary
from radt.app.view.views import View
from radt.collectors.store.stores import open_metric_store
from radt.points import Point
from radt.runmodel import SCRIPT_END_TAG, SCRIPT_START_TAG
from tests.support.radtproc import radt_env, run_radt
from tests.support.runs import radt_run

pytestmark = pytest.mark.dialects  # the SQL radt issues differs per dialect: SQLite and the real PostgreSQL

BASE = 1_700_000_000_000
MIN = 60_000
X = ("--model", "resnet50")  # the command most runs share
Z = ("--model", "bert")
Y = ("--model", "vit")


def _run(client, writer, experiment, name, start, end, *, steps, args=X, workload=None, letter="A", status="FINISHED", script=None, series=None, tags=None):
    """A radt run from `start` to `end` (ms) that logged loss at steps 0..steps-1, and its hardware series (key -> values, 1 s apart)."""
    run_id = radt_run(client, experiment, name, start_time=start, workload=workload, letter=letter, script_args=args)
    points = [Point("loss", 1.0 / (i + 1), start + 1000 * i, i) for i in range(steps)]
    for key, values in (series or {}).items():
        points += [Point(key, float(v), start + 1000 * i, i) for i, v in enumerate(values)]
    writer.write(run_id, points)
    if script:
        client.set_tag(run_id, SCRIPT_START_TAG, str(script[0]))
        client.set_tag(run_id, SCRIPT_END_TAG, str(script[1]))
    for key, value in (tags or {}).items():
        client.set_tag(run_id, key, value)
    client.set_terminated(run_id, status, end_time=end)
    return run_id


def _build(uri: str) -> tuple[str, dict[str, str]]:
    client = MlflowClient(uri)
    writer = open_metric_store(uri)
    exp = client.create_experiment("compare")
    energy, memory, smact = "system/gpu_{}_energy_joules", "system/gpu_{}_memory_usage_megabytes", "system/gpu_{}_sm_active"
    own = "system/gpu_{}_process_memory_megabytes"  # the run's processes' memory on the GPU (NVML's per-process lists)
    r = {}
    r["solo1"] = _run(client, writer, exp, "solo1", BASE, BASE + 60 * MIN, steps=10)
    r["solo2"] = _run(client, writer, exp, "solo2", BASE + 20 * MIN, BASE + 90 * MIN, steps=10, script=(BASE + 30 * MIN, BASE + 60 * MIN))
    r["crashed"] = _run(client, writer, exp, "crashed", BASE, BASE + 6 * MIN, steps=10, status="FAILED")
    r["seqA"] = _run(client, writer, exp, "seqA", BASE + 100 * MIN, BASE + 130 * MIN, steps=5, workload="seq")
    r["seqB"] = _run(client, writer, exp, "seqB", BASE + 131 * MIN, BASE + 161 * MIN, steps=15, workload="seq", letter="B")
    pair = {energy.format(0): [0, 600_000], memory.format(0): [5000, 4000], own.format(0): [2600, 2900]}
    r["pairA"] = _run(
        client, writer, exp, "pairA", BASE + 200 * MIN, BASE + 262 * MIN, steps=12, workload="pair", script=(BASE + 201 * MIN, BASE + 261 * MIN), series=pair
    )
    pair = {energy.format(0): [0, 400_000], memory.format(0): [3000, 2000], own.format(0): [1900, 1800]}
    r["pairB"] = _run(client, writer, exp, "pairB", BASE + 209 * MIN, BASE + 251 * MIN, steps=6, workload="pair", letter="B",
                      script=(BASE + 210 * MIN, BASE + 250 * MIN), series=pair)  # fmt: skip
    for letter, uuid, joules in (("A", "GPU-aaaa", 100_000), ("B", "GPU-bbbb", 200_000)):  # both their GPU 0, two physical GPUs
        gpus = json.dumps([{"series": "gpu_0", "uuid": uuid}])
        r[f"split{letter}"] = _run(client, writer, exp, f"split{letter}", BASE + 400 * MIN, BASE + 430 * MIN, steps=3, args=Z, workload="split",
                                   letter=letter, series={energy.format(0): [0, joules], own.format(0): [0, 0]}, tags={"radt.gpus": gpus})  # fmt: skip
    duo = {smact.format(0): [0.2, 0.4], smact.format(1): [0.6, 0.8, 1.0], energy.format(0): [0, 1000], energy.format(1): [0, 3000],
           memory.format(0): [2000, 1000], memory.format(1): [7000, 6000], own.format(0): [1500, 900], own.format(1): [6400, 6100]}  # fmt: skip
    r["duo"] = _run(client, writer, exp, "duo", BASE + 300 * MIN, BASE + 330 * MIN, steps=3, args=Y, workload="duo", series=duo)
    r["profiled"] = _run(client, writer, exp, "profiled", BASE + 500 * MIN, BASE + 560 * MIN, steps=1, tags={"radt.profiler": "ncu"})
    writer.close()
    _open_store(uri)
    return exp, r


def _table(exp: str, run_ids) -> tuple[dict[str, dict], dict[str, dict]]:
    """(run rows by run name, workload rows by workload label) of the table of these ticked runs."""
    table = comparison_table(View([exp], list(run_ids)))
    rows = table.to_dict("records")
    return {r["run"]: r for r in rows if r["kind"] == "run"}, {r["workload"]: r for r in rows if r["kind"] == "workload"}


@pytest.fixture
def built(store_uri, snapshots):
    built = snapshots.restore(_build, store_uri)  # _build()'s rows in the test's own store, filled once per test run (tests/support/snapshots.py)
    _open_store(store_uri)
    return built


# alone runs of X: solo1 10 steps in 60 min, solo2 10 in its script's 30 min, seqA 5 in 30, seqB 15 in 30 (crashed FAILED: not one)
ALONE_X = (10 / 1 + 10 / 0.5 + 5 / 0.5 + 15 / 0.5) / 4  # 17.5 steps/h


def test_runs_are_together_only_where_their_times_overlap(built):
    exp, r = built
    runs, workloads = _table(exp, r.values())
    together = {name: row["together"] for name, row in runs.items()}
    # solo1/solo2 overlap but are plain MLflow runs; seqA/seqB share a workload one after another; duo is alone in its own
    assert together == {"solo1": 1, "solo2": 1, "crashed": 1, "seqA": 1, "seqB": 1, "pairA": 2, "pairB": 2, "splitA": 2, "splitB": 2, "duo": 1, "profiled": 1}
    assert set(workloads) == {"workload pair", "workload split"}, "a workload row only for runs that ran together"
    assert workloads["workload pair"]["run"] == "workload pair: A+B together", "the row names its workload"


def test_a_run_alone_is_normalised_against_the_alone_runs_of_its_command(built):
    """The table left "normalised" blank for a run that ran alone while the collocation figure drew it at its steps/h over
    the same baseline, 1 for the only alone run of its command (issue 52). Now the table says what the figure draws."""
    exp, r = built
    runs, _ = _table(exp, r.values())
    for name, per_hour in (("solo1", 10.0), ("solo2", 20.0), ("seqA", 10.0), ("seqB", 30.0), ("crashed", 100.0)):  # X alone: ALONE_X
        assert runs[name]["normalised"] == pytest.approx(per_hour / ALONE_X), (name, runs[name]["normalised"])
        assert runs[name]["alone_steps_per_h"] == pytest.approx(ALONE_X) and runs[name]["alone_runs"] == 4, name
    for name in ("duo", "profiled"):  # the only alone run of its command (vit; ncu's): its own baseline
        assert runs[name]["normalised"] == pytest.approx(1.0) and runs[name]["alone_runs"] == 1, (name, runs[name]["normalised"])
    # the figure draws the same number for an alone run beside its command's collocated runs, and leaves out a command that never shared a GPU
    drawn = normalised(pd.DataFrame([runs[name] for name in ("solo1", "pairA", "duo")]))
    assert drawn[0] == pytest.approx(10.0 / ALONE_X) and drawn[1] == pytest.approx(12.0 / ALONE_X) and math.isnan(drawn[2]), list(drawn)


def test_alone_baseline_is_every_finished_run_of_the_command_that_ran_by_itself(built):
    exp, r = built
    runs, workloads = _table(exp, r.values())
    assert runs["seqA"]["steps_per_h"] == pytest.approx(10.0) and runs["seqB"]["steps_per_h"] == pytest.approx(30.0)
    a, b = runs["pairA"], runs["pairB"]
    assert a["steps"] == 12 and a["duration_min"] == pytest.approx(60.0) and a["steps_per_h"] == pytest.approx(12.0)  # 12 steps / 1 h
    assert b["steps"] == 6 and b["duration_min"] == pytest.approx(40.0) and b["steps_per_h"] == pytest.approx(9.0)  # 6 steps / (40/60) h
    assert a["alone_runs"] == 4 and a["alone_steps_per_h"] == pytest.approx(ALONE_X) and b["alone_steps_per_h"] == pytest.approx(ALONE_X)
    assert a["normalised"] == pytest.approx(12.0 / ALONE_X) and b["normalised"] == pytest.approx(9.0 / ALONE_X)
    w = workloads["workload pair"]
    assert w["steps_per_h"] == pytest.approx(12.0 + 9.0), "the sum of its runs' steps/h"
    assert w["normalised"] == pytest.approx(12.0 / ALONE_X + 9.0 / ALONE_X) == 1.2, "the sum of its runs' normalised"
    assert w["duration_min"] == pytest.approx(60.0), "first script start (201 min) to last exit (261 min)"
    assert math.isnan(w["steps"]) and math.isnan(w["alone_steps_per_h"]), "no sum of these is the group's"
    # split's command never ran alone: no baseline, no normalised, but its steps/h still add up
    s = workloads["workload split"]
    assert runs["splitA"]["alone_runs"] == 0 and math.isnan(runs["splitA"]["normalised"]) and math.isnan(s["normalised"])
    assert s["steps_per_h"] == pytest.approx(6.0 + 6.0)  # 3 steps in 30 min each


def test_a_run_under_a_profiler_is_named_by_it_and_is_no_baseline_for_runs_without(built):
    """ncu replays every kernel: on an H200 a loop of matrix products read SMACT 0.015 under it (docs/GPU.md). Taken as an
    alone run of its command it would halve every collocated run's baseline and double its normalised throughput."""
    exp, r = built
    runs, _ = _table(exp, [r["pairA"], r["profiled"]])
    assert runs["profiled"]["command"] == "ncu train.py --model resnet50" and runs["pairA"]["command"] == "train.py --model resnet50"
    assert runs["pairA"]["alone_runs"] == 4 and runs["pairA"]["alone_steps_per_h"] == pytest.approx(ALONE_X), "the profiled run is not among them"


def test_duration_is_the_scripts_own_time(built, store_uri):
    exp, r = built
    runs, _ = _table(exp, [r["solo1"], r["solo2"]])
    assert runs["solo1"]["duration_min"] == pytest.approx(60.0) and runs["solo1"]["steps_per_h"] == pytest.approx(10.0), (
        "no script tags: the run's start and end"
    )
    assert runs["solo2"]["duration_min"] == pytest.approx(30.0), "the script's 30 minutes, not the run's 70"
    assert runs["solo2"]["steps_per_h"] == pytest.approx(20.0)
    engine = make_read_engine(store_uri)
    assert run_summary(engine, [r["solo2"]])["duration_s"].iloc[0] == pytest.approx(1800.0)
    engine.dispose()


def test_a_partial_selection_gives_the_same_figures(built):
    exp, r = built
    full_runs, full_workloads = _table(exp, r.values())
    runs, workloads = _table(exp, [r["pairA"], r["seqB"]])
    assert set(runs) == {"pairA", "seqB"}
    for name in runs:
        assert runs[name] == pytest.approx(full_runs[name], nan_ok=True), name
    assert runs["pairA"]["together"] == 2 and runs["seqB"]["together"] == 1, "sizes from the store, not from the ticked runs"
    assert workloads == {"workload pair": pytest.approx(full_workloads["workload pair"], nan_ok=True)}, "the whole group's row, pairB included"


def test_a_two_gpu_run_covers_both_gpus(built):
    exp, r = built
    runs, _ = _table(exp, [r["duo"]])
    duo = runs["duo"]
    pooled = [0.2, 0.4, 0.6, 0.8, 1.0]  # GPU 0's two points and GPU 1's three
    assert duo["smact_mean"] == pytest.approx(3.0 / 5) and duo["smact_p95"] == pytest.approx(0.8 + 0.8 * (1.0 - 0.8)) == np.percentile(pooled, 95)
    assert duo["energy_kj"] == pytest.approx((1000 + 3000) / 1000), "summed over its GPUs"
    assert duo["peak_memory_per_gpu_mb"] == pytest.approx(7000.0), "the highest single GPU's peak, not a sum"


def test_a_runs_own_peak_memory_is_its_processes_and_the_gpus_holds_every_process(built):
    """Two runs together on GPU 0: the GPU's peak memory holds both (5,000 MB beside pairB's 1,900 MB), which the summary
    quoted as each run's peak; a run's own is the highest its processes held on one GPU (NVML's per-process lists)."""
    exp, r = built
    runs, workloads = _table(exp, r.values())
    assert runs["pairA"]["run_memory_peak_mb"] == pytest.approx(2900.0) and runs["pairA"]["peak_memory_per_gpu_mb"] == pytest.approx(5000.0)
    assert runs["pairB"]["run_memory_peak_mb"] == pytest.approx(1900.0)
    assert runs["duo"]["run_memory_peak_mb"] == pytest.approx(6400.0), "the highest of its GPUs, not a sum"
    assert math.isnan(runs["splitA"]["run_memory_peak_mb"]), "its processes never showed on a GPU: no figure, not 0"
    assert math.isnan(runs["solo1"]["run_memory_peak_mb"]), "no per-process series"
    assert math.isnan(workloads["workload pair"]["run_memory_peak_mb"]), "the runs' own peaks need not coincide: not summed"


def test_runs_on_one_gpu_count_its_energy_once(built):
    exp, r = built
    runs, workloads = _table(exp, r.values())
    assert runs["pairA"]["energy_kj"] == pytest.approx(600.0) and runs["pairB"]["energy_kj"] == pytest.approx(400.0)
    # both read GPU 0 of this host (no radt.gpus): the largest, not 600 + 400
    assert workloads["workload pair"]["energy_kj"] == pytest.approx(600.0)
    assert workloads["workload pair"]["peak_memory_per_gpu_mb"] == pytest.approx(5000.0)
    # split's runs both say "GPU 0", but radt.gpus names two physical GPUs: summed
    assert workloads["workload split"]["energy_kj"] == pytest.approx(100.0 + 200.0)


def test_radT_workloads_are_together_by_the_same_overlap_rule(store_uri):
    from mlflow.entities import Metric, Param

    client = MlflowClient(store_uri)
    exp = client.create_experiment("radT")
    ids = {}
    for name, workload, start, epochs in (("old1", "3", BASE, 6), ("old2", "3", BASE, 3), ("old3", "3", BASE + 120 * MIN, 10)):
        run_id = client.create_run(exp, run_name=name, start_time=start).info.run_id
        params = {"workload": workload, "letter": name[-1], "model": "resnet50", "params": "--batch-size 64"}
        client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()], metrics=[Metric("loss", 1.0, start + i, i) for i in range(epochs)])
        client.set_terminated(run_id, "FINISHED", end_time=start + 60 * MIN)
        ids[name] = run_id
    _open_store(store_uri)
    runs, workloads = _table(exp, ids.values())
    # old3 ran an hour after old1 and old2 in the same radT workload: alone, the baseline (10 epochs in 1 h)
    assert [runs[n]["together"] for n in ("old1", "old2", "old3")] == [2, 2, 1]
    assert runs["old1"]["normalised"] == pytest.approx(6 / 10) and runs["old2"]["normalised"] == pytest.approx(3 / 10)
    assert workloads["workload 3"]["normalised"] == pytest.approx(0.9) and workloads["workload 3"]["steps_per_h"] == pytest.approx(9.0)


def test_a_real_radt_run_records_the_scripts_start_and_exit(store_uri, radt_home, tmp_path):
    (tmp_path / "nap.py").write_text("import time\ntime.sleep(0.5)\n")
    before = int(time.time() * 1000)
    result = run_radt(["-e", "spans", "-l", "host", "--interval", "0.2", "nap.py"], env=radt_env(radt_home, store_uri), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    client = MlflowClient(store_uri)
    run = client.search_runs([client.get_experiment_by_name("spans").experiment_id])[0]
    start, end = int(run.data.tags[SCRIPT_START_TAG]), int(run.data.tags[SCRIPT_END_TAG])
    assert before <= run.info.start_time <= start <= end <= run.info.end_time
    assert end - start >= 500, "the script slept half a second"
    engine = make_read_engine(store_uri)
    assert run_summary(engine, [run.info.run_id])["duration_s"].iloc[0] == pytest.approx((end - start) / 1000), "the table's duration is the script's"
    engine.dispose()


def test_a_workloads_row_has_an_empty_logs_cell_not_undefined():
    """The summary table's markdown logs column printed "undefined" on a workload's "2 runs together" row (no key)."""
    import pandas as pd

    from radt.pages.parts.summary_table import table_rows

    table = pd.DataFrame(
        [{"run_id": "r1", "run": "resnet50 2A", "kind": "run"}, {"run_id": "w1", "run": "workload 2 same GPU: A+B together", "kind": "workload"}]
    )
    rows = table_rows(table)
    assert [r["logs"] for r in rows] == ["[logs](/runs/r1/artifacts)", ""]


def test_every_numeric_column_of_the_summary_groups_thousands():
    """J/step showed 32294.0 beside peak memory's 22,674: grouping was on for whole numbers only."""
    from radt.pages.parts.summary_table import COLUMNS, table_column

    numeric = [table_column(c) for c in COLUMNS if c.decimals is not None]
    assert numeric and all(c["format"]["specifier"].startswith(",") for c in numeric), [c["format"] for c in numeric]


def test_the_summary_names_a_command_by_what_tells_it_apart_and_keeps_it_whole_for_the_tooltip():
    """A sweep of one script read 'examples/trai…' in every row (the command cut at its column's 110 px): the batch size
    that told the runs apart was only in each cell's tooltip."""
    import pandas as pd

    from radt.pages.parts.summary_table import table_rows

    sweep = [f"examples/train.py --epochs 20 --batch-size {b}" for b in (128, 512)]
    table = pd.DataFrame(
        [
            {"run_id": "r1", "run": "a", "kind": "run", "command": sweep[0]},
            {"run_id": "r2", "run": "b", "kind": "run", "command": sweep[1]},
            {"run_id": "w1", "run": "a+b together", "kind": "workload", "command": sweep[1]},
            {"run_id": "r3", "run": "c", "kind": "run", "command": None},
        ]
    )
    rows = table_rows(table)
    assert [r["command"] for r in rows] == ["--batch-size 128", "--batch-size 512", "--batch-size 512", None]
    assert [r.get("command_whole") for r in rows] == [*sweep, sweep[1], None]
    alone = table_rows(table.iloc[:1])
    assert alone[0]["command"] == sweep[0], "one command shown: all of it"
