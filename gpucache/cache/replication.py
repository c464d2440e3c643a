"""The seam between a cache and its other replicas: what the cache asks of a replication, what a
replication may do to the cache, and the default, a cache with no other replica.

The cache owns this seam. A replication (``gpucache.share.redis.RedisShare``) implements
``Replication``; the cache calls it at each point where other replicas matter (a store, a
removal, a clear, the claims around a load, an exact repeat another replica may have stored)
and never asks whether there is one: ``LocalOnly``, the default, answers each call with
"nothing elsewhere". A replication applies other replicas' entries through ``Replica``, three
public methods of the cache, never its internals. Nothing in ``gpucache.cache`` imports a
replication, so the packages depend one way only.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from gpucache.embedding.model import Embedder


@dataclass(frozen=True)
class SharedEntry:
    """An entry another replica stored."""

    scope: str
    prompt: str
    response: str
    expires_at: float
    vector: torch.Tensor  # (D,) float32
    written_at: float = math.nan  # wall-clock time it was written to the shared store


class Replica(Protocol):
    """What a replication may do to the cache it serves."""

    @property
    def embedder(self) -> Embedder: ...

    def apply_replicated(self, entries: Sequence[SharedEntry]) -> None:
        """Other replicas' entries, into this replica's index (no policy, admission or
        publishing: they passed them where they were stored)."""

    def apply_replicated_removal(self, scope: str, prompt: str) -> None: ...

    def apply_replicated_clear(self, scope: str | None, under: bool = False) -> None: ...


class Replication(Protocol):
    """What a cache asks of its replication."""

    remote: bool
    """Whether other replicas may exist: where not, the flow skips the claims across
    replicas, which on async paths would each cost a worker thread's round trip."""

    def attach(self, replica: Replica) -> None:
        """Join as ``replica``: start applying other replicas' entries to it."""

    def stored(
        self, scope: str, items: list[tuple[str, str]], vectors: torch.Tensor, expires_at: float
    ) -> None: ...

    def removed(self, scope: str, prompt: str) -> None: ...

    def cleared(self, scope: str | None, under: bool = False) -> None:
        """A clear of ``scope`` (with ``under``, of every scope below it too: ``scope/...``;
        of everything, with None)."""

    def fetch(self, pairs: list[tuple[str, str]]) -> list[SharedEntry]:
        """Entries stored elsewhere under exactly these (scope, prompt) pairs, now."""

    def claim(self, scope: str, prompts: list[str]) -> tuple[dict[str, str], list[str]]:
        """Claims on misses across replicas: the ones this replica got (prompt -> token), and
        the prompts another replica is loading."""

    def wait_loaded(self, scope: str, prompts: list[str]) -> list[SharedEntry]:
        """Block until another replica's loads of ``prompts`` end; what arrived."""

    async def await_loaded(self, scope: str, prompts: list[str]) -> list[SharedEntry]:
        """``wait_loaded`` for the event loop, holding no worker thread while it waits."""

    def release(self, scope: str, claims: dict[str, str]) -> None: ...

    def close(self) -> None: ...


class LocalOnly:
    """The replication of a cache with no other replica: nothing is elsewhere."""

    remote = False

    def attach(self, replica: Replica) -> None:
        pass

    def stored(
        self, scope: str, items: list[tuple[str, str]], vectors: torch.Tensor, expires_at: float
    ) -> None:
        pass

    def removed(self, scope: str, prompt: str) -> None:
        pass

    def cleared(self, scope: str | None, under: bool = False) -> None:
        pass

    def fetch(self, pairs: list[tuple[str, str]]) -> list[SharedEntry]:
        return []

    def claim(self, scope: str, prompts: list[str]) -> tuple[dict[str, str], list[str]]:
        return {}, []

    def wait_loaded(self, scope: str, prompts: list[str]) -> list[SharedEntry]:
        return []

    async def await_loaded(self, scope: str, prompts: list[str]) -> list[SharedEntry]:
        return []

    def release(self, scope: str, claims: dict[str, str]) -> None:
        pass

    def close(self) -> None:
        pass


def covers(
    gone_scope: str | None, gone_prompt: str | None, scope: str, prompt: str, under: bool = False
) -> bool:
    """Whether a removal covers the entry (scope, prompt): a delete names both, a clear of a
    scope has no prompt (and with ``under`` covers the scopes below it), a clear of everything
    neither."""
    if gone_scope is None:
        return True
    if under:
        return within(scope, gone_scope)
    return gone_scope == scope and gone_prompt in (None, prompt)


def within(scope: str, prefix: str) -> bool:
    """Whether ``scope`` is ``prefix`` or lies under it (``prefix/...``): a tenant's scopes
    start with the tenant, as a server's do."""
    return scope == prefix or scope.startswith(prefix + "/")


class ClearedPrefixes:
    """The prefixes cleared with every scope under them (``clear_under``: a revoked
    credential's), here or on another replica, each with the number of its latest clear.

    A server keeps each credential's verdict a while; a revoke applied on another replica must
    end it here too, so the server reads ``since`` before it trusts a kept verdict. Written
    under the cache's lock, read from the event loop without it: one read of a plain dict. The
    last ``KEPT`` prefixes are kept; past that, a prefix may have been cleared at any number up
    to the oldest one forgotten (``floor``), so a verdict older than that is asked again."""

    KEPT = 65536

    def __init__(self) -> None:
        self.number = 0  # clears so far
        self.floor = 0
        self._last: dict[str, int] = {}

    def cleared(self, prefix: str) -> None:
        self.number += 1
        self._last.pop(prefix, None)  # re-inserted last: the oldest are forgotten first
        self._last[prefix] = self.number
        while len(self._last) > self.KEPT:
            self.floor = self._last.pop(next(iter(self._last)))

    def since(self, prefix: str) -> int:
        """The number of the latest clear of ``prefix`` (0: none, or none since the floor)."""
        return max(self._last.get(prefix, 0), self.floor)


class RemovalFence:
    """The removals this cache has applied, numbered, so that an entry read from the shared
    store before a removal and applied after it stays out.

    A fetch (an exact repeat read from Redis) takes a round trip outside the cache's lock; a
    delete or a clear may be applied meanwhile, here or from another replica's event. The
    fetch marks the fence before it reads (``mark``) and, under the lock again, drops every
    entry a removal since then covers (``stale``): an admin clear that returned is never undone
    by a read that was in flight. Only the last ``KEPT`` removals are kept; a fetch older than
    all of them keeps nothing. Callers hold the cache's lock."""

    KEPT = 1024

    def __init__(self) -> None:
        self.number = 0  # removals so far
        self._recent: deque[tuple[int, str | None, str | None, bool]] = deque(maxlen=self.KEPT)

    def removed(self, scope: str, prompt: str) -> None:
        self.number += 1
        self._recent.append((self.number, scope, prompt, False))

    def cleared(self, scope: str | None, under: bool = False) -> None:
        """A clear of ``scope`` (and of the scopes under it, with ``under``; of every scope,
        with None)."""
        self.number += 1
        self._recent.append((self.number, scope, None, under))

    def mark(self) -> int:
        return self.number

    def stale(self, scope: str, prompt: str, since: int) -> bool:
        """Whether a removal after ``since`` covers the entry (scope, prompt)."""
        if self.number - since > len(self._recent):
            return True  # removals since then no longer kept: any may cover it
        for number, gone_scope, gone_prompt, under in reversed(self._recent):
            if number <= since:
                return False
            if covers(gone_scope, gone_prompt, scope, prompt, under):
                return True
        return False
