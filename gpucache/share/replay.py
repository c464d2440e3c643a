"""What makes a signed record or event that was once genuine unusable a second time.

A signature says who wrote a record or an event, not when, nor whether it still holds: anyone
who can write to Redis can keep a copy of a signed put and its record, and put both back after
the entry was invalidated, or ``XADD`` a captured ``clear`` again. Three things stop that:

1. **A sequence per writer.** Every replica's share is a writer with a random id (its
   ``origin``) and a counter; every event it signs binds ``origin``, ``seq`` and ``at`` (its
   wall-clock time). Its events reach the stream in ``seq`` order (one thread writes them, in
   order, each batch in one transaction), so a replica that has applied ``seq`` n of a writer
   refuses any event of that writer at or below n. A replayed ``XADD`` gets a new stream id, so
   the stream id alone tells nothing; the signed sequence does.
2. **A freshness window.** An event whose signed ``at`` is more than ``window`` seconds from
   the time in its stream id (Redis's clock when it was added) was signed long before or after
   it was added: a replay. The stream id's time, not this replica's clock, is the reference, so
   a replica catching up after an outage still applies old events that were added when they
   were signed. The one float comparison that decides anything: ``abs(added - at) > window``;
   the writers' clocks and Redis's must agree within it.
3. **Versions against tombstones.** A record's signature binds the ``origin`` and ``seq`` of
   the put that wrote it. A replica remembers each delete and clear it applied (a tombstone)
   together with how far it had read every writer then; a record read later without its
   event (an exact repeat fetched from Redis, a bootstrap) whose writer had already passed its
   ``seq`` when the tombstone was made is older than the delete: refused. This compares
   sequences of one writer only, never clocks across machines, so a record put back right
   after its delete is refused as surely as an old one. Where this replica had heard nothing
   of the record's writer when the tombstone was made, the record is refused when it was
   signed more than ``window`` before the delete: a writer that put a record less than a
   window before a delete had its put read here, unless the delete lies within a window of
   where this replica began reading (see below), so only records older than that are left
   to the unknown case; and a record put after the delete was signed after it, give or take
   the clocks' skew.
4. **Versions against overwrites.** Each put a replica reads is the high-water mark of its
   record's key: a writer writes the record and adds its put in one transaction, so the record
   Redis holds is always the one the key's latest put names, or a newer one whose put is still
   to be read. A record of that key at another version, whose writer this replica has read
   past that version, is one an overwrite replaced, put back: refused. Where this replica has
   heard nothing of its writer, it is refused when signed more than ``window`` before the
   latest put (as for a tombstone).

A replica that joins (or bootstraps again) first reads the stream's last ``3 * window``
seconds before its join event into the guard, applying nothing (``LEARN_WINDOWS``): a replay of
any event it could otherwise accept (one signed within the window) finds the writer's sequence
already past it, and a record deleted in the last ``2 * window`` of that span (where every put
less than a window older was read too) is refused at the bootstrap. A record deleted earlier,
put back before a replica joins, is accepted by that replica: what it could know of the delete
is gone from the stream (trimmed, or ``XDEL``-ed: everything in Redis is the attacker's to
remove); likewise the deletes a replica never read because the stream was trimmed past it
while it was away.

Bounded memory: ``max_writers`` writers (the least recently heard is forgotten first; one
forgotten while it was still within the window raises a floor, and an event of a writer not in
the table signed at or before the floor is refused, so forgetting never lets a replay in) and
``max_tombstones`` deletes and clears (the oldest is forgotten first: a record deleted before
the oldest one kept can be put back; logged once). Each writer keeps, besides its sequence,
one (tombstone count, sequence) point per sequence change that followed a new tombstone, and
only those a tombstone kept can ask for (at most about two per tombstone, pruned in amortised
passes): the lookup "where was writer w at tombstone t" is a bisection, and no tombstone
copies the whole table. Worst case, writers x tombstones points; in practice a writer holds a
point for each tombstone made while it was writing.

Unsigned shares (no secret) are not protected and nothing is counted: without a signature
anyone can write any sequence, so there is nothing to check against.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from gpucache.keys import prompt_key

log = logging.getLogger("gpucache.share")

UNKNOWN = -1  # "this replica had heard nothing of the writer at that tombstone"
LEARN_WINDOWS = 3  # windows of the stream read into the guard before a bootstrap


@dataclass(frozen=True)
class Version:
    """Who signed a record or an event, its place in that writer's sequence, and when."""

    origin: str
    seq: int
    at: float


