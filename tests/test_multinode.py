"""One run across nodes: radts with MLFLOW_RUN_ID and MLFLOW_SYSTEM_METRICS_NODE_ID join a run as its nodes, and the
radts of one multi-node Slurm step share one run. Each node's series are `system/<node>/...` (MLflow's convention),
the run runs while any node's part runs and ends with the worst status of its parts.
"""

from __future__ import annotations

import subprocess

import pytest
from mlflow import MlflowClient

from radt.catalogue import resolve
from radt.collectors.store.nodes import Membership, membership, node_key
from tests.support.polling import wait_for
from tests.support.radtproc import radt_command, radt_env

WAIT_THEN_EXIT = """
import os, sys, time
open(sys.argv[1] + f"-started-{os.getpid()}", "w").close()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
raise SystemExit(int(sys.argv[2]))
"""


def _start(env: dict, tmp_path, go, code: int, extra: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        radt_command("-l", "host", "--interval", "0.2", "node.py", str(go), str(code)),
        env={**env, **extra},
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(started: list[subprocess.Popen]) -> list[tuple[int, str]]:
    return [(p.wait(timeout=120), p.stderr.read()) for p in started]


def test_three_radts_join_one_run_as_their_nodes_and_it_ends_with_the_worst_status(store_uri, radt_home, tmp_path):
    client = MlflowClient(store_uri)
    experiment_id = client.create_experiment("multi-node")
    run_id = client.create_run(experiment_id, run_name="ddp").info.run_id  # torchrun's rank 0 made it, say
    (tmp_path / "node.py").write_text(WAIT_THEN_EXIT)
    env = radt_env(radt_home, store_uri)
    go = tmp_path / "go"
    nodes = {"gpu-a": 0, "gpu-b": 0, "gpu-c": 3}
    started = [_start(env, tmp_path, go, code, {"MLFLOW_RUN_ID": run_id, "MLFLOW_SYSTEM_METRICS_NODE_ID": node}) for node, code in nodes.items()]
    try:
        wait_for(lambda: len(list(tmp_path.glob("go-started-*"))) == 3, what="the three nodes' scripts", timeout=120)
        wait_for(
            lambda: all(client.get_metric_history(run_id, f"system/{node}/cpu_utilization_percentage") for node in nodes),
            what="every node's CPU series in the run",
            timeout=60,
        )
        run = client.get_run(run_id)
        assert run.info.status == "RUNNING"
        assert {node: run.data.tags.get(f"radt.node.{node}") for node in nodes} == dict.fromkeys(nodes, "RUNNING")
    finally:
        go.touch()
        ended = _finish(started)
    assert [code for code, _ in ended] == [0, 0, 3], [err for _, err in ended]
    run = client.get_run(run_id)
    assert run.info.status == "FAILED", "one node failed: the run failed, whatever order the nodes ended in"
    assert {node: run.data.tags[f"radt.node.{node}"] for node in nodes} == {"gpu-a": "FINISHED", "gpu-b": "FINISHED", "gpu-c": "FAILED"}
    assert run.data.tags["radt.exit_code"] == "3"
    assert int(run.data.tags["radt.points"]) == sum(int(run.data.tags[f"radt.node.{n}/points"]) for n in nodes) > 0
    experiment_runs = client.search_runs([experiment_id])
    assert [r.info.run_id for r in experiment_runs] == [run_id], "joining creates no run"
    keys = set(run.data.metrics)
    for node in nodes:
        assert f"system/{node}/cpu_utilization_percentage" in keys
        assert resolve(f"system/{node}/cpu_utilization_percentage").node == node
    assert not any(k.startswith("system/") and k.count("/") == 1 for k in keys), "no series without its node"
    artifacts = {a.path for a in client.list_artifacts(run_id, "radt")}
    assert artifacts == {f"radt/{node}" for node in nodes}, "each node's logs in its own folder"


def test_a_node_that_ends_first_does_not_end_the_run(store_uri, radt_home, tmp_path):
    client = MlflowClient(store_uri)
    run_id = client.create_run(client.create_experiment("first ends")).info.run_id
    (tmp_path / "node.py").write_text(WAIT_THEN_EXIT)
    env = radt_env(radt_home, store_uri)
    slow, fast = tmp_path / "slow", tmp_path / "fast"
    fast.touch()
    both = {"MLFLOW_RUN_ID": run_id}
    later = _start(env, tmp_path, slow, 0, {**both, "MLFLOW_SYSTEM_METRICS_NODE_ID": "n1"})
    try:
        wait_for(lambda: list(tmp_path.glob("slow-started-*")), what="the slow node's script")
        first = _start(env, tmp_path, fast, 0, {**both, "MLFLOW_SYSTEM_METRICS_NODE_ID": "n0"})
        assert _finish([first])[0][0] == 0
        run = client.get_run(run_id)
        assert (run.info.status, run.data.tags["radt.node.n0"], run.data.tags["radt.node.n1"]) == ("RUNNING", "FINISHED", "RUNNING")
    finally:
        slow.touch()
        code, err = _finish([later])[0]
    assert code == 0, err
    assert client.get_run(run_id).info.status == "FINISHED"


def test_a_run_id_of_no_run_is_refused_in_one_line(store_uri, radt_home, tmp_path):
    (tmp_path / "node.py").write_text("print('never')\n")
    env = {**radt_env(radt_home, store_uri), "MLFLOW_RUN_ID": "0" * 32, "MLFLOW_SYSTEM_METRICS_NODE_ID": "n0"}
    done = subprocess.run(radt_command("-l", "host", "node.py"), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(f"radt: MLFLOW_RUN_ID={'0' * 32} names no run in this store")
    assert "Traceback" not in done.stderr


def test_a_run_id_without_a_node_id_is_said_in_one_line_and_the_run_is_radts_own(store_uri, radt_home, tmp_path):
    """MLFLOW_RUN_ID alone (left over in a shell, or set by `mlflow run`) was ignored without a word: radt made a run of its
    own and the user looked for the series in the run they had named. radt joins a run only as one of its nodes."""
    client = MlflowClient(store_uri)
    named = client.create_run(client.create_experiment("mine")).info.run_id
    (tmp_path / "node.py").write_text("import os\nprint(os.environ['MLFLOW_RUN_ID'])\n")
    env = {**radt_env(radt_home, store_uri), "MLFLOW_RUN_ID": named}
    done = subprocess.run(radt_command("-l", "host", "node.py"), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "MLFLOW_RUN_ID" in line]
    assert said == [
        f"radt: MLFLOW_RUN_ID={named} is set without MLFLOW_SYSTEM_METRICS_NODE_ID, so radt records a run of its own; "
        f"to record into {named} as one node of it, set MLFLOW_SYSTEM_METRICS_NODE_ID too (e.g. $(hostname -s)), or unset MLFLOW_RUN_ID"
    ], done.stderr
    own = done.stdout.strip()
    assert own != named and client.get_run(own).info.status == "FINISHED", "the script sees the run radt records"
    assert client.get_run(named).info.status == "RUNNING" and not client.get_run(named).data.metrics, "the named run is left as it was"


def test_the_radts_of_one_multi_node_slurm_step_share_one_run(store_uri, radt_home, tmp_path):
    """What srun gives each task of `srun -N2 radt train.py`: the same job and step, its own node name."""
    client = MlflowClient(store_uri)
    (tmp_path / "node.py").write_text(WAIT_THEN_EXIT)
    env = radt_env(radt_home, store_uri)
    go = tmp_path / "go"
    step = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "2", "SLURM_JOB_PARTITION": "gpu", "SLURM_LOCALID": "0"}
    started = [
        subprocess.Popen(
            radt_command("-e", "slurm step", "-l", "host", "--interval", "0.2", "node.py", str(go), "0"),
            env={**env, **step, "SLURMD_NODENAME": node},
            cwd=tmp_path,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in ("node01", "node02")
    ]
    try:
        wait_for(lambda: len(list(tmp_path.glob("go-started-*"))) == 2, what="both nodes' scripts", timeout=120)
        experiment_id = client.get_experiment_by_name("slurm step").experiment_id

        def both_nodes_sampled() -> bool:  # CPU is a difference of two readings: each node's second tick, not its script's end
            found = client.search_runs([experiment_id])
            return len(found) == 1 and all(
                client.get_metric_history(found[0].info.run_id, f"system/{n}/cpu_utilization_percentage") for n in ("node01", "node02")
            )

        wait_for(both_nodes_sampled, what="both nodes' CPU series in the one run", timeout=60)
    finally:
        go.touch()
        ended = _finish(started)
    assert [code for code, _ in ended] == [0, 0], [err for _, err in ended]
    runs = client.search_runs([experiment_id])
    assert len(runs) == 1, f"{len(runs)} runs for one step"
    tags = runs[0].data.tags
    assert (tags["radt.slurm.job_id"], tags["radt.slurm.step"], tags["radt.slurm.partition"]) == ("4242", "4242.0", "gpu")
    assert (tags["radt.node.node01"], tags["radt.node.node02"], runs[0].info.status) == ("FINISHED", "FINISHED", "FINISHED")
    assert {"system/node01/cpu_utilization_percentage", "system/node02/cpu_utilization_percentage"} <= set(runs[0].data.metrics)


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, Membership()),
        ({"MLFLOW_SYSTEM_METRICS_NODE_ID": "n3"}, Membership("n3")),
        ({"MLFLOW_SYSTEM_METRICS_NODE_ID": "n3", "MLFLOW_RUN_ID": "abc"}, Membership("n3", "abc")),
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1", "SLURM_STEP_NUM_NODES": "1", "SLURMD_NODENAME": "a"}, Membership()),
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1", "SLURM_STEP_NUM_NODES": "4", "SLURMD_NODENAME": "a"}, Membership("a", None, "7.1", 4)),
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1", "SLURM_NNODES": "2", "SLURMD_NODENAME": "a", "SLURM_LOCALID": "1"}, Membership("a.1", None, "7.1", 2)),
    ],
)
def test_membership_from_the_environment(environ, expected):
    assert membership(environ) == expected


