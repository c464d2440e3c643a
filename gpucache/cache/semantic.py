"""``SemanticCache``: answer a prompt from an earlier prompt that meant the same thing.

One lookup: check input -> exact tier (scope, text) -> embed -> scan (top-K, in scope) ->
candidates >= threshold, best first -> verifier -> serve | miss. A semantic candidate is served
only when its full-precision cosine similarity is at or above ``threshold`` *and* the verifier
accepts it; when the best is rejected the next ones above the threshold are tried, up to
``top_k``. Scopes (tenants, models, system prompts) never see each other's entries: the scope
is masked inside the scan.

This module is the facade: it holds a ``CacheCore`` (core.py: the state and the operations on
it), checks input, then runs the get-or-load flows (flow.py) on the core. The async API never
takes the cache's lock on the event loop: whatever may wait on it runs in a worker thread.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from gpucache.cache.batching import LookupTimeout
from gpucache.cache.core import CacheCore, Parts
from gpucache.cache.flight import LoadAbandoned
from gpucache.cache.loading import GetOrLoad
from gpucache.cache.lookup import LookupRequest
from gpucache.cache.replication import ClearedPrefixes, Replication
from gpucache.cache.saving import capture, restore
from gpucache.cache.served import Found, Hit, Joined, Keep, Loaded, Served, ServeOnly, Stream
from gpucache.cache.settings import CacheSettings, read_settings_file
from gpucache.cache.snapshot import Snapshot, check_model, read_snapshot, saved_policies, write_snapshot
from gpucache.cache.stats import CacheStats
from gpucache.cache.validation import (
    check_prompt,
    check_prompts,
    check_response,
    check_scope,
    check_threshold,
    check_ttl,
)
from gpucache.conversation.value import Prompt
from gpucache.devices import DeviceLike, resolve_device
from gpucache.embedding.embedder import TransformerEmbedder
from gpucache.embedding.model import DEFAULT_MODEL_NAME, Embedder
from gpucache.guard.lexical import LexicalNearMissVerifier
from gpucache.guard.verifier import HitVerifier
from gpucache.index.engines.base import ScanEngine
from gpucache.index.store import ExactScanStore
from gpucache.policy.admission import AdmissionPolicy
from gpucache.policy.content import CachePolicy, ContentPolicy

__all__ = [
    "Found",
    "Hit",
    "Joined",
    "Keep",
    "LoadAbandoned",
    "Loaded",
    "LookupTimeout",
    "SemanticCache",
    "ServeOnly",
    "Served",
    "Stream",
]


class SemanticCache(GetOrLoad):
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
        shared: Replication | None = None,
        settings: CacheSettings | None = None,
        **options: Any,
    ) -> None:
        if settings is not None and not isinstance(settings, CacheSettings):
            raise TypeError(f"settings must be a CacheSettings, got {type(settings).__name__}")
        settings = CacheSettings.from_options(settings, **options)
        if not callable(timer):
            raise TypeError("timer must be a callable returning seconds")
        where = resolve_device(device)
        if verifier is not None and not isinstance(verifier, HitVerifier):
            raise TypeError("verifier must have a name and verify(cached, new, similarity)")
        if cache_policy is not None and not isinstance(cache_policy, CachePolicy):
            raise TypeError("cache_policy must have a name and decide(prompt, response, scope)")
        if admission is not None and not isinstance(admission, AdmissionPolicy):
            raise TypeError("admission must be an AdmissionPolicy or None")
        if embedder is not None and not isinstance(embedder, Embedder):
            raise TypeError("embedder must have name, dim, device and encode(texts)")
        parts = Parts(  # the model is loaded last: a wrong argument is said before it
            settings=settings,
            timer=timer,
            device=where,
            verifier=verifier if verifier is not None else LexicalNearMissVerifier(),
            cache_policy=cache_policy if cache_policy is not None else ContentPolicy(),
            admission=admission,
            embedder=embedder if embedder is not None else TransformerEmbedder(device=where),
            engine=engine,
        )
        self._core = CacheCore(parts, shared)

    # ----------------------------------------------------------------------------- views

    @property
    def settings(self) -> CacheSettings:
        """Every scalar setting (``CacheSettings``); the most asked-for have views below."""
        return self._core.settings

    @property
    def threshold(self) -> float:
        return self._core.settings.threshold

    @property
    def top_k(self) -> int:
        return self._core.settings.top_k

    @property
    def capacity(self) -> int:
        return self._core.settings.capacity

    @property
    def ttl(self) -> float | None:
        return self._core.settings.ttl

    @property
    def quantization(self) -> str:
        """The index's storage mode: "fp32", "fp16", "bf16" or "int8"."""
        return self._core.store.quantization

    @property
    def scan_paths(self) -> dict[str, str]:
        """How a quantized CPU index answers each query bucket, as measured on this machine
        ("quantized" rows then the exact rescore, or the exact fp32 "copy"); empty for fp32
        storage and on CUDA (``ExactScanStore.scan_paths``)."""
        return self._core.store.scan_paths

    @property
    def embedder(self) -> Embedder:
        return self._core.embedder

    @property
    def verifier(self) -> HitVerifier:
        return self._core.verifier

    @property
    def device(self) -> torch.device:
        return self._core.device

    @property
    def lookup_batches(self) -> int:
        """Lookup batches computed so far (concurrent lookups coalesce into one: a server
        exports the count beside its requests)."""
        return self._core.batches

    def replay_chunks(self, answer: str) -> Iterator[str]:
        """A stored answer in ``replay_chunk_chars`` pieces, for a caller that streams it."""
        return self._core.replay(answer)

    @property
    def cleared_prefixes(self) -> ClearedPrefixes:
        """The prefixes cleared with every scope under them (``clear_under``), here or on any
        replica, numbered: a server re-checks a revoked credential's kept verdict by them."""
        return self._core.cleared_prefixes

    @property
    def shared(self) -> Replication:
        """How entries are shared with other replicas (``LocalOnly`` where they are not)."""
        return self._core.shared

    @property
    def timer(self) -> Callable[[], float]:
        """The clock for expiry (the injected one), in seconds."""
        return self._core.timer

    @property
    def admission(self) -> AdmissionPolicy | None:
        """What decides whether a miss's answer is worth storing (None: every one is)."""
        return self._core.admission

    @property
    def cache_policy(self) -> CachePolicy:
        """What may be stored at all, on every write path (``ContentPolicy`` by default)."""
        return self._core.cache_policy

    @property
    def store(self) -> ExactScanStore:
        """The index: vectors, scopes and expiries, scanned for the nearest entries."""
        return self._core.store

    def scope_id(self, scope: str | None = None) -> int | None:
        """The index's id for ``scope`` (``store.search`` takes it): for a benchmark that times
        the scan alone on this cache's own rows. None where the scope holds no entry."""
        return self._core.table.scope_id(check_scope(scope))

    def __repr__(self) -> str:
        return (
            f"SemanticCache(entries={len(self._core.table)}, threshold={self.threshold}, "
            f"verifier={self.verifier.name!r}, device={self.device})"
        )

    # ----------------------------------------------------------------------------- reads

    def get(self, prompt: Prompt, *, scope: str | None = None, threshold: float | None = None) -> Hit | None:
        """The cached answer for ``prompt`` in ``scope``, or None on a miss."""
        request = self._request([check_prompt(prompt)], scope, threshold)
        return self._core.find([request])[0].ordered()[0]

    def get_all(
        self, prompts: Sequence[Prompt], *, scope: str | None = None, threshold: float | None = None
    ) -> list[Hit | None]:
        """``get`` for a whole list: one embedder batch and one scan; results in input order."""
        request = self._request(check_prompts(prompts), scope, threshold)
        return self._core.find([request])[0].ordered()

    async def aget(
        self, prompt: Prompt, *, scope: str | None = None, threshold: float | None = None
    ) -> Hit | None:
        """``get`` for asyncio: embedding and scanning run in a worker thread."""
        found = await self._core.afind(self._request([check_prompt(prompt)], scope, threshold))
        return found.ordered()[0]

    async def aget_all(
        self, prompts: Sequence[Prompt], *, scope: str | None = None, threshold: float | None = None
    ) -> list[Hit | None]:
        """``get_all`` for asyncio: the event loop keeps serving while the batch is embedded, and
        lookups from concurrent calls share one batch where ``lookup_window_seconds`` is set."""
        found = await self._core.afind(self._request(check_prompts(prompts), scope, threshold))
        return found.ordered()

    # ----------------------------------------------------------------------------- writes

    def put(
        self, prompt: Prompt, response: str, *, scope: str | None = None, ttl: float | None = None
    ) -> bool:
        """Store ``response`` for ``prompt``; replaces an existing entry for the same prompt.

        Returns False when the cache policy refuses it (counted in ``stats().refusals``).
        Admission does not apply: a caller saying "store this" is not traffic.
        """
        prompt = check_prompt(prompt)
        response = check_response(response)
        scope = check_scope(scope)
        ttl = self.ttl if ttl is None else check_ttl(ttl)
        return self._core.put([(prompt, response)], scope, ttl) == 1

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
        return self._core.put(list(latest.items()), scope, self.ttl)

    # ----------------------------------------------------------------------------- upkeep

    def invalidate(self, prompt: Prompt, *, scope: str | None = None) -> bool:
        """Remove the entry stored under exactly ``prompt`` in ``scope``; True if there was one."""
        return self._core.upkeep.invalidate(check_scope(scope), check_prompt(prompt))

    def may_hold(self, prompt: Prompt, *, scope: str | None = None) -> bool:
        """True where an entry is stored under exactly ``prompt`` in ``scope`` (it may have
        expired): answered without the lock, so an event loop may ask while a scan runs. For
        admission decisions (a server under load still takes exact repeats), never for serving."""
        return self._core.upkeep.may_hold(check_scope(scope), check_prompt(prompt))

    def clear(self, scope: str | None = None) -> None:
        """Remove every entry, or only those of ``scope`` when one is given."""
        self._core.upkeep.clear(None if scope is None else check_scope(scope))

    def clear_under(self, prefix: str) -> int:
        """Remove every entry of scope ``prefix`` or under it (``prefix/...``: a tenant's, where
        scopes start with the tenant as a server's do), here and on replicas; how many here."""
        return self._core.upkeep.clear_under(check_scope(prefix))

    def close(self) -> None:
        """Stop what runs in the background (the share's threads, the exact tier's thread);
        the cache itself needs no closing."""
        self._core.close()

    def may_store(self, prompt: Prompt, response: str, *, scope: str | None = None) -> bool:
        """Whether this cache's content policy would store ``response`` for ``prompt`` (a
        refusal is counted in ``stats().refusals``), for a caller that must decide before it
        writes (the LangChain adapter stores one record for several answers)."""
        return self._core.allowed(check_prompt(prompt), check_response(response), check_scope(scope))

    def purge_expired(self) -> int:
        """Drop expired entries now (they are never served either way); returns how many."""
        return self._core.upkeep.purge_expired()

    def __len__(self) -> int:
        return self._core.upkeep.live_entries()

    def stats(self) -> CacheStats:
        """The counters: hits by tier, misses, loads, rejections by rule, refusals, timings."""
        return self._core.upkeep.stats()

    # ----------------------------------------------------------------------------- snapshots

    def save(self, path: str | os.PathLike[str], *, key: bytes | None = None) -> None:
        """Write the cache to one file, atomically (see ``gpucache.cache.snapshot``): entries,
        vectors, settings, counters and the admission sketch. Expired entries are left out.
        ``key``: sign the file, so that ``load`` with the same key refuses any other."""
        write_snapshot(capture(self._core), path, key)  # file I/O with no lock held

    def restore(self, snapshot: Snapshot) -> None:
        """Put a snapshot's live entries and counters into this cache (``read_snapshot``
        reads and checks the file): all or nothing, so a snapshot that fails leaves the cache
        as it was; an entry the cache already holds is kept (gpucache.cache.saving)."""
        restore(self._core, snapshot)

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
            check_model(snapshot, DEFAULT_MODEL_NAME, None, path)  # before loading a model
            embedder = TransformerEmbedder(device=device)
        check_model(snapshot, embedder.name, embedder.dim, path)
        saved, admission = saved_policies(snapshot, path)
        if admission is not None:
            overrides.setdefault("admission", admission)
        shared = overrides.pop("shared", None)  # attached once the entries are in
        cache = cls(embedder, device=device, settings=saved, **overrides)
        try:
            restore(cache._core, snapshot)
        except BaseException:
            cache.close()
            raise
        if shared is not None:
            cache._core.attach(shared)
        return cache

    @classmethod
    def from_config(
        cls, path: str | os.PathLike[str], embedder: Embedder | None = None, **collaborators: Any
    ) -> SemanticCache:
        """A cache with the settings of a TOML settings file: its ``[cache]`` table
        (``CacheSettings``), its ``[guard]`` table (the soft rules switched off) and the model of
        its ``[embedder]`` table (where no ``embedder`` is given), as ``gpucache calibrate``
        writes them. ``collaborators`` as for the constructor; a
        ``verifier=`` given here replaces the file's guard."""
        settings, guard, model = read_settings_file(path)
        collaborators.setdefault("verifier", guard.build())
        if embedder is None and model is not None:  # the model the file's threshold was chosen with
            embedder = TransformerEmbedder(model, device=collaborators.get("device", "auto"))
        return cls(embedder, settings=settings, **collaborators)

    def _request(self, keys: Sequence[str], scope: str | None, threshold: float | None) -> LookupRequest:
        """A plain lookup's request (no claims) for prompts already checked (their keys)."""
        return LookupRequest(
            tuple(keys),
            check_scope(scope),
            self.threshold if threshold is None else check_threshold(threshold),
            claim=False,
        )
