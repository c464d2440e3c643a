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
    because their prompt had not been seen often enough yet. ``scan_retries`` and
    ``cpu_fallbacks`` count scans that ran out of device memory and were retried in smaller
    chunks, or ran on the CPU instead. ``embed_seconds`` / ``embedded`` are the embedder's time
    and the prompts it embedded (lookups and stores); ``scan_seconds`` / ``scans`` the index
    scans' (one per scope of a lookup batch): where a lookup's time goes, for a server's
    metrics. Timings are wall-clock and are never part of a decision.
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
    scan_retries: int = 0
    cpu_fallbacks: int = 0
    embed_seconds: float = 0.0
    embedded: int = 0
    scan_seconds: float = 0.0
    scans: int = 0

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
    embed_seconds: float = 0.0  # this process's timings: not saved in snapshots
    embedded: int = 0
    scan_seconds: float = 0.0
    scans: int = 0

    def embedding(self, seconds: float, prompts: int) -> None:
        self.embed_seconds += seconds
        self.embedded += prompts

    def scanning(self, seconds: float) -> None:
        self.scan_seconds += seconds
        self.scans += 1

    def snapshot(self, entries: int, scan_retries: int = 0, cpu_fallbacks: int = 0) -> CacheStats:
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
            scan_retries=scan_retries,
            cpu_fallbacks=cpu_fallbacks,
            embed_seconds=self.embed_seconds,
            embedded=self.embedded,
            scan_seconds=self.scan_seconds,
            scans=self.scans,
        )

    def to_json(self) -> dict[str, object]:
        return {
            "exact_hits": self.exact_hits,
            "semantic_hits": self.semantic_hits,
            "misses": self.misses,
            "stores": self.stores,
            "loads": self.loads,
            "evictions": self.evictions,
            "expirations": self.expirations,
            "rejections": dict(self.rejections),
            "refusals": dict(self.refusals),
            "admissions_deferred": self.admissions_deferred,
        }

    @classmethod
    def from_json(cls, doc: dict[str, object]) -> StatsCounter:
        counts = {
            k: int(doc.get(k, 0))  # type: ignore[call-overload]
            for k in (
                "exact_hits",
                "semantic_hits",
                "misses",
                "stores",
                "loads",
                "evictions",
                "expirations",
                "admissions_deferred",
            )
        }
        return cls(
            **counts,
            rejections=Counter({str(k): int(v) for k, v in dict(doc.get("rejections", {})).items()}),  # type: ignore[call-overload]
            refusals=Counter({str(k): int(v) for k, v in dict(doc.get("refusals", {})).items()}),  # type: ignore[call-overload]
        )
