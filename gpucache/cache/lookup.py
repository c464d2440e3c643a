"""Lookups, one or many at once: the exact tier, one embedder batch, one scan per scope, the
verifier, and (for get-or-load calls) the claims on the misses.

Why batch across calls: the embedder's cost per prompt falls steeply with the batch, and a scan
reads every stored row whatever the number of queries. Lookups that arrive together (a server's
concurrent requests, ``batching.LookupCoalescer``) therefore share one ``encode`` call and one
scan per distinct scope; each request keeps its own threshold, counts and claims, so the
answers are those it would have got alone.

A request is a ``LookupRequest``; the result is a ``Plan``, which a get-or-load call carries
through its load (``CacheCore.finish`` stores what the loader returned).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from gpucache.cache.flight import Unstored
from gpucache.guard.verifier import ExplainingVerifier, Verdict
from gpucache.keys import prompt_key

if TYPE_CHECKING:
    from gpucache.cache.entries import Entry, EntryTable
    from gpucache.cache.flight import SingleFlight
    from gpucache.cache.replication import Replication, SharedEntry
    from gpucache.cache.settings import CacheSettings
    from gpucache.cache.stats import StatsCounter
    from gpucache.embedding.model import Embedder
    from gpucache.guard.verifier import HitVerifier
    from gpucache.index.store import ExactScanStore
    from gpucache.policy.admission import AdmissionPolicy

log = logging.getLogger("gpucache")


class LookupState(Protocol):
    """What a lookup reads and changes: the parts of a cache's core (``CacheCore`` in core.py
    is the one). A protocol, so that this module needs nothing from the core's."""

    lock: Any  # a threading.RLock: guards the table, the index and the counters
    table: EntryTable
    counters: StatsCounter
    flights: SingleFlight[bytes, str]
    embedder: Embedder
    store: ExactScanStore
    settings: CacheSettings
    verifier: HitVerifier
    admission: AdmissionPolicy | None
    shared: Replication

    def now(self) -> float: ...

    def embedded(self, prompts: Sequence[str]) -> list[str]: ...

    def fetched(self, pairs: list[tuple[str, str]]) -> list[SharedEntry]: ...


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
    age: float = field(default=math.inf, compare=False)
    """Seconds since the response was stored, on the cache's clock; inf where unknown (an
    entry restored from a snapshot or taken from another replica). A caller that accepts
    nothing older than N seconds (HTTP's ``Cache-Control: max-age=N``) compares it."""


@dataclass(frozen=True)
class LookupRequest:
    """One call's lookup. ``claim``: a get-or-load call, which records sightings for admission
    and claims the misses it is to load; ``count``: count its hits and misses (not for a retry
    of a load another call abandoned)."""

    prompts: tuple[str, ...]
    scope: str
    threshold: float
    claim: bool
    count: bool = True


@dataclass
class Plan:
    """What one call found and, for a get-or-load call, must do: the lookup fills it before
    the loader runs, ``CacheCore.finish`` stores what the loader returned, so the loader runs
    with no lock held."""

    scope: str
    prompts: list[str]  # input order
    unique: list[str]  # distinct, first-seen order
    vectors: torch.Tensor  # (len(unique), D): embeddings of every prompt that missed the exact tier
    hits: dict[str, Hit | None] = field(default_factory=dict)
    answers: dict[str, str | Unstored] = field(default_factory=dict)  # Unstored: served, not kept
    prompt_of: dict[bytes, str] = field(default_factory=dict)  # single-flight key -> its miss
    claimed: list[bytes] = field(default_factory=list)  # keys of the misses this call loads
    loading_elsewhere: dict[bytes, Future[str]] = field(default_factory=dict)  # another call loads
    shared_claims: dict[str, str] = field(default_factory=dict)  # prompt -> token of a replica-wide claim

    @property
    def to_load(self) -> list[str]:
        """The misses this call claimed, as prompts: what its loader is given."""
        return [self.prompt_of[k] for k in self.claimed]

    def ordered(self) -> list[str | Unstored]:
        return [self.answers[p] for p in self.prompts]

    def after(self, previous: Plan) -> Plan:
        """This plan for a retry of some of ``previous``'s prompts, carrying its answers."""
        self.answers = {**previous.answers, **self.answers}
        self.prompts = previous.prompts
        return self


