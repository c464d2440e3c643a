"""The get-or-load state machine, written once, and its sync and async drivers.

A get-or-load call looks its prompts up, claims the misses nobody else is loading, runs the
caller's loader on them, stores the answers, and hands them to every call that waited. When the
call it waited on gave up (``LoadAbandoned``), it claims again and loads itself. That logic is a
generator here (``get_or_load``, ``stream``) that yields the operations it needs and receives
their results, as httpx's auth flows and psycopg 3's protocol do:

    Work(fn, *args)    cache work that may take the cache's lock or compute (lookup, store)
    Load(prompts)      the caller's loader, on the misses this call claimed
    LoadStream()       the caller's streaming loader: its chunks pass through to the consumer
    Wait(future)       the answer another call is loading

A driver runs the operations and knows nothing of the logic. The sync drivers call them in
place. The async drivers run ``Work`` in a worker thread and await the rest, so nothing on the
event loop ever waits on the cache's lock, which a scan holds (DESIGN.md, contract 12). The only
lock taken on the loop is single-flight's own, held for a dict operation and never across a
scan.

An operation that raises is thrown back into the generator at its ``yield``, so the generator's
``try`` blocks see the loader's error (and release its claims) whichever driver runs it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucache.cache.flight import LoadAbandoned
from gpucache.cache.validation import check_response

if TYPE_CHECKING:
    from gpucache.cache.state import CacheState, Plan


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
class Replay:
    """What a stream returns when it did not load: an answer to replay in chunks."""

    answer: str


Op = Work | Load | LoadStream | Wait
Flow = Generator[Op, Any, Any]


def _abandoned(exc: BaseException) -> BaseException:
    """The error a load's waiters see when it stopped: the loader's own error, or
    ``LoadAbandoned`` when the consumer stopped reading or the task was cancelled, in which
    case the waiters load it themselves."""
    if isinstance(exc, (GeneratorExit, asyncio.CancelledError)):
        return LoadAbandoned()
    return exc


def get_or_load(cache: CacheState, prompts: list[str], scope: str) -> Flow:
    """Answers for ``prompts`` in input order, loading the misses this call claims."""
    plan: Plan = yield Work(cache._begin, (prompts, scope, True))
    while True:
        if plan.mine:
            try:
                responses = yield Load(plan.to_load)  # the caller's code: no lock held
            except BaseException as exc:
                cache._abort(plan, _abandoned(exc))
                raise
            yield Work(cache._finish, (plan, responses))
        retry = []
        for key, future in plan.theirs.items():
            try:
                plan.answers[plan.keys[key]] = yield Wait(future)  # its error is ours too
            except LoadAbandoned:
                retry.append(plan.keys[key])
        if not retry:
            return plan.ordered()
        again: Plan = yield Work(cache._begin, (retry, scope, False))
        plan = again.after(plan)


def stream(cache: CacheState, prompt: str, scope: str) -> Flow:
    """Returns ``Replay(answer)`` for a hit or another call's load; otherwise loads through
    ``LoadStream`` and stores the whole text once the stream completes."""
    plan: Plan = yield Work(cache._begin, ([prompt], scope, True))
    while plan.theirs:  # another call is loading it: replay its answer when it completes
        try:
            answer = yield Wait(next(iter(plan.theirs.values())))
        except LoadAbandoned:
            plan = yield Work(cache._begin, ([prompt], scope, False))
            continue
        return Replay(answer)
    if not plan.mine:
        return Replay(plan.answers[prompt])
    try:
        text = yield LoadStream()
    except BaseException as exc:
        cache._abort(plan, _abandoned(exc))
        raise
    yield Work(cache._finish, (plan, [text]))
    return None


# ---------------------------------------------------------------------------------- drivers


def _step(flow: Flow, value: Any, error: BaseException | None) -> tuple[bool, Any]:
    """Hand the last operation's result (or error) to ``flow``: (False, next operation), or
    (True, the flow's return value)."""
    try:
        return False, (flow.throw(error) if error is not None else flow.send(value))
    except StopIteration as stop:
        return True, stop.value


def _call(op: Op, load: Callable[[list[str]], list[str]] | None = None) -> Any:
    if isinstance(op, Work):
        return op.fn(*op.args)
    if isinstance(op, Wait):
        return op.future.result()
    if isinstance(op, Load) and load is not None:
        return load(op.prompts)
    raise RuntimeError(f"gpucache bug: {op!r} has no driver here")


async def _acall(op: Op, load: Callable[[list[str]], Awaitable[list[str]]] | None = None) -> Any:
    if isinstance(op, Work):
        return await asyncio.to_thread(op.fn, *op.args)
    if isinstance(op, Wait):
        return await wait(op.future)
    if isinstance(op, Load) and load is not None:
        return await load(op.prompts)
    raise RuntimeError(f"gpucache bug: {op!r} has no driver here")


async def wait(future: Future[str]) -> str:
    """Await a load another call runs. Shielded: a waiter that is cancelled must not cancel
    the shared future, which the loading call and the other waiters still use."""
    return await asyncio.shield(asyncio.wrap_future(future))


def run(flow: Flow, load: Callable[[list[str]], list[str]]) -> Any:
    """Drive ``flow`` on this thread."""
    value, error = None, None
    while True:
        done, op = _step(flow, value, error)
        if done:
            return op
        try:
            value, error = _call(op, load), None
        except BaseException as exc:
            value, error = None, exc


async def arun(flow: Flow, load: Callable[[list[str]], Awaitable[list[str]]]) -> Any:
    """Drive ``flow`` on the event loop: cache work in a worker thread, the rest awaited."""
    value, error = None, None
    while True:
        done, op = _step(flow, value, error)
        if done:
            return op
        try:
            value, error = await _acall(op, load), None
        except BaseException as exc:
            value, error = None, exc


def run_stream(cache: CacheState, flow: Flow, chunks: Callable[[], Iterable[str]]) -> Iterator[str]:
    """Drive a ``stream`` flow for a sync consumer, yielding the chunks it is to see. A
    consumer that stops reading raises GeneratorExit at a ``yield``; thrown into the flow, it
    releases the claim, and the flow re-raises it."""
    value, error = None, None
    while True:
        done, op = _step(flow, value, error)
        if done:
            if isinstance(op, Replay):
                yield from cache._replay(op.answer)
            return
        source: Any = None
        try:
            if not isinstance(op, LoadStream):
                value, error = _call(op), None
                continue
            parts: list[str] = []
            source = _iterate(chunks())
            for chunk in source:
                parts.append(check_response(chunk, "stream chunk"))
                yield chunk
            value, error = "".join(parts), None
        except BaseException as exc:
            value, error = None, exc
            closer = getattr(source, "close", None)
            if closer is not None:
                closer()


async def arun_stream(
    cache: CacheState, flow: Flow, chunks: Callable[[], Any]
) -> AsyncIterator[str]:
    """``run_stream`` for an async consumer: ``chunks()`` may return an async iterable, an
    awaitable of one, or a plain iterable."""
    value, error = None, None
    while True:
        done, op = _step(flow, value, error)
        if done:
            if isinstance(op, Replay):
                for chunk in cache._replay(op.answer):
                    yield chunk
            return
        source: Any = None
        try:
            if not isinstance(op, LoadStream):
                value, error = await _acall(op), None
                continue
            parts: list[str] = []
            source = chunks()
            if inspect.isawaitable(source):
                source = await source
            if hasattr(source, "__aiter__"):
                async for chunk in source:
                    parts.append(check_response(chunk, "stream chunk"))
                    yield chunk
            else:
                for chunk in _iterate(source):
                    parts.append(check_response(chunk, "stream chunk"))
                    yield chunk
            value, error = "".join(parts), None
        except BaseException as exc:
            value, error = None, exc
            if hasattr(source, "aclose"):
                await source.aclose()
            elif hasattr(source, "close"):
                source.close()


def _iterate(source: object) -> Iterator[str]:
    if isinstance(source, (str, bytes)) or not isinstance(source, Iterable):
        raise TypeError(
            f"a streaming loader must return an iterable of str chunks, got {type(source).__name__}"
        )
    return iter(source)
