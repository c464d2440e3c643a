"""Lookups asked from an event loop: the exact tier's shortcut, and the coalescer for the rest.

Why a part of its own: an event loop must never wait on the lock a scan holds, so a lookup
from the loop first tries the exact tier with the lock only if it is free at once; where a
store or a scan holds it, a repeat is read without the lock (``EntryTable.peek``: atomic reads,
the record read again after its expiry) and served at once, its bookkeeping (recency, counts,
the admission sketch's sighting) queued and done by the next holder of the lock that asks
(``settle``); a repeat the lock-free read cannot confirm waits in a thread of the exact tier's
own (never queued behind the embedder's batches); anything else goes to the coalescer
(batching.py), which gathers the loop's lookups into batches computed in a worker thread.

Why not wait for the lock: a store holds it while it writes the index (an int8 block
quantized again, for one), and under a load of misses a repeat waiting for it queued for tens
of milliseconds (bench/serve_stalls.py); a repeat needs no write to be answered.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from gpucache.cache.batching import LookupCoalescer
from gpucache.cache.claims import Claims
from gpucache.cache.entries import EntryTable
from gpucache.cache.lookup import Findings, Lookup, LookupRequest, count
from gpucache.cache.settings import CacheSettings
from gpucache.cache.stats import StatsCounter
from gpucache.policy.admission import AdmissionPolicy


class LoopCore(Protocol):
    """What the loop's lookups run on (``CacheCore`` in core.py is the one). A protocol, so that
    this module needs nothing from the core's."""

    settings: CacheSettings
    lock: Any
    lookup: Lookup
    table: EntryTable
    counters: StatsCounter
    admission: AdmissionPolicy | None

    def looked(self, requests: Sequence[LookupRequest]) -> list[Findings | Claims]: ...

    def release(self, found: Findings | Claims) -> None: ...

    def claims(self, request: LookupRequest, found: Findings, now: float) -> Claims: ...

    def now(self) -> float: ...


@dataclass(frozen=True)
class LockBusy:
    """``LoopLookups.exact``'s answer where the lock was held and the caller would not wait."""


LOCK_BUSY = LockBusy()


class LoopLookups:
    """A cache's lookups from an event loop (module doc); ``core`` is the cache's."""

    def __init__(self, core: LoopCore) -> None:
        self.core = core
        s = core.settings
        # where an async exact lookup waits for the lock a scan holds: one thread of its own,
        # so a repeat never queues behind the embedder's batches in the shared pool
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpucache-exact")
        self.coalescer = LookupCoalescer(
            core.looked, core.release, window=s.lookup_window_seconds, max_batch=s.lookup_batch
        )
        # repeats served without the lock, whose bookkeeping waits for it (appends and pops
        # are atomic: the loop appends, a holder of the lock pops)
        self.deferred: deque[tuple[LookupRequest, Findings]] = deque()

    def close(self) -> None:
        self.pool.shutdown(wait=False)

    def exact(self, request: LookupRequest, wait: bool) -> Findings | Claims | LockBusy | None:
        """A request whose every prompt the exact tier answers (repeats: a dictionary lookup,
        which through the coalescer would take a thread hop and queue behind the embedder),
        looked up and, for a get-or-load request, claimed, in one lock section; None where one
        is not stored. ``wait`` False: only where the lock is free at once, else ``LockBusy``
        (how the event loop asks, never waiting on a scan); True: from a thread that may wait
        for it (a scan holds it for milliseconds)."""
        core = self.core
        if not core.lock.acquire(blocking=wait):
            found = core.lookup.peek_exact(request)
            if found is None:
                return LOCK_BUSY
            self.deferred.append((request, found))
            return Claims(found, {}, [], {}) if request.claim else found  # every prompt a hit
        try:
            self.settle()
            found = core.lookup.exact(request)
            if found is None or not request.claim:
                return found
            return core.claims(request, found, core.now())
        finally:
            core.lock.release()

    def settle(self) -> None:
        """The bookkeeping of the repeats served without the lock, as ``exact`` would have done
        it: each entry marked recently used (where still stored), each hit counted, a
        get-or-load's sightings recorded in the admission sketch. Lock held: every reader of
        the counters (``stats``, a snapshot) settles first."""
        core, deferred = self.core, self.deferred
        while deferred:
            request, found = deferred.popleft()
            for prompt in found.unique:
                core.table.touch_key(found.scope, prompt)
            if request.count:
                count(core.counters, found)
                if request.claim and core.admission is not None:
                    for prompt in found.prompts:
                        core.admission.record(found.scope, prompt)

    async def looked(self, request: LookupRequest) -> Findings | Claims:
        """One request's lookup: an exact repeat answered on the spot where the lock is free,
        else after waiting for the lock in the exact tier's own thread; otherwise in a worker
        thread, at once where no batch is computing, else in the next batch with the requests
        that gathered behind it (where ``lookup_window_seconds`` is above 0), and bounded by
        ``lookup_timeout_seconds`` (``LookupTimeout``)."""
        found = None if request.refresh else self.exact(request, wait=False)  # a refresh skips the tier
        held = self.core.table.may_hold
        if isinstance(found, LockBusy) and all(held(request.scope, p) for p in request.prompts):
            # a scan or a store holds the lock, and every prompt looks stored: wait for the lock
            # in the exact tier's own thread, then look again. A prompt not stored goes to the
            # coalescer at once.
            loop = asyncio.get_running_loop()
            found = await loop.run_in_executor(self.pool, self.exact, request, True)
        if isinstance(found, (Findings, Claims)):
            return found
        return await self.coalescer.submit(request, self.core.settings.lookup_timeout_seconds)
