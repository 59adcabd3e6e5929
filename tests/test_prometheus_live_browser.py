"""The Live tab in real headless Chromium while `radt --prometheus URL -l prometheus+host` trains: a real Prometheus
scrapes a dcgm-exporter stand-in serving a recorded `dcgmi dmon` log for this host. Each scrape reaches the store at
its own timestamp, often after a newer host point; the live chart must hold every one of them, not skip the late ones."""

from __future__ import annotations

import datetime as dt
import socket
import subprocess
import textwrap
import time
from pathlib import Path

from mlflow import MlflowClient

from tests.support import prometheus as prom
from tests.support.browser import dashboard, new_page, screenshot
from tests.support.dcgm_exporter import Device
from tests.support.polling import wait_for
from tests.support.radtproc import radt_command, radt_env

LOG = Path(__file__).parent / "fixtures" / "real-tool-logs" / "mnist_dcgmi_dmon_18fields.txt"
HERE = socket.gethostname()
SMACT = "system/gpu_0_sm_active"
TRAIN = textwrap.dedent(
    """
    import pathlib, sys, time
    stop = pathlib.Path(sys.argv[1])
    deadline = time.monotonic() + 90
    while not stop.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    """
)
CHART_X = """(name) => {
  const card = Array.from(document.querySelectorAll('.live-run')).find(c => c.querySelector('header strong')?.textContent === name);
  const g = card && card.querySelector('.live-chart .js-plotly-plot');
  const t = g && g._fullData && g._fullData.find(t => t.meta && t.meta.key === 'system/gpu_0_sm_active');
  return t && t.x ? Array.from(t.x) : null;
}"""


def _ms(text: str) -> int:
    return round(dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp() * 1000)


def test_the_live_chart_holds_every_scrape_of_a_prometheus_run(pg_uri, radt_home, tmp_path, browser):
    (tmp_path / "train.py").write_text(TRAIN)
    stop = tmp_path / "stop"
    env = radt_env(radt_home, pg_uri)
    until = f'DCGM_FI_PROF_SM_ACTIVE{{Hostname="{HERE}",gpu="0"}}[1h]'
    with (
        prom.serving(LOG, [Device(HERE, 0, 0)], until, 2, delay_s=0.6 * prom.SCRAPE_MS / 1000) as (_exporter, server),  # a slow exporter: late scrapes
        dashboard(pg_uri, env) as base,
        new_page(browser, width=1300, height=900) as page,
    ):
        page.goto(base + "live")
        page.wait_for_selector("text=No run is training now")
        run = subprocess.Popen(
            radt_command("--prometheus", server.url, "-l", "prometheus+host", "-n", "scraped", "--interval", "0.5", "train.py", str(stop)),
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            chart = wait_for(lambda: (xs := page.evaluate(CHART_X, "scraped")) and len(xs) >= 12 and xs, timeout=60, what="12 scrapes on the live chart")
            client = MlflowClient(pg_uri)
            run_id = client.search_runs([e.experiment_id for e in client.search_experiments()], "attributes.run_name = 'scraped'")[0].info.run_id
            drawn = [_ms(x) for x in chart]
            stored = sorted(m.timestamp for m in client.get_metric_history(run_id, SMACT))
            screenshot(page, "live-prometheus")
        finally:
            stop.touch()
            out, _ = run.communicate(timeout=60)
    assert run.returncode == 0, out
    assert drawn == sorted(drawn) and len(set(drawn)) == len(drawn)
    assert [t for t in stored if t <= drawn[-1]] == drawn, "every scrape stored up to the chart's newest is drawn, each once"
    assert time.time() * 1000 - drawn[-1] < 120_000
