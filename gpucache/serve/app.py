"""The ASGI app of ``gpucache serve``: routes, start and shutdown.

    POST /v1/chat/completions, /v1/completions   cached (proxy.py)
    *    /v1/{an allow-listed path}               forwarded unchanged, never cached (passthrough.py);
                                                  any other path: 400 or 404
    GET  /health                                  ready once the model is loaded (with the admin
                                                  token: the model, entries, upstream reachable?)
    GET  /metrics                                 Prometheus text format (metrics.py)
    POST /admin/invalidate, /admin/clear, /admin/revoke, /admin/snapshot; GET /admin/stats
                                                  behind the admin token, when one is set (admin.py)

At start the cache is built (the embedder loaded), the snapshot, if there is one, loaded, and
what start-up loaded frozen out of the collector's full collections (heap.py); at shutdown
(SIGTERM: uvicorn stops accepting requests and lets those in flight finish first) the snapshot
is saved, atomically.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from gpucache.extras import missing

try:
    import httpx
    from fastapi import FastAPI, Request
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.responses import JSONResponse, Response
except ImportError as exc:  # the serve extra
    raise missing("serve", __name__, exc) from exc

from gpucache.cache.semantic import SemanticCache
from gpucache.serve import admin, heap
from gpucache.serve.answers import error
from gpucache.serve.auth import NOT_AN_AUTHORITY, CredentialCheck
from gpucache.serve.lifecycle import build_cache
from gpucache.serve.metrics import ProxyMetrics
from gpucache.serve.passthrough import route
from gpucache.serve.proxy import Proxy
from gpucache.serve.settings import ConfigError, ServeSettings
from gpucache.serve.tenancy import Refusal
from gpucache.serve.upstream import Upstream

log = logging.getLogger("gpucache.serve")


def create_app(
    config: ServeSettings,
    cache_factory: Callable[[], SemanticCache] | None = None,
    *,
    upstream_transport: httpx.AsyncBaseTransport | None = None,
) -> FastAPI:
    """The proxy's app. ``cache_factory`` builds the cache at start (the default: from the
    settings' embedder, cache and replication sections); a snapshot at ``config.snapshot`` is
    restored into it when present (lifecycle.py). A factory brings its own embedder, settings
    and replication, so a config that names a Redis beside one is refused: the Redis would be
    silently unused. ``upstream_transport`` carries the requests to the upstream in place of the
    network (``httpx.MockTransport`` in the proxy's unit tests; the upstream's URL still names
    it)."""
    config = config.resolved()  # the secrets and files the settings name, read once, here
    if cache_factory is not None and config.replication.redis is not None:
        raise ConfigError(
            "a cache_factory brings its own replication: build its cache with "
            "shared=RedisShare(...) and leave replication.redis unset"
        )
    metrics = ProxyMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        cache = await asyncio.to_thread(build_cache, config, cache_factory)
        upstream = Upstream(config.upstream, config.upstream_timeout, upstream_transport)
        metrics.watch(cache)
        proxy = Proxy(config, cache, upstream, metrics)
        metrics.body_bytes.set_function(lambda: proxy.intake.budget.held)
        metrics.share_waits.set_function(lambda: proxy.slots.waiting)
        credentials = proxy.intake.credentials
        if isinstance(credentials, CredentialCheck) and await credentials.probe() is False:
            cache.close()
            await upstream.close()
            raise ConfigError(NOT_AN_AUTHORITY)
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
    app.state.config = config

    def proxy(request: Request) -> Proxy:
        return request.app.state.proxy  # type: ignore[no-any-return]

    async def chat(request: Request) -> Response:
        return await proxy(request).completion("chat", request)

    async def completions(request: Request) -> Response:
        return await proxy(request).completion("completions", request)

    # the cached endpoints as plain Starlette routes: the request handed over as it is, without
    # FastAPI's dependency solving, which took a tenth of an exact repeat's time on the loop
    # (bench/reports/serve-ab-routes.md); before the /v1 catch-all, as routes match in order
    app.add_route("/v1/chat/completions", chat, methods=["POST"])
    app.add_route("/v1/completions", completions, methods=["POST"])

    @app.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def passthrough(path: str, request: Request) -> Response:
        p = proxy(request)
        found = route(
            request.method, request.scope.get("raw_path") or request.url.path.encode(), config.passthrough
        )
        if isinstance(found, Refusal):
            # counted here, not through answers.record: a path the allow-list refuses is no
            # exchange and no outcome, only a request ("other", refused) and an error
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
        if config.admin_token is None or admin.admitted(config, request) is not None:
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

    app.include_router(admin.router)
    app.add_exception_handler(admin.AdminRefusal, _admin_refusal)  # type: ignore[arg-type]

    return app


async def _admin_refusal(request: Request, exc: admin.AdminRefusal) -> Response:
    return exc.response
