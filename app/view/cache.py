"""flask-caching for the read side: finished runs cached long, running runs for a poll interval.

`RADT_CACHE` (settings.CACHE) picks the backend: unset or `simple` (one process), `redis://host:6379/0`
for several gunicorn workers sharing one cache. A cache is a shortcut, never a dependency: Redis down or frozen
costs a view at most RADT_CACHE_TIMEOUT, then the views are drawn without it (SparedRedisCache). RADT_RESPONSE_CACHE=0 and RADT_COMPRESS=0 turn off the
whole-response cache and the compression of app/web/responses.py (the load benchmark's baseline).
"""

from __future__ import annotations

import logging
import time

from flask_caching import Cache
from flask_caching.backends.rediscache import RedisCache
from flask_caching.backends.simplecache import SimpleCache

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
LOG = logging.getLogger(__name__)


class RoomySimpleCache(SimpleCache):
    """flask-caching's one-process cache, which makes room a tenth of its entries at a time: cachelib's sorts every entry to
    drop one on each set once full, and 5,000 runs' summaries (a filter over a big experiment) took 1.5 s of sorting."""

    def _prune(self) -> None:
        if not self._over_threshold():
            return
        now = time.time()
        self._cache = {k: v for k, v in self._cache.items() if not 0 < v[0] < now}  # expired (0: never expires)
        if self._over_threshold():
            keep = self._threshold - max(1, self._threshold // 10)
            newest = sorted(self._cache.items(), key=lambda item: item[1][0])[-keep:] if keep > 0 else []
            self._cache = dict(newest)


class SparedRedisCache(RedisCache):
    """flask-caching's Redis cache that Redis down or frozen cannot fail a view with (it was an HTTP 500 on every
    view): each call waits RADT_CACHE_TIMEOUT at most, an error is a miss, and after one Redis is left alone for
    CACHE_RETRY_S, with one line in the log when it goes and one when it is back."""

    _off_until = 0.0  # monotonic time before which calls skip Redis
    _down = False

    def get(self, key):
        return self._spared(super().get, None, key)

    def set(self, key, value, timeout=None):
        return self._spared(super().set, False, key, value, timeout)

    def get_many(self, *keys):
        return self._spared(super().get_many, [None] * len(keys), *keys)

    def set_many(self, mapping, timeout=None):
        return self._spared(super().set_many, [], mapping, timeout)

    def add(self, key, value, timeout=None):
        return self._spared(super().add, False, key, value, timeout)

    def delete(self, key):
        return self._spared(super().delete, False, key)

    def delete_many(self, *keys):
        return self._spared(super().delete_many, [], *keys)

    def has(self, key):
        return self._spared(super().has, False, key)

    def _spared(self, call, missed, *args):
        from redis.exceptions import RedisError

        if time.monotonic() < self._off_until:
            return missed
        try:
            answer = call(*args)
        except RedisError as exc:
            self._off_until = time.monotonic() + settings.CACHE_RETRY_S
            if not self._down:
                self._down = True
                text = str(exc).strip()
                reason = text.splitlines()[0][:200] if text else type(exc).__name__
                LOG.warning(
                    "the Redis cache does not answer (%s): views are drawn without it, and it is tried again every %g s", reason, settings.CACHE_RETRY_S
                )
            return missed
        if self._down:
            self._down = False
            LOG.warning("the Redis cache answers again: views use it")
        return answer


def cache_config(spec: str | None = None) -> dict:
    """flask-caching's configuration for `spec` (--cache), else RADT_CACHE; SettingError names what it cannot use."""
    spec = spec if spec is not None else settings.CACHE.get()
    if spec.startswith(("redis://", "rediss://")):
        wait = settings.CACHE_TIMEOUT.get()
        return {
            "CACHE_TYPE": f"{__name__}.SparedRedisCache",
            "CACHE_REDIS_URL": spec,
            "CACHE_OPTIONS": {"socket_timeout": wait, "socket_connect_timeout": wait},
            "CACHE_KEY_PREFIX": "radt:",
            "CACHE_DEFAULT_TIMEOUT": LISTING_TIMEOUT,
        }
    if spec in ("", "simple"):
        return {"CACHE_TYPE": f"{__name__}.RoomySimpleCache", "CACHE_THRESHOLD": settings.CACHE_ENTRIES.get(), "CACHE_DEFAULT_TIMEOUT": LISTING_TIMEOUT}
    if spec == "null":
        return {"CACHE_TYPE": "NullCache"}
    raise settings.SettingError(f"--cache {spec!r} is not 'simple', 'null' or a redis:// URL; give one of them (RADT_CACHE sets the default)")
