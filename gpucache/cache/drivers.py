"""The drivers of the get-or-load flows (flow.py): they run each operation the flow yields on a
cache's core and hand its result back, knowing nothing of the logic.

The sync driver (``run``) calls the operations in place. The async one (``arun``) hands ``Find``
to the cache's lookup coalescer (which batches concurrent lookups and runs them in a worker
thread, batching.py), runs what takes the cache's lock (``Finish``, ``AdoptShared``, a claim
across replicas) in a worker thread, runs ``Abort`` in place (it takes only single-flight's own
lock), and awaits the rest; so nothing on the event loop ever waits on the cache's lock, which
a scan holds for milliseconds. The only lock taken on the loop is single-flight's own, held for
a dict operation and never across a scan.

A stream's ``Relay`` ends the drive early: the caller gets ``Loaded(value, pieces)``, and the
pieces, as the caller reads them, pass the chunks on and then drive the rest of the flow (the
store, or the release of the claims where the caller stopped reading).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from gpucache.cache.claims import Claims
from gpucache.cache.flow import (
    Abort,
    AdoptShared,
    ClaimShared,
    Find,
    Finish,
    Flow,
    Load,
    Op,
    Open,
    Relay,
    Wait,
    WaitShared,
)
from gpucache.cache.lookup import LookupRequest
from gpucache.cache.served import Found, Framed, Joined, Keep, Loaded, LoaderAnswer, ServeOnly, Stream
from gpucache.cache.validation import check_response, check_ttl

if TYPE_CHECKING:
    from gpucache.cache.replication import Replication, SharedEntry

T = TypeVar("T")


class SharedClaims(Protocol):
    """A flow's claims across replicas (``ReplicaSide`` in replicated.py is the one)."""

    def claim_shared(self, claims: Claims) -> list[str]: ...

    def adopt_shared(self, claims: Claims, found: list[SharedEntry]) -> dict[str, str]: ...


class FlowCore(Protocol):
    """What the drivers run a flow's operations on (``CacheCore`` in core.py is the one). A
    protocol, so that this module needs nothing from the core's."""

    shared: Replication

    @property
    def replica(self) -> SharedClaims: ...

    def find_and_claim(self, requests: Sequence[LookupRequest]) -> list[Claims]: ...

    async def afind_and_claim(self, request: LookupRequest) -> Claims: ...

    def finish(
        self, claims: Claims, answers: Sequence[LoaderAnswer[Any]], ttl: float | None = None
    ) -> None: ...

    def abort(self, claims: Claims, error: BaseException) -> None: ...


# The loaders as the drivers take them (the facade wraps the caller's, checking what they answer)
BatchLoad = Callable[[list[str]], Sequence[LoaderAnswer[Any]]]
AsyncBatchLoad = Callable[[list[str]], Awaitable[Sequence[LoaderAnswer[Any]]]]
Opener = Callable[[], "Stream[Any] | ServeOnly[Any] | Awaitable[Stream[Any] | ServeOnly[Any]]"]


class _Stepper:
    """The flow's side of a driver: hands the last operation's result (or error) back to the
    flow and takes its next operation, until the flow returns ``result``. Times the first
    lookup (``lookup_seconds``: from the call to the lookup's decision)."""

    def __init__(self, flow: Flow[Any]) -> None:
        self.flow = flow
        self.op: Op | None = None
        self.result: Any = None
        self.lookup_seconds: float | None = None
        self._started = time.perf_counter()
        self._value: object = None
        self._error: BaseException | None = None

    def next(self) -> bool:
        """True with ``op`` set to the next operation; False once the flow has returned
        ``result``. The flow's own exceptions propagate."""
        try:
            if self._error is not None:
                self.op = self.flow.throw(self._error)
            else:
                self.op = self.flow.send(self._value)
            return True
        except StopIteration as stop:
            self.result = _stamped(stop.value, self.lookup_seconds or 0.0)
            return False

    def done(self, value: object) -> None:
        if self.lookup_seconds is None and isinstance(self.op, Find):
            self.lookup_seconds = time.perf_counter() - self._started
        self._value, self._error = value, None

    def failed(self, error: BaseException) -> None:
        self._value, self._error = None, error


def _stamped(result: Any, seconds: float) -> Any:
    """``result`` (a ``Served`` or a list of them) with the lookup's time on each."""
    if isinstance(result, list):
        return [_stamped(r, seconds) for r in result]
    if isinstance(result, Found):
        return Found(result.hit, seconds)
    if isinstance(result, Joined):
        return Joined(result.text, seconds)
    if isinstance(result, Loaded):
        return replace(result, lookup_seconds=seconds)
    return result


