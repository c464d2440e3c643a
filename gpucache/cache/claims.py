"""What a get-or-load call holds of its misses, from its lookup to its store: ``Claims``.

After the lookup (lookup.py) has found a call's hits and misses, the call claims the misses
nobody else is loading (single-flight, flight.py): those it loads, and for the others the
futures of the loads it waits on. A miss that another call stored while the lookup ran (the scan
runs without the lock) is read again first and answered, or it would be loaded a second time by
a new leader. A claim across replicas (``ReplicaSide.claim_shared``) is held here too.

The cache's core takes the claims under its lock, and releases them once: ``finish`` (the load
stored and handed to the waiters), ``abort`` (the load failed or was given up) or ``release``
(the caller went away before it had them), whichever comes first.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpucache.cache.lookup import Findings, LookupRequest
from gpucache.keys import prompt_key

if TYPE_CHECKING:
    from gpucache.cache.entries import EntryTable
    from gpucache.cache.flight import SingleFlight
    from gpucache.cache.stats import StatsCounter
    from gpucache.policy.admission import AdmissionPolicy


@dataclass
class Claims:
    """One get-or-load call's claims. ``found``: what its lookup found. ``mine``: the
    single-flight keys of the misses this call loads; ``elsewhere``: the loads of other calls it
    waits on; ``prompt_of``: each of those keys' prompt; ``stored``: misses another call stored
    while the lookup ran (prompt -> answer); ``shared``: its claims across replicas (prompt ->
    token); ``since``: the cache's removals when they were claimed (``RemovalFence.mark``), so
    that an answer loaded across an invalidate, a clear or a revoke is not stored after it.
    ``mine`` and ``shared`` shrink as the claims are answered or released."""

    found: Findings
    prompt_of: dict[bytes, str]
    mine: list[bytes]
    elsewhere: dict[bytes, Future[str]]
    stored: dict[str, str] = field(default_factory=dict)
    shared: dict[str, str] = field(default_factory=dict)
    since: int = 0

    @property
    def scope(self) -> str:
        return self.found.scope

    @property
    def to_load(self) -> list[str]:
        """The misses this call claimed, as prompts: what its loader is given."""
        return [self.prompt_of[k] for k in self.mine]


def take_claims(
    found: Findings,
    request: LookupRequest,
    table: EntryTable,
    flights: SingleFlight[bytes, str],
    counters: StatsCounter,
    admission: AdmissionPolicy | None,
    now: float,
) -> Claims:
    """Record the request's sightings (every request is one, hit or miss) and claim the misses
    this call is to load. The cache's lock held."""
    if request.count and admission is not None:
        for prompt in found.prompts:
            admission.record(found.scope, prompt)
    misses = found.misses
    if not misses:  # every prompt a hit (an exact repeat, most often): nothing to claim
        return Claims(found, {}, [], {})
    stored = {}
    for prompt in misses if not request.refresh else ():  # a refresh replaces what is stored
        entry = table.exact(found.scope, prompt, now)
        if entry is not None:
            stored[prompt] = entry.response
    prompt_of = {prompt_key(found.scope, p): p for p in misses if p not in stored}
    mine, elsewhere = flights.claim(prompt_of)
    if mine:
        counters.loads += 1
    return Claims(found, prompt_of, mine, elsewhere, stored)
