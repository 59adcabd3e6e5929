"""Where a workload's MIG slices go on their GPU: the GPU's placement table, the instances already there, a small search.

A GPU in MIG mode has memory slices (8 on an A100, H100 or H200, 4 on an A30) and compute slices (7, 4). Each GPU
instance profile may start only at some memory slices and takes a fixed number of them, as `nvidia-smi mig -lgipp`
prints (`GPU  0 Profile ID  9 Placements: {0,4}:4`), and GPU instances never overlap. Profiles that each have a free
instance may not fit together (4g.20gb + 2g.10gb + 2g.10gb on an A100 40GB), so the plan places the workload's whole
set, and set-up creates each slice where it was placed (`nvidia-smi mig -cgi 3g.20gb:4`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

DRIVER = "nvidia-smi mig -lgipp"
_LGIPP_LINE = re.compile(r"^GPU\s+(\d+)\s+Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([\d,\s]*)\}\s*:\s*(\d+)")
_LGI_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|")  # GPU, profile, its id, GI id, start:size


@dataclass(frozen=True)
class Slot:
    """A GPU instance's memory slices: `size` of them from `start`."""

    start: int
    size: int

    @property
    def mask(self) -> int:
        return ((1 << self.size) - 1) << self.start

    def text(self) -> str:
        return str(self.start) if self.size == 1 else f"{self.start}-{self.start + self.size - 1}"


@dataclass(frozen=True)
class Held:
    """A GPU instance on the GPU already (someone else's, or a run's outside radt): its slices are taken."""

    profile: str
    gpu_instance: int
    slot: Slot


@dataclass(frozen=True)
class MigLayout:
    """What placing slices on one GPU needs: each profile's placements, the instances there, and where the table came from."""

    placements: dict[str, tuple[Slot, ...]]  # empty: not known (the driver did not answer, radt has no table for the GPU)
    held: tuple[Held, ...] = ()
    free: dict[str, int] = field(default_factory=dict)  # instances of each profile the GPU can still give (`-lgip`); none: no cap
    basis: str = DRIVER  # "nvidia-smi mig -lgipp", or "radt's table for the A100 40GB"
    fallback: str = ""  # why the driver's own table was not used ("" when it was)

    def compute_slices(self) -> int:
        """The GPU's compute slices: those of its whole-GPU profile (7g.40gb: 7)."""
        return max((compute_slices(p) for p in self.placements), default=0)

    def memory_slices(self) -> int:
        return max((s.start + s.size for slots in self.placements.values() for s in slots), default=0)


def compute_slices(profile: str) -> int:
    """'3g.20gb' -> 3: the compute slices a profile takes (its name says so in every MIG GPU's naming)."""
    return int(profile.split("g.", 1)[0])


def memory_size(layout: MigLayout, profile: str) -> int:
    """The memory slices a profile takes on this GPU."""
    return layout.placements[profile][0].size


def parse_placements(text: str, gpu: int, names: dict[int, str]) -> dict[str, tuple[Slot, ...]]:
    """`nvidia-smi mig -lgipp`'s lines of GPU `gpu` by profile name (`names`: profile id -> name, from `-lgip`)."""
    found = {}
    for line in text.splitlines():
        match = _LGIPP_LINE.match(line.strip())
        if match and int(match[1]) == gpu and int(match[2]) in names:
            starts = [int(s) for s in match[3].replace(" ", "").split(",") if s]
            found[names[int(match[2])]] = tuple(Slot(s, int(match[4])) for s in starts)
    return found


def parse_instances(text: str, gpu: int) -> tuple[Held, ...]:
    """The GPU instances `nvidia-smi mig -lgi` lists on GPU `gpu`, with their placements ('No GPU instances found': none)."""
    rows = (_LGI_ROW.match(line.strip()) for line in text.splitlines())
    return tuple(Held(m[2], int(m[4]), Slot(int(m[5]), int(m[6]))) for m in rows if m and int(m[1]) == gpu)


def _eight(one: str, one_wide: str, two: str, three: str, four: str, seven: str) -> dict[str, tuple[Slot, ...]]:
    """The placements of a GPU of 8 memory slices and 7 compute slices (A100, H100, H200), its profiles named for its memory."""
    ones = tuple(Slot(s, 1) for s in range(7))
    return {
        one: ones,
        f"{one}+me": ones,
        one_wide: tuple(Slot(s, 2) for s in (0, 2, 4, 6)),
        two: tuple(Slot(s, 2) for s in (0, 2, 4)),
        three: (Slot(0, 4), Slot(4, 4)),
        four: (Slot(0, 4),),
        seven: (Slot(0, 8),),
    }


