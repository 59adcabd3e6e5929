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

from tests.fakes.fake_nvml import A100, H100
from tests.support.browser import dashboard, new_page, screenshot
from tests.support.radtproc import radt_command, radt_env

GPUS = json.dumps([{**H100, "load": 0.7}, {**A100, "load": 0.0}])  # one busy GPU, one idle

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


def test_a_training_run_appears_grows_and_ends_on_the_live_tab(pg_uri, radt_home, tmp_path, browser):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    stop = tmp_path / "stop"
    env = radt_env(radt_home, pg_uri)
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
            page.wait_for_function(f"({POINTS_JS})('cpu trainer') >= 2")
            before = page.evaluate(f"({POINTS_JS})('cpu trainer')")
            # mark the plot element: extendData must grow this very element, not a redrawn one
            page.evaluate(
                "(name) => { document.querySelectorAll('.live-run').forEach(c => { if (c.querySelector('header strong').textContent === name) c.querySelector('.js-plotly-plot').dataset.mark = 'kept'; }); }",
                "cpu trainer",
            )
            page.wait_for_function(f"({POINTS_JS})('cpu trainer') >= {before + 6}")
            assert card.locator(".js-plotly-plot[data-mark=kept]").count() == 1, "the chart was redrawn instead of extended"
            assert card.locator(".value[data-metric=cpu_utilization_percentage]").count() == 1
            card.locator(".value[data-metric=process_cpu_utilization_percentage]").wait_for()
            href = card.locator("a.explore-link").get_attribute("href")
            assert href.startswith("/?exp=") and "runs=" in href, href

            # the monitor's card: one row of current values per GPU (the busy one high, the idle one low)
            watcher = page.locator(".live-run", has=page.locator(".value-row .where", has_text="GPU 1"))
            watcher.locator(".status", has_text="RUNNING").wait_for()
            watcher.locator(".value-row", has_text="GPU 0").locator(".value[data-metric=sm_active]").wait_for()
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
