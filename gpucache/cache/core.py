"""``SemanticCache``: answer a prompt from an earlier prompt that meant the same thing.

One lookup (DESIGN.md, "Data flow"):

    validate -> exact tier (scope, text) -> embed -> index.search (top-K, in scope)
             -> candidates >= threshold, best first -> verifier -> serve | miss

The exact tier answers a repeated prompt without running the embedder. A semantic candidate is
served only when its full-precision cosine similarity is at or above ``threshold`` *and* the
verifier accepts it; when the best candidate is rejected the next ones above the threshold are
tried, up to ``top_k``. Scopes (tenants, models, system prompts) never see each other's entries:
the scope is masked inside the scan.

The parts: ``CacheSettings`` (settings.py) holds the scalar settings; ``EntryTable``
(entries.py) the entries over the index; ``flow.py`` the get-or-load state machine and its sync
and async drivers; ``snapshot.py`` the file format. This module is the facade: it validates
input, then runs the flows. The state operations they yield (``_begin``, ``_finish``,
``_lookup``) live here, beside the lock.

Locking: one re-entrant lock guards the entries, the index and the counters. The embedder and
the caller's loader never run under it, so a slow model call never blocks readers; state that
may have changed meanwhile is re-read after the lock is taken again. The async API never takes
it on the event loop: every operation that may wait on it runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from gpucache.cache import flow
from gpucache.cache.entries import Entry, EntryTable
from gpucache.cache.flight import LoadAbandoned, SingleFlight
from gpucache.cache.settings import CacheSettings
from gpucache.cache.snapshot import Snapshot, SnapshotEntry, SnapshotError, read_snapshot, write_snapshot
from gpucache.cache.stats import CacheStats, StatsCounter
from gpucache.cache.validation import (
    check_prompt,
    check_prompts,
    check_response,
    check_scope,
    check_threshold,
    check_ttl,
)
from gpucache.devices import DeviceLike, resolve_device
from gpucache.embedding.embedder import DEFAULT_MODEL_NAME, Embedder, TransformerEmbedder
from gpucache.guard.lexical import LexicalNearMissVerifier
from gpucache.guard.verifier import ExplainingVerifier, HitVerifier, Verdict
from gpucache.index.engines.base import ScanEngine
from gpucache.index.interface import NEVER
from gpucache.index.store import ExactScanStore
from gpucache.keys import prompt_key
from gpucache.policy.admission import AdmissionPolicy
from gpucache.policy.content import CachePolicy, ContentPolicy

__all__ = ["Hit", "LoadAbandoned", "SemanticCache"]

log = logging.getLogger("gpucache")

Loader = Callable[[str], str]
BatchLoader = Callable[[list[str]], Sequence[str]]
StreamLoader = Callable[[str], Iterable[str]]
AsyncLoader = Callable[[str], Awaitable[str]]
AsyncBatchLoader = Callable[[list[str]], Awaitable[Sequence[str]]]
AsyncStreamLoader = Callable[[str], Any]  # returns an async iterable (or an iterable) of chunks


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
class Plan:
    """What one get-or-load call found and must do: ``_begin`` fills it before the loader runs,
    ``_finish`` stores what the loader returned, so the loader runs with no lock held."""

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

    def after(self, previous: Plan) -> Plan:
        """This plan for a retry of some of ``previous``'s prompts, carrying its answers."""
        self.answers = {**previous.answers, **self.answers}
        self.prompts = previous.prompts
        return self


