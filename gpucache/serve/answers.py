"""Outcomes to HTTP and to metrics: ``respond`` is the only place an outcome becomes an HTTP
answer, ``record`` the only place requests, hits and errors are counted (proxy.py runs an
exchange to its outcome and hands it to both)."""

from __future__ import annotations

import math

from gpucache.extras import missing

try:
    from starlette.background import BackgroundTask
    from starlette.responses import Response, StreamingResponse
except ImportError as exc:  # the serve extra
    raise missing("serve", __name__, exc) from exc

from gpucache.cache.served import Hit
from gpucache.serve import wire
from gpucache.serve.exchange import (
    Bypassed,
    Cached,
    Coalesced,
    Exchange,
    FailedOpen,
    Fetched,
    Forwarded,
    Outcome,
    PassedThrough,
    Refused,
    Shed,
    Unauthorized,
    Unavailable,
)
from gpucache.serve.metrics import ProxyMetrics
from gpucache.serve.upstream import returned


def error(
    status: int,
    message: str,
    type_: str,
    code: str | None = None,
    param: str | None = None,
    retry: bool | None = None,
) -> Response:
    headers = {} if retry is None else {"x-should-retry": "true" if retry else "false"}
    return wire.JSON(wire.error_body(message, type_, code, param), status_code=status, headers=headers)


def respond(ex: Exchange | None, outcome: Outcome, max_concurrency: int) -> Response:
    """The HTTP answer of an outcome: the only place one is built."""
    if isinstance(outcome, Refused):
        if outcome.status == 499:
            return Response(status_code=499)
        return error(
            outcome.status, outcome.message, "invalid_request_error", outcome.code, outcome.param, retry=False
        )
    if isinstance(outcome, Unavailable):
        code = "upstream_timeout" if outcome.status == 504 else "upstream_unavailable"
        return error(outcome.status, outcome.message, "api_error", code, retry=True)
    if isinstance(outcome, Shed):
        if outcome.reason == "rate_limit":
            message = "this credential is past its rate of requests; retry later"
            shed = error(429, message, "requests", "rate_limit_exceeded", retry=True)
        else:
            limit = (
                f"its limit of {max_concurrency} requests in flight"
                if outcome.reason == "concurrency"
                else "its limit of request bodies held at once"
            )
            shed = error(503, f"the cache is at {limit}; retry later", "api_error", "overloaded", retry=True)
        shed.headers["retry-after"] = str(outcome.retry_after)
        return shed
    if isinstance(outcome, (Bypassed, FailedOpen)):
        assert outcome.answer is not None
        return relayed(outcome.answer, "bypass" if isinstance(outcome, Bypassed) else "miss")
    if isinstance(outcome, (PassedThrough, Unauthorized)):
        tier = {"x-gpucache": "miss" if isinstance(outcome, PassedThrough) else "refused"}
        return Response(outcome.content, outcome.status, headers={**returned(outcome.headers), **tier})
    assert isinstance(ex, Exchange)
    if isinstance(outcome, (Cached, Coalesced)):
        headers = hit_headers(outcome.hit) if isinstance(outcome, Cached) else {"x-gpucache": "miss"}
        if outcome.stream is not None:
            return StreamingResponse(outcome.stream, media_type="text/event-stream", headers=headers)
        return wire.JSON(wire.completion(ex.kind, ex.body["model"], outcome.answer), headers=headers)
    assert isinstance(outcome, Fetched)
    # why a stored prompt was not served: the rule, never the prompt (only the caller's own
    # scope was scanned, so it tells nothing of another tenant)
    refused = {"x-gpucache-refused": outcome.refused} if outcome.refused else {}
    headers = {**returned(outcome.headers or {}), "x-gpucache": "miss", **refused}
    if outcome.stream is not None:
        return StreamingResponse(
            outcome.stream, status_code=outcome.status, media_type="text/event-stream", headers=headers
        )
    return Response(outcome.content, outcome.status, headers=headers)


def record(metrics: ProxyMetrics, endpoint: str, outcome: Outcome, ex: Exchange | None = None) -> None:
    """The metrics of an outcome and of the exchange that led to it (its timings, the errors it
    survived): the only place requests, hits and errors are counted, but for what a stream meets
    after its outcome was recorded (streams.py) and a store after the answer went (proxy.py)."""
    m = metrics
    if ex is not None:
        for label in ex.notes:
            m.errors.labels(label).inc()
        if "lookup" in ex.timing:
            m.lookup_seconds.observe(ex.timing["lookup"])
        if "answer" in ex.timing:
            m.upstream_seconds.observe(ex.timing["answer"])
    if isinstance(outcome, Refused):
        m.errors.labels(outcome.kind).inc()
        return
    if isinstance(outcome, Cached):
        tier = "exact" if outcome.hit.exact else "semantic"
        m.requests.labels(endpoint, tier).inc()
        m.hits.labels(tier).inc()
        if not outcome.hit.exact:
            m.similarity.observe(outcome.hit.similarity)
        return
    if isinstance(outcome, Bypassed):
        m.bypasses.labels(outcome.reason).inc()
        m.requests.labels(endpoint, "bypass").inc()
        return
    if isinstance(outcome, Unauthorized):
        kind, label = "unauthorized", "refused"
    elif isinstance(outcome, Shed):
        kind, label = "shed" if outcome.reason == "concurrency" else outcome.reason, "shed"
    elif isinstance(outcome, Unavailable):
        kind, label = "upstream_timeout" if outcome.status == 504 else "upstream_unavailable", "error"
    else:  # Fetched, Coalesced, PassedThrough, FailedOpen
        m.requests.labels(endpoint, "miss").inc()
        return
    m.errors.labels(kind).inc()
    m.requests.labels(endpoint, label).inc()


def relayed(answer: Forwarded, tier: str) -> Response:
    """A forwarded answer as it came back, marked with the tier it went by."""
    headers = {**returned(answer.headers), "x-gpucache": tier}
    if answer.stream is None:
        return Response(answer.content, answer.status, headers=headers)
    close = BackgroundTask(answer.close) if answer.close is not None else None
    return StreamingResponse(answer.stream, status_code=answer.status, headers=headers, background=close)


def hit_headers(hit: Hit) -> dict[str, str]:
    headers = {"x-gpucache": "exact" if hit.exact else "semantic"}
    if math.isfinite(hit.age):  # RFC 9111's Age: how long ago the served answer was stored
        headers["age"] = str(max(0, int(hit.age)))
    if not hit.exact:
        headers["x-gpucache-similarity"] = f"{hit.similarity:.4f}"
    return headers
