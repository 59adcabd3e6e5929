"""Listener names on the command line -> metric sources; radT's names keep working as aliases."""

from __future__ import annotations

from collectors.sources.base import MetricSource

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
}
PROFILERS = {"nsys", "ncu", "nsys-raw", "ncu-raw"}  # wrap the command; CSV experiments only
DEFAULT = "nvml+host"


class ListenerError(ValueError):
    """An unknown or unusable listener name; the message names it and the valid ones."""


def parse_listeners(spec: str | None) -> list[str]:
    """'smi+top+dcgmi' -> ['nvml', 'host', 'dcgm'] (deduplicated, in order)."""
    spec = (spec or DEFAULT).strip()
    names: list[str] = []
    for raw in spec.replace(",", "+").split("+"):
        name = raw.strip().lower()
        if not name or name == "-":
            continue
        if name in PROFILERS:
            raise ListenerError(f"listener '{name}' wraps the command with a profiler and is only available in CSV experiments; use -l nvml+host here")
        if name not in ALIASES:
            known = ", ".join(sorted(set(ALIASES)))
            raise ListenerError(f"unknown listener '{name}'; choose from {known} (join several with '+')")
        if ALIASES[name] not in names:
            names.append(ALIASES[name])
    return names


def make_source(name: str) -> MetricSource:
    """A fresh source object for a resolved listener name."""
    if name == "nvml":
        from collectors.sources.nvml import NvmlSource

        return NvmlSource()
    if name == "dcgm":
        from collectors.sources.dcgm import DcgmSource

        return DcgmSource()
    if name == "host":
        from collectors.sources.host import HostSource

        return HostSource()
    raise ListenerError(f"unknown listener '{name}'")