def lookup_batch(core: LookupState, requests: Sequence[LookupRequest]) -> list[Plan]:
    """A ``Plan`` per request, in order, from one embedder call and one scan per scope."""
    plans = [Plan(r.scope, list(r.prompts), list(dict.fromkeys(r.prompts)), torch.empty(0)) for r in requests]
    need: dict[tuple[str, str], list[int]] = {}  # (scope, prompt) -> requests that need it
    with core.lock:
        now = core.now()
        for i, (request, plan) in enumerate(zip(requests, plans)):
            for prompt in plan.unique:
                entry = core.table.exact(request.scope, prompt, now)
                if entry is None:
                    need.setdefault((request.scope, prompt), []).append(i)
                else:
                    plan.hits[prompt] = Hit(entry.response, entry.prompt, 1.0, exact=True,
                                            age=now - entry.stored_at)
    if need:
        _exact_from_shared(core, plans, need)
    texts = list(dict.fromkeys(prompt for _, prompt in need))
    dim = core.embedder.dim
    began = time.perf_counter()
    # no lock held; what is embedded is each prompt's request text (the verifier's reading)
    embedded = core.embedder.encode(core.embedded(texts)) if texts else torch.zeros((0, dim))
    embed_seconds = time.perf_counter() - began
    row_of = {text: i for i, text in enumerate(texts)}
    for plan in plans:  # (len(unique), D), zero rows for exact hits
        plan.vectors = torch.zeros((len(plan.unique), dim), dtype=torch.float32, device=embedded.device)
        missed = [j for j, p in enumerate(plan.unique) if p not in plan.hits]
        if missed:
            rows = torch.tensor([row_of[plan.unique[j]] for j in missed], device=embedded.device)
            plan.vectors[torch.tensor(missed, device=embedded.device)] = embedded[rows]
    by_scope: dict[str, list[str]] = {}
    for scope, prompt in need:
        by_scope.setdefault(scope, []).append(prompt)
    found: dict[tuple[str, str], list[Candidate]] = {}
    with core.lock:
        if texts:
            core.counters.embedding(embed_seconds, len(texts))
        now = core.now()
        for scope, prompts in by_scope.items():
            least = min(requests[i].threshold for p in prompts for i in need[(scope, p)])
            found.update(_search(core, scope, prompts, embedded[[row_of[p] for p in prompts]], now, least))
    # no lock held: the verifier (pure, about 0.1 ms a candidate with the guard) judges what the
    # scan found, so many candidates never hold up the other lookups, stores and exact repeats
    chosen: dict[tuple[int, str], Candidate | None] = {}
    rejections: dict[str, int] = {}
    for (scope, prompt), candidates in found.items():
        for i in need[(scope, prompt)]:
            chosen[(i, prompt)] = _verify(core, prompt, candidates, requests[i].threshold, rejections)
    with core.lock:
        now = core.now()
        for rule, n in rejections.items():
            core.counters.rejections[rule] += n
        for (i, prompt), candidate in chosen.items():
            plans[i].hits[prompt] = _served(core, candidate, now)
        for request, plan in zip(requests, plans):
            if request.claim:
                _claim(core, request, plan, now)
            elif request.count:
                _count(core, plan)
    return plans


LOCK_BUSY = object()  # exact_plan: the lock was held and the caller would not wait


def exact_plan(core: LookupState, request: LookupRequest, wait: bool) -> Plan | None | object:
    """The plan of a request whose every prompt the exact tier answers (repeats, which need
    no embedding), or None where one is not stored. ``wait`` False: only where the cache's
    lock is free at once, else ``LOCK_BUSY``; that is how the event loop asks, never waiting
    on a scan. ``wait`` True: from a thread that may wait for the lock (a scan holds it for
    milliseconds).

    Why: a repeat needs a dictionary lookup, yet through the coalescer it takes a thread hop
    and queues behind the embedder under load."""
    if not core.lock.acquire(blocking=wait):
        return LOCK_BUSY
    try:
        now = core.now()
        hits: dict[str, Hit | None] = {}
        for prompt in dict.fromkeys(request.prompts):
            entry = core.table.exact(request.scope, prompt, now)
            if entry is None:
                return None
            hits[prompt] = Hit(entry.response, entry.prompt, 1.0, exact=True, age=now - entry.stored_at)
        plan = Plan(request.scope, list(request.prompts), list(hits), torch.empty(0), hits=hits)
        if request.claim:
            _claim(core, request, plan, now)  # counts and sightings; nothing to claim
        else:
            plan.answers = {p: hit.response for p, hit in hits.items() if hit is not None}
            if request.count:
                _count(core, plan)
        return plan
    finally:
        core.lock.release()


