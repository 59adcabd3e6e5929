"""The run filter (app/view/filters.py) on SQLite and the real PostgreSQL: the old word list, MLflow's search syntax read as
MLflow reads it (checked against MlflowClient.search_runs on the same store), radt's summaries, and one-line errors."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

from radt.app.view.filters import FilterError, Query, narrow, parse
from radt.app.view.filters import apply as apply_filter
from radt.diagnosis import Diagnosis, Finding
from radt.footprint import Footprint
from tests.support.state import dashboard_reads

pytestmark = pytest.mark.dialects  # the SQL radt issues differs per dialect: SQLite and the real PostgreSQL

BASE = 1_700_000_000_000
MINUTE = 60_000


@dataclasses.dataclass
class FilterStore:
    uri: str
    experiment: str
    runs: dict[str, str]  # label -> run id


# label: (batch_size, collocation, status, minutes (None: still running), SMACT values, SMOCC value, loss values (last = latest), step of the last loss)
RUNS = {
    "r1": ("128", "MPS", "FINISHED", 20, np.full(60, 0.2), 0.1, [0.9, 0.4], 9),
    "r2": ("128", "-", "FINISHED", 5, np.full(60, 0.8), 0.6, [0.8, 0.6], 49),
    "r3": ("256", "MPS", "FAILED", 15, np.full(60, 0.25), 0.2, [0.7, math.nan], 4),
    "r4": ("128", "MPS", "RUNNING", None, None, None, [0.5, 0.3], 2),
    "r5": ("64", "MIG", "KILLED", 60, np.linspace(0.0, 1.0, 60), 0.3, [1.5, 1.2], 99),
}
BASIS = "400 gCO2eq/kWh, PUE 1.2, 2 USD per GPU-hour"


def _diagnosed(codes: list[str], footprint: Footprint) -> dict[str, str]:
    """The tags radt's diagnosis and footprint write on a run (Diagnosis.tags, Footprint.tags)."""
    return Diagnosis([Finding(code, f"{code}: the numbers; the action", (BASE, BASE + MINUTE)) for code in codes]).tags() | footprint.tags()


JOBS = {  # two runs imported from Slurm (radt import --slurm's tags), and the diagnosis and footprint of three runs
    "r1": {"radt.slurm.job_id": "7001", "radt.slurm.partition": "a100"} | _diagnosed(["idle_gpus", "input_starved"], Footprint(4.0, 1.5, 2.5, 1.2, 8.0, BASIS)),
    "r2": _diagnosed([], Footprint(0.08, 0.0, None, None, 0.17, BASIS)),  # diagnosed, nothing found; no power series: no energy
    "r5": {"radt.slurm.job_id": "7002", "radt.slurm.partition": "h100"} | _diagnosed(["throttled"], Footprint(1.0, 0.0, 0.4, 0.19, 2.0, BASIS)),
}
NAMES = {"r1": "resnet-128-mps", "r2": "resnet-128-alone", "r3": "resnet-256-mps", "r4": "bert-128-mps", "r5": "ResNet-64-mig"}


def build_filter_store(uri: str) -> FilterStore:
    """Five runs that differ in every field the filter reads, written through MLflow's client."""
    client = MlflowClient(uri)
    experiment = client.create_experiment("filters")
    runs = {}
    for label, (batch, collocation, status, minutes, smact, smocc, losses, last_step) in RUNS.items():
        run_id = client.create_run(experiment, run_name=NAMES[label], start_time=BASE).info.run_id
        runs[label] = run_id
        # the first loss at step 0 (a loop counting from 0: its steps are the highest + 1), the latest at last_step
        metrics = [Metric("loss", v, BASE + i * 1000, 0 if i == 0 else last_step - len(losses) + 1 + i) for i, v in enumerate(losses)]
        if smact is not None:
            metrics += [Metric("system/gpu_0_sm_active", float(v), BASE + i * 1000, i) for i, v in enumerate(smact)]
            metrics += [Metric("system/gpu_0_sm_occupancy", smocc, BASE + i * 1000, i) for i in range(60)]
        tags = [RunTag("radt.collocation", collocation)] + [RunTag(k, v) for k, v in JOBS.get(label, {}).items()]
        client.log_batch(run_id, metrics=metrics, params=[Param("batch_size", batch)], tags=tags)
        if minutes is not None:
            client.set_terminated(run_id, status, end_time=BASE + minutes * MINUTE)
    return FilterStore(uri, experiment, runs)


