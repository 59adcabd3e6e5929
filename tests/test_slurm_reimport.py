"""`radt import --slurm` again over jobs it imported: an unchanged job is found in one query per experiment and left as it
is (nothing written, nothing asked of Prometheus); a job whose state or end changed, or whose run holds a gap, is
imported again. A real Slurm's accounting (slurmdbd on MariaDB) and a real Prometheus scraping a dcgm-exporter stand-in."""

from __future__ import annotations

import time

import pytest
from mlflow.tracking import MlflowClient

from radt.collectors.cluster import slurmimport
from radt.collectors.slurm import slurmacct as acct
from radt.collectors.sources import promql
from radt.collectors.store.tracking import connect
from radt.runmodel import PROMETHEUS_GAP_TAG
from tests import test_slurm_import as _base
from tests.support import slurmacct

cluster, monkeypatch_module, served = _base.cluster, _base.monkeypatch_module, _base.served  # the real Slurm and Prometheus, as there
radt_import, runs_of, _scraped_after = _base.radt_import, _base.runs_of, _base._scraped_after


@pytest.fixture
def asked(monkeypatch):
    """The queries sent to Prometheus, counted."""
    sent = [0]
    original = promql._get

    def counted(*args, **kwargs):
        sent[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(promql, "_get", counted)
    return sent


def _imported(served, store_uri, capsys) -> tuple[str, object]:
    """A 1-GPU job run, accounted, scraped to its end and imported with its series: (job id, its run)."""
    _exporter, server = served
    job = slurmacct.submit("--gres=gpu:1", "-J", "again", "--wrap", "sleep 2")
    slurmacct.accounted(job, ("COMPLETED",))
    fact = acct.sacct([job])[0]
    _scraped_after(server, slurmacct.host(), fact.gpus[slurmacct.host()][0], fact.end_ms)
    code, err = radt_import(capsys, "--slurm", job, "--prometheus", server.url, "--store", store_uri)
    assert code == 0 and "GPU series from Prometheus" in err, err
    return job, runs_of(MlflowClient(store_uri), "root")[job]


def _held(store_uri: str, run_id: str) -> tuple[dict, dict, int | None]:
    """The run's tags, latest metrics and end as the store holds them."""
    run = MlflowClient(store_uri).get_run(run_id)
    return dict(run.data.tags), dict(run.data.metrics), run.info.end_time


def test_an_unchanged_job_imported_again_writes_nothing_and_asks_prometheus_nothing(served, store_uri, capsys, asked):
    _exporter, server = served
    job, run = _imported(served, store_uri, capsys)
    before = _held(store_uri, run.info.run_id)
    asked[0] = 0
    code, err = radt_import(capsys, "--slurm", job, "--prometheus", server.url, "--store", store_uri)
    assert code == 0 and "unchanged since the last import" in err and "1 unchanged" in err, err
    assert asked[0] == 0, f"{asked[0]} queries for a job its run already holds"
    assert _held(store_uri, run.info.run_id) == before


@pytest.mark.parametrize("change", ["state", "end", "gap"])
def test_a_job_whose_run_differs_or_holds_a_gap_is_imported_again(served, store_uri, capsys, asked, change):
    _exporter, server = served
    job, run = _imported(served, store_uri, capsys)
    client = MlflowClient(store_uri)
    run_id = run.info.run_id
    if change == "state":  # imported while it ran: the run said RUNNING
        client.set_tag(run_id, "radt.slurm.state", "RUNNING")
    elif change == "end":
        client.set_terminated(run_id, status="FINISHED", end_time=run.info.end_time - 1000)
    else:  # Prometheus did not answer last time
        client.set_tag(run_id, PROMETHEUS_GAP_TAG, "Prometheus at http://127.0.0.1:9 did not answer")
    asked[0] = 0
    code, err = radt_import(capsys, "--slurm", job, "--prometheus", server.url, "--store", store_uri)
    assert code == 0 and "unchanged" not in err.split("radt import: 1 jobs")[0], err
    assert asked[0] > 0, "the job's series were read again"
    tags, metrics, end = _held(store_uri, run_id)
    fact = acct.sacct([job])[0]
    assert tags["radt.slurm.state"] == "COMPLETED" and end == fact.end_ms and PROMETHEUS_GAP_TAG not in tags and metrics


def _sacct_lines(jobs: int) -> str:
    """`jobs` finished jobs of two users as sacct --parsable2 prints them (the tests' slurmdbd's format), no GPU."""
    return "".join(
        f"{7000 + i}|{7000 + i}|t{i}|user{i % 2}|proj|gpu|2026-11-26T08:00:00|2026-11-26T08:00:{i:02d}|2026-11-26T09:00:00|"
        f"COMPLETED|0:0|gpu00|billing=1,cpu=8,node=1|\n"
        for i in range(jobs)
    )


def test_many_jobs_are_found_in_one_query_per_experiment(store_uri, monkeypatch):
    jobs = acct.parse_sacct(_sacct_lines(slurmimport.INDEXED + 5))
    client = connect(store_uri)
    first = slurmimport.JobImporter(client, store_uri)
    first.index(jobs)
    assert sum(first.job(job).created for job in jobs) == len(jobs)
    searched = []
    original = slurmimport.find_runs
    monkeypatch.setattr(slurmimport, "find_runs", lambda *a, **k: searched.append(a[2]) or original(*a, **k))
    again = slurmimport.JobImporter(client, store_uri)
    again.index(jobs)
    done = [again.job(job) for job in jobs]
    assert len(searched) == 2, f"{len(searched)} searches for {len(jobs)} jobs of 2 users"
    assert all(d.unchanged and not d.created for d in done)
    changed = jobs[3]._replace(state="FAILED", exit_code=1)
    assert not again.job(changed).unchanged
    assert MlflowClient(store_uri).get_run(done[3].run_id).info.status == "FAILED"


def _in_run(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, int, float]]]:
    """{key: [(timestamp, step, value)]} of every series of the run: point for point, steps too."""
    return {k: sorted((m.timestamp, m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in client.get_run(run_id).data.metrics}


def test_jobs_read_a_nodes_window_at_a_time_hold_what_the_per_job_backfill_writes(tmp_path, capsys):
    """24 jobs on 2 nodes (1-4 GPUs each, as radt's prolog wrote them in their AdminComment) within what a real Prometheus
    scraped, imported per job and batched into two stores: the same points, steps, tags, in far fewer queries."""
    from radt.collectors.imports import importer
    from tests.support import prometheus as prom
    from tests.support.dcgm_exporter import Device

    nodes = ("gpu00", "gpu01")
    devices = [Device(node, gpu, gpu % 5, memory_mib=81_559) for node in nodes for gpu in range(4)]
    with prom.serving(_base.LOG, devices, 'DCGM_FI_PROF_SM_ACTIVE{Hostname="gpu01",gpu="3"}[1h]', 36, timeout=90) as (_e, server):
        end = int(time.time()) - 2
        stamp = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))  # noqa: E731  (sacct prints local time)
        lines = []
        # 8 s each, overlapping, all within the 18 s scraped (36 scrapes at 0.5 s): a job that began 20 s back, as it did,
        # overlapped what was scraped by about a second and, under CI's load, held no point
        for i in range(24):
            start, node, gpus = end - 12 + i % 5, nodes[i % 2], 1 + i % 4
            idx = f"(IDX:0-{gpus - 1})" if gpus > 1 else "(IDX:0)"
            lines.append(
                f"{40000 + i}|{40000 + i}|w{i}|user{i % 3}|proj|gpu|{stamp(start - 5)}|{stamp(start)}|{stamp(start + 8)}|COMPLETED|0:0|{node}|"
                f"billing=1,cpu=8,gres/gpu={gpus},node=1|radt-gres={node}>gpu:{gpus}{idx}\n"
            )
        jobs = acct.parse_sacct("".join(lines))
        held, sent = {}, {}
        for way, batch in (("per job", None), ("batched", importer.batch_fill)):
            uri = f"sqlite:///{tmp_path}/{way.replace(' ', '_')}.db"
            counted = [0]
            original = promql._get

            def counting(*args, _n=counted, _o=original, **kwargs):
                _n[0] += 1
                return _o(*args, **kwargs)

            promql._get = counting
            try:
                one = slurmimport.JobImporter(connect(uri), uri, url=server.url, fill=importer.prometheus_main, batch=batch)
                one.index(jobs)
                done = {job.job_id: one.job(job) for job in jobs}
                one.close()
            finally:
                promql._get = original
            client = MlflowClient(uri)
            assert all(d.filled and d.reason is None for d in done.values()), done
            held[way] = {
                j: (_in_run(client, d.run_id), {k: v for k, v in client.get_run(d.run_id).data.tags.items() if k.startswith(("radt.", "mlflow.user"))})
                for j, d in done.items()
            }
            sent[way] = counted[0]
        stopped = _stopped_then_again(tmp_path, server.url, jobs, importer)
    capsys.readouterr()
    for job_id, series in stopped.items():
        assert series == held["per job"][job_id][0], f"job {job_id}: a stopped import and the next one, point for point"
    assert all(series for series, _tags in held["per job"].values())
    for job_id, (series, tags) in held["per job"].items():
        assert held["batched"][job_id][0] == series, f"job {job_id}: point for point"
        assert held["batched"][job_id][1] == tags, f"job {job_id}: its tags"
    assert sent["batched"] * 2 < sent["per job"], sent


