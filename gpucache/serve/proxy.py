"""The caching path of ``/v1/chat/completions`` and ``/v1/completions``.

A request is keyed (keying.py), then answered from the cache or loaded from the upstream
through ``SemanticCache.aget_or_put`` / ``aget_or_put_streaming``, so concurrent identical
misses make one upstream call and concurrent lookups share one embedder batch (the cache's
``lookup_window_seconds``). Only a complete answer (finish_reason "stop", no tool call unless
allowed, no ``no-store``) is stored; anything else the upstream says reaches the client as it
said it (``UpstreamAnswer``), and an upstream that cannot be reached is a 502 or 504.

The cache fails open: if the lookup fails or passes its deadline (``LookupTimeout``), the
request goes upstream as if the cache were not there, and the failure is counted.

A little over 400 lines: the JSON path, the streamed path and the uncached paths share their
failure handling, and read best side by side.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gpucache.cache.core import SemanticCache
from gpucache.cache.lookup import Hit
from gpucache.serve import wire
from gpucache.serve.config import ServeConfig
from gpucache.serve.keying import BadRequest, RequestKey, namespace, request_key
from gpucache.serve.metrics import ProxyMetrics
from gpucache.serve.upstream import Upstream, UpstreamAnswer, UpstreamUnavailable, returned

log = logging.getLogger("gpucache.serve")

PATHS = {"chat": "chat/completions", "completions": "completions"}


class TooLarge(ValueError):
    pass


class Unstored(Exception):
    """A streamed answer that completed but must not be kept (finish_reason not "stop", a tool
    call, ``no-store``): its chunks have already reached the client."""


@dataclass(frozen=True)
class CacheControl:
    """The request's Cache-Control, as HTTP caching users expect: ``no-cache`` does not read
    the cache but stores the answer, ``no-store`` does not store, ``max-age=N`` is the stored
    answer's lifetime (0 stores nothing)."""

    no_cache: bool = False
    no_store: bool = False
    max_age: float | None = None

    @classmethod
    def parse(cls, header: str | None) -> CacheControl:
        if not header:
            return cls()
        tokens = [t.strip().lower() for t in header.split(",")]
        max_age = None
        for token in tokens:
            if token.startswith("max-age="):
                value = token.split("=", 1)[1]
                if not value.isdigit():
                    raise BadRequest(f"Cache-Control max-age must be whole seconds, got {value!r}")
                max_age = float(value)
        return cls("no-cache" in tokens, "no-store" in tokens or max_age == 0, max_age if max_age else None)


def error(
    status: int,
    message: str,
    type_: str,
    code: str | None = None,
    param: str | None = None,
    retry: bool | None = None,
) -> JSONResponse:
    headers = {} if retry is None else {"x-should-retry": "true" if retry else "false"}
    return JSONResponse(wire.error_body(message, type_, code, param), status_code=status, headers=headers)


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the request body is larger than {limit} bytes")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise TooLarge(f"the request body is larger than {limit} bytes")
    return bytes(body)


async def sse_events(response: Any) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of an upstream's server-sent-event stream, up to ``[DONE]``."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


