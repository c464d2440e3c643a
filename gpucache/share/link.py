"""One replica's link to the shared log: the Redis client, the key layout, the signer, this
replica's origin, the counters, and the condition every change to them is announced on. The
writer (writer.py), the tail (tail.py) and the facade (redis.py) each hold the one link.

Why a condition on the counters: "replica B has applied replica A's entry" is an event, and
tests and callers wait on it (``RedisShare.wait_for``) instead of sleeping.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpucache.cache.replication import SharedEntry
from gpucache.share.records import Keys, Refusal, Signer, decode_entries

log = logging.getLogger("gpucache.share")


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


class Link:
    """The parts every side of a share uses (see the module's docstring).

    ``errors``: what Redis being away or refusing raises; ``transient``: those of them that
    mean Redis or the way to it failed (a write waits and is retried). Anything else (Redis
    refusing a command, a value that cannot be encoded) fails again on every try."""

    def __init__(
        self, client: Any, url: str, prefix: str, maxlen: int, deadline: float, secret: bytes | None,
        errors: tuple[type[Exception], ...], transient: tuple[type[Exception], ...],
    ) -> None:
        # typed Any: redis-py's stubs type every reply as a union of its sync and async forms
        self.redis: Any = client
        self.url, self.prefix, self.maxlen, self.deadline = url, prefix, maxlen, deadline
        self.keys = Keys(prefix)
        self.signer = Signer(secret)
        self.origin = uuid.uuid4().hex  # this replica: its own events are not applied twice
        self.stats = ShareStats()
        self.changed = threading.Condition()
        self.stop = threading.Event()
        self.errors, self.transient = errors, transient

    def count(self, **deltas: int) -> None:
        """Add to counters and announce it."""
        with self.changed:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)
            self.changed.notify_all()

    def set_connected(self, connected: bool) -> None:
        with self.changed:
            self.stats.connected = connected
            self.changed.notify_all()

    def wait_for(self, predicate: Callable[[ShareStats], bool], timeout: float | None) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: predicate(self.stats), timeout)

    def failed(self, exc: Exception, doing: str, backoff: float) -> float:
        """Count a failure, log it if it is not Redis being away, wait; the next backoff."""
        self.stats.errors += 1
        self.stats.connected = False
        if not isinstance(exc, self.errors):
            log.error("gpucache: %s failed", doing, exc_info=exc)
        self.stop.wait(backoff)
        return min(backoff * 2, 2.0)

    def decoded(self, records: list[dict[Any, Any]], model: str, dim: int) -> list[SharedEntry]:
        """The records this replica can apply (records.py checks each); the others counted."""
        entries, refusals = decode_entries(records, model, dim, self.signer)
        for refusal in refusals:
            self.refused(refusal, "record")
        return entries

    def refused(self, refusal: Refusal, what: str) -> None:
        """A record or event not applied: counted by kind, logged, passed over."""
        if refusal.kind == "unsigned":
            log.error("gpucache: refused a shared %s without a valid signature (prefix %r)", what,
                      self.prefix)
            self.count(unsigned=1)
        elif refusal.kind == "refused":
            log.error("gpucache: refused a shared entry of %s", refusal.reason)
            self.count(refused=1)
        else:
            log.error("gpucache: skipped a shared %s that cannot be read (%r): %s", what,
                      refusal.which, refusal.reason)
            self.count(malformed=1)
