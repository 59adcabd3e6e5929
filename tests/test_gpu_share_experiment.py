"""Issue #55 end to end: a CSV's same-GPU workload and its MPS workload each draw two different share lines and a stacked
GPU-share chart, checked in Chromium.

A real `radt experiment.csv` with the driver's tools faked (nvidia-smi, nvidia-cuda-mps-control: tests/fakes/gpu_tools)
and NVML the fake driver (tests/fakes/fake_nvml.py) with per-process loads: each training process writes its own
"pid sm mem" to the file the fake reads, as its kernels would load the GPU. The MPS clients are named by their own pids,
as drivers that split MPS clients do (the older drivers that name the server are tests/test_gpu_share.py's). Everything
above pynvml and the tools is radt's own: the scheduler, the runs' samplers, the store, the dashboard, Chromium.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlencode

import pytest
from mlflow import MlflowClient

from radt.app.figures.figures import DEVICE_LINE_COLOUR, OWN_SHARE_TITLE
from radt.catalogue import METRICS, MetricName, key
from radt.collectors.experiment.csvfile import ExperimentFile
from radt.runmodel import GPU_SHARE_TAG, HOST_TAG
from tests.fakes.fake_nvml import H100
from tests.support import state
from tests.support.browser import URL_VIEW_JS, dashboard, screenshot
from tests.support.radtproc import fake_tools_env, radt_env, run_radt

pytestmark = pytest.mark.e2e

HEADER = "Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params\n"
RUN_SM = key(MetricName.RUN_SM_UTILIZATION_PERCENTAGE, 0)
RUN_MEM = key(MetricName.RUN_MEMORY_UTILIZATION_PERCENTAGE, 0)
RUN_POWER = key(MetricName.RUN_POWER_WATTS, 0)
DEVICE = key(MetricName.UTILIZATION_PERCENTAGE, 0)
LOADS = ((30, 12), (55, 20))  # each workload's two training processes: (smUtil, memUtil) on GPU 0
BUSY = sum(sm for sm, _ in LOADS)  # GPU 0's utilization while both ran: 85 %
WORKLOADS = {"same-gpu": ("1", "-"), "mps": ("2", "MPS")}  # name: (Workload, Collocation)
POINTS = 4  # share points each run waits for in the store, once both runs' loads are on the GPU, before it ends

TRAIN = """\
import fcntl, os, sys, tempfile, time
from tests.support.stored import points

args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
loads, key, runs = args["--loads"], args["--key"], int(args["--runs"])

def alive(line):
    try:
        os.kill(int(line.split()[0]), 0)
        return True
    except (ProcessLookupError, ValueError, IndexError):
        return False

def live_lines():
    with open(loads) as f:
        return [line for line in f.read().splitlines() if alive(line)]