class Proxy:
    def __init__(
        self, config: ServeConfig, cache: SemanticCache, upstream: Upstream, metrics: ProxyMetrics
    ) -> None:
        self.config, self.cache, self.upstream, self.metrics = config, cache, upstream, metrics

    # ------------------------------------------------------------------------- entry

    async def completion(self, kind: str, request: Request) -> Response:
        endpoint = PATHS[kind]
        try:
            raw = await read_body(request, self.config.max_body_bytes)
            body = json.loads(raw)
            tenant = namespace(request.headers, self.config.namespace_header, self.config.namespace_secret)
            key = request_key(kind, body, tenant)
            control = CacheControl.parse(request.headers.get("cache-control"))
        except TooLarge as exc:
            self.metrics.errors.labels("bad_request").inc()
            return error(413, str(exc), "invalid_request_error", "request_too_large", retry=False)
        except ClientDisconnect:
            self.metrics.errors.labels("client_disconnect").inc()
            return Response(status_code=499)
        except (ValueError, BadRequest) as exc:
            self.metrics.errors.labels("bad_request").inc()
            param = exc.param if isinstance(exc, BadRequest) else None
            message = (
                str(exc) if isinstance(exc, BadRequest) else f"the request body is not valid JSON: {exc}"
            )
            return error(400, message, "invalid_request_error", "invalid_request", param, retry=False)
        if key.bypass is not None:
            self.metrics.bypasses.labels(key.bypass).inc()
            self.metrics.requests.labels(endpoint, "bypass").inc()
            return await self.forward(endpoint, request, raw, key.stream, "bypass")
        if control.no_cache:
            return await self.refresh(kind, request, raw, key, control)
        if key.stream:
            return await self.streamed(kind, request, body, raw, key, control)
        return await self.whole(kind, request, body, raw, key, control)

    # ------------------------------------------------------------------------- JSON

    async def whole(self, kind: str, request: Request, body: dict[str, Any], raw: bytes,
                    key: RequestKey, control: CacheControl) -> Response:
        endpoint = PATHS[kind]
        found, on_lookup = self.recorder()
        mine: dict[str, Any] = {}  # set when this call loaded: the upstream's own response

        async def loader(text: str) -> str:
            mine["started"] = True
            begun = time.perf_counter()
            response = await self.upstream.send("POST", endpoint, request.headers, raw)
            self.metrics.upstream_seconds.observe(time.perf_counter() - begun)
            answer = None
            if response.status_code == 200:
                try:
                    answer, finish, tools = wire.answer_of(kind, response.json())
                except ValueError:
                    finish, tools = None, False
            if (
                answer is None
                or finish != "stop"
                or control.no_store
                or (tools and not self.config.cache_tool_calls)
            ):
                raise UpstreamAnswer(response.status_code, response.headers, response.content)
            mine["response"] = response
            return answer

        try:
            answer = await self.cache.aget_or_put(
                key.semantic_text, loader, scope=key.scope, ttl=control.max_age, on_lookup=on_lookup
            )
        except UpstreamAnswer as passed:
            return self.passed_through(endpoint, passed)
        except UpstreamUnavailable as down:
            return self.unavailable(endpoint, down)
        except Exception as exc:  # the cache failed: go upstream without it, unless that has begun
            if mine.get("started"):
                raise
            return await self.fail_open(endpoint, request, raw, False, exc)
        hit = found[0] if found else None
        if hit is not None:
            return JSONResponse(
                wire.completion(kind, body["model"], answer), headers=self.hit_headers(endpoint, hit)
            )
        self.metrics.requests.labels(endpoint, "miss").inc()
        if "response" in mine:
            response = mine["response"]
            return Response(
                response.content,
                response.status_code,
                headers={**returned(response.headers), "x-gpucache": "miss"},
            )
        return JSONResponse(wire.completion(kind, body["model"], answer), headers={"x-gpucache": "miss"})

    # ------------------------------------------------------------------------- streams

    async def streamed(self, kind: str, request: Request, body: dict[str, Any], raw: bytes,
                       key: RequestKey, control: CacheControl) -> Response:
        endpoint = PATHS[kind]
        found, on_lookup = self.recorder()
        meta = wire.StreamMeta(kind, body["model"])
        loading: dict[str, bool] = {}

        async def chunks(text: str) -> AsyncIterator[str]:
            loading["started"] = True
            begun = time.perf_counter()
            async with self.upstream.stream(endpoint, request.headers, raw) as response:
                if response.status_code != 200:
                    raise UpstreamAnswer(response.status_code, response.headers, await response.aread())
                async for event in sse_events(response):
                    meta.id = meta.id if "gpucache" not in meta.id else str(event.get("id") or meta.id)
                    meta.model = str(event.get("model") or meta.model)
                    delta = wire.delta_of(kind, event, meta)
                    if delta:
                        yield delta
            self.metrics.upstream_seconds.observe(time.perf_counter() - begun)
            if (
                meta.finish_reason != "stop"
                or control.no_store
                or (meta.tool_calls and not self.config.cache_tool_calls)
            ):
                raise Unstored(meta.finish_reason)

        pieces = self.cache.aget_or_put_streaming(
            key.semantic_text, chunks, scope=key.scope, ttl=control.max_age, on_lookup=on_lookup
        )
        first: str | None = None
        ended = "stop"
        try:
            first = await pieces.__anext__()  # the lookup, then a hit's or the upstream's first chunk
        except StopAsyncIteration:
            pass
        except Unstored:
            if not loading.get("started"):  # another call's answer was not kept: load our own
                return await self.forward(endpoint, request, raw, True, "miss")
            ended = meta.finish_reason or "stop"
        except UpstreamAnswer as passed:
            return self.passed_through(endpoint, passed)
        except UpstreamUnavailable as down:
            return self.unavailable(endpoint, down)
        except Exception as exc:
            if loading.get("started"):
                raise
            return await self.fail_open(endpoint, request, raw, True, exc)
        hit = found[0] if found else None
        if hit is not None:
            headers = self.hit_headers(endpoint, hit)
        else:
            self.metrics.requests.labels(endpoint, "miss").inc()
            headers = {"x-gpucache": "miss"}

        async def events() -> AsyncIterator[bytes]:
            finish = ended
            try:
                if kind == "chat":
                    yield wire.chunk(meta, role=True, content="")
                if first is not None:
                    yield wire.chunk(meta, content=first)
                    try:
                        async for piece in pieces:
                            yield wire.chunk(meta, content=piece)
                    except Unstored:
                        finish = meta.finish_reason or "stop"
                    except (UpstreamUnavailable, UpstreamAnswer) as exc:
                        yield wire.sse(wire.error_body(f"the upstream failed mid-stream: {exc}", "api_error"))
                        return
                yield wire.chunk(meta, finish=finish)
                if key.include_usage:
                    yield wire.chunk(meta, usage=meta.usage or dict(wire.ZERO_USAGE))
                yield wire.DONE
            except (asyncio.CancelledError, GeneratorExit):
                self.metrics.errors.labels("client_disconnect").inc()
                raise
            finally:
                await pieces.aclose()  # a client gone mid-stream: the upstream request is closed

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    # ------------------------------------------------------------------------- no cache

    async def refresh(
        self, kind: str, request: Request, raw: bytes, key: RequestKey, control: CacheControl
    ) -> Response:
        """``Cache-Control: no-cache``: the upstream answers, and a complete answer is stored
        (unless ``no-store``) for later requests."""
        endpoint = PATHS[kind]
        self.metrics.requests.labels(endpoint, "miss").inc()
        if key.stream:
            return await self.forward(endpoint, request, raw, True, "miss", store=(key, control))
        try:
            response = await self.upstream.send("POST", endpoint, request.headers, raw)
        except UpstreamUnavailable as down:
            return self.unavailable(endpoint, down)
        if response.status_code == 200 and not control.no_store:
            try:
                answer, finish, tools = wire.answer_of(kind, response.json())
            except ValueError:
                answer, finish, tools = None, None, False
            if answer is not None and finish == "stop" and (self.config.cache_tool_calls or not tools):
                await self.store(key, answer, control)
        return Response(
            response.content,
            response.status_code,
            headers={**returned(response.headers), "x-gpucache": "miss"},
        )

    async def store(self, key: RequestKey, answer: str, control: CacheControl) -> None:
        try:
            await asyncio.to_thread(
                self.cache.put, key.semantic_text, answer, scope=key.scope, ttl=control.max_age
            )
        except Exception:  # the answer is served either way: a failed store is counted, not fatal
            log.exception("gpucache: storing an answer failed")
            self.metrics.errors.labels("cache").inc()

    # ------------------------------------------------------------------------- plain

    async def forward(
        self,
        path: str,
        request: Request,
        raw: bytes,
        stream: bool,
        outcome: str,
        store: tuple[RequestKey, CacheControl] | None = None,
    ) -> Response:
        """The request as it came, to the upstream, and its answer as it came back."""
        headers = {"x-gpucache": outcome}
        if not stream:
            try:
                response = await self.upstream.send(
                    request.method, path, request.headers, raw, params=request.query_params
                )
            except UpstreamUnavailable as down:
                return self.unavailable(path, down)
            return Response(
                response.content, response.status_code, headers={**returned(response.headers), **headers}
            )
        try:
            response = await self.upstream.open(path, request.headers, raw)
        except UpstreamUnavailable as down:
            return self.unavailable(path, down)
        if store is not None and response.status_code == 200:
            relay: AsyncIterator[bytes] = self.relay(response, store)
        else:
            relay = response.aiter_raw()
        return StreamingResponse(
            relay,
            status_code=response.status_code,
            headers={**returned(response.headers), **headers},
            background=BackgroundTask(response.aclose),
        )

    async def relay(self, response: Any, store: tuple[RequestKey, CacheControl]) -> AsyncIterator[bytes]:
        """An upstream stream passed through line by line, its answer stored if it completes."""
        key, control = store
        meta = wire.StreamMeta(key.kind, "")
        parts: list[str] = []
        async for line in response.aiter_lines():
            yield (line + "\n").encode()
            if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
                try:
                    delta = wire.delta_of(key.kind, json.loads(line[5:]), meta)
                except ValueError:
                    continue
                if delta:
                    parts.append(delta)
        if (
            meta.finish_reason == "stop"
            and not control.no_store
            and (self.config.cache_tool_calls or not meta.tool_calls)
        ):
            await self.store(key, "".join(parts), control)

    async def fail_open(
        self, path: str, request: Request, raw: bytes, stream: bool, exc: Exception
    ) -> Response:
        log.warning("gpucache: the cache failed (%r); this request goes upstream without it", exc)
        self.metrics.errors.labels("cache").inc()
        self.metrics.requests.labels(path, "miss").inc()
        return await self.forward(path, request, raw, stream, "miss")

    def passed_through(self, path: str, passed: UpstreamAnswer) -> Response:
        """An upstream answer the cache does not keep, as the upstream sent it."""
        self.metrics.requests.labels(path, "miss").inc()
        headers = {**returned(passed.headers), "x-gpucache": "miss"}
        return Response(passed.body, passed.status, headers=headers)

    def unavailable(self, path: str, down: UpstreamUnavailable) -> JSONResponse:
        self.metrics.errors.labels("upstream_timeout" if down.status == 504 else "upstream_unavailable").inc()
        self.metrics.requests.labels(path, "error").inc()
        return error(
            down.status,
            str(down),
            "api_error",
            "upstream_timeout" if down.status == 504 else "upstream_unavailable",
            retry=True,
        )

    def recorder(self) -> tuple[list[Hit | None], Callable[[Hit | None], None]]:
        """A list for the lookup's hit (or None), and the cache's ``on_lookup`` that fills it
        and times the lookup from now."""
        found: list[Hit | None] = []
        started = time.perf_counter()

        def on_lookup(hit: Hit | None) -> None:
            found.append(hit)
            self.metrics.lookup_seconds.observe(time.perf_counter() - started)

        return found, on_lookup

    def hit_headers(self, path: str, hit: Hit) -> dict[str, str]:
        tier = "exact" if hit.exact else "semantic"
        self.metrics.requests.labels(path, tier).inc()
        self.metrics.hits.labels(tier).inc()
        headers = {"x-gpucache": tier}
        if not hit.exact:
            self.metrics.similarity.observe(hit.similarity)
            headers["x-gpucache-similarity"] = f"{hit.similarity:.4f}"
        return headers
