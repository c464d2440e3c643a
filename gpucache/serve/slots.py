"""The proxy's slots past the exact tier, and each credential's share of the cache's lookups.

    Slots(limit, share).seen(holder)          a credential's request got past its check
    Slots.full()            -> bool           every slot is held
    await Slots.turn(holder, seconds) -> bool its share has room, at once or within ``seconds``
    with Slots.held(holder): ...              a slot, and a place in the share, for the block
    Slots.upstream_bound()                    the block's request leaves the share for the upstream

A request waiting on a lookup or the upstream holds a slot; at most ``limit`` are held at once
(``max_concurrency``), past which a request is shed (503, Retry-After) rather than queued.

**Why a share, of the lookups only, and only in company.** Without one, one credential's burst
of new prompts fills the embedder's batches, and another credential's misses wait behind the
batch computing: beside a flood of 32 connections from one key, another key's misses took
several times as long as alone on a 2-core CPU, and with the share about as long
(``bench/reports/serve-fairness.md`` has the figures). So a credential may have at most
``share`` requests in the cache (on a lookup, before its request goes upstream) at once. What
is shared is the embedder, not the model server: a request leaves the share when it goes
upstream (``upstream_bound``), so a tenant's 32 workers still have 32 generations running at
once, and only their lookups take turns. And most deployments send every request with one key,
where a share would only hold that key back for nobody's benefit: the share binds while another
credential is *active*, having got a request past its check in the last ``company_seconds``.
Why a window rather than who holds a slot now: a user sending one request after another holds
none between them, and the flood would take the embedder back in that gap.

**Why a request past its share waits for its turn before it is shed.** A client that ignores
Retry-After (a load generator, a script in a loop) sends its next request the moment a refusal
comes back, and refusals made at once are made as fast as it can ask: a rate limit's 429s to a
32-connection flood came tens of thousands of times in 20 s, and their work on the event loop
starved the embedder's thread of the interpreter, so lookups, the other key's too, passed their
deadline (``bench/reports/serve-fairness.md``, the rate's row). A request past its share instead waits,
in the order its credential's requests came, for one of that credential's own places in the
share, up to ``retry_after`` seconds; only then is it shed. It waits behind its own credential's
requests, never another's, and costs nothing while it waits (a suspended coroutine and its
connection). At most ``limit`` of a credential's requests wait at once; one past that is shed at
once (bounded by the share instead, the waiters of a flood wider than twice its share would be
refused at once again).

The set of active credentials is kept in the order last heard from, and those quiet past the
window are dropped from its front, so many keys each sending once cost memory for the window
only. Every call is on the event loop (no lock).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

# How long a credential counts as active after a request of its got past its check: longer than
# a client's back-off after a shed answer (Retry-After, a second by default) and a chat user's
# pause between questions, so a tenant that keeps asking keeps its protection.
COMPANY_SECONDS = 30.0


@dataclass
class _Slot:
    holder: str
    in_share: bool = True


# The slot the running request holds: set by ``held``, read by ``upstream_bound`` from wherever
# the request's upstream call is made (inside the cache's loader, a task of the request's own
# context), so the call sites need not carry it.
_current: ContextVar[_Slot | None] = ContextVar("gpucache_slot", default=None)


class Slots:
    """``limit`` slots; ``share`` of one credential's requests at most in the cache at once while
    other credentials are active (None: no share)."""

    def __init__(
        self,
        limit: int,
        share: int | None,
        company_seconds: float = COMPANY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit, self.share = limit, share
        self.company_seconds, self.clock = company_seconds, clock
        self.busy = 0  # slots held now
        self._sharing: dict[str, int] = {}  # of those, each credential's still in the cache
        self._heard: OrderedDict[str, float] = OrderedDict()  # holder -> last heard, oldest first
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}  # holder -> its turns, first first

    def seen(self, holder: str) -> None:
        """``holder``'s request got past its credential check: it is active from now."""
        now = self.clock()
        self._heard[holder] = now
        self._heard.move_to_end(holder)
        self._forget_quiet(now)

    def in_company(self, holder: str) -> bool:
        """Whether a credential other than ``holder`` is active."""
        self._forget_quiet(self.clock())
        return len(self._heard) > 1 or (len(self._heard) == 1 and holder not in self._heard)

    def at_share(self, holder: str) -> bool:
        """Whether ``holder`` has its share of requests in the cache while another is active."""
        if self.share is None or self._sharing.get(holder, 0) < self.share:
            return False
        return self.in_company(holder)

    def full(self) -> bool:
        """Whether every slot is held."""
        return self.busy >= self.limit

    def sharing(self, holder: str) -> int:
        """``holder``'s requests in the cache now."""
        return self._sharing.get(holder, 0)

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn now, every credential's."""
        return sum(len(queue) for queue in self._waiting.values())

    async def turn(self, holder: str, seconds: float) -> bool:
        """Whether ``holder``'s share has room for one more request, at once (and no earlier
        request of its waits) or once one of its own leaves the cache within ``seconds``;
        False where it is still at its share then, or where ``limit`` of its requests wait
        already."""
        queue = self._waiting.get(holder)
        if not queue and not self.at_share(holder):
            return True
        if seconds <= 0 or (queue is not None and len(queue) >= self.limit):
            return False
        queue = self._waiting.setdefault(holder, deque())
        waiter = asyncio.get_running_loop().create_future()
        queue.append(waiter)
        room = False
        try:
            try:
                await asyncio.wait_for(asyncio.shield(waiter), seconds)
            except asyncio.TimeoutError:  # TimeoutError itself from 3.11 on
                pass
            room = not self.at_share(holder)
            return room
        finally:
            queue.remove(waiter)
            if not queue and self._waiting.get(holder) is queue:
                del self._waiting[holder]
            if not room and not self.at_share(holder):  # a free place it did not take (its
                self._next_turn(holder)  # client gone as it was woken): the next one's turn

    @contextmanager
    def held(self, holder: str) -> Iterator[None]:
        """A slot held for ``holder`` while the block runs, and a place in its share until the
        block ends or its request goes upstream (``upstream_bound``)."""
        slot = _Slot(holder)
        self.busy += 1
        self._sharing[holder] = self._sharing.get(holder, 0) + 1
        token = _current.set(slot)
        try:
            yield
        finally:
            _current.reset(token)
            self.busy -= 1
            if slot.in_share:
                self._leave_share(slot)

    def upstream_bound(self) -> None:
        """The running request goes to the upstream: its place in the share is given to the
        next of its credential's requests (the slot it keeps)."""
        slot = _current.get()
        if slot is not None and slot.in_share:
            self._leave_share(slot)

    def _leave_share(self, slot: _Slot) -> None:
        slot.in_share = False
        left = self._sharing.pop(slot.holder) - 1
        if left:
            self._sharing[slot.holder] = left
        self._next_turn(slot.holder)

    def _next_turn(self, holder: str) -> None:
        """Wake the first of ``holder``'s requests waiting for a place in its share."""
        for waiter in self._waiting.get(holder, ()):
            if not waiter.done():
                waiter.set_result(None)
                return

    def _forget_quiet(self, now: float) -> None:
        while self._heard:
            holder, heard = next(iter(self._heard.items()))
            if now - heard < self.company_seconds:
                return
            del self._heard[holder]