def test_a_node_id_with_a_slash_is_refused():
    with pytest.raises(ValueError, match="no '/'"):
        membership({"MLFLOW_SYSTEM_METRICS_NODE_ID": "rack/3"})
    assert node_key("system/gpu_0_sm_active", "n1") == "system/n1/gpu_0_sm_active"
    assert node_key("system/n1/gpu_0_sm_active", "n2") == "system/n1/gpu_0_sm_active"
    assert node_key("loss", "n1") == "loss"


def test_the_dashboard_names_each_nodes_gpu_from_that_nodes_own_tags():
    """node × GPU: a multi-node run's series `system/<node>/gpu_0_...` take the identity its node recorded."""
    import json

    import pandas as pd

    from radt.app.figures import figures
    from radt.app.summary import summaries
    from radt.catalogue import Device

    tags = {
        "radt.node.n1/gpus": json.dumps([{"series": "gpu_0", "uuid": "GPU-aaaa1111-2222-3333-4444-555566667777", "name": "NVIDIA H100"}]),
        "radt.node.n2/gpus": json.dumps([{"series": "gpu_0", "uuid": "GPU-bbbb1111-2222-3333-4444-555566667777", "name": "NVIDIA H100"}]),
    }
    meta = pd.Series({"tags": tags})
    assert "GPU-aaaa1111" in figures.gpu_identity(meta, Device("n1", 0))
    assert "GPU-bbbb1111" in figures.gpu_identity(meta, Device("n2", 0))
    assert figures.gpu_identity(meta, Device("n3", 0)) == ""
    assert summaries.gpu_identity(Device("n2", 0), tags) == "uuid:GPU-bbbb1111-2222-3333-4444-555566667777"
    assert summaries.gpu_identity(Device("n3", 1), tags) == "host:n3:gpu:1"
    assert resolve("system/n2/gpu_0_sm_active").device.label == "n2 · GPU 0"