# this process's own load on the fake GPU, as its kernels would make it; a process that ended computes no more (the
# last workload's). Replaced atomically: the fake reads the file on every NVML call, without the lock
with open(loads + ".lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    lines = live_lines() + [f"{os.getpid()} {args['--sm']} {args['--mem']}"]
    fd, new = tempfile.mkstemp(dir=os.path.dirname(loads))
    with os.fdopen(fd, "w") as f:
        f.write("\\n".join(lines) + "\\n")
    os.replace(new, loads)
deadline = time.monotonic() + 90
while len(live_lines()) < runs and time.monotonic() < deadline:  # every run of the workload on the GPU
    time.sleep(0.1)
wanted = points(os.environ["MLFLOW_RUN_ID"], key) + int(args["--points"])
while points(os.environ["MLFLOW_RUN_ID"], key) < wanted and time.monotonic() < deadline:  # its share while they all ran
    time.sleep(0.1)
"""


def _rows(loads: Path) -> str:
    return "".join(
        f"shared,{workload},,,0,{collocation},train.py,nvml,--loads {loads} --sm {sm} --mem {mem} --key {RUN_SM} --runs 2 --points {POINTS}\n"
        for workload, collocation in WORKLOADS.values()
        for sm, mem in LOADS
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, sqlite_template) -> dict:
    """`radt experiment.csv` once for the module: workload 1 two runs on GPU 0 (collocation -), workload 2 two runs on
    GPU 0 under MPS, listener nvml. {uri, home, experiment, runs: {workload name: [run id of 30 %, run id of 55 %]}}."""
    folder = tmp_path_factory.mktemp("gpu-share-experiment")
    home = folder / "radt-home"
    home.mkdir()
    loads = folder / "loads.txt"
    loads.write_text("")
    (folder / "train.py").write_text(TRAIN)
    (folder / "experiment.csv").write_text(HEADER + _rows(loads))
    gpu = {**H100, "load": 0.05, "process_loads_from": str(loads)}
    with state.sqlite_home(home, sqlite_template) as uri:
        # the fake NVML's GPUs and the fake tools together: fake_tools_env leaves RADT_FAKE_NVML as radt_env sets it
        env = radt_env(home, uri, fake_gpus=json.dumps([gpu]), extra=fake_tools_env(folder))
        done = run_radt(["--interval", "0.5", "experiment.csv"], env, folder, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    exp = ExperimentFile.load(folder / "experiment.csv")
    assert [exp.get(r, "Status") for r in exp.rows] == ["FINISHED"] * 4, done.stderr[-4000:]
    ids = [exp.get(r, "Run") for r in exp.rows]
    client = MlflowClient(uri)
    events = [json.loads(line) for line in (folder / "tools.log").read_text().splitlines()]
    assert [e.get("stdin") for e in events if e["tool"] == "nvidia-cuda-mps-control"] == [None, "quit"], "workload 2 ran under MPS"
    return {
        "uri": uri,
        "home": home,
        "experiment": client.get_run(ids[0]).info.experiment_id,
        "runs": {name: ids[2 * i : 2 * i + 2] for i, name in enumerate(WORKLOADS)},
    }


def test_each_run_of_a_same_gpu_and_an_mps_workload_stores_its_own_processs_share(recorded):
    client = MlflowClient(recorded["uri"])
    for name, runs in recorded["runs"].items():
        device = {}
        for run_id, (sm, mem) in zip(runs, LOADS, strict=True):
            run = client.get_run(run_id)
            share = client.get_metric_history(run_id, RUN_SM)
            assert len(share) >= POINTS and {m.value for m in share} == {float(sm)}, (name, sm, [m.value for m in share])
            assert {m.value for m in client.get_metric_history(run_id, RUN_MEM)} == {float(mem)}, (name, mem)
            assert client.get_metric_history(run_id, RUN_POWER), (name, "the run's power estimate")
            assert GPU_SHARE_TAG not in run.data.tags, (name, run.data.tags.get(GPU_SHARE_TAG))
            device[run_id] = (share, client.get_metric_history(run_id, DEVICE))
        # while both processes ran, each run's device series is the same: the whole GPU, both runs' loads. Each run stored
        # POINTS shares (a second each) after both loads were on the GPU: the last 2 s before the first run's last share
        # are in that time, and so is what follows a second after both runs' first share (NVML's samples of a process
        # that has just written its load may be dated up to a tick before it)
        end = min(max(m.timestamp for m in share) for share, _ in device.values())
        both = max(end - 2000, max(min(m.timestamp for m in share) for share, _ in device.values()) + 1000)
        during = {run_id: {m.value for m in history if both <= m.timestamp <= end} for run_id, (_, history) in device.items()}
        assert list(during.values()) == [{float(BUSY)}, {float(BUSY)}], (name, during)
        assert {max(m.value for m in history) for _, history in device.values()} == {float(BUSY)}, name
        hosts = {client.get_run(r).data.tags[HOST_TAG] for r in runs}
        assert len(hosts) == 1, (name, "the runs shared one host's GPU", hosts)


@pytest.fixture(scope="module")
def share_dashboard(recorded):
    with dashboard(recorded["uri"], radt_env(recorded["home"])) as base:
        yield base


# the first chart figure's traces, from what Plotly drew (_fullData: the y values decoded)
DRAWN_JS = """() => {
  const g = document.querySelector('#charts .js-plotly-plot');
  if (!g || !Array.isArray(g._fullData)) { return null; }
  return g._fullData.filter(t => t.meta).map(t => ({
    run_id: t.meta.run_id || null, metric: t.meta.metric || null, share: !!t.meta.share, idle: !!t.meta.idle,
    stacked: !!t.stackgroup, fill: t.fillcolor || null, colour: (t.line || {}).color || null, group: t.legendgroup || null,
    y: Array.from(t.y || []),
  }));
}"""
# drawn: the GPU share chart's stack (two runs and idle) and the GPU util chart's two run lines, with DEV the device line
READY_JS = (
    "([dev, util]) => { const t = (" + DRAWN_JS + ")(); if (!t) { return false; }"
    " const stack = t.filter(x => x.stacked && (x.share || x.idle)).length;"
    " const lines = t.filter(x => x.metric === util && !x.stacked && !String(x.run_id).startsWith('device:')).length;"
    " const device = t.filter(x => String(x.run_id).startsWith('device:')).length;"
    " return stack === 3 && lines === 2 && device === (dev ? 1 : 0); }"
)


def _drawn(page, dev: bool) -> list[dict]:
    util = METRICS[MetricName.UTILIZATION_PERCENTAGE].label
    page.wait_for_function(READY_JS, arg=[dev, util])
    return page.evaluate(DRAWN_JS)


@pytest.mark.browser
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_explore_stacks_the_two_runs_and_draws_each_runs_own_share_in_gpu_util(page, recorded, share_dashboard, workload):
    """Explore on a workload's two runs with Run SM util and GPU util: the GPU share chart stacks both runs and the idle
    remainder in the runs' colours; the GPU util chart draws each run's own share (30 and 55), not the same device line
    twice; the link's dev=1 adds GPU 0's line once, grey."""
    runs = recorded["runs"][workload]
    host = MlflowClient(recorded["uri"]).get_run(runs[0]).data.tags[HOST_TAG]
    util = METRICS[MetricName.UTILIZATION_PERCENTAGE].label
    metrics = f"cat:{MetricName.RUN_SM_UTILIZATION_PERCENTAGE},cat:{MetricName.UTILIZATION_PERCENTAGE}"
    page.goto(share_dashboard + "?" + urlencode({"exp": recorded["experiment"], "runs": ",".join(runs), "metrics": metrics}))
    drawn = _drawn(page, dev=False)

    colour = {t["run_id"]: t["colour"] for t in drawn if t["metric"] == util and not t["stacked"]}
    stack = [t for t in drawn if t["stacked"] and (t["share"] or t["idle"])]
    assert [t["run_id"] if t["share"] else "idle" for t in stack] == [*runs, "idle"], "the two runs' shares, then the idle remainder"
    assert [t["fill"] for t in stack[:2]] == [colour[r] for r in runs] and colour[runs[0]] != colour[runs[1]], "each run in its colour"
    for trace, (sm, _mem) in zip(stack, LOADS, strict=False):
        assert set(trace["y"]) <= {0.0, float(sm)} and float(sm) in trace["y"], (trace["run_id"], sm, trace["y"])
    assert min(stack[2]["y"]) == 100 - BUSY, "idle: 100 − the device's utilization while both ran"
    lines = {t["run_id"]: set(t["y"]) for t in drawn if t["metric"] == util and not t["stacked"]}
    assert lines == {runs[0]: {float(LOADS[0][0])}, runs[1]: {float(LOADS[1][0])}}, "each run's own share, not the device's line"
    page.locator("#charts .annotation-text", has_text=f"GPU share · {host} · GPU 0").wait_for()
    page.locator("#charts .annotation-text", has_text=OWN_SHARE_TITLE.strip(" ·")).wait_for()

    page.goto(share_dashboard + "?" + urlencode({"exp": recorded["experiment"], "runs": ",".join(runs), "metrics": metrics, "dev": "1"}))
    drawn = _drawn(page, dev=True)
    (device,) = [t for t in drawn if str(t["run_id"]).startswith("device:")]
    assert device["group"] == f"device:{host} · GPU 0 (device)" and device["colour"] == DEVICE_LINE_COLOUR
    assert max(device["y"]) == BUSY, "the whole GPU: both runs' loads"
    assert {t["run_id"]: set(t["y"]) for t in drawn if t["metric"] == util and t["run_id"] in runs} == lines, "the runs' own lines stay"
    assert page.evaluate(f"() => {URL_VIEW_JS}.get('dev')") == "1", "the link keeps the device line"
    screenshot(page, f"gpu-share-experiment-{workload}")
