"""Async lookups from concurrent calls, coalesced into one batch.

Why: a server runs one ``aget_or_put`` per request, each with one prompt; looked up alone, every
request pays for its own embedder call and its own scan over every stored row. Requests that
gather share one batch (``CacheCore.looked``): one embedder batch and one scan per scope (lookup.py). Each
caller gets the result it would have got alone.

Batch only what gathers. A lookup that arrives while none of its loop's batches is computing is
sent at once, alone: waiting for company that may never come only adds latency (a lone miss
used to wait out the whole window). One batch is in flight at a time: requests that arrive
while one is being looked up gather into the next, which is sent the moment the first returns
(up to ``max_batch``; the rest form the one after). Under load the batches therefore grow with
the load, as a model server's continuous batching does, instead of many small batches
competing for the same cores and the cache's lock; at low load nobody waits for anybody.

So a gathered lookup waits for the running batch to finish, not for a timer: sending it beside
the running batch after a fixed window would, under a steady load longer than the window,
put a new batch in flight every window and lose the sharing (and, on a CPU, split its cores
between batches). ``window`` is therefore a switch: above 0, lookups coalesce as above; with
``window=0`` every request is its own batch, sent at once: the path the async API takes when
coalescing is off, so timeouts and cancellation work the same way either way.

A batch past ``max_batch`` is filled fairly: the gathered lookups are taken one tenant at a
time in turn (a scope's tenant, entries.py), each tenant's in the order they came, so one
tenant's flood of misses fills the batches it shares with others only to its turn, and another
tenant's lookup is in the next batch, not behind every lookup of the flood.

A caller that gives up (its ``timeout`` passes, or its task is cancelled) may leave a lookup
running in a worker thread, which may have claimed misses for that caller to load. Those
claims are released as soon as the result arrives, whichever side gets there first (``_Ticket``),
so no other caller waits on a load that will never run.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpucache.cache.claims import Claims
from gpucache.cache.entries import tenant_of
from gpucache.cache.lookup import Findings, LookupRequest

Looked = Findings | Claims  # what a lookup returns: its findings, or a get-or-load call's claims


class LookupTimeout(TimeoutError):
    """An async lookup took longer than the cache's ``lookup_timeout_seconds``. Nothing was
    claimed in the caller's name; a server treats it as a miss and goes upstream."""


@dataclass
class _Ticket:
    request: LookupRequest
    future: asyncio.Future[Looked]
    result: Looked | None = None  # set by the worker; taken by the caller or released
    abandoned: bool = False  # the caller gave up before the result arrived


@dataclass
class _Window:
    tickets: list[_Ticket] = field(default_factory=list)  # gathered behind the running batch
    busy: bool = False  # a batch of this loop's is being looked up


def in_turn(tickets: list[_Ticket], size: int) -> tuple[list[_Ticket], list[_Ticket]]:
    """The next batch of at most ``size`` tickets, taken one tenant at a time in turn (in the
    order tenants first appear, each tenant's in arrival order), and the rest in arrival order."""
    if len(tickets) <= size:
        return tickets, []
    queues: dict[str, list[_Ticket]] = {}
    for ticket in tickets:
        queues.setdefault(tenant_of(ticket.request.scope), []).append(ticket)
    chosen: set[int] = set()
    for turn in range(size):
        for queue in queues.values():
            if turn < len(queue) and len(chosen) < size:
                chosen.add(id(queue[turn]))
        if len(chosen) >= size:
            break
    return ([t for t in tickets if id(t) in chosen], [t for t in tickets if id(t) not in chosen])


