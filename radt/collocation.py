"""How runs share a GPU, spelled once for both sides: the collocation modes (none set up, MPS, MIG with its
profile), how the CSV's Collocation cell and radt's `radt.collocation` tag spell them, and their display labels.

A plan keeps a run's collocation as its key ('-', 'mps' or the MIG profile); the runner is given, and the tag
stores, the cell spelling ('-', 'MPS' or the profile); the dashboard reads either, in any case.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

MIG_PROFILE = re.compile(r"^\d+g\.\d+gb(\+\w+)?$")  # 1g.10gb, 3g.40gb, 1g.10gb+me
NO_SETUP_CELLS = ("", "-", "nan")  # CSV cells for runs that share a GPU with nothing set up (pandas reads an empty cell as 'nan')
NO_SETUP_TAGS = ("-", "", "none")  # tag (or radT `collocation` param) values of such runs
MIG_CELL_PREFIX = "MIG "  # a CSV cell may say 'MIG 3g.40gb'
ALONE = "alone"  # a run with nothing set up that ran by itself: the baseline
SAME_GPU = "same GPU"  # a run with nothing set up that ran together with others (time-sliced)


class Mode(Enum):
    """The collocation modes; a MIG mode's profile is its parameter (Collocation.profile)."""

    SHARED = "-"  # nothing set up: alone, or time-sliced on the same GPU with the workload's other runs
    MPS = "mps"
    MIG = "mig"


@dataclass(frozen=True)
class Collocation:
    """A run's collocation: its mode and, for MIG, the profile ('3g.40gb')."""

    mode: Mode
    profile: str = ""

    @property
    def key(self) -> str:
        """The plan's spelling: '-', 'mps' or the MIG profile."""
        return self.profile if self.mode is Mode.MIG else self.mode.value

    @property
    def cell(self) -> str:
        """As users write it, and as the tag stores it from a CSV: '-', 'MPS' or the MIG profile."""
        return "MPS" if self.mode is Mode.MPS else self.key

    def method(self, together_with: int) -> str:
        """The comparison's method: 'alone', 'same GPU' (ran with others, time-sliced), 'MPS' or 'MIG'."""
        if self.mode is Mode.SHARED:
            return SAME_GPU if together_with > 1 else ALONE
        return self.mode.name

    def label(self, together_with: int) -> str:
        """For display: 'alone', 'same GPU', 'MPS' or 'MIG 3g.40gb'."""
        return f"MIG {self.profile}" if self.mode is Mode.MIG else self.method(together_with)


SHARED = Collocation(Mode.SHARED)
MPS = Collocation(Mode.MPS)
METHODS = (ALONE, SAME_GPU, Mode.MPS.name, Mode.MIG.name)  # Collocation.method's values, in the order the papers print them


def parse_cell(text: str) -> Collocation | None:
    """A CSV Collocation cell: '-'/'' -> SHARED, 'mps' in any case -> MPS, '3g.20gb' or 'MIG 3G.20GB' -> MIG; None: none of these."""
    value = text.strip()
    if value in NO_SETUP_CELLS:
        return SHARED
    if value.lower() == Mode.MPS.value:
        return MPS
    profile = value.removeprefix(MIG_CELL_PREFIX).strip().lower()
    return Collocation(Mode.MIG, profile) if MIG_PROFILE.match(profile) else None


def from_key(key: str) -> Collocation:
    """A plan's key ('-', 'mps', a MIG profile) back into its collocation."""
    if key == Mode.SHARED.value:
        return SHARED
    return MPS if key == Mode.MPS.value else Collocation(Mode.MIG, key)


def from_tag(value: object) -> Collocation:
    """A stored `radt.collocation` tag (or radT's `collocation` param): 'mps' in any case is MPS, '-'/''/'none' or
    missing is SHARED, anything else is MIG (with the value as its profile)."""
    text = str(value or Mode.SHARED.value).strip()
    if text.lower() == Mode.MPS.value:
        return MPS
    return SHARED if text in NO_SETUP_TAGS else Collocation(Mode.MIG, text)
