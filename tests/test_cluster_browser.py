"""The Cluster view in Chromium: every imported Slurm job with its diagnosis, the most idle GPU-hours first, names shown
as text (a hostile account name stays text), a job's link opening its run in Explore, the jobs counted by finding with a
link narrowing to one, totals per user / account / partition that narrow the page, and a cap on the jobs listed that
says how many there are."""

from __future__ import annotations

import shutil
from urllib.parse import urlencode

import pytest

from radt import settings
from tests.support import state
from tests.support.browser import dashboard, screenshot
from tests.support.diagnosed import import_jobs
from tests.support.radtproc import radt_env

HOSTILE = '<img src=x onerror="document.title=1">'
# sacct --parsable2 lines as Slurm 22.05 printed them on the tests' cluster (tests/support/slurmacct.py), three jobs:
# 4 GPUs for 2 h barely used, 1 GPU for 1 h busy, no GPU at all
SACCT = (
    "101|101|train-big|alice|proj|gpu|2026-11-20T10:00:00|2026-11-20T10:00:05|2026-11-20T12:00:05|COMPLETED|0:0|gpu01|"
    "billing=1,cpu=8,gres/gpu=4,node=1|radt-gres=gpu01>gpu:4(IDX:0-3)\n"
    f"102|102|train-small|bob|{HOSTILE}|gpu|2026-11-20T10:00:00|2026-11-20T10:00:05|2026-11-20T11:00:05|COMPLETED|0:0|gpu02|"
    "billing=1,cpu=8,gres/gpu=1,node=1|radt-gres=gpu02>gpu:1(IDX:2)\n"
    "103|103|prep|alice|proj|cpu|2026-11-20T10:00:00|2026-11-20T10:00:05|2026-11-20T10:30:05|FAILED|2:0|cpu07|billing=1,cpu=8,node=1|\n"
)


@pytest.fixture(scope="module")
def cluster_store(tmp_path_factory, sqlite_template):
    home = tmp_path_factory.mktemp("cluster")
    with state.sqlite_home(home, sqlite_template) as uri:
        # the importer's own path (facts, no Prometheus here), the GPUs' SMACT written, then diagnosed as the import does:
        # 101's GPU 0 busy and GPUs 1-3 idle, 102's one GPU busy
        runs = import_jobs(uri, SACCT, {"101": [0, 1, 2, 3], "102": [2]}, {"101": [0], "102": [2]})
    with dashboard(uri, {**radt_env(home), "RADT_CLUSTER_ROWS": "2"}) as base:  # 3 jobs: the cap cuts one
        yield base, runs


def _rows(page, table: str) -> list[list[str]]:
    page.locator(f"#{table} tbody tr").first.wait_for()
    return page.eval_on_selector_all(f"#{table} tbody tr", "rows => rows.map(r => Array.from(r.cells).map(c => c.textContent))")


def test_jobs_come_most_idle_first_with_their_diagnosis_and_open_in_explore(page, cluster_store):
    base, runs = cluster_store
    page.goto(base + "cluster")
    rows = _rows(page, "cluster-jobs")
    screenshot(page, "cluster-jobs")
    assert [r[0] for r in rows] == ["101", "102"], rows  # 3 idle GPUs × 2 h = 6 idle GPU-h, then 0; 103 (no diagnosis) is past the cap
    assert rows[0][5:9] == ["4", "2.00", "8.00", "6.00"] and rows[1][5:9] == ["1", "1.00", "1.00", "0.00"], rows
    assert rows[0][9] == "idle gpus" and rows[1][9] == "none", rows
    sentence = page.locator("#cluster-jobs tbody tr").first.locator("td.diagnosis").get_attribute("title")
    assert sentence.startswith("3 of 4 GPUs idle"), "the finding's sentence on hover"
    count = page.locator("#cluster-count").text_content()
    assert count.startswith("The 2 with the most idle GPU-hours of 3 jobs") and "RADT_CLUSTER_ROWS" in count, count
    assert rows[1][2] == HOSTILE and page.locator("#cluster-jobs img, #cluster-totals img").count() == 0, "an account name is text, never markup"
    assert page.title() != "1"
    page.locator("#cluster-jobs a.job-link", has_text="101").click()
    page.wait_for_url(lambda url: f"runs={runs['101']}" in url)
    page.locator("#run-filter").wait_for()  # Explore's run picker: the run's experiment is open


