"""One core, two sides: `radt/` imports neither side, `collectors/` never imports the dashboard, `app/` and
`pages/` never import the tracker, and no radt modules import each other in a circle. Inside `collectors/` and `app/`
the rooms stand in layers: each imports only itself and the rooms below it. `pages/` holds one Dash page per file at
its top and their components in `pages/parts/`; `app/` never imports `pages/`.

Read from the source with `ast` (every import, also those inside functions), so a new violation fails
here before anyone runs the code path that has it.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import NamedTuple

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
COLLECTOR_ROOMS = ("process", "sources", "store", "diagnose", "run", "experiment", "recovery", "slurm", "cluster", "imports", "monitor")
COMMON = "_common"  # the user-error and first-line helpers every room uses: it imports no room
ENTRY_POINTS = ("cli", "demo")  # the command entry points: they may import any room, and no room imports them
# app/'s rooms, lowest first: the store's reads, the run summaries and comparison, the figures, a view and its cached reads,
# paper export, the web server's hooks. At the top only the entry points: the Dash app (dashboard, `radt.app:server`
# through app/__init__.py), `radt dashboard` (main), `radt export` (exportcli), `radt retain` (retain).
APP_ROOMS = ("db", "summary", "figures", "view", "export", "web")
APP_ENTRY_POINTS = ("main", "exportcli", "retain")
PAGE_PARTS = "parts"  # pages/' components (legend, run picker, tables, ids): Dash registers only the pages at pages/' top


class Plan(NamedTuple):
    """One side's rooms: its folder, the package it installs as, its rooms lowest first, its ground, its entry points."""

    folder: str
    package: str
    rooms: tuple[str, ...]
    common: str | None
    entry_points: tuple[str, ...]
    listed: str  # the name of the rooms' list here, for the message


PLANS = (
    Plan("collectors", "radt.collectors", COLLECTOR_ROOMS, COMMON, ENTRY_POINTS, "COLLECTOR_ROOMS"),
    Plan("app", "radt.app", APP_ROOMS, None, APP_ENTRY_POINTS, "APP_ROOMS"),
)


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


def plan_of(module: str) -> Plan | None:
    """The plan of the side a module belongs to (collectors/ or app/); None for radt/ and pages/."""
    return next((plan for plan in PLANS if module.startswith(plan.package + ".")), None)


def room_of(module: str) -> str | None:
    """The room (sub-package or top-level module) of a collectors/ or app/ module names; None elsewhere."""
    plan = plan_of(module)
    return module[len(plan.package) + 1 :].split(".")[0] if plan else None


def floor(plan: Plan, room: str) -> int:
    """A room's layer: the side's ground (`_common`), its rooms in the plan's order, the entry points on top."""
    if room == plan.common:
        return 0
    if room in plan.rooms:
        return 1 + plan.rooms.index(room)
    return 1 + len(plan.rooms)


def misplaced(known: dict[str, Path]) -> list[str]:
    """Every collectors/ or app/ module that stands outside its plan: at the top but neither the ground nor an entry
    point, in a sub-package the plan does not name, or in an `__init__.py` that holds code (the rooms' faces stay empty)."""
    bad = []
    for name, path in known.items():
        plan, room = plan_of(name), room_of(name)
        if room is None:
            continue
        at_top = path.parent == REPO / plan.folder
        if at_top and room not in (plan.common, *plan.entry_points):
            bad.append(f"{path.relative_to(REPO)} stands at the top of {plan.folder}/: put it in a room of {plan.listed}")
        elif not at_top and room not in plan.rooms:
            bad.append(f"{path.relative_to(REPO)} is in {plan.folder}/{room}/, a room {plan.listed} does not place")
        if path.name == "__init__.py" and path.read_text().strip():
            bad.append(f"{path.relative_to(REPO)} holds code: a room's __init__.py stays empty")
    return bad


def upward(known: dict[str, Path]) -> list[str]:
    """Every import of a room by a lower one of the same side (or of an entry point by a room), as 'file:line imports module'."""
    bad = []
    for name, path in known.items():
        plan, room = plan_of(name), room_of(name)
        if room is None:
            continue
        for line, target in imports(name, path):
            owner = target if target in known else target.rpartition(".")[0]
            other = room_of(owner) if owner in known and plan_of(owner) == plan else None
            if other is not None and other != room and floor(plan, other) >= floor(plan, room):
                bad.append(f"{path.relative_to(REPO)}:{line} imports {target} ({room} stands below {other}: move what it needs down)")
    return bad


def stray_pages(known: dict[str, Path]) -> list[str]:
    """Every pages/ module out of place: a Dash page (register_page) outside pages/' top, a component at the top, a folder
    other than pages/parts/, or a part that imports a page (parts stand below the pages that assemble them)."""
    bad = []
    for name, path in known.items():
        if not name.startswith("radt.pages.") or path.name == "__init__.py":
            continue
        where, page = path.relative_to(REPO), "register_page" in path.read_text()
        folder = path.parent.relative_to(REPO / "pages").parts
        if folder == () and not page:
            bad.append(f"{where} is no Dash page: put it in pages/{PAGE_PARTS}/")
        elif folder and (folder != (PAGE_PARTS,) or page):
            bad.append(f"{where} stands in pages/{'/'.join(folder)}/: a page belongs at pages/' top, its components in pages/{PAGE_PARTS}/")
        if folder == (PAGE_PARTS,):
            for line, target in imports(name, path):
                owner = target if target in known else target.rpartition(".")[0]
                if owner.startswith("radt.pages.") and not owner.startswith(f"radt.pages.{PAGE_PARTS}"):
                    bad.append(f"{where}:{line} imports {target} (a part imports no page)")
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


