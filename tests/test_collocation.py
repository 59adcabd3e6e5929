"""radt/collocation.py: every CSV spelling of a collocation, the tag values stores hold, and the labels shown."""

import pytest

from radt.collocation import METHODS, MPS, SHARED, Collocation, Mode, from_key, from_tag, parse_cell

MIG_3G = Collocation(Mode.MIG, "3g.40gb")


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("", SHARED),
        ("-", SHARED),
        ("  -  ", SHARED),
        ("nan", SHARED),  # pandas' empty cell
        ("mps", MPS),
        ("MPS", MPS),
        (" Mps ", MPS),
        ("3g.40gb", MIG_3G),
        ("3G.40GB", MIG_3G),
        ("MIG 3g.40gb", MIG_3G),
        ("MIG  3G.40gb ", MIG_3G),
        ("1g.10gb+me", Collocation(Mode.MIG, "1g.10gb+me")),
    ],
)
def test_every_csv_spelling_reads_as_its_mode(cell, expected):
    assert parse_cell(cell) == expected


@pytest.mark.parametrize("cell", ["time-sliced", "mps2", "3g", "MIG", "none"])
def test_a_cell_that_is_no_collocation_reads_as_none(cell):
    assert parse_cell(cell) is None


def test_keys_and_cells_are_the_values_stored_today():
    assert [(c.key, c.cell) for c in (SHARED, MPS, MIG_3G)] == [("-", "-"), ("mps", "MPS"), ("3g.40gb", "3g.40gb")]
    assert [from_key(c.key) for c in (SHARED, MPS, MIG_3G)] == [SHARED, MPS, MIG_3G]


@pytest.mark.parametrize(
    ("tag", "expected"),
    [
        ("-", SHARED),
        ("", SHARED),
        ("none", SHARED),
        (None, SHARED),
        ("mps", MPS),
        ("MPS", MPS),
        (" 3g.40gb ", MIG_3G),
        ("1g.5gb", Collocation(Mode.MIG, "1g.5gb")),
    ],
)
def test_a_stored_tag_reads_as_its_mode(tag, expected):
    assert from_tag(tag) == expected


def test_labels_and_methods():
    assert [SHARED.label(1), SHARED.label(2), MPS.label(2), MIG_3G.label(2)] == ["alone", "same GPU", "MPS", "MIG 3g.40gb"]
    assert [SHARED.method(1), SHARED.method(3), MPS.method(1), MIG_3G.method(1)] == list(METHODS) == ["alone", "same GPU", "MPS", "MIG"]