def test_explore_draws_node_by_gpu_and_the_table_lists_the_run(browser, pg_uri, radt_home):
    """A run over two nodes on the real dashboard in Chromium: one SMACT trace per node × GPU, named so, with every point."""
    import time

    from radt.collectors.store.stores import SqlMetricStore
    from radt.points import Point
    from tests.support.browser import dashboard, new_page, wait_for_traces

    client = MlflowClient(pg_uri)
    experiment = client.create_experiment("two nodes", artifact_location=str(radt_home / "artifacts" / "two_nodes"))  # as radt makes it
    now = int(time.time() * 1000) - 600_000
    run_id = client.create_run(experiment, run_name="ddp", start_time=now).info.run_id
    points = [
        Point(f"system/{node}/gpu_{gpu}_sm_active", 0.2 * (k + 1) + 0.01 * (s % 3), now + s * 1000, s)
        for k, (node, gpu) in enumerate([("n1", 0), ("n1", 1), ("n2", 0)])
        for s in range(300)
    ]
    SqlMetricStore(pg_uri).write(run_id, points)
    client.set_terminated(run_id, "FINISHED", end_time=now + 300_000)
    with dashboard(pg_uri, radt_env(radt_home, pg_uri)) as base, new_page(browser, width=1440, height=900) as page:
        page.goto(f"{base}?exp={experiment}&runs={run_id}&metrics=cat:sm_active")
        traces = wait_for_traces(page, {"ddp · n1 · GPU 0", "ddp · n1 · GPU 1", "ddp · n2 · GPU 0"})
        assert all(t["n"] == 300 for t in traces), traces
        # the table is filled in its own request after the charts: wait for the run's row, not for a row count
        page.wait_for_function("() => Array.from(document.querySelectorAll('#summary tbody tr')).some(r => r.innerText.includes('ddp'))")
        link = page.locator(f"#summary a[href='/runs/{run_id}/artifacts']")
        assert link.count() >= 1, "the row links to the run's logs"  # DataTable draws a fixed column as a second table
        assert page.request.get(f"{base.rstrip('/')}/runs/{run_id}/artifacts").status == 200


