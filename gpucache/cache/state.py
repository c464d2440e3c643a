"""``CacheState``: the state of a cache and the operations on it, under one lock.

The facade (``SemanticCache``, core.py) validates what callers hand it and runs the get-or-load
flows (flow.py); the flows yield the operations defined here (``_begin``, ``_finish``,
``_abort``), and the drivers run them, in place or in a worker thread. What is here: the
collaborators and settings, the lock, the entry table over the index, single-flight, the
counters and the clock; the lookup (exact tier, embed, scan, verify); stores after a load; and
the upkeep and snapshot operations.

Locking: one re-entrant lock guards the entries, the index and the counters. The embedder and
the caller's loader never run under it, so a slow model call never blocks readers; state that
may have changed meanwhile is re-read after the lock is taken again. Single-flight has its own
lock (flight.py), so a claim can be released on the event loop.
"""


from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from gpucache.cache.batching import LookupCoalescer
from gpucache.cache.entries import Entry, EntryTable
from gpucache.cache.flight import LoadAbandoned, SingleFlight, Unstored
from gpucache.cache.lookup import LOCK_BUSY, LookupRequest, Plan, exact_plan, lookup_batch
from gpucache.cache.replication import LocalOnly, Replication, SharedEntry
from gpucache.cache.settings import CacheSettings
from gpucache.cache.snapshot import Snapshot, SnapshotEntry, write_snapshot
from gpucache.cache.stats import CacheStats, StatsCounter
from gpucache.cache.validation import (
    check_prompt,
    check_prompts,
    check_scope,
    check_threshold,
)
from gpucache.devices import DeviceLike, resolve_device
from gpucache.embedding.embedder import Embedder, TransformerEmbedder
from gpucache.guard.lexical import LexicalNearMissVerifier
from gpucache.guard.verifier import HitVerifier
from gpucache.index.engines.base import ScanEngine
from gpucache.index.interface import NEVER
from gpucache.index.store import ExactScanStore
from gpucache.keys import prompt_key
from gpucache.policy.admission import AdmissionPolicy
from gpucache.policy.content import CachePolicy, ContentPolicy

log = logging.getLogger("gpucache")


