"""``SemanticCache``: answer a prompt from an earlier prompt that meant the same thing.

One lookup (DESIGN.md, "Data flow"):

    validate -> exact tier (scope, text) -> embed -> index.search (top-K, in scope)
             -> candidates >= threshold, best first -> verifier -> serve | miss

The exact tier answers a repeated prompt without running the embedder. A semantic candidate is
served only when its full-precision cosine similarity is at or above ``threshold`` *and* the
verifier accepts it; when the best candidate is rejected the next ones above the threshold are
tried, up to ``top_k``. Scopes (tenants, models, system prompts) never see each other's entries:
the scope is masked inside the scan.

The parts: ``CacheSettings`` (settings.py) holds the scalar settings; ``CacheState``
(state.py) the collaborators, the lock and the operations on the state; ``EntryTable``
(entries.py) the entries over the index; ``flow.py`` the get-or-load state machine and its sync
and async drivers; ``snapshot.py`` the file format. This module is the facade: it validates
input, then runs the flows.

The async API never takes the cache's lock on the event loop: every operation that may wait on
it runs in a worker thread (flow.py).
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

from gpucache.cache import flow
from gpucache.cache.batching import LookupTimeout
from gpucache.cache.flight import LoadAbandoned, Unstored
from gpucache.cache.lookup import Hit, Plan
from gpucache.cache.settings import CacheSettings, read_settings_file
from gpucache.cache.snapshot import SnapshotError, read_snapshot
from gpucache.cache.state import CacheState
from gpucache.cache.validation import (
    check_prompt,
    check_prompts,
    check_response,
    check_scope,
    check_ttl,
)
from gpucache.devices import DeviceLike
from gpucache.embedding.embedder import DEFAULT_MODEL_NAME, Embedder, TransformerEmbedder
from gpucache.policy.admission import AdmissionPolicy

__all__ = ["Hit", "LoadAbandoned", "LookupTimeout", "SemanticCache", "Unstored"]

Loader = Callable[[str], str]
BatchLoader = Callable[[list[str]], Sequence[str]]
StreamLoader = Callable[[str], Iterable[str]]
AsyncLoader = Callable[[str], Awaitable[str]]
AsyncBatchLoader = Callable[[list[str]], Awaitable[Sequence[str]]]
AsyncStreamLoader = Callable[[str], Any]  # returns an async iterable (or an iterable) of chunks
OnLookup = Callable[[Hit | None], None] | None


class SemanticCache(CacheState):
    """A semantic cache of LLM responses.

    Args:
        embedder: turns prompts into unit vectors; None loads the packaged all-MiniLM-L6-v2
            (``TransformerEmbedder``) on ``device``.
        verifier: the last word on every candidate above the threshold (``HitVerifier``);
            None uses ``LexicalNearMissVerifier``; ``ThresholdOnly()`` lets similarity decide.
        device: where the index's vectors live: "auto" (CUDA when present), "cpu", "cuda[:N]".
        timer: the clock for expiry, in seconds; injectable for tests.
        cache_policy: may an answer be stored at all (``CachePolicy``), on every write path;
            None uses ``ContentPolicy()``; ``StoreEverything()`` turns the checks off.
        admission: is an answer worth storing (``AdmissionPolicy``), on the writes after a
            miss only; None stores every miss.
        engine: the index's scan engine (``gpucache.index.engines``); None chooses one for the
            device and storage dtype.
        shared: a ``Replication`` (``gpucache.cache.replication``), such as ``RedisShare``
            (``gpucache.share.redis``): this cache's entries are shared with the other replicas
            on the same Redis or Valkey; None (``LocalOnly``) keeps them to this process.
        settings: the scalar settings (``CacheSettings``); None takes the defaults.
        **options: single settings by name, replacing those of ``settings``: ``threshold``,
            ``top_k``, ``capacity``, ``ttl``, ``quantization``... (``CacheSettings`` documents
            each; an unknown name is a TypeError listing them).
    """

    # ----------------------------------------------------------------------------- reads

    def get(self, prompt: str, *, scope: str | None = None, threshold: float | None = None) -> Hit | None:
        """The cached answer for ``prompt`` in ``scope``, or None on a miss."""
        return self.get_all([check_prompt(prompt)], scope=scope, threshold=threshold)[0]

    def get_all(
        self, prompts: Sequence[str], *, scope: str | None = None, threshold: float | None = None
    ) -> list[Hit | None]:
        """``get`` for a whole list: one embedder batch and one scan; results in input order."""
        request = self._get_request(prompts, scope, threshold)
        return _ordered_hits(self._lookup_batch([request])[0])

    async def aget(
        self, prompt: str, *, scope: str | None = None, threshold: float | None = None
    ) -> Hit | None:
        """``get`` for asyncio: embedding and scanning run in a worker thread."""
        return (await self.aget_all([check_prompt(prompt)], scope=scope, threshold=threshold))[0]

    async def aget_all(
        self, prompts: Sequence[str], *, scope: str | None = None, threshold: float | None = None
    ) -> list[Hit | None]:
        """``get_all`` for asyncio: the event loop keeps serving while the batch is embedded, and
        lookups from concurrent calls share one batch where ``lookup_window_seconds`` is set."""
        return _ordered_hits(await self._alookup(self._get_request(prompts, scope, threshold)))

    # ----------------------------------------------------------------------------- writes

    def put(
        self, prompt: str, response: str, *, scope: str | None = None, ttl: float | None = None
    ) -> bool:
        """Store ``response`` for ``prompt``; replaces an existing entry for the same prompt.

        Returns False when the cache policy refuses it (counted in ``stats().refusals``).
        Admission does not apply: a caller saying "store this" is not traffic.
        """
        prompt = check_prompt(prompt)
        response = check_response(response)
        scope = check_scope(scope)
        ttl = self.ttl if ttl is None else check_ttl(ttl)
        return self._put([(prompt, response)], scope, ttl) == 1

    def warm(self, pairs: Iterable[tuple[str, str]], *, scope: str | None = None) -> int:
        """Store many (prompt, response) pairs with one embedder call; returns how many stored.

        A prompt given twice keeps its last response. Pairs the cache policy refuses are
        skipped (and counted); admission does not apply.
        """
        scope = check_scope(scope)
        if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Iterable):
            raise TypeError("pairs must be an iterable of (prompt, response) tuples")
        latest: dict[str, str] = {}
        for i, pair in enumerate(pairs):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError(f"pairs[{i}] must be a (prompt, response) pair, got {pair!r:.80}")
            prompt = check_prompt(pair[0], f"pairs[{i}][0]")
            latest[prompt] = check_response(pair[1], f"pairs[{i}][1]")
        return self._put(list(latest.items()), scope, self.ttl)

    def get_or_put(
        self, prompt: str, loader: Loader, *, scope: str | None = None, ttl: float | None = None,
        on_lookup: OnLookup = None,
    ) -> str:
        """The cached answer for ``prompt``, or ``loader(prompt)``'s, which is then stored
        (when the cache policy allows it and the admission policy admits it).

        Concurrent misses on the same (scope, prompt) call the loader once. A loader that
        raises stores nothing; its exception reaches the caller unchanged. A loaded answer lives
        ``ttl`` seconds (the cache's default where None). ``on_lookup(hit)``,
        where given, is called once the lookup is done, before any load: with the ``Hit`` that
        answers, or None for a miss (a server says which in its response headers).

        A loader may return ``Unstored(value)`` instead of a str: an answer to serve this caller
        but not to keep (an error, a truncated answer). It comes back as it is, nothing is
        stored, and the calls waiting on this load run their own.
        """
        prompt, scope, ttl = check_prompt(prompt), check_scope(scope), check_ttl(ttl)
        _check_callable(loader, "loader(prompt) -> str")
        return flow.run(flow.get_or_load(self, [prompt], scope, ttl),
                        lambda missed: [_one(loader(missed[0]))], _reporter(prompt, on_lookup))[0]

    def get_or_put_all(
        self, prompts: Sequence[str], loader: BatchLoader, *, scope: str | None = None
    ) -> list[str]:
        """Answers for every prompt, calling ``loader`` once with all the distinct misses.

        ``loader(missed_prompts) -> responses`` gets the distinct misses in first-seen order and
        must return one str per prompt, in the same order; otherwise ``ValueError``/``TypeError``
        and nothing is stored. Duplicates in ``prompts`` share one load. Results come back in
        input order. Misses that another call is already loading are waited for, not reloaded.
        A loader that raises stores nothing from the batch, and its error reaches the caller.
        """
        prompts, scope = check_prompts(prompts), check_scope(scope)
        _check_callable(loader, "loader(prompts) -> list of responses")
        return flow.run(flow.get_or_load(self, prompts, scope),
                        lambda missed: _check_batch(loader(list(missed)), len(missed)))

    def get_or_put_streaming(
        self, prompt: str, loader: StreamLoader, *, scope: str | None = None,
        ttl: float | None = None, on_lookup: OnLookup = None,
    ) -> Iterator[str]:
        """Stream the answer for ``prompt``: a hit is replayed in ``replay_chunk_chars`` chunks;
        a miss passes ``loader(prompt)``'s chunks through as they arrive.

        The full response is stored only after the loader's stream completes, through the cache
        policy and admission. A consumer that stops reading (closes the iterator) or a loader
        that raises stores nothing; the loader's error reaches the consumer unchanged. Input is
        checked when this is called; the lookup and the load start at the first ``next()``, so
        an iterator that is never started holds nothing and blocks no one. ``ttl`` and
        ``on_lookup`` as in ``get_or_put``; ``on_lookup`` is called before the first chunk.
        A loader that yields ``Unstored()`` (as its last item; it is not passed on) has its
        chunks served and nothing stored, as ``get_or_put``'s loader that returns it.
        """
        prompt, scope, ttl = check_prompt(prompt), check_scope(scope), check_ttl(ttl)
        _check_callable(loader, "loader(prompt) -> iterable of str chunks")
        return flow.run_stream(self, flow.stream(self, prompt, scope, ttl), lambda: loader(prompt),
                               _reporter(prompt, on_lookup))

    async def aget_or_put(
        self, prompt: str, loader: AsyncLoader, *, scope: str | None = None,
        ttl: float | None = None, on_lookup: OnLookup = None,
    ) -> str:
        """``get_or_put`` with an async loader (``async def loader(prompt) -> str``)."""
        prompt, scope, ttl = check_prompt(prompt), check_scope(scope), check_ttl(ttl)
        _check_callable(loader, "async loader(prompt) -> str")

        async def load_one(missed: list[str]) -> list[str]:
            return [_one(await loader(missed[0]))]

        return (await flow.arun(flow.get_or_load(self, [prompt], scope, ttl), load_one,
                                _reporter(prompt, on_lookup)))[0]

    async def aget_or_put_all(
        self, prompts: Sequence[str], loader: AsyncBatchLoader, *, scope: str | None = None
    ) -> list[str]:
        """``get_or_put_all`` with an async batch loader."""
        prompts, scope = check_prompts(prompts), check_scope(scope)
        _check_callable(loader, "async loader(prompts) -> list of responses")

        async def load_batch(missed: list[str]) -> list[str]:
            return _check_batch(await loader(list(missed)), len(missed))

        return await flow.arun(flow.get_or_load(self, prompts, scope), load_batch)

    def aget_or_put_streaming(
        self, prompt: str, loader: AsyncStreamLoader, *, scope: str | None = None,
        ttl: float | None = None, on_lookup: OnLookup = None,
    ) -> AsyncGenerator[str, None]:
        """``get_or_put_streaming`` for asyncio: ``loader(prompt)`` returns an async iterator
        of chunks (an async generator, say); a plain iterable is accepted too. Use it with
        ``async for``. Input is checked when this is called, the lookup starts at the first
        ``__anext__``."""
        prompt, scope, ttl = check_prompt(prompt), check_scope(scope), check_ttl(ttl)
        _check_callable(loader, "loader(prompt) -> async iterable of str chunks")
        return flow.arun_stream(self, flow.stream(self, prompt, scope, ttl), lambda: loader(prompt),
                                _reporter(prompt, on_lookup))

    @classmethod
    def from_config(
        cls, path: str | os.PathLike[str], embedder: Embedder | None = None, **collaborators: Any
    ) -> SemanticCache:
        """A cache with the settings of a TOML settings file: its ``[cache]`` table
        (``CacheSettings``) and its ``[guard]`` table (the soft rules switched off), as
        ``gpucache calibrate`` writes them. ``collaborators`` as for the constructor; a
        ``verifier=`` given here replaces the file's guard."""
        settings, guard = read_settings_file(path)
        collaborators.setdefault("verifier", guard.build())
        return cls(embedder, settings=settings, **collaborators)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        embedder: Embedder | None = None,
        device: DeviceLike = "auto",
        *,
        key: bytes | None = None,
        **overrides: Any,
    ) -> SemanticCache:
        """A cache from a snapshot written by ``save``, on ``device`` (any device: vectors are
        stored on the CPU). ``overrides`` replace saved settings or add collaborators
        (``verifier=``, ``cache_policy=``, ``timer=``...). Entries already expired are dropped.

        Raises ``SnapshotError`` for a missing, corrupt, truncated or other-version file, for
        one written with another model or dimension than ``embedder``'s, and, with ``key``,
        for one not signed with that key (``save(path, key=...)``).
        """
        snapshot = read_snapshot(path, key)
        if embedder is None:
            if snapshot.model != DEFAULT_MODEL_NAME:
                raise SnapshotError(
                    f"{path} was written with model {snapshot.model!r}: pass embedder= that model"
                )
            embedder = TransformerEmbedder(device=device)
        if embedder.dim != snapshot.dim:
            raise SnapshotError(
                f"{path} holds {snapshot.dim}-dimensional vectors, the embedder makes {embedder.dim}"
            )
        if embedder.name != snapshot.model:
            raise SnapshotError(
                f"{path} was written with model {snapshot.model!r}, the embedder is {embedder.name!r}"
            )
        try:
            saved = CacheSettings.from_json(snapshot.settings)
        except (TypeError, ValueError) as exc:
            raise SnapshotError(f"{path} is corrupt: bad settings ({exc})") from exc
        if snapshot.admission is not None and "admission" not in overrides:
            try:
                overrides["admission"] = AdmissionPolicy.from_state(snapshot.admission)
            except (ValueError, KeyError, TypeError) as exc:
                raise SnapshotError(f"{path} is corrupt: bad admission sketch ({exc})") from exc
        cache = cls(embedder, device=device, settings=saved, **overrides)
        cache._restore(snapshot)
        return cache


