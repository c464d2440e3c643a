"""``SemanticCache``: answer a prompt from an earlier prompt that meant the same thing.

One lookup (DESIGN.md, "Data flow"):

    validate -> exact tier (scope, text) -> embed -> store.search (top-K, in scope)
             -> candidates >= threshold, best first -> verifier -> serve | miss

The exact tier answers a repeated prompt without running the embedder. A semantic candidate is
served only when its full-precision cosine similarity is at or above ``threshold`` *and* the
verifier accepts it; when the best candidate is rejected the next ones above the threshold are
tried, up to ``top_k``. Scopes (tenants, models, system prompts) never see each other's entries:
the scope is masked inside the scan.

Locking: one re-entrant lock guards the entries, the store and the counters. The embedder and
the caller's loader never run under it, so a slow model call never blocks readers; state that
may have changed meanwhile is re-read after the lock is taken again.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from gpucache.admission import AdmissionPolicy
from gpucache.devices import DeviceLike, resolve_device
from gpucache.embedder import DEFAULT_MODEL_NAME, Embedder, TransformerEmbedder
from gpucache.flight import SingleFlight
from gpucache.keys import prompt_key
from gpucache.lexical import LexicalNearMissVerifier
from gpucache.policy import CachePolicy, ContentPolicy
from gpucache.snapshot import Snapshot, SnapshotEntry, SnapshotError, read_snapshot, write_snapshot
from gpucache.stats import CacheStats, StatsCounter
from gpucache.store import NEVER, ExactScanStore
from gpucache.validation import (
    check_positive_int,
    check_prompt,
    check_prompts,
    check_response,
    check_scope,
    check_threshold,
    check_ttl,
)
from gpucache.verifier import HitVerifier

log = logging.getLogger("gpucache")

# Chosen from bench/reports/semantic-false-hits.md: with the lexical verifier, the lowest
# threshold at which qqp serves <= 6% of its different-question pairs (5.6%, serving 36.0% of
# its duplicates); paws_wiki near-misses are then served 3.7% of the time.
DEFAULT_THRESHOLD = 0.875
# One candidate: in the intent replay a second candidate added more wrong answers than hits.
DEFAULT_TOP_K = 1
DEFAULT_CAPACITY = 100_000

Loader = Callable[[str], str]
BatchLoader = Callable[[list[str]], Sequence[str]]
StreamLoader = Callable[[str], Iterable[str]]
AsyncLoader = Callable[[str], Awaitable[str]]
AsyncBatchLoader = Callable[[list[str]], Awaitable[Sequence[str]]]
AsyncStreamLoader = Callable[[str], Any]  # returns an async iterable (or an iterable) of chunks


class LoadAbandoned(RuntimeError):
    """The call loading a prompt gave up before its load completed: its stream's consumer
    stopped reading, or its asyncio task was cancelled. Calls that were waiting for that load
    run their own instead; callers never see this error."""


@dataclass(frozen=True)
class Hit:
    """A served answer: the response, the prompt it was stored under, and how it matched.

    ``similarity`` is the full-precision cosine similarity (1.0 for exact hits); ``exact`` is
    True when the exact tier answered without running the embedder.
    """

    response: str
    cached_prompt: str
    similarity: float
    exact: bool


@dataclass
class _Entry:
    key: bytes
    scope: str
    prompt: str
    response: str
    row: int
    expires_at: float


@dataclass
class _Plan:
    """What one get-or-load call found and must do: the first half runs before the loader,
    the second after it, so the loader (sync or async) runs with no lock held."""

    scope: str
    prompts: list[str]  # input order
    unique: list[str]  # distinct, first-seen order
    vectors: torch.Tensor  # (len(unique), D): embeddings of every prompt that missed the exact tier
    answers: dict[str, str] = field(default_factory=dict)
    keys: dict[bytes, str] = field(default_factory=dict)
    mine: list[bytes] = field(default_factory=list)  # misses this call loads
    theirs: dict[bytes, Future[str]] = field(default_factory=dict)  # misses another call loads

    @property
    def to_load(self) -> list[str]:
        return [self.keys[k] for k in self.mine]

    def ordered(self) -> list[str]:
        return [self.answers[p] for p in self.prompts]


class SemanticCache:
    """A semantic cache of LLM responses.

    Args:
        embedder: turns prompts into unit vectors; None loads the packaged all-MiniLM-L6-v2
            (``TransformerEmbedder``) on ``device``.
        threshold: the lowest cosine similarity a semantic candidate may have to be served,
            in (0, 1]. See the README for the evidence behind the default.
        verifier: the last word on every candidate above the threshold (``HitVerifier``);
            None uses ``LexicalNearMissVerifier``; ``ThresholdOnly()`` lets similarity decide.
        top_k: how many candidates above the threshold are offered to the verifier, best first.
        capacity: the most entries kept; a full cache evicts the least recently used entry.
        ttl: default seconds an entry lives (None: until evicted); ``put`` can override it.
        device: where the store's vectors live: "auto" (CUDA when present), "cpu", "cuda[:N]".
        timer: the clock for expiry, in seconds; injectable for tests.
        scan_budget_bytes: the most scratch memory one chunk of the similarity scan may take.
        cache_policy: may an answer be stored at all (``CachePolicy``), on every write path;
            None uses ``ContentPolicy()``; ``StoreEverything()`` turns the checks off.
        admission: is an answer worth storing (``AdmissionPolicy``), on the writes after a
            miss only; None stores every miss.
        replay_chunk_chars: characters per chunk when a cached answer is replayed as a stream.
        quantization: device storage of the vectors: None/"fp32", "fp16", "bf16" or "int8";
            candidates are rescored in full precision, so it can cost a miss, never cause a hit.
        max_device_bytes: the most device memory the store may take (the cache shares the GPU
            with a model); the cache evicts to stay within it. None: bounded by capacity only.
        scan_kernel: "auto" (on CUDA with Triton: the faster of the two scan kernels, timed
            on this cache's own scans; elsewhere torch), "torch" or "triton". A speed setting
            of this machine, so snapshots do not keep it.
    """

    def __init__(
        self,
        embedder: Embedder | None = None,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        verifier: HitVerifier | None = None,
        top_k: int = DEFAULT_TOP_K,
        capacity: int = DEFAULT_CAPACITY,
        ttl: float | None = None,
        device: DeviceLike = "auto",
        timer: Callable[[], float] = time.time,
        scan_budget_bytes: int = 64 * 2**20,
        cache_policy: CachePolicy | None = None,
        admission: AdmissionPolicy | None = None,
        replay_chunk_chars: int = 64,
        quantization: str | None = None,
        max_device_bytes: int | None = None,
        scan_kernel: str = "auto",
    ) -> None:
        self.threshold = check_threshold(threshold)
        self.top_k = check_positive_int(top_k, "top_k")
        self.capacity = check_positive_int(capacity, "capacity")
        self.ttl = check_ttl(ttl)
        if not callable(timer):
            raise TypeError("timer must be a callable returning seconds")
        self.timer = timer
        self.device = resolve_device(device)
        if verifier is not None and not isinstance(verifier, HitVerifier):
            raise TypeError("verifier must have a name and verify(cached, new, similarity)")
        self.verifier: HitVerifier = (
            verifier if verifier is not None else LexicalNearMissVerifier()
        )
        if cache_policy is not None and not isinstance(cache_policy, CachePolicy):
            raise TypeError("cache_policy must have a name and decide(prompt, response, scope)")
        self.cache_policy: CachePolicy = (
            cache_policy if cache_policy is not None else ContentPolicy()
        )
        if admission is not None and not isinstance(admission, AdmissionPolicy):
            raise TypeError("admission must be an AdmissionPolicy or None")
        self.admission = admission
        self.replay_chunk_chars = check_positive_int(replay_chunk_chars, "replay_chunk_chars")
        if embedder is not None and not isinstance(embedder, Embedder):
            raise TypeError("embedder must have name, dim, device and encode(texts)")
        self.embedder: Embedder = (
            embedder if embedder is not None else TransformerEmbedder(device=self.device)
        )
        self.store = ExactScanStore(
            self.embedder.dim,
            device=self.device,
            scan_budget_bytes=scan_budget_bytes,
            quantization=quantization,
            max_device_bytes=max_device_bytes,
            initial_rows=min(1024, self.capacity),
            scan_kernel=scan_kernel,
        )
        self.quantization = self.store.quantization
        self.max_device_bytes = max_device_bytes
        # the most entries kept: the capacity, or fewer where the device budget says so
        self._limit = min(self.capacity, self.store.max_rows or self.capacity)
        self._lock = threading.RLock()
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()  # least recently used first
        self._by_row: dict[int, _Entry] = {}
        self._scope_ids: dict[str, int] = {}
        self._stats = StatsCounter()
        self._flights: SingleFlight[bytes, str] = SingleFlight()
        self._clock = -float("inf")  # the latest time seen: the clock never runs backwards here

    def __repr__(self) -> str:
        return (
            f"SemanticCache(entries={len(self._entries)}, threshold={self.threshold}, "
            f"verifier={self.verifier.name!r}, device={self.device})"
        )

    # ----------------------------------------------------------------------------- reads

    def get(self, prompt: str, *, scope: str | None = None, threshold: float | None = None) -> Hit | None:
        """The cached answer for ``prompt`` in ``scope``, or None on a miss."""
        return self.get_all([check_prompt(prompt)], scope=scope, threshold=threshold)[0]

    def get_all(
        self, prompts: Sequence[str], *, scope: str | None = None, threshold: float | None = None
    ) -> list[Hit | None]:
        """``get`` for a whole list: one embedder batch and one scan; results in input order."""
        prompts = check_prompts(prompts)
        scope = check_scope(scope)
        threshold = self.threshold if threshold is None else check_threshold(threshold)
        found, _ = self._lookup(list(dict.fromkeys(prompts)), scope, threshold)
        with self._lock:
            self._count_lookups(prompts, found)
        return [found[p] for p in prompts]

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
        with self._lock:
            if not self._allowed(prompt, response, scope):
                return False
        vectors = self.embedder.encode([prompt])
        with self._lock:
            return self._store([(prompt, response)], vectors, scope, ttl) == 1

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
        with self._lock:
            items = [(p, r) for p, r in latest.items() if self._allowed(p, r, scope)]
        if not items:
            return 0
        vectors = self.embedder.encode([p for p, _ in items])
        with self._lock:
            return self._store(items, vectors, scope, self.ttl)

    def get_or_put(self, prompt: str, loader: Loader, *, scope: str | None = None) -> str:
        """The cached answer for ``prompt``, or ``loader(prompt)``'s, which is then stored
        (when the cache policy allows it and the admission policy admits it).

        Concurrent misses on the same (scope, prompt) call the loader once. A loader that
        raises stores nothing; its exception reaches the caller unchanged.
        """
        prompt = check_prompt(prompt)
        scope = check_scope(scope)
        _check_callable(loader, "loader(prompt) -> str")

        def load_one(missed: list[str]) -> list[str]:
            return [check_response(loader(missed[0]), "loader's response")]

        return self._get_or_load([prompt], load_one, scope)[0]

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
        prompts = check_prompts(prompts)
        scope = check_scope(scope)
        _check_callable(loader, "loader(prompts) -> list of responses")

        def load_batch(missed: list[str]) -> list[str]:
            return _check_batch(loader(list(missed)), len(missed))

        return self._get_or_load(prompts, load_batch, scope)

    def get_or_put_streaming(
        self, prompt: str, loader: StreamLoader, *, scope: str | None = None
    ) -> Iterator[str]:
        """Stream the answer for ``prompt``: a hit is replayed in ``replay_chunk_chars`` chunks;
        a miss passes ``loader(prompt)``'s chunks through as they arrive.

        The full response is stored only after the loader's stream completes, through the cache
        policy and admission. A consumer that stops reading (closes the iterator) or a loader
        that raises stores nothing; the loader's error reaches the consumer unchanged. Input is
        checked when this is called; the lookup and the load start at the first ``next()``, so
        an iterator that is never started holds nothing and blocks no one.
        """
        prompt = check_prompt(prompt)
        scope = check_scope(scope)
        _check_callable(loader, "loader(prompt) -> iterable of str chunks")
        return self._stream(prompt, scope, loader)

    # ----------------------------------------------------------------------------- async

    async def aget(
        self, prompt: str, *, scope: str | None = None, threshold: float | None = None
    ) -> Hit | None:
        """``get`` for asyncio: embedding and scanning run in a worker thread."""
        return (await self.aget_all([check_prompt(prompt)], scope=scope, threshold=threshold))[0]

    async def aget_all(
        self, prompts: Sequence[str], *, scope: str | None = None, threshold: float | None = None
    ) -> list[Hit | None]:
        """``get_all`` for asyncio: the event loop keeps serving while the batch is embedded."""
        prompts = check_prompts(prompts)
        scope = check_scope(scope)
        threshold = self.threshold if threshold is None else check_threshold(threshold)
        found, _ = await asyncio.to_thread(
            self._lookup, list(dict.fromkeys(prompts)), scope, threshold
        )
        with self._lock:
            self._count_lookups(prompts, found)
        return [found[p] for p in prompts]

    async def aget_or_put(
        self, prompt: str, loader: AsyncLoader, *, scope: str | None = None
    ) -> str:
        """``get_or_put`` with an async loader (``async def loader(prompt) -> str``)."""
        prompt = check_prompt(prompt)
        scope = check_scope(scope)
        _check_callable(loader, "async loader(prompt) -> str")

        async def load_one(missed: list[str]) -> list[str]:
            return [check_response(await loader(missed[0]), "loader's response")]

        return (await self._aget_or_load([prompt], load_one, scope))[0]

    async def aget_or_put_all(
        self, prompts: Sequence[str], loader: AsyncBatchLoader, *, scope: str | None = None
    ) -> list[str]:
        """``get_or_put_all`` with an async batch loader."""
        prompts = check_prompts(prompts)
        scope = check_scope(scope)
        _check_callable(loader, "async loader(prompts) -> list of responses")

        async def load_batch(missed: list[str]) -> list[str]:
            return _check_batch(await loader(list(missed)), len(missed))

        return await self._aget_or_load(prompts, load_batch, scope)

    def aget_or_put_streaming(
        self, prompt: str, loader: AsyncStreamLoader, *, scope: str | None = None
    ) -> AsyncIterator[str]:
        """``get_or_put_streaming`` for asyncio: ``loader(prompt)`` returns an async iterator
        of chunks (an async generator, say); a plain iterable is accepted too. Use it with
        ``async for``. Input is checked when this is called, the lookup starts at the first
        ``__anext__``."""
        prompt = check_prompt(prompt)
        scope = check_scope(scope)
        _check_callable(loader, "loader(prompt) -> async iterable of str chunks")
        return self._astream(prompt, scope, loader)

    async def _astream(
        self, prompt: str, scope: str, loader: AsyncStreamLoader
    ) -> AsyncIterator[str]:
        plan = await asyncio.to_thread(self._begin, [prompt], scope)
        while plan.theirs:  # another call is loading it: replay its answer when it completes
            future = next(iter(plan.theirs.values()))
            try:
                answer = await asyncio.wrap_future(future)
            except LoadAbandoned:
                plan = await asyncio.to_thread(self._begin, [prompt], scope, False)
                continue
            for chunk in self._replay(answer):
                yield chunk
            return
        if not plan.mine:
            for chunk in self._replay(plan.answers[prompt]):
                yield chunk
            return
        chunks: list[str] = []
        completed = False
        source: Any = None
        try:
            source = loader(prompt)
            if inspect.isawaitable(source):
                source = await source
            if hasattr(source, "__aiter__"):
                async for chunk in source:
                    chunks.append(check_response(chunk, "stream chunk"))
                    yield chunk
            else:
                for chunk in _iterate(source):
                    chunks.append(check_response(chunk, "stream chunk"))
                    yield chunk
            completed = True
        except (GeneratorExit, asyncio.CancelledError):
            raise  # the consumer stopped reading or the task was cancelled: handled below
        except BaseException as exc:
            self._abort(plan, exc)
            raise
        finally:
            if not completed:
                self._abort(plan, LoadAbandoned())
                closer = getattr(source, "aclose", None)
                if closer is not None:
                    await closer()
        await asyncio.to_thread(self._finish, plan, ["".join(chunks)])

    # ----------------------------------------------------------------------------- upkeep

    def invalidate(self, prompt: str, *, scope: str | None = None) -> bool:
        """Remove the entry stored under exactly ``prompt`` in ``scope``; True if there was one."""
        key = prompt_key(check_scope(scope), check_prompt(prompt))
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return False
            self._drop([entry])
            return True

    def clear(self, scope: str | None = None) -> None:
        """Remove every entry, or only those of ``scope`` when one is given."""
        with self._lock:
            if scope is None:
                self._entries.clear()
                self._by_row.clear()
                self.store.clear()
                return
            scope = check_scope(scope)
            self._drop([e for e in self._entries.values() if e.scope == scope])

    def purge_expired(self) -> int:
        """Drop expired entries now (they are never served either way); returns how many."""
        with self._lock:
            return self._purge_expired(self._now())

    def __len__(self) -> int:
        with self._lock:
            self._purge_expired(self._now())
            return len(self._entries)

    def stats(self) -> CacheStats:
        with self._lock:
            self._purge_expired(self._now())
            return self._stats.snapshot(
                entries=len(self._entries),
                scan_retries=self.store.scan_retries,
                cpu_fallbacks=self.store.cpu_fallbacks,
            )

    # ----------------------------------------------------------------------------- snapshots

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the cache to one file, atomically (see ``gpucache.snapshot``): entries,
        vectors, settings, counters and the admission sketch. Expired entries are left out."""
        with self._lock:
            self._purge_expired(self._now())
            entries = list(self._entries.values())  # least recently used first
            rows = [e.row for e in entries]
            vectors = (
                self.store.vectors(rows).cpu()
                if rows else torch.empty((0, self.embedder.dim), dtype=torch.float32)
            )
            snapshot = Snapshot(
                model=self.embedder.name,
                dim=self.embedder.dim,
                settings={
                    "threshold": self.threshold,
                    "top_k": self.top_k,
                    "capacity": self.capacity,
                    "ttl": self.ttl,
                    "replay_chunk_chars": self.replay_chunk_chars,
                    "quantization": self.quantization,
                    "max_device_bytes": self.max_device_bytes,
                },
                entries=[SnapshotEntry(e.scope, e.prompt, e.response, e.expires_at) for e in entries],
                vectors=vectors,
                stats=self._stats.to_json(),
                admission=self.admission.state() if self.admission is not None else None,
            )
        write_snapshot(snapshot, path)  # file I/O with no lock held

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        embedder: Embedder | None = None,
        device: DeviceLike = "auto",
        **overrides: Any,
    ) -> SemanticCache:
        """A cache from a snapshot written by ``save``, on ``device`` (any device: vectors are
        stored on the CPU). ``overrides`` replace saved settings or add collaborators
        (``verifier=``, ``cache_policy=``, ``timer=``...). Entries already expired are dropped.

        Raises ``SnapshotError`` for a missing, corrupt, truncated or other-version file, and
        for one written with another model or dimension than ``embedder``'s.
        """
        snapshot = read_snapshot(path)
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
        settings: dict[str, Any] = {**snapshot.settings, **overrides}
        if snapshot.admission is not None and "admission" not in overrides:
            try:
                settings["admission"] = AdmissionPolicy.from_state(snapshot.admission)
            except (ValueError, KeyError, TypeError) as exc:
                raise SnapshotError(f"{path} is corrupt: bad admission sketch ({exc})") from exc
        cache = cls(embedder, device=device, **settings)
        cache._restore(snapshot)
        return cache

    def _restore(self, snapshot: Snapshot) -> None:
        with self._lock:
            now = self._now()
            live = [i for i, e in enumerate(snapshot.entries) if e.expires_at > now]
            live = live[-self._limit :]
            by_scope: dict[str, list[int]] = {}
            for i in live:
                by_scope.setdefault(snapshot.entries[i].scope, []).append(i)
            row_of: dict[int, int] = {}
            for scope, items in by_scope.items():
                scope_id = self._scope_ids.setdefault(scope, len(self._scope_ids))
                rows = self.store.add(
                    snapshot.vectors[items], scope_id, [snapshot.entries[i].expires_at for i in items]
                )
                row_of.update(zip(items, rows))
            for i in live:  # in saved order, so the least recently used stays first
                e = snapshot.entries[i]
                entry = _Entry(prompt_key(e.scope, e.prompt), e.scope, e.prompt, e.response,
                               row_of[i], e.expires_at)
                self._entries[entry.key] = entry
                self._by_row[entry.row] = entry
            self._stats = StatsCounter.from_json(snapshot.stats)
            self._stats.expirations += len(snapshot.entries) - len(live)

    # ----------------------------------------------------------------------------- internals

    def _now(self) -> float:
        """The cache's clock: the injected timer, but never earlier than a time already seen,
        so a clock stepped backwards cannot bring an expired entry back."""
        now = self.timer()
        if now > self._clock:
            self._clock = now
        return self._clock

    def _begin(self, prompts: list[str], scope: str, count: bool = True) -> _Plan:
        """Look every prompt up, record sightings, and claim the misses to load."""
        unique = list(dict.fromkeys(prompts))
        found, vectors = self._lookup(unique, scope, self.threshold)
        plan = _Plan(scope, prompts, unique, vectors)
        plan.answers = {p: hit.response for p, hit in found.items() if hit is not None}
        with self._lock:
            if count:
                self._count_lookups(prompts, found)
                if self.admission is not None:
                    for prompt in prompts:  # every request is a sighting, hit or miss
                        self.admission.record(scope, prompt)
            # The lookup ran without the lock: a call that loaded one of these misses may have
            # stored it since. Re-read the exact tier before claiming, or that prompt would be
            # loaded a second time by a new leader.
            now = self._now()
            misses = [p for p in unique if found[p] is None]
            for prompt in misses:
                entry = self._exact(scope, prompt, now)
                if entry is not None:
                    plan.answers[prompt] = entry.response
            plan.keys = {prompt_key(scope, p): p for p in misses if p not in plan.answers}
            plan.mine, plan.theirs = self._flights.claim(plan.keys)
            if plan.mine:
                self._stats.loads += 1
        return plan

    def _finish(self, plan: _Plan, responses: list[str]) -> None:
        """Store what the loader returned (policy and admission permitting) and hand every
        response to the calls waiting on it."""
        loaded = plan.to_load
        plan.answers.update(zip(loaded, responses))
        position = {p: i for i, p in enumerate(plan.unique)}
        with self._lock:
            keep = [
                (p, r) for p, r in zip(loaded, responses)
                if self._allowed(p, r, plan.scope) and self._admitted(p, plan.scope)
            ]
            if keep:
                rows = torch.tensor([position[p] for p, _ in keep], device=plan.vectors.device)
                self._store(keep, plan.vectors[rows], plan.scope, self.ttl)
            self._flights.resolve(dict(zip(plan.mine, responses)))

    def _abort(self, plan: _Plan, error: BaseException) -> None:
        with self._lock:
            self._flights.fail(plan.mine, error)

    def _get_or_load(
        self, prompts: list[str], load: Callable[[list[str]], list[str]], scope: str
    ) -> list[str]:
        plan = self._begin(prompts, scope)
        while True:
            if plan.mine:
                try:
                    responses = load(plan.to_load)  # the caller's code: no lock held
                except BaseException as exc:
                    self._abort(plan, exc)
                    raise
                self._finish(plan, responses)
            retry = []
            for key, future in plan.theirs.items():
                try:
                    plan.answers[plan.keys[key]] = future.result()  # its error is ours too
                except LoadAbandoned:
                    retry.append(plan.keys[key])
            if not retry:
                return plan.ordered()
            again = self._begin(retry, scope, count=False)
            again.answers = {**plan.answers, **again.answers}
            again.prompts = prompts
            plan = again

    async def _aget_or_load(
        self, prompts: list[str], load: Callable[[list[str]], Awaitable[list[str]]], scope: str
    ) -> list[str]:
        plan = await asyncio.to_thread(self._begin, prompts, scope)
        while True:
            if plan.mine:
                try:
                    responses = await load(plan.to_load)
                except asyncio.CancelledError:
                    self._abort(plan, LoadAbandoned())  # the waiters load it themselves
                    raise
                except BaseException as exc:
                    self._abort(plan, exc)
                    raise
                await asyncio.to_thread(self._finish, plan, responses)
            retry = []
            for key, future in plan.theirs.items():
                try:
                    plan.answers[plan.keys[key]] = await asyncio.wrap_future(future)
                except LoadAbandoned:
                    retry.append(plan.keys[key])
            if not retry:
                return plan.ordered()
            again = await asyncio.to_thread(self._begin, retry, scope, False)
            again.answers = {**plan.answers, **again.answers}
            again.prompts = prompts
            plan = again

    def _stream(self, prompt: str, scope: str, loader: StreamLoader) -> Iterator[str]:
        plan = self._begin([prompt], scope)
        while plan.theirs:  # another call is loading it: replay its answer when it completes
            try:
                answer = next(iter(plan.theirs.values())).result()
            except LoadAbandoned:
                plan = self._begin([prompt], plan.scope, count=False)
                continue
            yield from self._replay(answer)
            return
        if not plan.mine:
            yield from self._replay(plan.answers[prompt])
            return
        chunks: list[str] = []
        completed = False
        source: Any = None
        try:
            source = _iterate(loader(prompt))
            for chunk in source:
                chunks.append(check_response(chunk, "stream chunk"))
                yield chunk
            completed = True
        except GeneratorExit:
            raise  # the consumer stopped reading: handled below, nothing stored
        except BaseException as exc:
            self._abort(plan, exc)
            raise
        finally:
            if not completed:
                self._abort(plan, LoadAbandoned())
                closer = getattr(source, "close", None)
                if closer is not None:
                    closer()
        self._finish(plan, ["".join(chunks)])

    def _replay(self, answer: str) -> Iterator[str]:
        size = self.replay_chunk_chars
        for start in range(0, len(answer), size):
            yield answer[start : start + size]

    def _allowed(self, prompt: str, response: str, scope: str) -> bool:
        decision = self.cache_policy.decide(prompt, response, scope)
        if not decision.allowed:
            self._stats.refusals[decision.reason] += 1
            log.debug("cache policy refused to store %r: %s", prompt[:80], decision.reason)
        return decision.allowed

    def _admitted(self, prompt: str, scope: str) -> bool:
        if self.admission is None or self.admission.admits(scope, prompt):
            return True
        self._stats.admissions_deferred += 1
        return False

    def _lookup(
        self, prompts: list[str], scope: str, threshold: float
    ) -> tuple[dict[str, Hit | None], torch.Tensor]:
        """Hits for distinct ``prompts`` and the (Q, D) embeddings of all of them that missed
        the exact tier (rows follow ``prompts`` order; exact hits get zero rows)."""
        found: dict[str, Hit | None] = {}
        need: list[str] = []
        with self._lock:
            now = self._now()
            for prompt in prompts:
                entry = self._exact(scope, prompt, now)
                if entry is None:
                    need.append(prompt)
                else:
                    found[prompt] = Hit(entry.response, entry.prompt, 1.0, exact=True)
        vectors = torch.zeros((len(prompts), self.embedder.dim), dtype=torch.float32)
        if not need:
            return found, vectors
        embedded = self.embedder.encode(need)  # (Q, D), no lock held
        vectors = vectors.to(embedded.device)
        index = {p: i for i, p in enumerate(prompts)}
        vectors[torch.tensor([index[p] for p in need], device=embedded.device)] = embedded
        with self._lock:
            now = self._now()
            scope_id = self._scope_ids.get(scope)
            if scope_id is None or len(self.store) == 0:
                found.update(dict.fromkeys(need))
                return found, vectors
            scores, rows = self.store.search(embedded, self.top_k, scope_id, now)  # (Q, K)
            scores_host, rows_host = scores.cpu().tolist(), rows.cpu().tolist()  # one transfer
            for prompt, cand_scores, cand_rows in zip(need, scores_host, rows_host):
                found[prompt] = self._verify(prompt, cand_scores, cand_rows, threshold)
        return found, vectors

    def _verify(
        self, prompt: str, scores: list[float], rows: list[int], threshold: float
    ) -> Hit | None:
        """The best candidate above ``threshold`` that the verifier accepts, or None."""
        for similarity, row in zip(scores, rows):
            if row < 0 or similarity < threshold:
                break
            entry = self._by_row.get(row)
            if entry is None:
                raise RuntimeError(f"gpucache bug: store row {row} has no entry")
            if self.verifier.verify(entry.prompt, prompt, similarity):
                self._entries.move_to_end(entry.key)
                return Hit(entry.response, entry.prompt, min(similarity, 1.0), exact=False)
            self._stats.rejections[self._rejection_rule(entry.prompt, prompt)] += 1
        return None

    def _rejection_rule(self, cached: str, new: str) -> str:
        explain: Any = getattr(self.verifier, "explain", None)
        if explain is None:
            return self.verifier.name
        verdict = explain(cached, new)
        log.debug("verifier rejected %r for %r: %s", cached, new, verdict)
        return str(getattr(verdict, "rule", self.verifier.name))

    def _count_lookups(self, prompts: list[str], found: dict[str, Hit | None]) -> None:
        for prompt in prompts:
            hit = found[prompt]
            if hit is None:
                self._stats.misses += 1
            elif hit.exact:
                self._stats.exact_hits += 1
            else:
                self._stats.semantic_hits += 1

    def _exact(self, scope: str, prompt: str, now: float) -> _Entry | None:
        entry = self._entries.get(prompt_key(scope, prompt))
        if entry is None:
            return None
        if entry.expires_at <= now:
            self._drop([entry])
            self._stats.expirations += 1
            return None
        self._entries.move_to_end(entry.key)
        return entry

    def _store(
        self,
        items: list[tuple[str, str]],
        vectors: torch.Tensor,
        scope: str,
        ttl: float | None,
    ) -> int:
        """Write (prompt, response) pairs with their (M, D) vectors; lock held. Returns M."""
        now = self._now()
        expires_at = NEVER if ttl is None else now + ttl
        fresh: list[int] = []
        updated = 0
        for i, (prompt, response) in enumerate(items):
            entry = self._entries.get(prompt_key(scope, prompt))
            if entry is None:
                fresh.append(i)
                continue
            updated += 1
            entry.response, entry.expires_at = response, expires_at
            self.store.set_expiry([entry.row], [expires_at])
            self._entries.move_to_end(entry.key)
        fresh = fresh[-self._limit :]  # more than fit: the earliest would be evicted at once
        if fresh:
            self._make_room(len(fresh), now)
            scope_id = self._scope_ids.setdefault(scope, len(self._scope_ids))
            index = torch.tensor(fresh, dtype=torch.int64, device=vectors.device)
            rows = self.store.add(vectors[index], scope_id, [expires_at] * len(fresh))
            for i, row in zip(fresh, rows):
                prompt, response = items[i]
                entry = _Entry(prompt_key(scope, prompt), scope, prompt, response, row, expires_at)
                self._entries[entry.key] = entry
                self._by_row[row] = entry
        self._stats.stores += updated + len(fresh)
        return updated + len(fresh)

    def _make_room(self, needed: int, now: float) -> None:
        if len(self._entries) + needed <= self._limit:
            return
        self._purge_expired(now)
        excess = len(self._entries) + needed - self._limit
        if excess > 0:
            victims = [entry for _, entry in zip(range(excess), self._entries.values())]
            self._drop(victims)
            self._stats.evictions += len(victims)

    def _purge_expired(self, now: float) -> int:
        rows = self.store.expired_rows(now)
        if rows:
            self._drop([self._by_row[r] for r in rows])
            self._stats.expirations += len(rows)
        return len(rows)

    def _drop(self, entries: list[_Entry]) -> None:
        for entry in entries:
            del self._entries[entry.key]
            del self._by_row[entry.row]
        self.store.remove([e.row for e in entries])


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
    return [check_response(r, f"loader's response [{i}]") for i, r in enumerate(responses)]


def _iterate(source: object) -> Iterator[str]:
    if isinstance(source, (str, bytes)) or not isinstance(source, Iterable):
        raise TypeError(
            f"a streaming loader must return an iterable of str chunks, got {type(source).__name__}"
        )
    return iter(source)
