"""One replica's link to the shared log: the Redis client, the key layout, the signer, this
replica's origin and its sequence, what it has seen of the others' (the replay guard), the
counters, and the condition every change to them is announced on. The writer (writer.py), the
tail (tail.py) and the facade (redis.py) each hold the one link.

Why a condition on the counters: "replica B has applied replica A's entry" is an event, and
tests and callers wait on it (``RedisShare.wait_for``) instead of sleeping. Every counter changes
through ``Link.count`` and the connection's state through the ``Breaker``, both under it.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpucache.extras import missing

try:
    from redis.backoff import ExponentialBackoff
except ImportError as exc:  # the share extra
    raise missing("share", __name__, exc) from exc

from gpucache.cache.replication import SharedEntry
from gpucache.share.records import Keys, Refusal, Signer, decode_entries, text, version_of
from gpucache.share.replay import ReplayGuard, Version

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
    replayed: int = 0  # signed records or events refused as replays (replay.py)
    tombstones: int = 0  # deletes and clears remembered against replays (at most max_tombstones)
    errors: int = 0
    pending: int = 0
    connected: bool = False  # the breaker's state (Breaker): Redis answered this replica last
    extra: dict[str, int] = field(default_factory=dict)


class Breaker:
    """Whether this replica asks Redis now, and how long a thread that met a failure waits
    before it tries again. Closed (``connected``) while Redis answers; a failure anywhere (the
    writer, the tail, a lookup's claim or fetch) trips it open, and while it is open lookups do
    without Redis at once instead of each waiting out a timeout; the writer's or the tail's next
    success closes it. One per link, so the three threads that use Redis agree on one fact; its
    state lives in ``ShareStats.connected`` and changes under the link's condition, so a waiter
    sees it. The wait is redis-py's ``ExponentialBackoff``: 50 ms, doubling to 2 s, from the
    first failure since the last success."""

    FIRST_S, CAP_S = 0.05, 2.0

    def __init__(self, stats: ShareStats, changed: threading.Condition) -> None:
        self._stats, self._changed = stats, changed
        self._backoff = ExponentialBackoff(cap=self.CAP_S, base=self.FIRST_S)
        self._failures = 0

    @property
    def connected(self) -> bool:
        return self._stats.connected

    def succeeded(self) -> None:
        """Redis answered: closed, and the next failure waits the shortest time again."""
        with self._changed:
            self._failures = 0
            if not self._stats.connected:
                self._stats.connected = True
                self._changed.notify_all()

    def trip(self) -> float:
        """Redis failed: open, the error counted; how long the caller waits before trying again."""
        with self._changed:
            delay = self._backoff.compute(self._failures)
            self._failures += 1
            self._stats.connected = False
            self._stats.errors += 1
            self._changed.notify_all()
        return delay


class Link:
    """The parts every side of a share uses (see the module's docstring).

    ``errors``: what Redis being away or refusing raises; ``transient``: those of them that
    mean Redis or the way to it failed (a write waits and is retried). Anything else (Redis
    refusing a command, a value that cannot be encoded) fails again on every try."""

    def __init__(
        self,
        client: Any,
        prefix: str,
        maxlen: int,
        deadline: float,
        secret: bytes | None,
        errors: tuple[type[Exception], ...],
        transient: tuple[type[Exception], ...],
        guard: ReplayGuard | None = None,
    ) -> None:
        # typed Any: redis-py's stubs type every reply as a union of its sync and async forms
        self.redis: Any = client
        self.prefix, self.maxlen, self.deadline = prefix, maxlen, deadline
        self.keys = Keys(prefix)
        self.signer = Signer(secret)
        self.origin = uuid.uuid4().hex  # this replica as a writer: its own events are not applied twice
        self.seq = 0  # the sequence of the last event this replica signed (the writer's thread)
        # replays can be told apart only where records and events are signed (replay.py)
        self.guard = guard if secret is not None else None
        self.stats = ShareStats()
        self.changed = threading.Condition()
        self.breaker = Breaker(self.stats, self.changed)
        self.stop = threading.Event()
        self.errors, self.transient = errors, transient

    def count(self, **deltas: int) -> None:
        """Add to counters and announce it."""
        with self.changed:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)
            self.changed.notify_all()

    def gauge(self, **values: int) -> None:
        """Set counters that say how many there are now (``pending``, ``tombstones``)."""
        with self.changed:
            for name, value in values.items():
                setattr(self.stats, name, value)
            self.changed.notify_all()

    def wait_for(self, predicate: Callable[[ShareStats], bool], timeout: float | None) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: predicate(self.stats), timeout)

    def failed(self, exc: Exception, doing: str) -> None:
        """A thread's failure: the breaker tripped, logged where it is not Redis being away,
        then the breaker's wait (cut short by ``stop``)."""
        delay = self.breaker.trip()
        if not isinstance(exc, self.errors):
            log.error("gpucache: %s failed", doing, exc_info=exc)
        self.stop.wait(delay)

    def next_seq(self) -> int:
        """The sequence of the next event this replica signs (called by the writer's thread)."""
        self.seq += 1
        return self.seq

    def judged(
        self, records: list[dict[Any, Any]], model: str, dim: int, announced: Version | None = None
    ) -> tuple[list[SharedEntry], list[Refusal]]:
        """The records this replica can apply (records.py checks each), and the refusals (each
        already counted and logged). ``announced``: the version a put event names for its record
        (the tail), else None (a fetch or a bootstrap: no event vouches for the record's place)."""
        guard = self.guard
        judge = None if guard is None else lambda record: self._judge(guard, self.keys, record, announced)
        entries, refusals = decode_entries(records, model, dim, self.signer, judge)
        for refusal in refusals:
            self.refused(refusal, "record")
        return entries, refusals

    @staticmethod
    def _judge(
        guard: ReplayGuard, keys: Keys, record: dict[Any, Any], announced: Version | None
    ) -> Refusal | None:
        """A signed record against what this replica has applied. The record a put event names
        is applied as it comes in the stream's order; any other is refused where it is older
        than a delete or a clear applied here, than the latest put of its key read here, or
        than the event that names its key; a newer one is passed over (its own event follows)."""
        which = record.get(b"prompt", b"?")[:40]
        try:
            version = version_of(record, record=True)
            scope, prompt = text(record[b"scope"]), text(record[b"prompt"])
        except (KeyError, ValueError, UnicodeDecodeError) as exc:
            return Refusal("malformed", which, repr(exc))
        if announced is not None and (version.origin, version.seq) == (announced.origin, announced.seq):
            return None
        older = guard.older_than_a_tombstone(scope, prompt, version) or guard.overwritten(
            keys.record(scope, prompt), version
        )
        if older is not None:
            return Refusal("replayed", which, older)
        if announced is not None:
            if version.origin == announced.origin and version.seq < announced.seq:
                return Refusal(
                    "replayed",
                    which,
                    f"sequence {version.seq} where its put event "
                    f"names {announced.seq}: an older record put back",
                )
            return Refusal("superseded", which, "replaced since its put event")
        return None

    def refused(self, refusal: Refusal, what: str) -> None:
        """A record or event not applied: counted by kind, logged, passed over."""
        if refusal.kind == "unsigned":
            log.error(
                "gpucache: refused a shared %s without a valid signature (prefix %r)", what, self.prefix
            )
            self.count(unsigned=1)
        elif refusal.kind == "replayed":
            log.error("gpucache: refused a replayed shared %s (%r): %s", what, refusal.which, refusal.reason)
            self.count(replayed=1)
        elif refusal.kind == "superseded":
            log.debug("gpucache: passed over a shared record replaced since its event (%r)", refusal.which)
        elif refusal.kind == "refused":
            log.error("gpucache: refused a shared entry of %s", refusal.reason)
            self.count(refused=1)
        else:
            log.error(
                "gpucache: skipped a shared %s that cannot be read (%r): %s",
                what,
                refusal.which,
                refusal.reason,
            )
            self.count(malformed=1)