def _reporter(prompt: str, on_lookup: OnLookup) -> Callable[[Plan], None] | None:
    """The flow's ``on_find`` for a caller's ``on_lookup(hit)``."""
    if on_lookup is None:
        return None
    if not callable(on_lookup):
        raise TypeError("on_lookup must be callable: on_lookup(hit or None)")
    return lambda plan: on_lookup(plan.hits[prompt])


def _ordered_hits(plan: Plan) -> list[Hit | None]:
    return [plan.hits[p] for p in plan.prompts]


def _one(response: object) -> str | Unstored:
    if isinstance(response, Unstored):
        return response
    return check_response(response, "loader's response")


def _check_callable(loader: object, shape: str) -> None:
    if not callable(loader):
        raise TypeError(f"loader must be callable: {shape}")


def _check_batch(responses: object, expected: int) -> list[str]:
    """A batch loader's answer: a list of ``expected`` str, or a clear error."""
    if isinstance(responses, (str, bytes)) or not isinstance(responses, Iterable):
        raise TypeError(f"loader must return a list of str, got {type(responses).__name__}")
    responses = list(responses)
    if len(responses) != expected:
        raise ValueError(f"loader returned {len(responses)} responses for {expected} prompts")
    return [r if isinstance(r, Unstored) else check_response(r, f"loader's response [{i}]")
            for i, r in enumerate(responses)]
