"""The caching path of ``/v1/chat/completions`` and ``/v1/completions``.

A request is keyed (keying.py), then answered from the cache or loaded from the upstream
through ``SemanticCache.aget_or_put`` / ``aget_or_put_streaming``, so concurrent identical
misses make one upstream call (within one tenant: the tenant opens every scope) and concurrent
lookups share one embedder batch (the cache's ``lookup_window_seconds``). Only a complete answer
that its text alone replays (finish_reason "stop", no tool call, refusal or reasoning, no
``no-store``) is stored; anything else the upstream says reaches the client as it said it
(``UpstreamAnswer``), and an upstream that cannot be reached is a 502 or 504. A streamed miss
is relayed event by event as the upstream sent it (tool-call deltas, usage and all), its text
collected on the side for the cache; an upstream error event or a cut connection ends the
client's stream with an error event, and nothing is stored.

The cache fails open: if the lookup fails or passes its deadline (``LookupTimeout``), the
request goes upstream as if the cache were not there, and the failure is counted.

The JSON path, the streamed path and the uncached paths share their failure handling, and read
best side by side.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gpucache.cache.core import SemanticCache
from gpucache.cache.lookup import Hit
from gpucache.serve import wire
from gpucache.serve.config import ServeConfig
from gpucache.serve.keying import BadRequest, RequestKey, parse_json, request_key
from gpucache.serve.metrics import ProxyMetrics
from gpucache.serve.tenancy import Refusal
from gpucache.serve.upstream import Upstream, UpstreamAnswer, UpstreamUnavailable, returned

log = logging.getLogger("gpucache.serve")

PATHS = {"chat": "chat/completions", "completions": "completions"}


class TooLarge(ValueError):
    pass


class Unstored(Exception):
    """A streamed answer that completed but must not be kept (finish_reason not "stop", more
    than text, ``no-store``): its events have already reached the client."""


class UpstreamErrorEvent(Exception):
    """The upstream's stream sent an error event: relayed to the client, nothing stored."""


# RFC 9111 section 1.2.2: a delta-seconds value past 2^31 is taken as 2^31
MAX_DELTA_SECONDS = 2**31


@dataclass(frozen=True)
class CacheControl:
    """The request's Cache-Control, as HTTP means it (RFC 9111, section 5.2.1), and only ever
    about this request: ``max-age=N`` accepts a stored answer at most N seconds old (else the
    upstream answers and the fresh answer is stored); ``no-cache`` (or ``max-age=0``) reads
    nothing from the cache and stores the fresh answer; ``no-store`` stores nothing. How long
    an answer is kept is the server's setting (``ServeConfig.ttl``), never a client's: one
    client must not decide what the tenant's other clients are served."""

    no_cache: bool = False
    no_store: bool = False
    max_age: int | None = None

    @classmethod
    def parse(cls, header: str | None) -> CacheControl | Refusal:
        if not header:
            return cls()
        no_cache = no_store = False
        max_age = None
        for token in (t.strip().lower() for t in header.split(",")):
            name, _, value = token.partition("=")
            if name == "no-cache":
                no_cache = True
            elif name == "no-store":
                no_store = True
            elif name == "max-age":
                if not value.isascii() or not value.isdigit():
                    return Refusal(400, f"Cache-Control max-age must be whole seconds, got {value!r}",
                                   "invalid_cache_control")
                max_age = min(int(value), MAX_DELTA_SECONDS)
        return cls(no_cache or max_age == 0, no_store, max_age)

    @property
    def reads(self) -> bool:
        """Whether a stored answer may be served at all."""
        return not self.no_cache

    def fresh(self, hit: Hit) -> bool:
        """Whether ``hit`` is young enough for this request."""
        return self.max_age is None or hit.age <= self.max_age


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


async def upstream_events(response: Any) -> AsyncIterator[tuple[dict[str, Any], bytes]]:
    """The JSON events of an upstream's server-sent-event stream, up to ``[DONE]``, each with
    the bytes to relay it by (``data: ...`` and a blank line). A cut connection raises
    ``UpstreamUnavailable``."""
    try:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                event = json.loads(data)
            except (ValueError, RecursionError):
                continue
            if isinstance(event, dict):
                yield event, f"data: {data}\n\n".encode()
    except httpx.TransportError as exc:
        raise UpstreamUnavailable(502, f"the upstream connection failed mid-stream: {exc!r}") from exc


