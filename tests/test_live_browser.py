"""The Live tab in real headless Chromium while a real `radt` run trains and `radt monitor` watches
the machine (GPUs faked below pynvml), both into the real PostgreSQL.

The page is open before they start: each appears on its own, the run's chart gains points
through extendData (the same plot element, no redraw), current values show per GPU and for the
host, and when they end their cards show the final status.
"""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
import time

from mlflow import MlflowClient

from radt.collectors.store import tracking
from radt.collectors.store.stores import SqlMetricStore
from radt.points import Point
from tests.fakes.fake_nvml import A100, H100
from tests.support.browser import dashboard, new_page, screenshot
from tests.support.radtproc import DEFAULT_PERIODS, radt_command, radt_env
from tests.support.runs import radt_run

GPUS = json.dumps([{**H100, "load": 0.7}, {**A100, "load": 0.0}])  # one busy GPU, one idle
CPU_KEY, RUN_CPU_KEY = "system/cpu_utilization_percentage", "system/process_cpu_utilization_percentage"

TRAIN = textwrap.dedent(
    """
    import pathlib, sys, time
    stop = pathlib.Path(sys.argv[1])
    while not stop.exists():  # a CPU "training" that runs until the test says stop
        end = time.time() + 0.1
        while time.time() < end:
            pass
        time.sleep(0.1)
    print("done")
    """
)

POINTS_JS = """(name) => {
  const card = Array.from(document.querySelectorAll('.live-run')).find(c => c.querySelector('header strong')?.textContent === name);
  const g = card && card.querySelector('.live-chart .js-plotly-plot');
  if (!g || !g._fullData) { return null; }
  return g._fullData.reduce((n, t) => n + (t.x ? t.x.length : 0), 0);
}"""


def _card(page, name: str):
    return page.locator(".live-run", has=page.locator("header strong", has_text=name))


def _extended_not_redrawn(page, card, name: str) -> None:
    """Six new points on `name`'s chart reach this very plot element (extendData), not a redrawn one. The cards are
    rebuilt, rightly, when a run starts storing a new chart metric, and under load one came after the waits above and
    replaced the marked element (once in four full runs); so three tries: a chart redrawn on every poll fails all three."""
    for _ in range(3):
        before = page.evaluate(f"({POINTS_JS})('{name}')")
        # mark the plot element: extendData must grow this very element, not a redrawn one
        page.evaluate(
            "(name) => { document.querySelectorAll('.live-run').forEach(c => { if (c.querySelector('header strong').textContent === name) c.querySelector('.js-plotly-plot').dataset.mark = 'kept'; }); }",
            name,
        )
        page.wait_for_function(f"({POINTS_JS})('{name}') >= {before + 6}")
        if card.locator(".js-plotly-plot[data-mark=kept]").count() == 1:
            return
    raise AssertionError("the chart was redrawn instead of extended, three times in a row")