def _stopped_then_again(tmp_path, url: str, jobs: list, importer) -> dict[str, dict]:
    """An import whose store fails at its first batched write, then one stopped after half the jobs (closed, as main's
    `finally` closes it), then the whole day again: no run says it holds series its store did not take, the stopped
    import's runs hold the series it queued, and the next import completes the rest. {job id: its series}."""
    from radt.collectors.store.stores import SqlMetricStore
    from radt.runmodel import PROMETHEUS_TAG

    uri = f"sqlite:///{tmp_path}/stopped.db"
    original = SqlMetricStore.write_runs

    def refused(self, batches):
        raise OSError("disk full")

    SqlMetricStore.write_runs = refused
    try:
        failing = slurmimport.JobImporter(connect(uri), uri, url=url, fill=importer.prometheus_main, batch=importer.batch_fill)
        failing.index(jobs)
        for job in jobs:
            failing.job(job)
        with pytest.raises(OSError):
            failing.close()
    finally:
        SqlMetricStore.write_runs = original
    client = MlflowClient(uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert runs and not any(PROMETHEUS_TAG in r.data.tags for r in runs), "a count tag on a run whose points were refused"
    half = slurmimport.JobImporter(connect(uri), uri, url=url, fill=importer.prometheus_main, batch=importer.batch_fill)
    half.index(jobs)
    early = {job.job_id: half.job(job).run_id for job in jobs[:12]}
    half.close()
    assert all(client.get_run(run_id).data.metrics and PROMETHEUS_TAG in client.get_run(run_id).data.tags for run_id in early.values())
    rest = slurmimport.JobImporter(connect(uri), uri, url=url, fill=importer.prometheus_main, batch=importer.batch_fill)
    rest.index(jobs)
    done = {job.job_id: rest.job(job) for job in jobs}
    rest.close()
    assert all(done[j].unchanged for j in early) and not any(done[job.job_id].unchanged for job in jobs[12:])
    return {j: _in_run(client, d.run_id) for j, d in done.items()}