class CacheState:
    """Everything a ``SemanticCache`` holds; its constructor is the cache's (see there)."""

    def __init__(
        self,
        embedder: Embedder | None = None,
        *,
        verifier: HitVerifier | None = None,
        device: DeviceLike = "auto",
        timer: Callable[[], float] = time.time,
        cache_policy: CachePolicy | None = None,
        admission: AdmissionPolicy | None = None,
        engine: ScanEngine | None = None,
        shared: Replication | None = None,
        settings: CacheSettings | None = None,
        **options: Any,
    ) -> None:
        if settings is not None and not isinstance(settings, CacheSettings):
            raise TypeError(f"settings must be a CacheSettings, got {type(settings).__name__}")
        self.settings = CacheSettings.from_options(settings, **options)
        if not callable(timer):
            raise TypeError("timer must be a callable returning seconds")
        self.timer = timer
        self.device = resolve_device(device)
        if verifier is not None and not isinstance(verifier, HitVerifier):
            raise TypeError("verifier must have a name and verify(cached, new, similarity)")
        self.verifier: HitVerifier = verifier if verifier is not None else LexicalNearMissVerifier()
        if cache_policy is not None and not isinstance(cache_policy, CachePolicy):
            raise TypeError("cache_policy must have a name and decide(prompt, response, scope)")
        self.cache_policy: CachePolicy = cache_policy if cache_policy is not None else ContentPolicy()
        if admission is not None and not isinstance(admission, AdmissionPolicy):
            raise TypeError("admission must be an AdmissionPolicy or None")
        self.admission = admission
        if embedder is not None and not isinstance(embedder, Embedder):
            raise TypeError("embedder must have name, dim, device and encode(texts)")
        if embedder is None:
            embedder = TransformerEmbedder(device=self.device)
        self.embedder: Embedder = embedder
        s = self.settings
        self.store = ExactScanStore(
            self.embedder.dim, device=self.device, scan_budget_bytes=s.scan_budget_bytes,
            quantization=s.quantization, max_device_bytes=s.max_device_bytes,
            initial_rows=min(1024, s.capacity), scan_kernel=s.scan_kernel, engine=engine,
        )
        self._lock = threading.RLock()
        self._stats = StatsCounter()
        # the most entries kept: the capacity, or fewer where the device budget says so
        limit = min(s.capacity, self.store.max_rows or s.capacity)
        self._table = EntryTable(self.store, limit, self._stats)
        self._flights: SingleFlight[bytes, str] = SingleFlight()
        # where an async exact lookup waits for the lock a scan holds: one thread of its own,
        # so a repeat never queues behind the embedder's batches in the shared pool
        self._exact_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpucache-exact")
        self._coalescer = LookupCoalescer(self._lookup_batch, self._release,
                                          window=s.lookup_window_seconds, max_batch=s.lookup_batch)
        self._clock = -float("inf")  # the latest time seen: the clock never runs backwards here
        self.shared: Replication = shared if shared is not None else LocalOnly()
        self.shared.attach(self)  # last: a replication's threads apply other replicas' entries at once

    # Read-only views of the most asked-for settings; every setting is in ``self.settings``.
    @property
    def threshold(self) -> float:
        return self.settings.threshold

    @property
    def top_k(self) -> int:
        return self.settings.top_k

    @property
    def capacity(self) -> int:
        return self.settings.capacity

    @property
    def ttl(self) -> float | None:
        return self.settings.ttl

    @property
    def quantization(self) -> str:
        """The index's storage mode: "fp32", "fp16", "bf16" or "int8"."""
        return self.store.quantization

    @property
    def scan_paths(self) -> dict[str, str]:
        """How a quantized CPU index answers each query bucket, as measured on this machine
        ("quantized" rows then the exact rescore, or the exact fp32 "copy"); empty for fp32
        storage and on CUDA (``ExactScanStore.scan_paths``)."""
        return self.store.scan_paths

    def __repr__(self) -> str:
        return (
            f"SemanticCache(entries={len(self._table)}, threshold={self.threshold}, "
            f"verifier={self.verifier.name!r}, device={self.device})"
        )


    # ----------------------------------------------------------------------------- upkeep

    def invalidate(self, prompt: str, *, scope: str | None = None) -> bool:
        """Remove the entry stored under exactly ``prompt`` in ``scope``; True if there was one."""
        scope, prompt = check_scope(scope), check_prompt(prompt)
        with self._lock:
            removed = self._table.remove(scope, prompt)
        self.shared.removed(scope, prompt)  # and on every replica, wherever it was stored
        return removed

    def may_hold(self, prompt: str, *, scope: str | None = None) -> bool:
        """True where an entry is stored under exactly ``prompt`` in ``scope`` (it may have
        expired): answered without the lock, so an event loop may ask while a scan runs. For
        admission decisions (a server under load still takes exact repeats), never for serving."""
        return self._table.may_hold(check_scope(scope), check_prompt(prompt))

    def clear(self, scope: str | None = None) -> None:
        """Remove every entry, or only those of ``scope`` when one is given."""
        scope = None if scope is None else check_scope(scope)
        with self._lock:
            self._table.clear(scope)
        self.shared.cleared(scope)

    def close(self) -> None:
        """Stop what runs in the background (the share's threads); the cache itself needs no
        closing."""
        self.shared.close()
        self._exact_pool.shutdown(wait=False)

    def purge_expired(self) -> int:
        """Drop expired entries now (they are never served either way); returns how many."""
        with self._lock:
            return self._table.purge_expired(self._now())

    def __len__(self) -> int:
        with self._lock:
            self._table.purge_expired(self._now())
            return len(self._table)

    def stats(self) -> CacheStats:
        with self._lock:
            self._table.purge_expired(self._now())
            return self._stats.snapshot(
                entries=len(self._table),
                scan_retries=self.store.scan_retries,
                cpu_fallbacks=self.store.cpu_fallbacks,
            )

    # ----------------------------------------------------------------------------- snapshots

    def save(self, path: str | os.PathLike[str], *, key: bytes | None = None) -> None:
        """Write the cache to one file, atomically (see ``gpucache.cache.snapshot``): entries,
        vectors, settings, counters and the admission sketch. Expired entries are left out.
        ``key``: sign the file, so that ``load`` with the same key refuses any other."""
        with self._lock:
            self._table.purge_expired(self._now())
            entries = list(self._table)  # least recently used first
            rows = [e.row for e in entries]
            vectors = (
                self.store.vectors(rows).cpu()
                if rows else torch.empty((0, self.embedder.dim), dtype=torch.float32)
            )
            snapshot = Snapshot(
                model=self.embedder.name,
                dim=self.embedder.dim,
                settings=self.settings.to_json(),
                entries=[SnapshotEntry(e.scope, e.prompt, e.response, self._table.expires_at(e))
                         for e in entries],
                vectors=vectors,
                stats=self._stats.to_json(),
                admission=self.admission.state() if self.admission is not None else None,
            )
        write_snapshot(snapshot, path, key)  # file I/O with no lock held

    def _restore(self, snapshot: Snapshot) -> None:
        with self._lock:
            now = self._now()
            live = [i for i, e in enumerate(snapshot.entries) if e.expires_at > now]
            live = live[-self._table.limit :]
            by_scope: dict[str, list[int]] = {}
            for i in live:
                by_scope.setdefault(snapshot.entries[i].scope, []).append(i)
            restored: dict[int, Entry] = {}
            for scope, items in by_scope.items():
                saved = [snapshot.entries[i] for i in items]
                entries = self._table.restore(
                    scope, [(e.prompt, e.response) for e in saved], snapshot.vectors[items],
                    [e.expires_at for e in saved],
                )
                restored.update(zip(items, entries))
            self._table.reorder([restored[i] for i in live])  # least recently used stays first
            self._stats = StatsCounter.from_json(snapshot.stats)
            self._stats.expirations += len(snapshot.entries) - len(live)
            self._table.stats = self._stats

    # ----------------------------------------------------------------------------- state

    def _now(self) -> float:
        """The cache's clock: the injected timer, but never earlier than a time already seen,
        so a clock stepped backwards cannot bring an expired entry back."""
        now = self.timer()
        if now > self._clock:
            self._clock = now
        return self._clock

    def _get_request(
        self, prompts: Sequence[str], scope: str | None, threshold: float | None
    ) -> LookupRequest:
        """A plain lookup's request (no claims), its input checked."""
        return LookupRequest(tuple(check_prompts(prompts)), check_scope(scope),
                             self.threshold if threshold is None else check_threshold(threshold),
                             claim=False)

    def _put(self, items: list[tuple[str, str]], scope: str, ttl: float | None) -> int:
        with self._lock:
            items = [(p, r) for p, r in items if self._allowed(p, r, scope)]
        if not items:
            return 0
        began = time.perf_counter()
        vectors = self.embedder.encode([p for p, _ in items])  # no lock held
        with self._lock:
            self._stats.embedding(time.perf_counter() - began, len(items))
            now = self._now()
            stored = self._table.store(scope, items, vectors, _expiry(now, ttl), now)
        self.shared.stored(scope, items, vectors, _expiry(now, ttl))
        return stored

    def _lookup_batch(self, requests: Sequence[LookupRequest]) -> list[Plan]:
        """A plan per request from one embedder batch and one scan per scope (lookup.py)."""
        return lookup_batch(self, requests)

    async def _alookup(self, request: LookupRequest) -> Plan:
        """``_lookup_batch`` for one request, from the event loop: an exact repeat answered on
        the spot where the lock is free, else after waiting for the lock in the exact tier's own
        thread (``exact_plan``); otherwise in a worker thread,
        batched with the requests that arrive within ``lookup_window_seconds``, and bounded by
        ``lookup_timeout_seconds`` (``LookupTimeout``) (batching.py)."""
        plan = exact_plan(self, request, wait=False)
        if plan is LOCK_BUSY and all(self._table.may_hold(request.scope, p) for p in request.prompts):
            # a scan or a store holds the lock, and every prompt looks stored: wait for the lock
            # in a thread of the exact tier's own (never queued behind the embedder's batches),
            # then look again. A prompt not stored goes to the coalescer at once.
            loop = asyncio.get_running_loop()
            plan = await loop.run_in_executor(self._exact_pool, exact_plan, self, request, True)
        if isinstance(plan, Plan):
            return plan
        return await self._coalescer.submit(request, self.settings.lookup_timeout_seconds)

    def _release(self, plan: Plan) -> None:
        """Give up a plan's claims, once: its caller is gone, and its waiters load for
        themselves."""
        mine, plan.mine = plan.mine, []
        if mine:
            self._flights.fail(mine, LoadAbandoned())
        self._release_shared(plan)

    def _claim_shared(self, plan: Plan) -> list[str]:
        """Between this call's local claims and its load: the claims across replicas (one
        round trip). Returns the misses another replica is loading, for the flow to wait on
        (``WaitShared``: on the event loop on async paths, never in a worker thread); the rest
        this call loads, holding their shared claims until it stores or gives up."""
        if not plan.mine:
            return []
        prompts = [plan.keys[k] for k in plan.mine]
        plan.shared_claims, others = self.shared.claim(plan.scope, prompts)
        return others

    def _adopt_shared(self, plan: Plan, found: list[SharedEntry]) -> None:
        """The entries another replica loaded for this call's misses: applied here, answered,
        and handed to this replica's waiters; what did not arrive, this call loads."""
        if not found:
            return  # the other replica gave up or took too long: this call loads them
        self.apply_replicated(found)
        answers = {e.prompt: e.response for e in found}
        plan.answers.update(answers)
        done = {prompt_key(plan.scope, p): r for p, r in answers.items()}
        with self._lock:
            self._flights.resolve(done)  # this replica's waiters get the other replica's answer
        plan.mine = [k for k in plan.mine if k not in done]

    def _release_shared(self, plan: Plan) -> None:
        claims, plan.shared_claims = plan.shared_claims, {}
        if claims:
            self.shared.release(plan.scope, claims)

    def _finish(self, plan: Plan, responses: list[str | Unstored], ttl: float | None = None) -> None:
        """Store what the loader returned (policy and admission permitting) and hand every
        response to the calls waiting on it."""
        loaded = plan.to_load
        plan.answers.update(zip(loaded, responses))
        position = {p: i for i, p in enumerate(plan.unique)}
        unstored = [key for key, r in zip(plan.mine, responses) if isinstance(r, Unstored)]
        with self._lock:
            keep = [
                (p, r) for p, r in zip(loaded, responses)
                if not isinstance(r, Unstored)
                and self._allowed(p, r, plan.scope) and self._admitted(p, plan.scope)
            ]
            if keep:
                rows = torch.tensor([position[p] for p, _ in keep], device=plan.vectors.device)
                now = self._now()
                expires_at = _expiry(now, self.ttl if ttl is None else ttl)
                self._table.store(plan.scope, keep, plan.vectors[rows], expires_at, now)
            self._flights.resolve({key: r for key, r in zip(plan.mine, responses)
                                   if not isinstance(r, Unstored)})
        if unstored:  # never handed to another caller: its waiters load their own
            self._flights.fail(unstored, LoadAbandoned())
        if keep:
            self.shared.stored(plan.scope, keep, plan.vectors[rows], expires_at)
        self._release_shared(plan)  # after the records: a waiting replica finds them

    # ----------------------------------------------------------------------------- shared

    # The ``Replica`` face (gpucache.cache.replication): how a replication applies what other
    # replicas did. Public, and the only way in from outside the package.

    def apply_replicated(self, entries: Sequence[SharedEntry]) -> None:
        """Other replicas' entries, into this replica's index (no policy, admission or
        publishing: they passed them where they were stored)."""
        groups: dict[tuple[str, float], list[SharedEntry]] = {}
        for entry in entries:  # one write per scope and expiry: a bootstrap is one batch
            groups.setdefault((entry.scope, entry.expires_at), []).append(entry)
        with self._lock:
            now = self._now()
            for (scope, expires_at), group in groups.items():
                if expires_at > now:
                    self._table.store(scope, [(e.prompt, e.response) for e in group],
                                      torch.stack([e.vector for e in group]), expires_at, now)

    def apply_replicated_removal(self, scope: str, prompt: str) -> None:
        with self._lock:
            self._table.remove(scope, prompt)

    def apply_replicated_clear(self, scope: str | None) -> None:
        with self._lock:
            self._table.clear(scope)

    def _abort(self, plan: Plan, error: BaseException) -> None:
        """Release this call's claims, handing ``error`` to their waiters. Takes only
        single-flight's own lock (and queues the release of any claims across replicas): the
        async drivers call it on the event loop."""
        self._flights.fail(plan.mine, error)
        self._release_shared(plan)

    def _replay(self, answer: str) -> Iterator[str]:
        size = self.settings.replay_chunk_chars
        for start in range(0, len(answer), size):
            yield answer[start : start + size]

    def _allowed(self, prompt: str, response: str, scope: str) -> bool:
        decision = self.cache_policy.decide(prompt, response, scope)
        if not decision.allowed:
            self._stats.refusals[decision.reason] += 1
            log.debug("cache policy refused to store %r: %s", prompt[:80], decision.reason)
        return decision.allowed

    def _admitted(self, prompt: str, scope: str) -> bool:
        if self.admission is None or self.admission.admits(scope, prompt):
            return True
        self._stats.admissions_deferred += 1
        return False


def _expiry(now: float, ttl: float | None) -> float:
    return NEVER if ttl is None else now + ttl
