"""The cache's entries and the index rows behind them.

An entry is a stored answer: its scope, its prompt, its response and the index row holding its
vector. Entries are kept in least-recently-used order (an ``OrderedDict``, oldest first), keyed
by ``prompt_key(scope, prompt)`` for the exact tier, and by row for the semantic tier.

Expiry has one owner, the index: each row carries its expiry time, which the scan masks on and
which the exact tier reads back through ``index.expires_at(row)``. An entry keeps no copy.

Capacity counts both entries (``limit``) and the memory their texts hold (``text_limit``: the
prompts' and responses' string sizes): one 8 MB prompt costs what thousands of questions do, so
a count alone lets a few large prompts take gigabytes. Past either bound the least recently
used go; an entry larger than the whole text budget is not stored (``refusals["too-large"]``).
With ``tenant_limit``, one tenant (a scope's part before its first "/": the server's scopes
begin with the tenant) keeps at most that many entries, its own least recently used going
first, so one key's junk evicts its own entries and no one else's. With ``fair``, where room
is needed, a tenant holding more than its share (the bound, entries or text bytes, divided among
the tenants holding entries) makes it from its own least recently used, and only one within its
share from everyone's: one tenant alone has the whole cache, and a tenant flooding it takes no
more than its share from the others. A scope's id is dropped with its last entry, so the table
of scopes holds only scopes with entries.

Every method is called with the cache's lock held; nothing here computes an embedding.

The table holds each entry as a plain tuple of strings and numbers (``_Stored``) and hands out
``Entry`` values made from it. Why: the garbage collector untracks a tuple that holds only such
values, so a full collection, which holds the GIL and so every request, does not walk the
entries; an object of a class is tracked for as long as it lives. With the start-up heap frozen
(serve/heap.py), a full collection took 288 ms over a million entries held as objects, and 62 ms
held as tuples, what is left being the two dicts' own walk (``python3 bench/gc_entries.py
--entries 1000000``, a 2-core Xeon, CPython 3.11).
"""

from __future__ import annotations

import math
import sys
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from gpucache.cache.stats import StatsCounter
from gpucache.index.interface import VectorIndex
from gpucache.keys import prompt_key


@dataclass(frozen=True, slots=True)
class Entry:
    """A stored answer as the table holds it now (a value: a later store makes another)."""

    key: bytes
    scope: str
    prompt: str
    response: str
    row: int
    # when this response was stored, on the cache's clock; -inf where unknown (restored from a
    # snapshot or another replica), which reads as too old for any freshness limit
    stored_at: float = -math.inf
    size: int = 0  # the memory its prompt and response hold (``text_size``), counted by the table


# An entry as the table keeps it: (key, scope, prompt, response, row, stored_at, size), a plain
# tuple (module doc); ``Entry(*stored)`` is the value handed out
_Stored = tuple[bytes, str, str, str, int, float, int]


def _stored(entry: Entry) -> _Stored:
    return (entry.key, entry.scope, entry.prompt, entry.response, entry.row, entry.stored_at, entry.size)


def tenant_of(scope: str) -> str:
    """A scope's tenant: its part before the first "/" (the whole scope where there is none)."""
    return scope.split("/", 1)[0]


def text_size(prompt: str, response: str) -> int:
    """The memory two texts hold as Python strings (O(1): the objects know their size)."""
    return sys.getsizeof(prompt) + sys.getsizeof(response)


