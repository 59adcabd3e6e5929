"""flask-caching for the read side: finished runs cached long, running runs for a poll interval.

`RADT_CACHE` (settings.CACHE) picks the backend: unset or `simple` (one process), `redis://host:6379/0`
for several gunicorn workers sharing one cache. RADT_RESPONSE_CACHE=0 and RADT_COMPRESS=0 turn off the
whole-response cache and the compression of app/responses.py (the load benchmark's baseline).
"""

from __future__ import annotations

from flask_caching import Cache

from radt import settings
from radt.settings import Setting

CACHE = Cache()
FINISHED_TIMEOUT = 3600  # a finished run's series never change
RUNNING_TIMEOUT = 2  # a running run's series grow every sample
LISTING_TIMEOUT = 5  # experiments and runs lists
ZOOM_TIMEOUT = 60  # a zoomed window of a run: redraws of the same zoom hit; each new zoom is another entry, gone after a minute
RESPONSE_TIMEOUT = 600  # a whole draw response of ended runs (app/responses.py); checked against the store on every hit

RESPONSE_CACHE = Setting(
    "RADT_RESPONSE_CACHE", int, 1, "1: keep the explore chart's whole response for views of ended runs (app/responses.py); 0: draw every time", high=1
)
COMPRESS = Setting("RADT_COMPRESS", int, 1, "1: gzip the dashboard's responses for browsers that accept it; 0: send them as they are", high=1)


def cache_config(spec: str | None = None) -> dict:
    """flask-caching's configuration for `spec` (--cache), else RADT_CACHE; ValueError names what it cannot use."""
    spec = spec if spec is not None else settings.CACHE.get()
    if spec.startswith(("redis://", "rediss://")):
        return {"CACHE_TYPE": "RedisCache", "CACHE_REDIS_URL": spec, "CACHE_KEY_PREFIX": "radt:", "CACHE_DEFAULT_TIMEOUT": LISTING_TIMEOUT}
    if spec in ("", "simple"):
        return {"CACHE_TYPE": "SimpleCache", "CACHE_THRESHOLD": 2000, "CACHE_DEFAULT_TIMEOUT": LISTING_TIMEOUT}
    if spec == "null":
        return {"CACHE_TYPE": "NullCache"}
    raise ValueError(f"RADT_CACHE={spec!r} is not 'simple', 'null' or a redis:// URL")
