"""The get-or-load core machine, written once, and its sync and async drivers.

A get-or-load call looks its prompts up, claims the misses nobody else is loading, runs the
caller's loader on them, stores the answers, and hands them to every call that waited. When the
call it waited on gave up (``LoadAbandoned``), it claims again and loads itself. That logic is a
generator here (``get_or_load``, ``stream``) that yields the operations it needs and receives
their results, as httpx's auth flows and psycopg 3's protocol do:

    Find(request)      the lookup: exact tier, embedder, scan, verifier, claims (lookup.py)
    Work(fn, *args)    other cache work that may take the cache's lock (storing a load)
    Load(prompts)      the caller's loader, on the misses this call claimed
    LoadStream()       the caller's streaming loader: its chunks pass through to the consumer

A loader that returns ``Unstored`` (a streaming loader: yields it last) has its answer served to
its caller and kept from everyone else: nothing is stored and its waiters load their own.
    Wait(future)       the answer another call is loading
    WaitShared(...)    the entries another replica is loading (replicas sharing through Redis)

A driver runs the operations and knows nothing of the logic. The sync drivers call them in
place. The async drivers run ``Work`` in a worker thread, hand ``Find`` to the cache's lookup
coalescer (which batches concurrent lookups and runs them in a worker thread, batching.py) and
await the rest, so nothing on the event loop ever waits on the cache's lock, which a scan holds
for milliseconds (a server's every other request would wait with it). The only
lock taken on the loop is single-flight's own, held for a dict operation and never across a
scan.

An operation that raises is thrown back into the generator at its ``yield``, so the generator's
``try`` blocks see the loader's error (and release its claims) whichever driver runs it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpucache.cache.flight import LoadAbandoned, Unstored
from gpucache.cache.lookup import Hit, LookupRequest, Plan
from gpucache.cache.validation import check_response

if TYPE_CHECKING:
    from gpucache.cache.replication import Replication, SharedEntry
    from gpucache.cache.settings import CacheSettings


class FlowCore(Protocol):
    """The operations a flow asks of a cache's core (``CacheCore`` in core.py is the one). A
    protocol, so that this module needs nothing from the core's."""

    settings: CacheSettings
    shared: Replication

    def lookup_batch(self, requests: Sequence[LookupRequest]) -> list[Plan]: ...

    async def alookup(self, request: LookupRequest) -> Plan: ...

    def claim_shared(self, plan: Plan) -> list[str]: ...

    def adopt_shared(self, plan: Plan, found: list[SharedEntry]) -> None: ...

    def finish(self, plan: Plan, responses: list[str | Unstored], ttl: float | None = None) -> None: ...

    def abort(self, plan: Plan, error: BaseException) -> None: ...

    def replay(self, answer: str) -> Iterator[str]: ...


# The caller's loaders, as the facade takes them; a loader may answer ``Unstored`` (served to
# its caller, not kept).
Loader = Callable[[str], "str | Unstored"]
BatchLoader = Callable[[list[str]], Sequence["str | Unstored"]]
StreamLoader = Callable[[str], Iterable[str]]
AsyncLoader = Callable[[str], Awaitable["str | Unstored"]]
AsyncBatchLoader = Callable[[list[str]], Awaitable[Sequence["str | Unstored"]]]
AsyncStreamLoader = Callable[[str], Any]  # returns an async iterable (or an iterable) of chunks
OnLookup = Callable[["Hit | None"], None] | None


@dataclass(frozen=True)
class Find:
    """Look a request up: a ``Plan``. Async drivers batch it with concurrent lookups."""

    core: FlowCore
    request: LookupRequest


@dataclass(frozen=True)
class Work:
    """Cache work: may take the cache's lock or compute. Async drivers run it in a thread."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Load:
    """Call the caller's loader with the misses this call claimed; the result is a list of
    one response per prompt."""

    prompts: list[str]


@dataclass(frozen=True)
class LoadStream:
    """Run the caller's streaming loader, passing its chunks to the consumer as they come; the
    result is the whole text once the stream completes."""


@dataclass(frozen=True)
class Wait:
    """The answer another call is loading; raises what that load raised."""

    future: Future[str]


@dataclass(frozen=True)
class WaitShared:
    """The entries another replica is loading for these prompts: what arrived, once all have
    or the other replica gave up or ``claim_wait`` passed. Async drivers poll on the event
    loop, so any number of such waits hold no worker thread that lookups need."""

    core: FlowCore
    scope: str
    prompts: list[str]


@dataclass(frozen=True)
class Replay:
    """What a stream returns when it did not load: an answer to replay in chunks."""

    answer: str


Op = Find | Work | Load | LoadStream | Wait | WaitShared
Flow = Generator[Op, Any, Any]


def _abandoned(exc: BaseException) -> BaseException:
    """The error a load's waiters see when it stopped: the loader's own error, or
    ``LoadAbandoned`` when the consumer stopped reading or the task was cancelled, in which
    case the waiters load it themselves."""
    if isinstance(exc, (GeneratorExit, asyncio.CancelledError)):
        return LoadAbandoned()
    return exc


def _shared_claims(core: FlowCore, plan: Plan) -> Generator[Op, Any, None]:
    """Claim this call's misses across replicas; wait for those another replica is loading."""
    others = yield Work(core.claim_shared, (plan,))
    if others:
        found = yield WaitShared(core, plan.scope, others)
        yield Work(core.adopt_shared, (plan, found))