class LookupCoalescer:
    """Batches the lookups submitted on an event loop while one of its batches computes.

    Args:
        run: ``CacheCore.looked``: requests in, a result per request out (its
            findings, or a get-or-load call's claims); runs in a worker thread.
        release: gives up a result's claims, if any (its caller is gone).
        window: above 0, lookups coalesce: one is sent at once where no batch is computing,
            else it joins the next batch, sent when the running one returns; 0: each lookup
            its own batch, sent at once. No lookup waits for a timer either way.
        max_batch: the most requests one batch holds.
    """

    def __init__(
        self,
        run: Callable[[Sequence[LookupRequest]], list[Looked]],
        release: Callable[[Looked], None],
        window: float,
        max_batch: int,
    ) -> None:
        self._run = run
        self._release = release
        self.window = window
        self.max_batch = max_batch
        self.batches = 0  # batches sent, for tests and metrics
        self._lock = threading.Lock()  # guards tickets' result/abandoned; never held across a scan
        self._windows: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Window] = (
            weakref.WeakKeyDictionary()
        )
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def gathered(self) -> int:
        """Lookups gathered behind a running batch, on every loop: a count read from any
        thread (for tests and metrics), never a lock on the loop's state."""
        return sum(len(w.tickets) for w in list(self._windows.values()))

    async def submit(self, request: LookupRequest, timeout: float | None = None) -> Looked:
        """The request's result, from the batch it joins; ``LookupTimeout`` past ``timeout``."""
        loop = asyncio.get_running_loop()
        ticket = _Ticket(request, loop.create_future())
        window = self._windows.setdefault(loop, _Window())
        window.tickets.append(ticket)
        if self.window <= 0:
            self._send(loop, window, [ticket])
        elif not window.busy:  # nothing computing: nobody to wait for, and nobody gathering
            self._send_next(loop, window)
        # else it gathers behind the running batch and goes with the next one (``_after``)
        try:
            return await asyncio.wait_for(ticket.future, timeout)
        except asyncio.TimeoutError:
            self._abandon(ticket)
            raise LookupTimeout(f"the lookup took longer than {timeout} s") from None
        except BaseException:
            self._abandon(ticket)
            raise

    def _send_next(self, loop: asyncio.AbstractEventLoop, window: _Window) -> None:
        """Send the waiting tickets (up to ``max_batch``) as this loop's batch in flight."""
        # a ticket whose caller gave up (its deadline passed while it queued) is dropped, not
        # computed: under overload, embedding lookups nobody waits for is how a queue collapses
        with self._lock:
            waiting = [t for t in window.tickets if not t.abandoned]
        tickets, window.tickets = in_turn(waiting, self.max_batch)
        if tickets:
            window.busy = True
            self._send(loop, window, tickets)

    def _send(self, loop: asyncio.AbstractEventLoop, window: _Window, tickets: list[_Ticket]) -> None:
        if self.window <= 0:
            window.tickets.remove(tickets[0])
        self.batches += 1
        task = loop.create_task(self._complete(tickets))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self.window > 0:
            task.add_done_callback(lambda _: self._after(loop, window))

    def _after(self, loop: asyncio.AbstractEventLoop, window: _Window) -> None:
        """A batch came back: the requests that gathered meanwhile go at once."""
        window.busy = False
        if window.tickets:
            self._send_next(loop, window)

    async def _complete(self, tickets: list[_Ticket]) -> None:
        try:
            await asyncio.to_thread(self._compute, tickets)
        except BaseException as exc:  # the lookup failed: every caller of the batch sees why
            for ticket in tickets:
                if not ticket.future.done():
                    ticket.future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for ticket in tickets:
            with self._lock:
                result, ticket.result = ticket.result, None
            if result is not None and not ticket.future.done():
                ticket.future.set_result(result)
            elif result is not None:
                self._release(result)

    def _compute(self, tickets: list[_Ticket]) -> None:
        """In the worker thread: the batch's results, each handed to its ticket or, where its
        caller has already given up, released."""
        results = self._run([t.request for t in tickets])
        for ticket, result in zip(tickets, results):
            with self._lock:
                if not ticket.abandoned:
                    ticket.result = result
                    continue
            self._release(result)

    def _abandon(self, ticket: _Ticket) -> None:
        with self._lock:
            ticket.abandoned = True
            result, ticket.result = ticket.result, None
        if result is not None:
            self._release(result)
        if ticket.future.done() and not ticket.future.cancelled() and ticket.future.exception() is None:
            self._release(ticket.future.result())  # delivered, but its caller never took it