@dataclass
class _Writer:
    seq: int
    at: float  # the signed time of its latest event applied here
    # (tombstones made when this point was set, seq from then on), ascending in both
    points: list[tuple[int, int]] = field(default_factory=list)

    def at_tombstone(self, number: int) -> int:
        """This writer's sequence when tombstone ``number`` was made (UNKNOWN: not heard of)."""
        i = bisect.bisect_left(self.points, (number, -2)) - 1  # the last point set before it
        return self.points[i][1] if i >= 0 else UNKNOWN


class ReplayGuard:
    """The writers' sequences and the tombstones one replica has seen (see the module's
    docstring). Thread-safe: the tail feeds it, lookups ask it about fetched records."""

    def __init__(
        self, window: float, max_writers: int = 4096, max_tombstones: int = 65536, max_puts: int = 65536
    ) -> None:
        if not (math.isfinite(window) and window > 0):
            raise ValueError(f"replay_window must be a positive number of seconds, got {window!r}")
        if max_writers < 1 or max_tombstones < 1 or max_puts < 1:
            raise ValueError("max_writers, max_tombstones and max_puts must be >= 1")
        self.window, self.max_writers, self.max_tombstones = window, max_writers, max_tombstones
        self.max_puts = max_puts
        self._puts: OrderedDict[str, Version] = OrderedDict()  # record key -> its latest put read
        self._forgot_puts = False
        self._lock = threading.Lock()
        self._writers: OrderedDict[str, _Writer] = OrderedDict()  # least recently heard first
        self._floor = -math.inf  # see the module's docstring: forgotten writers
        self._made = 0  # tombstones made so far; the number of the latest
        # ("k", key digest) | ("s", scope) | ("*",) -> (tombstone number, its signed time)
        self._tombstones: OrderedDict[tuple[object, ...], tuple[int, float]] = OrderedDict()
        self._forgot_tombstones = False

    def __len__(self) -> int:
        """How many tombstones are remembered."""
        return len(self._tombstones)

    # ----------------------------------------------------------------------------- events

    def admit(self, version: Version, added_ms: int) -> str | None:
        """Whether an event signed as ``version`` and added to the stream at ``added_ms`` (its
        stream id's time) may be applied: None, and the writer's sequence moves to it; or why
        not (a replay)."""
        added = added_ms / 1000
        if abs(added - version.at) > self.window:
            return (
                f"signed at {version.at:.3f}, added to the stream at {added:.3f}: outside "
                f"the {self.window:g} s window"
            )
        with self._lock:
            writer = self._writers.get(version.origin)
            if writer is None:
                if version.at <= self._floor:
                    return (
                        f"of a writer no longer remembered, signed at {version.at:.3f}, not "
                        f"after {self._floor:.3f}"
                    )
                writer = self._writers[version.origin] = _Writer(version.seq, version.at)
                writer.points.append((self._made, version.seq))
                self._forget_writers(added)
                return None
            if version.seq <= writer.seq:
                return f"sequence {version.seq} of writer {version.origin}, which is at {writer.seq}"
            writer.seq, writer.at = version.seq, version.at
            self._writers.move_to_end(version.origin)
            if writer.points[-1][0] == self._made:
                writer.points[-1] = (self._made, version.seq)
            else:
                writer.points.append((self._made, version.seq))
                self._prune(writer)
            return None

    def _forget_writers(self, now: float) -> None:
        while len(self._writers) > self.max_writers:
            origin, writer = self._writers.popitem(last=False)
            if writer.at >= now - self.window:  # its replays would still pass the window
                self._floor = max(self._floor, writer.at)
                log.warning(
                    "gpucache: more than %d replicas wrote within %g s; forgot writer %s "
                    "(events of forgotten writers signed before %.3f are refused)",
                    self.max_writers,
                    self.window,
                    origin,
                    self._floor,
                )

    def _prune(self, writer: _Writer) -> None:
        """Drop the points no tombstone kept can ask for, once a writer holds more than twice
        as many as there are tombstones (amortised: one pass over both, both ascending). A
        point is asked for by the tombstones made after it was set and before the next one
        was, and the last by every tombstone to come."""
        points = writer.points
        if len(points) <= 2 * len(self._tombstones) + 2:
            return
        live = [number for number, _ in self._tombstones.values()]  # ascending: see _tombstone
        kept, j = [], 0
        for i, (set_at, seq) in enumerate(points):
            while j < len(live) and live[j] <= set_at:
                j += 1
            last = i + 1 == len(points)
            if last or (j < len(live) and live[j] <= points[i + 1][0]):
                kept.append((set_at, seq))
        writer.points = kept

    # ----------------------------------------------------------------------------- tombstones

    def deleted(self, scope: str, prompt: str, at: float) -> None:
        """A delete of (scope, prompt), signed at ``at``, was applied (after ``admit``)."""
        self._tombstone(("k", prompt_key(scope, prompt)), at)

    def cleared(self, scope: str | None, at: float, under: bool = False) -> None:
        """A clear of ``scope`` (and of those below it, with ``under``; None: of everything),
        signed at ``at``, was applied."""
        self._tombstone(("*",) if scope is None else ("u" if under else "s", _scope_key(scope)), at)

    def _tombstone(self, key: tuple[object, ...], at: float) -> None:
        with self._lock:
            self._made += 1
            # a later one supersedes: it refuses more
            if _remember(self._tombstones, key, (self._made, at), self.max_tombstones) and (
                not self._forgot_tombstones
            ):
                self._forgot_tombstones = True
                log.warning(
                    "gpucache: more than %d deletes and clears remembered; the oldest "
                    "are forgotten (a record deleted before them could be put back)",
                    self.max_tombstones,
                )

    def older_than_a_tombstone(self, scope: str, prompt: str, version: Version) -> str | None:
        """Why a record of (scope, prompt) at ``version`` is older than a delete or a clear
        applied here; None where it is not."""
        with self._lock:
            writer = self._writers.get(version.origin)
            # the scope's own tombstones, and those of every scope it lies under ("a/b/c":
            # "a/b/c", "a/b", "a")
            parts = scope.split("/")
            above = [("u", _scope_key("/".join(parts[:n]))) for n in range(len(parts), 0, -1)]
            for key in (("k", prompt_key(scope, prompt)), ("s", _scope_key(scope)), *above, ("*",)):
                found = self._tombstones.get(key)
                if found is None:
                    continue
                number, tomb_at = found
                seq = writer.at_tombstone(number) if writer is not None else UNKNOWN
                if seq == UNKNOWN:
                    if version.at < tomb_at - self.window:
                        return (
                            f"signed at {version.at:.3f}, more than {self.window:g} s before a "
                            f"{_what(key)} signed at {tomb_at:.3f}"
                        )
                elif version.seq <= seq:
                    return (
                        f"sequence {version.seq} of writer {version.origin}, which was at "
                        f"{seq} when a {_what(key)} was applied"
                    )
        return None

    # ----------------------------------------------------------------------------- overwrites

    def put(self, record_key: str, version: Version) -> None:
        """A put of the record at ``record_key``, signed as ``version``, was admitted: the
        key's high-water mark (the least recently put key is forgotten past ``max_puts``)."""
        with self._lock:
            if _remember(self._puts, record_key, version, self.max_puts) and not self._forgot_puts:
                self._forgot_puts = True
                log.warning(
                    "gpucache: more than %d keys' latest puts remembered; the oldest are "
                    "forgotten (a record overwritten before them could be put back)",
                    self.max_puts,
                )

    def overwritten(self, record_key: str, version: Version) -> str | None:
        """Why a record at ``record_key`` signed as ``version`` is older than the latest put of
        that key read here; None where it is that put, or newer (its own put still to come)."""
        with self._lock:
            latest = self._puts.get(record_key)
            if latest is None or (latest.origin, latest.seq) == (version.origin, version.seq):
                return None
            writer = self._writers.get(version.origin)
            if writer is None:
                if version.at < latest.at - self.window:
                    return (
                        f"signed at {version.at:.3f}, more than {self.window:g} s before the "
                        f"latest put of its key, signed at {latest.at:.3f}"
                    )
                return None
            if version.seq <= writer.seq:
                return (
                    f"sequence {version.seq} of writer {version.origin}, read here before the "
                    f"latest put of its key (sequence {latest.seq} of writer {latest.origin})"
                )
        return None


def _remember(table: OrderedDict[Any, Any], key: Any, value: Any, limit: int) -> bool:
    """``key`` set to ``value`` and made the newest in ``table``, the oldest forgotten past
    ``limit``: whether any was."""
    table[key] = value
    table.move_to_end(key)
    forgot = False
    while len(table) > limit:
        table.popitem(last=False)
        forgot = True
    return forgot


def _scope_key(scope: str) -> bytes:
    """A scope as a tombstone's key: 16 bytes, however long the scope (the tag apart from
    deletes' keys is the tuple's first element)."""
    return prompt_key(scope, "")


def _what(key: tuple[object, ...]) -> str:
    return {
        "k": "delete",
        "s": "clear of its scope",
        "u": "clear of a scope it lies under",
        "*": "clear of everything",
    }[str(key[0])]
