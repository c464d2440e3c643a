"""The tail: other replicas' events, read from the stream by one background thread and applied
to this replica's index.

The thread reads the stream (XREAD BLOCK from the last id it applied). A replica that starts, or
that finds the stream trimmed past that id (it was away too long), first bootstraps from the
records (SCAN), then tails from the join event it added before reading them, so nothing falls
between. One event or record that cannot be read is counted and passed over: it must not stop
the tail. Redis going away stops nothing either: the thread reconnects with backoff.

With a secret, every signed event goes through the replay guard (replay.py) before it is
applied, this replica's own included (they are not applied here, but its deletes and clears
are remembered as tombstones, and a replay of one of them must not make a new tombstone). A
bootstrap first reads the stream's last ``LEARN_WINDOWS`` windows before its join event into
the guard, applying nothing, so that the replica knows every writer's sequence and the recent
deletes before it reads a record or tails an event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpucache.cache.replication import Replica, SharedEntry
from gpucache.share.link import Link
from gpucache.share.records import Refusal, id_after, text, version_of
from gpucache.share.replay import LEARN_WINDOWS, Version

BOOTSTRAP_BATCH = 1000  # records read per round trip when a replica bootstraps


class Tail:
    """Applies the shared log to ``replica`` (set when the share is attached)."""

    def __init__(self, link: Link, on_apply: Callable[[list[SharedEntry], list[float]], None] | None) -> None:
        self.link = link
        self.on_apply = on_apply
        self.replica: Replica | None = None
        self.last_id: str | None = None  # the last stream id applied; None: bootstrap first

    @property
    def owner(self) -> Replica:
        if self.replica is None:
            raise RuntimeError("gpucache bug: a shared log tailed before attach()")
        return self.replica

    def loop(self) -> None:
        link = self.link
        while not link.stop.is_set():
            try:
                if self.last_id is None or self._trimmed():
                    self._bootstrap()
                replies = link.redis.xread(
                    {link.keys.key("log"): self.last_id or "0-0"},
                    count=512,
                    block=max(1, int(link.deadline * 1000 / 2)),
                )
                for _, events in replies or []:
                    for event_id, fields in events:
                        try:
                            self._apply_event(event_id, fields)
                        except link.transient:
                            raise  # Redis away: this event is read again once it is back
                        except Exception as exc:  # one bad event must not stop the tail
                            link.refused(Refusal("malformed", event_id, repr(exc)), "event")
                        self.last_id = event_id.decode()
                link.breaker.succeeded()
            except Exception as exc:  # Redis away (or a bug): reconnect with backoff, never die
                link.failed(exc, "tailing the shared log")

    def _trimmed(self) -> bool:
        """Whether the stream was trimmed past the last event applied here (events this replica
        has not seen may be gone: it must bootstrap). Trimmed exactly to that event also reads
        as trimmed: an extra bootstrap, never a missed entry."""
        if self.last_id is None:
            return True
        first = self.link.redis.xrange(self.link.keys.key("log"), count=1)
        return bool(first) and id_after(first[0][0].decode(), self.last_id)

    def _bootstrap(self) -> None:
        """Every live record, then the stream from this replica's join event, added before the
        records were read: an event written meanwhile is applied twice, never missed."""
        link = self.link
        start = link.redis.xadd(
            link.keys.key("log"), {"op": "join", "origin": link.origin}, maxlen=link.maxlen, approximate=True
        )
        start_id = start.decode() if isinstance(start, bytes) else str(start)
        self._learn(start_id)
        keys = list(link.redis.scan_iter(match=link.keys.key("e:*"), count=BOOTSTRAP_BATCH))
        for first in range(0, len(keys), BOOTSTRAP_BATCH):
            pipe = link.redis.pipeline(transaction=False)
            for key in keys[first : first + BOOTSTRAP_BATCH]:
                pipe.hgetall(key)
            records = [r for r in pipe.execute() if r]  # expired since the scan: skipped
            if records:
                self.apply_records(records)
        self.last_id = start_id
        link.breaker.succeeded()
        link.count(bootstraps=1)

    def _learn(self, start_id: str) -> None:
        """The stream's events from ``LEARN_WINDOWS`` windows before ``start_id`` up to it, into
        the replay guard only: the writers' sequences and the deletes and clears (applied
        already, or they would not be in the records the bootstrap reads next). A replay among
        them is passed over uncounted (it was counted, or not, when it was added; a second
        bootstrap reads the same events again)."""
        link, guard = self.link, self.link.guard
        if guard is None:
            return
        ms = int(start_id.split("-")[0])
        cursor = f"{max(0, ms - int(LEARN_WINDOWS * guard.window * 1000))}-0"
        while True:
            events = link.redis.xrange(link.keys.key("log"), min=cursor, max=start_id, count=BOOTSTRAP_BATCH)
            for event_id, fields in events:
                try:
                    self._admitted(event_id, fields)
                except (KeyError, ValueError, UnicodeDecodeError):  # counted when it was tailed
                    pass
            if len(events) < BOOTSTRAP_BATCH:
                return
            last_ms, last_seq = (int(x) for x in events[-1][0].decode().split("-"))
            cursor = f"{last_ms}-{last_seq + 1}"

    def _admitted(self, event_id: bytes, fields: dict[Any, Any]) -> tuple[str, dict[str, Any]] | None:
        """An event's op and fields where it is signed and, with a guard, no replay (its
        writer's sequence moved to it and, for a delete or a clear, the tombstone made); None
        where it is not. Raises for an event that cannot be read."""
        link = self.link
        f = {k.decode(): v for k, v in fields.items()}
        op = f.get("op", b"").decode()
        if op == "join" or not link.signer.verified(fields):
            return None
        guard = link.guard
        if guard is None:
            return op, f
        try:
            version = version_of(fields, record=False)
        except ValueError as exc:  # signed, so written by a gpucache from before sequences
            raise Replayed(f"no sequence to tell it from a replay ({exc})") from exc
        why = guard.admit(version, int(event_id.decode().split("-")[0]))
        if why is not None:
            raise Replayed(why)
        if op == "put":
            guard.put(text(f["record"]), version)
        elif op == "del":
            guard.deleted(text(f["scope"]), text(f["prompt"]), version.at)
        elif op == "clear":
            guard.cleared(
                None if f.get("all") == b"1" else text(f["scope"]), version.at, under=f.get("under") == b"1"
            )
        if op in ("del", "clear"):
            link.gauge(tombstones=len(guard))
        return op, f

    def _apply_event(self, event_id: bytes, fields: dict[Any, Any]) -> None:
        link = self.link
        mine = fields.get(b"origin", b"").decode() == link.origin
        if fields.get(b"op") == b"join":  # a replica joined: nothing to apply (and nothing to check)
            return
        if not link.signer.verified(fields):
            if not mine:  # one claiming to be this replica is not applied either way
                link.refused(Refusal("unsigned", fields.get(b"op"), "no valid signature"), "event")
            return
        try:
            admitted = self._admitted(event_id, fields)
        except Replayed as exc:
            link.refused(Refusal("replayed", fields.get(b"op"), str(exc)), "event")
            return
        if mine or admitted is None:
            link.count()  # its tombstone, if it made one, is announced
            return
        op, f = admitted
        replica = self.owner
        if op == "put":
            record = link.redis.hgetall(f["record"].decode())
            if record:  # gone already (deleted, expired): never served
                announced = version_of(fields, record=False) if link.guard is not None else None
                _, refusals = self.apply_records([record], announced)
                if not any(r.kind == "superseded" for r in refusals):
                    return
        elif op == "del":
            replica.apply_replicated_removal(text(f["scope"]), text(f["prompt"]))
        elif op == "clear":
            replica.apply_replicated_clear(
                None if f.get("all") == b"1" else text(f["scope"]), under=f.get("under") == b"1"
            )
        else:
            raise ValueError(f"unknown op {op!r}")
        link.count(applied=1)

    def apply_records(
        self, records: list[dict[Any, Any]], announced: Version | None = None
    ) -> tuple[list[SharedEntry], list[Refusal]]:
        """Records into the local index, one batch under the cache's lock; ``announced``: the
        version the put event that names the one record gives it (``Link.judged``)."""
        embedder = self.owner.embedder
        entries, refusals = self.link.judged(records, embedder.name, embedder.dim, announced)
        self.owner.apply_replicated(entries)
        if self.on_apply is not None and entries:
            self.on_apply(entries, [e.written_at for e in entries])
        self.link.count(applied=len(entries))
        return entries, refusals


class Replayed(ValueError):
    """A signed event the replay guard refuses (its reason is the message)."""
