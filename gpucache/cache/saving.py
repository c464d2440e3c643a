"""What a snapshot takes of a cache, and how a snapshot goes back into one.

``capture`` reads the live entries, their vectors, the settings, the counters and the admission
sketch under the cache's lock and does no I/O (``SemanticCache.save`` writes the file after).
``restore`` is all or nothing: everything that can be wrong with a snapshot is read and checked
first (the counters; the file's own checks are ``read_snapshot``'s), then the entries go in
under the lock, and if inserting them fails part way, those already in are taken out again, so
a cache whose restore failed holds what it held before. An entry the cache already holds (the
same scope and prompt, stored since: another replica's, say) is newer than the file's and is
kept. Replication is attached after a restore has succeeded (``SemanticCache.load``), so a
failed one starts no thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from gpucache.cache.entries import Entry
from gpucache.cache.snapshot import Snapshot, SnapshotEntry, SnapshotError
from gpucache.cache.stats import StatsCounter

if TYPE_CHECKING:
    from gpucache.cache.core import CacheCore


def capture(core: CacheCore) -> Snapshot:
    """What ``SemanticCache.save`` writes: the live entries (least recently used first), their
    vectors on the CPU, the settings, the counters and the admission sketch."""
    with core.lock:
        core.settle()  # the repeats served without the lock: their recency and counts
        core.table.purge_expired(core.now())
        entries = list(core.table)  # least recently used first
        rows = [e.row for e in entries]
        vectors = (
            core.store.vectors(rows).cpu()
            if rows
            else torch.empty((0, core.embedder.dim), dtype=torch.float32)
        )
        return Snapshot(
            model=core.embedder.name,
            dim=core.embedder.dim,
            settings=core.settings.to_json(),
            entries=[SnapshotEntry(e.scope, e.prompt, e.response, core.table.expires_at(e)) for e in entries],
            vectors=vectors,
            stats=core.counters.to_json(),
            admission=core.admission.state() if core.admission is not None else None,
        )


def counters_of(snapshot: Snapshot) -> StatsCounter:
    """The snapshot's counters, or ``SnapshotError`` saying why they do not read."""
    try:
        return StatsCounter.from_json(snapshot.stats)
    except (TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise SnapshotError(f"the snapshot's counters do not read ({type(exc).__name__}: {exc})") from exc


def restore(core: CacheCore, snapshot: Snapshot) -> None:
    """The snapshot's live entries into ``core``, its counters in place of the cache's; all or
    nothing (see the module's docstring)."""
    counters = counters_of(snapshot)
    with core.lock:
        now = core.now()
        live = [i for i, e in enumerate(snapshot.entries) if e.expires_at > now]
        live = live[-core.table.limit :]
        expired = len(snapshot.entries) - len(live)
        held = core.table.may_hold
        live = [i for i in live if not held(snapshot.entries[i].scope, snapshot.entries[i].prompt)]
        by_scope: dict[str, list[int]] = {}
        for i in live:
            by_scope.setdefault(snapshot.entries[i].scope, []).append(i)
        restored: dict[int, Entry] = {}
        try:
            for scope, items in by_scope.items():
                saved = [snapshot.entries[i] for i in items]
                entries = core.table.restore(
                    scope,
                    [(e.prompt, e.response) for e in saved],
                    snapshot.vectors[items],
                    [e.expires_at for e in saved],
                )
                restored.update(zip(items, entries))
        except BaseException:
            core.table.drop(list(restored.values()))
            raise
        core.table.restored([restored[i] for i in live])  # least recently used stays first
        counters.expirations += expired
        core.counters = counters
        core.table.stats = counters
