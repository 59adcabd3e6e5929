"""flask-caching for the read side: finished runs cached long, running runs for a poll interval.

`RADT_CACHE` (settings.CACHE) picks the backend: unset or `simple` (one process), `redis://host:6379/0`
for several gunicorn workers sharing one cache. RADT_RESPONSE_CACHE=0 and RADT_COMPRESS=0 turn off the
whole-response cache and the compression of app/responses.py (the load benchmark's baseline).
"""

from __future__ import annotations

from flask_caching import Cache

from radt import settings
from radt.settings import (  # noqa: F401 - the dashboard's cache lifetimes and switches, defined with every other default
    COMPRESS,
    FINISHED_TIMEOUT,
    LISTING_TIMEOUT,
    RESPONSE_CACHE,
    RESPONSE_TIMEOUT,
    RUNNING_TIMEOUT,
    ZOOM_TIMEOUT,
)

CACHE = Cache()


def cache_config(spec: str | None = None) -> dict:
    """flask-caching's configuration for `spec` (--cache), else RADT_CACHE; SettingError names what it cannot use."""
    spec = spec if spec is not None else settings.CACHE.get()
    if spec.startswith(("redis://", "rediss://")):
        return {"CACHE_TYPE": "RedisCache", "CACHE_REDIS_URL": spec, "CACHE_KEY_PREFIX": "radt:", "CACHE_DEFAULT_TIMEOUT": LISTING_TIMEOUT}
    if spec in ("", "simple"):
        return {"CACHE_TYPE": "SimpleCache", "CACHE_THRESHOLD": settings.CACHE_ENTRIES.get(), "CACHE_DEFAULT_TIMEOUT": LISTING_TIMEOUT}
    if spec == "null":
        return {"CACHE_TYPE": "NullCache"}
    raise settings.SettingError(f"--cache {spec!r} is not 'simple', 'null' or a redis:// URL; give one of them (RADT_CACHE sets the default)")
