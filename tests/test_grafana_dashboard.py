"""examples/grafana/radt.json, the Grafana dashboard for `radt monitor --prometheus-port`: Grafana's current classic
schema, a Prometheus datasource variable, SMACT, SMOCC and GRACT per GPU and per run, and every query in it asks for
metric names and labels that radt's exposition really serves (names from the catalogue, labels from a real scrape)
and is PromQL that the real Prometheus parses (`promtool check rules` on the queries as recording rules)."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from radt.catalogue import METRICS, MetricName, exposition_name, key
from radt.collectors.monitor.exposition import PROCESS_GAUGES, Exposition, Training, bind
from radt.collectors.sources.gpushare import ProcessRow
from radt.points import Point
from tests.support import prometheus as prom
from tests.support import promtool
from tests.support.ports import free_port

DASHBOARD = Path(__file__).resolve().parent.parent / "examples" / "grafana" / "radt.json"
NOW_MS = 1_780_000_000_123
# PromQL words that are no metric name: set operators, modifiers
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan"}
ACTIVITY = (MetricName.SM_ACTIVE, MetricName.SM_OCCUPANCY, MetricName.GR_ENGINE_ACTIVE)  # SMACT, SMOCC, GRACT


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict) -> list[dict]:
    """Every panel, those inside a collapsed row too."""
    return [p for top in dashboard["panels"] for p in [top, *top.get("panels", [])]]


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target."""
    return [(f"panel {p['id']} {t['refId']}", t["expr"]) for p in panels(dashboard) for t in p.get("targets", [])]


def variables(dashboard: dict) -> list[dict]:
    return dashboard["templating"]["list"]


def variable_queries(dashboard: dict) -> list[tuple[str, str, str]]:
    """(name, selector, label) of each label_values(selector, label) variable."""
    found = []
    for var in variables(dashboard):
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query.strip())
        assert match, f"variable {var['name']}: {query}"
        found.append((var["name"], match.group(1), match.group(2)))
    return found


def without_variables(promql: str) -> str:
    """Grafana's template variables ($gpu, ${gpu}, ${gpu:regex}) as the regex that matches anything."""
    return re.sub(r"\$\{\w+(?::\w+)?\}|\$\w+", ".*", promql)


def metric_names(promql: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers outside strings, label matchers and by/on clauses that
    are no function, aggregation or keyword."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', promql)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][\w:]*", text):
        if text[match.end() :].lstrip().startswith("(") or match.group().lower() in KEYWORDS:
            continue
        names.add(match.group())
    return names


def label_names(promql: str) -> set[str]:
    """The label names a PromQL expression matches on or groups by."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', promql)
    found = {name for inside in re.findall(r"\{([^}]*)\}", text) for name in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", inside)}
    for inside in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", text):
        found.update(name.strip() for name in inside.split(",") if name.strip())
    return found


def served_names() -> set[str]:
    """Every metric name radt's exposition serves, from the catalogue: each metric's, and each process gauge's."""
    return {exposition_name(metric) for metric in METRICS.values()} | {name for name, _field, _help in PROCESS_GAUGES}


