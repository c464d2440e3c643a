"""The proxy's Prometheus metrics, in a registry of its own (one per app, so tests and
several apps in one process never share counters).

Counted by the proxy as requests pass: requests by endpoint and outcome, hits by tier, the
similarity of semantic hits, lookup and upstream latency, bypasses by reason, errors by kind;
the bytes of request bodies held now (``max_buffered_bytes`` bounds them).
Read from the cache at each scrape: verifier rejections by rule, entries, stores, evictions,
the index's device bytes, and where lookup time goes: the embedder's seconds and prompts, the
scans' seconds and count (a lookup's latency less these is queueing and the proxy's own work).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpucache.extras import missing

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as exc:  # the serve extra
    raise missing("serve", __name__, exc) from exc


if TYPE_CHECKING:
    from gpucache.cache.semantic import SemanticCache

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60)
SIMILARITY_BUCKETS = (0.8, 0.85, 0.875, 0.9, 0.925, 0.95, 0.975, 0.99, 1.0)


class ProxyMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "gpucache_requests",
            "Requests by endpoint and outcome (exact, semantic, miss, bypass, error, shed)",
            ["endpoint", "outcome"],
            registry=r,
        )
        self.hits = Counter(
            "gpucache_hits", "Requests answered from the cache, by tier", ["tier"], registry=r
        )
        self.similarity = Histogram(
            "gpucache_hit_similarity",
            "Cosine similarity of semantic hits",
            buckets=SIMILARITY_BUCKETS,
            registry=r,
        )
        self.lookup_seconds = Histogram(
            "gpucache_lookup_seconds", "Time to a hit or a miss decision", buckets=LATENCY_BUCKETS, registry=r
        )
        self.upstream_seconds = Histogram(
            "gpucache_upstream_seconds",
            "Upstream request time (to the whole answer, or to the end of its stream)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.bypasses = Counter(
            "gpucache_bypasses", "Requests forwarded without the cache, by reason", ["reason"], registry=r
        )
        self.errors = Counter(
            "gpucache_errors",
            "Failures by kind (cache, upstream_unavailable, "
            "upstream_timeout, bad_request, unauthorized, refused_path, client_disconnect, shed, "
            "body_timeout, body_budget, rate_limit, store_backlog: an answer not stored because too "
            "many stores were waiting)",
            ["kind"],
            registry=r,
        )
        self.body_bytes = Gauge(
            "gpucache_request_body_bytes",
            "Bytes of request bodies held now, across all requests (max_buffered_bytes bounds them)",
            registry=r,
        )
        self.share_waits = Gauge(
            "gpucache_share_waits",
            "Requests waiting, headers read, for a place in their own credential's share of the "
            "cache's lookups (max_tenant_concurrency) while other credentials are active",
            registry=r,
        )

    def watch(self, cache: SemanticCache) -> None:
        self.registry.register(_CacheCollector(cache))


class _CacheCollector(Collector):
    """The cache's own counters, read at each scrape."""

    def __init__(self, cache: SemanticCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        stats = self.cache.stats()
        rejections = CounterMetricFamily(
            "gpucache_verifier_rejections", "Candidates the verifier refused, by rule", labels=["rule"]
        )
        for rule, count in sorted(stats.rejections.items()):
            rejections.add_metric([rule], count)
        yield rejections
        yield GaugeMetricFamily("gpucache_entries", "Entries stored", value=stats.entries)
        yield CounterMetricFamily("gpucache_stores", "Answers stored", value=stats.stores)
        yield CounterMetricFamily("gpucache_evictions", "Entries evicted", value=stats.evictions)
        yield GaugeMetricFamily(
            "gpucache_device_bytes", "Device memory held by the index", value=self.cache.store.nbytes
        )
        yield CounterMetricFamily(
            "gpucache_embed_seconds",
            "Seconds the embedder ran (lookups and stores)",
            value=stats.embed_seconds,
        )
        yield CounterMetricFamily("gpucache_embedded_prompts", "Prompts embedded", value=stats.embedded)
        yield CounterMetricFamily(
            "gpucache_scan_seconds", "Seconds the similarity scans ran", value=stats.scan_seconds
        )
        yield CounterMetricFamily(
            "gpucache_scans", "Similarity scans (one per scope of a batch)", value=stats.scans
        )
        share = getattr(self.cache.shared, "stats", None)  # a RedisShare's ShareStats
        if share is not None:
            events = CounterMetricFamily(
                "gpucache_replication_events",
                "Replicated entries and events, by what became of them",
                labels=["kind"],
            )
            for kind in (
                "applied",
                "written",
                "dropped",
                "refused",
                "malformed",
                "poisoned",
                "unsigned",
                "replayed",
                "errors",
            ):
                events.add_metric([kind], getattr(share, kind))
            yield events
        yield CounterMetricFamily(
            "gpucache_lookup_batches",
            "Batches the concurrent lookups shared (fewer than the lookups: they were coalesced)",
            value=self.cache.lookup_batches,
        )
