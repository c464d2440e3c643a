"""Outcomes to HTTP and to metrics (gpucache/serve/answers.py), without a server: each kind of
outcome becomes one answer a client can act on, and one count."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")

from exchanges import exchange  # noqa: E402

from gpucache.cache.served import Hit  # noqa: E402
from gpucache.serve import answers  # noqa: E402
from gpucache.serve.exchange import (  # noqa: E402
    Bypassed,
    Cached,
    Coalesced,
    Fetched,
    PassedThrough,
    Refused,
    Shed,
    Unavailable,
)
from gpucache.serve.metrics import ProxyMetrics  # noqa: E402


def body(response) -> dict:
    return json.loads(response.body)


def sample(metrics: ProxyMetrics, name: str, **labels) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_a_refusal_is_an_openai_error_the_client_must_not_retry():
    response = answers.respond(None, Refused(400, "messages must be a list", "invalid_type", "messages"), 512)
    assert response.status_code == 400 and response.headers["x-should-retry"] == "false"
    assert body(response)["error"] == {
        "message": "messages must be a list",
        "type": "invalid_request_error",
        "code": "invalid_type",
        "param": "messages",
    }


def test_a_client_that_went_away_gets_no_body():
    assert answers.respond(None, Refused(499, "gone", "client_disconnect"), 512).body == b""


@pytest.mark.parametrize("status, code", [(502, "upstream_unavailable"), (504, "upstream_timeout")])
def test_an_unavailable_upstream_is_an_error_the_client_may_retry(status, code):
    response = answers.respond(None, Unavailable(status, "the model server did not answer"), 512)
    assert response.status_code == status and response.headers["x-should-retry"] == "true"
    assert body(response)["error"]["code"] == code and body(response)["error"]["type"] == "api_error"


def test_shedding_says_when_to_come_back_and_names_the_limit():
    response = answers.respond(None, Shed(retry_after=3), 64)
    assert response.status_code == 503 and response.headers["retry-after"] == "3"
    assert (
        response.headers["x-should-retry"] == "true" and "64 requests" in body(response)["error"]["message"]
    )


def test_a_semantic_hit_says_its_tier_age_and_similarity_and_carries_a_completion():
    hit = Hit("Paris.", "What is the capital of France?", 0.93456, exact=False, age=12.7)
    response = answers.respond(exchange(), Cached(hit, "Paris."), 512)
    assert response.headers["x-gpucache"] == "semantic" and response.headers["age"] == "12"
    assert response.headers["x-gpucache-similarity"] == "0.9346"
    completion = body(response)
    assert completion["model"] == "smol" and completion["choices"][0]["message"]["content"] == "Paris."


def test_an_exact_hit_of_unknown_age_sends_no_age_and_no_similarity():
    headers = answers.hit_headers(Hit("a", "q", 1.0, exact=True, age=math.inf))
    assert headers == {"x-gpucache": "exact"}


def test_an_upstream_answer_passes_with_its_status_and_says_miss():
    loaded = Fetched(
        status=201,
        headers={"content-type": "application/json", "x-request-id": "r1"},
        content=b'{"ok": true}',
    )
    response = answers.respond(exchange(), loaded, 512)
    assert response.status_code == 201 and response.body == b'{"ok": true}'
    assert response.headers["x-gpucache"] == "miss" and response.headers["x-request-id"] == "r1"
    joined = answers.respond(exchange(), Coalesced("Paris."), 512)
    assert joined.headers["x-gpucache"] == "miss"
    assert body(joined)["choices"][0]["message"]["content"] == "Paris."
    passed = answers.respond(None, PassedThrough(418, {}, b"teapot"), 512)
    assert passed.status_code == 418 and passed.headers["x-gpucache"] == "miss"


def test_each_outcome_is_counted_once_under_its_own_name():
    metrics = ProxyMetrics()
    hit = Hit("a", "q", 0.95, exact=False)
    answers.record(metrics, "chat", Cached(hit, "a"))
    answers.record(metrics, "chat", Cached(Hit("a", "q", 1.0, exact=True), "a"))
    answers.record(metrics, "chat", Fetched())
    answers.record(metrics, "chat", Bypassed("tools", None))
    answers.record(metrics, "chat", Shed(1))
    answers.record(metrics, "chat", Unavailable(504, "slow"))
    answers.record(metrics, "chat", Refused(401, "no key", "unauthorized", kind="unauthorized"))
    assert sample(metrics, "gpucache_requests_total", endpoint="chat", outcome="semantic") == 1
    assert sample(metrics, "gpucache_requests_total", endpoint="chat", outcome="exact") == 1
    assert sample(metrics, "gpucache_requests_total", endpoint="chat", outcome="miss") == 1
    assert sample(metrics, "gpucache_requests_total", endpoint="chat", outcome="bypass") == 1
    assert sample(metrics, "gpucache_requests_total", endpoint="chat", outcome="shed") == 1
    assert sample(metrics, "gpucache_requests_total", endpoint="chat", outcome="error") == 1
    assert sample(metrics, "gpucache_hits_total", tier="semantic") == 1
    assert sample(metrics, "gpucache_hit_similarity_count") == 1  # semantic hits only
    assert sample(metrics, "gpucache_bypasses_total", reason="tools") == 1
    for kind in ("shed", "upstream_timeout", "unauthorized"):
        assert sample(metrics, "gpucache_errors_total", kind=kind) == 1
    # a refusal is an error, not a request the cache handled
    total = sum(
        s.value
        for m in metrics.registry.collect()
        if m.name == "gpucache_requests"
        for s in m.samples
        if s.name == "gpucache_requests_total"
    )
    assert total == 6


def test_what_the_exchange_met_on_its_way_is_counted_with_its_outcome():
    """The errors an exchange survived (a cache that failed open, an answer not kept) and its
    timings (the lookup, the upstream's whole answer) are counted where its outcome is."""
    metrics = ProxyMetrics()
    ex = exchange()
    ex.notes.append("cache")
    ex.timing.update(lookup=0.002, answer=0.5)
    answers.record(metrics, "chat", Fetched(), ex)
    assert sample(metrics, "gpucache_errors_total", kind="cache") == 1
    assert sample(metrics, "gpucache_lookup_seconds_count") == 1
    assert sample(metrics, "gpucache_lookup_seconds_sum") == 0.002
    assert sample(metrics, "gpucache_upstream_seconds_sum") == 0.5
    answers.record(metrics, "chat", Fetched(), exchange())  # an exchange that timed nothing
    assert sample(metrics, "gpucache_lookup_seconds_count") == 1
    assert sample(metrics, "gpucache_requests_total", endpoint="chat", outcome="miss") == 2
