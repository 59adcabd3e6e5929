"""The explore chart's draw callback request, as a browser sends it: one copy, for tests/test_responses.py and
bench/dashboard_load.py (which imports it from the checkout)."""

from __future__ import annotations

import json

DRAW_OUTPUT = "charts.figure"  # the draw callback's first output: its request is the one to replay


def draw_request(app, experiment: str, run_ids: list[str], metrics: list[str]) -> bytes:
    """The draw callback's request, from the dashboard's own callback list (`app`: create_app's Dash app): these runs
    ticked in one workload of the run tree, these metrics, the controls' defaults elsewhere."""
    deps = json.loads(app.server.test_client().get("/_dash-dependencies").data)
    draw = next(d for d in deps if DRAW_OUTPUT in d["output"])
    known = {
        ("metrics", "value"): metrics,
        ("x-mode", "value"): "relative",
        ("group-mode", "value"): "runs",
        ("smoothing", "value"): 0,
        ("log-y", "value"): [],
        ("zoom", "data"): {"axis": "relative-runs", "range": None},
        ("gpu-filter", "value"): [],
        ("gpu-mode", "value"): "each",
        ("experiments", "value"): [str(experiment)],
    }

    def item(dep: dict):
        if dep["id"].startswith("{"):  # the run tree's pattern-matching boxes: one workload with the runs
            pattern = json.loads(dep["id"])
            assert pattern["type"] == "wl-runs", dep
            return [{"id": {"type": "wl-runs", "wl": "w"}, "property": "value", "value": run_ids}]
        return {"id": dep["id"], "property": dep["property"], "value": known.get((dep["id"], dep["property"]))}

    outputs = [{"id": o.rsplit(".", 1)[0], "property": o.rsplit(".", 1)[1]} for o in draw["output"].strip(".").split("...")]
    body = {
        "output": draw["output"],
        "outputs": outputs,
        "inputs": [item(d) for d in draw["inputs"]],
        "changedPropIds": [],
        "state": [item(d) for d in draw["state"]],
    }
    return json.dumps(body).encode()
