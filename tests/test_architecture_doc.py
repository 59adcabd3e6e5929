"""docs/ARCHITECTURE.md stays one true page (issue 53): every module it names exists, and every room of collectors/,
app/ and pages/ is named there, so a move that forgets the page fails here."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "ARCHITECTURE.md"
FOLDERS = ("radt", "collectors", "app", "pages", "tests", "bench", "examples")
SIDES = ("collectors", "app", "pages")
# a file name as the page writes one: `sampler.py`, `collectors/run/runner.py`, `sources/nvml.py`
NAMED = re.compile(r"(?<![\w/.-])((?:[a-z_]+/)*[a-z_]+\.py)\b")


def _python_files() -> set[str]:
    files = {str(p.relative_to(REPO)) for folder in FOLDERS for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts}
    return files | {p.name for p in REPO.glob("*.py")}


def _exists(name: str, files: set[str]) -> bool:
    """A bare name is any module of that name; a path, a file whose path ends with it (`sources/nvml.py`)."""
    return name in files or any(f == name or f.endswith("/" + name) for f in files)


def test_every_module_the_page_names_exists():
    text, files = PAGE.read_text(), _python_files()
    missing = sorted({name for name in NAMED.findall(text) if not _exists(name, files)})
    assert missing == [], f"docs/ARCHITECTURE.md names modules the tree does not have: {missing}"


def test_every_room_is_named_on_the_page():
    text = PAGE.read_text()
    rooms = sorted(f"{side}/{folder.name}/" for side in SIDES for folder in (REPO / side).iterdir() if folder.is_dir() and (folder / "__init__.py").exists())
    assert rooms, "the sides stand in rooms"
    unnamed = [room for room in rooms if f"`{room.split('/', 1)[1]}`" not in text and room not in text]
    assert unnamed == [], f"docs/ARCHITECTURE.md does not name these rooms: {unnamed}"
