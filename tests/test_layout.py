"""One core, two sides: `radt/` imports neither side, `collectors/` never imports the dashboard, `app/` and
`pages/` never import the tracker, and no radt modules import each other in a circle. Inside `collectors/` the
rooms stand in layers: each imports only itself and the rooms below it.

Read from the source with `ast` (every import, also those inside functions), so a new violation fails
here before anyone runs the code path that has it.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# the folders of the checkout and the package each installs as (pyproject.toml's package-dir)
PACKAGES = {"radt": "radt", "collectors": "radt.collectors", "app": "radt.app", "pages": "radt.pages"}
# what each side may import of radt's own packages
ALLOWED = {
    "radt": ("radt",),
    "radt.collectors": ("radt", "radt.collectors"),
    "radt.app": ("radt", "radt.app"),
    "radt.pages": ("radt", "radt.app", "radt.pages"),
}
SIDES = ("radt.collectors", "radt.app", "radt.pages")
# collectors/' rooms (sub-packages), lowest first: a room imports only itself, the rooms before it and `_common`.
COLLECTOR_ROOMS = ("process", "sources", "store", "run", "experiment", "recovery", "slurm", "cluster", "imports", "monitor")
COMMON = "_common"  # the user-error and first-line helpers every room uses: it imports no room
ENTRY_POINTS = ("cli", "demo")  # the command entry points: they may import any room, and no room imports them


def module_name(path: Path) -> str:
    folder = path.relative_to(REPO).parts[0]
    parts = [PACKAGES[folder], *path.relative_to(REPO / folder).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for folder in PACKAGES for path in sorted((REPO / folder).rglob("*.py"))}


def imports(name: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import in the file, relative ones resolved, top-level or not."""
    return list(_imports(name, path.name == "__init__.py", path.read_text(), str(path)))


@functools.cache
def _imports(name: str, is_package: bool, source: str, filename: str) -> list[tuple[int, str]]:
    """imports() of one text: each test of this module reads the same files, parsed once (~14 s of CPU a run before)."""
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]  # `from radt.app import queries`
    return found


def side_of(module: str) -> str:
    return next((side for side in SIDES if module == side or module.startswith(side + ".")), "radt")


def violations(known: dict[str, Path]) -> list[str]:
    """Every import that breaks the rule, as 'file:line imports module'."""
    bad = []
    for name, path in known.items():
        allowed = ALLOWED[side_of(name)]
        for line, target in imports(name, path):
            root = target.split(".")[0]
            where = f"{path.relative_to(REPO)}:{line} imports {target}"
            if root in ("app", "collectors", "pages"):  # the checkout's folders are not importable once installed
                bad.append(f"{where} (write radt.{target})")
            elif root == "radt" and (target in known or target.rpartition(".")[0] in known):
                owner = target if target in known else target.rpartition(".")[0]
                if side_of(owner) not in allowed:
                    bad.append(f"{where} ({side_of(name)} may import only {', '.join(allowed)})")
    return bad


