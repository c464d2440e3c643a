"""Replicas sharing entries through Redis or Valkey: ``SemanticCache(..., shared=RedisShare(url))``.

Each replica keeps its own index on its own device, and scans it alone: that is the part Redis
cannot do fast. What Redis holds is the log that feeds every index:

    {prefix}:meta        hash   model and dimension: a replica of another model refuses to join
    {prefix}:e:{key}     hash   one entry: scope, prompt, response, expiry, model, vector bytes,
                                and the replica that stored it; expires with the entry (PEXPIREAT)
    {prefix}:log         stream put / del / clear / join events, trimmed to about ``maxlen`` events;
                                each names its writer, its sequence and when it was signed

Writing: every entry a replica stores is written as a record and announced on the stream; an
invalidation or a clear is announced too. Writes go through a background thread: a request never
waits on Redis, and an entry stored while Redis is away is kept locally and written when it
returns (up to ``pending_max`` of them).

Reading: a background thread tails the stream (XREAD BLOCK from the last id it saw) and applies
other replicas' events to the local index. A replica that starts, or that finds the stream
trimmed past the last id it saw (it was away too long), first bootstraps from the records (SCAN),
then tails from the stream's end as it was before the bootstrap began, so nothing falls between.

When Redis is unreachable the replica keeps serving and storing locally, counts the errors,
reconnects with backoff, and catches up (or bootstraps) when it can. Expiry is wall-clock
time: shared caches use the default ``timer`` (``time.time``).

The parts: records.py (the key layout, the record format, signatures, decoding), link.py (the
client, the counters and the condition they are announced on), writer.py (the writing thread),
tail.py (the tailing thread); this module is the face a cache sees (``Replication``).

Authenticated records: with a ``secret`` (the same on every replica), every record and event
carries an HMAC of its fields, and a replica refuses (and counts) any that lacks the right one,
so anyone who can write to Redis but does not hold the secret cannot plant an answer in any
tenant's scope, nor invalidate one. ``gpucache serve --redis`` signs with a key derived from its
tenancy secret. A signature binds the writer, its sequence and the signing time, so a genuine
record or event put back (an invalidated answer's record and its put, a captured ``clear``
added again) is refused and counted too (``ShareStats.replayed``; replay.py says how, and
what a replica that joins later can and cannot know).

Single-flight holds across replicas: a replica about to load a miss first claims it in Redis
(SET NX PX, a random token, released by compare-and-delete after the entry is written); a
replica that finds the claim taken waits, within ``claim_wait``, for the entry, then loads it
itself. Not shared, per replica: the admission sketch (each replica admits from the traffic it
sees; sharing it would take a sketch of counters in Redis merged on each sighting).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from gpucache.cache.replication import Replica, SharedEntry, covers
from gpucache.cache.validation import MAX_TTL_SECONDS
from gpucache.fields import without_password
from gpucache.share.link import Link, ShareStats
from gpucache.share.records import SharedModelMismatch, model_mismatch
from gpucache.share.replay import ReplayGuard
from gpucache.share.tail import Tail
from gpucache.share.writer import Writer

if TYPE_CHECKING:
    import redis

__all__ = ["RedisShare", "ShareStats", "SharedModelMismatch"]

log = logging.getLogger("gpucache.share")

CLAIM_POLL = 0.02  # seconds between looks for an entry another replica is loading


class RedisShare:
    """Shares one cache's entries with the other replicas on the same Redis or Valkey.

    Args:
        url: ``redis://host:port/db`` (Valkey speaks the same protocol).
        prefix: the keys' prefix; replicas of one cache share it.
        maxlen: about how many events the stream keeps (XADD MAXLEN ~).
        deadline: seconds any one Redis call may take before it counts as a failure.
        pending_max: entries kept for writing while Redis is away; older ones are dropped first.
        claim_wait: seconds a miss waits for another replica that is loading the same prompt,
            before loading it itself.
        claim_ttl: seconds a replica-wide claim lives at most (a replica that died holding one
            blocks no one for longer).
        client: a redis-py client to use instead of one made from ``url`` (tests).
        secret: sign every record and event written, and refuse any read without the right
            signature (``ShareStats.unsigned``); the same on every replica. None: unsigned.
        replay_window: seconds an event's signing time may lie from the time Redis added it
            to the stream (replay.py); replicas' and Redis's clocks must agree within it. Only
            with a secret: unsigned, nothing can be told from a replay.
        on_apply: called with the entries applied here from other replicas and the wall-clock
            time each was written at (metrics, benchmarks).
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "gpucache",
        maxlen: int = 100_000,
        deadline: float = 0.5,
        pending_max: int = 10_000,
        claim_wait: float = 30.0,
        claim_ttl: float = 120.0,
        client: redis.Redis | None = None,
        on_apply: Callable[[list[SharedEntry], list[float]], None] | None = None,
        secret: bytes | None = None,
        replay_window: float = 300.0,
    ) -> None:
        import redis as redis_module

        if secret is not None and len(secret) < 16:
            raise ValueError("the replication secret must be at least 16 bytes")
        if maxlen < 1 or deadline <= 0 or pending_max < 1:
            raise ValueError("maxlen and pending_max must be >= 1 and deadline > 0")
        self.claim_wait, self.claim_ttl = claim_wait, claim_ttl
        self.link = Link(
            client
            or redis_module.Redis.from_url(url, socket_timeout=deadline, socket_connect_timeout=deadline),
            prefix,
            maxlen,
            deadline,
            secret,
            errors=(redis_module.RedisError, OSError),
            transient=(redis_module.ConnectionError, redis_module.TimeoutError, OSError),
            guard=ReplayGuard(replay_window),
        )
        self.redis, self.keys, self.signer = self.link.redis, self.link.keys, self.link.signer
        # the URL as logs and errors show it: a password in it (redis://:pw@host) masked
        self.url, self.prefix = without_password(url), prefix
        self.stats: ShareStats = self.link.stats
        self.writer = Writer(self.link, pending_max)
        self.tail = Tail(self.link, on_apply)
        self._threads: list[threading.Thread] = []

    # ----------------------------------------------------------------------------- life

    remote = True  # other replicas may exist (``gpucache.cache.replication.Replication``)

    def attach(self, cache: Replica) -> None:
        """Join the shared log as ``cache``: check the model, then start writing and tailing.
        Raises ``SharedModelMismatch`` when the log holds another model's vectors. A share
        that was closed may be attached again: it catches up from where it stopped."""
        self.tail.replica = cache
        self.link.stop.clear()
        model, dim = cache.embedder.name, cache.embedder.dim
        self.writer.model = (model, dim)
        meta_key = self.keys.key("meta")
        try:
            self.redis.hsetnx(meta_key, "model", model)
            self.redis.hsetnx(meta_key, "dim", str(dim))
            meta = self.redis.hgetall(meta_key)
            self.link.breaker.succeeded()
        except self.link.errors as exc:  # Redis is away: join blind, check once it is back
            log.warning("gpucache: Redis at %s is unreachable (%r); serving locally", self.url, exc)
            meta = {}
        theirs = model_mismatch(meta, model, dim)
        if theirs is not None:
            raise SharedModelMismatch(
                f"the shared cache at {self.url} (prefix {self.prefix!r}) holds vectors of model "
                f"{theirs[0]!r} ({theirs[1]} dimensions); this replica runs {model!r} "
                f"({dim}): give it another prefix, or the same model"
            )
        for name, target in (("writer", self.writer.loop), ("tail", self.tail.loop)):
            thread = threading.Thread(target=target, name=f"gpucache-share-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self, flush_timeout: float = 5.0) -> None:
        """Write what is pending (for up to ``flush_timeout`` seconds, while Redis answers),
        then stop the background threads."""
        self.writer.drain(flush_timeout, running=bool(self._threads))
        self.link.stop.set()
        self.writer.stopped()
        for thread in self._threads:
            thread.join(5)
        self._threads.clear()

    def wait_for(self, predicate: Callable[[ShareStats], bool], timeout: float | None = None) -> bool:
        """Block until ``predicate(stats)`` holds; False on timeout. For tests and diagnostics:
        "replica B has seen replica A's entry" is an event."""
        return self.link.wait_for(predicate, timeout)

    def wait_applied(self, n: int, timeout: float | None = None) -> bool:
        """Until ``n`` entries and events in all have been applied here."""
        return self.wait_for(lambda s: s.applied >= n, timeout)

    def wait_written(self, n: int, timeout: float | None = None) -> bool:
        """Until ``n`` entries and events in all have been written to Redis."""
        return self.wait_for(lambda s: s.written >= n, timeout)

    # ----------------------------------------------------------------------------- writes

    def stored(
        self, scope: str, items: list[tuple[str, str]], vectors: torch.Tensor, expires_at: float
    ) -> None:
        """The cache stored these (prompt, response) pairs with their (M, D) vectors."""
        if math.isfinite(expires_at) and expires_at > time.time() + MAX_TTL_SECONDS + 86400:
            # Redis would refuse its expiry: checked here, before it could fail a batch
            self.link.count(poisoned=len(items))
            log.error(
                "gpucache: %d entries expire past what Redis accepts (%r): kept in this replica only",
                len(items),
                expires_at,
            )
            return
        rows = vectors.detach().to("cpu", torch.float32).numpy()
        for (prompt, response), vector in zip(items, rows):
            self.writer.enqueue(
                {
                    "op": "put",
                    "scope": scope,
                    "prompt": prompt,
                    "response": response,
                    "expires_at": expires_at,
                    "vector": vector.astype("<f4").tobytes(),
                }
            )

    def claim(self, scope: str, prompts: list[str]) -> tuple[dict[str, str], list[str]]:
        """Claims across replicas on these misses (SET NX PX with a random token): the ones
        this replica got, prompt -> token, and the prompts another replica is loading. With
        Redis away, every miss is this replica's to load, unclaimed."""
        if not self.link.breaker.connected:
            return {}, []
        tokens = {p: uuid.uuid4().hex for p in prompts}
        try:
            pipe = self.redis.pipeline(transaction=False)
            for prompt, token in tokens.items():
                pipe.set(self.keys.claim(scope, prompt), token, nx=True, px=int(self.claim_ttl * 1000))
            got = pipe.execute()
        except Exception:  # Redis away: every miss is this replica's to load, unclaimed
            self.link.breaker.trip()
            return {}, []
        mine = {p: t for (p, t), ok in zip(tokens.items(), got) if ok}
        return mine, [p for p in prompts if p not in mine]

    def wait_loaded(self, scope: str, prompts: list[str]) -> list[SharedEntry]:
        """The entries another replica is loading, once all have arrived, or what arrived by
        then when its claims are gone (it gave up) or ``claim_wait`` has passed. Blocks the
        calling thread (sync paths; async paths use ``await_loaded``)."""
        deadline = time.monotonic() + self.claim_wait
        with self._waiting():
            while True:
                found, settled = self.look_loaded(scope, prompts)
                if settled or time.monotonic() >= deadline:
                    return found
                self.link.stop.wait(CLAIM_POLL)

    async def await_loaded(self, scope: str, prompts: list[str]) -> list[SharedEntry]:
        """``wait_loaded`` for the event loop: it waits between looks with ``asyncio.sleep``
        and holds a worker thread only for each look's round trip, so any number of waits
        leave the threads that lookups run in free."""
        deadline = time.monotonic() + self.claim_wait
        with self._waiting():
            while True:
                found, settled = await asyncio.to_thread(self.look_loaded, scope, prompts)
                if settled or time.monotonic() >= deadline:
                    return found
                await asyncio.sleep(CLAIM_POLL)  # a poll's period: Redis has no cheaper signal here

    def look_loaded(self, scope: str, prompts: list[str]) -> tuple[list[SharedEntry], bool]:
        """One look (one or two round trips): the entries that have arrived, and whether the
        wait is over (all arrived, the claims are gone, or Redis is away)."""
        pairs = [(scope, p) for p in prompts]
        found = self.fetch(pairs)
        if len(found) == len(pairs):
            return found, True
        try:
            held = self.redis.exists(*(self.keys.claim(scope, p) for p in prompts))
        except Exception:
            return found, True
        if held == 0:  # released: stored meanwhile (read once more), or given up
            return self.fetch(pairs), True
        return found, False

    @contextmanager
    def _waiting(self) -> Iterator[None]:
        self.link.count(waiting=1)
        try:
            yield
        finally:
            self.link.count(waiting=-1)

    def release(self, scope: str, claims: dict[str, str]) -> None:
        """Let go of claims this replica holds, through the writer (after the entries it wrote
        for them); compare-and-delete, so a claim that expired and was taken since stays."""
        for prompt, token in claims.items():
            self.writer.enqueue({"op": "unlock", "scope": scope, "prompt": prompt, "token": token})

    def removed(self, scope: str, prompt: str) -> None:
        self.writer.enqueue({"op": "del", "scope": scope, "prompt": prompt})

    def cleared(self, scope: str | None, under: bool = False) -> None:
        self.writer.enqueue(
            {
                "op": "clear",
                "scope": "" if scope is None else scope,
                "all": scope is None,
                "under": under and scope is not None,
            }
        )

    # ----------------------------------------------------------------------------- reads

    def fetch(self, pairs: list[tuple[str, str]]) -> list[SharedEntry]:
        """The live records of these (scope, prompt) pairs, read from Redis in one round trip:
        an exact repeat asked here right after another replica stored it is answered even
        while this replica's tail is behind. Nothing (and no wait) while Redis is away."""
        if not pairs or not self.link.breaker.connected:
            return []
        self.link.count(fetches=1)
        # what a queued delete or clear removes is not read: Redis holds it until the writer
        # has written the removal. One queued after this look is the cache's fence's to drop
        # (ReplicaSide.fetched)
        removing = self.writer.removals()
        if removing:
            pairs = [(s, p) for s, p in pairs if not any(covers(gs, gp, s, p, u) for gs, gp, u in removing)]
            if not pairs:
                return []
        try:
            pipe = self.redis.pipeline(transaction=False)
            for scope, prompt in pairs:
                pipe.hgetall(self.keys.record(scope, prompt))
            records = [r for r in pipe.execute() if r]
        except Exception:  # Redis away: the lookup goes on without it
            self.link.breaker.trip()
            return []
        now = time.time()
        embedder = self.tail.owner.embedder
        return [e for e in self.link.judged(records, embedder.name, embedder.dim)[0] if e.expires_at > now]
