"""The ASGI app of ``gpucache serve``: routes, start and shutdown.

    POST /v1/chat/completions, /v1/completions   cached (proxy.py)
    *    /v1/{an allow-listed path}               forwarded unchanged, never cached (passthrough.py);
                                                  any other path: 400 or 404
    GET  /health                                  ready once the model is loaded (with the admin
                                                  token: the model, entries, upstream reachable?)
    GET  /metrics                                 Prometheus text format (metrics.py)
    POST /admin/invalidate, /admin/clear, /admin/revoke, /admin/snapshot; GET /admin/stats
                                                  behind the admin token, when one is set

At start the cache is built (the embedder loaded), the snapshot, if there is one, loaded, and
what start-up loaded frozen out of the collector's full collections (heap.py); at shutdown
(SIGTERM: uvicorn stops accepting requests and lets those in flight finish first) the snapshot
is saved, atomically.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import JSONResponse, Response

from gpucache.cache.semantic import SemanticCache
from gpucache.cache.snapshot import SnapshotError
from gpucache.serve import heap
from gpucache.serve.answers import error
from gpucache.serve.keying import BadRequest, parse_json, request_key
from gpucache.serve.lifecycle import build_cache
from gpucache.serve.metrics import ProxyMetrics
from gpucache.serve.passthrough import route
from gpucache.serve.proxy import Proxy
from gpucache.serve.settings import ConfigError, ServeSettings
from gpucache.serve.tenancy import ANONYMOUS, Refusal
from gpucache.serve.upstream import Upstream

log = logging.getLogger("gpucache.serve")


def create_app(config: ServeSettings, cache_factory: Callable[[], SemanticCache] | None = None) -> FastAPI:
    """The proxy's app. ``cache_factory`` builds the cache at start (the default: from the
    settings' embedder, cache and replication sections); a snapshot at ``config.snapshot`` is
    restored into it when present (lifecycle.py). A factory brings its own embedder, settings
    and replication, so a config that names a Redis beside one is refused: the Redis would be
    silently unused."""
    if cache_factory is not None and config.replication.redis is not None:
        raise ConfigError("a cache_factory brings its own replication: build its cache with "
                          "shared=RedisShare(...) and leave replication.redis unset")
    metrics = ProxyMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        cache = await asyncio.to_thread(build_cache, config, cache_factory)
        upstream = Upstream(config.upstream, config.upstream_timeout)
        metrics.watch(cache)
        proxy = Proxy(config, cache, upstream, metrics)
        # last at start, before the first request: the loop is not held up by full collections
        # of what start-up loaded (heap.py)
        app.state.frozen = heap.freeze()
        app.state.proxy = proxy
        try:
            yield
        finally:
            heap.thaw(app.state.frozen)
            if config.snapshot:
                await asyncio.to_thread(cache.save, config.snapshot, key=config.snapshot_key)
                log.info("gpucache: saved the cache to %s", config.snapshot)
            cache.close()
            await upstream.close()

    app = FastAPI(title="gpucache", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def proxy(request: Request) -> Proxy:
        return request.app.state.proxy  # type: ignore[no-any-return]

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await proxy(request).completion("chat", request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await proxy(request).completion("completions", request)

    @app.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def passthrough(path: str, request: Request) -> Response:
        p = proxy(request)
        found = route(request.method, request.scope.get("raw_path") or request.url.path.encode(),
                      config.passthrough)
        if isinstance(found, Refusal):
            p.metrics.errors.labels("refused_path").inc()
            p.metrics.requests.labels("other", "refused").inc()
            return error(found.status, found.message, "invalid_request_error", found.code, retry=False)
        return await p.passthrough(found.path, found.label, request)

    @app.get("/health")
    async def health(request: Request) -> Response:
        """Ready or not, for a balancer: answered from memory, saying nothing of the cache. The
        details (the model, the entry count, whether the upstream answers: a request to it)
        only with the admin token, so an unauthenticated poller can neither size the cache nor
        make the proxy call the upstream."""
        p: Proxy | None = getattr(request.app.state, "proxy", None)
        if p is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        if config.admin_token is None or admitted(request) is not None:
            return JSONResponse({"status": "ok"})
        reachable = await p.upstream.reachable()
        return JSONResponse(
            {
                "status": "ok",
                "model": p.cache.embedder.name,
                "upstream": "reachable" if reachable else "unreachable",
                "entries": len(p.cache),
            }
        )

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # ----------------------------------------------------------------------------- admin

    def admitted(request: Request) -> Response | None:
        """None for a request with the admin token (``Bearer``, in any case: RFC 9110 §11.1);
        else its refusal (404 where the endpoints are off, 401). Compared in constant time."""
        token = config.admin_token
        scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer":
            given = ""
        given = given.strip()
        if token is None:
            return error(
                404, "the admin endpoints are off: start with --admin-token", "invalid_request_error"
            )
        if not hmac.compare_digest(given.encode(), token.encode()):
            return error(401, "a valid admin token is required", "invalid_request_error", "unauthorized")
        return None

    async def admin_doc(request: Request) -> dict[str, Any] | Response:
        """An admin call's JSON object, for a caller with the admin token; else the refusal (404,
        401) or a 400 that says what is wrong with the body."""
        refused = admitted(request)
        return refused if refused is not None else await admin_body(request)

    async def admin_body(request: Request) -> dict[str, Any] | Response:
        """An admin call's JSON object, or a 400 that says what is wrong with it."""
        try:
            doc = parse_json(await request.body() or b"{}")
        except BadRequest as exc:
            return error(400, str(exc), "invalid_request_error", retry=False)
        if not isinstance(doc, dict):
            return error(400, "the body must be a JSON object", "invalid_request_error", retry=False)
        return doc

    def request_scope(doc: dict[str, Any]) -> tuple[str, str | None] | Response:
        """The scope and text of the completion request an admin call names: its ``kind``
        ("chat" or "completions"), ``request`` (the body), and the tenant as the proxy finds
        it for a request with these headers: ``credentials`` (header name to value, as the
        tenant sends them) and ``namespace`` (the namespace header's value)."""
        kind = doc.get("kind", "chat")
        credentials = doc.get("credentials") or {}
        named = doc.get("namespace")
        if kind not in ("chat", "completions"):
            return error(400, "'kind' must be 'chat' or 'completions'", "invalid_request_error",
                         param="kind", retry=False)
        if not isinstance(credentials, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in credentials.items()
        ):
            return error(400, "'credentials' must map header names to strings", "invalid_request_error",
                         param="credentials", retry=False)
        if named is not None and not isinstance(named, str):
            return error(400, "'namespace' must be a string", "invalid_request_error",
                         param="namespace", retry=False)
        headers = {k.lower(): v for k, v in credentials.items()}
        if named:
            headers[config.tenancy.namespace_header] = named
        tenant = config.tenancy.tenant(headers)
        if isinstance(tenant, Refusal):
            return error(400, tenant.message, "invalid_request_error", tenant.code, retry=False)
        try:
            key = request_key(kind, doc.get("request"), tenant)
        except BadRequest as exc:
            return error(400, str(exc), "invalid_request_error", param=exc.param, retry=False)
        return key.scope, key.text

    @app.post("/admin/invalidate")
    async def invalidate(request: Request) -> Response:
        doc = await admin_doc(request)
        found = doc if isinstance(doc, Response) else request_scope(doc)
        if isinstance(found, Response):
            return found
        scope, text = found
        removed = text is not None and await asyncio.to_thread(
            proxy(request).cache.invalidate, text, scope=scope
        )
        return JSONResponse({"removed": bool(removed)})

    @app.post("/admin/clear")
    async def clear(request: Request) -> Response:
        doc = await admin_doc(request)
        if isinstance(doc, Response):
            return doc
        if doc.get("all") is True:
            await asyncio.to_thread(proxy(request).cache.clear)
            return JSONResponse({"cleared": "all"})
        found = request_scope(doc)
        if isinstance(found, Response):
            return found
        await asyncio.to_thread(proxy(request).cache.clear, found[0])
        return JSONResponse({"cleared": found[0]})

    @app.post("/admin/revoke")
    async def revoke(request: Request) -> Response:
        """Everything one credential's requests were filed under, dropped at once, with the
        credential's verdict: a leaked key that is revoked upstream keeps nothing to probe, and
        its next request is checked again. Body: ``credentials`` (header name to value, as the
        client sends them) and optionally ``query`` (its query string, where the key rides
        there). Every scope under the credential goes: each namespace, each query string."""
        doc = await admin_doc(request)
        if isinstance(doc, Response):
            return doc
        credentials, query = doc.get("credentials"), doc.get("query", "")
        if not isinstance(credentials, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in credentials.items()
        ) or not isinstance(query, str):
            return error(400, "'credentials' must map header names to strings, 'query' be a string",
                         "invalid_request_error", param="credentials", retry=False)
        headers = {k.lower(): v for k, v in credentials.items() if k.lower() != config.namespace_header}
        identity = dataclasses.replace(config.tenancy, trust_namespace_header=False).identify(headers, query)
        if isinstance(identity, Refusal) or identity.holder == ANONYMOUS:
            return error(400, "name the credentials to revoke: no credential was found in them",
                         "invalid_request_error", param="credentials", retry=False)
        p = proxy(request)
        removed = await asyncio.to_thread(p.cache.clear_under, identity.holder)
        p.intake.forget(identity.holder)
        log.info("gpucache: revoked a credential (%s): %d entries removed", identity.holder, removed)
        return JSONResponse({"revoked": identity.holder, "removed": removed})

    @app.post("/admin/snapshot")
    async def snapshot(request: Request) -> Response:
        refused = admitted(request)
        if refused is not None:
            return refused
        if not config.snapshot:
            return error(409, "no snapshot path: start with --snapshot PATH", "invalid_request_error")
        try:
            await asyncio.to_thread(proxy(request).cache.save, config.snapshot, key=config.snapshot_key)
        except (OSError, SnapshotError) as exc:
            return error(500, f"the snapshot could not be saved: {exc}", "api_error")
        return JSONResponse({"saved": config.snapshot})

    @app.get("/admin/stats")
    async def stats(request: Request) -> Response:
        refused = admitted(request)
        if refused is not None:
            return refused
        s = await asyncio.to_thread(proxy(request).cache.stats)
        doc: dict[str, Any] = dataclasses.asdict(s)
        doc["hit_rate"] = s.hit_rate
        share = getattr(proxy(request).cache.shared, "stats", None)
        if share is not None:  # replication's counters: replays and forgeries refused among them
            doc["replication"] = dataclasses.asdict(share)
        return JSONResponse(doc)

    return app
