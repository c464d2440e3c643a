"""The get-or-load machine, written once; its sync and async drivers are drivers.py.

A get-or-load call looks its prompts up, claims the misses nobody else is loading, runs the
caller's loader on them, stores the answers, and hands them to every call that waited. When the
call it waited on gave up (``LoadAbandoned``), it claims again and loads itself. That logic is a
generator here (``get_or_load``, ``stream``) that yields named operations and receives their
results, as httpx's auth flows and psycopg 3's protocol do; it returns what the call is served
(``Served``: served.py). Each operation, and what it answers:

    Find(request)              the lookup: exact tier, embedder, scan, verifier, claims -> Claims
    ClaimShared(claims)          claims across replicas on this call's misses -> the prompts
                               another replica is loading (a cache with no other replica,
                               ``LocalOnly``, answers "none" at once)
    WaitShared(scope, prompts) the entries another replica is loading -> what arrived
    AdoptShared(claims, found)   those entries kept here and handed to this call -> their texts
    Load(prompts)              the caller's loader on the misses this call claimed -> answers
    Open()                     the caller's streaming loader opened -> Stream | ServeOnly
    Relay(stream)              the stream's chunks, passed to the caller as they come -> the
                               answer they make once they end (the driver hands the caller
                               ``Loaded(value, pieces)`` and runs the rest as they are read)
    Finish(claims, answers, ttl) store what the loader answered and hand it to the waiters
    Abort(claims, error)         release this call's claims, handing ``error`` to their waiters
    Wait(future)               the answer another call here is loading

The flow holds no cache: a driver (drivers.py) runs each operation on one and knows nothing
of the logic.

An operation that raises is thrown back into the generator at its ``yield``, so the generator's
``try`` blocks see the loader's error (and release its claims) whichever driver runs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar, cast

from gpucache.cache.claims import Claims
from gpucache.cache.flight import LoadAbandoned
from gpucache.cache.lookup import LookupRequest
from gpucache.cache.served import Found, Joined, Keep, Loaded, LoaderAnswer, Served, ServeOnly, Stream

if TYPE_CHECKING:
    from gpucache.cache.replication import SharedEntry

T = TypeVar("T")


@dataclass(frozen=True)
class Find:
    request: LookupRequest


@dataclass(frozen=True)
class ClaimShared:
    claims: Claims


@dataclass(frozen=True)
class WaitShared:
    """Async drivers poll on the event loop, so any number of such waits hold no worker thread
    that lookups need."""

    scope: str
    prompts: list[str]


@dataclass(frozen=True)
class AdoptShared:
    claims: Claims
    found: list[SharedEntry]


@dataclass(frozen=True)
class Load:
    prompts: list[str]


@dataclass(frozen=True)
class Open:
    pass


@dataclass(frozen=True)
class Relay:
    stream: Stream[Any]
    refused: str = ""  # the verifier's refusal on this prompt's lookup, for ``Loaded.refused``


@dataclass(frozen=True)
class Finish:
    claims: Claims
    answers: Sequence[LoaderAnswer[Any]]
    ttl: float | None


@dataclass(frozen=True)
class Abort:
    claims: Claims
    error: BaseException


@dataclass(frozen=True)
class Wait:
    """Raises what that load raised."""

    future: Future[str]


Op = Find | ClaimShared | WaitShared | AdoptShared | Load | Open | Relay | Finish | Abort | Wait
Flow = Generator[Op, object, T]


# ----------------------------------------------------------- each operation, typed for the flow


def _find(request: LookupRequest) -> Flow[Claims]:
    return cast(Claims, (yield Find(request)))


def _load(prompts: list[str]) -> Flow[Sequence[LoaderAnswer[Any]]]:
    return cast("Sequence[LoaderAnswer[Any]]", (yield Load(prompts)))


def _open() -> Flow[Stream[Any] | ServeOnly[Any]]:
    return cast("Stream[Any] | ServeOnly[Any]", (yield Open()))


def _relay(stream: Stream[Any], refused: str) -> Flow[LoaderAnswer[Any]]:
    return cast("LoaderAnswer[Any]", (yield Relay(stream, refused)))


def _wait(future: Future[str]) -> Flow[str]:
    return cast(str, (yield Wait(future)))


def _shared(claims: Claims) -> Flow[dict[str, str]]:
    """Claim this call's misses across replicas; wait for those another replica is loading
    and take what it stored: prompt -> answer."""
    others = cast("list[str]", (yield ClaimShared(claims)))
    if not others:
        return {}
    found = cast("list[SharedEntry]", (yield WaitShared(claims.scope, others)))
    return cast("dict[str, str]", (yield AdoptShared(claims, found)))


def _finish(
    claims: Claims, answers: Sequence[LoaderAnswer[Any]], ttl: float | None
) -> Flow[Exception | None]:
    """Store what the loader answered; a store that fails releases what claims it left (their
    waiters see its error) and is this call's to report (``Loaded.failed``): the answer was
    loaded, and it is served."""
    try:
        yield Finish(claims, answers, ttl)
    except Exception as exc:
        yield Abort(claims, exc)
        return exc
    return None


def _abandoned(exc: BaseException) -> BaseException:
    """The error a load's waiters see when it stopped: the loader's own error, or
    ``LoadAbandoned`` when the consumer stopped reading or the task was cancelled, in which
    case the waiters load it themselves."""
    if isinstance(exc, (GeneratorExit, asyncio.CancelledError)):
        return LoadAbandoned()
    return exc


def _answered(claims: Claims, prompt: str) -> Served[Any] | None:
    """What the lookup answered for ``prompt``: a hit, or an answer another call stored while
    this lookup ran (read again before claiming); None for a miss."""
    hit = claims.found.hits.get(prompt)
    if hit is not None:
        return Found(hit)
    if prompt in claims.stored:
        return Joined(claims.stored[prompt])
    return None


def _value(answer: LoaderAnswer[Any]) -> Any:
    if isinstance(answer, Keep) and answer.value is None:
        return answer.text
    return answer.value


# ------------------------------------------------------------------------------- the flows


def get_or_load(
    prompts: list[str], scope: str, threshold: float, ttl: float | None = None, refresh: bool = False
) -> Flow[list[Served[Any]]]:
    """What each of ``prompts`` is served, in input order, loading the misses this call claims
    (and storing them for ``ttl`` seconds, or the cache's default where None); with ``refresh``,
    nothing stored is served (``LookupRequest.refresh``)."""
    served: dict[str, Served[Any]] = {}
    request = LookupRequest(tuple(prompts), scope, threshold, claim=True, refresh=refresh)
    while True:
        claims = yield from _find(request)
        for prompt in claims.found.unique:
            answered = _answered(claims, prompt)
            if answered is not None:
                served[prompt] = answered
        if claims.mine:
            try:  # the claims are released whatever ends this: an error, a cancellation
                adopted = yield from _shared(claims)  # another replica may be loading some
                served.update((p, Joined(text)) for p, text in adopted.items())
                loading = claims.to_load
                answers = (yield from _load(loading)) if loading else []  # the caller's code: no lock held
            except BaseException as exc:
                yield Abort(claims, _abandoned(exc))
                raise
            if loading:
                failed = yield from _finish(claims, answers, ttl)
                served.update(
                    (p, Loaded(_value(a), failed=failed, refused=claims.found.refused.get(p, "")))
                    for p, a in zip(loading, answers)
                )
        retry = []
        for key, future in claims.elsewhere.items():
            prompt = claims.prompt_of[key]
            try:
                served[prompt] = Joined((yield from _wait(future)))  # its error is ours too
            except LoadAbandoned:
                retry.append(prompt)
        if not retry:
            return [served[p] for p in prompts]
        request = replace(request, prompts=tuple(retry), count=False)


def stream(
    prompt: str, scope: str, threshold: float, ttl: float | None = None, refresh: bool = False
) -> Flow[Served[Any]]:
    """What ``prompt`` is served, loading a miss through the streaming loader (``Open``, then
    ``Relay``) and storing the text its chunks made once they end; with ``refresh``, nothing
    stored is served."""
    request = LookupRequest((prompt,), scope, threshold, claim=True, refresh=refresh)
    while True:
        claims = yield from _find(request)
        answered = _answered(claims, prompt)
        if answered is not None:
            return answered
        if not claims.elsewhere:
            break
        try:  # another call is loading it: its answer, when it completes
            return Joined((yield from _wait(next(iter(claims.elsewhere.values())))))
        except LoadAbandoned:
            request = replace(request, count=False)
    try:
        adopted = yield from _shared(claims)  # another replica may be loading it
        if prompt in adopted:
            return Joined(adopted[prompt])
        opened = yield from _open()
        refused = claims.found.refused.get(prompt, "")
        answer = opened if isinstance(opened, ServeOnly) else (yield from _relay(opened, refused))
    except BaseException as exc:
        yield Abort(claims, _abandoned(exc))
        raise
    failed = yield from _finish(claims, [answer], ttl)
    return Loaded(opened.value, failed=failed, refused=refused)