def _call(core: FlowCore, op: Op, load: BatchLoad | None = None, open_: Opener | None = None) -> object:
    if isinstance(op, Find):
        return core.find_and_claim([op.request])[0]
    if isinstance(op, Finish):
        core.finish(op.claims, op.answers, op.ttl)
        return None
    if isinstance(op, Abort):
        core.abort(op.claims, op.error)
        return None
    if isinstance(op, ClaimShared):
        return core.replica.claim_shared(op.claims)
    if isinstance(op, WaitShared):
        return core.shared.wait_loaded(op.scope, op.prompts)
    if isinstance(op, AdoptShared):
        return core.replica.adopt_shared(op.claims, op.found)
    if isinstance(op, Wait):
        return op.future.result()
    if isinstance(op, Load) and load is not None:
        return load(op.prompts)
    if isinstance(op, Open) and open_ is not None:
        return open_()
    raise RuntimeError(f"gpucache bug: {op!r} has no driver here")


async def _acall(
    core: FlowCore, op: Op, load: AsyncBatchLoad | None = None, open_: Opener | None = None
) -> object:
    if isinstance(op, Find):
        return await core.afind_and_claim(op.request)
    if isinstance(op, Abort) or (isinstance(op, ClaimShared) and not core.shared.remote):
        # in place: a release takes only single-flight's own lock, and must happen before
        # anything awaits (a cancelled task may be cancelled again at any await); a cache with
        # no other replica answers a claim at once, for less than a thread hop costs
        return _call(core, op)
    if isinstance(op, (Finish, ClaimShared, AdoptShared)):
        # Shielded: the work records or releases claims (``finish`` hands a load's answer to
        # its waiters). A caller cancelled while the job still queued for a worker thread
        # would cancel the job itself, and the claim it releases would be held for good, every
        # later caller of the prompt waiting on it. The job runs to its end either way.
        return await asyncio.shield(asyncio.to_thread(_call, core, op))
    if isinstance(op, Wait):
        return await wait(op.future)
    if isinstance(op, WaitShared):
        return await core.shared.await_loaded(op.scope, op.prompts)
    if isinstance(op, Load) and load is not None:
        return await load(op.prompts)
    if isinstance(op, Open) and open_ is not None:
        opened = open_()
        return await opened if inspect.isawaitable(opened) else opened
    raise RuntimeError(f"gpucache bug: {op!r} has no driver here")


async def wait(future: Future[str]) -> str:
    """Await a load another call runs. Shielded: a waiter that is cancelled must not cancel
    the shared future, which the loading call and the other waiters still use."""
    return await asyncio.shield(asyncio.wrap_future(future))


def run(core: FlowCore, flow: Flow[T], load: BatchLoad | None = None, open_: Opener | None = None) -> T:
    """Drive ``flow`` on this thread. A stream's ``Relay`` ends the drive with
    ``Loaded(value, pieces)``; the pieces, as they are read, drive the rest."""
    step = _Stepper(flow)
    while step.next():
        assert step.op is not None
        if isinstance(step.op, Relay):
            return cast(T, _loading(step, step.op, _pieces(core, step, step.op.stream)))
        try:
            step.done(_call(core, step.op, load, open_))
        except BaseException as exc:
            step.failed(exc)
    return cast(T, step.result)


async def arun(
    core: FlowCore, flow: Flow[T], load: AsyncBatchLoad | None = None, open_: Opener | None = None
) -> T:
    """Drive ``flow`` on the event loop: the lookup coalesced, the cache's work in a worker
    thread, the rest awaited. ``Relay`` as for ``run``."""
    step = _Stepper(flow)
    while step.next():
        assert step.op is not None
        if isinstance(step.op, Relay):
            return cast(T, _loading(step, step.op, _AsyncPieces(core, step, step.op.stream)))
        try:
            step.done(await _acall(core, step.op, load, open_))
        except BaseException as exc:
            step.failed(exc)
    return cast(T, step.result)


def _loading(step: _Stepper, relay: Relay, pieces: Any) -> Loaded[Any]:
    return Loaded(
        relay.stream.value, pieces=pieces, lookup_seconds=step.lookup_seconds or 0.0, refused=relay.refused
    )


def _pieces(core: FlowCore, step: _Stepper, stream: Stream[Any]) -> Iterator[object]:
    """A stream's chunks for a sync consumer, then the rest of the flow (the store). A
    consumer that stops reading raises GeneratorExit at a ``yield``; thrown into the flow, it
    releases the claim, and the flow re-raises it."""
    source: Any = None
    text = _Text()
    try:
        source = _iterate(stream.chunks)
        for chunk in source:
            piece = text.take(chunk)
            if piece is not None:
                yield piece
        step.done(text.answer())
    except BaseException as exc:
        step.failed(exc)
        if hasattr(source, "close"):
            source.close()
    while step.next():
        assert step.op is not None
        try:
            step.done(_call(core, step.op))
        except BaseException as exc:
            step.failed(exc)
    _raise_failed(step)


