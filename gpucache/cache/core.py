"""``CacheCore``: what a ``SemanticCache`` holds, and the operations on it, under one lock.

The facade (``SemanticCache``, semantic.py) checks what callers hand it and runs the
get-or-load flows (flow.py), whose drivers (drivers.py) run the operations defined here
(``finish``, ``abort``) and, across replicas, ``replica``'s (replicated.py). What is here: the
collaborators and settings, the lock, the entry table over the index, single-flight, the
counters and the clock; the lookups (``Lookup``, lookup.py: ``find`` for plain lookups,
``find_and_claim`` for get-or-load ones, each with one return type; from an event loop,
onloop.py) and the claims taken on what they found (claims.py); stores after a load. Removals
and counts are ``upkeep``'s (upkeep.py); the snapshot's capture and restore are saving.py's.
Public to the package; input is not checked here (the facade has done it).

Locking: one re-entrant lock (``lock``) guards the entries, the index and the counters. The
embedder, the verifier, the content policy and the caller's loader never run under it, so a
slow model call, a scan with many candidates or a long answer's check never blocks readers;
state that may have changed meanwhile is re-read after the lock is taken again (a candidate
removed while it was judged is a miss).
Single-flight has its own lock (flight.py), so a claim can be released on the event loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from gpucache.cache.claims import Claims, take_claims
from gpucache.cache.entries import EntryTable
from gpucache.cache.flight import LoadAbandoned, SingleFlight
from gpucache.cache.lookup import Findings, Lookup, LookupRequest
from gpucache.cache.onloop import LockBusy, LoopLookups
from gpucache.cache.replicated import ReplicaSide
from gpucache.cache.replication import ClearedPrefixes, LocalOnly, RemovalFence, Replication
from gpucache.cache.served import Keep, LoaderAnswer
from gpucache.cache.settings import CacheSettings
from gpucache.cache.stats import StatsCounter
from gpucache.cache.upkeep import Upkeep
from gpucache.conversation.context import ContextMatcher
from gpucache.conversation.value import request_of
from gpucache.embedding.model import Embedder
from gpucache.guard.memo import reading_for
from gpucache.guard.verifier import HitVerifier, ReadsRequests
from gpucache.index.engines.base import ScanEngine
from gpucache.index.interface import NEVER
from gpucache.index.store import ExactScanStore
from gpucache.policy.admission import AdmissionPolicy
from gpucache.policy.content import CachePolicy

log = logging.getLogger("gpucache")


@dataclass(frozen=True)
class Parts:
    """What a cache is built from, checked and with every default filled in: the facade's
    constructor (``SemanticCache``, semantic.py) makes it from its arguments, documented there."""

    settings: CacheSettings
    embedder: Embedder
    verifier: HitVerifier
    device: torch.device
    timer: Callable[[], float]
    cache_policy: CachePolicy
    admission: AdmissionPolicy | None
    engine: ScanEngine | None


class CacheCore:
    """Everything a ``SemanticCache`` holds: its ``parts``, and the state built over them."""

    def __init__(self, parts: Parts, shared: Replication | None = None) -> None:
        self.settings = parts.settings
        self.timer = parts.timer
        self.device = parts.device
        self.verifier = parts.verifier
        self.cache_policy = parts.cache_policy
        self.admission = parts.admission
        self.embedder = parts.embedder
        s = self.settings
        self.store = ExactScanStore(
            self.embedder.dim,
            device=self.device,
            scan_budget_bytes=s.scan_budget_bytes,
            quantization=s.quantization,
            max_device_bytes=s.max_device_bytes,
            initial_rows=min(1024, s.capacity),
            scan_kernel=s.scan_kernel,
            engine=parts.engine,
        )
        self.lock = threading.RLock()
        self.fence = RemovalFence()  # removals, for the reads from the shared store (fetched)
        self.cleared_prefixes = ClearedPrefixes()  # clear_under's, here and elsewhere (revokes)
        self.counters = StatsCounter()
        # the most entries kept: the capacity, or fewer where the device budget says so
        limit = min(s.capacity, self.store.max_rows or s.capacity)
        self.table = EntryTable(
            self.store, limit, self.counters, s.max_text_bytes, s.tenant_capacity, fair=s.fair_share
        )
        self.flights: SingleFlight[bytes, str] = SingleFlight()
        self.shared: Replication = LocalOnly()
        self.replica = ReplicaSide(self, lambda: self.shared)  # this cache among others (replicated.py)
        self.upkeep = Upkeep(self)  # removals here and everywhere, purges, counts (upkeep.py)
        self.lookup = Lookup(
            lock=self.lock,
            table=self.table,
            store=self.store,
            embedder=self.embedder,
            verifier=self.verifier,
            counters=lambda: self.counters,
            top_k=s.top_k,
            now=self.now,
            embedded=self.embedded,
            fetched=self.replica.fetched,
            context=ContextMatcher() if s.match_context else None,
        )
        self.onloop = LoopLookups(self)  # lookups asked from an event loop (onloop.py)
        self._clock = -float("inf")  # the latest time seen: the clock never runs backwards here
        self._clock_lock = threading.Lock()  # held for a comparison: never by a scan
        if shared is not None:
            self.attach(shared)

    def attach(self, shared: Replication) -> None:
        """Share this cache's entries through ``shared`` from now on: last in the constructor,
        or after a restore (a replication's threads apply other replicas' entries at once)."""
        if not isinstance(self.shared, LocalOnly):
            raise RuntimeError("this cache is already replicated (a gpucache bug)")
        self.shared = shared
        shared.attach(self.replica)

    @property
    def batches(self) -> int:
        """Lookup batches computed so far (the coalescer's count; a server exports it)."""
        return self.onloop.coalescer.batches

    def close(self) -> None:
        self.shared.close()
        self.onloop.close()

    def settle(self) -> None:
        """The bookkeeping of repeats the loop served without the lock (onloop.py). Lock held."""
        self.onloop.settle()

    # ----------------------------------------------------------------------------- snapshots

    # ----------------------------------------------------------------------------- state

    def now(self) -> float:
        """The cache's clock: the injected timer, but never earlier than a time already seen,
        so a clock stepped backwards cannot bring an expired entry back."""
        now = self.timer()
        with self._clock_lock:  # read without the cache's lock by the loop's repeats (onloop.py)
            if now > self._clock:
                self._clock = now
            return self._clock

    def embedded(self, prompts: Sequence[str], scopes: Sequence[str]) -> list[str]:
        """The texts the semantic tier embeds for ``prompts``: each prompt's request as the
        verifier reads it (``ReadsRequests``: framing dropped, shorthand written out), so a
        chatty wrapper and the bare request land together; the prompt itself for a verifier
        that reads prompts as written. The exact tier always keys the prompt as sent (a
        conversation: the whole of it, conversation/value.py). Each is read for its scope
        (``scopes``, one a prompt): the guard's memos of one scope never make another's
        reading faster (guard/memo.py)."""
        requests = [request_of(p) for p in prompts]  # a conversation: its final request
        verifier = self.verifier
        if not isinstance(verifier, ReadsRequests):
            return requests
        read = []
        for prompt, scope in zip(requests, scopes, strict=True):
            with reading_for(scope):
                read.append(verifier.request(prompt))
        return read

    def put(self, items: list[tuple[str, str]], scope: str, ttl: float | None) -> int:
        items = [(p, r) for p, r in items if self.allowed(p, r, scope)]  # no lock held
        if not items:
            return 0
        began = time.perf_counter()
        vectors = self.embedder.encode(self.embedded([p for p, _ in items], [scope] * len(items)))  # no lock
        with self.lock:
            self.counters.embedding(time.perf_counter() - began, len(items))
            now = self.now()
            stored = self.table.store(scope, items, vectors, _expiry(now, ttl), now)
        self.shared.stored(scope, items, vectors, _expiry(now, ttl))
        return stored

    def find(self, requests: Sequence[LookupRequest]) -> list[Findings]:
        """Plain lookups (no claims): each request's findings, from one embedder batch and one
        scan per scope."""
        if any(r.claim for r in requests):
            raise ValueError("gpucache bug: find takes plain lookups; find_and_claim claims")
        repeat = self._repeat(requests)
        return [cast(Findings, repeat)] if repeat is not None else self.lookup.find(requests)

    def find_and_claim(self, requests: Sequence[LookupRequest]) -> list[Claims]:
        """Get-or-load lookups: each request's claims on what it found (claims.py)."""
        if not all(r.claim for r in requests):
            raise ValueError("gpucache bug: find_and_claim takes get-or-load lookups")
        repeat = self._repeat(requests)
        return [cast(Claims, repeat)] if repeat is not None else cast("list[Claims]", self.looked(requests))

    def _repeat(self, requests: Sequence[LookupRequest]) -> Findings | Claims | None:
        """A lone request whose every prompt the exact tier answers, looked up (and claimed) in
        one lock section, the event loop's shortcut (onloop.py) taken by a thread that may wait
        for the lock: a repeat, the common case, takes the lock once rather than once for the
        exact tier, twice around a scan it does not need and once for its claims. None where
        there is more than one request or a prompt is not stored: the whole lookup runs."""
        if len(requests) != 1:
            return None
        found = self.onloop.exact(requests[0], wait=True)
        assert not isinstance(found, LockBusy)  # waited for
        return found

    def looked(self, requests: Sequence[LookupRequest]) -> list[Findings | Claims]:
        """One batch that may hold both kinds (the coalescer's): each plain request's findings,
        each get-or-load request's claims."""
        found = self.lookup.find(requests)
        if not any(r.claim for r in requests):
            return list(found)
        with self.lock:
            now = self.now()
            return [self.claims(r, f, now) if r.claim else f for r, f in zip(requests, found)]

    def claims(self, request: LookupRequest, found: Findings, now: float) -> Claims:
        """A get-or-load request's claims on what its lookup found (claims.py), marked with the
        removals so far (``Claims.since``). Lock held."""
        claims = take_claims(found, request, self.table, self.flights, self.counters, self.admission, now)
        claims.since = self.fence.mark()
        return claims

    async def afind(self, request: LookupRequest) -> Findings:
        """``find`` for one plain request, from the event loop (onloop.py)."""
        found = await self.onloop.looked(request)
        if not isinstance(found, Findings) or request.claim:
            raise ValueError("gpucache bug: afind takes a plain lookup")
        return found

    async def afind_and_claim(self, request: LookupRequest) -> Claims:
        """``find_and_claim`` for one get-or-load request, from the event loop (onloop.py)."""
        found = await self.onloop.looked(request)
        if not isinstance(found, Claims):
            raise ValueError("gpucache bug: afind_and_claim takes a get-or-load lookup")
        return found

    def release(self, found: Findings | Claims) -> None:
        """Give up a lookup's claims, if it took any: its caller is gone, and its waiters load
        for themselves."""
        if isinstance(found, Claims):
            self.abort(found, LoadAbandoned())

    def finish(self, claims: Claims, answers: Sequence[LoaderAnswer[Any]], ttl: float | None = None) -> None:
        """Store what the loader answered for this call's claims (each ``Keep``, policy and
        admission permitting, for its own ttl, else ``ttl``, else the cache's) and hand each
        kept text to the calls waiting on it; a ``ServeOnly``'s waiters load their own."""
        loaded, mine, found = claims.to_load, claims.mine, claims.found
        position = {p: i for i, p in enumerate(found.unique)}
        kept = {key: (p, a) for key, p, a in zip(mine, loaded, answers) if isinstance(a, Keep)}
        unkept = [key for key in mine if key not in kept]
        stored: list[tuple[list[tuple[str, str]], torch.Tensor, float]] = []
        # decided with no lock held: the content policy (regular expressions over both texts)
        # and admission (a read of the sketch; its counts are written under the lock, in claims)
        permitted = [(p, a) for p, a in kept.values() if self.allowed(p, a.text or "", claims.scope)]
        admitted = [(p, a) for p, a in permitted if self.admits(p, claims.scope)]
        with self.lock:
            now = self.now()
            self.counters.admissions_deferred += len(permitted) - len(admitted)
            # a removal since the claim (an admin invalidate, clear or revoke that returned while
            # the answer was loading) covers what it loaded: handed to its callers, not stored
            admitted = [(p, a) for p, a in admitted if not self.fence.stale(claims.scope, p, claims.since)]
            groups: dict[float, list[tuple[str, str]]] = {}
            for p, a in admitted:
                assert a.text is not None
                lifetime = a.ttl if a.ttl is not None else self.settings.ttl if ttl is None else ttl
                groups.setdefault(_expiry(now, lifetime), []).append((p, a.text))
            for expires_at, keep in groups.items():
                rows = torch.tensor([position[p] for p, _ in keep], device=found.vectors.device)
                vectors = found.vectors[rows]
                self.table.store(claims.scope, keep, vectors, expires_at, now)
                stored.append((keep, vectors, expires_at))
            self.flights.resolve({key: a.text for key, (_, a) in kept.items() if a.text is not None})
        if unkept:  # never handed to another caller: its waiters load their own
            self.flights.fail(unkept, LoadAbandoned())
        claims.mine = []  # released, once: a store that raised before here leaves them to abort
        for keep, vectors, expires_at in stored:
            self.shared.stored(claims.scope, keep, vectors, expires_at)
        self.replica.release_shared(claims)  # after the records: a waiting replica finds them

    def abort(self, claims: Claims, error: BaseException) -> None:
        """Release this call's claims (those not yet released), handing ``error`` to their
        waiters. Takes only single-flight's own lock (and queues the release of any claims
        across replicas): the async drivers call it on the event loop."""
        mine, claims.mine = claims.mine, []
        if mine:
            self.flights.fail(mine, error)
        self.replica.release_shared(claims)

    def replay(self, answer: str) -> Iterator[str]:
        """A stored answer in ``replay_chunk_chars`` pieces, for a streaming caller."""
        size = self.settings.replay_chunk_chars
        for start in range(0, len(answer), size):
            yield answer[start : start + size]

    def allowed(self, prompt: str, response: str, scope: str) -> bool:
        """Whether the content policy lets (prompt, response) be stored. Decided with no lock
        held (regular expressions over both texts: linear, not free), so a long answer being
        checked holds up no lookup; only a refusal's count takes the lock."""
        decision = self.cache_policy.decide(prompt, response, scope)
        if not decision.allowed:
            with self.lock:
                self.counters.refusals[decision.reason] += 1
            log.debug("cache policy refused to store %r: %s", prompt[:80], decision.reason)
        return decision.allowed

    def admits(self, prompt: str, scope: str) -> bool:
        """Whether admission lets ``prompt``'s answer be stored now (no policy: always). A read
        of the sketch, asked with no lock held: a sighting counted meanwhile by another lookup
        may or may not be seen, as it would be a moment later."""
        return self.admission is None or self.admission.admits(scope, prompt)


def _expiry(now: float, ttl: float | None) -> float:
    return NEVER if ttl is None else now + ttl
