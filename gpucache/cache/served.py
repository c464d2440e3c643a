"""What a get-or-load call answers with, and what its loader answers the cache: typed values, so
the caller matches once on what happened instead of piecing it together from flags.

The call answers ``Served[T]``, one of:

    Found(hit)            the lookup answered (exact or semantic tier): ``hit``, a ``Hit``,
                          says what was served and how it matched
    Loaded(value)         this call ran the loader: ``value`` is what the loader gave back
    Joined(text)          another call's load answered (here, or on another replica)

The loader answers, for the prompt it was given:

    Keep(text, value)     store ``text`` (policy and admission permitting; for ``ttl``
                          seconds where given), hand ``text`` to the calls waiting on this load,
                          and give ``value`` back to this call in ``Loaded``
    ServeOnly(value)      store nothing: ``value`` goes back to this call only, and the calls
                          waiting on this load run their own (an upstream's error, a truncated
                          answer: nothing another caller should be handed)

A streaming loader opens its source and answers ``Stream(value, chunks)`` or
``ServeOnly(value)`` (the source refused before any chunk). The chunks are str pieces, or
``Framed(text, frame)`` where the caller passes something on beside each piece's text (an
event's bytes as the source sent them, say); the last item may be ``ServeOnly()`` (serve what
streamed, keep none of it) or ``Keep(ttl=...)`` (keep the text that streamed, for that long);
without either the text is kept for the call's ttl.
The call then answers ``Loaded(value, pieces)``: the chunks as they come, each as the loader
gave it, for the caller to pass on; the text is stored when they end, and a caller that stops
reading stores nothing. Because a ``Framed`` chunk carries its frame through the cache, the
caller needs no side channel kept in step with the pieces by hand.

Why values and not callbacks or exceptions: vLLM's serving handlers return an error, a
response or a stream, and the route matches on the type; a reader can follow each case to its
end, and a type checker can tell when one is not handled.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from gpucache.conversation.value import Conversation

T = TypeVar("T")
F = TypeVar("F")
C_co = TypeVar("C_co", covariant=True)


@dataclass(frozen=True)
class Hit:
    """A served answer: the response, the prompt it was stored under, and how it matched.

    ``similarity`` is the full-precision cosine similarity (1.0 for exact hits); ``exact`` is
    True when the exact tier answered without running the embedder.
    """

    response: str
    cached_prompt: str | Conversation
    """The prompt as it was stored: a str, or the ``Conversation`` (its final request and the
    turns before it)."""
    similarity: float
    exact: bool
    age: float = field(default=math.inf, compare=False)
    """Seconds since the response was stored, on the cache's clock; inf where unknown (an
    entry restored from a snapshot or taken from another replica). A caller that accepts
    nothing older than N seconds (HTTP's ``Cache-Control: max-age=N``) compares it."""


@dataclass(frozen=True)
class Keep(Generic[T]):
    """A loader's answer to store and to serve. ``text`` is what is stored and what waiting
    calls get (None only as a stream's last item: the text that streamed); ``value`` is what
    this call gets back (``text`` where None); ``ttl``, where given, is how long it lives,
    replacing the call's."""

    text: str | None = None
    value: T | None = None
    ttl: float | None = None


@dataclass(frozen=True)
class ServeOnly(Generic[T]):
    """A loader's answer to give back to its call and to keep from everyone else."""

    value: T | None = None


@dataclass(frozen=True, slots=True)
class Framed(Generic[F]):
    """A stream's chunk that carries, beside the ``text`` the cache keeps, a ``frame`` the
    cache never reads: the caller reads the chunk back whole, in its place among the others."""

    text: str
    frame: F


@dataclass(frozen=True)
class Stream(Generic[T]):
    """A streaming loader's open source: ``value`` for its call (the response's headers, say),
    ``chunks`` the str or ``Framed`` pieces, sync or async, optionally ending with a ``Keep``
    or a ``ServeOnly``."""

    value: T | None
    chunks: AsyncIterable[object] | Iterable[object]


class Pieces(Protocol[C_co]):
    """A streamed load's chunks for an async caller, each as the loader gave it (``str`` or
    ``Framed``): iterate them, or close them (started or not) to give the load up."""

    def __aiter__(self) -> AsyncIterator[C_co]: ...

    def __anext__(self) -> Awaitable[C_co]: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class Found:
    """The lookup answered: ``hit.response``, stored for ``hit.cached_prompt``."""

    hit: Hit
    lookup_seconds: float = field(default=0.0, compare=False)
    """From the call to the lookup's decision (measured by the driver)."""


@dataclass(frozen=True)
class Loaded(Generic[T]):
    """This call ran the loader. ``value``: what the loader gave back. ``pieces``: for a
    streaming load, the chunks to pass on (iterate them to the end, or close them to give the
    load up). ``failed``: the answer was served but keeping it failed (the cache's error, for
    the caller to log or count; the loader's own errors are raised, never put here).
    ``refused``: where the verifier refused the best stored prompt at the threshold, the rule
    that did (``Verdict.rule``); empty where none reached it."""

    value: T | None
    pieces: Pieces[Any] | Iterator[Any] | None = None
    failed: Exception | None = field(default=None, compare=False)
    lookup_seconds: float = field(default=0.0, compare=False)
    refused: str = ""


@dataclass(frozen=True)
class Joined:
    """Another call's load answered this one, with ``text`` (the answer as it was stored)."""

    text: str
    lookup_seconds: float = field(default=0.0, compare=False)


Served = Found | Loaded[T] | Joined
LoaderAnswer = Keep[T] | ServeOnly[T]


def text_of(served: Found | Loaded[str] | Joined) -> str:
    """The answer's text, for calls whose loader answers str (the ``get_or_put`` family)."""
    if isinstance(served, Found):
        return served.hit.response
    if isinstance(served, Joined):
        return served.text
    if served.failed is not None:
        raise served.failed
    assert isinstance(served.value, str)
    return served.value


def text_of_chunk(chunk: object) -> str:
    """A streamed chunk's text, for the ``get_or_put_streaming`` family: a ``Framed`` chunk's
    ``text``, a str as it is."""
    return chunk.text if isinstance(chunk, Framed) else str(chunk)