@pytest.fixture
def store(store_uri, snapshots, monkeypatch):
    """The five runs in the test's own store, the dashboard's cached reads pointed at it."""
    built = dataclasses.replace(snapshots.restore(build_filter_store, store_uri), uri=store_uri)
    with dashboard_reads(store_uri, monkeypatch):
        yield built


def _labels(store: FilterStore, text: str) -> set[str]:
    from radt.app.view import data

    runs = data.runs([store.experiment])
    kept = set(apply_filter(runs, text)["run_id"])
    return {label for label, run_id in store.runs.items() if run_id in kept}


# --- MLflow's search syntax, as MLflow reads it -----------------------------------------------------

MLFLOW_FILTERS = {
    "params.batch_size = '128' and tags.radt.collocation = 'MPS' and attributes.status = 'FINISHED'": {"r1"},  # the example
    "tags.`mlflow.runName` = 'resnet-128-alone'": {"r2"},
    "attributes.run_name LIKE '%resnet%'": {"r1", "r2", "r3"},  # LIKE is case-sensitive, as in MLflow
    "attributes.run_name ILIKE '%resnet%'": {"r1", "r2", "r3", "r5"},
    "run_name LIKE 'resnet-_28%'": {"r1", "r2"},
    "params.batch_size != '128'": {"r3", "r5"},
    'params.batch_size = "256"': {"r3"},
    "tags.radt.collocation ILIKE 'm%'": {"r1", "r3", "r4", "r5"},
    "attributes.run_id IN ('{r2}', '{r5}')": {"r2", "r5"},
    "attributes.run_id NOT IN ('{r2}', '{r5}')": {"r1", "r3", "r4"},
    "status = 'RUNNING'": {"r4"},
    "metrics.loss < 0.5": {"r1", "r4"},  # the latest value; r3's is NaN
    "metrics.loss <= 0.6": {"r1", "r2", "r4"},
    "metrics.loss > 0.5": {"r2", "r5"},
    "metrics.loss >= 1.2": {"r5"},
    "metrics.loss = 0.4": {"r1"},
    "metrics.loss != 0.4": {"r2", "r3", "r4", "r5"},  # a NaN passes != alone
    "metrics.missing < 1": set(),
    "params.batch_size IS NULL": set(),
    "params.batch_size IS NOT NULL": {"r1", "r2", "r3", "r4", "r5"},
    "params.lr IS NULL": {"r1", "r2", "r3", "r4", "r5"},
    f"attributes.start_time >= {BASE} and metrics.loss < 1": {"r1", "r2", "r4"},
    "tags.`radt.diagnosis` LIKE '%input_starved%'": {"r1"},
    "tags.`radt.diagnosis` = ''": {"r2"},
}


@pytest.mark.parametrize("text, expected", list(MLFLOW_FILTERS.items()), ids=list(MLFLOW_FILTERS))
def test_mlflows_search_syntax_keeps_the_runs_mlflow_keeps(store, text, expected):
    text = text.format(**store.runs)
    mlflow_ids = {r.info.run_id for r in MlflowClient(store.uri).search_runs([store.experiment], filter_string=text)}
    assert {label for label, run_id in store.runs.items() if run_id in mlflow_ids} == expected, "the expectation is MLflow's own answer"
    assert _labels(store, text) == expected


# --- radt's summaries and the old words ----------------------------------------------------------------

