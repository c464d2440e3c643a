"""``ReplicaSide``: a cache as one replica among others, split from the core by that seam.

Two faces, one state (the core's lock, entry table, removal fence and single-flight, and the
replication attached to it):

- what a replication does to this cache (replication.py's ``Replica``: ``apply_replicated``,
  ``apply_replicated_removal``, ``apply_replicated_clear``), the only way in from outside the
  package;
- what a get-or-load flow asks across replicas (drivers.py): ``claim_shared`` before its load,
  ``adopt_shared`` for what another replica loaded meanwhile, ``release_shared`` after; and
  ``fetched``, an exact repeat read from the shared store where this replica holds none.

Why apart from the core: none of it is needed by a cache that is not replicated, and all of it
is the same few steps under the core's lock; the core keeps its own operations (lookups, stores,
upkeep) and hands this object to the replication it attaches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from gpucache.cache.claims import Claims
from gpucache.cache.entries import EntryTable
from gpucache.cache.flight import SingleFlight
from gpucache.cache.replication import ClearedPrefixes, RemovalFence, Replication, SharedEntry
from gpucache.embedding.model import Embedder
from gpucache.keys import prompt_key


class ReplicaCore(Protocol):
    """The state a replica's steps run on (``CacheCore`` in core.py is the one). A protocol, so
    that this module needs nothing from the core's: the core builds this side, not the reverse."""

    lock: Any
    table: EntryTable
    fence: RemovalFence
    cleared_prefixes: ClearedPrefixes
    flights: SingleFlight[bytes, str]
    embedder: Embedder

    def now(self) -> float: ...


class ReplicaSide:
    """The replica face of ``core`` (see the module's docstring); every step under its lock."""

    def __init__(self, core: ReplicaCore, shared: Callable[[], Replication]) -> None:
        """``shared``: the replication attached now (it is attached after construction, or
        after a restore)."""
        self.core = core
        self._shared = shared

    @property
    def embedder(self) -> Embedder:
        return self.core.embedder

    # ------------------------------------------------------------------ what others did

    def apply_replicated(self, entries: Sequence[SharedEntry]) -> None:
        """Other replicas' entries, into this replica's index (no policy, admission or
        publishing: they passed them where they were stored)."""
        groups: dict[tuple[str, float], list[SharedEntry]] = {}
        for entry in entries:  # one write per scope and expiry: a bootstrap is one batch
            groups.setdefault((entry.scope, entry.expires_at), []).append(entry)
        core = self.core
        with core.lock:
            now = core.now()
            for (scope, expires_at), group in groups.items():
                if expires_at > now:
                    core.table.store(
                        scope,
                        [(e.prompt, e.response) for e in group],
                        torch.stack([e.vector for e in group]),
                        expires_at,
                        now,
                    )

    def apply_replicated_removal(self, scope: str, prompt: str) -> None:
        core = self.core
        with core.lock:
            core.fence.removed(scope, prompt)
            core.table.remove(scope, prompt)

    def apply_replicated_clear(self, scope: str | None, under: bool = False) -> None:
        core = self.core
        with core.lock:
            core.fence.cleared(scope, under)
            if under and scope is not None:
                core.cleared_prefixes.cleared(scope)
                core.table.drop(core.table.under(scope))
            else:
                core.table.clear(scope)

    # ------------------------------------------------------------------ what a flow asks

    def fetched(self, pairs: list[tuple[str, str]]) -> list[SharedEntry]:
        """Exact repeats read from the shared store (one round trip, outside the lock) and
        kept here; an entry that a removal applied meanwhile covers is dropped (the fence)."""
        shared, core = self._shared(), self.core
        if not shared.remote:
            return []  # nothing elsewhere: no round trip, and no second wait for the lock
        with core.lock:
            since = core.fence.mark()
        found = shared.fetch(pairs)
        if not found:
            return []
        with core.lock:
            found = [e for e in found if not core.fence.stale(e.scope, e.prompt, since)]
            self.apply_replicated(found)
        return found

    def claim_shared(self, claims: Claims) -> list[str]:
        """Between this call's local claims and its load: the claims across replicas (one
        round trip). Returns the misses another replica is loading, for the flow to wait on
        (``WaitShared``: on the event loop on async paths, never in a worker thread); the rest
        this call loads, holding their shared claims until it stores or gives up."""
        if not claims.mine:
            return []
        claims.shared, others = self._shared().claim(claims.scope, claims.to_load)
        return others

    def adopt_shared(self, claims: Claims, found: list[SharedEntry]) -> dict[str, str]:
        """The entries another replica loaded for this call's misses: applied here, handed to
        this replica's waiters, and returned (prompt -> answer); the rest, this call loads."""
        if not found:
            return {}  # the other replica gave up or took too long: this call loads them
        self.apply_replicated(found)
        answers = {e.prompt: e.response for e in found}
        done = {prompt_key(claims.scope, p): r for p, r in answers.items()}
        with self.core.lock:
            self.core.flights.resolve(done)  # this replica's waiters get the other replica's answer
        claims.mine = [k for k in claims.mine if k not in done]
        return answers

    def release_shared(self, claims: Claims) -> None:
        """This call's claims across replicas given up (after its store, or its abort)."""
        shared, claims.shared = claims.shared, {}
        if shared:
            self._shared().release(claims.scope, shared)