def test_jobs_are_counted_by_finding_and_narrow_to_one(page, cluster_store):
    base, _runs = cluster_store
    page.goto(base + "cluster")
    link = page.locator("#cluster-findings a.finding-link[data-code=idle_gpus]")
    assert link.text_content() == "idle gpus 1" and page.locator("#cluster-findings a.finding-link").count() == 1
    link.click()
    page.wait_for_url(lambda url: url.endswith("/cluster?finding=idle_gpus"))
    page.locator("#cluster-every-finding").wait_for()
    assert [r[0] for r in _rows(page, "cluster-jobs")] == ["101"] and page.locator("#cluster-count").text_content() == "1 job"
    assert "finding idle gpus" in page.locator("#cluster-chosen").text_content()
    (alice,) = _rows(page, "cluster-totals")
    assert alice[:6] == ["alice", "1", "8.00", "6.00", "75%", "0"], "the totals of the jobs with that finding"
    assert float(alice[8]) == pytest.approx(8 * settings.GPU_HOUR_PRICE.get()), "its cost: 8 GPU-hours at the price"
    page.locator("#cluster-every-finding").click()
    page.wait_for_url(lambda url: url.endswith("/cluster"))
    page.locator("#cluster-every-finding").wait_for(state="detached")
    assert [r[0] for r in _rows(page, "cluster-jobs")] == ["101", "102"]


def test_totals_per_user_account_and_partition_narrow_the_jobs(page, cluster_store):
    base, _runs = cluster_store
    page.goto(base + "cluster")
    totals = _rows(page, "cluster-totals")
    # alice: 101 (4 GPUs × 2 h, 3 idle) and 103 (no GPU, no diagnosis); bob: 102 (1 GPU × 1 h, busy)
    assert [row[:6] for row in totals] == [["alice", "2", "8.00", "6.00", "75%", "1"], ["bob", "1", "1.00", "0.00", "0%", "0"]], totals
    page.locator("#cluster-totals a.group-link", has_text="alice").click()
    page.wait_for_url(lambda url: url.endswith("/cluster?user=alice"))
    page.locator("#cluster-chosen").wait_for()
    assert [r[0] for r in _rows(page, "cluster-jobs")] == ["101", "103"], "alice's jobs, the one past the cap too"
    assert _rows(page, "cluster-jobs")[1][9] == "the job had no GPU"
    assert page.locator("#cluster-count").text_content() == "2 jobs"
    page.locator("#cluster-by-partition").click()
    page.wait_for_url(lambda url: "by=partition" in url and "user=alice" in url)
    page.locator("#cluster-by-partition.chosen").wait_for()
    assert [r[0] for r in _rows(page, "cluster-totals")] == ["gpu", "cpu"], "alice's jobs by partition"
    page.locator("#cluster-all").click()
    page.wait_for_url(lambda url: url.endswith("/cluster?by=partition"))
    page.locator("#cluster-chosen").wait_for(state="detached")
    assert [r[0] for r in _rows(page, "cluster-totals")] == ["gpu", "cpu"]
    assert _rows(page, "cluster-totals")[0][1:4] == ["2", "9.00", "6.00"]


def test_a_hostile_query_is_no_choice_and_no_markup(page, cluster_store):
    base, _runs = cluster_store
    page.goto(base + "cluster?" + urlencode([("by", "<script>"), ("user", HOSTILE), ("account", HOSTILE), ("user", "bob"), ("partition", "gpu' OR 1=1 --")]))
    page.locator("#cluster-chosen").wait_for()
    assert page.locator("#cluster-by-user.chosen").count() == 1, "an unknown grouping is the default one"
    assert page.locator("#cluster-jobs tbody tr").count() == 0
    assert page.locator("#cluster-count").text_content() == "0 jobs", "a partition named like SQL is just a name nobody has"
    assert page.locator(".cluster img, .cluster script").count() == 0 and page.title() != "1"
    page.goto(base + "cluster?" + urlencode({"account": HOSTILE}))
    assert [r[0] for r in _rows(page, "cluster-jobs")] == ["102"], "the hostile account is a name like any other"


def test_a_store_without_jobs_says_how_to_get_them(page, tmp_path, sqlite_template):
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(sqlite_template, home / "store.db")
    with dashboard(f"sqlite:///{home / 'store.db'}", radt_env(home)) as base:
        page.goto(base + "cluster")
        assert "radt import --slurm-since 1d" in page.locator("#cluster-empty").text_content()
        # with the page's margin, as with jobs (the heading touched the window's left edge, 2026-11-27 walk)
        assert page.locator("h2", has_text="Cluster").bounding_box()["x"] >= 12
