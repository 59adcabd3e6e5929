"""What a callback reads from a request, checked first: anyone who can reach the dashboard can post any JSON as a
control's value, and a value of the wrong type becomes the control's default (or nothing), never an error inside a callback."""

from __future__ import annotations

import math
from collections.abc import Collection

from radt.app.view.views import KEY_LIMIT, RUN_ID

MAX_MS = 2**53  # epoch milliseconds (and steps) as JSON numbers keep them exactly


def count(value: object) -> int:
    """A button's n_clicks or an interval's n_intervals: a whole number from 0, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_MS else 0


def choice(value: object, allowed: Collection, default: object) -> object:
    """One of a control's options (radio items, a dropdown), else its default."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return default
    return value if value in allowed else default


def number(value: object, default: float, low: float = -math.inf, high: float = math.inf) -> float:
    """A finite number from `low` to `high`, else `default`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(value) if math.isfinite(value) and low <= value <= high else default


def millis(value: object, default: int) -> int:
    """A time in epoch milliseconds (as a store keeps it), else `default`."""
    return int(number(value, default, 0, MAX_MS))


def run_id(value: object) -> str | None:
    """A run id, as MLflow makes them; None for anything else."""
    return value if isinstance(value, str) and RUN_ID.fullmatch(value) else None


def key(value: object) -> str | None:
    """A metric key a store can hold: printable text (no NUL), at most MLflow's 250 characters."""
    return value if isinstance(value, str) and 0 < len(value) <= KEY_LIMIT and value.isprintable() else None


def records(value: object) -> list[dict]:
    """A list of objects (a table's rows, a dropdown's options): what is not an object is left out."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
