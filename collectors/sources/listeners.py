"""Listener names on the command line -> metric sources and an optional profiler; radT's names keep working."""

from __future__ import annotations

from radt.collectors.sources.base import MetricSource
from radt.errors import UserError

# radT listener -> radt source. `smi` read nvidia-smi, `top`/`ps`/`iostat` read the host.
ALIASES = {
    "nvml": "nvml",
    "smi": "nvml",
    "nvidia-smi": "nvml",
    "gpm": "nvml",
    "dcgm": "dcgm",
    "dcgmi": "dcgm",
    "host": "host",
    "top": "host",
    "ps": "host",
    "iostat": "host",
    "free": "host",
    "psutil": "host",
    "prometheus": "prometheus",
}
# Profilers wrap the training command (collectors/run/profilers.py); radT spelled the raw ones without the dash.
PROFILER_ALIASES = {"nsys": "nsys", "ncu": "ncu", "nsys-raw": "nsys-raw", "nsysraw": "nsys-raw", "ncu-raw": "ncu-raw", "ncuraw": "ncu-raw"}
DEFAULT = "nvml+host"


class ListenerError(UserError, ValueError):
    """An unknown or unusable listener name; the message names it and the valid ones."""


def _names(spec: str | None) -> list[str]:
    """The names of a listener list; None is the default, '-' none. An empty name ('', '+', 'nvml++') is a ListenerError."""
    spec = (DEFAULT if spec is None else spec).strip()
    names = []
    for raw in spec.replace(",", "+").split("+"):
        name = raw.strip().lower()
        if not name:
            raise ListenerError(
                f"listeners '{spec}' {'name no listener' if not spec else 'hold an empty name'}: join names with one '+', e.g. {DEFAULT}, or give '-' for none"
            )
        if name == "-":
            continue
        if name not in ALIASES and name not in PROFILER_ALIASES:
            known = ", ".join(sorted(set(ALIASES) | {"nsys", "ncu", "nsys-raw", "ncu-raw"}))
            raise ListenerError(f"unknown listener '{raw.strip()}'; choose from {known} (join several with '+')")
        names.append(name)
    return names


def parse_listeners(spec: str | None) -> list[str]:
    """'smi+top+dcgmi' -> ['nvml', 'host', 'dcgm'] (sources only, deduplicated, in order)."""
    sources: list[str] = []
    for name in _names(spec):
        if name in ALIASES and ALIASES[name] not in sources:
            sources.append(ALIASES[name])
    return sources


def parse_profiler(spec: str | None) -> str | None:
    """The one profiler in a listener list ('smi+nsys' -> 'nsys'), or None; two are refused."""
    found = sorted({PROFILER_ALIASES[n] for n in _names(spec) if n in PROFILER_ALIASES})
    if len(found) > 1:
        raise ListenerError(f"listeners {' and '.join(found)} both wrap the command; keep one profiler per run")
    return found[0] if found else None


def make_source(name: str) -> MetricSource:
    """A fresh source object for a resolved listener name."""
    if name == "nvml":
        from radt.collectors.sources.nvml import NvmlSource

        return NvmlSource()
    if name == "dcgm":
        from radt.collectors.sources.dcgm import DcgmSource

        return DcgmSource()
    if name == "host":
        from radt.collectors.sources.host import HostSource

        return HostSource()
    if name == "prometheus":
        from radt.collectors.sources.prometheus import PrometheusSource

        return PrometheusSource()
    raise ListenerError(f"unknown listener '{name}'")
