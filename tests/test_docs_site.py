"""The README fits a screen or three and starts with the two commands; the user guide is a site whose every page exists
and whose links resolve (issue #53: a 1,046-line README described the dashboard 40 % of the way down).

The site is MkDocs with the Material theme (mkdocs.yml); CI builds it with --strict, and so does the last test here
where mkdocs is installed (requirements-dev.txt).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from radt import cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 250
# what the guide holds, one page per topic, beside the design notes (issue #53 item 8)
GUIDE = ("tracking.md", "experiments.md", "slurm.md", "prometheus.md", "dashboard.md", "stores.md", "reference.md")
NOTES = ("ARCHITECTURE.md", "RELIABILITY.md", "PERFORMANCE.md", "GPU.md", "development.md")
INNER_LOOP = re.compile(r'-m "((?:not \w+(?: and )?)+)"')


def mkdocs_config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def nav_pages(nav) -> list[str]:
    """Every page the nav names, however deep its sections."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


def first_code_block(text: str) -> tuple[int, str]:
    """The line the README's first fenced block opens on, and its text."""
    match = re.search(r"^```\w*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert match, "the README has no code block"
    return text[: match.start()].count("\n") + 1, match.group(1)


def test_the_readme_fits_a_screen_or_three():
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines, over {MAX_README_LINES}: move the detail into a page of docs/"


def test_the_readme_starts_with_the_two_commands():
    text = README.read_text()
    opens_at, block = first_code_block(text)
    assert "\n## " not in text.split("```", 1)[0], "a section comes before the README's commands"
    assert opens_at <= 5, f"the README's commands open on line {opens_at}: they come first, under the title"
    assert "pip install -e . && .venv/bin/radt demo && .venv/bin/python app.py" in block, "the first command (install, demo, dashboard) is missing"
    ci_test = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip() and not line.startswith("#")][-1]
    assert any(line.startswith("python3 -m venv .venv") and line.endswith(ci_test) for line in block.splitlines()), (
        f"the README's test command does not end in the one CI runs ({ci_test})"
    )
    inner = INNER_LOOP.search(block)
    assert inner, 'the README\'s commands lack the inner loop (-m "not ... and not ...")'
    markers = {line.split(":")[0] for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]}
    named = set(re.findall(r"not (\w+)", inner.group(1)))
    assert named <= markers, f"the inner loop names markers pyproject.toml does not register: {sorted(named - markers)}"


def test_every_link_of_the_readme_reaches_a_file():
    """GitHub shows the README, not the site: its links to the guide are checked here, not by mkdocs."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [target for target in targets if "://" not in target]
    assert local, "the README links to no page of the guide"
    missing = [target for target in local if not (ROOT / target).exists()]
    assert missing == []


def test_every_page_of_the_nav_exists_and_every_page_is_in_it():
    config = mkdocs_config()
    assert config["docs_dir"] == "docs"
    assert config["theme"]["name"] == "material"
    assert config["theme"].get("font") is False, "theme.font must be false: Google Fonts cannot be reached where radt is built"
    docs = ROOT / config["docs_dir"]
    pages = nav_pages(config["nav"])
    assert [page for page in pages if not (docs / page).is_file()] == []
    assert set(GUIDE + NOTES) <= set(pages), f"the nav lacks {sorted(set(GUIDE + NOTES) - set(pages))}"
    assert sorted(path.name for path in docs.glob("*.md") if path.name not in pages) == [], "a page of docs/ is not in the nav"


def command_options(argv: list[str], capsys) -> set[str]:
    """The long options a radt command's --help lists (its own lines, not the words of their help)."""
    with pytest.raises(SystemExit) as stop:
        cli.main([*argv, "--help"])
    assert stop.value.code == 0
    help_text = capsys.readouterr().out
    flags = set()
    for line in help_text.splitlines():
        if re.match(r"^  -", line):
            flags |= {flag for flag in re.findall(r"(--[a-z][\w-]*)", re.split(r"\s{2,}", line.strip())[0])}
    return flags - {"--help"}


SECTIONS = {  # a command's --help, and the heading of the reference's section for it
    (): "radt train.py and radt experiment.csv",  # `radt --help`: after a script, --help would be the script's
    ("monitor",): "radt monitor",
    ("import", "x.log"): "radt import",
    ("import", "--prometheus", "http://p:9090", "--run", "r"): "radt import",
    ("import", "--slurm", "1"): "radt import",
    ("export",): "radt export",
    ("dashboard",): "radt dashboard",
    ("demo",): "radt demo, sync, rollup, retain",
    ("sync",): "radt demo, sync, rollup, retain",
    ("rollup",): "radt demo, sync, rollup, retain",
    ("retain",): "radt demo, sync, rollup, retain",
}


@pytest.mark.parametrize("argv", list(SECTIONS), ids=lambda argv: " ".join(("radt", *argv[:2])))
def test_the_reference_names_every_option_of_every_command(argv, capsys):
    reference = (ROOT / "docs" / "reference.md").read_text()
    heading = SECTIONS[argv]
    sections = dict(re.findall(r"^## ([^\n]+)\n(.*?)(?=^## |\Z)", reference, re.MULTILINE | re.DOTALL))
    assert heading in sections, f"docs/reference.md has no section '## {heading}'"
    section = sections[heading]
    options = command_options(list(argv), capsys)
    assert options or f"`radt {argv[0]}`" in section, f"'## {heading}' of docs/reference.md does not name `radt {argv[0]}`"
    missing = sorted(option for option in options if not re.search(rf"`[^`]*{re.escape(option)}(?![\w-])", section))
    assert missing == [], f"'## {heading}' of docs/reference.md lacks {missing}"


def test_the_site_builds_in_strict_mode(tmp_path):
    """A broken link, a missing page or an unknown anchor fails the build (mkdocs.yml: strict, validation)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file()
    assert "fonts.googleapis.com" not in (tmp_path / "site" / "index.html").read_text()