async def _apieces(core: FlowCore, step: _Stepper, stream: Stream[Any]) -> AsyncGenerator[object, None]:
    """``_pieces`` for an async consumer: the chunks may be an async iterable or a plain one."""
    iterator: AsyncGenerator[object, None] | None = None
    text = _Text()
    try:
        iterator = _aiterate(stream.chunks)
        async for chunk in iterator:
            piece = text.take(chunk)
            if piece is not None:
                yield piece
        step.done(text.answer())
    except BaseException as exc:
        step.failed(exc)
        # The flow sees the error before anything here awaits, and its ``Abort`` runs in place:
        # this call's claims are released on the spot. A consumer that went away closes this
        # generator inside a cancelled task, where every await may be cancelled again; a claim
        # released only after one would be left held, and the next caller would wait on it.
        try:
            while step.next():
                assert isinstance(step.op, Abort), step.op
                step.done(_call(core, step.op))
        finally:
            await _close(iterator, stream.chunks)
        return
    while step.next():
        assert step.op is not None
        try:
            step.done(await _acall(core, step.op))
        except BaseException as exc:
            step.failed(exc)
    _raise_failed(step)


def _raise_failed(step: _Stepper) -> None:
    """A stream whose store failed ends with the cache's error, after its last chunk: its
    consumer has had the whole answer, and learns it was not kept."""
    if isinstance(step.result, Loaded) and step.result.failed is not None:
        raise step.result.failed


class _AsyncPieces:
    """A streamed load's pieces for an async consumer (``_apieces``), closable whether or not
    they were started: an async generator that never started runs nothing when closed, and
    the load's claims would be held for good, every later caller of the prompt waiting."""

    def __init__(self, core: FlowCore, step: _Stepper, stream: Stream[Any]) -> None:
        self._core, self._step, self._stream = core, step, stream
        self._pieces = _apieces(core, step, stream)
        self._started = False

    def __aiter__(self) -> _AsyncPieces:
        return self

    def __anext__(self) -> Awaitable[object]:
        self._started = True
        return self._pieces.__anext__()

    async def aclose(self) -> None:
        if self._started:
            await self._pieces.aclose()
            return
        self._started = True
        await self._pieces.aclose()  # marks it closed; nothing of it ran
        self._step.failed(GeneratorExit())
        try:
            while self._step.next():  # the flow's Abort, in place: before anything awaits
                assert isinstance(self._step.op, Abort), self._step.op
                self._step.done(_call(self._core, self._step.op))
        except GeneratorExit:
            pass
        finally:
            await _close(None, self._stream.chunks)


async def _close(iterator: AsyncGenerator[object, None] | None, source: Any) -> None:
    """Close a streaming loader's iterator and source, whichever kind they are."""
    if iterator is not None:
        await iterator.aclose()
    if hasattr(source, "aclose"):
        await source.aclose()
    elif hasattr(source, "close"):
        source.close()


class _Text:
    """A streamed load's text, gathered as its chunks pass, and the loader's last word."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.last: LoaderAnswer[Any] | None = None

    def take(self, chunk: object) -> object | None:
        """The piece to pass on (the chunk as the loader gave it, its text gathered), or None
        for the loader's last word (``Keep``/``ServeOnly``)."""
        if isinstance(chunk, (Keep, ServeOnly)):
            self.last = chunk
            return None
        if isinstance(chunk, Framed):
            self.parts.append(check_response(chunk.text, "stream chunk's text"))
            return chunk
        piece = check_response(chunk, "stream chunk")
        self.parts.append(piece)
        return piece

    def answer(self) -> LoaderAnswer[Any]:
        """Its text kept (for the ``ttl`` of a ``Keep`` it ended with), or, where it ended with
        ``ServeOnly``, nothing kept."""
        last = self.last
        if isinstance(last, ServeOnly):
            return last
        return Keep("".join(self.parts), ttl=check_ttl(last.ttl, "a stream's Keep's ttl") if last else None)


async def _aiterate(source: object) -> AsyncGenerator[object, None]:
    """An async iterable's chunks, or a plain iterable's."""
    if hasattr(source, "__aiter__"):
        async for chunk in cast("Any", source):
            yield chunk
    else:
        for chunk in _iterate(source):
            yield chunk


def _iterate(source: object) -> Iterator[object]:
    if isinstance(source, (str, bytes)) or not isinstance(source, Iterable):
        raise TypeError(
            f"a streaming loader must return an iterable of str chunks, got {type(source).__name__}"
        )
    return iter(source)
