"""What a reader must know before comparing a run's figures with another's: the tags that qualify its numbers.

A MIG run whose slice's own activity could not be read has the whole GPU's series; a run a profiler wrapped (`-l ...+ncu`)
has the profiler's kernel replays in its GPU series and its times. The run picker, the tooltips and the summary say so.
"""

from __future__ import annotations

from collections.abc import Mapping

from radt.catalogue import Device
from radt.runmodel import MIG_ACTIVITY_TAG, PROFILER_TAG


def _tags(tags) -> Mapping[str, str]:
    return tags if isinstance(tags, Mapping) else {}


def profiled_by(tags) -> str:
    """The profiler that wrapped the run's script ('ncu', 'nsys-raw', ...), or ''."""
    return str(_tags(tags).get(PROFILER_TAG) or "")


def profiler_caveat(tags) -> str:
    by = profiled_by(tags)
    return f"⚠ profiled by {by}: its GPU figures and times are the profiler's" if by else ""


def run_caveats(tags) -> list[str]:
    """The run's caveats as the run picker lists them after its name, short (its tooltips say what they mean)."""
    reason, by = _tags(tags).get(MIG_ACTIVITY_TAG), profiled_by(tags)
    found = [f"⚠ MIG slice activity not recorded ({reason})" if reason else "", f"⚠ profiled by {by}" if by else ""]
    return [text for text in found if text]


def series_caveats(tags, device: Device) -> list[str]:
    """The caveats of one drawn series of the run, for its tooltip: the MIG one only on a whole GPU's series."""
    reason = _tags(tags).get(MIG_ACTIVITY_TAG) if device.gpu is not None and device.mig is None else None
    found = [f"⚠ the whole GPU, not the run's MIG slice ({reason})" if reason else "", profiler_caveat(tags)]
    return [text for text in found if text]
