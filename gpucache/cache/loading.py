"""The facade's get-or-load calls: look a prompt up, and on a miss run the caller's loader, store
its answer and hand it to every call that waited (flow.py runs them on the cache's core).

Two families, one machine:

- ``get_or_load``, ``aget_or_load``, ``aget_or_load_streaming``: typed. The loader answers
  ``Keep(text, value)`` or ``ServeOnly(value)`` (a streaming one, ``Stream(value, chunks)`` or
  ``ServeOnly(value)``), and the call answers ``Served``: ``Found(hit)``, ``Loaded(value)`` or
  ``Joined(text)`` (served.py). For callers that must know what happened and carry more than
  the text: a server relays its upstream's own response on a miss, says hit or miss in its
  headers, and keeps an upstream's error from every other caller.
- ``get_or_put`` and the rest: the text. The loader answers a str, and the call the answer.

``SemanticCache`` (semantic.py) is the class that has them; this part needs only its core.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar, cast

from gpucache.cache import drivers, flow
from gpucache.cache.core import CacheCore
from gpucache.cache.served import Keep, Loaded, Pieces, Served, ServeOnly, Stream, text_of, text_of_chunk
from gpucache.cache.validation import (
    check_answer,
    check_batch,
    check_flag,
    check_loaded,
    check_loader,
    check_prompt,
    check_prompts,
    check_scope,
    check_ttl,
)
from gpucache.conversation.value import Prompt, given

T = TypeVar("T")

Loader = Callable[[Prompt], str]
BatchLoader = Callable[[list[Prompt]], Sequence[str]]
StreamLoader = Callable[[Prompt], Iterable[str]]
AsyncLoader = Callable[[Prompt], Awaitable[str]]
AsyncBatchLoader = Callable[[list[Prompt]], Awaitable[Sequence[str]]]
AsyncStreamLoader = Callable[[Prompt], Any]  # returns an async iterable (or an iterable) of chunks
TypedLoader = Callable[[Prompt], "Keep[T] | ServeOnly[T]"]
AsyncTypedLoader = Callable[[Prompt], Awaitable["Keep[T] | ServeOnly[T]"]]
StreamOpener = Callable[[Prompt], Any]  # returns Stream | ServeOnly, or an awaitable of one


class GetOrLoad:
    """The get-or-load calls of a cache whose core is ``_core``."""

    _core: CacheCore

    @property
    def _threshold(self) -> float:
        return self._core.settings.threshold

    # --------------------------------------------------------------------------- typed

    def get_or_load(
        self,
        prompt: Prompt,
        loader: TypedLoader[T],
        *,
        scope: str | None = None,
        ttl: float | None = None,
        refresh: bool = False,
    ) -> Served[T]:
        """What ``prompt`` is served: ``Found(hit)``, or on a miss ``loader(prompt)`` run
        (``Loaded(value)``), or another call's load (``Joined(text)``).

        The loader answers ``Keep(text, value)``: ``text`` is stored (when the cache policy
        allows it and the admission policy admits it) for ``Keep.ttl``, else ``ttl``, else the
        cache's ttl, and handed to the calls waiting on this load; or ``ServeOnly(value)``:
        nothing is stored, and those calls run their own load. Concurrent misses on the same
        (scope, prompt) call the loader once. A loader that raises stores nothing; its
        exception reaches this caller and those waiting on it. A store that fails after the
        loader answered is ``Loaded.failed``: the value is served either way.

        With ``refresh``, nothing stored is served (a client's ``no-cache``, an answer older
        than it accepts): the loader runs, or a load of the prompt already running is joined,
        and its answer replaces the entry as a miss's is stored, policy and admission
        permitting; calls without it are served the stored answer meanwhile."""
        prompt, scope, ttl = check_prompt(prompt), check_scope(scope), check_ttl(ttl)
        check_loader(loader, "loader(prompt) -> Keep(text, value) or ServeOnly(value)")
        flowing = flow.get_or_load([prompt], scope, self._threshold, ttl, check_flag(refresh, "refresh"))
        served = drivers.run(self._core, flowing, lambda missed: [check_answer(loader(given(missed[0])))])
        return served[0]

    async def aget_or_load(
        self,
        prompt: Prompt,
        loader: AsyncTypedLoader[T],
        *,
        scope: str | None = None,
        ttl: float | None = None,
        refresh: bool = False,
    ) -> Served[T]:
        """``get_or_load`` with an async loader: the lookup coalesced with concurrent ones, the
        cache's work in worker threads, nothing on the event loop waiting on the cache's lock."""
        prompt, scope, ttl = check_prompt(prompt), check_scope(scope), check_ttl(ttl)
        check_loader(loader, "async loader(prompt) -> Keep(text, value) or ServeOnly(value)")

        async def load(missed: list[str]) -> list[Any]:
            return [check_answer(await loader(given(missed[0])))]

        flowing = flow.get_or_load([prompt], scope, self._threshold, ttl, check_flag(refresh, "refresh"))
        served = await drivers.arun(self._core, flowing, load)
        return served[0]

    async def aget_or_load_streaming(
        self,
        prompt: Prompt,
        loader: StreamOpener,
        *,
        scope: str | None = None,
        ttl: float | None = None,
        refresh: bool = False,
    ) -> Served[Any]:
        """``aget_or_load`` for a streamed answer. On a miss ``loader(prompt)`` opens the source
        and answers ``Stream(value, chunks)``, or ``ServeOnly(value)`` where it refused before
        any chunk; the call answers ``Loaded(value, pieces)``: iterate ``pieces`` (the chunks,
        as they come) to the end to store their text, or close it to give the load up (its
        waiters then load their own). The chunks may end with ``ServeOnly()`` (keep nothing)
        or ``Keep(ttl=...)``. A hit or a joined load answers with its whole text, to replay.
        ``refresh`` as for ``get_or_load``."""
        prompt, scope, ttl = check_prompt(prompt), check_scope(scope), check_ttl(ttl)
        check_loader(loader, "loader(prompt) -> Stream(value, chunks) or ServeOnly(value)")

        async def open_() -> Stream[Any] | ServeOnly[Any]:
            opened = loader(given(prompt))
            if inspect.isawaitable(opened):
                opened = await opened
            if not isinstance(opened, (Stream, ServeOnly)):
                raise TypeError(
                    f"a streaming loader must answer Stream(value, chunks) or ServeOnly(value), "
                    f"got {type(opened).__name__}"
                )
            return opened

        flowing = flow.stream(prompt, scope, self._threshold, ttl, check_flag(refresh, "refresh"))
        return await drivers.arun(self._core, flowing, open_=open_)

    # ---------------------------------------------------------------------------- text

    def get_or_put(
        self, prompt: Prompt, loader: Loader, *, scope: str | None = None, ttl: float | None = None
    ) -> str:
        """The cached answer for ``prompt``, or ``loader(prompt)``'s, which is then stored
        (when the cache policy allows it and the admission policy admits it) for ``ttl``
        seconds (the cache's default where None). Concurrent misses on the same (scope,
        prompt) call the loader once. A loader that raises stores nothing; its exception
        reaches the caller unchanged. ``get_or_load`` is this call with typed answers."""
        prompt, scope, ttl = check_prompt(prompt), check_scope(scope), check_ttl(ttl)
        check_loader(loader, "loader(prompt) -> str")
        served = drivers.run(
            self._core,
            flow.get_or_load([prompt], scope, self._threshold, ttl),
            lambda missed: [check_loaded(loader(given(missed[0])))],
        )
        return text_of(served[0])

    def get_or_put_all(
        self, prompts: Sequence[Prompt], loader: BatchLoader, *, scope: str | None = None
    ) -> list[str]:
        """Answers for every prompt, calling ``loader`` once with all the distinct misses.

        ``loader(missed_prompts) -> responses`` gets the distinct misses in first-seen order and
        must return one str per prompt, in the same order; otherwise ``ValueError``/``TypeError``
        and nothing is stored. Duplicates in ``prompts`` share one load. Results come back in
        input order. Misses that another call is already loading are waited for, not reloaded.
        A loader that raises stores nothing from the batch, and its error reaches the caller.
        """
        prompts, scope = check_prompts(prompts), check_scope(scope)
        check_loader(loader, "loader(prompts) -> list of responses")
        served = drivers.run(
            self._core,
            flow.get_or_load(prompts, scope, self._threshold),
            lambda missed: check_batch(loader([given(p) for p in missed]), len(missed)),
        )
        return [text_of(s) for s in served]

    async def aget_or_put(
        self, prompt: Prompt, loader: AsyncLoader, *, scope: str | None = None, ttl: float | None = None
    ) -> str:
        """``get_or_put`` with an async loader (``async def loader(prompt) -> str``)."""
        prompt, scope, ttl = check_prompt(prompt), check_scope(scope), check_ttl(ttl)
        check_loader(loader, "async loader(prompt) -> str")

        async def load(missed: list[str]) -> list[Keep[str]]:
            return [check_loaded(await loader(given(missed[0])))]

        served = await drivers.arun(self._core, flow.get_or_load([prompt], scope, self._threshold, ttl), load)
        return text_of(served[0])

    async def aget_or_put_all(
        self, prompts: Sequence[Prompt], loader: AsyncBatchLoader, *, scope: str | None = None
    ) -> list[str]:
        """``get_or_put_all`` with an async batch loader."""
        prompts, scope = check_prompts(prompts), check_scope(scope)
        check_loader(loader, "async loader(prompts) -> list of responses")

        async def load(missed: list[str]) -> list[Keep[str]]:
            return check_batch(await loader([given(p) for p in missed]), len(missed))

        served = await drivers.arun(self._core, flow.get_or_load(prompts, scope, self._threshold), load)
        return [text_of(s) for s in served]

    def get_or_put_streaming(
        self, prompt: Prompt, loader: StreamLoader, *, scope: str | None = None, ttl: float | None = None
    ) -> Iterator[str]:
        """Stream the answer for ``prompt``: a hit is replayed in ``replay_chunk_chars`` chunks;
        a miss passes ``loader(prompt)``'s chunks through as they arrive.

        The full response is stored only after the loader's stream completes, through the cache
        policy and admission. A consumer that stops reading (closes the iterator) or a loader
        that raises stores nothing; the loader's error reaches the consumer unchanged. Input is
        checked when this is called; the lookup and the load start at the first ``next()``, so
        an iterator that is never started holds nothing and blocks no one. ``ttl`` as in
        ``get_or_put``. A loader whose last item is ``ServeOnly()`` (not passed on) has its
        chunks served and nothing stored. A ``Framed`` chunk is served as its text (a hit has
        no frames to give)."""
        prompt, scope, ttl = check_prompt(prompt), check_scope(scope), check_ttl(ttl)
        check_loader(loader, "loader(prompt) -> iterable of str chunks")
        core = self._core

        def chunks() -> Iterator[str]:
            served = drivers.run(
                core,
                flow.stream(prompt, scope, self._threshold, ttl),
                open_=lambda: Stream(None, loader(given(prompt))),
            )
            if isinstance(served, Loaded):
                yield from map(text_of_chunk, cast(Iterator[object], served.pieces))
            else:
                yield from core.replay(text_of(served))

        return chunks()

    def aget_or_put_streaming(
        self, prompt: Prompt, loader: AsyncStreamLoader, *, scope: str | None = None, ttl: float | None = None
    ) -> AsyncGenerator[str, None]:
        """``get_or_put_streaming`` for asyncio: ``loader(prompt)`` returns an async iterator
        of chunks (an async generator, say); a plain iterable or an awaitable of either is
        accepted too. Use it with ``async for``. Input is checked when this is called, the
        lookup starts at the first ``__anext__``."""
        prompt, scope, ttl = check_prompt(prompt), check_scope(scope), check_ttl(ttl)
        check_loader(loader, "loader(prompt) -> async iterable of str chunks")
        core = self._core

        async def open_() -> Stream[None]:
            source = loader(given(prompt))
            if inspect.isawaitable(source):
                source = await source
            return Stream(None, source)

        async def chunks() -> AsyncGenerator[str, None]:
            served = await drivers.arun(core, flow.stream(prompt, scope, self._threshold, ttl), open_=open_)
            if not isinstance(served, Loaded):
                for piece in core.replay(text_of(served)):
                    yield piece
                return
            pieces = cast("Pieces[object]", served.pieces)
            try:
                async for chunk in pieces:
                    yield text_of_chunk(chunk)
            finally:
                await pieces.aclose()

        return chunks()
