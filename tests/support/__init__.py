"""The tests' own helpers, one copy each: imported by the test modules and by conftest.py's fixtures.

paths        where the repository, the real tool logs, the fakes and the test artifacts are
polling      waiting on a condition with a deadline (never a fixed sleep), processes that still run, a URL that answers
ports        a free TCP port on 127.0.0.1
postgres     the test PostgreSQL server: URIs, databases cloned from one MLflow template, reused between tests
proxy        a loopback TCP proxy that takes a store away (refused, reset, hung) and gives it back
mlflowserver a real `mlflow server` a test can stop, restart, freeze and thaw
browser      headless Chromium, a real `python app.py` dashboard, the explore page's traces, screenshots
radtproc     `python -m radt` as a user runs it: its environment, run to the end or live in the background
runs         a run as `radt train.py` creates it, for the tests that write its points themselves
stores       stores filled once for the dashboard's read side and its browser tests
drawrequest  the explore chart's draw callback request as a browser sends it (bench/dashboard_load.py uses it too)
"""
