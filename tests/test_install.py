"""A clean install: the wheel adds one top-level name (`radt`), ships the dashboard's assets, leaves another
distribution's `app`, `pages` and `collectors` alone, and puts nothing of radt's on a training script's path
beyond what `import radt` needs.

radt is built with `pip wheel` and installed non-editable into a folder of its own, which comes first on
PYTHONPATH (before the checkout's editable install), next to a folder holding somebody else's `app`, `pages`
and `collectors` packages, as a user's environment could.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.paths import REPO
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.radtproc import run_radt

OTHERS = ("app", "pages", "collectors")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The folder radt's wheel was installed into (pip install --target, no dependencies: the venv has them)."""
    wheels = tmp_path_factory.mktemp("wheel")
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)]
    subprocess.run(build, check=True, capture_output=True, timeout=300)
    wheel = next(wheels.glob("radt-*.whl"))
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)], check=True, capture_output=True, timeout=300
    )
    return target


@pytest.fixture(scope="module")
def somebody_elses(tmp_path_factory) -> Path:
    """A folder with another distribution's top-level `app`, `pages` and `collectors` packages."""
    folder = tmp_path_factory.mktemp("other")
    for name in OTHERS:
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text(f"OWNER = 'somebody else'\nNAME = {name!r}\n")
    return folder


@pytest.fixture(scope="module")
def user_env(installed, somebody_elses, tmp_path_factory) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RADT_", "PYTEST_", "PYTHONPATH"))}
    home = tmp_path_factory.mktemp("home")
    env.update(PYTHONPATH=f"{installed}{os.pathsep}{somebody_elses}", RADT_HOME=str(home), MLFLOW_DISABLE_TELEMETRY="true")
    return env


@pytest.fixture(scope="module")
def demo_store(user_env, tmp_path_factory) -> str:
    """A SQLite store the installed `radt demo` wrote (two minutes of run alone: the export below needs 100 rows, the
    default 15 minutes would only write 7 times the points)."""
    folder = tmp_path_factory.mktemp("store")
    store = f"sqlite:///{folder / 'mlflow.db'}"
    demo = radt(["demo", "--minutes", "2", "--store", store], user_env, folder)
    assert demo.returncode == 0, demo.stderr
    return store


def radt(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_radt(args, env=env, cwd=cwd, timeout=timeout)


def test_the_wheel_adds_one_top_level_name_and_ships_the_assets(installed):
    top = {path.name for path in installed.iterdir() if path.name not in ("bin", "__pycache__")}
    assert {name for name in top if not name.endswith(".dist-info")} == {"radt"}, top
    package = installed / "radt"
    for part in ("app/web/dashboard.py", "pages/explore.py", "collectors/run/runner.py", "collectors/sources/nvml.py", "catalogue.py", "cli.py"):
        assert (package / part).is_file(), part
    for asset in sorted((REPO / "assets").iterdir()):
        assert (package / "assets" / asset.name).read_bytes() == asset.read_bytes(), asset.name
    assert not (package / "tests").exists()
    record = next(installed.glob("radt-*.dist-info")) / "RECORD"
    assert not [line for line in record.read_text().splitlines() if line.split("/")[0] in OTHERS], "the wheel writes outside radt/"


def shipped_name(path: Path) -> str:
    """Where a checkout file lies in the wheel: radt/ as it is, the other folders under radt/ (setup.py's mapping)."""
    relative = path.relative_to(REPO).as_posix()
    return relative if relative.startswith("radt/") else f"radt/{relative}"


def test_the_wheel_holds_every_python_file_of_the_checkout(installed):
    """The packages are found (setup.py), not listed: a sub-package added to any folder is in the wheel, none left out,
    and no module the checkout has not (an old path kept alive)."""
    record = next(installed.glob("radt-*.dist-info")) / "RECORD"
    shipped = {line.split(",")[0] for line in record.read_text().splitlines()}
    sources = [path for folder in ("radt", "collectors", "app", "pages") for path in (REPO / folder).rglob("*.py") if "__pycache__" not in path.parts]
    assert len(sources) > 100
    assert [shipped_name(path) for path in sources if shipped_name(path) not in shipped] == []
    # and nothing else: a module the checkout no longer has (a stale build/ after a move: rm -rf build) would live on in the wheel
    assert sorted(name for name in shipped if name.endswith(".py")) == sorted(shipped_name(path) for path in sources)


def test_another_distributions_app_is_neither_shadowed_nor_shadowing(installed, user_env, tmp_path):
    probe = "import app, collectors, pages, radt, radt.app.main; print(app.OWNER, collectors.OWNER, pages.OWNER, radt.__file__)"
    done = subprocess.run([sys.executable, "-c", probe], env=user_env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:3] == ["somebody", "else", "somebody"] and done.stdout.strip().endswith(str(installed / "radt" / "__init__.py"))
    helped = radt(["--help"], user_env, tmp_path, timeout=120)
    assert helped.returncode == 0 and "usage: radt" in helped.stdout, helped.stderr


def test_installed_radt_runs_demo_export_and_a_script(installed, user_env, demo_store, tmp_path):
    store = demo_store
    out = tmp_path / "smact.csv"
    export = radt(["export", "--store", store, "--experiment", "demo: resnet50 collocation", "--metric", "smact", "-o", str(out)], user_env, tmp_path)
    assert export.returncode == 0, export.stderr
    rows = out.read_text().splitlines()
    assert len(rows) > 100 and "value" in rows[0].split(","), rows[:2]

    script = tmp_path / "train.py"
    script.write_text(
        "import json, os, sys\nimport app, radt\n"
        "json.dump({'app': app.OWNER, 'radt': radt.__file__, 'path': os.environ.get('PYTHONPATH', '').split(os.pathsep)}, open(sys.argv[1], 'w'))\n"
    )
    seen = tmp_path / "seen.json"
    run = radt(["-l", "host", "--store", store, str(script), str(seen)], user_env, tmp_path)
    assert run.returncode == 0, run.stderr
    inside = json.loads(seen.read_text())
    assert inside["app"] == "somebody else"  # the user's `app`, not radt's dashboard
    assert inside["radt"].startswith(str(installed))
    added = [entry for entry in inside["path"] if entry not in user_env["PYTHONPATH"].split(os.pathsep)]
    assert len(added) == 1, inside["path"]  # one folder, holding nothing but `radt`
    assert [p.name for p in Path(added[0]).iterdir() if not p.name.startswith(".")] == ["radt"]


def test_installed_dashboard_serves_its_pages_and_zoom(user_env, demo_store, tmp_path):
    store = demo_store
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "radt", "dashboard", "--store", store, "--port", str(port)],
        env=user_env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def page() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
                    return answer.read().decode()
            except OSError:
                assert server.poll() is None, server.stderr.read().decode()
                return None

        html = wait_for(page, timeout=120)
        assert "zoom.js" in html and "style.css" in html
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/assets/zoom.js", timeout=10) as answer:
            assert answer.read() == (REPO / "assets" / "zoom.js").read_bytes()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_dash-layout", timeout=10) as answer:
            assert answer.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_dash-dependencies", timeout=10) as answer:
            assert len(json.loads(answer.read())) > 10  # the pages' callbacks are registered
    finally:
        server.terminate()
        server.wait(timeout=30)