RADT_FILTERS = {
    "smact.mean < 0.3": {"r1", "r3"},  # r4 recorded no SMACT: no figure passes no comparison
    "smact.mean < 30%": {"r1", "r3"},
    "smact.p95 > 0.9": {"r5"},
    "smocc.mean >= 0.5": {"r2"},
    "smocc.p95 < 0.15": {"r1"},
    "duration > 10m": {"r1", "r3", "r4", "r5"},  # r4 still runs: its duration grows to now
    "duration <= 300s": {"r2"},
    "duration > 0.5h and duration < 2h": {"r5"},
    "steps >= 50": {"r2", "r5"},  # the highest step of the run's own metrics + 1, as they start at step 0
    "throughput > 100": {"r2"},  # steps/h: 50 steps in 5 min = 600/h; r5: 100 in an hour
    "throughput >= 100": {"r2", "r5"},
    "params.batch_size = '128' and smact.mean < 0.3": {"r1"},
    "resnet mps": {"r1", "r3"},  # the old word list: every word in name, workload, letter, status or param=value
    "RESNET 128": {"r1", "r2"},
    "batch_size=256": {"r3"},  # a param=value word, as before
    "killed": {"r5"},
    "'resnet-128'": {"r1", "r2"},
    "attributes.status IN ('FAILED', 'KILLED')": {"r3", "r5"},  # IN for every text field (MLflow: for run_id alone)
    "status NOT IN ('FAILED', 'KILLED') and params.batch_size IN ('128')": {"r1", "r2", "r4"},
    "resnet and status = 'FAILED'": {"r3"},
    "status=FINISHED metrics.loss<0.5": {"r1"},
    "diagnosis LIKE '%input_starved%'": {"r1"},  # radt's words for tags: the diagnosis' codes, a Slurm job's
    "diagnosis LIKE '%idle%'": {"r1"},
    "diagnosis = ''": {"r2"},  # diagnosed, nothing found
    "diagnosis IS NULL": {"r3", "r4"},  # never diagnosed
    "diagnosis ILIKE '%THROTTLED%' and partition = 'h100'": {"r5"},
    "energy.kwh > 1": {"r1"},  # the footprint (radt.footprint.*): r2 has no energy, which passes no comparison
    "energy.kwh >= 400wh": {"r1", "r5"},
    "energy.kwh != 0": {"r1", "r5"},
    "co2.kg < 1": {"r5"},
    "co2.kg > 500g": {"r1"},
    "cost >= 2": {"r1", "r5"},
    "idle.gpu_hours > 1h": {"r1"},
    "idle.gpu_hours = 0 and gpu_hours <= 1": {"r2", "r5"},
    "idle.gpu_hours > 0 and diagnosis LIKE '%throttled%'": set(),
    "job IN ('7001', '7002') and smact.mean < 0.3": {"r1"},
    "": {"r1", "r2", "r3", "r4", "r5"},
}


@pytest.mark.parametrize("text, expected", list(RADT_FILTERS.items()), ids=list(RADT_FILTERS))
def test_radts_summaries_and_the_old_word_list(store, text, expected):
    assert _labels(store, text) == expected


def test_summaries_are_read_only_for_the_runs_the_cheaper_terms_left(store, monkeypatch):
    from radt.app.view import data, filters

    asked = []
    original = data.summary
    monkeypatch.setattr(data, "summary", lambda runs: asked.append(set(runs["run_id"])) or original(runs))
    runs = data.runs([store.experiment])
    kept = filters.apply(runs, "attributes.status = 'FAILED' and smact.mean < 0.3")
    assert list(kept["run_id"]) == [store.runs["r3"]]
    assert asked == [{store.runs["r3"]}], "the summary of one run, not of five"
    asked.clear()
    assert filters.apply(runs, "status = 'nothing' and smact.mean < 0.3").empty and asked == [], "nothing left: no summary at all"
    assert list(filters.apply(runs, "energy.kwh > 1")["run_id"]) == [store.runs["r1"]]
    assert asked == [], "the footprint is in the run list (its tags): no summary read for it"


def test_a_case_that_differs_says_how_to_match_it(store):
    from radt.app.view import data

    narrowed = narrow(data.runs([store.experiment]), "tags.radt.collocation = 'mps'")
    assert narrowed.runs.empty and not narrowed.error
    assert narrowed.hint == "No run matches; 3 would with the case ignored: = compares exactly, as in MLflow; write tags.radt.collocation ILIKE 'mps'."