def _exact_from_shared(core: LookupState, plans: list[Plan], need: dict[tuple[str, str], list[int]]) -> None:
    """Exact repeats that another replica stored and this one's tail has not applied yet,
    answered from the shared records (and kept here); ``need`` loses them."""
    found = core.fetched(list(need))
    for entry in found:
        for i in need.pop((entry.scope, entry.prompt), []):
            plans[i].hits[entry.prompt] = Hit(entry.response, entry.prompt, 1.0, exact=True)


@dataclass(frozen=True)
class Candidate:
    """An entry the scan found for a prompt, with its similarity: what the verifier judges
    without the lock (an entry's prompt never changes; whether it is still stored is asked
    again under the lock, and its answer read then, ``_served``)."""

    similarity: float
    entry: Entry


def _search(
    core: LookupState, scope: str, prompts: list[str], queries: torch.Tensor, now: float, least: float
) -> dict[tuple[str, str], list[Candidate]]:
    """One scan for every prompt of ``scope`` that missed the exact tier: each prompt's
    candidates at or above ``least`` (the lowest threshold a request asked it with), best first.
    Lock held."""
    scope_id = core.table.scope_id(scope)
    if scope_id is None or len(core.store) == 0:
        return {(scope, prompt): [] for prompt in prompts}
    began = time.perf_counter()
    scores, rows = core.store.search(queries, core.settings.top_k, scope_id, now)  # (Q, K)
    scores_host, rows_host = scores.cpu().tolist(), rows.cpu().tolist()  # one transfer
    core.counters.scanning(time.perf_counter() - began)
    found = {}
    for prompt, cand_scores, cand_rows in zip(prompts, scores_host, rows_host):
        found[(scope, prompt)] = [Candidate(similarity, core.table.at_row(row))
                                  for similarity, row in zip(cand_scores, cand_rows)
                                  if row >= 0 and similarity >= least]
    return found


def _verify(
    core: LookupState, prompt: str, candidates: list[Candidate], threshold: float, rejections: dict[str, int]
) -> Candidate | None:
    """The best candidate above ``threshold`` that the verifier accepts, or None; each
    rejection counted into ``rejections`` by its rule. No lock held."""
    for candidate in candidates:
        if candidate.similarity < threshold:
            break
        verdict = _judge(core, candidate.entry.prompt, prompt, candidate.similarity)
        if not verdict.rejected:
            return candidate
        rejections[verdict.rule] = rejections.get(verdict.rule, 0) + 1
        log.debug("verifier rejected %r for %r: %s", candidate.entry.prompt, prompt, verdict)
    return None


def _served(core: LookupState, candidate: Candidate | None, now: float) -> Hit | None:
    """The hit of the verifier's choice, where its entry is still the one stored (not removed,
    replaced or expired since the scan: then a miss, never an answer that is gone). Lock held."""
    if candidate is None or not core.table.holds(candidate.entry, now):
        return None
    entry = candidate.entry
    core.table.touch(entry)
    return Hit(entry.response, entry.prompt, min(candidate.similarity, 1.0), exact=False,
               age=now - entry.stored_at)


def _judge(core: LookupState, cached: str, new: str, similarity: float) -> Verdict:
    """The verifier's decision on one candidate, evaluated once."""
    verifier = core.verifier
    if isinstance(verifier, ExplainingVerifier):
        return verifier.explain(cached, new)
    return Verdict(not verifier.verify(cached, new, similarity), verifier.name)


def _claim(core: LookupState, request: LookupRequest, plan: Plan, now: float) -> None:
    """Record sightings and claim the misses this call is to load. Lock held."""
    plan.answers = {p: hit.response for p, hit in plan.hits.items() if hit is not None}
    if request.count:
        _count(core, plan)
        if core.admission is not None:
            for prompt in plan.prompts:  # every request is a sighting, hit or miss
                core.admission.record(plan.scope, prompt)
    # The scan ran without the lock: a call that loaded one of these misses may have stored it
    # since. Re-read the exact tier before claiming, or that prompt would be loaded a second
    # time by a new leader.
    misses = [p for p in plan.unique if plan.hits[p] is None]
    for prompt in misses:
        entry = core.table.exact(plan.scope, prompt, now)
        if entry is not None:
            plan.answers[prompt] = entry.response
    plan.prompt_of = {prompt_key(plan.scope, p): p for p in misses if p not in plan.answers}
    plan.claimed, plan.loading_elsewhere = core.flights.claim(plan.prompt_of)
    if plan.claimed:
        core.counters.loads += 1


def _count(core: LookupState, plan: Plan) -> None:
    for prompt in plan.prompts:
        hit = plan.hits[prompt]
        if hit is None:
            core.counters.misses += 1
        elif hit.exact:
            core.counters.exact_hits += 1
        else:
            core.counters.semantic_hits += 1