# radt's own tables, where the GPU does not answer `nvidia-smi mig -lgipp`: NVIDIA's MIG user guide (Supported MIG
# Profiles, Getting Started: -lgipp on an A100 40GB, an H100 and an A30)
MODEL_TABLES: dict[str, dict[str, tuple[Slot, ...]]] = {
    "A100 40GB": _eight("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    "A100 80GB or H100 80GB": _eight("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100 94GB": _eight("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
    "H100 96GB": _eight("1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"),
    "H200": _eight("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    "A30": {
        "1g.6gb": tuple(Slot(s, 1) for s in range(4)),
        "1g.6gb+me": tuple(Slot(s, 1) for s in range(4)),
        "2g.12gb": (Slot(0, 2), Slot(2, 2)),
        "2g.12gb+me": (Slot(0, 2), Slot(2, 2)),
        "4g.24gb": (Slot(0, 4),),
    },
}


def model_layout(profiles: Iterable[str]) -> tuple[str, MigLayout] | None:
    """The GPU model whose table holds every profile the GPU offers (`-lgip`), and its layout; None: radt has none."""
    offered = set(profiles)
    for model, table in MODEL_TABLES.items():
        if offered and offered <= set(table):
            return model, MigLayout(dict(table), basis=f"radt's table for the {model}")
    return None


def place(layout: MigLayout, profiles: list[str]) -> list[int] | None:
    """The start slice of each profile (in order), none overlapping another or an instance there; None: they do not fit."""
    if any(p not in layout.placements for p in profiles) or not _within_counts(layout, profiles):
        return None
    if sum(compute_slices(p) for p in [*profiles, *(h.profile for h in layout.held)]) > layout.compute_slices():
        return None
    # biggest first (fewest ways to place it); identical profiles in rising starts, so no order of them is tried twice
    order = sorted(range(len(profiles)), key=lambda i: (-memory_size(layout, profiles[i]), -compute_slices(profiles[i]), profiles[i]))
    starts: list[int] = [0] * len(profiles)
    taken = 0
    for held in layout.held:
        taken |= held.slot.mask
    return starts if _fill(layout, profiles, order, 0, taken, starts) else None


def _within_counts(layout: MigLayout, profiles: list[str]) -> bool:
    return all(profiles.count(p) <= layout.free.get(p, len(profiles)) for p in set(profiles))


def _fill(layout: MigLayout, profiles: list[str], order: list[int], k: int, taken: int, starts: list[int]) -> bool:
    """Backtracking over the profiles in `order` from the k-th: each on a free placement, recorded in `starts`."""
    if k == len(order):
        return True
    index = order[k]
    previous = order[k - 1] if k else None
    floor = starts[previous] + 1 if previous is not None and profiles[previous] == profiles[index] else 0
    for slot in layout.placements[profiles[index]]:
        if slot.start < floor or taken & slot.mask:
            continue
        starts[index] = slot.start
        if _fill(layout, profiles, order, k + 1, taken | slot.mask, starts):
            return True
    return False


def why_not(layout: MigLayout, profiles: list[str]) -> str:
    """Why the profiles do not fit together: what the GPU holds, the compute slices they need, each one's placements."""
    parts = []
    if layout.held:
        held = ", ".join(f"{h.profile} at {h.slot.text()} (GPU instance {h.gpu_instance})" for h in layout.held)
        parts.append(f"it already holds {held}")
    needed = sum(compute_slices(p) for p in [*profiles, *(h.profile for h in layout.held)])
    if needed > layout.compute_slices():
        with_held = f"with {'it' if len(layout.held) == 1 else 'them'} " if layout.held else ""
        parts.append(f"{with_held}they need {needed} of its {layout.compute_slices()} compute slices")
    tables = "; ".join(f"{p} at {_either([s.text() for s in layout.placements[p]])}" for p in dict.fromkeys(profiles))
    parts.append(f"{layout.basis}, memory slices 0-{layout.memory_slices() - 1}: {tables}")
    return "; ".join(parts)


def _either(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def smaller_swap(layout: MigLayout, profiles: list[str]) -> tuple[int, str] | None:
    """One slice made smaller so the set fits: (its index, the profile), keeping the most compute, then memory; None: none does."""
    best: tuple[tuple[int, int, int], int, str] | None = None
    for index, profile in enumerate(profiles):
        for other in layout.placements:
            if not _smaller(layout, other, profile) or (layout.free and other not in layout.free):  # one the GPU offers
                continue
            changed = [*profiles[:index], other, *profiles[index + 1 :]]
            if place(layout, changed) is None:
                continue
            rank = (sum(compute_slices(p) for p in changed), sum(memory_size(layout, p) for p in changed), -index)
            if best is None or rank > best[0]:
                best = (rank, index, other)
    return (best[1], best[2]) if best else None


def _smaller(layout: MigLayout, other: str, profile: str) -> bool:
    """`other` takes no more compute nor memory than `profile`, and is not a media-extension variant it did not ask for."""
    if other == profile or ("+" in other and other.partition("+")[2] != profile.partition("+")[2]):
        return False
    return compute_slices(other) <= compute_slices(profile) and memory_size(layout, other) <= memory_size(layout, profile)


def fewest_dropped(layout: MigLayout, profiles: list[str]) -> list[int]:
    """The fewest slices (latest first) whose removal lets the rest fit; every index when none fits even alone."""
    for keep in range(min(len(profiles) - 1, layout.compute_slices()), 0, -1):  # each slice takes a compute slice at least
        for kept in itertools.combinations(range(len(profiles)), keep):
            if place(layout, [profiles[i] for i in kept]) is not None:
                return [i for i in range(len(profiles)) if i not in kept]
    return list(range(len(profiles)))
