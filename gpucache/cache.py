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

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gpucache.devices import DeviceLike, resolve_device
from gpucache.embedder import Embedder, TransformerEmbedder
from gpucache.flight import SingleFlight
from gpucache.keys import prompt_key
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
from gpucache.lexical import LexicalNearMissVerifier
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
        if embedder is not None and not isinstance(embedder, Embedder):
            raise TypeError("embedder must have name, dim, device and encode(texts)")
        self.embedder: Embedder = (
            embedder if embedder is not None else TransformerEmbedder(device=self.device)
        )
        self.store = ExactScanStore(
            self.embedder.dim, device=self.device, scan_budget_bytes=scan_budget_bytes
        )
        self._lock = threading.RLock()
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()  # least recently used first
        self._by_row: dict[int, _Entry] = {}
        self._scope_ids: dict[str, int] = {}
        self._stats = StatsCounter()
        self._flights: SingleFlight[bytes, str] = SingleFlight()

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
        """Store ``response`` for ``prompt``; replaces an existing entry for the same prompt."""
        prompt = check_prompt(prompt)
        response = check_response(response)
        scope = check_scope(scope)
        ttl = self.ttl if ttl is None else check_ttl(ttl)
        vectors = self.embedder.encode([prompt])
        with self._lock:
            return self._store([(prompt, response)], vectors, scope, ttl) == 1

    def warm(self, pairs: Iterable[tuple[str, str]], *, scope: str | None = None) -> int:
        """Store many (prompt, response) pairs with one embedder call; returns how many stored.

        A prompt given twice keeps its last response.
        """
        scope = check_scope(scope)
        if isinstance(pairs, (str, bytes)):
            raise TypeError("pairs must be an iterable of (prompt, response) tuples")
        latest: dict[str, str] = {}
        for i, pair in enumerate(pairs):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError(f"pairs[{i}] must be a (prompt, response) pair, got {pair!r:.80}")
            prompt = check_prompt(pair[0], f"pairs[{i}][0]")
            latest[prompt] = check_response(pair[1], f"pairs[{i}][1]")
        if not latest:
            return 0
        items = list(latest.items())
        vectors = self.embedder.encode([p for p, _ in items])
        with self._lock:
            return self._store(items, vectors, scope, self.ttl)

    def get_or_put(self, prompt: str, loader: Loader, *, scope: str | None = None) -> str:
        """The cached answer for ``prompt``, or ``loader(prompt)``'s, which is then stored.

        Concurrent misses on the same (scope, prompt) call the loader once. A loader that
        raises stores nothing; its exception reaches the caller unchanged.
        """
        prompt = check_prompt(prompt)
        if not callable(loader):
            raise TypeError("loader must be callable: loader(prompt) -> str")

        def load_one(missed: list[str]) -> list[str]:
            return [check_response(loader(missed[0]), "loader's response")]

        return self._get_or_load([prompt], load_one, check_scope(scope))[0]

    def get_or_put_all(
        self, prompts: Sequence[str], loader: BatchLoader, *, scope: str | None = None
    ) -> list[str]:
        """Answers for every prompt, calling ``loader`` once with all the distinct misses.

        ``loader(missed_prompts) -> responses`` gets the distinct misses in first-seen order and
        must return one str per prompt, in the same order; otherwise ``ValueError``/``TypeError``
        and nothing is stored. Duplicates in ``prompts`` share one load. Results come back in
        input order. Misses that another call is already loading are waited for, not reloaded.
        """
        prompts = check_prompts(prompts)
        if not callable(loader):
            raise TypeError("loader must be callable: loader(prompts) -> list of responses")

        def load_batch(missed: list[str]) -> list[str]:
            responses = loader(list(missed))
            if isinstance(responses, (str, bytes)) or not isinstance(responses, Iterable):
                raise TypeError(f"loader must return a list of str, got {type(responses).__name__}")
            responses = list(responses)
            if len(responses) != len(missed):
                raise ValueError(
                    f"loader returned {len(responses)} responses for {len(missed)} prompts"
                )
            return [check_response(r, f"loader's response [{i}]") for i, r in enumerate(responses)]

        return self._get_or_load(prompts, load_batch, check_scope(scope))

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
            return self._purge_expired(self.timer())

    def __len__(self) -> int:
        with self._lock:
            self._purge_expired(self.timer())
            return len(self._entries)

    def stats(self) -> CacheStats:
        with self._lock:
            self._purge_expired(self.timer())
            return self._stats.snapshot(entries=len(self._entries))

    # ----------------------------------------------------------------------------- internals

    def _get_or_load(
        self, prompts: list[str], load: Callable[[list[str]], list[str]], scope: str
    ) -> list[str]:
        unique = list(dict.fromkeys(prompts))
        found, vectors = self._lookup(unique, scope, self.threshold)
        answers = {p: hit.response for p, hit in found.items() if hit is not None}
        misses = [p for p in unique if found[p] is None]
        with self._lock:
            self._count_lookups(prompts, found)
            if not misses:
                return [answers[p] for p in prompts]
            keys = {prompt_key(scope, p): p for p in misses}
            mine, theirs = self._flights.claim(keys)
        to_load = [keys[k] for k in mine]
        if to_load:
            try:
                with self._lock:
                    self._stats.loads += 1
                responses = load(to_load)  # the caller's code: no lock held
                position = {p: i for i, p in enumerate(unique)}
                rows = torch.tensor([position[p] for p in to_load], device=vectors.device)
                with self._lock:
                    self._store(list(zip(to_load, responses)), vectors[rows], scope, self.ttl)
                    self._flights.resolve(dict(zip(mine, responses)))
            except BaseException as exc:
                with self._lock:
                    self._flights.fail(mine, exc)
                raise
            answers.update(zip(to_load, responses))
        for key, future in theirs.items():
            answers[keys[key]] = future.result()  # another call's load: its error is ours too
        return [answers[p] for p in prompts]

    def _lookup(
        self, prompts: list[str], scope: str, threshold: float
    ) -> tuple[dict[str, Hit | None], torch.Tensor]:
        """Hits for distinct ``prompts`` and the (Q, D) embeddings of all of them that missed
        the exact tier (rows follow ``prompts`` order; exact hits get zero rows)."""
        found: dict[str, Hit | None] = {}
        need: list[str] = []
        with self._lock:
            now = self.timer()
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
            now = self.timer()
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
        now = self.timer()
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
        fresh = fresh[-self.capacity :]  # more than fit: the earliest would be evicted at once
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
        if len(self._entries) + needed <= self.capacity:
            return
        self._purge_expired(now)
        excess = len(self._entries) + needed - self.capacity
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