def get_or_load(core: FlowCore, prompts: list[str], scope: str, ttl: float | None = None) -> Flow:
    """Answers for ``prompts`` in input order, loading the misses this call claims (and storing
    them for ``ttl`` seconds, or the cache's default where None)."""
    plan: Plan = yield Find(core, LookupRequest(tuple(prompts), scope, core.settings.threshold, claim=True))
    while True:
        if plan.claimed and core.shared.remote:
            yield from _shared_claims(core, plan)  # another replica may be loading some
        if plan.claimed:
            try:
                responses = yield Load(plan.to_load)  # the caller's code: no lock held
            except BaseException as exc:
                core.abort(plan, _abandoned(exc))
                raise
            yield Work(core.finish, (plan, responses, ttl))
        retry = []
        for key, future in plan.loading_elsewhere.items():
            try:
                plan.answers[plan.prompt_of[key]] = yield Wait(future)  # its error is ours too
            except LoadAbandoned:
                retry.append(plan.prompt_of[key])
        if not retry:
            return plan.ordered()
        again: Plan = yield Find(
            core, LookupRequest(tuple(retry), scope, core.settings.threshold, claim=True, count=False))
        plan = again.after(plan)


def stream(core: FlowCore, prompt: str, scope: str, ttl: float | None = None) -> Flow:
    """Returns ``Replay(answer)`` for a hit or another call's load; otherwise loads through
    ``LoadStream`` and stores the whole text once the stream completes."""
    plan: Plan = yield Find(core, LookupRequest((prompt,), scope, core.settings.threshold, claim=True))
    while plan.loading_elsewhere:  # another call is loading it: replay its answer when it completes
        try:
            answer = yield Wait(next(iter(plan.loading_elsewhere.values())))
        except LoadAbandoned:
            plan = yield Find(
                core, LookupRequest((prompt,), scope, core.settings.threshold, claim=True, count=False))
            continue
        return Replay(answer)
    if plan.claimed and core.shared.remote:
        yield from _shared_claims(core, plan)  # another replica may be loading it
    if not plan.claimed:  # a hit, or another replica's entry: a stored answer
        answer = plan.answers[prompt]
        if isinstance(answer, Unstored):
            raise RuntimeError("gpucache bug: an Unstored answer found by a lookup")
        return Replay(answer)
    try:
        text = yield LoadStream()
    except BaseException as exc:
        core.abort(plan, _abandoned(exc))
        raise
    yield Work(core.finish, (plan, [text], ttl))
    return None


# ---------------------------------------------------------------------------------- drivers


OnFind = Callable[[Plan], None]


class _Stepper:
    """The flow's side of a driver: hands the last operation's result (or error) back to the
    flow and takes its next operation, until the flow returns. ``on_find`` sees the first
    lookup's plan as soon as it is known (a server's response headers say hit or miss)."""

    def __init__(self, flow: Flow, on_find: OnFind | None = None) -> None:
        self.flow = flow
        self.on_find = on_find
        self.op: Any = None
        self.result: Any = None
        self._value: Any = None
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
            self.result = stop.value
            return False

    def done(self, value: Any) -> None:
        if self.on_find is not None and isinstance(self.op, Find):
            on_find, self.on_find = self.on_find, None  # the first lookup only
            on_find(value)
        self._value, self._error = value, None

    def failed(self, error: BaseException) -> None:
        self._value, self._error = None, error


def _call(op: Op, load: Callable[[list[str]], list[str | Unstored]] | None = None) -> Any:
    if isinstance(op, Find):
        return op.core.lookup_batch([op.request])[0]
    if isinstance(op, Work):
        return op.fn(*op.args)
    if isinstance(op, Wait):
        return op.future.result()
    if isinstance(op, WaitShared):
        return op.core.shared.wait_loaded(op.scope, op.prompts)
    if isinstance(op, Load) and load is not None:
        return load(op.prompts)
    raise RuntimeError(f"gpucache bug: {op!r} has no driver here")


async def _acall(op: Op, load: Callable[[list[str]], Awaitable[list[str | Unstored]]] | None = None) -> Any:
    if isinstance(op, Find):
        return await op.core.alookup(op.request)
    if isinstance(op, Work):
        # Shielded: the work records or releases claims (``finish`` hands a load's answer to
        # its waiters). A caller cancelled while the job still queued for a worker thread
        # would cancel the job itself, and the claim it releases would be held for good, every
        # later caller of the prompt waiting on it. The job runs to its end either way.
        return await asyncio.shield(asyncio.to_thread(op.fn, *op.args))
    if isinstance(op, Wait):
        return await wait(op.future)
    if isinstance(op, WaitShared):
        return await op.core.shared.await_loaded(op.scope, op.prompts)
    if isinstance(op, Load) and load is not None:
        return await load(op.prompts)
    raise RuntimeError(f"gpucache bug: {op!r} has no driver here")


