"""``Upkeep``: the core's entries removed and counted, split from the core by that seam.

Removals here and on every replica (``invalidate``, ``clear``, ``clear_under``: each the
removal fence, the replicated event and the table's change as one step under the core's lock,
so a read from the shared store in flight is not kept after it), expired entries purged, and
what the cache holds counted (``live_entries``, ``stats``). Why apart from the core: none of it
is on a lookup's or a store's path, and each is the same few steps under the core's lock; the
facade (semantic.py) calls it as ``core.upkeep``.
"""

from __future__ import annotations

from typing import Any, Protocol

from gpucache.cache.entries import EntryTable
from gpucache.cache.replication import ClearedPrefixes, RemovalFence, Replication
from gpucache.cache.stats import CacheStats, StatsCounter
from gpucache.index.store import ExactScanStore


class UpkeepCore(Protocol):
    """The state the removals and counts run on (``CacheCore`` in core.py is the one). A
    protocol, so that this module needs nothing from the core's: the core builds it, not the
    reverse."""

    lock: Any
    table: EntryTable
    fence: RemovalFence
    cleared_prefixes: ClearedPrefixes
    shared: Replication
    counters: StatsCounter
    store: ExactScanStore

    def now(self) -> float: ...

    def settle(self) -> None: ...


class Upkeep:
    """The removals and counts of ``core`` (see the module's docstring)."""

    def __init__(self, core: UpkeepCore) -> None:
        self.core = core

    def invalidate(self, scope: str, prompt: str) -> bool:
        """Remove the entry stored under exactly ``prompt`` in ``scope``, here and on every
        replica; True if there was one here."""
        core = self.core
        with core.lock:  # the fence, the queued event and the removal as one step (fetched)
            core.fence.removed(scope, prompt)
            core.shared.removed(scope, prompt)  # and on every replica, wherever it was stored
            return core.table.remove(scope, prompt)

    def may_hold(self, scope: str, prompt: str) -> bool:
        """Whether an entry may be stored under exactly ``prompt``, without the lock
        (``SemanticCache.may_hold``)."""
        return self.core.table.may_hold(scope, prompt)

    def clear(self, scope: str | None) -> None:
        core = self.core
        with core.lock:
            core.fence.cleared(scope)
            core.shared.cleared(scope)
            core.table.clear(scope)

    def clear_under(self, prefix: str) -> int:
        """Remove every entry whose scope is ``prefix`` or under it, here and on every replica
        (one clear of the prefix: another replica may hold scopes under it this one never saw,
        and Redis their records); how many were removed here."""
        core = self.core
        with core.lock:
            found = core.table.under(prefix)
            core.fence.cleared(prefix, under=True)
            core.cleared_prefixes.cleared(prefix)
            core.shared.cleared(prefix, under=True)
            core.table.drop(found)
        return len(found)

    def purge_expired(self) -> int:
        core = self.core
        with core.lock:
            return core.table.purge_expired(core.now())

    def live_entries(self) -> int:
        """How many entries are stored and unexpired (expired ones are dropped first)."""
        core = self.core
        with core.lock:
            core.table.purge_expired(core.now())
            return len(core.table)

    def stats(self) -> CacheStats:
        core = self.core
        with core.lock:
            core.settle()  # the repeats served without the lock, counted first
            core.table.purge_expired(core.now())
            return core.counters.snapshot(
                entries=len(core.table),
                scan_retries=core.store.scan_retries,
                cpu_fallbacks=core.store.cpu_fallbacks,
            )
