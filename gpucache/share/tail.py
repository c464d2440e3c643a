"""The tail: other replicas' events, read from the stream by one background thread and applied
to this replica's index.

The thread reads the stream (XREAD BLOCK from the last id it applied). A replica that starts, or
that finds the stream trimmed past that id (it was away too long), first bootstraps from the
records (SCAN), then tails from the join event it added before reading them, so nothing falls
between. One event or record that cannot be read is counted and passed over: it must not stop
the tail. Redis going away stops nothing either: the thread reconnects with backoff.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpucache.cache.replication import Replica, SharedEntry
from gpucache.share.link import Link
from gpucache.share.records import Refusal, id_after, text

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
        link, backoff = self.link, 0.05
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
                            self._apply_event(fields)
                        except link.transient:
                            raise  # Redis away: this event is read again once it is back
                        except Exception as exc:  # one bad event must not stop the tail
                            link.refused(Refusal("malformed", event_id, repr(exc)), "event")
                        self.last_id = event_id.decode()
                link.stats.connected = True
                backoff = 0.05
            except Exception as exc:  # Redis away (or a bug): reconnect with backoff, never die
                backoff = link.failed(exc, "tailing the shared log", backoff)

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
        keys = list(link.redis.scan_iter(match=link.keys.key("e:*"), count=BOOTSTRAP_BATCH))
        for first in range(0, len(keys), BOOTSTRAP_BATCH):
            pipe = link.redis.pipeline(transaction=False)
            for key in keys[first : first + BOOTSTRAP_BATCH]:
                pipe.hgetall(key)
            records = [r for r in pipe.execute() if r]  # expired since the scan: skipped
            if records:
                self.apply_records(records)
        self.last_id = start.decode() if isinstance(start, bytes) else str(start)
        link.stats.connected = True
        link.count(bootstraps=1)

    def _apply_event(self, fields: dict[Any, Any]) -> None:
        f = {k.decode(): v for k, v in fields.items()}
        if f.get("origin", b"").decode() == self.link.origin:
            return
        if f.get("op") == b"join":  # a replica joined: nothing to apply (and nothing to check)
            return
        if not self.link.signer.verified(fields):
            self.link.refused(Refusal("unsigned", f.get("op"), "no valid signature"), "event")
            return
        replica = self.owner
        op = f["op"].decode()
        if op == "put":
            record = self.link.redis.hgetall(f["record"].decode())
            if record:  # gone already (deleted, expired): never served
                self.apply_records([record])
                return
        elif op == "del":
            replica.apply_replicated_removal(text(f["scope"]), text(f["prompt"]))
        elif op == "clear":
            replica.apply_replicated_clear(None if f.get("all") == b"1" else text(f["scope"]))
        else:
            raise ValueError(f"unknown op {op!r}")
        self.link.count(applied=1)

    def apply_records(self, records: list[dict[Any, Any]]) -> None:
        """Records into the local index, one batch under the cache's lock."""
        embedder = self.owner.embedder
        entries = self.link.decoded(records, embedder.name, embedder.dim)
        self.owner.apply_replicated(entries)
        if self.on_apply is not None and entries:
            self.on_apply(entries, [e.written_at for e in entries])
        self.link.count(applied=len(entries))