def test_a_key_no_run_has_says_so_and_names_the_one_meant(store):
    """The demo's param is batch-size, MLflow's examples write batch_size: '0 of 7 runs match' alone left the user guessing."""
    from radt.app.view import data

    runs = data.runs([store.experiment])
    texts = ("params.`batch-size` = '128'", "params.lr = '0.1'", "tags.radt.colocation = 'MPS'", "metrics.los < 1", "metrics.`system/gpu_0_sm_activ` > 0")
    hints = {text: narrow(runs, text) for text in texts}
    assert all(n.runs.empty and not n.error for n in hints.values())
    assert hints["params.`batch-size` = '128'"].hint == "No run here has the param 'batch-size': did you mean params.batch_size?"
    assert hints["params.lr = '0.1'"].hint == "No run here has the param 'lr'; the params here: batch_size."
    assert hints["tags.radt.colocation = 'MPS'"].hint == "No run here has the tag 'radt.colocation': did you mean tags.radt.collocation?"
    assert hints["metrics.los < 1"].hint == "No run here has the metric 'los': did you mean metrics.loss?"
    assert hints["metrics.`system/gpu_0_sm_activ` > 0"].hint.endswith("did you mean metrics.`system/gpu_0_sm_active`?")
    long = narrow(runs, f"params.`{'x' * 5000}` = '1'").hint
    assert long.startswith("No run here has the param 'xxx") and len(long) < 200, "a link's 5,000-character key is not echoed whole"
    assert narrow(runs, "params.lr IS NULL").hint == "" and len(narrow(runs, "params.lr IS NULL").runs) == 5, "asking for its absence is no mistake"


def test_a_filter_that_cannot_be_read_keeps_every_run_and_says_why(store):
    from radt.app.view import data

    runs = data.runs([store.experiment])
    narrowed = narrow(runs, "foo.bar = 1")
    assert len(narrowed.runs) == 5
    assert narrowed.error.startswith("unknown field 'foo.bar': use params., tags., attributes., metrics. or one of smact.mean, smact.p95, smact.busiest")


# --- errors: one line each, saying what to change ----------------------------------------------------

ERRORS = {
    "foo.bar = 1": "unknown field 'foo.bar': use params., tags., attributes., metrics. or one of smact.mean, smact.p95, smact.busiest, smocc.mean, "
    "smocc.p95, gract.mean, power.mean, gpus.used, share.sm, duration, steps, throughput, memory.peak, memory.run_peak, energy, cpu.mean, energy.kwh, co2.kg, "
    "cost, gpu_hours, idle.gpu_hours, letter, diagnosis, partition, job",
    "energy.kwh > 3x": "energy.kwh > 3x: expected a number (kWh, Wh or MWh)",
    "diagnosis < 'a'": "diagnosis: '<' is not one of =, !=, LIKE, ILIKE, IN, NOT IN, IS NULL, IS NOT NULL",
    "flags LIKE '%idle%'": "unknown field 'flags'",  # the verdict's flags are gone: the diagnosis replaced them
    "foo < 3": "unknown field 'foo': use params.",
    "params.batch_size < '3'": "params.batch_size: '<' is not one of =, !=, LIKE, ILIKE, IN, NOT IN, IS NULL, IS NOT NULL (params and tags are text",
    "metrics.loss LIKE '1%'": "metrics.loss: 'LIKE' is not one of =, !=, <, <=, >, >=",
    "metrics.loss < abc": "metrics.loss < abc: expected a number",
    "duration > 10x": "duration > 10x: expected a number (s, m or h)",
    "cpu.mean > 5cores": "cpu.mean > 5cores: expected a number (% of all cores)",  # the host's CPU (cpu_utilization_percentage)
    "power.mean > 3x": "power.mean > 3x: expected a number (W or kW)",
    "smact.mean <": "expected a value after 'smact.mean <'",
    "params.model = 'resnet": "unclosed quote ' at character 16",
    "tags.`mlflow.runName = 'a'": "unclosed backtick at character 6",
    "status = 'A' or status = 'B'": "OR is not supported: MLflow's filter joins comparisons with AND",
    "status IN 'FAILED'": "expected a list after 'status IN'",
    "status IN ('FAILED' 'KILLED')": "expected , or ) in the list after 'status IN', found 'KILLED'",
    "status IN ('FAILED'": "unclosed list after 'status IN'",
    "attributes.user_id = 'me'": "attributes.user_id is not in radt's run list",
    "attributes.colour = 'red'": "unknown attribute 'colour'",
    "datasets.name = 'x'": "'datasets.name': radt's filter does not read datasets",
    "(status = 'FAILED')": "unexpected '(' at character 1",
    "params.a IS 'x'": "params.a IS: write IS NULL or IS NOT NULL",
    "params.a NOT LIKE 'x'": "params.a: NOT LIKE is not in MLflow's filter",
    "metrics. < 1": "'metrics.' names no key",
}