def test_collectors_and_app_rooms_import_only_the_rooms_below_them():
    assert upward(modules()) == []


def test_every_collectors_and_app_module_stands_in_a_room_of_the_plan():
    assert misplaced(modules()) == []


def test_the_plan_names_every_room_of_collectors():
    rooms = sorted(path.parent.name for path in (REPO / "collectors").glob("*/__init__.py"))
    assert rooms == sorted(COLLECTOR_ROOMS)


def test_the_plan_names_every_room_of_app():
    rooms = sorted(path.parent.name for path in (REPO / "app").glob("*/__init__.py"))
    assert rooms == sorted(APP_ROOMS)


def test_pages_hold_one_dash_page_per_file_and_their_parts_beside_them():
    assert stray_pages(modules()) == []


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        ("collectors/store/_probe.py", "from radt.collectors.run import finish\n", "collectors/store/_probe.py:1 imports radt.collectors.run.finish (store"),
        ("collectors/_common_probe.py", "x = 1\n", "collectors/_common_probe.py stands at the top"),
        ("collectors/process/_probe.py", "def f():\n    from radt.collectors.cli import main\n", "collectors/process/_probe.py:2 imports radt.collectors.cli"),
        ("collectors/_common.py", "from radt.collectors.process.watchdog import is_same\n", "collectors/_common.py:1 imports radt.collectors.process.watchdog"),
        ("collectors/attic/_probe.py", "x = 1\n", "collectors/attic/_probe.py is in collectors/attic/"),
        ("app/db/_probe.py", "from radt.app.view import data\n", "app/db/_probe.py:1 imports radt.app.view.data (db stands below view"),
        ("app/summary/_probe.py", "def f():\n    from radt.app.main import main\n", "app/summary/_probe.py:2 imports radt.app.main"),
        ("app/_probe.py", "x = 1\n", "app/_probe.py stands at the top of app/"),
        ("app/attic/_probe.py", "x = 1\n", "app/attic/_probe.py is in app/attic/"),
        ("app/web/__init__.py", "x = 1\n", "app/web/__init__.py holds code"),
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


def test_a_page_out_of_place_is_caught_and_dash_finds_the_pages():
    """The pages checker itself (a component at the top, a page among the parts, a part importing a page), and Dash's
    own walk of pages/ registers exactly the files at its top: the parts folder is walked but registers nothing."""
    probes = {
        REPO / "pages" / "_probe.py": ("x = 1\n", "pages/_probe.py is no Dash page"),
        REPO / "pages" / PAGE_PARTS / "_page.py": ("dash.register_page(__name__)\n", "pages/parts/_page.py stands in pages/parts/"),
        REPO / "pages" / PAGE_PARTS / "_part.py": ("from radt.pages import explore\n", "pages/parts/_part.py:1 imports radt.pages.explore"),
    }
    known = modules() | {module_name(probe): probe for probe in probes}
    original_read = Path.read_text

    def read_text(self, *args, **kwargs):
        return probes[self][0] if self in probes else original_read(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Path, "read_text", read_text)
        found = stray_pages(known)
    for _source, expected in probes.values():
        assert any(line.startswith(expected) for line in found), found
    pages = sorted(path.stem for path in (REPO / "pages").glob("*.py") if "register_page" in path.read_text())
    assert pages == ["cluster", "explore", "live"]


@pytest.mark.parametrize(
    ("folder", "source", "expected"),
    [
        ("collectors", "from radt.app import queries\n", "collectors/_probe.py:1 imports radt.app.queries"),
        ("collectors", "def f():\n    from radt.app.export.tables import data_csv\n", "collectors/_probe.py:2 imports radt.app.export.tables"),
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


MAX_PARAMETERS = 8  # STYLE.md: a function with more than a handful of parameters takes an object
# the functions that still take more, by module and qualified name: this list may only shrink (see the test below)
LONG_SIGNATURES = frozenset(
    {
        "radt.pages.parts.export_panel:export",  # a Dash callback: Dash passes each Input and State as its own argument
        "radt.pages.explore:draw",  # a Dash callback, as above
        "radt.pages.explore:layout",  # a Dash page: Dash passes each query parameter of the URL as its own keyword
        "radt.app.db.series:load_series",  # the dashboard's series query: its window, budget and method still loose
        "radt.settings:Setting.__init__",  # a setting's declaration: its bounds and check still loose
    }
)


def parameter_counts(module: str, source: str) -> dict[str, int]:
    """Each function's parameters (positional and keyword-only, not self/cls, not *args/**kwargs) by module:qualname."""
    counts: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs) if p.arg not in ("self", "cls")]
                counts[f"{module}:{prefix}{child.name}"] = len(names)
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return counts


def long_signatures(known: dict[str, Path]) -> dict[str, int]:
    """The functions of radt's modules that take more than MAX_PARAMETERS parameters."""
    counts = {name: n for module, path in known.items() for name, n in parameter_counts(module, path.read_text()).items()}
    return {name: n for name, n in counts.items() if n > MAX_PARAMETERS}


def test_no_function_takes_more_than_a_handful_of_parameters():
    """A new long signature fails here (give it one object); a converted one must leave LONG_SIGNATURES."""
    found = long_signatures(modules())
    assert {name: n for name, n in found.items() if name not in LONG_SIGNATURES} == {}
    assert sorted(LONG_SIGNATURES - set(found)) == [], "converted: remove from LONG_SIGNATURES"


def test_a_new_long_signature_is_caught():
    source = "class Job:\n    def __init__(self, a, b, c, d, e, f, g, h, *, i=1):\n        pass\n\ndef short(a, *args, **kwargs):\n    pass\n"
    assert parameter_counts("radt.x", source) == {"radt.x:Job.__init__": 9, "radt.x:short": 1}
