"""Replicas sharing entries through Redis or Valkey: ``SemanticCache(..., shared=RedisShare(url))``.

Each replica keeps its own index on its own device, and scans it alone: that is the part Redis
cannot do fast. What Redis holds is the log that feeds every index:

    {prefix}:meta        hash   model and dimension: a replica of another model refuses to join
    {prefix}:e:{key}     hash   one entry: scope, prompt, response, expiry, model, vector bytes,
                                and the replica that stored it; expires with the entry (PEXPIREAT)
    {prefix}:log         stream put / del / clear events, trimmed to about ``maxlen`` events

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

One module of over 400 lines: the writer, the tailer and the claims share the key layout, the
record format, the model check and the counters; apart, they would pass all of these around.

Authenticated records: with a ``secret`` (the same on every replica), every record and event
carries an HMAC of its fields, and a replica refuses (and counts) any that lacks the right one,
so anyone who can write to Redis but does not hold the secret cannot plant an answer in any
tenant's scope, nor invalidate one. ``gpucache serve --redis`` signs with a key derived from its
tenancy secret.

Single-flight holds across replicas: a replica about to load a miss first claims it in Redis
(SET NX PX, a random token, released by compare-and-delete after the entry is written); a
replica that finds the claim taken waits, within ``claim_wait``, for the entry, then loads it
itself. Not shared, per replica: the admission sketch (each replica admits from the traffic it
sees; sharing it would take a sketch of counters in Redis merged on each sighting).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gpucache.cache.replication import Replica, SharedEntry
from gpucache.cache.validation import MAX_TTL_SECONDS
from gpucache.keys import prompt_key

if TYPE_CHECKING:
    import redis

log = logging.getLogger("gpucache.share")


BOOTSTRAP_BATCH = 1000  # records read per round trip when a replica bootstraps
WRITE_BATCH = 256  # events written per round trip
CLAIM_POLL = 0.02  # seconds between looks for an entry another replica is loading
# compare-and-delete: a claim is released only by the replica that holds it
RELEASE_SCRIPT = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)


class SharedModelMismatch(ValueError):
    """The shared log was written by replicas of another model or dimension."""


@dataclass
class ShareStats:
    """What a replica's share did: events applied, written, refused, and Redis errors."""

    applied: int = 0
    written: int = 0
    fetches: int = 0  # lookups that read shared records (never while Redis is away)
    dropped: int = 0  # events dropped unwritten: more than pending_max waited at once
    waiting: int = 0  # calls waiting now for an entry another replica is loading
    bootstraps: int = 0
    refused: int = 0  # records of another model
    malformed: int = 0  # records or events that could not be read: skipped, counted, logged
    poisoned: int = 0  # events Redis refused to write (not a connection failure): dropped
    unsigned: int = 0  # records or events refused for a missing or wrong signature
    errors: int = 0
    pending: int = 0
    connected: bool = False
    extra: dict[str, int] = field(default_factory=dict)


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
    ) -> None:
        import redis as redis_module

        if secret is not None and len(secret) < 16:
            raise ValueError("the replication secret must be at least 16 bytes")
        self.secret = secret
        self.on_apply = on_apply
        self.claim_wait, self.claim_ttl = claim_wait, claim_ttl
        if maxlen < 1 or deadline <= 0 or pending_max < 1:
            raise ValueError("maxlen and pending_max must be >= 1 and deadline > 0")
        self.url, self.prefix, self.maxlen, self.deadline = url, prefix, maxlen, deadline
        self.origin = uuid.uuid4().hex  # this replica: its own events are not applied twice
        # typed Any: redis-py's stubs type every reply as a union of its sync and async forms
        self.redis: Any = client or redis_module.Redis.from_url(
            url, socket_timeout=deadline, socket_connect_timeout=deadline
        )
        self.stats = ShareStats()
        self._errors: tuple[type[BaseException], ...] = (redis_module.RedisError, OSError)
        # Redis or the way to it failing: the event waits and is written later. Anything else
        # (Redis refusing a command, a value that cannot be encoded) fails again on every try.
        self._transient: tuple[type[Exception], ...] = (
            redis_module.ConnectionError, redis_module.TimeoutError, OSError)
        self._pending: deque[dict[str, Any]] = deque(maxlen=pending_max)
        self._wake = threading.Condition()
        self._applied = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._cache: Replica | None = None
        self._last_id: str | None = None  # the last stream id applied; None: bootstrap first

    # ----------------------------------------------------------------------------- life

    remote = True  # other replicas may exist (``gpucache.cache.replication.Replication``)

    def attach(self, cache: Replica) -> None:
        """Join the shared log as ``cache``: check the model, then start writing and tailing.
        Raises ``SharedModelMismatch`` when the log holds another model's vectors. A share
        that was closed may be attached again: it catches up from where it stopped."""
        self._cache = cache
        self._stop.clear()
        model, dim = cache.embedder.name, cache.embedder.dim
        try:
            self.redis.hsetnx(self._key("meta"), "model", model)
            self.redis.hsetnx(self._key("meta"), "dim", str(dim))
            meta = self.redis.hgetall(self._key("meta"))
            self.stats.connected = True
        except self._errors as exc:  # Redis is away: join blind, check once it is back
            log.warning("gpucache: Redis at %s is unreachable (%r); serving locally", self.url, exc)
            meta = {}
        self._check_model(meta)
        for target in (self._write_loop, self._tail_loop):
            thread = threading.Thread(target=target, name=f"gpucache-share-{target.__name__}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self, flush_timeout: float = 5.0) -> None:
        """Write what is pending (for up to ``flush_timeout`` seconds, while Redis answers),
        then stop the background threads."""
        with self._wake:
            self._wake.wait_for(
                lambda: not self._pending or not self.stats.connected or not self._threads, flush_timeout
            )
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        for thread in self._threads:
            thread.join(5)
        self._threads.clear()

    def wait_for(self, predicate: Callable[[ShareStats], bool], timeout: float | None = None) -> bool:
        """Block until ``predicate(stats)`` holds; False on timeout. For tests and diagnostics:
        "replica B has seen replica A's entry" is an event."""
        with self._applied:
            return self._applied.wait_for(lambda: predicate(self.stats), timeout)

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
            self.stats.poisoned += len(items)
            log.error("gpucache: %d entries expire past what Redis accepts (%r): kept in this "
                      "replica only", len(items), expires_at)
            return
        rows = vectors.detach().to("cpu", torch.float32).numpy()
        for (prompt, response), vector in zip(items, rows):
            self._enqueue(
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
        if not self.stats.connected:
            return {}, []
        tokens = {p: uuid.uuid4().hex for p in prompts}
        try:
            pipe = self.redis.pipeline(transaction=False)
            for prompt, token in tokens.items():
                pipe.set(self._claim_key(scope, prompt), token, nx=True, px=int(self.claim_ttl * 1000))
            got = pipe.execute()
        except Exception:
            self.stats.errors += 1
            self.stats.connected = False
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
                self._stop.wait(CLAIM_POLL)

    async def await_loaded(self, scope: str, prompts: list[str]) -> list[SharedEntry]:
        """``wait_loaded`` for the event loop: it waits between looks with ``asyncio.sleep``
        and holds a worker thread only for each look's round trip, so any number of waits
        leave the threads that lookups run in free."""
        import asyncio

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
            held = self.redis.exists(*(self._claim_key(scope, p) for p in prompts))
        except Exception:
            return found, True
        if held == 0:  # released: stored meanwhile (read once more), or given up
            return self.fetch(pairs), True
        return found, False

    @contextmanager
    def _waiting(self) -> Iterator[None]:
        with self._applied:
            self.stats.waiting += 1
            self._applied.notify_all()
        try:
            yield
        finally:
            with self._applied:
                self.stats.waiting -= 1
                self._applied.notify_all()

    def release(self, scope: str, claims: dict[str, str]) -> None:
        """Let go of claims this replica holds, through the writer (after the entries it wrote
        for them); compare-and-delete, so a claim that expired and was taken since stays."""
        for prompt, token in claims.items():
            self._enqueue({"op": "unlock", "scope": scope, "prompt": prompt, "token": token})

    def removed(self, scope: str, prompt: str) -> None:
        self._enqueue({"op": "del", "scope": scope, "prompt": prompt})

    def cleared(self, scope: str | None) -> None:
        self._enqueue({"op": "clear", "scope": "" if scope is None else scope, "all": scope is None})

    def _enqueue(self, event: dict[str, Any]) -> None:
        with self._wake:
            if len(self._pending) == self._pending.maxlen:
                self.stats.dropped += 1  # the oldest goes: it stays in this replica only
                if self.stats.dropped == 1:
                    log.warning(
                        "gpucache: more than %d shared events wait to be written; the oldest "
                        "are dropped (kept locally). Raise pending_max for bulk loads",
                        self._pending.maxlen,
                    )
            self._pending.append(event)
            self.stats.pending = len(self._pending)
            self._wake.notify()

    def _write_loop(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            with self._wake:
                self._wake.wait_for(lambda: self._pending or self._stop.is_set())
                if self._stop.is_set():
                    return
                batch = list(itertools.islice(self._pending, WRITE_BATCH))
            try:
                self._write(batch)
            except self._transient as exc:  # Redis away: keep the events, retry with backoff
                backoff = self._failed(exc, "writing shared events", backoff)
                continue
            except Exception as exc:  # one event Redis refuses must not hold back the others
                log.warning("gpucache: a batch of %d shared events failed (%r); writing them one "
                            "by one", len(batch), exc)
                written, dropped = self._write_each(batch)
                self._count_written(-dropped)
                if written < len(batch):  # Redis went away meanwhile: the rest wait
                    batch = batch[:written]
                    backoff = self._failed(ConnectionError("Redis went away"), "writing shared events",
                                           backoff)
                    if not batch:
                        continue
            backoff = 0.05
            with self._wake:
                for event in batch:  # the oldest may have been dropped meanwhile (pending_max)
                    if self._pending and self._pending[0] is event:
                        self._pending.popleft()
                self.stats.pending = len(self._pending)
                self._wake.notify_all()  # close() may be waiting for the queue to drain
            with self._applied:
                self.stats.written += len(batch)
                self._applied.notify_all()

    def _write_each(self, batch: list[dict[str, Any]]) -> tuple[int, int]:
        """The batch one event at a time: an event Redis refuses is dropped (counted, logged),
        the others are written. Returns how many events were dealt with before Redis itself
        failed (all of them, when it did not), and how many of those were dropped."""
        dropped = 0
        for done, event in enumerate(batch):
            try:
                self._write([event])
            except self._transient:
                return done, dropped
            except Exception as exc:
                dropped += 1
                self.stats.poisoned += 1
                log.error("gpucache: dropped a shared %s event that cannot be written (%r); it "
                          "stays in this replica only", event["op"], exc)
        return len(batch), dropped

    def _count_written(self, n: int) -> None:
        with self._applied:
            self.stats.written += n
            self._applied.notify_all()

    def _write(self, batch: list[dict[str, Any]]) -> None:
        """Events in order, each record written or deleted with its announcement, in one
        transaction (one round trip for the batch)."""
        cache = self._owner
        pipe = self.redis.pipeline(transaction=True)
        for event in batch:
            fields: dict[str, Any] = {
                "op": event["op"],
                "origin": self.origin,
                "scope": _utf8(event["scope"]),
                "at": repr(time.time()),
            }
            if event["op"] == "put":
                record = self._record_key(event["scope"], event["prompt"])
                pipe.hset(
                    record,
                    mapping=self._signed({
                        "scope": _utf8(event["scope"]),
                        "prompt": _utf8(event["prompt"]),
                        "response": _utf8(event["response"]),
                        "expires_at": repr(event["expires_at"]),
                        "model": cache.embedder.name,
                        "dim": str(cache.embedder.dim),
                        "vector": event["vector"],
                        "origin": self.origin,
                        "at": fields["at"],
                    }),
                )
                if math.isfinite(event["expires_at"]):
                    pipe.pexpireat(record, int(event["expires_at"] * 1000))
                fields["record"] = record
            elif event["op"] == "unlock":
                pipe.eval(RELEASE_SCRIPT, 1, self._claim_key(event["scope"], event["prompt"]), event["token"])
                continue  # not an event other replicas need
            elif event["op"] == "del":
                pipe.delete(self._record_key(event["scope"], event["prompt"]))
                fields["prompt"] = _utf8(event["prompt"])
            else:
                for key in self._records_of(None if event["all"] else event["scope"]):
                    pipe.delete(key)
                fields["all"] = "1" if event["all"] else "0"
            pipe.xadd(self._key("log"), self._signed(fields), maxlen=self.maxlen, approximate=True)
        pipe.execute()
        self.stats.connected = True

    def _records_of(self, scope: str | None) -> list[bytes]:
        """The record keys of ``scope`` (of every scope, with None)."""
        keys = list(self.redis.scan_iter(match=self._key("e:*"), count=1000))
        if scope is None or not keys:
            return keys
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.hget(key, "scope")
        scopes = pipe.execute()
        return [k for k, s in zip(keys, scopes) if s is not None and s == _utf8(scope)]

    # ----------------------------------------------------------------------------- reads

    def fetch(self, pairs: list[tuple[str, str]]) -> list[SharedEntry]:
        """The live records of these (scope, prompt) pairs, read from Redis in one round trip:
        an exact repeat asked here right after another replica stored it is answered even
        while this replica's tail is behind. Nothing (and no wait) while Redis is away."""
        if not pairs or not self.stats.connected:
            return []
        self.stats.fetches += 1
        try:
            pipe = self.redis.pipeline(transaction=False)
            for scope, prompt in pairs:
                pipe.hgetall(self._record_key(scope, prompt))
            records = [r for r in pipe.execute() if r]
        except Exception:  # Redis away: the lookup goes on without it
            self.stats.errors += 1
            self.stats.connected = False
            return []
        now = time.time()
        return [e for e in self._entries_of(records) if e.expires_at > now]

    def _tail_loop(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            try:
                if self._last_id is None or self._trimmed():
                    self._bootstrap()
                replies = self.redis.xread(
                    {self._key("log"): self._last_id or "0-0"},
                    count=512,
                    block=max(1, int(self.deadline * 1000 / 2)),
                )
                for _, events in replies or []:
                    for event_id, fields in events:
                        try:
                            self._apply_event(fields)
                        except self._transient:
                            raise  # Redis away: this event is read again once it is back
                        except Exception as exc:  # one bad event must not stop the tail
                            self._malformed("event", event_id, exc)
                        self._last_id = event_id.decode()
                self.stats.connected = True
                backoff = 0.05
            except Exception as exc:  # Redis away (or a bug): reconnect with backoff, never die
                backoff = self._failed(exc, "tailing the shared log", backoff)

    def _failed(self, exc: Exception, doing: str, backoff: float) -> float:
        """Count a failure, log it if it is not Redis being away, wait; the next backoff."""
        self.stats.errors += 1
        self.stats.connected = False
        if not isinstance(exc, self._errors):
            log.error("gpucache: %s failed", doing, exc_info=exc)
        self._stop.wait(backoff)
        return min(backoff * 2, 2.0)

    def _trimmed(self) -> bool:
        """Whether the stream was trimmed past the last event applied here (events this replica
        has not seen may be gone: it must bootstrap). Trimmed exactly to that event also reads
        as trimmed: an extra bootstrap, never a missed entry."""
        if self._last_id is None:
            return True
        first = self.redis.xrange(self._key("log"), count=1)
        return bool(first) and _id_after(first[0][0].decode(), self._last_id)

    def _bootstrap(self) -> None:
        """Every live record, then the stream from this replica's join event, added before the
        records were read: an event written meanwhile is applied twice, never missed."""
        start = self.redis.xadd(
            self._key("log"), {"op": "join", "origin": self.origin}, maxlen=self.maxlen, approximate=True
        )
        keys = list(self.redis.scan_iter(match=self._key("e:*"), count=BOOTSTRAP_BATCH))
        for first in range(0, len(keys), BOOTSTRAP_BATCH):
            pipe = self.redis.pipeline(transaction=False)
            for key in keys[first : first + BOOTSTRAP_BATCH]:
                pipe.hgetall(key)
            records = [r for r in pipe.execute() if r]  # expired since the scan: skipped
            if records:
                self._apply_records(records)
        self._last_id = start.decode() if isinstance(start, bytes) else str(start)
        with self._applied:
            self.stats.bootstraps += 1
            self.stats.connected = True
            self._applied.notify_all()

    def _apply_event(self, fields: dict[Any, Any]) -> None:
        f = {k.decode(): v for k, v in fields.items()}
        if f.get("origin", b"").decode() == self.origin:
            return
        if f.get("op") == b"join":  # a replica joined: nothing to apply (and nothing to check)
            return
        if not self._verified(fields, "event"):
            return
        cache = self._owner
        op = f["op"].decode()
        if op == "join":  # a replica joined: nothing to apply
            return
        if op == "put":
            record = self.redis.hgetall(f["record"].decode())
            if record:  # gone already (deleted, expired): never served
                self._apply_record(record)
                return
        elif op == "del":
            cache.apply_replicated_removal(_text(f["scope"]), _text(f["prompt"]))
        elif op == "clear":
            cache.apply_replicated_clear(None if f.get("all") == b"1" else _text(f["scope"]))
        else:
            raise ValueError(f"unknown op {op!r}")
        self._count_applied()

    def _apply_record(self, record: dict[Any, Any]) -> None:
        self._apply_records([record])

    def _apply_records(self, records: list[dict[Any, Any]]) -> None:
        """Records into the local index, one batch under the cache's lock."""
        entries = self._entries_of(records)
        self._owner.apply_replicated(entries)
        if self.on_apply is not None and entries:
            self.on_apply(entries, [e.written_at for e in entries])
        with self._applied:
            self.stats.applied += len(entries)
            self._applied.notify_all()

    def _entries_of(self, records: list[dict[Any, Any]]) -> list[SharedEntry]:
        """Records as entries; another model's are refused, loudly, and one that cannot be
        read (a field missing, bad UTF-8, a vector of the wrong length) is skipped and
        counted: it must not stop the others, in the tail or in a bootstrap."""
        cache = self._owner
        entries = []
        for record in records:
            if not self._verified(record, "record"):
                continue
            try:
                model, dim = record.get(b"model", b"").decode(), int(record.get(b"dim", b"0"))
            except (ValueError, UnicodeDecodeError) as exc:
                self._malformed("record", record.get(b"prompt", b"?")[:40], exc)
                continue
            if (model, dim) != (cache.embedder.name, cache.embedder.dim):
                self.stats.refused += 1
                log.error(
                    "gpucache: refused a shared entry of model %r (dim %s): this replica runs %r",
                    model,
                    dim,
                    cache.embedder.name,
                )
                continue
            try:
                vector_bytes = record[b"vector"]
                if len(vector_bytes) != 4 * dim:
                    raise ValueError(f"a vector of {len(vector_bytes)} bytes for dimension {dim}")
                values = np.frombuffer(vector_bytes, dtype="<f4")
                if not np.isfinite(values).all():  # an inf would score above any threshold
                    raise ValueError("a vector that is not finite")
                vector = torch.from_numpy(values.copy())
                entry = SharedEntry(
                    _text(record[b"scope"]),
                    _text(record[b"prompt"]),
                    _text(record[b"response"]),
                    float(record[b"expires_at"]),
                    vector,
                    float(record.get(b"at", b"nan")),
                )
            except (KeyError, ValueError, UnicodeDecodeError) as exc:
                self._malformed("record", record.get(b"prompt", b"?")[:40], exc)
                continue
            entries.append(entry)
        return entries

    def _signed(self, fields: dict[str, Any]) -> dict[str, Any]:
        """``fields`` with their signature added, where this share has a secret."""
        if self.secret is None:
            return fields
        return {**fields, "mac": self._mac({k.encode(): _as_bytes(v) for k, v in fields.items()})}

    def _mac(self, fields: dict[bytes, bytes]) -> str:
        """An HMAC over every field but the signature, sorted and length-prefixed: no two
        mappings sign alike, whatever their values hold."""
        assert self.secret is not None
        mac = hmac.new(self.secret, digestmod=hashlib.sha256)
        for name in sorted(fields):
            if name == b"mac":
                continue
            for part in (name, fields[name]):
                mac.update(len(part).to_bytes(8, "big"))
                mac.update(part)
        return mac.hexdigest()

    def _verified(self, fields: dict[Any, Any], what: str) -> bool:
        """Whether a record or event read back carries this share's signature (always, with
        no secret); refused ones are counted and logged."""
        if self.secret is None:
            return True
        given = fields.get(b"mac")
        if isinstance(given, bytes) and hmac.compare_digest(given, self._mac(fields).encode()):
            return True
        self.stats.unsigned += 1
        log.error("gpucache: refused a shared %s without a valid signature (prefix %r)", what, self.prefix)
        with self._applied:
            self._applied.notify_all()
        return False

    def _malformed(self, what: str, which: Any, exc: BaseException) -> None:
        """A record or event that cannot be read: counted, logged, passed over."""
        self.stats.malformed += 1
        log.error("gpucache: skipped a shared %s that cannot be read (%r): %r", what, which, exc)
        with self._applied:
            self._applied.notify_all()

    def _count_applied(self) -> None:
        with self._applied:
            self.stats.applied += 1
            self._applied.notify_all()

    # ----------------------------------------------------------------------------- keys

    def _check_model(self, meta: dict[Any, Any]) -> None:
        cache = self._owner
        model = meta.get(b"model", cache.embedder.name.encode()).decode()
        dim = int(meta.get(b"dim", str(cache.embedder.dim).encode()))
        if (model, dim) != (cache.embedder.name, cache.embedder.dim):
            raise SharedModelMismatch(
                f"the shared cache at {self.url} (prefix {self.prefix!r}) holds vectors of model "
                f"{model!r} ({dim} dimensions); this replica runs {cache.embedder.name!r} "
                f"({cache.embedder.dim}): give it another prefix, or the same model"
            )

    @property
    def _owner(self) -> Replica:
        if self._cache is None:
            raise RuntimeError("gpucache bug: a RedisShare used before attach()")
        return self._cache

    def _key(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    def _claim_key(self, scope: str, prompt: str) -> str:
        return self._key(f"claim:{prompt_key(scope, prompt).hex()}")

    def _record_key(self, scope: str, prompt: str) -> str:
        return self._key(f"e:{prompt_key(scope, prompt).hex()}")


def _utf8(text: str) -> bytes:
    """A text as Redis stores it: UTF-8, a lone surrogate (legal in a Python str, valid in
    JSON, refused by a strict encoder) kept rather than failing the write."""
    return text.encode("utf-8", "surrogatepass")


def _as_bytes(value: Any) -> bytes:
    """A field value as Redis will hold it (what redis-py sends for a str, bytes or number)."""
    if isinstance(value, bytes):
        return value
    return str(value).encode()


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")


def _id_after(a: str, b: str) -> bool:
    """Whether stream id ``a`` comes after ``b``."""
    ams, aseq = (int(x) for x in a.split("-"))
    bms, bseq = (int(x) for x in b.split("-"))
    return (ams, aseq) > (bms, bseq)