class EntryTable:
    """Entries in LRU order over a ``VectorIndex``; at most ``limit`` of them, their texts at
    most ``text_limit`` bytes (None: no bound)."""

    def __init__(
        self,
        index: VectorIndex,
        limit: int,
        stats: StatsCounter,
        text_limit: int | None = None,
        tenant_limit: int | None = None,
        *,
        fair: bool,
    ) -> None:
        self.index = index
        self.limit = limit
        self.text_limit = text_limit
        self.tenant_limit = tenant_limit
        self.fair = fair
        self._tracking = tenant_limit is not None or fair  # each tenant's entries are kept apart
        self._tenant_bytes: dict[str, int] = {}  # each tenant's text bytes, where tracking
        self.text_bytes = 0  # the sum of the entries' sizes
        self.stats = stats
        self._entries: OrderedDict[bytes, _Stored] = OrderedDict()  # least recently used first
        self._by_row: dict[int, _Stored] = {}
        self._scope_ids: dict[str, int] = {}  # scopes with entries, and their ids in the index
        self._scope_sizes: dict[str, int] = {}
        self._next_scope = 0  # ids are never reused: a stale id finds no rows
        # each tenant's entries in LRU order, where ``tenant_limit`` or ``fair`` is set
        self._tenants: dict[str, OrderedDict[bytes, None]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        """Least recently used first."""
        return iter([Entry(*stored) for stored in self._entries.values()])

    @property
    def scopes(self) -> int:
        """How many scopes hold entries (a scope is forgotten with its last entry)."""
        return len(self._scope_ids)

    def scope_id(self, scope: str) -> int | None:
        """The index's id for ``scope``; None when it holds no entry."""
        return self._scope_ids.get(scope)

    def at_row(self, row: int) -> Entry:
        stored = self._by_row.get(row)
        if stored is None:
            raise RuntimeError(f"gpucache bug: index row {row} has no entry")
        return Entry(*stored)

    def expires_at(self, entry: Entry) -> float:
        return self.index.expires_at(entry.row)

    def current(self, entry: Entry, now: float) -> Entry | None:
        """What is stored now for ``entry`` (its answer perhaps replaced since), where its
        prompt still holds its row and has not expired by ``now``; else None."""
        stored = self._by_row.get(entry.row)
        if stored is None or stored[0] != entry.key or self.expires_at(entry) <= now:
            return None
        return Entry(*stored)

    def touch(self, entry: Entry) -> None:
        self._entries.move_to_end(entry.key)
        if self._tracking:
            self._tenants[tenant_of(entry.scope)].move_to_end(entry.key)

    def _scope_id(self, scope: str) -> int:
        found = self._scope_ids.get(scope)
        if found is None:
            found = self._scope_ids[scope] = self._next_scope
            self._next_scope += 1
        return found

    def may_hold(self, scope: str, prompt: str) -> bool:
        """Whether an entry is filed under exactly (scope, prompt), perhaps expired: one dict
        membership test, safe without the lock (atomic in CPython), for admission decisions
        that must not wait on a scan. The lookup itself decides what is served."""
        return prompt_key(scope, prompt) in self._entries

    def peek(self, scope: str, prompt: str, now: float) -> Entry | None:
        """The live entry stored under exactly (scope, prompt), read without the lock: for the
        event loop's repeat while a store or scan holds it. Nothing changes here (no recency, no
        expired entry dropped: the caller has the entry touched later, under the lock). Each
        read is one atomic step in CPython; the entry's expiry is read from its row, and the
        mapping is read again after it: where the entry was dropped, replaced or its row
        reused meanwhile, the key no longer maps to the same record, and nothing is served."""
        key = prompt_key(scope, prompt)
        stored = self._entries.get(key)
        if stored is None:
            return None
        entry = Entry(*stored)
        alive = self.index.expires_at(entry.row) > now
        if not alive or self._entries.get(key) is not stored:
            return None
        return entry

    def touch_key(self, scope: str, prompt: str) -> None:
        """Mark the entry under (scope, prompt), where still stored, as recently used."""
        stored = self._entries.get(prompt_key(scope, prompt))
        if stored is not None:
            self.touch(Entry(*stored))

    def exact(self, scope: str, prompt: str, now: float) -> Entry | None:
        """The live entry stored under exactly (scope, prompt), marked as recently used; an
        expired one is dropped on the way."""
        stored = self._entries.get(prompt_key(scope, prompt))
        if stored is None:
            return None
        entry = Entry(*stored)
        if self.index.expires_at(entry.row) <= now:
            self.drop([entry])
            self.stats.expirations += 1
            return None
        self.touch(entry)
        return entry

    def store(
        self, scope: str, items: list[tuple[str, str]], vectors: torch.Tensor, expires_at: float, now: float
    ) -> int:
        """Write (prompt, response) pairs with their (M, D) vectors; an existing entry for the
        same prompt takes the new response and expiry. Evicts to stay within ``limit``.
        Returns M."""
        fresh: list[int] = []
        updated = 0
        for i, (prompt, response) in enumerate(items):
            stored = self._entries.get(prompt_key(scope, prompt))
            if stored is None:
                fresh.append(i)
                continue
            entry = Entry(*stored)
            size = text_size(prompt, response)
            if self.text_limit is not None and size > self.text_limit:
                self.drop([entry])  # the old answer must not stand in for the new one
                self.stats.refusals["too-large"] += 1
                continue
            updated += 1
            self.text_bytes += size - entry.size
            if self._tracking:
                self._tenant_bytes[tenant_of(scope)] += size - entry.size
            replaced = _stored(Entry(entry.key, scope, entry.prompt, response, entry.row, now, size))
            self._entries[entry.key] = self._by_row[entry.row] = replaced  # in place: its recency kept
            self.index.set_expiry([entry.row], [expires_at])
            self.touch(entry)
        if self.text_limit is not None:
            fits = [i for i in fresh if text_size(*items[i]) <= self.text_limit]
            if len(fits) < len(fresh):
                self.stats.refusals["too-large"] += len(fresh) - len(fits)
            fresh = fits
        fresh = fresh[-self.limit :]  # more than fit: the earliest would be evicted at once
        if fresh and self.tenant_limit is not None:
            fresh = fresh[-self.tenant_limit :]
            own: OrderedDict[bytes, None] = self._tenants.get(tenant_of(scope), OrderedDict())
            excess = len(own) + len(fresh) - self.tenant_limit
            if excess > 0:
                victims = [Entry(*self._entries[key]) for _, key in zip(range(excess), own)]
                self.drop(victims)
                self.stats.evictions += len(victims)
        if fresh:
            self._make_room(len(fresh), now, tenant_of(scope))
            scope_id = self._scope_id(scope)
            index = torch.tensor(fresh, dtype=torch.int64, device=vectors.device)
            rows = self.index.add(vectors[index], scope_id, [expires_at] * len(fresh))
            for i, row in zip(fresh, rows):
                prompt, response = items[i]
                self._insert(Entry(prompt_key(scope, prompt), scope, prompt, response, row, now))
        self._trim_text(tenant_of(scope))
        self.stats.stores += updated + len(fresh)
        return updated + len(fresh)

    def _trim_text(self, tenant: str | None = None) -> None:
        """Evict the least recently used until the texts fit ``text_limit``: ``tenant``'s own
        first while it holds more than its share of it (``fair``), then anyone's."""
        if self.text_limit is None or self.text_bytes <= self.text_limit:
            return
        victims, freed = [], 0
        own = self._tenants.get(tenant) if self.fair and tenant is not None else None
        if own and tenant is not None:
            share, held = self.text_limit // len(self._tenants), self._tenant_bytes[tenant]  # it holds some
            for key in own:
                if self.text_bytes - freed <= self.text_limit or held - freed <= share:
                    break
                victims.append(Entry(*self._entries[key]))
                freed += victims[-1].size
        chosen = {v.key for v in victims}
        for stored in self._entries.values():
            if self.text_bytes - freed <= self.text_limit:
                break
            if stored[0] not in chosen:
                victims.append(Entry(*stored))
                freed += victims[-1].size
        self.drop(victims)
        self.stats.evictions += len(victims)

    def restore(
        self, scope: str, items: Sequence[tuple[str, str]], vectors: torch.Tensor, expires_at: Sequence[float]
    ) -> list[Entry]:
        """Entries read back from a snapshot, in the order given (least recently used first)."""
        scope_id = self._scope_id(scope)
        rows = self.index.add(vectors, scope_id, expires_at)
        return [
            self._insert(Entry(prompt_key(scope, p), scope, p, r, row)) for (p, r), row in zip(items, rows)
        ]

    def restored(self, entries: Sequence[Entry]) -> None:
        """The end of a restore: ``entries`` (those ``restore`` gave) put in this recency order,
        least recently used first, then the least recently used evicted past the text budget
        and each tenant's share, as a store would have."""
        for entry in entries:
            self.touch(entry)
        self._trim_text()
        self._trim_tenants()

    def _trim_tenants(self) -> None:
        """Evict each tenant's least recently used past ``tenant_limit`` (after a restore)."""
        if self.tenant_limit is None:
            return
        for own in list(self._tenants.values()):
            excess = len(own) - self.tenant_limit
            if excess > 0:
                victims = [Entry(*self._entries[key]) for _, key in zip(range(excess), own)]
                self.drop(victims)
                self.stats.evictions += len(victims)

    def purge_expired(self, now: float) -> int:
        rows = self.index.expired_rows(now)
        if rows:
            self.drop([Entry(*self._by_row[r]) for r in rows])
            self.stats.expirations += len(rows)
        return len(rows)

    def remove(self, scope: str, prompt: str) -> bool:
        stored = self._entries.get(prompt_key(scope, prompt))
        if stored is None:
            return False
        self.drop([Entry(*stored)])
        return True

    def clear(self, scope: str | None = None) -> None:
        if scope is None:
            self._entries.clear()
            self._by_row.clear()
            self.text_bytes = 0
            self._scope_ids.clear()
            self._scope_sizes.clear()
            self._tenants.clear()
            self._tenant_bytes.clear()
            self.index.clear()
        else:
            self.drop([Entry(*stored) for stored in self._entries.values() if stored[1] == scope])

    def under(self, prefix: str) -> list[Entry]:
        """Every entry whose scope is ``prefix`` or lies under it (``prefix/...``)."""
        below = prefix + "/"
        return [
            Entry(*stored)
            for stored in self._entries.values()
            if stored[1] == prefix or stored[1].startswith(below)
        ]

    def drop(self, entries: list[Entry]) -> None:
        for entry in entries:
            del self._entries[entry.key]
            del self._by_row[entry.row]
            self.text_bytes -= entry.size
            left = self._scope_sizes[entry.scope] - 1
            if left:
                self._scope_sizes[entry.scope] = left
            else:  # its last entry: the scope is forgotten, and its id with it
                del self._scope_sizes[entry.scope], self._scope_ids[entry.scope]
            if self._tracking:
                tenant = tenant_of(entry.scope)
                own = self._tenants[tenant]
                del own[entry.key]
                self._tenant_bytes[tenant] -= entry.size
                if not own:
                    del self._tenants[tenant], self._tenant_bytes[tenant]
        self.index.remove([e.row for e in entries])

    def _insert(self, given: Entry) -> Entry:
        """``given`` stored, its size counted: the entry as the table now holds it."""
        entry = Entry(
            given.key,
            given.scope,
            given.prompt,
            given.response,
            given.row,
            given.stored_at,
            text_size(given.prompt, given.response),
        )
        self.text_bytes += entry.size
        self._scope_sizes[entry.scope] = self._scope_sizes.get(entry.scope, 0) + 1
        if self._tracking:
            tenant = tenant_of(entry.scope)
            self._tenants.setdefault(tenant, OrderedDict())[entry.key] = None
            self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + entry.size
        self._entries[entry.key] = self._by_row[entry.row] = _stored(entry)
        return entry

    def _make_room(self, needed: int, now: float, tenant: str) -> None:
        """Room for ``needed`` more of ``tenant``'s entries within ``limit``: the expired go
        first, then ``tenant``'s own least recently used while it holds more than its share
        (``fair``), then anyone's."""
        if len(self._entries) + needed <= self.limit:
            return
        self.purge_expired(now)
        excess = len(self._entries) + needed - self.limit
        own = self._tenants.get(tenant) if self.fair else None
        if excess > 0 and own:
            over = len(own) + needed - self.limit // len(self._tenants)  # shared among those holding some
            victims = [Entry(*self._entries[key]) for _, key in zip(range(min(excess, over)), own)]
            self.drop(victims)
            self.stats.evictions += len(victims)
            excess -= len(victims)
        if excess > 0:
            victims = [Entry(*stored) for _, stored in zip(range(excess), self._entries.values())]
            self.drop(victims)
            self.stats.evictions += len(victims)
