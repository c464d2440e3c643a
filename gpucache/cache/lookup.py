"""Lookups, one or many at once: the exact tier, one embedder batch, one scan per scope, and the
verifier, each request's result a frozen ``Findings``.

Why batch across calls: the embedder's cost per prompt falls steeply with the batch, and a scan
reads every stored row whatever the number of queries. Lookups that arrive together (a server's
concurrent requests, ``batching.LookupCoalescer``) therefore share one ``encode`` call and one
scan per distinct scope; each request keeps its own threshold and counts, so the answers are
those it would have got alone.

``Lookup`` is handed what it reads (the lock, the entries over the index, the embedder, the
verifier, the counters, the clock, the read of other replicas' records) and changes nothing but
the counters and the recency of the entries it serves. What a get-or-load call then claims of
its misses is claims.py's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch

from gpucache.cache.served import Hit
from gpucache.conversation.context import ContextMatcher
from gpucache.conversation.value import MARK, decode, given
from gpucache.guard.memo import reading_for
from gpucache.guard.verifier import ExplainingVerifier, PreparesBatches, Verdict, WeighsSimilarity

if TYPE_CHECKING:
    from gpucache.cache.entries import Entry, EntryTable
    from gpucache.cache.replication import SharedEntry
    from gpucache.cache.stats import StatsCounter
    from gpucache.embedding.model import Embedder
    from gpucache.guard.verifier import HitVerifier
    from gpucache.index.store import ExactScanStore

log = logging.getLogger("gpucache")


@dataclass(frozen=True)
class LookupRequest:
    """One call's lookup. ``claim``: a get-or-load call, which records sightings for admission
    and claims the misses it is to load; ``count``: count its hits and misses (not for a retry
    of a load another call abandoned); ``refresh``: a get-or-load call that is served nothing
    stored (a client's ``no-cache``, an answer older than it accepts): every prompt a miss,
    embedded for the store, so that its load is stored as any miss's is."""

    prompts: tuple[str, ...]
    scope: str
    threshold: float
    claim: bool
    count: bool = True
    refresh: bool = False


@dataclass(frozen=True)
class Findings:
    """What one request's lookup found: each distinct prompt's hit, or None for a miss, and
    the embeddings of those that missed the exact tier (a store of the misses needs them)."""

    scope: str
    prompts: tuple[str, ...]  # input order
    unique: tuple[str, ...]  # distinct, first-seen order
    vectors: torch.Tensor  # (len(unique), D), zero rows for exact hits; empty where all were
    hits: Mapping[str, Hit | None]
    # each miss whose best candidate at the threshold the verifier refused: that refusal's rule
    # (what the proxy's x-gpucache-refused header says; only this request's scope was scanned)
    refused: Mapping[str, str] = field(default_factory=dict)

    def ordered(self) -> list[Hit | None]:
        """Each prompt's hit or None, in input order."""
        return [self.hits[p] for p in self.prompts]

    @property
    def misses(self) -> list[str]:
        return [p for p in self.unique if self.hits[p] is None]


@dataclass(frozen=True)
class Candidate:
    """An entry the scan found for a prompt, with its similarity: what the verifier judges
    without the lock (an entry's prompt never changes; whether it is still stored is asked
    again under the lock, and its answer read then, ``Lookup._served``)."""

    similarity: float
    entry: Entry


class Lookup:
    """Finds what requests' prompts are stored as, under ``lock`` (a re-entrant lock: a caller
    that holds it may look up within it). ``counters`` is read at each use: a restored cache's
    are replaced."""

    def __init__(
        self,
        *,
        lock: Any,
        table: EntryTable,
        store: ExactScanStore,
        embedder: Embedder,
        verifier: HitVerifier,
        counters: Callable[[], StatsCounter],
        top_k: int,
        now: Callable[[], float],
        embedded: Callable[[Sequence[str], Sequence[str]], list[str]],
        fetched: Callable[[list[tuple[str, str]]], list[SharedEntry]],
        context: ContextMatcher | None = None,
    ) -> None:
        self.lock, self.table, self.store = lock, table, store
        self.context = context  # None: earlier turns must be the same, word for word
        self.embedder, self.verifier, self.counters, self.top_k = embedder, verifier, counters, top_k
        self.now, self.embedded, self.fetched = now, embedded, fetched

    def find(self, requests: Sequence[LookupRequest]) -> list[Findings]:
        """Each request's findings, in order, from one embedder call and one scan per scope."""
        unique = [tuple(dict.fromkeys(r.prompts)) for r in requests]
        hits: list[dict[str, Hit | None]] = [{} for _ in requests]
        need: dict[tuple[str, str], list[int]] = {}  # (scope, prompt) -> requests that need it
        with self.lock:
            now = self.now()
            for i, request in enumerate(requests):
                for prompt in unique[i]:
                    entry = None if request.refresh else self.table.exact(request.scope, prompt, now)
                    if entry is None:
                        need.setdefault((request.scope, prompt), []).append(i)
                    else:
                        hits[i][prompt] = _exact_hit(entry, now)
        # the requests each missing prompt is looked up for: all but the refreshes, which are
        # served nothing stored but still need the prompt embedded, for the store
        looking = {key: [i for i in wanting if not requests[i].refresh] for key, wanting in need.items()}
        looking = {key: wanting for key, wanting in looking.items() if wanting}
        if looking:  # exact repeats another replica stored and this one has not applied yet
            for shared in self.fetched(list(looking)):
                key = (shared.scope, shared.prompt)
                for i in looking.pop(key, []):
                    hits[i][shared.prompt] = Hit(shared.response, given(shared.prompt), 1.0, exact=True)
                    need[key].remove(i)
                if not need.get(key, True):
                    del need[key]
        scope_of: dict[str, str] = {}  # each text read for the first scope that needs it
        for scope, prompt in need:
            scope_of.setdefault(prompt, scope)
        texts = list(scope_of)
        dim = self.embedder.dim
        began = time.perf_counter()
        # no lock held; what is embedded is each prompt's request text (the verifier's reading)
        embedded = (
            self.embedder.encode(self.embedded(texts, [scope_of[t] for t in texts]))
            if texts
            else torch.zeros((0, dim))
        )
        embed_seconds = time.perf_counter() - began
        row_of = {text: i for i, text in enumerate(texts)}
        vectors = [_rows(embedded, u, h, row_of) for u, h in zip(unique, hits)]
        by_scope: dict[str, list[str]] = {}
        for scope, prompt in looking:
            by_scope.setdefault(scope, []).append(prompt)
        found: dict[tuple[str, str], list[Candidate]] = {}
        with self.lock:
            if texts:
                self.counters().embedding(embed_seconds, len(texts))
            now = self.now()
            for scope, prompts in by_scope.items():
                least = min(requests[i].threshold for p in prompts for i in looking[(scope, p)])
                found.update(self._search(scope, prompts, embedded[[row_of[p] for p in prompts]], now, least))
        # no lock held: the verifier (pure, about 0.1 ms a candidate with the guard) judges what the
        # scan found, so many candidates never hold up the other lookups, stores and exact repeats
        chosen: dict[tuple[int, str], Candidate | Verdict | None] = {}
        rejections: dict[str, int] = {}
        self._prepare(need, found, requests)
        for (scope, prompt), wanting in need.items():
            for i in wanting:  # a refresh is a miss: it is verified against nothing
                candidates = [] if requests[i].refresh else found[(scope, prompt)]
                with reading_for(scope):  # the guard's memos are the scope's own (guard/memo.py)
                    chosen[(i, prompt)] = self._verify(prompt, candidates, requests[i].threshold, rejections)
        refused: list[dict[str, str]] = [{} for _ in requests]
        with self.lock:
            now = self.now()
            counters = self.counters()
            for rule, n in rejections.items():
                counters.rejections[rule] += n
            for (i, prompt), candidate in chosen.items():
                if isinstance(candidate, Verdict):
                    refused[i][prompt] = candidate.rule
                    candidate = None
                hits[i][prompt] = self._served(candidate, now)
            findings = [
                Findings(r.scope, r.prompts, u, v, MappingProxyType(h), MappingProxyType(f))
                for r, u, v, h, f in zip(requests, unique, vectors, hits, refused)
            ]
            for request, finding in zip(requests, findings):
                if request.count:
                    count(counters, finding)
        return findings

    def exact(self, request: LookupRequest) -> Findings | None:
        """The findings of a request whose every prompt the exact tier answers (repeats, which
        need no embedding), or None where one is not stored. Lock held (the caller decides
        whether it may wait for it: ``CacheCore.exact``)."""
        finding = self._repeats(request, self.table.exact)
        if finding is not None and request.count:
            count(self.counters(), finding)
        return finding

    def peek_exact(self, request: LookupRequest) -> Findings | None:
        """``exact`` without the lock and without its bookkeeping (entries.py ``peek``): the
        findings where every prompt is a live repeat, else None. The caller has the hits
        counted and touched later, under the lock (``LoopLookups.settle``)."""
        return self._repeats(request, self.table.peek)

    def _repeats(
        self, request: LookupRequest, read: Callable[[str, str, float], Entry | None]
    ) -> Findings | None:
        if request.refresh:
            return None
        now = self.now()
        hits: dict[str, Hit | None] = {}
        for prompt in dict.fromkeys(request.prompts):
            entry = read(request.scope, prompt, now)
            if entry is None:
                return None
            hits[prompt] = _exact_hit(entry, now)
        return Findings(request.scope, request.prompts, tuple(hits), _NO_VECTORS, MappingProxyType(hits))

    def _search(
        self, scope: str, prompts: list[str], queries: torch.Tensor, now: float, least: float
    ) -> dict[tuple[str, str], list[Candidate]]:
        """One scan for every prompt of ``scope`` that missed the exact tier: each prompt's
        candidates at or above ``least`` (the lowest threshold a request asked it with), best
        first. Lock held."""
        scope_id = self.table.scope_id(scope)
        if scope_id is None or len(self.store) == 0:
            return {(scope, prompt): [] for prompt in prompts}
        began = time.perf_counter()
        scores, rows = self.store.search(queries, self.top_k, scope_id, now)  # (Q, K)
        scores_host, rows_host = scores.cpu().tolist(), rows.cpu().tolist()  # one transfer
        self.counters().scanning(time.perf_counter() - began)
        found = {}
        for prompt, cand_scores, cand_rows in zip(prompts, scores_host, rows_host):
            found[(scope, prompt)] = [
                Candidate(similarity, self.table.at_row(row))
                for similarity, row in zip(cand_scores, cand_rows)
                if row >= 0 and similarity >= least
            ]
        return found

    def _prepare(
        self,
        need: Mapping[tuple[str, str], list[int]],
        found: Mapping[tuple[str, str], list[Candidate]],
        requests: Sequence[LookupRequest],
    ) -> None:
        """Where the verifier scores pairs in batches (the pair decision's model), one batch per
        scope of every pair it may be asked to judge: each candidate at or above its request's
        threshold, as the requests it judges (a conversation's final requests). No lock held."""
        if not isinstance(self.verifier, PreparesBatches):
            return
        by_scope: dict[str, list[tuple[str, str]]] = {}
        for (scope, prompt), wanting in need.items():
            asking = [requests[i].threshold for i in wanting if not requests[i].refresh]
            for candidate in found[(scope, prompt)] if asking else []:
                if candidate.similarity < min(asking):
                    break
                by_scope.setdefault(scope, []).append(_requests(candidate.entry.prompt, prompt))
        for scope, pairs in by_scope.items():
            with reading_for(scope):
                self.verifier.prepare(pairs)

    def _verify(
        self, prompt: str, candidates: list[Candidate], threshold: float, rejections: dict[str, int]
    ) -> Candidate | Verdict | None:
        """The best candidate above ``threshold`` that the verifier accepts; where it refused
        every one, its verdict on the best; None where none reached the threshold. Each
        rejection counted into ``rejections`` by its rule. No lock held."""
        first: Verdict | None = None
        for candidate in candidates:
            if candidate.similarity < threshold:
                break
            verdict = self._judge(candidate.entry.prompt, prompt, candidate.similarity)
            if not verdict.rejected:
                return candidate
            first = first or verdict
            rejections[verdict.rule] = rejections.get(verdict.rule, 0) + 1
            log.debug("verifier rejected %r for %r: %s", candidate.entry.prompt, prompt, verdict)
        return first

    def _judge(self, cached: str, new: str, similarity: float) -> Verdict:
        """The decision on one candidate, evaluated once: the verifier's on the two requests;
        where either is a conversation (value.py), the verifier's on the final requests and
        then, on the turns before them, the context matcher's (``match_context``) or equality."""
        if cached.startswith(MARK) or new.startswith(MARK):
            a, b = decode(cached), decode(new)
            verdict = self._verdict(a.request, b.request, similarity)
            if verdict.rejected:
                return verdict
            if self.context is None:  # earlier turns compared word for word (match_context off)
                same = a.context == b.context
                return Verdict(not same, "context-same" if same else "context-differs")
            return self.context.explain(a, b)
        return self._verdict(cached, new, similarity)

    def _verdict(self, cached: str, new: str, similarity: float) -> Verdict:
        verifier = self.verifier
        if isinstance(verifier, WeighsSimilarity):
            return verifier.judge(cached, new, similarity)
        if isinstance(verifier, ExplainingVerifier):
            return verifier.explain(cached, new)
        return Verdict(not verifier.verify(cached, new, similarity), verifier.name)

    def _served(self, candidate: Candidate | None, now: float) -> Hit | None:
        """The hit of the verifier's choice, where its prompt is still stored in its row (not
        removed, its row taken by another or expired since the scan: then a miss, never an
        answer that is gone), with the answer stored for it now. Lock held."""
        entry = None if candidate is None else self.table.current(candidate.entry, now)
        if candidate is None or entry is None:
            return None
        self.table.touch(entry)
        return Hit(
            entry.response,
            given(entry.prompt),
            min(candidate.similarity, 1.0),
            exact=False,
            age=now - entry.stored_at,
        )


_NO_VECTORS = torch.empty((0, 0))  # the findings of the exact tier alone: nothing to store


def _requests(cached: str, new: str) -> tuple[str, str]:
    """What the verifier judges of a pair: the prompts, or a conversation's final requests."""
    if cached.startswith(MARK) or new.startswith(MARK):
        return decode(cached).request, decode(new).request
    return cached, new


def _exact_hit(entry: Entry, now: float) -> Hit:
    return Hit(entry.response, given(entry.prompt), 1.0, exact=True, age=now - entry.stored_at)


def _rows(
    embedded: torch.Tensor, unique: tuple[str, ...], hits: dict[str, Hit | None], row_of: dict[str, int]
) -> torch.Tensor:
    """A request's (len(unique), D) embeddings: its prompts' rows of the batch, zero for those
    the exact tier answered."""
    vectors = torch.zeros((len(unique), embedded.shape[1]), dtype=torch.float32, device=embedded.device)
    missed = [j for j, p in enumerate(unique) if p not in hits]
    if missed:
        rows = torch.tensor([row_of[unique[j]] for j in missed], device=embedded.device)
        vectors[torch.tensor(missed, device=embedded.device)] = embedded[rows]
    return vectors


def count(counters: StatsCounter, finding: Findings) -> None:
    for prompt in finding.prompts:
        hit = finding.hits[prompt]
        if hit is None:
            counters.misses += 1
        elif hit.exact:
            counters.exact_hits += 1
        else:
            counters.semantic_hits += 1
