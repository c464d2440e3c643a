"""The writer: this replica's events, written to Redis by one background thread, in order.

A request never waits on Redis: ``enqueue`` appends to a bounded queue and returns. The thread
writes the queue in batches, each record with its announcement in one transaction. While Redis
is away the events wait (up to ``pending_max``; past it the oldest go, counted as dropped, and
stay in this replica only); one event Redis refuses (not a connection failure) is dropped,
counted as poisoned, and never holds back the others.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import deque
from typing import Any

from gpucache.cache.replication import within
from gpucache.share.link import Link
from gpucache.share.records import entry_fields, text, utf8

log = logging.getLogger("gpucache.share")

WRITE_BATCH = 256  # events written per round trip
# compare-and-delete: a claim is released only by the replica that holds it
RELEASE_SCRIPT = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)


REMOVALS = ("del", "clear")  # the events after which Redis no longer holds what they name


class Writer:
    """The queue and the thread that writes it (``loop``); ``model`` is set when the share is
    attached to a cache (its embedder's name and dimension, written in every record)."""

    def __init__(self, link: Link, pending_max: int) -> None:
        self.link = link
        self.pending: deque[dict[str, Any]] = deque(maxlen=pending_max)
        self.wake = threading.Condition()
        self.model: tuple[str, int] = ("", 0)
        self._removing = 0  # deletes and clears in ``pending`` (``removals``)
        # registered once: a pipeline sends it by its SHA-1 (EVALSHA), loading it only where the
        # server does not have it, instead of the script's text with every release
        self.release = link.redis.register_script(RELEASE_SCRIPT)

    def enqueue(self, event: dict[str, Any]) -> None:
        with self.wake:
            if len(self.pending) == self.pending.maxlen:
                self._removing -= self.pending[0]["op"] in REMOVALS
                self.link.count(dropped=1)  # the oldest goes: it stays in this replica only
                if self.link.stats.dropped == 1:
                    log.warning(
                        "gpucache: more than %d shared events wait to be written; the oldest "
                        "are dropped (kept locally). Raise pending_max for bulk loads",
                        self.pending.maxlen,
                    )
            self.pending.append(event)
            self._removing += event["op"] in REMOVALS
            self.link.gauge(pending=len(self.pending))
            self.wake.notify()

    def removals(self) -> list[tuple[str | None, str | None, bool]]:
        """The deletes and clears queued and not yet written, as (scope, prompt, under): prompt
        None for a clear, scope None for a clear of everything, under True for a clear of a scope
        and those below it. Until one is written, Redis still holds what it removes
        (``RedisShare.fetch`` must not bring it back)."""
        with self.wake:
            if not self._removing:  # the common case: no walk of a queue of puts
                return []
            return [
                (
                    None if e.get("all") else e["scope"],
                    e.get("prompt") if e["op"] == "del" else None,
                    bool(e.get("under")),
                )
                for e in self.pending
                if e["op"] in REMOVALS
            ]

    def drain(self, timeout: float, running: bool) -> None:
        """Wait (up to ``timeout``) until the queue is written, while Redis answers."""
        with self.wake:
            self.wake.wait_for(
                lambda: not self.pending or not self.link.breaker.connected or not running, timeout
            )

    def stopped(self) -> None:
        """Wake the thread so it sees the link's stop event."""
        with self.wake:
            self.wake.notify_all()

    def loop(self) -> None:
        link = self.link
        while not link.stop.is_set():
            with self.wake:
                self.wake.wait_for(lambda: self.pending or link.stop.is_set())
                if link.stop.is_set():
                    return
                batch = list(itertools.islice(self.pending, WRITE_BATCH))
            try:
                self.write(batch)
            except link.transient as exc:  # Redis away: keep the events, retry with backoff
                link.failed(exc, "writing shared events")
                continue
            except Exception as exc:  # one event Redis refuses must not hold back the others
                log.warning(
                    "gpucache: a batch of %d shared events failed (%r); writing them one by one",
                    len(batch),
                    exc,
                )
                written, dropped = self._write_each(batch)
                link.count(written=-dropped)
                if written < len(batch):  # Redis went away meanwhile: the rest wait
                    batch = batch[:written]
                    link.failed(ConnectionError("Redis went away"), "writing shared events")
                    if not batch:
                        continue
            with self.wake:
                for event in batch:  # the oldest may have been dropped meanwhile (pending_max)
                    if self.pending and self.pending[0] is event:
                        self.pending.popleft()
                        self._removing -= event["op"] in REMOVALS
                link.gauge(pending=len(self.pending))
                self.wake.notify_all()  # close() may be waiting for the queue to drain
            link.count(written=len(batch))

    def _write_each(self, batch: list[dict[str, Any]]) -> tuple[int, int]:
        """The batch one event at a time: an event Redis refuses is dropped (counted, logged),
        the others are written. Returns how many events were dealt with before Redis itself
        failed (all of them, when it did not), and how many of those were dropped."""
        dropped = 0
        for done, event in enumerate(batch):
            try:
                self.write([event])
            except self.link.transient:
                return done, dropped
            except Exception as exc:
                dropped += 1
                self.link.count(poisoned=1)
                log.error(
                    "gpucache: dropped a shared %s event that cannot be written (%r); it "
                    "stays in this replica only",
                    event["op"],
                    exc,
                )
        return len(batch), dropped

    def write(self, batch: list[dict[str, Any]]) -> None:
        """Events in order, each record written or deleted with its announcement, in one
        transaction (one round trip for the batch)."""
        link, keys = self.link, self.link.keys
        pipe = link.redis.pipeline(transaction=True)
        for event in batch:
            if event["op"] == "unlock":
                self.release(
                    keys=[keys.claim(event["scope"], event["prompt"])], args=[event["token"]], client=pipe
                )
                continue  # not an event other replicas need
            # the writer, its sequence and the time, signed with the rest: what lets a replica
            # refuse this event, or the record it writes, once it is put back (replay.py). A
            # batch tried again gets new sequences: its events may reach the stream twice, and
            # both apply, as they would have before
            fields: dict[str, Any] = {
                "op": event["op"],
                "origin": link.origin,
                "seq": str(link.next_seq()),
                "scope": utf8(event["scope"]),
                "at": repr(time.time()),
            }
            if event["op"] == "put":
                record = keys.record(event["scope"], event["prompt"])
                pipe.hset(
                    record,
                    mapping=link.signer.signed(
                        entry_fields(
                            event["scope"],
                            event["prompt"],
                            event["response"],
                            event["expires_at"],
                            *self.model,
                            event["vector"],
                            link.origin,
                            fields["at"],
                            int(fields["seq"]),
                        )
                    ),
                )
                if math.isfinite(event["expires_at"]):
                    pipe.pexpireat(record, int(event["expires_at"] * 1000))
                fields["record"] = record
            elif event["op"] == "del":
                pipe.delete(keys.record(event["scope"], event["prompt"]))
                fields["prompt"] = utf8(event["prompt"])
            else:
                scope = None if event["all"] else event["scope"]
                for key in self._records_of(scope, event.get("under", False)):
                    pipe.delete(key)
                fields["all"] = "1" if event["all"] else "0"
                if event.get("under"):  # and the scopes below it (a revoked credential's)
                    fields["under"] = "1"
            pipe.xadd(keys.key("log"), link.signer.signed(fields), maxlen=link.maxlen, approximate=True)
        pipe.execute()
        link.breaker.succeeded()

    def _records_of(self, scope: str | None, under: bool = False) -> list[bytes]:
        """The record keys of ``scope`` (and of those below it, with ``under``; of every scope,
        with None)."""
        redis = self.link.redis
        keys = list(redis.scan_iter(match=self.link.keys.key("e:*"), count=1000))
        if scope is None or not keys:
            return keys
        pipe = redis.pipeline(transaction=False)
        for key in keys:
            pipe.hget(key, "scope")
        scopes = pipe.execute()
        if under:
            return [k for k, s in zip(keys, scopes) if s is not None and within(text(s), scope)]
        return [k for k, s in zip(keys, scopes) if s is not None and s == utf8(scope)]
