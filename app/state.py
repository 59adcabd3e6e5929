"""What the pages share at run time: the read engine and the cache, set once by create_app()."""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa


@dataclass
class DashboardState:
    store_uri: str = ""
    engine: sa.Engine | None = None
    error: str | None = None  # why the store cannot be read, shown as a page instead of a traceback
    extra: dict = field(default_factory=dict)


STATE = DashboardState()