def test_a_radt_started_by_hand_inside_a_slurm_job_is_tagged_with_its_job_node_and_partition(store_uri, radt_home, tmp_path):
    """`srun radt train.py` on the real one-node test cluster: the tags come from what Slurm itself set."""
    from tests.support import slurm

    slurm.cluster()
    (tmp_path / "ok.py").write_text("print('trained')\n")
    env = radt_env(radt_home, store_uri, extra=slurm.env())
    done = subprocess.run(
        ["srun", "-N1", "-n1", f"--partition={slurm.PARTITION}", "--job-name=radt-by-hand", *radt_command("-e", "by hand", "-l", "host", "ok.py")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    client = MlflowClient(store_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("by hand").experiment_id])
    tags = run.data.tags
    assert tags["radt.slurm.partition"] == slurm.PARTITION
    assert tags["radt.slurm.job_id"].isdigit() and tags["radt.slurm.step"].startswith(tags["radt.slurm.job_id"] + ".")
    nodes = subprocess.run(["sinfo", "-h", "-p", slurm.PARTITION, "-o", "%N"], env=env, capture_output=True, text=True, timeout=30).stdout.split()
    assert [tags["radt.slurm.node"]] == nodes, "the node Slurm ran the step on"
    assert not any(k.startswith("radt.node.") for k in tags), "a one-node step is a run of one host"
    assert run.info.status == "FINISHED"