def room_of(module: str) -> str | None:
    """The collectors/ room (sub-package or top-level module) a module of radt.collectors belongs to; None elsewhere."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["radt", "collectors"] and len(parts) > 2 else None


def floor(room: str) -> int:
    """A room's layer: `_common` the ground, the rooms in COLLECTOR_ROOMS' order, the entry points on top."""
    if room == COMMON:
        return 0
    if room in COLLECTOR_ROOMS:
        return 1 + COLLECTOR_ROOMS.index(room)
    return 1 + len(COLLECTOR_ROOMS)


def misplaced(known: dict[str, Path]) -> list[str]:
    """Every collectors/ module that stands outside the plan: at the top but neither `_common` nor an entry point,
    in a sub-package COLLECTOR_ROOMS does not name, or an `__init__.py` that holds code (the rooms' faces stay empty)."""
    bad = []
    for name, path in known.items():
        room = room_of(name)
        if room is None:
            continue
        at_top = path.parent == REPO / "collectors"
        if at_top and room not in (COMMON, *ENTRY_POINTS):
            bad.append(f"{path.relative_to(REPO)} stands at the top of collectors/: put it in a room of COLLECTOR_ROOMS")
        elif not at_top and room not in COLLECTOR_ROOMS:
            bad.append(f"{path.relative_to(REPO)} is in collectors/{room}/, a room COLLECTOR_ROOMS does not place")
        if path.name == "__init__.py" and path.read_text().strip():
            bad.append(f"{path.relative_to(REPO)} holds code: a room's __init__.py stays empty")
    return bad


def upward(known: dict[str, Path]) -> list[str]:
    """Every import of a collectors/ room by a lower one (or of an entry point by a room), as 'file:line imports module'."""
    bad = []
    for name, path in known.items():
        room = room_of(name)
        if room is None:
            continue
        for line, target in imports(name, path):
            owner = target if target in known else target.rpartition(".")[0]
            other = room_of(owner) if owner in known else None
            if other is not None and other != room and floor(other) >= floor(room):
                bad.append(f"{path.relative_to(REPO)}:{line} imports {target} ({room} stands below {other}: move what it needs down)")
    return bad


def cycles(known: dict[str, Path]) -> list[list[str]]:
    """The import cycles among radt's modules (strongly connected components of two or more, or a self-import)."""
    graph = {name: set() for name in known}
    for name, path in known.items():
        for _line, target in imports(name, path):
            owner = target if target in known else target.rpartition(".")[0]
            if owner in known and owner != name and not name.startswith(owner + "."):  # a package's own __init__ is not a cycle
                graph[name].add(owner)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_core_and_the_two_sides_import_only_what_the_rule_allows():
    assert violations(modules()) == []


def test_no_import_cycles_among_radts_modules():
    assert cycles(modules()) == []


def test_collectors_rooms_import_only_the_rooms_below_them():
    assert upward(modules()) == []


def test_every_collectors_module_stands_in_a_room_of_the_plan():
    assert misplaced(modules()) == []


def test_the_plan_names_every_room_of_collectors():
    rooms = sorted(path.parent.name for path in (REPO / "collectors").glob("*/__init__.py"))
    assert rooms == sorted(COLLECTOR_ROOMS)


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        ("collectors/store/_probe.py", "from radt.collectors.run import finish\n", "collectors/store/_probe.py:1 imports radt.collectors.run.finish (store"),
        ("collectors/_common_probe.py", "x = 1\n", "collectors/_common_probe.py stands at the top"),
        ("collectors/process/_probe.py", "def f():\n    from radt.collectors.cli import main\n", "collectors/process/_probe.py:2 imports radt.collectors.cli"),
        ("collectors/_common.py", "from radt.collectors.process.watchdog import is_same\n", "collectors/_common.py:1 imports radt.collectors.process.watchdog"),
        ("collectors/attic/_probe.py", "x = 1\n", "collectors/attic/_probe.py is in collectors/attic/"),
    ],
)
def test_a_room_out_of_its_layer_is_caught(path, source, expected):
    """The layering checker itself: an upward import, a module at the top, a room off the plan are each reported."""
    probe = REPO / path
    known = modules()
    known[module_name(probe)] = probe
    original_read = Path.read_text

    def read_text(self, *args, **kwargs):
        return source if self == probe else original_read(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Path, "read_text", read_text)
        found = upward(known) + misplaced(known)
    assert any(line.startswith(expected) for line in found), found


@pytest.mark.parametrize(
    ("folder", "source", "expected"),
    [
        ("collectors", "from radt.app import queries\n", "collectors/_probe.py:1 imports radt.app.queries"),
        ("collectors", "def f():\n    from radt.app.export import data_csv\n", "collectors/_probe.py:2 imports radt.app.export"),
        ("app", "from radt.collectors.store import tracking\n", "app/_probe.py:1 imports radt.collectors.store.tracking"),
        ("app", "from ..collectors.store.writer import MetricWriter\n", "app/_probe.py:1 imports radt.collectors.store.writer"),
        ("radt", "import radt.app.queries\n", "radt/_probe.py:1 imports radt.app.queries"),
        ("pages", "from collectors.cli import main\n", "pages/_probe.py:1 imports collectors.cli"),
    ],
)
def test_a_new_violation_is_caught(folder, source, expected):
    """The checker itself: each kind of violation, written into a module of that side, is reported with its line."""
    probe = REPO / folder / "_probe.py"
    known = modules()
    name = module_name(probe)
    known[name] = probe
    probe_text = source
    original_read = Path.read_text

    def read_text(self, *args, **kwargs):
        return probe_text if self == probe else original_read(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Path, "read_text", read_text)
        found = violations(known)
    assert any(line.startswith(expected) for line in found), found


def test_a_cycle_is_caught():
    known = {"radt.collectors.a": Path("a.py"), "radt.collectors.b": Path("b.py")}
    sources = {"a.py": "def f():\n    from radt.collectors import b\n", "b.py": "from radt.collectors.a import f\n"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Path, "read_text", lambda self, *a, **k: sources[str(self)])
        assert cycles(known) == [["radt.collectors.a", "radt.collectors.b"]]


def test_the_watchdog_runs_on_the_standard_library_and_names_the_run_folder_as_rundir_does():
    """collectors/process/watchdog.py starts as `python -I -S watchdog.py` (no site-packages, so no radt): it may import
    only the standard library, and the file names it shares with radt must be radt/rundir.py's."""
    import sys

    from radt import rundir
    from radt.collectors.process import watchdog

    path = REPO / "collectors" / "process" / "watchdog.py"
    imported = {target.split(".")[0] for _line, target in imports("radt.collectors.process.watchdog", path)}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported - set(sys.stdlib_module_names)
    assert (watchdog.TREE_FILE, watchdog.LOGS_DIR) == (rundir.TREE_FILE, rundir.LOGS_DIR)
