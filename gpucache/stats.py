"""Counters a cache keeps, and the immutable snapshot ``SemanticCache.stats()`` hands out."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of a cache's counters since it was created (or loaded).

    ``hits == exact_hits + semantic_hits``; every lookup is counted once, as a hit or a miss.
    ``rejections`` counts candidates the verifier refused, by the rule that fired: one lookup
    can add several when it tries several candidates. ``refusals`` counts answers the cache
    policy would not store, by reason; ``admissions_deferred`` counts answers not stored
    because their prompt had not been seen often enough yet.
    """

    hits: int = 0
    exact_hits: int = 0
    semantic_hits: int = 0
    misses: int = 0
    entries: int = 0
    stores: int = 0
    loads: int = 0
    evictions: int = 0
    expirations: int = 0
    rejections: dict[str, int] = field(default_factory=dict)
    refusals: dict[str, int] = field(default_factory=dict)
    admissions_deferred: int = 0

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


@dataclass
class StatsCounter:
    """The mutable counters behind ``CacheStats``; only touched under the cache's lock."""

    exact_hits: int = 0
    semantic_hits: int = 0
    misses: int = 0
    stores: int = 0
    loads: int = 0
    evictions: int = 0
    expirations: int = 0
    rejections: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)
    admissions_deferred: int = 0

    def snapshot(self, entries: int) -> CacheStats:
        return CacheStats(
            hits=self.exact_hits + self.semantic_hits,
            exact_hits=self.exact_hits,
            semantic_hits=self.semantic_hits,
            misses=self.misses,
            entries=entries,
            stores=self.stores,
            loads=self.loads,
            evictions=self.evictions,
            expirations=self.expirations,
            rejections=dict(self.rejections),
            refusals=dict(self.refusals),
            admissions_deferred=self.admissions_deferred,
        )