@pytest.fixture(scope="module")
def served_labels() -> set[str]:
    """The label names of a real scrape of radt's exposition: a training run's GPU, a MIG slice, a node's, the host, a process."""
    exposition: Exposition = bind("127.0.0.1", free_port(), "node-7", lambda line: None)
    training = Training("run-1", "resnet", "vision", "resnet", [{"series": "gpu_0", "index": 0, "uuid": "GPU-0"}], frozenset({111}))
    exposition.start(lambda: [training], lambda: "monitor-run", {"gpu_0": "GPU-0"}, lambda: [ProcessRow(0, 111, 35.0, 12.0, NOW_MS)])
    try:
        where = [key(MetricName.SM_ACTIVE, 0), key(MetricName.SM_ACTIVE, 1, mig=3), key(MetricName.SM_ACTIVE, 0, node="node-8")]
        exposition.put([Point(k, 0.5, NOW_MS, 1) for k in [*where, key(MetricName.CPU_UTILIZATION_PERCENTAGE)]])
        with urllib.request.urlopen(f"http://127.0.0.1:{exposition.server.server_address[1]}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        exposition.stop()
    return {label for family in text_string_to_metric_families(text) for sample in family.samples for label in sample.labels}


def test_the_dashboard_is_in_grafanas_current_schema_with_a_prometheus_datasource_variable(dashboard):
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["uid"] and dashboard["title"] and dashboard["id"] is None  # importable: Grafana gives the id
    (source,) = [v for v in variables(dashboard) if v["type"] == "datasource"]
    assert source["query"] == "prometheus"
    uses = f"${{{source['name']}}}"
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": uses}, panel["title"]
        assert all(t["datasource"] == panel["datasource"] for t in panel["targets"]), panel["title"]
    assert all(v["datasource"] == {"type": "prometheus", "uid": uses} for v in variables(dashboard) if v["type"] == "query")


def test_every_panel_has_a_unique_id_and_a_place_on_the_grid(dashboard):
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        assert {k: type(grid[k]) for k in ("h", "w", "x", "y")} == dict.fromkeys(("h", "w", "x", "y"), int), panel["id"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["id"]
        mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not mine & cells, f"panel {panel['id']} overlaps another"
        cells |= mine


def test_smact_smocc_and_gract_each_have_a_panel_per_gpu_and_one_per_run(dashboard):
    for name in ACTIVITY:
        served = exposition_name(METRICS[name])
        grouped = [label_names(expr) for _, expr in queries(dashboard) if served in metric_names(expr)]
        assert any("gpu" in labels for labels in grouped), f"{served} per GPU"
        assert any("run_id" in labels for labels in grouped), f"{served} per run"


def test_every_query_names_only_metrics_and_labels_radts_exposition_serves(dashboard, served_labels):
    served = served_names()
    asked = [*queries(dashboard), *((name, selector) for name, selector, _label in variable_queries(dashboard))]
    for where, expr in asked:
        names = metric_names(expr)
        assert names and names <= served, f"{where}: {sorted(names - served)} are not served by radt"
        assert label_names(expr) <= served_labels, f"{where}: {sorted(label_names(expr) - served_labels)} are no label radt serves"
    legends = {name for p in panels(dashboard) for t in p.get("targets", []) for name in re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", ""))}
    assert legends <= served_labels
    assert {label for _name, _selector, label in variable_queries(dashboard)} <= served_labels


def test_the_query_parser_of_this_test_sees_names_and_labels():
    expr = 'avg by (run_id) (rate(radt_gpu_energy_joules_total{gpu=~"$gpu", x="a{b}"}[5m])) / on (gpu) group_left radt_sm_active * 1e6'
    assert metric_names(expr) == {"radt_gpu_energy_joules_total", "radt_sm_active"}
    assert label_names(expr) == {"run_id", "gpu", "x"}
    assert without_variables('x{gpu=~"$gpu", h=~"${Hostname}", r=~"${run_id:regex}"}') == 'x{gpu=~".*", h=~".*", r=~".*"}'


def test_every_query_is_promql_the_real_prometheus_parses(dashboard, tmp_path):
    """Each panel query and each variable's selector as a recording rule (Grafana's variables as `.*`): `promtool check
    rules` parses every expression as Prometheus does."""
    asked = [*queries(dashboard), *((f"variable {name}", selector) for name, selector, _label in variable_queries(dashboard))]
    rules = [{"record": f"radt_dashboard:query_{i}", "expr": without_variables(expr)} for i, (_, expr) in enumerate(asked)]
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "radt_dashboard", "rules": rules}]}))  # JSON is YAML
    checked = promtool.check("rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout


@pytest.mark.skipif(not prom.available() and os.environ.get("CI") != "true", reason="needs Debian's prometheus package (.ci/run installs it)")
def test_each_panel_shows_the_gpus_and_the_runs_of_a_real_prometheus_scraping_radt(dashboard):
    """A real Prometheus scraping radt's exposition: run-1 on GPU 0, run-2 on GPU 1's MIG slice 3. Each per-GPU panel
    shows both GPUs, each per-run panel both runs (run-2 from its slice's series), each variable has values."""
    run1 = Training("run-1", "resnet", "vision", "resnet", [{"series": "gpu_0", "index": 0, "uuid": "GPU-0"}])
    run2 = Training("run-2", "bert", "nlp", "bert", [{"series": "gpu_1_mig_3", "index": 1, "uuid": "MIG-1-3", "gpu_instance": 3}])
    now = int(time.time() * 1000)
    with prom.taken() as server:
        exposition = bind("127.0.0.1", server.ports[0], "node-7", lambda line: None)
        exposition.start(lambda: [run1, run2], lambda: "monitor-run", {"gpu_0": "GPU-0", "gpu_1": "GPU-1", "gpu_1_mig_3": "MIG-1-3"})
        try:
            exposition.put([Point(key(name, gpu, mig=mig), 0.5, now, 1) for name in ACTIVITY for gpu, mig in ((0, None), (1, 3))])
            server.wait_samples(f'{exposition_name(METRICS[MetricName.GR_ENGINE_ACTIVE])}{{GPU_I_ID="3"}}[1m]', 1)
            shown = {where: server.api("/api/v1/query", query=without_variables(expr))["result"] for where, expr in queries(dashboard)}
            values = {
                name: server.api(f"/api/v1/label/{label}/values", **{"match[]": without_variables(selector)})
                for name, selector, label in variable_queries(dashboard)
            }
        finally:
            exposition.stop()
    for where, result in shown.items():
        labels = [series["metric"] for series in result]
        if any("run_id" in series for series in labels):
            assert sorted(series["run_id"] for series in labels) == ["run-1", "run-2"], where
            assert all(float(series["value"][1]) == 0.5 for series in result), where
        else:
            assert sorted((series["gpu"], series.get("GPU_I_ID", "")) for series in labels) == [("0", ""), ("1", "3")], where
    assert values == {"Hostname": ["node-7"], "gpu": ["0", "1"], "run_id": ["run-1", "run-2"]}