async def wait(future: Future[str]) -> str:
    """Await a load another call runs. Shielded: a waiter that is cancelled must not cancel
    the shared future, which the loading call and the other waiters still use."""
    return await asyncio.shield(asyncio.wrap_future(future))


def run(flow: Flow, load: Callable[[list[str]], list[str | Unstored]], on_find: OnFind | None = None) -> Any:
    """Drive ``flow`` on this thread."""
    step = _Stepper(flow, on_find)
    while step.next():
        try:
            step.done(_call(step.op, load))
        except BaseException as exc:
            step.failed(exc)
    return step.result


async def arun(
    flow: Flow, load: Callable[[list[str]], Awaitable[list[str | Unstored]]], on_find: OnFind | None = None
) -> Any:
    """Drive ``flow`` on the event loop: cache work in a worker thread, the rest awaited."""
    step = _Stepper(flow, on_find)
    while step.next():
        try:
            step.done(await _acall(step.op, load))
        except BaseException as exc:
            step.failed(exc)
    return step.result


def run_stream(
    core: FlowCore, flow: Flow, chunks: Callable[[], Iterable[str]], on_find: OnFind | None = None
) -> Iterator[str]:
    """Drive a ``stream`` flow for a sync consumer, yielding the chunks it is to see. A
    consumer that stops reading raises GeneratorExit at a ``yield``; thrown into the flow, it
    releases the claim, and the flow re-raises it."""
    step = _Stepper(flow, on_find)
    while step.next():
        if not isinstance(step.op, LoadStream):
            try:
                step.done(_call(step.op))
            except BaseException as exc:
                step.failed(exc)
            continue
        source: Any = None
        parts: list[str] = []
        unstored: Unstored | None = None
        try:
            source = _iterate(chunks())
            for chunk in source:
                if isinstance(chunk, Unstored):  # serve, do not keep (the loader's last item)
                    unstored = chunk
                    continue
                parts.append(check_response(chunk, "stream chunk"))
                yield chunk
            step.done(_streamed("".join(parts), unstored))
        except BaseException as exc:
            step.failed(exc)
            if hasattr(source, "close"):
                source.close()
    if isinstance(step.result, Replay):
        yield from core.replay(step.result.answer)


async def arun_stream(
    core: FlowCore, flow: Flow, chunks: Callable[[], Any], on_find: OnFind | None = None
) -> AsyncGenerator[str, None]:
    """``run_stream`` for an async consumer: ``chunks()`` may return an async iterable, an
    awaitable of one, or a plain iterable."""
    step = _Stepper(flow, on_find)
    going = step.next()
    while going:
        if not isinstance(step.op, LoadStream):
            try:
                step.done(await _acall(step.op))
            except BaseException as exc:
                step.failed(exc)
            going = step.next()
            continue
        source: Any = None
        iterator: AsyncGenerator[str, None] | None = None
        parts: list[str] = []
        unstored: Unstored | None = None
        try:
            source = chunks()
            if inspect.isawaitable(source):
                source = await source
            iterator = _aiterate(source)
            async for chunk in iterator:
                if isinstance(chunk, Unstored):  # serve, do not keep (the loader's last item)
                    unstored = chunk
                    continue
                parts.append(check_response(chunk, "stream chunk"))
                yield chunk
            step.done(_streamed("".join(parts), unstored))
        except BaseException as exc:
            step.failed(exc)
            # The flow sees the error before anything here awaits: it releases this call's
            # claims on the spot. A consumer that went away closes this generator inside a
            # cancelled task, where every await may be cancelled again; a claim released only
            # after one would be left held, and the next caller of the prompt would wait on it.
            try:
                going = step.next()
            finally:
                await _close(iterator, source)
            continue
        going = step.next()
    if isinstance(step.result, Replay):
        for chunk in core.replay(step.result.answer):
            yield chunk


async def _close(iterator: AsyncGenerator[str, None] | None, source: Any) -> None:
    """Close a streaming loader's iterator and source, whichever kind they are."""
    if iterator is not None:
        await iterator.aclose()
    if hasattr(source, "aclose"):
        await source.aclose()
    elif hasattr(source, "close"):
        source.close()


def _streamed(text: str, unstored: Unstored | None) -> str | Unstored:
    """A streamed load's result for the flow: its text, or, where the loader said not to keep
    it, ``Unstored`` holding the text (``Unstored.value`` where the loader gave one)."""
    if unstored is None:
        return text
    return unstored if unstored.value is not None else Unstored(text)


async def _aiterate(source: Any) -> AsyncGenerator[str, None]:
    """An async iterable's chunks, or a plain iterable's."""
    if hasattr(source, "__aiter__"):
        async for chunk in source:
            yield chunk
    else:
        for chunk in _iterate(source):
            yield chunk


def _iterate(source: object) -> Iterator[str]:
    if isinstance(source, (str, bytes)) or not isinstance(source, Iterable):
        raise TypeError(
            f"a streaming loader must return an iterable of str chunks, got {type(source).__name__}"
        )
    return iter(source)