def test_a_training_run_appears_grows_and_ends_on_the_live_tab(pg_uri, radt_home, tmp_path, browser):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    stop = tmp_path / "stop"
    env = radt_env(radt_home, pg_uri, extra=DEFAULT_PERIODS)  # every period at radt's default, Explore's redraw included
    with dashboard(pg_uri, env) as base, new_page(browser, width=1300, height=900) as page:
        page.goto(base + "live")
        page.wait_for_selector("text=No run is training now")

        run = subprocess.Popen(
            radt_command("-e", "live e2e", "-n", "cpu trainer", "--interval", "0.5", str(script), str(stop)),
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        monitor = subprocess.Popen(
            radt_command("monitor", "--interval", "0.5"),
            env=radt_env(radt_home, pg_uri, fake_gpus=GPUS),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            card = _card(page, "cpu trainer")
            card.locator(".status", has_text="RUNNING").wait_for()
            # every card is rebuilt (render) when a run appears or any run starts storing a chart metric (the monitor's SMACT
            # comes with its second GPM sample and replaces its GPU util line): the monitor's card with its GPU metrics and the
            # trainer's process CPU come first, so the chart marked below is rebuilt by nothing but a missed extend
            early = page.locator(".live-run", has=page.locator(".value-row .where", has_text="GPU 1"))
            early.locator(".status", has_text="RUNNING").wait_for()
            early.locator(".value-row", has_text="GPU 0").locator(".value[data-metric=sm_active]").wait_for()
            early.locator(".value-row", has_text="GPU 1").locator(".value-low[data-metric=utilization_percentage]").wait_for()
            early.locator(".value[data-metric=cpu_utilization_percentage]").wait_for()
            card.locator(".value[data-metric=cpu_utilization_percentage]").wait_for()
            card.locator(".value[data-metric=process_cpu_utilization_percentage]").wait_for()
            page.wait_for_function(f"({POINTS_JS})('cpu trainer') >= 2")
            _extended_not_redrawn(page, card, "cpu trainer")
            assert card.locator(".value[data-metric=cpu_utilization_percentage]").count() == 1
            card.locator(".value[data-metric=process_cpu_utilization_percentage]").wait_for()
            href = card.locator("a.explore-link").get_attribute("href")
            assert href.startswith("/?exp=") and "runs=" in href, href

            # the monitor's card: one row of current values per GPU (the busy one high, the idle one low)
            watcher = page.locator(".live-run", has=page.locator(".value-row .where", has_text="GPU 1"))
            watcher.locator(".status", has_text="RUNNING").wait_for()
            watcher.locator(".value-row", has_text="GPU 0").locator(".value[data-metric=sm_active]").wait_for()
            # the idle GPU's row waits for its own values (under load they came a poll after GPU 0's; an immediate count failed once)
            watcher.locator(".value-row", has_text="GPU 1").locator(".value-low[data-metric=utilization_percentage]").wait_for()
            assert watcher.locator(".value-row", has_text="GPU 1").locator(".value-low[data-metric=utilization_percentage]").count() == 1
            page.wait_for_function("() => document.querySelectorAll('.live-run .live-chart .js-plotly-plot').length === 2")
            screenshot(page, "live-running")
        finally:
            stop.touch()
            monitor.send_signal(signal.SIGINT)
            output, _ = run.communicate(timeout=120)
            watched, _ = monitor.communicate(timeout=120)
        assert run.returncode == 0, output
        assert monitor.returncode == 0, watched
        card.locator(".status", has_text="FINISHED").wait_for()
        watcher.locator(".status", has_text="FINISHED").wait_for()
        assert card.locator(".flag-stale").count() == 0, "an ended run is not stale"
        screenshot(page, "live-finished")


CARD_JS = """(name) => {
  const card = Array.from(document.querySelectorAll('.live-run')).find(c => c.querySelector('header strong')?.textContent === name);
  const g = card && card.querySelector('.live-chart .js-plotly-plot');
  if (!g || !g._fullLayout) { return null; }
  const x = g._fullLayout.xaxis, svg = g.querySelector('.main-svg').getBoundingClientRect();
  const boxes = Array.from(g.querySelectorAll('.xtick text, .ytick text, .y2tick text, .g-ytitle, .g-y2title')).map(e => e.getBoundingClientRect());
  const legend = g.querySelector('.legend').getBoundingClientRect();
  const ticks = Array.from(g.querySelectorAll('.xtick text')).map(e => e.getBoundingClientRect().bottom);
  return {x: x.range.map(v => x.r2l(v)), cpu: g._fullLayout.yaxis2.range, inside: boxes.every(b => b.left >= svg.left - 1 && b.right <= svg.right + 1 && b.top >= svg.top - 1 && b.bottom <= svg.bottom + 1),
          titles: g.querySelectorAll('.g-ytitle text, .g-y2title text').length, clear: ticks.every(b => b <= legend.top + 1),
          right: (g.querySelector('.g-y2title text') || {}).textContent};
}"""


def test_a_card_shows_the_runs_own_metrics_cpu_above_100_and_collocated_runs_share_a_time_range(pg_uri, radt_home, browser):
    """Eleven collocated runs of a learning-rate sweep: one trained four minutes with a process tree on 2.5 cores and logs
    loss and accuracy, the others started a minute ago. Each card names what tells its command apart (the cards showed a
    random run name alone, so which card was which learning rate took a trip to Explore), and the eleven cards lie apart
    within the window, each chart's labels inside it."""
    client = MlflowClient(pg_uri)
    experiment = tracking.resolve_experiment(client, pg_uri, "collocated")
    now = int(time.time() * 1000)
    sweep = ("--epochs", "90", "--batch-size", "256", "--lr")
    old = radt_run(client, experiment, "four minutes", start_time=now - 240_000, workload="pair", letter="A", script_args=(*sweep, "0.1"))
    young = radt_run(client, experiment, "one minute", start_time=now - 60_000, workload="pair", letter="B", script_args=(*sweep, "0.3"))
    more = {f"lr {n}": radt_run(client, experiment, f"lr {n}", start_time=now - 60_000, workload="pair", letter=chr(65 + n), script_args=(*sweep, f"0.{n + 2}"))
            for n in range(2, 11)}  # fmt: skip
    writer = SqlMetricStore(pg_uri)
    for run_id, seconds in ((old, 240), (young, 60), *((run_id, 60) for run_id in more.values())):
        ts = [now - (seconds - s) * 1000 for s in range(seconds)]
        writer.write(run_id, [Point("system/gpu_0_sm_active", 0.6, t, s) for s, t in enumerate(ts)])
        writer.write(run_id, [Point("system/process_cpu_utilization_percentage", 250.0, t, s) for s, t in enumerate(ts)])
    writer.write(old, [Point("loss", 0.25, now - 1000, 7), Point("accuracy", 0.875, now - 1000, 7)])

    with dashboard(pg_uri, radt_env(radt_home, pg_uri)) as base, new_page(browser, width=1440, height=900) as page:
        page.goto(base + "live")
        card = _card(page, "four minutes")
        card.locator(".value-own[data-metric=loss]").wait_for()
        assert card.locator(".value-own[data-metric=loss]").inner_text() == "loss 0.25"
        assert card.locator(".value-own[data-metric=accuracy]").inner_text() == "accuracy 0.875"
        assert _card(page, "one minute").locator(".value-own").count() == 0, "a run that logged nothing of its own shows none"
        for name, lr in (("four minutes", "0.1"), ("one minute", "0.3")):
            command = _card(page, name).locator("header .command")
            assert command.inner_text() == f"--lr {lr}", "what tells the card's command apart from the other card's"
            assert command.get_attribute("title") == f"train.py --epochs 90 --batch-size 256 --lr {lr}", "the whole command on hover"
            header, link = _card(page, name).bounding_box(), _card(page, name).locator(".explore-link").bounding_box()
            assert link["x"] + link["width"] <= header["x"] + header["width"], "the header stays inside its card"

        page.wait_for_function(f"({CARD_JS})('four minutes') && ({CARD_JS})('one minute')")
        shown = page.evaluate(CARD_JS, "four minutes")
        assert shown["cpu"][0] == 0 and shown["cpu"][1] >= 250, f"CPU at 250 % of one core is on the axis: {shown['cpu']}"
        # the young run's chart spans the old run's four minutes too: collocated runs on one time range
        page.wait_for_function(
            f"() => {{ const a = ({CARD_JS})('four minutes'), b = ({CARD_JS})('one minute');"
            " return Math.abs(a.x[0] - b.x[0]) < 1000 && Math.abs(a.x[1] - b.x[1]) < 1000 && a.x[1] - a.x[0] > 200000; }"
        )
        for name in ("four minutes", "one minute", *more):
            page.wait_for_function(f"() => ({CARD_JS})('{name}')")
            shown = page.evaluate(CARD_JS, name)
            assert shown["inside"] and shown["clear"] and shown["titles"] == 2, (name, shown)
            assert shown["right"] == "Run CPU (%)", ("the right axis says what is on it (no GPU util here), not its ticks' '%' again", shown["right"])
        cards = page.evaluate(
            """() => Array.from(document.querySelectorAll('.live-run')).map(c => { const b = c.getBoundingClientRect();
                 const h = c.querySelector('header').getBoundingClientRect(), g = c.querySelector('.js-plotly-plot').getBoundingClientRect();
                 return {l: b.left, r: b.right, t: b.top, b: b.bottom, inside: [h, g].every(e => e.left >= b.left - 0.5 && e.right <= b.right + 0.5),
                         command: c.querySelector('header .command').textContent}; })"""
        )
        wide = page.evaluate("() => document.documentElement.scrollWidth - innerWidth")
        screenshot(page, "live-collocated")
    assert len(cards) == 11 and all(c["inside"] for c in cards) and wide <= 0, (cards, wide)
    assert sorted(c["command"] for c in cards) == sorted(f"--lr 0.{n}" for n in (1, 3, *range(4, 13))), [c["command"] for c in cards]
    apart = all(
        a["r"] <= b["l"] + 0.5 or b["r"] <= a["l"] + 0.5 or a["b"] <= b["t"] + 0.5 or b["b"] <= a["t"] + 0.5
        for i, a in enumerate(cards)
        for b in cards[i + 1 :]
    )
    assert apart, "no card over another"


def test_a_dashboard_slower_than_its_poll_still_shows_the_run_and_its_new_points(store_uri, radt_home, browser):
    """A loaded server answers a Live poll after the next poll: each answer was dropped for the newer request (Dash keeps
    the newest only), so the page never showed a run (CI under load; at a 0.1 s poll on any machine). A poll now waits for
    the last one's answer."""
    client = MlflowClient(store_uri)
    experiment = tracking.resolve_experiment(client, store_uri, "slow server")
    now = int(time.time() * 1000)
    run_id = radt_run(client, experiment, "busy trainer", start_time=now - 30_000)
    writer = SqlMetricStore(store_uri)
    writer.write(run_id, [Point("system/cpu_utilization_percentage", 40.0, now - (30 - s) * 1000, s) for s in range(30)])
    env = radt_env(radt_home, store_uri, extra={"RADT_LIVE_POLL": "0.1"})  # every answer takes longer than a poll
    with dashboard(store_uri, env) as base, new_page(browser, width=1300, height=900) as page:
        page.goto(base + "live")
        card = _card(page, "busy trainer")
        card.locator(".status", has_text="RUNNING").wait_for(timeout=20_000)
        page.wait_for_function(f"({POINTS_JS})('busy trainer') >= 30", timeout=20_000)
        newest = int(time.time() * 1000)
        writer.write(run_id, [Point("system/cpu_utilization_percentage", 60.0, newest + s * 100, 30 + s) for s in range(5)])
        page.wait_for_function(f"({POINTS_JS})('busy trainer') >= 35", timeout=20_000)
        # away to Explore and back (the app's own links: the same window) while a poll is out: its answer never comes, and
        # the page that mounts again must not wait out the lost poll's 30 s
        page.click("nav a.nav-link:text-is('Explore')")
        page.wait_for_selector("#charts")
        page.evaluate("() => { window.radtLive.since = Date.now(); }")  # the poll that was out when the page left: never answered
        page.click("nav a.nav-link:text-is('Live')")
        _card(page, "busy trainer").locator(".status", has_text="RUNNING").wait_for(timeout=10_000)


# a card's chart as drawn: its message, its x tick labels and its axes' titles
DRAWN_JS = """(name) => {
  const card = Array.from(document.querySelectorAll('.live-run')).find(c => c.querySelector('header strong')?.textContent === name);
  const g = card && card.querySelector('.live-chart .js-plotly-plot');
  if (!g || !g._fullLayout) { return null; }
  const texts = s => Array.from(g.querySelectorAll(s)).map(e => e.textContent);
  return {message: texts('.annotation-text').join(' '), xticks: texts('.xtick text'), left: texts('.g-ytitle text'), right: texts('.g-y2title text'),
          points: g._fullData.reduce((n, t) => n + (t.x ? t.x.length : 0), 0)};
}"""


def test_a_new_runs_card_waits_for_its_first_sample_and_a_cpu_only_chart_names_only_cpu(store_uri, radt_home, browser):
    """A new run's card first showed an empty chart over "Jan 2000 … Nov 2000" (Plotly's default date range), and a
    CPU-only run's axes read "GPU activity" and "GPU util · CPU (%)" with no GPU line on the chart (issue 52)."""
    client = MlflowClient(store_uri)
    experiment = tracking.resolve_experiment(client, store_uri, "first sample")
    now = int(time.time() * 1000)
    run_id = radt_run(client, experiment, "cold start", start_time=now)
    writer = SqlMetricStore(store_uri)
    with dashboard(store_uri, radt_env(radt_home, store_uri)) as base, new_page(browser, width=1440, height=900) as page:
        page.goto(base + "live")
        page.wait_for_function(f"() => ({DRAWN_JS})('cold start') !== null")
        before = page.evaluate(DRAWN_JS, "cold start")
        screenshot(page, "live-before-first-sample")
        first = int(time.time() * 1000)
        points = [Point(key, value, first + s * 1000, s) for s in range(5) for key, value in ((CPU_KEY, 40.0), (RUN_CPU_KEY, 180.0))]
        writer.write(run_id, points)
        page.wait_for_function(f"() => {{ const d = ({DRAWN_JS})('cold start'); return d && d.points >= 10; }}", timeout=20_000)
        after = page.evaluate(DRAWN_JS, "cold start")
        screenshot(page, "live-after-first-sample")
    assert before["points"] == 0 and "waiting for the first sample" in before["message"], before
    assert not any("2000" in t for t in before["xticks"]) and before["left"] == before["right"] == [], ("no axis over no data", before)
    assert "waiting" not in after["message"] and after["xticks"] and not any("2000" in t for t in after["xticks"]), after
    assert after["left"] == [] and after["right"] == ["CPU · Run CPU (%)"], ("a CPU-only chart names what it draws, no GPU", after)
