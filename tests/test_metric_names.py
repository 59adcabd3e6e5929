"""Every metric name from the catalogue: outside radt/catalogue.py no module spells a metric's name, a chart spec
naming one ("cat:sm_active") or an exporter's metric name (DCGM_FI_*, nvidia_gpu_*) as a string; code says
MetricName.SM_ACTIVE, so a renamed metric fails where it is used. Help text may mention a name in prose."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from radt import catalogue
from radt.catalogue import METRICS, MetricName

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("radt", "collectors", "app", "pages")
HOME = REPO / "radt" / "catalogue.py"
_NAMES = "|".join(sorted(map(re.escape, METRICS), key=len, reverse=True))
# a bare name, a chart spec, or a stored key ending in one: what code would use to look a metric up
SPELLED = re.compile(rf"^(?:(?:cat|key):|system/(?:[^/]+/)?(?:gpu_\d+_(?:mig_\d+_)?)?)?(?:{_NAMES})$")
EXPORTER_NAME = re.compile(r"^(?:DCGM_FI_[A-Z0-9_]+|nvidia_gpu_[a-z0-9_]+)$")


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions (prose, not code)."""
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(node.body[0].value) for node in ast.walk(tree) if isinstance(node, owners) and ast.get_docstring(node, clean=False) is not None}


def spelled_names(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant in the source that spells a metric or an exporter metric name."""
    tree = ast.parse(source)
    prose = docstrings(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in prose
        and (SPELLED.match(node.value) or EXPORTER_NAME.match(node.value))
    ]


def test_metric_name_holds_every_catalogue_metric_and_nothing_else():
    attributes = {name: value for name, value in vars(MetricName).items() if not name.startswith("_")}
    assert sorted(attributes.values()) == sorted(METRICS)
    assert all(name == value.upper() for name, value in attributes.items())


def test_no_module_spells_a_metric_name_outside_the_catalogue():
    found = {
        str(path.relative_to(REPO)): hits
        for folder in FOLDERS
        for path in sorted((REPO / folder).rglob("*.py"))
        if path != HOME and (hits := spelled_names(path.read_text()))
    }
    assert found == {}, "name these metrics through radt.catalogue (MetricName, the exporter tables)"


def test_a_planted_spelling_is_caught():
    source = '"""sm_active in a docstring is prose."""\nA = "sm_active"\nB = f"cat:{x}"\nC = "cat:power_usage_watts"\nD = "system/gpu_0_mig_3_sm_occupancy"\nE = "DCGM_FI_PROF_SM_ACTIVE"\nF = "help: a name such as power_usage_watts"\n'
    assert [line for line, _ in spelled_names(source)] == [2, 4, 5, 6]


def test_the_exporter_tables_live_in_the_catalogue():
    assert catalogue.DCGM_EXPORTER_METRICS["DCGM_FI_PROF_SM_ACTIVE"] == (MetricName.SM_ACTIVE, 1.0)
    assert set(catalogue.EXPORTER_METRICS) >= set(catalogue.DCGM_EXPORTER_METRICS) | set(catalogue.RADT_EXPORTER_METRICS)