@pytest.mark.parametrize("text, message", list(ERRORS.items()), ids=list(ERRORS))
def test_errors_are_one_line_saying_what_to_change(text, message):
    with pytest.raises(FilterError) as caught:
        parse(text)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_the_parse_of_mlflows_forms():
    terms = parse("tags.`mlflow.runName` = 'it''s' AND run.status != \"X\" and params.`batch size` IN ('1', \"2\")").terms
    assert [(t.kind, t.key, t.op, t.value) for t in terms] == [
        ("tag", "mlflow.runName", "=", "it's"),
        ("attribute", "status", "!=", "X"),
        ("param", "batch size", "IN", ("1", "2")),
    ]
    assert parse("created > 5 and Run.run_id = 'a'").terms[0] == parse("attributes.start_time > 5").terms[0]
    assert (
        parse("duration > 1.5h").terms[0].value == 5400 and parse("energy < 2kJ").terms[0].value == 2000 and parse("memory.peak > 1GB").terms[0].value == 1000
    ), "radt's MB are 10^6 bytes (MLflow's), so a GB is 1,000 of them, as the verdicts' 'peak memory 5.5 GB' counts"
    assert [t.key for t in parse("wow! a!b !").terms] == ["wow!", "a!b", "!"], "a ! that starts no != is part of a word"
    assert isinstance(parse("resnet"), Query) and not parse("resnet batch=256").structured and parse("smact.mean < 0.3").structured


def test_a_500_run_list_is_filtered_row_by_row(store):
    """The evaluation itself: 500 rows of the run list through a structured filter, each row kept or not as its own
    values say (the picker's speed with 500 runs is bench/filter_picker.py's)."""
    import pandas as pd

    from radt.app.view import data

    runs = data.runs([store.experiment])
    many = pd.concat([runs] * 100, ignore_index=True)
    condition = "params.batch_size = '128' and tags.radt.collocation = 'MPS' and attributes.run_name LIKE '%mps' and duration > 10m"
    once = apply_filter(runs, condition)
    kept = apply_filter(many, condition)
    assert len(once) == 2 and len(kept) == 100 * len(once) and set(kept["run_id"]) == set(once["run_id"]), kept["run_id"].value_counts()


def test_the_filter_is_part_of_the_view_in_the_url():
    from radt.app.view.views import QUERY_LIMIT, View

    view = View.from_dict({"exp": "1", "runs": "", "q": "  params.batch_size = '128' and smact.mean < 0.3 "})
    assert view.query == "params.batch_size = '128' and smact.mean < 0.3" and not view.notes
    assert view.to_dict()["q"] == view.query and View.from_dict(view.to_dict()) == view, "the link holds it and gives it back"
    assert "q" not in View.from_dict({"exp": "1"}).to_dict(), "no filter: no q in the link"
    assert View.from_dict({"q": ["first", "second"]}).query == "first", "a repeated q: the first, like the other one-valued keys"
    for junk in ("resnet\x00", "x" * (QUERY_LIMIT + 1), "a\nb"):
        view = View.from_dict({"q": junk})
        assert view.query == "" and view.notes == [f"ignored the run filter: not one line of at most {QUERY_LIMIT} printable characters"]
