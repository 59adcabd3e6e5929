"""The unit of data on the write path: one metric value at one instant."""

from __future__ import annotations

from typing import NamedTuple


class Point(NamedTuple):
    key: str
    value: float
    timestamp: int  # milliseconds since the epoch, as MLflow stores it
    step: int
