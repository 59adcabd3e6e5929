"""The table legend's numbers: one number of decimals per chart column, as a researcher quotes a table (50.20 beside
50.06, not 50.2 beside 50.06; 21,586 MB; ratios with 3 decimals; '–' where a window holds no value)."""

from __future__ import annotations

import math

from radt.pages.parts import legend


def _entry(run: str, cpu: tuple, memory: tuple, smact: tuple, devices: list | None = None) -> dict:
    cells = [
        {"metric": "SMACT", "unit": "", "fmt": ".3f", **dict(zip(legend.STATS, smact, strict=True))},
        {"metric": "CPU", "unit": "% of all cores", "fmt": ",.4~g", **dict(zip(legend.STATS, cpu, strict=True))},
        {"metric": "GPU memory", "unit": "MB", "fmt": ",.4~g", **dict(zip(legend.STATS, memory, strict=True))},
    ]
    return {"id": run, "name": run, "color": "#1f77b4", "dash": "solid", "stats": cells, "devices": devices or []}


def _rows(found: list[dict]) -> list[list[str]]:
    table = legend.children(found)[0]
    body = table.children[1]
    return [[cell.children for cell in row.children[1:]] for row in body.children]


def test_every_row_of_a_chart_column_has_the_same_decimals():
    found = [
        _entry("long 0", (50.06, 93.55, 66.63), (21586.4, 22747.0, 0.0), (0.5, 0.942, 0.64)),
        _entry("long 1", (50.2, 95.49, 5.0), (9000.0, 9500.5, 12.0), (0.499, 0.965, math.nan)),
    ]
    rows = _rows(found)
    assert rows[0] == ["0.500", "0.942", "0.640", "50.06", "93.55", "66.63", "21,586", "22,747", "0"]
    assert rows[1] == ["0.499", "0.965", "–", "50.20", "95.49", "5.00", "9,000", "9,500", "12"], "50.2 was printed beside 50.06"


def test_a_devices_rows_share_their_runs_columns_and_small_values_keep_their_digits():
    gpu = {
        "label": "GPU 1",
        "dash": "dash",
        "stats": [{"fmt": ".3f", "mean": 0.0, "max": 0.0, "last": 0.0}, {}, {"fmt": ",.4~g", "mean": 0.5, "max": 1.25, "last": 0.0}],
    }
    found = [_entry("run", (0.8, 1.5, 0.0123), (0.5, 1.25, 0.0), (0.25, 0.5, 0.25), [gpu])]
    rows = _rows(found)
    assert rows[0][3:] == ["0.800", "1.500", "0.012", "0.500", "1.250", "0.000"]
    assert rows[1] == ["0.000", "0.000", "0.000", "–", "–", "–", "0.500", "1.250", "0.000"], "an idle GPU reads 0.000, its missing chart –"


def test_a_runs_series_count_names_its_series_on_hover():
    """'mnist · 6 series' beside a run of 5 GPUs read as six GPUs: the count is of its series, the host's included, and
    hovering it now names them."""
    devices = [{"label": label, "dash": "solid", "stats": [{}, {}, {}]} for label in ("host", "GPU 0", "GPU 1", "GPU 0 · MIG 1")]
    name_cell = legend.children([_entry("mnist", (1, 2, 3), (4, 5, 6), (0.1, 0.2, 0.3), devices)])[0].children[1].children[0].children[0]
    more = name_cell.children[2]
    assert more.children == " · 4 series"
    assert more.title == "4 series: host, GPU 0, GPU 1, GPU 0 · MIG 1 ('per GPU' shows a row for each)"
