"""The command-line options several radt commands share, declared once as argparse parent parsers.

`radt`, `radt monitor`, `radt import`, `radt export`, `radt dashboard` ... all take `--store`; the recording
commands also take `--interval` and `--flush-timeout`. Their help and defaults come from radt/settings.py.
"""

from __future__ import annotations

import argparse
import re

from radt import settings
from radt.errors import UserError

STORE_HELP = "tracking URI (default: MLFLOW_TRACKING_URI, else ~/.radt/mlflow.db)"


def store_parent() -> argparse.ArgumentParser:
    """`--store URI`: the tracking store a command reads or writes (settings.tracking_uri resolves the default)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--store", help=STORE_HELP)
    return parent


def recording_parent(flush_help: str = "when a run ends") -> argparse.ArgumentParser:
    """`--interval` and `--flush-timeout`, with RADT_INTERVAL and RADT_FLUSH_TIMEOUT as their defaults."""
    parent = argparse.ArgumentParser(add_help=False)
    interval, floor, flush = settings.INTERVAL.get(), settings.MIN_INTERVAL, settings.FLUSH_TIMEOUT.get()
    parent.add_argument("--interval", type=float, default=interval, help=f"seconds between samples ({floor:g} or more; default {interval:g}, RADT_INTERVAL)")
    parent.add_argument(
        "--flush-timeout",
        type=float,
        default=flush,
        help=f"seconds to keep trying an unreachable store {flush_help} (default {flush:g}, RADT_FLUSH_TIMEOUT)",
    )
    return parent


_SPAN = re.compile(r"^(\d+(?:\.\d+)?)\s*(m|h|d|w)$")
_SPAN_MS = {"m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 7 * 86_400_000}


def span_ms(text: str, option: str) -> int:
    """'30m', '6h', '7d' or '2w' -> milliseconds; a UserError naming the option and an example for anything else."""
    found = _SPAN.fullmatch(text.strip().lower())
    if not found or float(found.group(1)) <= 0:
        raise UserError(f"{option} {text!r} is not a span of time; give minutes, hours, days or weeks, such as {option} 7d or {option} 12h")
    return int(float(found.group(1)) * _SPAN_MS[found.group(2)])