def storable(kind: str, response: Any, control: CacheControl) -> str | None:
    """The text to store of an upstream's whole answer, or None where it must not be stored:
    an error status, no text, a finish other than "stop", more than text, or ``no-store``."""
    if response.status_code != 200 or control.no_store:
        return None
    try:
        answer, finish, replayable = wire.answer_of(kind, response.json())
    except ValueError:
        return None
    return answer if answer is not None and finish == "stop" and replayable else None


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
            body = parse_json(raw)
            tenant = self.config.tenancy.tenant(request.headers)
            key = request_key(kind, body, tenant) if isinstance(tenant, str) else None
        except TooLarge as exc:
            self.metrics.errors.labels("bad_request").inc()
            return error(413, str(exc), "invalid_request_error", "request_too_large", retry=False)
        except ClientDisconnect:
            self.metrics.errors.labels("client_disconnect").inc()
            return Response(status_code=499)
        except BadRequest as exc:
            self.metrics.errors.labels("bad_request").inc()
            return error(400, str(exc), "invalid_request_error", "invalid_request", exc.param, retry=False)
        control = (CacheControl() if self.config.ignore_client_cache_control
                   else CacheControl.parse(request.headers.get("cache-control")))
        for refused in (tenant, control):
            if isinstance(refused, Refusal):
                self.metrics.errors.labels("bad_request" if refused.status == 400 else "unauthorized").inc()
                return error(refused.status, refused.message, "invalid_request_error", refused.code,
                             retry=False)
        assert key is not None and isinstance(control, CacheControl)
        if key.bypass is not None:
            self.metrics.bypasses.labels(key.bypass).inc()
            self.metrics.requests.labels(endpoint, "bypass").inc()
            return await self.forward(endpoint, request, raw, key.stream, "bypass")
        if not control.reads:
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
            response = await self.upstream.send("POST", endpoint, request.headers, raw,
                                                params=request.query_params)
            self.metrics.upstream_seconds.observe(time.perf_counter() - begun)
            answer = storable(kind, response, control)
            if answer is None:
                raise UpstreamAnswer(response.status_code, response.headers, response.content)
            mine["response"] = response
            return answer

        try:
            answer = await self.cache.aget_or_put(
                key.semantic_text, loader, scope=key.scope, ttl=self.config.ttl, on_lookup=on_lookup
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
        if hit is not None and not control.fresh(hit):
            return await self.refresh(kind, request, raw, key, control)
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
        relayed: deque[bytes] = deque()  # the upstream's events, as sent, for a miss to relay

        async def chunks(text: str) -> AsyncIterator[str]:
            # one piece per upstream event (its text, or ""), so the events and the pieces the
            # cache hands back stay in step
            loading["started"] = True
            begun = time.perf_counter()
            async with self.upstream.stream(endpoint, request.headers, raw,
                                            params=request.query_params) as response:
                if response.status_code != 200:
                    raise UpstreamAnswer(response.status_code, response.headers, await response.aread())
                async for event, line in upstream_events(response):
                    relayed.append(line)
                    if "error" in event:
                        raise UpstreamErrorEvent(str(event.get("error"))[:200])
                    yield wire.delta_of(kind, event, meta) or ""
            self.metrics.upstream_seconds.observe(time.perf_counter() - begun)
            if meta.finish_reason != "stop" or control.no_store or meta.unreplayable:
                raise Unstored(meta.finish_reason)

        pieces = self.cache.aget_or_put_streaming(
            key.semantic_text, chunks, scope=key.scope, ttl=self.config.ttl, on_lookup=on_lookup
        )
        first: str | None = None
        ended: BaseException | None = None  # how a load ended before its first piece
        try:
            first = await pieces.__anext__()  # the lookup, then a hit's or the upstream's first piece
        except StopAsyncIteration:
            pass
        except Unstored as exc:
            if not loading.get("started"):  # another call's answer was not kept: load our own
                return await self.forward(endpoint, request, raw, True, "miss")
            ended = exc
        except UpstreamErrorEvent as exc:
            ended = exc
        except UpstreamAnswer as passed:
            return self.passed_through(endpoint, passed)
        except UpstreamUnavailable as down:
            return self.unavailable(endpoint, down)
        except Exception as exc:
            if loading.get("started"):
                log.exception("gpucache: a streamed load failed before its first event")
                self.metrics.errors.labels("upstream_unavailable").inc()
                return error(502, f"the upstream stream failed: {type(exc).__name__}", "api_error",
                             retry=True)
            return await self.fail_open(endpoint, request, raw, True, exc)
        hit = found[0] if found else None
        if hit is not None and not control.fresh(hit):
            await pieces.aclose()
            return await self.refresh(kind, request, raw, key, control)
        if hit is not None:
            headers = self.hit_headers(endpoint, hit)
        else:
            self.metrics.requests.labels(endpoint, "miss").inc()
            headers = {"x-gpucache": "miss"}
        if loading.get("started"):
            source = self.relay_load(first, ended, pieces, relayed)
        else:
            source = self.replay(meta, first, pieces, key.include_usage)

        async def events() -> AsyncIterator[bytes]:
            try:
                async for data in source:
                    yield data
            except (asyncio.CancelledError, GeneratorExit):
                self.metrics.errors.labels("client_disconnect").inc()
                raise
            finally:
                await pieces.aclose()  # a client gone mid-stream: the upstream request is closed

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    async def relay_load(self, first: str | None, ended: BaseException | None,
                         pieces: AsyncIterator[str], relayed: deque[bytes]) -> AsyncIterator[bytes]:
        """This call's own load: the upstream's events as it sent them, one per piece; its
        ``[DONE]`` where it completed; its error event, or one made here for a cut or failed
        upstream, where it did not."""
        def drain() -> list[bytes]:
            out = list(relayed)
            relayed.clear()
            return out

        if first is not None and ended is None:
            for line in drain():
                yield line
            try:
                async for _ in pieces:
                    for line in drain():
                        yield line
            except (Unstored, UpstreamErrorEvent) as exc:
                ended = exc
            except (UpstreamUnavailable, UpstreamAnswer) as exc:
                for line in drain():
                    yield line
                yield self.cut(exc)
                return
            except Exception as exc:  # a failure past the first event: an error event, never a traceback
                log.exception("gpucache: a streamed load failed mid-stream")
                self.metrics.errors.labels("upstream_unavailable").inc()
                yield wire.sse(wire.error_body(f"the stream failed: {type(exc).__name__}", "api_error"))
                return
        for line in drain():
            yield line
        if not isinstance(ended, UpstreamErrorEvent):
            yield wire.DONE

    @staticmethod
    async def replay(meta: wire.StreamMeta, first: str | None, pieces: AsyncIterator[str],
                     include_usage: bool) -> AsyncIterator[bytes]:
        """A stored answer (a hit, or another call's load) as a stream of its text."""
        if meta.kind == "chat":
            yield wire.chunk(meta, role=True, content="")
        if first is not None:
            yield wire.chunk(meta, content=first)
            async for piece in pieces:
                yield wire.chunk(meta, content=piece)
        yield wire.chunk(meta, finish="stop")
        if include_usage:
            yield wire.chunk(meta, usage=dict(wire.ZERO_USAGE))
        yield wire.DONE

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
            response = await self.upstream.send("POST", endpoint, request.headers, raw,
                                                params=request.query_params)
        except UpstreamUnavailable as down:
            return self.unavailable(endpoint, down)
        answer = storable(kind, response, control)
        if answer is not None:
            await self.store(key, answer)
        return Response(
            response.content,
            response.status_code,
            headers={**returned(response.headers), "x-gpucache": "miss"},
        )

    async def store(self, key: RequestKey, answer: str) -> None:
        try:
            await asyncio.to_thread(
                self.cache.put, key.semantic_text, answer, scope=key.scope, ttl=self.config.ttl
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
        label: str | None = None,
    ) -> Response:
        """The request as it came, to the upstream, and its answer as it came back. ``label``
        names the path in metrics (the allow-list's rule; never a client's own path)."""
        headers = {"x-gpucache": outcome}
        if not stream:
            try:
                response = await self.upstream.send(
                    request.method, path, request.headers, raw, params=request.query_params
                )
            except UpstreamUnavailable as down:
                return self.unavailable(label or path, down)
            return Response(
                response.content, response.status_code, headers={**returned(response.headers), **headers}
            )
        try:
            response = await self.upstream.open(path, request.headers, raw, params=request.query_params)
        except UpstreamUnavailable as down:
            return self.unavailable(label or path, down)
        if store is not None and response.status_code == 200:
            relay: AsyncIterator[bytes] = self.relay(response, store)
        else:
            relay = self.raw_relay(response)
        return StreamingResponse(
            relay,
            status_code=response.status_code,
            headers={**returned(response.headers), **headers},
            background=BackgroundTask(response.aclose),
        )

    async def raw_relay(self, response: Any) -> AsyncIterator[bytes]:
        """An upstream body passed through as bytes; a cut connection ends it with an error
        event (the body is a completion stream here), never a traceback."""
        try:
            async for part in response.aiter_raw():
                yield part
        except httpx.TransportError as exc:
            yield self.cut(exc)

    def cut(self, exc: Exception) -> bytes:
        """The error event that ends a client's stream whose upstream failed mid-stream."""
        self.metrics.errors.labels("upstream_unavailable").inc()
        return wire.sse(wire.error_body(f"the upstream failed mid-stream: {exc}", "api_error"))

    async def relay(self, response: Any, store: tuple[RequestKey, CacheControl]) -> AsyncIterator[bytes]:
        """An upstream stream passed through event by event, its answer stored if it
        completes and its text alone replays it."""
        key, control = store
        meta = wire.StreamMeta(key.kind, "")
        parts: list[str] = []
        try:
            async for event, line in upstream_events(response):
                yield line
                if "error" in event:
                    return  # relayed; nothing stored
                delta = wire.delta_of(key.kind, event, meta)
                if delta:
                    parts.append(delta)
        except UpstreamUnavailable as exc:
            yield self.cut(exc)
            return
        yield wire.DONE
        if meta.finish_reason == "stop" and not control.no_store and not meta.unreplayable:
            await self.store(key, "".join(parts))

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
        if math.isfinite(hit.age):  # RFC 9111's Age: how long ago the served answer was stored
            headers["age"] = str(max(0, int(hit.age)))
        if not hit.exact:
            self.metrics.similarity.observe(hit.similarity)
            headers["x-gpucache-similarity"] = f"{hit.similarity:.4f}"
        return headers