class SemanticCache:
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
        settings: the scalar settings (``CacheSettings``); None takes the defaults.
        **options: single settings by name, replacing those of ``settings``: ``threshold``,
            ``top_k``, ``capacity``, ``ttl``, ``quantization``... (``CacheSettings`` documents
            each; an unknown name is a TypeError listing them).
    """

    def __init__(
        self,
        embedder: Embedder | None = None,
        *,
        verifier: HitVerifier | None = None,
        device: DeviceLike = "auto",
        timer: Callable[[], float] = time.time,
        cache_policy: CachePolicy | None = None,
        admission: AdmissionPolicy | None = None,
        engine: ScanEngine | None = None,
        settings: CacheSettings | None = None,
        **options: Any,
    ) -> None:
        if settings is not None and not isinstance(settings, CacheSettings):
            raise TypeError(f"settings must be a CacheSettings, got {type(settings).__name__}")
        self.settings = CacheSettings.from_options(settings, **options)
        if not callable(timer):
            raise TypeError("timer must be a callable returning seconds")
        self.timer = timer
        self.device = resolve_device(device)
        if verifier is not None and not isinstance(verifier, HitVerifier):
            raise TypeError("verifier must have a name and verify(cached, new, similarity)")
        self.verifier: HitVerifier = verifier if verifier is not None else LexicalNearMissVerifier()
        if cache_policy is not None and not isinstance(cache_policy, CachePolicy):
            raise TypeError("cache_policy must have a name and decide(prompt, response, scope)")
        self.cache_policy: CachePolicy = cache_policy if cache_policy is not None else ContentPolicy()
        if admission is not None and not isinstance(admission, AdmissionPolicy):
            raise TypeError("admission must be an AdmissionPolicy or None")
        self.admission = admission
        if embedder is not None and not isinstance(embedder, Embedder):
            raise TypeError("embedder must have name, dim, device and encode(texts)")
        if embedder is None:
            embedder = TransformerEmbedder(device=self.device)
        self.embedder: Embedder = embedder
        s = self.settings
        self.store = ExactScanStore(
            self.embedder.dim, device=self.device, scan_budget_bytes=s.scan_budget_bytes,
            quantization=s.quantization, max_device_bytes=s.max_device_bytes,
            initial_rows=min(1024, s.capacity), scan_kernel=s.scan_kernel, engine=engine,
        )
        self._lock = threading.RLock()
        self._stats = StatsCounter()
        # the most entries kept: the capacity, or fewer where the device budget says so
        limit = min(s.capacity, self.store.max_rows or s.capacity)
        self._table = EntryTable(self.store, limit, self._stats)
        self._flights: SingleFlight[bytes, str] = SingleFlight()
        self._clock = -float("inf")  # the latest time seen: the clock never runs backwards here

    # Read-only views of the most asked-for settings; every setting is in ``self.settings``.
    @property
    def threshold(self) -> float:
        return self.settings.threshold

    @property
    def top_k(self) -> int:
        return self.settings.top_k

    @property
    def capacity(self) -> int:
        return self.settings.capacity

    @property
    def ttl(self) -> float | None:
        return self.settings.ttl

    @property
    def quantization(self) -> str:
        """The index's storage mode: "fp32", "fp16", "bf16" or "int8"."""
        return self.store.quantization

    def __repr__(self) -> str:
        return (
            f"SemanticCache(entries={len(self._table)}, threshold={self.threshold}, "
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
        return self._get_all(*self._check_lookup(prompts, scope, threshold))

    async def aget(
        self, prompt: str, *, scope: str | None = None, threshold: float | None = None
    ) -> Hit | None:
        """``get`` for asyncio: embedding and scanning run in a worker thread."""
        return (await self.aget_all([check_prompt(prompt)], scope=scope, threshold=threshold))[0]

    async def aget_all(
        self, prompts: Sequence[str], *, scope: str | None = None, threshold: float | None = None
    ) -> list[Hit | None]:
        """``get_all`` for asyncio: the event loop keeps serving while the batch is embedded."""
        return await asyncio.to_thread(self._get_all, *self._check_lookup(prompts, scope, threshold))

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

    def get_or_put(self, prompt: str, loader: Loader, *, scope: str | None = None) -> str:
        """The cached answer for ``prompt``, or ``loader(prompt)``'s, which is then stored
        (when the cache policy allows it and the admission policy admits it).

        Concurrent misses on the same (scope, prompt) call the loader once. A loader that
        raises stores nothing; its exception reaches the caller unchanged.
        """
        prompt, scope = check_prompt(prompt), check_scope(scope)
        _check_callable(loader, "loader(prompt) -> str")
        return flow.run(flow.get_or_load(self, [prompt], scope), lambda missed: [_one(loader(missed[0]))])[0]

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
        prompt, scope = check_prompt(prompt), check_scope(scope)
        _check_callable(loader, "loader(prompt) -> iterable of str chunks")
        return flow.run_stream(self, flow.stream(self, prompt, scope), lambda: loader(prompt))

    async def aget_or_put(self, prompt: str, loader: AsyncLoader, *, scope: str | None = None) -> str:
        """``get_or_put`` with an async loader (``async def loader(prompt) -> str``)."""
        prompt, scope = check_prompt(prompt), check_scope(scope)
        _check_callable(loader, "async loader(prompt) -> str")

        async def load_one(missed: list[str]) -> list[str]:
            return [_one(await loader(missed[0]))]

        return (await flow.arun(flow.get_or_load(self, [prompt], scope), load_one))[0]

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
        self, prompt: str, loader: AsyncStreamLoader, *, scope: str | None = None
    ) -> AsyncIterator[str]:
        """``get_or_put_streaming`` for asyncio: ``loader(prompt)`` returns an async iterator
        of chunks (an async generator, say); a plain iterable is accepted too. Use it with
        ``async for``. Input is checked when this is called, the lookup starts at the first
        ``__anext__``."""
        prompt, scope = check_prompt(prompt), check_scope(scope)
        _check_callable(loader, "loader(prompt) -> async iterable of str chunks")
        return flow.arun_stream(self, flow.stream(self, prompt, scope), lambda: loader(prompt))

    # ----------------------------------------------------------------------------- upkeep

    def invalidate(self, prompt: str, *, scope: str | None = None) -> bool:
        """Remove the entry stored under exactly ``prompt`` in ``scope``; True if there was one."""
        scope, prompt = check_scope(scope), check_prompt(prompt)
        with self._lock:
            return self._table.remove(scope, prompt)

    def clear(self, scope: str | None = None) -> None:
        """Remove every entry, or only those of ``scope`` when one is given."""
        scope = None if scope is None else check_scope(scope)
        with self._lock:
            self._table.clear(scope)

    def purge_expired(self) -> int:
        """Drop expired entries now (they are never served either way); returns how many."""
        with self._lock:
            return self._table.purge_expired(self._now())

    def __len__(self) -> int:
        with self._lock:
            self._table.purge_expired(self._now())
            return len(self._table)

    def stats(self) -> CacheStats:
        with self._lock:
            self._table.purge_expired(self._now())
            return self._stats.snapshot(
                entries=len(self._table),
                scan_retries=self.store.scan_retries,
                cpu_fallbacks=self.store.cpu_fallbacks,
            )

    # ----------------------------------------------------------------------------- snapshots

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the cache to one file, atomically (see ``gpucache.cache.snapshot``): entries,
        vectors, settings, counters and the admission sketch. Expired entries are left out."""
        with self._lock:
            self._table.purge_expired(self._now())
            entries = list(self._table)  # least recently used first
            rows = [e.row for e in entries]
            vectors = (
                self.store.vectors(rows).cpu()
                if rows else torch.empty((0, self.embedder.dim), dtype=torch.float32)
            )
            snapshot = Snapshot(
                model=self.embedder.name,
                dim=self.embedder.dim,
                settings=self.settings.to_json(),
                entries=[SnapshotEntry(e.scope, e.prompt, e.response, self._table.expires_at(e))
                         for e in entries],
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

    def _restore(self, snapshot: Snapshot) -> None:
        with self._lock:
            now = self._now()
            live = [i for i, e in enumerate(snapshot.entries) if e.expires_at > now]
            live = live[-self._table.limit :]
            by_scope: dict[str, list[int]] = {}
            for i in live:
                by_scope.setdefault(snapshot.entries[i].scope, []).append(i)
            restored: dict[int, Entry] = {}
            for scope, items in by_scope.items():
                saved = [snapshot.entries[i] for i in items]
                entries = self._table.restore(
                    scope, [(e.prompt, e.response) for e in saved], snapshot.vectors[items],
                    [e.expires_at for e in saved],
                )
                restored.update(zip(items, entries))
            self._table.reorder([restored[i] for i in live])  # least recently used stays first
            self._stats = StatsCounter.from_json(snapshot.stats)
            self._stats.expirations += len(snapshot.entries) - len(live)
            self._table.stats = self._stats

    # ----------------------------------------------------------------------------- state

    def _now(self) -> float:
        """The cache's clock: the injected timer, but never earlier than a time already seen,
        so a clock stepped backwards cannot bring an expired entry back."""
        now = self.timer()
        if now > self._clock:
            self._clock = now
        return self._clock

    def _check_lookup(
        self, prompts: Sequence[str], scope: str | None, threshold: float | None
    ) -> tuple[list[str], str, float]:
        return (check_prompts(prompts), check_scope(scope),
                self.threshold if threshold is None else check_threshold(threshold))

    def _get_all(self, prompts: list[str], scope: str, threshold: float) -> list[Hit | None]:
        found, _ = self._lookup(list(dict.fromkeys(prompts)), scope, threshold)
        with self._lock:
            self._count_lookups(prompts, found)
        return [found[p] for p in prompts]

    def _put(self, items: list[tuple[str, str]], scope: str, ttl: float | None) -> int:
        with self._lock:
            items = [(p, r) for p, r in items if self._allowed(p, r, scope)]
        if not items:
            return 0
        vectors = self.embedder.encode([p for p, _ in items])  # no lock held
        with self._lock:
            now = self._now()
            return self._table.store(scope, items, vectors, _expiry(now, ttl), now)

    def _begin(self, prompts: list[str], scope: str, count: bool) -> Plan:
        """Look every prompt up, record sightings, and claim the misses to load."""
        unique = list(dict.fromkeys(prompts))
        found, vectors = self._lookup(unique, scope, self.threshold)
        plan = Plan(scope, prompts, unique, vectors)
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
                entry = self._table.exact(scope, prompt, now)
                if entry is not None:
                    plan.answers[prompt] = entry.response
            plan.keys = {prompt_key(scope, p): p for p in misses if p not in plan.answers}
            plan.mine, plan.theirs = self._flights.claim(plan.keys)
            if plan.mine:
                self._stats.loads += 1
        return plan

    def _finish(self, plan: Plan, responses: list[str]) -> None:
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
                now = self._now()
                self._table.store(plan.scope, keep, plan.vectors[rows], _expiry(now, self.ttl), now)
            self._flights.resolve(dict(zip(plan.mine, responses)))

    def _abort(self, plan: Plan, error: BaseException) -> None:
        """Release this call's claims, handing ``error`` to their waiters. Takes only
        single-flight's own lock: the async drivers call it on the event loop."""
        self._flights.fail(plan.mine, error)

    def _replay(self, answer: str) -> Iterator[str]:
        size = self.settings.replay_chunk_chars
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
                entry = self._table.exact(scope, prompt, now)
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
            scope_id = self._table.scope_id(scope)
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
            entry = self._table.at_row(row)
            verdict = self._judge(entry.prompt, prompt, similarity)
            if not verdict.rejected:
                self._table.touch(entry)
                return Hit(entry.response, entry.prompt, min(similarity, 1.0), exact=False)
            self._stats.rejections[verdict.rule] += 1
            log.debug("verifier rejected %r for %r: %s", entry.prompt, prompt, verdict)
        return None

    def _judge(self, cached: str, new: str, similarity: float) -> Verdict:
        """The verifier's decision on one candidate, evaluated once."""
        if isinstance(self.verifier, ExplainingVerifier):
            return self.verifier.explain(cached, new)
        return Verdict(not self.verifier.verify(cached, new, similarity), self.verifier.name)

    def _count_lookups(self, prompts: list[str], found: dict[str, Hit | None]) -> None:
        for prompt in prompts:
            hit = found[prompt]
            if hit is None:
                self._stats.misses += 1
            elif hit.exact:
                self._stats.exact_hits += 1
            else:
                self._stats.semantic_hits += 1


def _expiry(now: float, ttl: float | None) -> float:
    return NEVER if ttl is None else now + ttl


def _one(response: object) -> str:
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
    return [check_response(r, f"loader's response [{i}]") for i, r in enumerate(responses)]
