"""The cache a server starts with: built from the settings or by the caller's factory, with the
snapshot, where there is one, restored into it.

A factory's cache carries what the settings cannot name (its own class, replication, admission,
policies), so the snapshot goes *into* that cache: replacing it with a cache rebuilt from the
file would drop all of that and leave the factory's cache running unserved (its replication's
threads still applying other replicas' entries). A cache built from the settings is built from
the file instead (``SemanticCache.load``), with every setting of the server's: the server's flags
win over what the file saved. A file that does not restore is set aside and the server starts
empty; it never refuses to start over a snapshot.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from gpucache.cache.semantic import SemanticCache
from gpucache.cache.snapshot import check_model, read_snapshot
from gpucache.serve.settings import ServeSettings

log = logging.getLogger("gpucache.serve")


def build_cache(config: ServeSettings, factory: Callable[[], SemanticCache] | None = None) -> SemanticCache:
    """The cache to serve: ``factory()``'s with the snapshot restored into it, or one made from
    the config's settings tree (embedder, device, ``CacheSettings``, guard, replication) and the
    snapshot."""
    path = config.snapshot if config.snapshot and os.path.exists(config.snapshot) else None
    if factory is not None:
        cache = factory()
        if not isinstance(cache, SemanticCache):
            raise TypeError(f"cache_factory must return a SemanticCache, got {type(cache).__name__}")
        if path is not None:
            try:
                snapshot = read_snapshot(path, config.snapshot_key)
                check_model(snapshot, cache.embedder.name, cache.embedder.dim, path)
                cache.restore(snapshot)
            except Exception as exc:  # noqa: BLE001 - see _set_aside
                _set_aside(path, exc)
        return cache
    embedder = config.embedder.build()
    verifier = config.guard.build(embedder.device)
    shared = config.replication.build(config.replication_key)
    if path is not None:
        try:
            return SemanticCache.load(
                path,
                embedder=embedder,
                device=embedder.device,
                key=config.snapshot_key,
                shared=shared,
                verifier=verifier,
                **dict(config.cache.items()),
            )
        except Exception as exc:  # noqa: BLE001 - see _set_aside
            _set_aside(path, exc)
    return SemanticCache(
        embedder, device=embedder.device, settings=config.cache, shared=shared, verifier=verifier
    )


def _set_aside(path: str, exc: Exception) -> None:
    """Any file that does not restore: keep serving, and keep the file for a person to look at
    (a checksum-valid file with a bad field fails past the snapshot's own checks, with whatever
    error that field raises)."""
    aside = f"{path}.corrupt"
    os.replace(path, aside)
    log.error(
        "gpucache: the snapshot did not restore (%s: %s); starting empty, the file is now %s",
        type(exc).__name__,
        exc,
        aside,
    )
